"""The device side of cluster measurement: the Ray actor that checks and times candidates on a device
(docs/cluster.md#what-runs-where).

A `DeviceRunner` is created by a build (one per measurer) on a node that advertises the device's key, and
measures by reusing this machine's own runner (`default_runner`: this CPU, its GPU, or qemu) in a local
worker process, exactly as a local build would: the actor only moves bytes in and results out. Everything
crossing Ray is plain data (bytes, numbers, strings, dicts), never a pickled aotc object, so a device and
a build only need the same aotc and Ray versions, not the same process state. Ray is not imported here:
the build side wraps the class with `ray.remote` (aotc.cluster.runner).
"""

from __future__ import annotations

import dataclasses
import itertools
import multiprocessing as mp
import os
import shutil
import tempfile

from aotc.search.common import ErrorCode, Noise
from aotc.search.workers import RunnerProcess, Worker, WorkerStartError

__all__ = ["DeviceError", "DeviceRunner", "LocalRunner", "elf_machine_problem", "plain_result"]

# ELF e_machine of the architectures a device's Python may run on
_ELF_MACHINES = {"x86_64": 62, "aarch64": 183, "arm": 40}
_WORKDIR_PREFIX = "aotc-device-"


class DeviceError(RuntimeError):
    """The device cannot measure: its runner does not start, or the reference library is not for it."""


class LocalRunner:
    """One runner process on this device (a `RunnerMain` in a `Worker`), restarted when it dies or passes
    the timeout: the measurer's own `RunnerProcess`, its start failures a DeviceError."""

    def __init__(self, main, setup) -> None:
        self.workdir = setup.workdir
        worker = Worker(mp.get_context("spawn"), "aotc-device-runner", main, ({}, setup))
        self.runner = RunnerProcess(worker, "the device's runner process")
        self.worker = worker
        self._started(self.runner.await_ready)

    def run(
        self, path: str, cutoff: float | None, layouts: list, timeout: float
    ) -> tuple[ErrorCode, str, list[float], Noise | None]:
        return self._started(lambda: self.runner.run((path, cutoff, layouts), timeout))

    @staticmethod
    def _started(call):
        try:
            return call()
        except WorkerStartError as err:
            raise DeviceError(str(err)) from None

    def close(self) -> None:
        self.worker.ask_to_stop()
        self.worker.stop()


def elf_machine_problem(library: bytes) -> str | None:
    """Why this device's Python cannot load `library` (an ELF for another architecture), or None.

    The reference library is loaded by the device's runner in Python on the device's own CPU (also when
    it runs the candidates under qemu or on a GPU); a build decides what it is built for, so a mismatch
    is said here instead of failing in dlopen (docs/cluster.md#what-runs-where)."""
    import llvmlite.binding as llvm

    from aotc.target import arch_of

    here = arch_of(llvm.get_process_triple())
    if library[:4] != b"\x7fELF" or len(library) < 20:
        return "the reference library is not an ELF shared library"
    machine = int.from_bytes(library[18:20], "little" if library[5] == 1 else "big")
    if _ELF_MACHINES.get(here) == machine:
        return None
    built = next((arch for arch, m in _ELF_MACHINES.items() if m == machine), f"ELF machine {machine}")
    return f"the reference library was built for {built}, and this device's runner loads it on {here}"


def _remove_dead_workdirs() -> None:
    """Delete the working folders of device actors that died (a killed actor cannot clean up after
    itself): their names carry the actor process's id."""
    base = tempfile.gettempdir()
    for name in os.listdir(base):
        pid = name.removeprefix(_WORKDIR_PREFIX).split("-", 1)[0]
        if name.startswith(_WORKDIR_PREFIX) and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def plain_result(result: tuple[ErrorCode, str, list[float], Noise | None]) -> tuple:
    """A runner's result as plain data for Ray: (error code as int, message, costs, noise as a dict or None)."""
    error, msg, costs, noise = result
    return int(error), msg, [float(c) for c in costs], None if noise is None else dataclasses.asdict(noise)


class DeviceRunner:
    """Measures one build task's candidates on this device, one at a time (docs/cluster.md#what-runs-where).

    `setup` takes the task's reference library and how to measure, and starts this machine's default
    runner on them; `run` takes a built candidate's bytes and answers the runner's result as plain data;
    `status` (in its own concurrency group, so it answers while a candidate runs) says whether it is busy
    and how many candidates it measured."""

    def __init__(self) -> None:
        _remove_dead_workdirs()
        self.workdir = tempfile.mkdtemp(prefix=f"{_WORKDIR_PREFIX}{os.getpid()}-")
        self.local: LocalRunner | None = None
        self.timeout = 10.0
        self.suffix = ".so"
        self.names = itertools.count()
        self.busy = False
        self.measured = 0

    def setup(self, reference: bytes, n_inputs: int, options: dict, target_text: str, threads: int) -> dict:
        """Start the local runner for a task; returns the device's host info as its records would carry it."""
        from aotc.search.measure import MeasureOptions, default_runner
        from aotc.search.records import measuring_host
        from aotc.search.timing import RunnerSetup
        from aotc.target import parse_target

        problem = elf_machine_problem(reference)
        if problem:
            raise DeviceError(f"{problem} (docs/cluster.md#what-runs-where)")
        target = parse_target(target_text)
        opts = MeasureOptions(**options)
        self._close_local()
        ref_path = os.path.join(self.workdir, "reference.so")
        with open(ref_path, "wb") as f:
            f.write(reference)
        main = default_runner(target)
        setup = RunnerSetup(self.workdir, ref_path, n_inputs, opts, target, threads)
        self.local = LocalRunner(main, setup)
        self.timeout = opts.timeout
        self.suffix = ".gpu.json" if target.is_gpu else ".so"
        return {"host": measuring_host(target), "runner": main.__name__, "pid": os.getpid()}

    def run(self, candidate: bytes, cutoff: float | None, layouts: list) -> tuple:
        """Check and time one built candidate; (error code, message, costs, noise dict or None)."""
        if self.local is None:
            raise DeviceError("the device runner was not set up")
        # a fresh name each time: dlopen of a path it still holds open would return the old kernel
        path = os.path.join(self.workdir, f"c{next(self.names)}{self.suffix}")
        with open(path, "wb") as f:
            f.write(candidate)
        self.busy = True
        try:
            return plain_result(self.local.run(path, cutoff, layouts, self.timeout))
        finally:
            self.busy = False
            self.measured += 1
            os.unlink(path)

    def status(self) -> dict:
        """Whether a candidate is being measured, how many were, and the actor's and its runner's process ids."""
        runner = self.local.worker.proc.pid if self.local is not None else None
        return {"busy": self.busy, "measured": self.measured, "pid": os.getpid(), "runner_pid": runner}

    def close(self) -> None:
        self._close_local()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __ray_shutdown__(self) -> None:
        """Ray calls this when the actor ends gracefully (its measurer closed): clean up then."""
        self.close()

    def _close_local(self) -> None:
        if self.local is not None:
            self.local.close()
            self.local = None
