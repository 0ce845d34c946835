"""A loaded model: validates inputs, calls the package's `aotc_run` through ctypes, returns outputs."""

from __future__ import annotations

import ctypes
import math
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from aotc_runtime.cache import install_library
from aotc_runtime.package import (
    LIBRARY,
    PackageContents,
    PackageError,
    aligned_empty,
    gpu_kind,
    read_manifest,
    read_package,
)
from aotc_runtime.plan import PlanCall, PlanTensor, PlanVariant
from aotc_runtime.signing import check_signature

if TYPE_CHECKING:
    from aotc_runtime.gpu_model import GPUModel

__all__ = ["CompiledModel", "KernelTime", "ModelVariant", "TensorInfo", "element_dtype", "load"]

_VoidPtrArray = ctypes.POINTER(ctypes.c_void_p)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @staticmethod
    def from_plan(t: PlanTensor) -> TensorInfo:
        dtype = np.dtype(t.dtype) if t.element is None else element_dtype(t.element)
        return TensorInfo(t.name, t.shape, dtype)


def element_dtype(name: str) -> np.dtype:
    """The numpy dtype of an ml_dtypes element type (bfloat16, float8_e4m3fn, int4, ...): a package with
    such an input or output needs ml_dtypes (which onnx installs), imported only then."""
    try:
        import ml_dtypes
    except ImportError:
        raise ImportError(
            f"this package takes or returns {name} tensors: pip install 'aotc-runtime[lowp]' (ml_dtypes)"
        ) from None
    return np.dtype(getattr(ml_dtypes, name))


@dataclass
class ModelVariant:
    """The model compiled for one set of input shapes: its inputs, outputs, entry function and calls."""

    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    entry: ctypes._CFuncPtr
    calls: tuple[PlanCall, ...]

    @property
    def input_shapes(self) -> tuple[tuple[int, ...], ...]:
        return tuple(t.shape for t in self.inputs)

    def describe(self) -> str:
        return ", ".join(f"{t.name}{list(t.shape)}" for t in self.inputs)


@dataclass(frozen=True)
class KernelTime:
    """One call of the execution plan, timed in place: its median and least milliseconds over the
    profiled runs, and its floating-point operations (0 where the manifest does not say). `alone_ms`,
    when asked for, is its median repeated back to back, its data warm as the tuner measured it."""

    index: int
    kernel: str
    task: str
    median_ms: float
    min_ms: float
    flops: int
    alone_ms: float | None = None

    @property
    def gflops(self) -> float:
        return self.flops / self.median_ms / 1e6 if self.median_ms > 0 else 0.0


def load(
    path: str,
    num_threads: int | None = None,
    trusted_keys: Iterable[str | os.PathLike] | None = None,
    require_signature: bool | None = None,
    max_concurrency: int | None = None,
) -> CompiledModel | GPUModel:
    """Verify the package at `path` (format, version, checksums, the manifest against the kernel
    library's own plan, the host, its signature) and only then load its library.

    A GPU package (target `opencl` or `cuda -arch=sm_XX`) is verified as strictly and put on the first
    device of its kind: a `GPUModel` (aotc_runtime.gpu_model), whose `run` is CompiledModel's;
    `num_threads` and `max_concurrency` do not apply to it.

    A signature is checked against `trusted_keys` (public-key PEM files or directories of *.pub;
    None: $AOTC_TRUSTED_KEYS). An invalid signature is always refused, a signature by a key outside
    given trusted keys too; unsigned packages load unless `require_signature` (None:
    $AOTC_REQUIRE_SIGNATURE) asks for a trusted signature.

    `max_concurrency` bounds the `run` calls that proceed at once, each with its own workspace (None:
    the cores this process may run on); callers beyond it wait."""
    if num_threads is not None:
        checked_num_threads(num_threads)  # before any of the package's code is loaded
    concurrency = available_cores() if max_concurrency is None else checked_max_concurrency(max_concurrency)
    if gpu_kind(read_manifest(path)["target"]):
        from aotc_runtime.gpu_model import load_gpu  # imports no GPU library until a device is opened

        return load_gpu(path, trusted_keys=trusted_keys, require_signature=require_signature)
    contents = read_package(path)
    check_signature(
        contents.signature, contents.digest, "package", str(path), trusted_keys, require_signature
    )
    sha = contents.manifest["members"][LIBRARY]["sha256"]
    lib_path = install_library(memoryview(contents.library), sha)
    model = CompiledModel(str(path), contents, lib_path, concurrency)
    if num_threads is not None:
        model.num_threads = num_threads
    return model


class CallSlot:
    """What one `run` call owns while it runs: a workspace and the argument arrays of the entry function."""

    def __init__(self, workspace_bytes: int, num_inputs: int, num_outputs: int) -> None:
        self.workspace = aligned_empty(max(workspace_bytes, 1))
        self.workspace_ptr = ctypes.c_void_p(self.workspace.__array_interface__["data"][0])
        self.in_argv = (ctypes.c_void_p * max(num_inputs, 1))()
        self.out_argv = (ctypes.c_void_p * max(num_outputs, 1))()


class CallSlotPool:
    """At most `limit` call slots, made when first needed; `acquire` waits while all are in use.
    `peak_in_use` is the most slots ever in use at once (calls that really ran side by side)."""

    def __init__(self, limit: int, make: Callable[[], CallSlot]) -> None:
        self.limit = limit
        self._make = make
        self._free: list[CallSlot] = []
        self._made = 0
        self.in_use = 0
        self.peak_in_use = 0
        self._cond = threading.Condition()

    def take(self) -> CallSlot:
        """A free slot (made if fewer than `limit` exist), waiting while all are in use; `give` it back."""
        with self._cond:
            while not self._free and self._made >= self.limit:
                self._cond.wait()
            self.in_use += 1
            if self.in_use > self.peak_in_use:
                self.peak_in_use = self.in_use
            if self._free:
                return self._free.pop()
            self._made += 1  # counted before making it so that no other caller overshoots the limit
        try:
            return self._make()
        except BaseException:
            with self._cond:
                self._made -= 1
                self.in_use -= 1
                self._cond.notify()
            raise

    def give(self, slot: CallSlot) -> None:
        with self._cond:
            self._free.append(slot)
            self.in_use -= 1
            self._cond.notify()

    @contextmanager
    def acquire(self) -> Iterator[CallSlot]:
        slot = self.take()
        try:
            yield slot
        finally:
            self.give(slot)

    @property
    def allocated(self) -> int:
        """Slots (workspaces) made so far."""
        return self._made


class LoadedModel:
    """What every loaded package offers, CPU or GPU: its manifest and name, its variants' inputs and
    outputs, inputs given by name or in order, the variant their shapes pick, seeded random inputs.
    A subclass sets `path`, `_manifest` and `variants` (each with `inputs`, `outputs`, `input_shapes`,
    `describe()`), then calls `_index_variants`."""

    path: str
    _manifest: dict
    variants: list

    def _index_variants(self) -> None:
        self._by_shapes = {v.input_shapes: v for v in self.variants}
        first = self.variants[0]
        self.inputs, self.outputs = first.inputs, first.outputs
        self._input_names = [t.name for t in self.inputs]
        self._output_names = [t.name for t in self.outputs]

    @property
    def manifest(self) -> dict:
        """The package's parsed manifest.json (treat as read-only)."""
        return self._manifest

    @property
    def name(self) -> str:
        return self._manifest["name"]

    def _where(self) -> str:
        return ""

    def __repr__(self) -> str:
        def sig(ts: list[TensorInfo]) -> str:
            return ", ".join(f"{t.name}: {t.dtype}{list(t.shape)}" for t in ts)

        return (
            f"<{type(self).__name__} {self.name!r} ({sig(self.inputs)}) -> ({sig(self.outputs)})"
            f"{self._where()} from {self.path}>"
        )

    def _input_values(self, inputs: Mapping[str, object] | Sequence[object]) -> list[object]:
        """The inputs in the model's order, from a list or a mapping by name."""
        names = self._input_names
        if isinstance(inputs, (list, tuple)):
            if len(inputs) != len(names):
                raise ValueError(f"expected {len(names)} inputs ({', '.join(names)}), got {len(inputs)}")
            return list(inputs)
        if isinstance(inputs, Mapping):
            if len(inputs) != len(names) or not all(n in inputs for n in names):
                raise ValueError(self._name_mismatch(inputs))
            return [inputs[n] for n in names]
        raise TypeError(
            f"inputs must be a dict of name -> array or a list of arrays, got {type(inputs).__name__}"
        )

    def _name_mismatch(self, given: Mapping[str, object], role: str = "input") -> str:
        expected = self._input_names if role == "input" else self._output_names
        unknown = [n for n in given if n not in expected]
        if unknown:
            return f"unknown {role} {unknown[0]!r}; expected {role}s: {', '.join(expected)}"
        missing = [n for n in expected if n not in given]
        return f"missing {role} {missing[0]!r}; expected {role}s: {', '.join(expected)}"

    def _pick_variant(self, values: Sequence[object]):
        """The variant compiled for these inputs' shapes; values without a shape get the first variant,
        whose checks then say what is wrong."""
        if len(self.variants) == 1:
            return self.variants[0]
        shapes = [getattr(v, "shape", None) for v in values]
        if any(s is None for s in shapes):
            return self.variants[0]
        key = tuple(tuple(int(d) for d in s) for s in shapes)
        variant = self._by_shapes.get(key)
        if variant is not None:
            return variant
        given = ", ".join(f"{n}{list(s)}" for n, s in zip(self._input_names, key))
        compiled = "; ".join(v.describe() for v in self.variants)
        raise ValueError(
            f"no variant of the model takes inputs of shapes {given}; it was compiled for {compiled}"
        )

    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Seeded inputs: standard normal floats, 0/1 integers and booleans."""
        rng = np.random.default_rng(seed)
        return [_random_array(rng, t) for t in self.inputs]


class CompiledModel(LoadedModel):
    """A model ready to run. `run` is thread-safe: up to `max_concurrency` calls run at once, each with
    its own workspace (made when first needed); further callers wait for one to finish.

    Everything it calls and every buffer it passes come from the checked plan of `contents`."""

    def __init__(
        self, path: str, contents: PackageContents, lib_path: str, max_concurrency: int | None = None
    ) -> None:
        self.path = path
        self._manifest = contents.manifest
        plan = contents.plan
        self.digest = contents.digest
        weights = contents.weights
        if weights.size != plan.weights_nbytes:
            raise PackageError(f"{path}: {weights.size} bytes of weights for a plan of {plan.weights_nbytes}")
        self._weights = weights
        self._lib = _open_library(path, lib_path)
        self.variants = [self._variant(v) for v in plan.variants]
        self._index_variants()
        self._weights_ptr = ctypes.c_void_p(weights.__array_interface__["data"][0])
        if plan.prepare is not None:
            self._prepare_weights(plan.prepare.entry)
        limit = available_cores() if max_concurrency is None else checked_max_concurrency(max_concurrency)
        # one pool for every variant, each workspace sized for the largest (variants share names, so counts)
        workspace = max(v.workspace_bytes for v in plan.variants)
        sizes = (workspace, len(self.inputs), len(self.outputs))
        self.call_slots = CallSlotPool(limit, lambda: CallSlot(*sizes))
        self._num_threads: int | None = None
        self._set_call_threads = self._lib.aotc_set_call_threads
        self._set_call_threads.restype = None
        self._set_call_threads.argtypes = [ctypes.c_int32]

    def _prepare_weights(self, symbol: str) -> None:
        """Compute the weights the package stores in a smaller form (Winograd transforms), once."""
        prepare = self._lib[symbol]  # the package check found it among the library's defined functions
        prepare.restype, prepare.argtypes = ctypes.c_int32, [ctypes.c_void_p]
        status = prepare(self._weights_ptr)
        if status != 0:
            raise RuntimeError(f"{self.path}: computing its weights at load failed (status {status})")

    def _variant(self, v: PlanVariant) -> ModelVariant:
        inputs = [TensorInfo.from_plan(t) for t in v.inputs]
        outputs = [TensorInfo.from_plan(t) for t in v.outputs]
        return ModelVariant(inputs, outputs, self._entry(v.entry), v.calls)

    def _entry(self, symbol: str) -> ctypes._CFuncPtr:
        fn = self._lib[symbol]  # the package check found it among the library's own defined functions
        fn.restype = ctypes.c_int32
        fn.argtypes = [_VoidPtrArray, _VoidPtrArray, ctypes.c_void_p, ctypes.c_void_p]
        return fn

    @property
    def max_concurrency(self) -> int:
        """How many `run` calls may proceed at once, each in its own workspace."""
        return self.call_slots.limit

    @property
    def num_threads(self) -> int:
        """Threads this model's parallel loops use: the calling thread and n - 1 workers of the package's
        pool. A setting of this model alone (another model, even of the same library, keeps its own);
        by default the cores this process may run on."""
        if self._num_threads is not None:
            return self._num_threads
        return int(self._lib.aotc_get_max_threads())

    @num_threads.setter
    def num_threads(self, n: int) -> None:
        self._num_threads = checked_num_threads(n)

    # ------------------------------------------------------------------------- running

    def run(
        self,
        inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray],
        outputs: Mapping[str, np.ndarray] | None = None,
        num_threads: int | None = None,
    ) -> dict[str, np.ndarray]:
        """Run the model; inputs by name or in order. Preallocated `outputs` (by name) are filled.
        `num_threads` applies to this call only (default: the model's `num_threads`)."""
        threads = self._num_threads if num_threads is None else checked_num_threads(num_threads)
        variant, arrays, in_ptrs = self._bind_inputs(inputs)
        results, out_ptrs = self._bind_outputs(outputs, arrays, in_ptrs, variant)
        # plain try/finally, not context managers: on a small model this path is most of a call's time
        slot = self.call_slots.take()
        try:
            if threads:
                self._set_call_threads(threads)
            in_argv, out_argv = slot.in_argv, slot.out_argv
            for i, p in enumerate(in_ptrs):
                in_argv[i] = p
            for i, p in enumerate(out_ptrs):
                out_argv[i] = p
            status = variant.entry(in_argv, out_argv, self._weights_ptr, slot.workspace_ptr)
        finally:
            if threads:
                self._set_call_threads(0)  # the library's thread-local setting is 0 between calls
            self.call_slots.give(slot)
        if status:
            self._check_status(status)
        return dict(zip(self._output_names, results))

    @contextmanager
    def _threads(self, n: int | None) -> Iterator[None]:
        """The pool's team for regions this thread starts meanwhile: a thread-local setting of the
        library, so models sharing a library (or calls from other threads) never see each other's."""
        self._set_call_threads(n or 0)
        try:
            yield
        finally:
            self._set_call_threads(0)

    def _check_status(self, status: int) -> None:
        if status:
            raise RuntimeError(
                f"model {self.name!r} ({self.path}) failed with status {status} (a kernel could not allocate memory)"
            )

    def _bind_inputs(
        self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray]
    ) -> tuple[ModelVariant, list[np.ndarray], list[int]]:
        """The variant whose input shapes the arrays have (a ValueError lists the compiled shapes when
        none has), the arrays as passed to it and their data pointers."""
        values = self._input_values(inputs)
        variant = self._pick_variant(values)
        arrays, ptrs = [], []
        for v, t in zip(values, variant.inputs):
            a, p = _conform(v, t)
            arrays.append(a)
            ptrs.append(p)
        return variant, arrays, ptrs

    def _bind_outputs(
        self,
        outputs: Mapping[str, np.ndarray] | None,
        inputs: list[np.ndarray],
        in_ptrs: list[int],
        variant: ModelVariant,
    ) -> tuple[list[np.ndarray], list[int]]:
        if outputs is None:
            results = [np.empty(t.shape, t.dtype) for t in variant.outputs]
            return results, [_address(a) for a in results]
        if any(n not in self._output_names for n in outputs):
            raise ValueError(self._name_mismatch(outputs, "output"))
        results, ptrs = [], []
        for t in variant.outputs:
            given = outputs.get(t.name)
            a = np.empty(t.shape, t.dtype) if given is None else given
            ptrs.append(_writable_pointer(a, t))
            results.append(a)
        spans = [(p, a.nbytes, n) for p, a, n in zip(ptrs, results, self._output_names)]
        _check_disjoint(spans, [(p, a.nbytes, n) for p, a, n in zip(in_ptrs, inputs, self._input_names)])
        return results, ptrs

    # ------------------------------------------------------------------------- benchmarking

    def benchmark(
        self,
        inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray] | None = None,
        repeat: int = 20,
        number: int | None = None,
        warmup: int = 3,
        seed: int = 0,
        min_repeat_ms: float = 10.0,
    ) -> dict:
        """Time `run` (milliseconds per call) on `inputs`, or on seeded random inputs when None.

        Each of `repeat` measurements averages `number` calls (None: enough calls for one measurement to
        last `min_repeat_ms`): median/mean/std/min/max of those, plus every `aotc_runtime.bench` statistic
        of the calls themselves (percentiles, throughput). Streams and durations: `aotc_runtime.bench`."""
        from aotc_runtime.bench import Budget, measure, model_calls

        calls = model_calls(self, inputs, 1, seed=seed)
        repeat = max(repeat, 1)
        warm = Budget(runs=warmup)
        if number is None:
            probe = measure(calls, Budget(runs=max(warmup, 3)), Budget(runs=0))
            number = min(max(1, math.ceil(min_repeat_ms / max(probe.percentile(50), 1e-6))), 1 << 20)
            warm = Budget(runs=0)
        timed = measure(calls, Budget(runs=repeat * number), warm, threads=self.num_threads)
        times = np.asarray(timed.latencies_ms).reshape(repeat, number).mean(axis=1).tolist()
        return {
            **timed.to_dict(),
            "median_ms": statistics.median(times),
            "mean_ms": statistics.fmean(times),
            "std_ms": statistics.pstdev(times),
            "min_ms": min(times),
            "max_ms": max(times),
            "repeat": len(times),
            "number": number,
            "num_threads": self.num_threads,
        }

    def profile(
        self,
        inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray] | None = None,
        outputs: Mapping[str, np.ndarray] | None = None,
        repeat: int = 20,
        warmup: int = 3,
        seed: int = 0,
        alone: bool = False,
    ) -> list[KernelTime]:
        """Time every kernel call of the execution plan where it runs: the whole plan is run `repeat`
        times, kernel by kernel through the library's exported kernels, so each call sees the caches
        its predecessors left, as in `run`. With `alone`, one more pass runs each call `repeat` times
        back to back. Inputs are seeded random ones when None; preallocated `outputs` (by name) are
        filled as `run` fills them."""
        variant, feeds, in_ptrs = self._bind_inputs(
            inputs if inputs is not None else self.random_inputs(seed)
        )
        _outputs, out_ptrs = self._bind_outputs(outputs, feeds, in_ptrs, variant)  # alive while kernels write
        times: list[list[float]] = [[] for _ in variant.calls]
        clock = time.perf_counter
        with self.call_slots.acquire() as slot, self._threads(self._num_threads):
            calls = self._plan_calls(variant.calls, in_ptrs, out_ptrs, slot.workspace_ptr.value or 0)
            for i in range(warmup + max(repeat, 1)):
                for (fn, argv), spent in zip(calls, times):
                    start = clock()
                    status = fn(argv)
                    end = clock()
                    self._check_status(status)
                    if i >= warmup:
                        spent.append((end - start) * 1e3)
            alone_ms = [self._time_alone(fn, argv, max(repeat, 1)) for fn, argv in calls] if alone else None
        info = kernel_info(self._manifest)
        timed = []
        for i, (call, spent) in enumerate(zip(variant.calls, times)):
            task, flops = info.get(call.kernel, ("", 0))
            timed.append(
                KernelTime(
                    i,
                    call.kernel,
                    task,
                    statistics.median(spent),
                    min(spent),
                    flops,
                    None if alone_ms is None else alone_ms[i],
                )
            )
        return timed

    def _time_alone(self, fn: ctypes._CFuncPtr, argv: ctypes.Array, repeat: int) -> float:
        """Median ms of one call run `repeat` times back to back, after one untimed run."""
        clock = time.perf_counter
        self._check_status(fn(argv))
        spent = []
        for _ in range(repeat):
            start = clock()
            status = fn(argv)
            spent.append((clock() - start) * 1e3)
            self._check_status(status)
        return statistics.median(spent)

    def _plan_calls(
        self, plan_calls: tuple[PlanCall, ...], in_ptrs: list[int], out_ptrs: list[int], workspace_ptr: int
    ) -> list[tuple[ctypes._CFuncPtr, ctypes.Array]]:
        """Each call of a variant's checked execution plan as (kernel function, its argument array)."""
        bases = {
            "input": in_ptrs,
            "output": out_ptrs,
            "weight": [self._weights_ptr.value or 0],
            "workspace": [workspace_ptr],
        }
        calls = []
        for call in plan_calls:
            fn = self._lib[call.kernel]  # checked: one of the library's own defined functions
            fn.restype = ctypes.c_int32
            fn.argtypes = [ctypes.c_void_p]
            argv = (ctypes.c_void_p * max(len(call.args), 1))(
                *(bases[a.kind][a.index] + a.offset for a in call.args)
            )
            calls.append((fn, argv))
        return calls


def kernel_info(manifest: dict) -> dict[str, tuple[str, int]]:
    """Each kernel's task name and flops as the manifest describes them (informational: 0 and '' when odd)."""
    info = {}
    for k in manifest["kernels"]:
        task, flops = k.get("task", ""), k.get("flops", 0)
        valid_flops = isinstance(flops, int) and not isinstance(flops, bool) and flops >= 0
        info[k["symbol"]] = (task if isinstance(task, str) else "", flops if valid_flops else 0)
    return info


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def checked_num_threads(n: object) -> int:
    """`n` if it is a thread count this process can use: 1 to its available cores."""
    cores = available_cores()
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= cores:
        raise ValueError(
            f"num_threads must be an int from 1 to {cores} (the cores this process may run on), got {n!r}"
        )
    return n


def checked_max_concurrency(n: object) -> int:
    """`n` if it is a usable bound on concurrent calls: an int of at least 1."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"max_concurrency must be an int of at least 1, got {n!r}")
    return n


def _open_library(path: str, lib_path: str) -> ctypes.CDLL:
    try:
        return ctypes.CDLL(lib_path)
    except OSError as err:
        raise OSError(
            f"{path}: cannot load its kernel library {lib_path} ({err}); the host needs glibc (libc, libm)"
        ) from None


def _address(a: np.ndarray) -> int:
    """Data pointer of `a`; `c_char.from_buffer` is several times cheaper than `__array_interface__`."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    except (TypeError, ValueError):
        return a.__array_interface__["data"][0]


def _conform(a: np.ndarray, t: TensorInfo) -> tuple[np.ndarray, int]:
    """`a` and its data pointer when usable as is (zero-copy), else a C-contiguous aligned copy."""
    check_array(a, t, "input")
    if a.flags.c_contiguous:
        ptr = _address(a)
        if ptr % t.dtype.alignment == 0:
            return a, ptr
    a = np.array(a, order="C")
    return a, _address(a)


def _writable_pointer(a: np.ndarray, t: TensorInfo) -> int:
    check_array(a, t, "output")
    flags = a.flags
    if not (flags.c_contiguous and flags.aligned and flags.writeable):
        raise ValueError(
            f"output {t.name!r}: a preallocated output must be C-contiguous, aligned and writeable"
        )
    return _address(a)


def check_array(a: object, t: TensorInfo, role: str) -> None:
    """A numpy array of the tensor's dtype and shape, else a TypeError or ValueError naming it."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{role} {t.name!r}: expected a numpy.ndarray, got {type(a).__name__}")
    if a.dtype != t.dtype:
        raise ValueError(f"{role} {t.name!r}: expected dtype {t.dtype}, got {a.dtype}")
    if a.shape != t.shape:
        raise ValueError(f"{role} {t.name!r}: expected shape {t.shape}, got {a.shape}")


def _check_disjoint(outputs: list[tuple[int, int, str]], inputs: list[tuple[int, int, str]]) -> None:
    """Kernels assume distinct buffers never overlap: refuse outputs sharing memory with anything."""
    for i, (p, n, name) in enumerate(outputs):
        for q, m, other in outputs[i + 1 :] + inputs:
            if n and m and p < q + m and q < p + n:
                raise ValueError(f"output {name!r} overlaps {other!r} in memory")


def _random_array(rng: np.random.Generator, t: TensorInfo) -> np.ndarray:
    if t.dtype.kind == "f":
        return rng.standard_normal(t.shape).astype(t.dtype)
    if t.dtype.kind == "b":
        return np.asarray(rng.random(t.shape) < 0.5)  # a 0-d comparison is a numpy scalar, not an array
    return rng.integers(0, 2, t.shape).astype(t.dtype)
