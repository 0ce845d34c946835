"""Measuring candidate schedules on this host: parallel builders, one isolated runner
(docs/search.md#measurement).

`Measurer.measure(states)` compiles every candidate in a pool of builder processes (steps → replay →
lower → LLVM IR → object → shared library), then runs the libraries one at a time in a single
persistent runner process. The runner checks each kernel's outputs against the DAG's naive schedule
(one untimed run that doubles as the warm-up, plus a comparison) and times it. A builder or runner
that crashes or passes its timeout is killed and restarted: the candidate gets an error code and
measuring goes on. Worker processes use the "spawn" start method, so a script that creates a
Measurer must guard its entry point with `if __name__ == "__main__":`. A Measurer is not thread-safe.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import json
import math
import mmap
import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import time
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from multiprocessing.connection import wait as wait_for_connections

import numpy as np

from aotc.ir.stmt import PrimFunc
from aotc.schedule.state import State
from aotc.search.common import ErrorCode, MeasureResult, Noise
from aotc.search.interference import CpuSample, Quietness, measure_quietly
from aotc.target import Target, arch_of, as_target, host_cores
from aotc.te.dag import ComputeDAG

__all__ = [
    "BatchStats",
    "KERNEL_NAME",
    "MeasureError",
    "MeasureOptions",
    "Measurer",
    "time_flushed",
    "time_kernel",
]

KERNEL_NAME = "aotc_candidate"
STARTUP_TIMEOUT = 120.0
_MAX_NUMBER = 10**7
_MSG_LIMIT = 4000
SLICE_SECONDS = 1e-3  # a repeat is timed in slices this long (at least one run each)
CUTOFF_RUNS = 4  # warm runs that may bring a candidate whose checked first run was slow under the cutoff
REPEAT_CAP = 4.0  # a repeat stops after this many times its intended length (min_repeat_ms)


class MeasureError(RuntimeError):
    """The measurer itself cannot work: the naive schedule does not build or run, or a worker won't start."""


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
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"MeasureOptions: {msg}")


@dataclass(frozen=True)
class BatchStats:
    """Wall seconds of one `measure` call: the parallel build phase, then the serial run phase."""

    candidates: int
    build_seconds: float
    run_seconds: float


# ----------------------------------------------------------------------------- worker processes


class _Worker:
    """A child process that answers requests over a pipe; it can be killed and started again."""

    def __init__(self, ctx, name: str, main: Callable, args: tuple) -> None:
        self.ctx, self.name, self.main, self.args = ctx, name, main, args
        self.proc = None
        self.conn = None
        self.start()

    def start(self) -> None:
        parent, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=self.main, args=(child, *self.args), name=self.name, daemon=True)
        self.proc.start()
        child.close()
        self.conn = parent
        self.ready = False
        self.task: int | None = None
        self.deadline = time.monotonic() + STARTUP_TIMEOUT
        self.done = 0

    def submit(self, task_id: int, payload, timeout: float) -> None:
        self.conn.send((task_id, payload))
        self.task = task_id
        self.deadline = time.monotonic() + timeout

    def receive(self) -> tuple[str, object]:
        """The next message: ("ready", None), ("failed", text) or ("result", (task_id, payload))."""
        kind, payload = self.conn.recv()
        if kind == "ready":
            self.ready = True
        elif kind == "result":
            self.task = None
            self.done += 1
        return kind, payload

    def death_reason(self) -> str:
        self.proc.join(timeout=2.0)
        code = self.proc.exitcode
        if code is None:
            return "its pipe closed"
        if code < 0:
            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(-code).name}"
        return f"exit status {code}"

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5.0)
        self.conn.close()

    def restart(self) -> None:
        self.kill()
        self.start()

    def ask_to_stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.conn.send(None)

    def stop(self) -> None:
        self.proc.join(timeout=1.0)
        self.kill()


def _shutdown(workers: list[_Worker], workdir: str) -> None:
    for w in workers:
        w.ask_to_stop()
    for w in workers:
        w.stop()
    shutil.rmtree(workdir, ignore_errors=True)


def _child_setup(env: dict[str, str]) -> None:
    """Environment for a worker: variables (an empty one is removed), no Ctrl-C (the parent handles
    it), die with the parent."""
    for key, value in env.items():
        if value:
            os.environ[key] = value
        else:
            os.environ.pop(key, None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


def _serve(conn, env: dict[str, str], setup: Callable[[], Callable]) -> None:
    """Run `setup` to get a handler, report ready (or the failure), then answer requests until None."""
    _child_setup(env)
    try:
        handle = setup()
    except BaseException:
        conn.send(("failed", _tail(traceback.format_exc())))
        return
    conn.send(("ready", None))
    while (msg := conn.recv()) is not None:
        task_id, payload = msg
        conn.send(("result", (task_id, handle(payload))))


def _tail(text: str) -> str:
    return text if len(text) <= _MSG_LIMIT else "..." + text[-_MSG_LIMIT:]


def _error_text(err: BaseException) -> str:
    """The message of an expected error; the traceback of anything else, a bug (call inside `except`)."""
    if type(err).__module__.startswith("aotc.") or isinstance(
        err, ValueError | TypeError | KeyError | OSError
    ):
        return f"{type(err).__name__}: {err}"
    return _tail(traceback.format_exc())


# ----------------------------------------------------------------------------- builder side


@dataclass
class _Built:
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

        return lambda task: _build_one(
            dag, target, os.path.join(workdir, f"b{os.getpid()}_{next(counter)}.so"), task
        )

    _serve(conn, env, setup)


def _build_one(dag: ComputeDAG, target: Target, path: str, task: tuple[str, object]) -> _Built:
    """Lower and compile one candidate: ("steps", step records), ("func", PrimFunc) or the naive ("reference", [])."""
    from aotc.codegen.module import build_module
    from aotc.schedule.layout import rewrite_layout
    from aotc.schedule.lower import lower
    from aotc.schedule.steps import replay, steps_from_json

    start = time.perf_counter()
    kind, payload = task
    layouts: list = []
    try:
        if kind == "steps":
            state, rewritten = rewrite_layout(replay(dag, steps_from_json(payload)))
            layouts = [layout.to_json() for layout in rewritten]
            func = lower(state, KERNEL_NAME)
        elif kind == "reference":
            func = lower(replay(dag, []), KERNEL_NAME)
        else:
            func = replace(payload, name=KERNEL_NAME)
    except Exception as err:
        return _Built(ErrorCode.INSTANTIATION_ERROR, _error_text(err), seconds=time.perf_counter() - start)
    try:
        build_module([func], target, path)
    except Exception as err:
        return _Built(ErrorCode.COMPILE_HOST, _error_text(err), seconds=time.perf_counter() - start)
    return _Built(ErrorCode.NO_ERROR, path=path, seconds=time.perf_counter() - start, layouts=layouts)


# ----------------------------------------------------------------------------- runner side

_PAGE = mmap.PAGESIZE
_PROT_NONE, _PROT_READ = 0, 1


def _mprotect(addr: int, size: int, prot: int) -> None:
    mprotect = ctypes.CDLL(None).mprotect
    mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    mprotect(addr, size, prot)


def _page_array(src: np.ndarray, readonly: bool) -> np.ndarray:
    """A copy of `src` on its own pages with an inaccessible guard page after them; read-only if asked.

    A kernel that writes into an input, or past the page-rounded end of a buffer, then crashes
    instead of silently corrupting the data that later candidates are checked with.
    """
    size = -(-max(src.nbytes, 1) // _PAGE) * _PAGE
    buf = mmap.mmap(-1, size + _PAGE)
    arr = np.frombuffer(buf, dtype=src.dtype, count=src.size).reshape(src.shape)
    arr[...] = src
    addr = arr.ctypes.data
    _mprotect(addr + size, _PAGE, _PROT_NONE)
    if readonly:
        _mprotect(addr, size, _PROT_READ)
        arr.flags.writeable = False
    return arr


def _random_array(shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
    """Floats uniform in [-1, 1), integers in {0, 1} (safe as indices), booleans fair coin flips."""
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.floating):
        return rng.uniform(-1.0, 1.0, shape).astype(dtype)
    return rng.integers(0, 2, shape).astype(dtype)


def _poison(ref: np.ndarray) -> np.ndarray:
    """Values that differ from `ref` everywhere: an output the kernel forgets to write is caught."""
    if ref.dtype == np.bool_:
        return ~ref
    if np.issubdtype(ref.dtype, np.floating):
        return np.where(np.isnan(ref), 0, np.nan).astype(ref.dtype)
    return ref + np.ones((), ref.dtype)


def _mismatch(name: str, out: np.ndarray, ref: np.ndarray, rtol: float, atol: float) -> str | None:
    """None if `out` matches `ref`; else a description. Float atol is scaled by max |ref|."""
    if np.issubdtype(ref.dtype, np.floating):
        got, want = out.astype(np.float64), ref.astype(np.float64)
        finite = np.abs(want[np.isfinite(want)])
        scale = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
        eps = float(np.finfo(ref.dtype).eps)
        close = np.isclose(
            got, want, rtol=max(rtol, 8 * eps), atol=max(atol, 8 * eps) * scale, equal_nan=True
        )
    else:
        got, want = out, ref
        close = out == ref
    if close.all():
        return None
    bad = np.flatnonzero(~close)
    first = bad[0]
    where = tuple(int(v) for v in np.unravel_index(first, ref.shape))
    return (
        f"output {name}: {bad.size} of {ref.size} elements differ from the naive schedule's; "
        f"first at {where}: got {got.flat[first]!r}, expected {want.flat[first]!r}"
    )


def _llc_bytes() -> int:
    best_level, size = 0, 32 << 20
    base = "/sys/devices/system/cpu/cpu0/cache"
    with contextlib.suppress(OSError, ValueError):
        for entry in os.listdir(base):
            if not entry.startswith("index"):
                continue
            with open(f"{base}/{entry}/level") as f:
                level = int(f.read())
            with open(f"{base}/{entry}/size") as f:
                text = f.read().strip()
            units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
            value = int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)
            if level > best_level:
                best_level, size = level, value
    return size


def _timed(fn: Callable[[], None], number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return time.perf_counter() - start


def _repeat(fn: Callable[[], None], number: int, per_slice: int, cap: float) -> tuple[float, float]:
    """One repeat of `number` runs timed in slices of `per_slice` runs: (seconds per run, elapsed).

    The value is the mean of the faster half of the slices: another process that takes a core for a
    few milliseconds stretches the slices it lands in, and on a busy machine it lands in many of a
    50 ms repeat; on a quiet one the slices agree and this is the plain mean. A repeat stops after
    `cap` seconds: on a busy machine a join can wait a time slice per run, and a repeat calibrated on
    quiet runs would take a hundred times as long (and pass the runner's timeout)."""
    per_run: list[float] = []
    elapsed = 0.0
    left = number
    while left > 0 and elapsed < cap:
        n = min(per_slice, left)
        seconds = _timed(fn, n)
        per_run.append(seconds / n)
        elapsed += seconds
        left -= n
    per_run.sort()
    fast = per_run[: (len(per_run) + 1) // 2]
    return sum(fast) / len(fast), elapsed


def time_kernel(
    fn: Callable[[], None],
    opts: MeasureOptions,
    first_seconds: float,
    sampler: Callable[[], CpuSample] | None = None,
    retries: int | None = None,
) -> tuple[list[float], Noise]:
    """`repeat` seconds-per-run values, `number` raised until a repeat lasts `min_repeat_ms`, each
    repeat timed in ~1 ms slices; a disturbed set is measured again (`measure_quietly`)."""
    min_s = opts.min_repeat_ms / 1000
    per_run = first_seconds if first_seconds >= min_s else min(first_seconds, _pilot(fn))
    number = opts.number or math.ceil(min_s / max(per_run, 1e-9) * 1.05)
    number = max(1, min(number, _MAX_NUMBER))
    per_slice = max(1, math.ceil(SLICE_SECONDS / max(per_run, 1e-9)))
    cap = REPEAT_CAP * max(min_s, per_run)

    def repeats() -> list[float]:
        nonlocal number
        value, elapsed = _repeat(fn, number, per_slice, cap)
        for _ in range(3):  # the pilot can be off (a cold first run): raise `number` on the first repeat
            if elapsed >= min_s or number >= _MAX_NUMBER:
                break
            number = min(_MAX_NUMBER, max(number + 1, math.ceil(number * min_s / max(elapsed, 1e-9) * 1.1)))
            value, elapsed = _repeat(fn, number, per_slice, cap)
        return [value] + [_repeat(fn, number, per_slice, cap)[0] for _ in range(opts.repeat - 1)]

    return _quietly(repeats, opts, sampler, retries)


def _quietly(
    repeats: Callable[[], list[float]],
    opts: MeasureOptions,
    sampler: Callable[[], CpuSample] | None,
    retries: int | None,
) -> tuple[list[float], Noise]:
    """`repeats()` timed again while disturbed, within the options' limits (`retries` overrides theirs)."""
    retries = opts.max_retries if retries is None else retries
    return measure_quietly(repeats, opts.max_interference, opts.max_spread, retries, sampler)


def _pilot(fn: Callable[[], None]) -> float:
    """Seconds per warm run, from doubling batches until one lasts a millisecond."""
    number = 1
    while True:
        elapsed = _timed(fn, number)
        if elapsed >= 1e-3 or number >= _MAX_NUMBER:
            return elapsed / number
        number *= 2


def time_flushed(
    fn: Callable[[], None],
    flush: Callable[[], None],
    opts: MeasureOptions,
    sampler: Callable[[], CpuSample] | None = None,
    retries: int | None = None,
) -> tuple[list[float], Noise]:
    """Like `time_kernel`, with the caches flushed before every run (flushing is not timed)."""
    number = opts.number or 1

    def repeats() -> list[float]:
        costs = []
        for _ in range(opts.repeat):
            total = 0.0
            for _ in range(number):
                flush()
                start = time.perf_counter()
                fn()
                total += time.perf_counter() - start
            costs.append(total / number)
        return costs

    return _quietly(repeats, opts, sampler, retries)


def _load_reference(workdir: str, ref_path: str, n_inputs: int, seed: int) -> dict[str, np.ndarray]:
    """Seeded random inputs and the naive schedule's outputs on them, by parameter name, in order.

    Computed by the first runner process of a task and saved, so a restarted runner reuses them.
    """
    from aotc.codegen.module import load_library

    saved = os.path.join(workdir, "reference.npz")
    if os.path.exists(saved):
        with np.load(saved) as data:
            return {name: data[name] for name in data.files}
    kernel = load_library(ref_path).kernel(KERNEL_NAME)
    rng = np.random.default_rng(seed)
    arrays = {p.name: _random_array(p.shape, p.dtype, rng) for p in kernel.params[:n_inputs]}
    arrays |= {p.name: np.zeros(p.shape, p.dtype) for p in kernel.params[n_inputs:]}
    kernel(*arrays.values())
    tmp = os.path.join(workdir, "reference.tmp.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, saved)
    return arrays


class _Bench:
    """The runner's state: inputs, reference outputs, output buffers, and the cache-flush buffer."""

    def __init__(self, workdir: str, ref_path: str, n_inputs: int, opts: MeasureOptions, threads: int):
        from aotc.codegen.module import load_library

        load_library(ref_path)  # libc's and the kernel's libraries load before the guarded pages exist
        named = _load_reference(workdir, ref_path, n_inputs, opts.seed)
        arrays = list(named.values())
        self.opts, self.threads = opts, threads
        # one thread per core: unbound, two threads could share the core another process left free
        self.cpus = sorted(os.sched_getaffinity(0))[:threads] if opts.bind_threads else []
        self.originals = arrays[:n_inputs]
        self.inputs = [_page_array(a, readonly=True) for a in self.originals]
        self.relaid: dict[str, list[np.ndarray]] = {}
        self.refs = arrays[n_inputs:]
        self.output_names = list(named)[n_inputs:]
        self.outputs = [_page_array(r, readonly=False) for r in self.refs]
        self.poison = [_poison(r) for r in self.refs]
        self.flush_buf = np.zeros(min(2 * _llc_bytes(), 512 << 20), np.uint8) if opts.flush_cache else None
        self.quietness = Quietness()

    def flush(self) -> None:
        """Write over twice the last-level cache, then re-read the first input (the activation stays warm)."""
        self.flush_buf += 1
        if self.inputs:
            self.inputs[0].sum()

    def inputs_for(self, layouts: list) -> list[np.ndarray]:
        """The inputs with the weights a candidate re-lays out in its layouts (a few kept, guarded too)."""
        if not layouts:
            return self.inputs
        key = json.dumps(layouts, sort_keys=True)
        if key not in self.relaid:
            from aotc.schedule.layout import WeightLayout

            inputs = list(self.inputs)
            for obj in layouts:
                layout = WeightLayout.from_json(obj)
                inputs[layout.arg] = _page_array(layout.apply(self.originals[layout.arg]), readonly=True)
            if len(self.relaid) >= 8:
                self.relaid.pop(next(iter(self.relaid)))
            self.relaid[key] = inputs
        return self.relaid[key]

    def run(
        self, request: tuple[str, float | None, list]
    ) -> tuple[ErrorCode, str, list[float], Noise | None]:
        from aotc.codegen.module import KernelError, load_library

        path, cutoff, layouts = request

        lib = None
        try:
            inputs = self.inputs_for(layouts)
            lib = load_library(path)
            kernel = lib.kernel(KERNEL_NAME)
            sig = [(p.dtype, p.num_elements) for p in kernel.params]
            expected = [(a.dtype, a.size) for a in (*inputs, *self.outputs)]
            if sig != expected:
                raise TypeError(f"kernel parameters {sig} differ from the task's {expected}")
            lib.set_num_threads(self.threads)
            lib.bind_threads(self.cpus)
            fn = kernel.prepare(*inputs, *self.outputs)
        except Exception as err:
            _unload(lib)
            return ErrorCode.COMPILE_DEVICE, _error_text(err), [], None
        try:
            return self._check_and_time(fn, cutoff)
        except KernelError as err:
            return ErrorCode.RUNTIME_DEVICE, str(err), [], None
        except Exception:
            return ErrorCode.UNKNOWN_ERROR, _tail(traceback.format_exc()), [], None
        finally:
            _unload(lib)

    def _check_and_time(
        self, fn: Callable[[], None], cutoff: float | None
    ) -> tuple[ErrorCode, str, list[float], Noise | None]:
        """The checked first run, then timing; a first run slower than `cutoff` is its only sample."""
        if self.opts.check_correctness:
            for out, poison in zip(self.outputs, self.poison):
                np.copyto(out, poison)
        start = time.perf_counter()
        fn()
        first = time.perf_counter() - start
        if self.opts.check_correctness:
            for name, out, ref in zip(self.output_names, self.outputs, self.refs):
                msg = _mismatch(name, out, ref, self.opts.rtol, self.opts.atol)
                if msg:
                    return ErrorCode.WRONG_ANSWER, msg, [], None
        if cutoff is not None and first > cutoff:
            first = _fastest_again(fn, cutoff)
            if first > cutoff:
                return ErrorCode.NO_ERROR, "", [first], None
        opts = self.opts
        retries = self.quietness.retries(opts.max_retries)
        if self.flush_buf is not None:
            costs, noise = time_flushed(fn, self.flush, opts, retries=retries)
        else:
            costs, noise = time_kernel(fn, opts, first, retries=retries)
        self.quietness.note(noise, opts.max_interference, opts.max_spread)
        return ErrorCode.NO_ERROR, "", costs, noise


def _fastest_again(fn: Callable[[], None], cutoff: float) -> float:
    """The fastest of up to CUTOFF_RUNS more runs, stopping at one under `cutoff` or after 0.1 s: with
    another process on a core one cold run can wait a whole time slice, and on a busy machine most
    candidates of a microsecond kernel were cut off by a first run ten times their speed."""
    best, spent = math.inf, 0.0
    for _ in range(CUTOFF_RUNS):
        seconds = _timed(fn, 1)
        best, spent = min(best, seconds), spent + seconds
        if seconds <= cutoff or spent > 0.1:
            break
    return best


def _unload(lib) -> None:
    """dlclose a measured library so that thousands of candidates do not pile up in the runner."""
    import _ctypes

    handle = getattr(getattr(lib, "_lib", None), "_handle", None)
    if handle:
        with contextlib.suppress(OSError):
            _ctypes.dlclose(handle)


def _runner_main(conn, env: dict[str, str], bench_args: tuple) -> None:
    _serve(conn, env, lambda: _Bench(*bench_args).run)


# ----------------------------------------------------------------------------- the measurer


class Measurer:
    """Builds and runs candidates of one task on this host; use as a context manager (or call close)."""

    def __init__(self, dag: ComputeDAG, target: Target | str, options: MeasureOptions | None = None):
        target = as_target(target)
        _check_runnable(target)
        self.dag, self.target = dag, target
        self.options = options or MeasureOptions()
        self.threads = self.options.num_threads or target.hw.num_cores
        self.last_batch: BatchStats | None = None
        self.workdir = tempfile.mkdtemp(prefix="aotc-measure-")
        self._ctx = mp.get_context("spawn")
        self._workers: list[_Worker] = []
        self._finalizer = weakref.finalize(self, _shutdown, self._workers, self.workdir)
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        env: dict[str, str] = {}
        for i in range(self.options.n_build_workers):
            args = (self.dag, self.target, self.workdir, env)
            self._workers.append(_Worker(self._ctx, f"aotc-builder-{i}", _builder_main, args))
        self._builders = list(self._workers)
        (ref,) = self._build([("reference", [])])
        if ref.error:
            raise MeasureError(
                f"the naive schedule of {self.dag} does not build ({ref.error.name}): {ref.msg}"
            )
        bench_args = (self.workdir, ref.path, len(self.dag.placeholders), self.options, self.threads)
        self._runner = _Worker(self._ctx, "aotc-runner", _runner_main, (env, bench_args))
        self._workers.append(self._runner)
        self._await_runner()

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
                early[i] = MeasureResult([], ErrorCode.INSTANTIATION_ERROR, _error_text(err))
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
        start = time.perf_counter()
        built = self._build([payload for _, payload in tasks]) if tasks else []
        build_wall = time.perf_counter() - start
        share = build_wall / max(n, 1)
        results: list[MeasureResult | None] = [None] * n
        for i, r in early.items():
            results[i] = replace(r, build_seconds=share)
        start = time.perf_counter()
        for (i, _), b in zip(tasks, built):
            results[i] = self._run_built(b, share, cutoff)
        self.last_batch = BatchStats(n, build_wall, time.perf_counter() - start)
        return results  # type: ignore[return-value]

    def _run_built(self, built: _Built, build_share: float, cutoff: float | None) -> MeasureResult:
        if built.error:
            return MeasureResult([], built.error, built.msg, build_seconds=build_share)
        start = time.perf_counter()
        try:
            error, msg, costs, noise = self._run(built.path, cutoff, built.layouts)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(built.path)
        return MeasureResult(costs, error, msg, build_share, time.perf_counter() - start, noise=noise)

    # -- building

    def _build(self, tasks: list[tuple[str, object]]) -> list[_Built]:
        """Build every task on the pool; a builder that times out or dies is restarted."""
        out: list[_Built | None] = [None] * len(tasks)
        queue = deque(range(len(tasks)))
        while queue or any(w.task is not None for w in self._builders):
            for w in self._builders:
                if queue and w.ready and w.task is None:
                    self._submit_build(w, queue, tasks)
            self._collect_builds(out)
        return out  # type: ignore[return-value]

    def _submit_build(self, w: _Worker, queue: deque, tasks: list) -> None:
        t = queue.popleft()
        try:
            w.submit(t, tasks[t], self.options.build_timeout)
        except OSError:
            queue.appendleft(t)
            w.restart()

    def _collect_builds(self, out: list[_Built | None]) -> None:
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
                raise MeasureError(f"a builder process failed to start:\n{payload}")
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

    def _builder_died(self, w: _Worker, out: list[_Built | None]) -> None:
        reason = w.death_reason()
        if w.task is None:
            raise MeasureError(f"a builder process died while starting ({reason})")
        out[w.task] = _Built(ErrorCode.COMPILE_HOST, f"the builder process died ({reason})")
        w.restart()

    def _builder_timed_out(self, w: _Worker, out: list[_Built | None]) -> None:
        if w.task is None:
            raise MeasureError(f"a builder process did not start within {STARTUP_TIMEOUT:.0f} s")
        limit = self.options.build_timeout
        out[w.task] = _Built(ErrorCode.BUILD_TIMEOUT, f"building took longer than {limit:g} s")
        w.restart()

    # -- running

    def _await_runner(self) -> None:
        r = self._runner
        while not r.ready:
            if not r.conn.poll(max(0.0, r.deadline - time.monotonic())):
                r.kill()
                raise MeasureError(f"the runner process did not start within {STARTUP_TIMEOUT:.0f} s")
            try:
                kind, payload = r.receive()
            except (EOFError, OSError):
                raise MeasureError(
                    f"the runner process died while running the naive schedule ({r.death_reason()})"
                ) from None
            if kind == "failed":
                raise MeasureError(f"the runner process failed to start:\n{payload}")

    def _run(
        self, path: str, cutoff: float | None, layouts: list
    ) -> tuple[ErrorCode, str, list[float], Noise | None]:
        r = self._runner
        if not r.proc.is_alive():
            r.restart()
        self._await_runner()
        timeout = self.options.timeout
        try:
            r.submit(0, (path, cutoff, layouts), timeout)
            if not r.conn.poll(timeout):
                r.restart()
                return ErrorCode.RUN_TIMEOUT, f"the kernel did not finish within {timeout:g} s", [], None
            kind, payload = r.receive()
        except (EOFError, OSError):
            reason = r.death_reason()
            r.restart()
            return (
                ErrorCode.RUNTIME_DEVICE,
                f"the runner process died while running the kernel ({reason})",
                [],
                None,
            )
        _, result = payload
        return result


def _check_runnable(target: Target) -> None:
    import llvmlite.binding as llvm

    if not target.is_cpu:
        raise ValueError(f"Measurer runs kernels on this host's CPU; target {target} is not a CPU target")
    host = arch_of(llvm.get_process_triple())
    if arch_of(target.triple) != host:
        raise ValueError(f"target {target} ({target.triple}) cannot run on this {host} host")
