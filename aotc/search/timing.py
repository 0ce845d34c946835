"""The runner side of measurement: how a built kernel is checked and timed (docs/search.md#measurement).

The runner process (`runner_main`) holds seeded random inputs and the naive schedule's outputs on
page-protected buffers; each candidate's first run is checked against them and doubles as the warm-up,
then `time_kernel` (or `time_flushed`, with cache flushing) takes its repeats. The GPU runner
(`gpu_runner_main`) holds the same inputs and reference outputs (from the naive schedule compiled for
this CPU) in device memory, and times candidates on the device's clock through aotc_runtime.gpu. The
emulated runner (`emulated_runner_main`) runs each candidate under qemu. Each is a `RunnerMain`: what
the search starts in a worker process to check and time candidates, and what a remote runner provides
(docs/search.md#runners).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import mmap
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from aotc.search.common import ErrorCode, Noise
from aotc.search.interference import CpuSample, Quietness, measure_quietly
from aotc.search.workers import error_text, message_tail, serve

if TYPE_CHECKING:
    from aotc.search.measure import MeasureOptions
    from aotc.target import Target

__all__ = [
    "KERNEL_NAME",
    "RunnerSetup",
    "emulated_runner_main",
    "gpu_runner_main",
    "runner_main",
    "time_flushed",
    "time_kernel",
]

KERNEL_NAME = "aotc_candidate"  # the builders name every candidate's function this; the runner looks it up
_MAX_NUMBER = 10**7
SLICE_SECONDS = 1e-3  # a repeat is timed in slices this long (at least one run each)
CUTOFF_RUNS = 4  # warm runs that may bring a candidate whose checked first run was slow under the cutoff
REPEAT_CAP = 4.0  # a repeat stops after this many times its intended length (min_repeat_ms)

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
            return ErrorCode.COMPILE_DEVICE, error_text(err), [], None
        try:
            return self._check_and_time(fn, cutoff)
        except KernelError as err:
            return ErrorCode.RUNTIME_DEVICE, str(err), [], None
        except Exception:
            return ErrorCode.UNKNOWN_ERROR, message_tail(traceback.format_exc()), [], None
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


RunnerMain = Callable[..., None]
"""`main(conn, env, setup: RunnerSetup)`, started in a worker process: it calls `serve(conn, env, setup_fn)`
with a handler that takes (path of a built candidate, cutoff seconds or None, weight layouts as JSON)
and returns (ErrorCode, message, costs in seconds, Noise or None), and a remote runner a fifth element,
the host info of the machine that measured (its records say so). A module-level function or a picklable
callable, so that a spawned process can import it."""


@dataclass(frozen=True)
class RunnerSetup:
    """What a runner starts from (docs/search.md#runners): the task's working directory, the naive
    schedule built as a reference library (for this host where the candidates run emulated or on a GPU),
    how many of its params are inputs, the measure options, the target and the threads to time with."""

    workdir: str
    reference: str
    n_inputs: int
    options: MeasureOptions
    target: Target
    threads: int


def runner_main(conn, env: dict[str, str], setup: RunnerSetup) -> None:
    """The runner of this host's CPU: it checks and times one (library, cutoff, layouts) request at a
    time, in this process."""
    args = (setup.workdir, setup.reference, setup.n_inputs, setup.options, setup.threads)
    serve(conn, env, lambda: _Bench(*args).run)


# ----------------------------------------------------------------------------- GPU


class _GPUBench:
    """The GPU runner's state: the device, the inputs and output buffers on it, the reference outputs."""

    def __init__(self, workdir: str, ref_path: str, n_inputs: int, opts: MeasureOptions, kind: str):
        from aotc_runtime.gpu import open_device

        named = _load_reference(workdir, ref_path, n_inputs, opts.seed)
        arrays = list(named.values())
        self.opts = opts
        self.device = open_device(kind)
        self.output_names = list(named)[n_inputs:]
        self.refs = arrays[n_inputs:]
        self.poison = [_poison(r) for r in self.refs]
        self.buffers = []
        for a in arrays:
            buf = self.device.alloc(max(1, a.nbytes))
            self.device.upload(buf, np.ascontiguousarray(a))
            self.buffers.append(buf)
        self.signature = [(a.dtype.name, a.nbytes) for a in arrays]
        self.program, self.scratch = None, []

    def run(
        self, request: tuple[str, float | None, list]
    ) -> tuple[ErrorCode, str, list[float], Noise | None]:
        path, cutoff, _ = request
        self.program = None
        try:
            fn = self._prepare(path)
        except Exception as err:
            self._unload()
            return ErrorCode.COMPILE_DEVICE, error_text(err), [], None
        try:
            return self._check_and_time(fn, cutoff)
        except Exception:
            return ErrorCode.RUNTIME_DEVICE, message_tail(traceback.format_exc()), [], None
        finally:
            self._unload()

    def _unload(self) -> None:
        """Free the candidate's kernels and scratch: the runner measures thousands."""
        if self.program is not None:
            with contextlib.suppress(Exception):
                self.device.synchronize()
                self.device.unload_program(self.program)
        for buf in self.scratch:
            with contextlib.suppress(Exception):
                self.device.free(buf)
        self.program, self.scratch = None, []

    def _prepare(self, path: str) -> Callable[[], None]:
        with open(path) as f:
            built = json.load(f)
        code = built["code"] if built["language"] == "opencl" else bytes.fromhex(built["code"])
        plan = built["launches"]
        sig = [(p["dtype"], p["nbytes"]) for p in plan["params"]]
        if sig != self.signature:
            raise TypeError(f"kernel parameters {sig} differ from the task's {self.signature}")
        self.program = program = self.device.load_program(code)
        self.scratch = [self.device.alloc(max(1, s["nbytes"])) for s in plan["scratch"]]
        buffers = self.buffers + self.scratch
        launches = [
            (k["kernel"], k["grid"], k["block"], [(buffers[a], 0) for a in k["args"]])
            for k in plan["launches"]
        ]

        def fn() -> None:
            for name, grid, block, args in launches:
                self.device.launch(program, name, grid, block, args)

        return fn

    def _check_and_time(
        self, fn: Callable[[], None], cutoff: float | None
    ) -> tuple[ErrorCode, str, list[float], Noise | None]:
        device, opts = self.device, self.opts
        n_out = len(self.refs)
        outputs = self.buffers[len(self.buffers) - n_out :]
        if opts.check_correctness:
            for buf, poison in zip(outputs, self.poison):
                device.upload(buf, poison)
        first = device.elapsed(fn, 1)
        if opts.check_correctness:
            for name, buf, ref in zip(self.output_names, outputs, self.refs):
                out = np.empty_like(ref)
                device.download(buf, out)
                msg = _mismatch(name, out, ref, opts.rtol, opts.atol)
                if msg:
                    return ErrorCode.WRONG_ANSWER, msg, [], None
        if cutoff is not None and first > cutoff:
            return ErrorCode.NO_ERROR, "", [first], None
        number = opts.number or max(
            1, min(_MAX_NUMBER, math.ceil(opts.min_repeat_ms * 1e-3 / max(first, 1e-7)))
        )
        return ErrorCode.NO_ERROR, "", [device.elapsed(fn, number) for _ in range(opts.repeat)], None


def gpu_runner_main(conn, env: dict[str, str], setup: RunnerSetup) -> None:
    """The GPU runner: it opens the target's device (OpenCL or CUDA), then checks and times one built
    candidate at a time."""
    kind = setup.target.kind
    serve(
        conn, env, lambda: _GPUBench(setup.workdir, setup.reference, setup.n_inputs, setup.options, kind).run
    )


# ----------------------------------------------------------------------------- emulated (qemu)


class _EmulatedBench:
    """The emulated runner's state: the task's inputs and reference outputs (the naive schedule on this
    CPU) as files, and the kernel driver built for the target's architecture; each candidate runs in a
    fresh qemu process with the target's CPU model. Its timings say nothing about the device."""

    def __init__(self, workdir: str, ref_path: str, n_inputs: int, opts: MeasureOptions, arch: str, cpu: str):
        import subprocess
        from importlib import resources

        named = _load_reference(workdir, ref_path, n_inputs, opts.seed)
        arrays = list(named.values())
        self.opts, self.workdir = opts, workdir
        self.originals = arrays[:n_inputs]
        self.output_names = list(named)[n_inputs:]
        self.refs = arrays[n_inputs:]
        from aotc.emulator import EMULATORS

        emulator = EMULATORS[arch]
        self.qemu, gcc, self.sysroot = emulator.qemu, emulator.cross_gcc, emulator.libc_root
        self.cpu = cpu
        self.driver = os.path.join(workdir, f"kernel_driver.{arch}")
        if not os.path.exists(self.driver):
            source = str(resources.files("aotc.search") / "kernel_driver.c")
            subprocess.run([gcc, "-O2", "-o", self.driver, source, "-ldl"], check=True, capture_output=True)

    def run(
        self, request: tuple[str, float | None, list]
    ) -> tuple[ErrorCode, str, list[float], Noise | None]:
        import subprocess

        path, _, layouts = request
        inputs = list(self.originals)
        if layouts:
            from aotc.schedule.layout import WeightLayout

            for obj in layouts:
                layout = WeightLayout.from_json(obj)
                inputs[layout.arg] = layout.apply(self.originals[layout.arg])
        files = []
        for i, a in enumerate([*inputs, *(_poison(r) for r in self.refs)]):
            f = os.path.join(self.workdir, f"arg{i}.bin")
            np.ascontiguousarray(a).tofile(f)
            files.append(f)
        cmd = [self.qemu, "-L", self.sysroot, "-cpu", self.cpu, self.driver, path, KERNEL_NAME]
        cmd += [str(self.opts.repeat), str(self.opts.number or 1), *files]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            return (
                ErrorCode.RUNTIME_DEVICE,
                message_tail(proc.stderr or f"exit status {proc.returncode}"),
                [],
                None,
            )
        n_in = len(inputs)
        for name, f, ref in zip(self.output_names, files[n_in:], self.refs):
            out = np.fromfile(f, ref.dtype).reshape(ref.shape)
            msg = _mismatch(name, out, ref, self.opts.rtol, self.opts.atol)
            if msg:
                return ErrorCode.WRONG_ANSWER, msg, [], None
        return ErrorCode.NO_ERROR, "", [float(line) for line in proc.stdout.split()], None


def emulated_runner_main(conn, env: dict[str, str], setup: RunnerSetup) -> None:
    """The emulated runner: each candidate runs in a fresh qemu of the target's architecture and CPU
    model, checked against the reference built for this host; its timings mean nothing."""
    from aotc.emulator import qemu_cpu

    args = (
        setup.workdir,
        setup.reference,
        setup.n_inputs,
        setup.options,
        setup.target.isa,
        qemu_cpu(setup.target),
    )
    serve(conn, env, lambda: _EmulatedBench(*args).run)
