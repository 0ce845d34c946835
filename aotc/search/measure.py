"""Measuring candidate schedules on this host: parallel builders, one isolated runner
(docs/search.md#measurement).

`Measurer.measure(states)` compiles every candidate in a pool of builder processes (steps → replay →
lower → LLVM IR → object → shared library), then runs the libraries one at a time in a single
persistent runner process. The runner checks each kernel's outputs against the DAG's naive schedule
(one untimed run that doubles as the warm-up, plus a comparison) and times it. A builder or runner
that crashes or passes its timeout is killed and restarted: the candidate gets an error code and
measuring goes on. Worker processes use the "spawn" start method, so a script that creates a
Measurer must guard its entry point with `if __name__ == "__main__":`. A Measurer is not thread-safe.

The runner side (checking and timing a kernel) is `aotc.search.timing`; the worker processes both
sides run in are `aotc.search.workers`.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing as mp
import os
import sys
import time
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from multiprocessing.connection import wait as wait_for_connections
from pathlib import Path

from aotc.emulator import EMULATORS, kernel_emulation_unavailable
from aotc.files import ScratchDir
from aotc.ir.stmt import PrimFunc
from aotc.schedule.state import State
from aotc.search.common import ErrorCode, MeasureResult, Noise
from aotc.search.timing import (
    KERNEL_NAME,
    RunnerMain,
    RunnerSetup,
    emulated_runner_main,
    gpu_runner_main,
    runner_main,
)
from aotc.search.workers import (
    STARTUP_TIMEOUT,
    RunnerProcess,
    Worker,
    WorkerStartError,
    error_text,
    message_tail,
    serve,
    shutdown_workers,
)
from aotc.target import Target, arch_of, as_target, host_cores, host_target
from aotc.te.dag import ComputeDAG

__all__ = [
    "KERNEL_NAME",
    "BatchStats",
    "Built",
    "BuildersCannotStart",
    "MeasureError",
    "MeasureOptions",
    "Measurer",
    "build_candidate",
    "device_unavailable",
    "reference_target",
]


class MeasureError(RuntimeError):
    """The measurer itself cannot work: the naive schedule does not build or run, or a worker won't start."""


class BuildersCannotStart(MeasureError):
    """The builder processes did not start: no candidate of any task can be built on this machine."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what}{_spawn_hint()}")


def _spawn_hint() -> str:
    """Builders are spawned: each imports the parent's main module again, and a script that tunes at its
    top level then tries to tune again in each of them, which Python refuses (they exit at once)."""
    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__spec__", None) is not None or not getattr(main, "__file__", None):
        return ""
    try:  # a script that has the guard (the `aotc` command's own) died of something else
        if "__main__" in Path(main.__file__).read_text(errors="replace"):
            return ""
    except OSError:
        pass
    return (
        f"; if {main.__file__} calls aotc.compile or aotc.tune, call it under"
        ' `if __name__ == "__main__":` (builders are spawned processes that import it again)'
    )


@dataclass
class MeasureOptions:
    """How candidates are built and timed.

    `number` runs make one repeat; 0 picks it so that a repeat lasts at least `min_repeat_ms`
    (a nonzero `number` is still raised to reach `min_repeat_ms`; set that to 0 to fix it).
    `costs` holds `repeat` values, each the mean seconds of one run within a repeat.
    `flush_cache` evicts the caches before every timed run (then `number` defaults to 1 and
    `min_repeat_ms` is ignored, as in Ansor). `num_threads` 0 means `target.hw.num_cores`.
    `check_correctness` costs one extra, untimed kernel run per candidate (it also serves as the
    warm-up run Ansor discards) plus filling and comparing the outputs; a mismatch beyond
    `rtol`/`atol` (atol scaled by the largest reference magnitude) is WRONG_ANSWER. Builder
    processes are recycled after `builds_per_worker` builds (llvmlite leaks memory per compile).

    Interference (aotc.search.interference): a repeat set during which other processes took more than
    `max_interference` of the CPU time, or whose repeats spread by more than `max_spread`, is timed
    again, at most `max_retries` times, and the quietest set is kept with its noise figure.
    `bind_threads` pins the runner's kernel threads one per core (the library's `aotc_bind_threads`):
    unbound, two of them sometimes shared the core another process left free, where a join waited a
    whole time slice (a 0.5 ms pool took 15 ms with one core busy under libgomp).

    `runner` is the process that checks and times built candidates (`aotc.search.timing.RunnerMain`):
    by default this CPU, its GPU, or qemu for another CPU architecture; another one (a board on the
    network, a cluster's device) takes the same requests and answers the same way (docs/search.md#runners).
    """

    number: int = 0
    repeat: int = 3
    min_repeat_ms: float = 50.0
    timeout: float = 10.0
    build_timeout: float = 30.0
    flush_cache: bool = False
    check_correctness: bool = True
    n_build_workers: int = field(default_factory=host_cores)
    rtol: float = 1e-4
    atol: float = 1e-5
    num_threads: int = 0
    seed: int = 0
    builds_per_worker: int = 1000
    max_interference: float = 0.2
    max_spread: float = 0.1
    max_retries: int = 2
    bind_threads: bool = True
    runner: RunnerMain | None = None  # None: `default_runner(target)`; a remote device plugs in here

    def __post_init__(self) -> None:
        checks = [
            (self.number >= 0, "number must be >= 0"),
            (self.repeat >= 1, "repeat must be >= 1"),
            (self.min_repeat_ms >= 0, "min_repeat_ms must be >= 0"),
            (self.timeout > 0, "timeout must be positive"),
            (self.build_timeout > 0, "build_timeout must be positive"),
            (self.n_build_workers >= 1, "n_build_workers must be >= 1"),
            (self.rtol >= 0 and self.atol >= 0, "rtol and atol must be >= 0"),
            (self.num_threads >= 0, "num_threads must be >= 0"),
            (self.builds_per_worker >= 1, "builds_per_worker must be >= 1"),
            (0 < self.max_interference <= 1, "max_interference must be in (0, 1]"),
            (self.max_spread > 0, "max_spread must be positive"),
            (self.max_retries >= 0, "max_retries must be >= 0"),
            (self.runner is None or callable(self.runner), "runner must be a RunnerMain function or None"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"MeasureOptions: {msg}")


@dataclass(frozen=True)
class BatchStats:
    """Wall seconds of one `measure` call: the parallel build phase, then the serial run phase (on a
    cluster, where the two overlap: until the last build came back, then the rest). On a cluster,
    `devices` holds its devices after the batch (aotc.cluster.DeviceRow as dicts) and `queue_depth` the
    most candidates that waited for a device."""

    candidates: int
    build_seconds: float
    run_seconds: float
    devices: tuple = ()
    queue_depth: int = 0


# ----------------------------------------------------------------------------- builder side


@dataclass
class Built:
    """A built candidate: its library (or GPU JSON) at `path`, or why it did not build."""

    error: ErrorCode
    msg: str = ""
    path: str | None = None
    seconds: float = 0.0
    layouts: list = field(default_factory=list)


def _builder_main(conn, dag: ComputeDAG, target: Target, workdir: str, env: dict[str, str]) -> None:
    counter = itertools.count()

    def setup():
        import aotc.codegen.module  # noqa: F401  (import before the first task, not during it)
        import aotc.schedule.lower  # noqa: F401

        def build(task: tuple[str, object]) -> Built:
            name = os.path.join(workdir, f"b{os.getpid()}_{next(counter)}")
            return build_candidate(dag, target, name, task)

        return build

    serve(conn, env, setup)


# the GPU runner's time limit for one candidate once a cutoff is known: this many cutoffs, at least
# GPU_MIN_TIMEOUT seconds (its first run, the poisoned outputs' upload and the check against the reference)
GPU_TIMEOUT_CUTOFFS = 10
GPU_MIN_TIMEOUT = 3.0


def reference_target(target: Target) -> Target:
    """What the reference schedule is built for: the runner's Python loads it and checks candidates against
    its outputs, on this CPU also when the candidates run on a GPU or under qemu."""
    return host_target() if target.is_gpu or emulated_arch(target) is not None else target


def build_candidate(dag: ComputeDAG, target: Target, name: str, task: tuple[str, object]) -> Built:
    """Lower and compile one candidate to `name` plus its suffix (.so, or .gpu.json for a GPU):
    ("steps", step records), ("func", PrimFunc), or the reference ("reference", []), built for
    `reference_target(target)`: the naive loops where the candidates run on this CPU, the untuned CPU
    schedule where they run elsewhere (naive loops would take minutes on a GPU-sized task: 4096^3 at
    0.6 GFLOP/s; the GPU and emulated candidates share no code generation with it)."""
    if task[0] == "reference":
        host = reference_target(target)
        if host is not target:
            task = ("default", [])
        target = host
    return _build_one(dag, target, name + (".gpu.json" if target.is_gpu else ".so"), task)


def _build_one(dag: ComputeDAG, target: Target, path: str, task: tuple[str, object]) -> Built:
    from aotc.codegen.module import build_module
    from aotc.schedule.default import default_schedule
    from aotc.schedule.layout import rewrite_layout
    from aotc.schedule.lower import lower
    from aotc.schedule.steps import replay, steps_from_json

    start = time.perf_counter()
    kind, payload = task
    layouts: list = []
    try:
        if kind == "steps" and target.is_gpu:  # weights keep their layout: shared memory stages them
            func = lower(replay(dag, steps_from_json(payload)), KERNEL_NAME)
        elif kind == "steps":
            state, rewritten = rewrite_layout(replay(dag, steps_from_json(payload)))
            layouts = [layout.to_json() for layout in rewritten]
            func = lower(state, KERNEL_NAME)
        elif kind == "reference":
            func = lower(replay(dag, []), KERNEL_NAME)
        elif kind == "default":
            func = lower(default_schedule(dag, target), KERNEL_NAME)
        else:
            func = replace(payload, name=KERNEL_NAME)
    except Exception as err:
        return Built(ErrorCode.INSTANTIATION_ERROR, error_text(err), seconds=time.perf_counter() - start)
    try:
        if target.is_gpu:
            _build_gpu(func, target, path)
        else:  # regions that an earlier candidate had are not compiled again
            build_module([func], target, path, object_cache=os.path.join(os.path.dirname(path), "objects"))
    except Exception as err:
        return Built(ErrorCode.COMPILE_HOST, error_text(err), seconds=time.perf_counter() - start)
    return Built(ErrorCode.NO_ERROR, path=path, seconds=time.perf_counter() - start, layouts=layouts)


def _build_gpu(func: PrimFunc, target: Target, path: str) -> None:
    """A GPU candidate as the GPU runner loads it (JSON): its kernels (OpenCL C source, or a cubin for the
    target's arch as hex) and how to launch them."""
    import json

    from aotc.codegen.gpu import compile_cuda, emit_gpu

    module = emit_gpu(func, target)
    if target.kind == "cuda":
        code = compile_cuda(module.cuda_source, target.arch).hex()
    else:
        code = module.opencl_source
    with open(path, "w") as f:
        json.dump({"language": target.kind, "code": code, "launches": module.launches()}, f)


# ----------------------------------------------------------------------------- the measurer


class Measurer:
    """Builds and runs candidates of one task on this host; use as a context manager (or call close)."""

    measures_here = True  # False for a measurer whose candidates run elsewhere (aotc.cluster)

    def __init__(self, dag: ComputeDAG, target: Target | str, options: MeasureOptions | None = None):
        target = as_target(target)
        options = options or MeasureOptions()
        if options.runner is None and self.measures_here:  # a runner of one's own runs wherever it runs
            _check_runnable(target)
        self.dag, self.target = dag, target
        self.options = options
        self.threads = self.options.num_threads or target.hw.num_cores
        self.last_batch: BatchStats | None = None
        self._runner_lost: str | None = None  # why the runner could not be restarted, once it could not
        scratch = ScratchDir("aotc-measure-")  # left behind by no process, however it ends
        self.workdir = scratch.path
        self._ctx = mp.get_context("spawn")
        self._workers: list[Worker] = []
        self._finalizer = weakref.finalize(self, shutdown_workers, self._workers, scratch)
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        env: dict[str, str] = {}
        for i in range(self.options.n_build_workers):
            args = (self.dag, self.target, self.workdir, env)
            self._workers.append(Worker(self._ctx, f"aotc-builder-{i}", _builder_main, args))
        self._builders = list(self._workers)
        (ref,) = self._build([("reference", [])])
        if ref.error:
            raise MeasureError(
                f"the naive schedule of {self.dag} does not build ({ref.error.name}): {ref.msg}"
            )
        setup = RunnerSetup(
            self.workdir, ref.path, len(self.dag.placeholders), self.options, self.target, self.threads
        )
        main = self.options.runner or default_runner(self.target)
        name = f"aotc-{main.__name__.removesuffix('_main').replace('_', '-')}"
        self._runner = RunnerProcess(Worker(self._ctx, name, main, (env, setup)))
        self._workers.append(self._runner.worker)
        try:
            self._runner.await_ready()
        except WorkerStartError as err:
            raise MeasureError(str(err)) from None

    def __enter__(self) -> Measurer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the worker processes and delete the temporary directory."""
        self._finalizer()

    def measure(self, states: Sequence[State], cutoff_seconds: float | None = None) -> list[MeasureResult]:
        """Build all `states` in parallel, then run them one by one; results in the same order.

        A candidate whose checked first run takes longer than `cutoff_seconds` (say, ten times the best
        so far) cannot win: that run is its only sample, which saves the repeats of slow candidates.

        A result's `build_seconds` is its equal share of the batch's build-phase wall time and its
        `run_seconds` the wall time of its own run (a worker restart included), so the results of a
        batch add up to its wall time; `last_batch` holds the totals.
        """
        tasks: list[tuple[int, tuple[str, object]]] = []
        early: dict[int, MeasureResult] = {}
        for i, state in enumerate(states):
            try:
                tasks.append((i, ("steps", self._steps_of(state))))
            except Exception as err:
                early[i] = MeasureResult([], ErrorCode.INSTANTIATION_ERROR, error_text(err))
        return self._measure(len(states), tasks, early, cutoff_seconds)

    def measure_funcs(self, funcs: Sequence[PrimFunc]) -> list[MeasureResult]:
        """Measure loop programs directly; their params must match the task's (placeholders, then outputs)."""
        return self._measure(len(funcs), [(i, ("func", f)) for i, f in enumerate(funcs)], {}, None)

    def _steps_of(self, state: State) -> list:
        from aotc.schedule.steps import steps_to_json

        if state.dag is not self.dag and state.dag.fingerprint != self.dag.fingerprint:
            raise ValueError(f"the state belongs to {state.dag}, not to this measurer's {self.dag}")
        return steps_to_json(state.steps)

    def _measure(
        self, n: int, tasks: list, early: dict[int, MeasureResult], cutoff: float | None
    ) -> list[MeasureResult]:
        if not self._finalizer.alive:
            raise MeasureError("the measurer is closed")
        measured, stats = self._measure_tasks(n, tasks, cutoff) if tasks else ([], BatchStats(n, 0.0, 0.0))
        results: list[MeasureResult | None] = [None] * n
        for (i, _), r in zip(tasks, measured):
            results[i] = r
        for i, r in early.items():
            results[i] = replace(r, build_seconds=stats.build_seconds / max(n, 1))
        self.last_batch = stats
        return results  # type: ignore[return-value]

    def _measure_tasks(
        self, n: int, tasks: list, cutoff: float | None
    ) -> tuple[list[MeasureResult], BatchStats]:
        """The results of (index, build task) pairs, in order, and the batch's stats (`n` candidates in
        all): built on the builders, then run one by one."""
        start = time.perf_counter()
        built = self._build([payload for _, payload in tasks])
        build_wall = time.perf_counter() - start
        share = build_wall / max(n, 1)
        start = time.perf_counter()
        results = [self._run_built(b, share, cutoff) for b in built]
        return results, BatchStats(n, build_wall, time.perf_counter() - start)

    def _run_built(self, built: Built, build_share: float, cutoff: float | None) -> MeasureResult:
        if built.error:
            return MeasureResult([], built.error, built.msg, build_seconds=build_share)
        start = time.perf_counter()
        try:
            error, msg, costs, noise, *host = self._run(built.path, cutoff, built.layouts)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(built.path)
        seconds = time.perf_counter() - start
        return MeasureResult(
            costs, error, msg, build_share, seconds, noise=noise, host=host[0] if host else None
        )

    # -- building

    def _build(self, tasks: list[tuple[str, object]]) -> list[Built]:
        """Build every task on the pool; a builder that times out or dies is restarted."""
        out: list[Built | None] = [None] * len(tasks)
        queue = deque(range(len(tasks)))
        while queue or any(w.task is not None for w in self._builders):
            for w in self._builders:
                if queue and w.ready and w.task is None:
                    self._submit_build(w, queue, tasks)
            self._collect_builds(out)
        return out  # type: ignore[return-value]

    def _submit_build(self, w: Worker, queue: deque, tasks: list) -> None:
        t = queue.popleft()
        try:
            w.submit(t, tasks[t], self.options.build_timeout)
        except OSError:
            queue.appendleft(t)
            w.restart()

    def _collect_builds(self, out: list[Built | None]) -> None:
        waiting = [w for w in self._builders if w.task is not None or not w.ready]
        timeout = max(0.0, min(w.deadline for w in waiting) - time.monotonic())
        for conn in wait_for_connections([w.conn for w in waiting], timeout):
            w = next(w for w in waiting if w.conn is conn)
            try:
                kind, payload = w.receive()
            except (EOFError, OSError):
                self._builder_died(w, out)
                continue
            if kind == "failed":
                raise BuildersCannotStart(f"a builder process failed to start:\n{payload}")
            if kind == "result":
                t, built = payload
                out[t] = built
                if w.done >= self.options.builds_per_worker:
                    w.ask_to_stop()
                    w.stop()
                    w.start()
        now = time.monotonic()
        for w in waiting:
            if w.deadline <= now and (w.task is not None or not w.ready):
                self._builder_timed_out(w, out)

    def _builder_died(self, w: Worker, out: list[Built | None]) -> None:
        reason = w.death_reason()
        if w.task is None:
            raise BuildersCannotStart(f"a builder process died while starting ({reason})")
        out[w.task] = Built(ErrorCode.COMPILE_HOST, f"the builder process died ({reason})")
        w.restart()

    def _builder_timed_out(self, w: Worker, out: list[Built | None]) -> None:
        if w.task is None:
            raise BuildersCannotStart(f"a builder process did not start within {STARTUP_TIMEOUT:.0f} s")
        limit = self.options.build_timeout
        out[w.task] = Built(ErrorCode.BUILD_TIMEOUT, f"building took longer than {limit:g} s")
        w.restart()

    # -- running

    def _run(
        self, path: str, cutoff: float | None, layouts: list
    ) -> tuple[ErrorCode, str, list[float], Noise | None]:
        timeout = self.options.timeout
        if cutoff is not None and self.target.is_gpu:
            # a candidate past the cutoff cannot win: stop waiting for one far past it (the GPU runner
            # restarts in a second or two; on an H200, 2 of 45 GEMM candidates ran past 10 s)
            timeout = min(timeout, max(GPU_MIN_TIMEOUT, GPU_TIMEOUT_CUTOFFS * cutoff))
        if self._runner_lost is None:
            try:
                return self._runner.run((path, cutoff, layouts), timeout)
            except WorkerStartError as err:  # a remote device gone: this batch's other results are kept
                self._runner_lost = f"the runner cannot start again: {err}"
        return ErrorCode.RUNTIME_DEVICE, self._runner_lost, [], None


def device_unavailable(target: Target, timeout: float = 60.0) -> str | None:
    """Why candidates for the GPU `target` cannot be measured on this machine, or None if they can.

    The device is opened in a child process: without a GPU the CUDA driver fails, and a call past a
    failed cuInit once hung, so nothing of it runs in this one."""
    import subprocess
    import sys

    if not target.is_gpu:
        return None
    probe = (
        "import sys\nfrom aotc_runtime.gpu import open_device\n"
        f"try:\n    open_device({target.kind!r}).close()\n"
        "except Exception as err:\n    print(err)\n    sys.exit(3)\n"
    )
    try:
        proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"opening the {target.kind} device took more than {timeout:g} s"
    if proc.returncode == 0:
        return None
    return message_tail((proc.stdout.strip() or proc.stderr.strip()) or f"exit status {proc.returncode}")


def _check_runnable(target: Target) -> None:
    import llvmlite.binding as llvm

    if target.is_gpu:
        return  # the GPU runner opens the device; without one it fails to start, saying why
    if not target.is_cpu:
        raise ValueError(f"Measurer runs kernels on this host's CPU; target {target} is not a CPU target")
    host = arch_of(llvm.get_process_triple())
    if arch_of(target.triple) != host and emulated_arch(target) is None:
        why = kernel_emulation_unavailable(target)
        hint = (
            f" (it is measured under qemu where that is installed: {why})" if target.isa in EMULATORS else ""
        )
        raise ValueError(f"target {target} ({target.triple}) cannot run on this {host} host{hint}")


def default_runner(target: Target) -> RunnerMain:
    """The runner for a target measured on this machine: its GPU, qemu for another CPU architecture,
    else this CPU."""
    if target.is_gpu:
        return gpu_runner_main
    if emulated_arch(target) is not None:
        return emulated_runner_main
    return runner_main


def emulated_arch(target: Target) -> str | None:
    """The architecture of a CPU target this host measures under qemu (its emulator and cross compiler
    are installed), or None (this host's own, a GPU, or no emulator)."""
    import llvmlite.binding as llvm

    if not target.is_cpu or target.isa == arch_of(llvm.get_process_triple()):
        return None
    return target.isa if kernel_emulation_unavailable(target) is None else None
