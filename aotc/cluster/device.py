"""The device side of cluster measurement: the Ray actor that checks and times candidates on a device
(docs/cluster.md#what-runs-where).

A build's driver creates a `DeviceRunner` on each node that advertises the key of its target's devices;
it measures by reusing this machine's own runner (`default_runner`: this CPU, its GPU, or qemu) in a
local worker process, exactly as a local build would: the actor only moves bytes in and results out.
`CandidateBuilder`s compile candidates on the nodes that offer CPUs. A task's ComputeDAG reaches both
pickled by Ray (so every machine of a cluster runs the same aotc version); candidates and results cross
as plain data (bytes, numbers, strings, dicts). Ray is not imported here: the driver wraps the classes
with `ray.remote` (aotc.cluster.driver).
"""

from __future__ import annotations

import dataclasses
import itertools
import multiprocessing as mp
import os
import shutil

from aotc.files import ScratchDir
from aotc.search.common import ErrorCode, Noise
from aotc.search.workers import RunnerProcess, Worker, WorkerStartError

__all__ = ["CandidateBuilder", "DeviceError", "DeviceRunner", "LocalRunner", "plain_result"]

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
        self.scratch = ScratchDir(_WORKDIR_PREFIX)  # a killed actor's is deleted by the next one
        self.workdir = self.scratch.path
        self.local: LocalRunner | None = None
        self.timeout = 10.0
        self.suffix = ".so"
        self.names = itertools.count()
        self.busy = False
        self.measured = 0

    def setup(self, dag, options: dict, target_text: str, threads: int) -> dict:
        """Start the local runner for a task (its ComputeDAG): the device builds the naive schedule it
        checks candidates against itself, for the CPU its Python runs on where it runs the candidates
        under qemu or on a GPU. Returns the device's host info as its records carry it."""
        from aotc.search.measure import MeasureOptions, build_candidate, default_runner
        from aotc.search.records import measuring_host
        from aotc.search.timing import RunnerSetup
        from aotc.target import parse_target

        target = parse_target(target_text)
        opts = MeasureOptions(**options)
        self._close_local()
        # a folder per task: the runner keeps the task's reference outputs there (reference.npz)
        taskdir = os.path.join(self.workdir, f"task{next(self.names)}")
        os.mkdir(taskdir)
        reference = build_candidate(dag, target, os.path.join(taskdir, "reference"), ("reference", []))
        if reference.error:
            raise DeviceError(f"the naive schedule of {dag} does not build here: {reference.msg}")
        main = default_runner(target)
        setup = RunnerSetup(taskdir, reference.path, len(dag.placeholders), opts, target, threads)
        self.local = LocalRunner(main, setup)
        self.timeout = opts.timeout
        self.suffix = ".gpu.json" if target.is_gpu else ".so"
        return {"host": measuring_host(target), "runner": main.__name__, "pid": os.getpid()}

    def run(self, candidate: bytes, cutoff: float | None, layouts: list) -> tuple:
        """Check and time one built candidate; (error code, message, costs, noise dict or None)."""
        if self.local is None:
            raise DeviceError("the device runner was not set up")
        # a fresh name each time: dlopen of a path it still holds open would return the old kernel
        path = os.path.join(self.local.workdir, f"c{next(self.names)}{self.suffix}")
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
        self.scratch.remove()

    def __ray_shutdown__(self) -> None:
        """Ray calls this when the actor ends gracefully (its measurer closed): clean up then."""
        self.close()

    def _close_local(self) -> None:
        if self.local is not None:
            self.local.close()
            shutil.rmtree(self.local.workdir, ignore_errors=True)
            self.local = None


class CandidateBuilder:
    """Compiles candidates for a cluster build on any node with a CPU to spare: one Ray actor per CPU,
    each building one candidate at a time in its own process (a crash or a hang costs only that actor,
    which the driver replaces). `build` answers (what happened, the built file's bytes or None)."""

    def __init__(self) -> None:
        self.scratch = ScratchDir(_WORKDIR_PREFIX)
        self.workdir = self.scratch.path
        self.names = itertools.count()
        self.targets: dict = {}

    def ping(self) -> bool:
        """True once the actor is up (its imports done), so a build's timeout counts only the build."""
        import aotc.codegen.module  # noqa: F401
        import aotc.schedule.lower  # noqa: F401

        return True

    def build(self, dag, target_text: str, task: tuple[str, object]) -> tuple[dict, bytes | None]:
        from aotc.search.measure import build_candidate
        from aotc.target import parse_target

        target = self.targets.get(target_text) or self.targets.setdefault(
            target_text, parse_target(target_text)
        )
        built = build_candidate(dag, target, os.path.join(self.workdir, f"c{next(self.names)}"), task)
        meta = {
            "error": int(built.error),
            "msg": built.msg,
            "seconds": built.seconds,
            "layouts": built.layouts,
        }
        if built.path is None:
            return meta, None
        try:
            with open(built.path, "rb") as f:
                return meta, f.read()
        finally:
            os.unlink(built.path)

    def __ray_shutdown__(self) -> None:
        self.scratch.remove()
