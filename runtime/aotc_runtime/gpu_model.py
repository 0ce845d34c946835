"""A loaded GPU package: its weights on the device once, one workspace and scratch arena, and `run`, which
uploads the inputs, launches every call's kernels in order on one queue (or stream) and downloads the
outputs. `aotc_runtime.load` returns a `GPUModel` for a package built for `opencl` or `cuda -arch=sm_XX`.

Everything is verified before the device is touched: checksums, signature, and plan.json (every argument
inside its buffer at an element boundary, launch arguments in range, grids and blocks within the limits).
"""

from __future__ import annotations

import os
import re
import statistics
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from aotc_runtime.gpu import (
    KDL_CUDA,
    Device,
    DeviceArray,
    DeviceBuffer,
    GPUError,
    dlpack_view,
    open_device,
)
from aotc_runtime.model import KernelTime, LoadedModel, TensorInfo, check_array, kernel_info
from aotc_runtime.package import GPUPackageContents, PackageError, read_gpu_package
from aotc_runtime.plan import DTYPES, PlanCall, PlanVariant
from aotc_runtime.signing import check_signature

__all__ = ["GPUModel", "GPUVariant", "load_gpu"]

SCRATCH_ALIGNMENT = 256  # every scratch buffer starts on a boundary any element type is aligned to
# launch sequences kept as device graphs, each for one variant and one set of input and output addresses
# (run_dlpack's tensors may change from call to call); the oldest is freed beyond this many
MAX_GRAPHS = 8
_ARCH_RE = re.compile(r"-arch=sm_(\d+)")

# a launch argument before buffers are bound: (buffer kind, its index, element offset); kind "scratch"
# is the scratch arena, the others are the plan's kinds
_Arg = tuple[str, int, int]
_Launch = tuple[str, tuple[int, int, int], tuple[int, int, int], tuple[_Arg, ...]]


@dataclass
class GPUVariant:
    """The model for one set of input shapes: its inputs, outputs, and every kernel launch in order."""

    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    calls: tuple[PlanCall, ...]
    launches: list[list[_Launch]]  # per call, its kernels' launches

    @property
    def input_shapes(self) -> tuple[tuple[int, ...], ...]:
        return tuple(t.shape for t in self.inputs)

    def describe(self) -> str:
        return ", ".join(f"{t.name}{list(t.shape)}" for t in self.inputs)


def load_gpu(
    path: str,
    device: int = 0,
    trusted_keys: Iterable[str | os.PathLike] | None = None,
    require_signature: bool | None = None,
) -> GPUModel:
    """Verify the GPU package at `path` (checksums, plan.json, signature as `aotc_runtime.load` does),
    then open the `device`-th device of its kind and put the model on it."""
    contents = read_gpu_package(path)
    check_signature(
        contents.signature, contents.digest, "package", str(path), trusted_keys, require_signature
    )
    opened = open_device(contents.kind, device)
    try:
        return GPUModel(str(path), contents, opened)
    except BaseException:
        opened.close()  # what the model allocated before failing (a kernel that does not build)
        raise


class GPUModel(LoadedModel):
    """A model on a GPU. `run` takes and returns numpy arrays like CompiledModel.run; with CUDA,
    `run_dlpack` takes and returns device tensors (torch, cupy, ...) without copies. Calls are
    serialized (one workspace on one queue): `max_concurrency` is 1."""

    max_concurrency = 1
    num_threads = 1  # host threads per call (aotc_runtime.bench reports it); the kernels' are the GPU's

    def __init__(self, path: str, contents: GPUPackageContents, device: Device) -> None:
        self.path = path
        self._manifest = contents.manifest
        self.digest = contents.digest
        self.kind = contents.kind
        self.device = device
        plan = contents.plan
        self._plan = plan
        self._lock = threading.Lock()
        self._graphs: dict[tuple, object | None] = {}
        self._seen_once: set[tuple] = set()
        self._check_device_limits()
        self._scratch_offsets, arena = _scratch_layout(plan.gpu)
        self.variants = [self._variant(v) for v in plan.variants]
        self._index_variants()
        self._program = device.load_program(self._kernel_code(contents))
        for symbol in plan.gpu.values():
            for launch in symbol.launches:
                device.kernel(self._program, launch.kernel)
        weights = device.alloc(plan.weights_nbytes)
        device.upload(weights, contents.weights)
        self._buffers: dict[str, list[DeviceBuffer]] = {
            "weight": [weights],
            "workspace": [device.alloc(max(v.workspace_bytes for v in plan.variants))],
            "scratch": [device.alloc(arena)],
            "input": [
                device.alloc(max(v.inputs[i].nbytes for v in self.variants)) for i in range(len(self.inputs))
            ],
            "output": [
                device.alloc(max(v.outputs[i].nbytes for v in self.variants))
                for i in range(len(self.outputs))
            ],
        }
        device.synchronize()

    def _check_device_limits(self) -> None:
        limit = self.device.max_threads_per_block
        for symbol, kernel in self._plan.gpu.items():
            for launch in kernel.launches:
                threads = int(np.prod(launch.block))
                if limit and threads > limit:
                    raise GPUError(
                        f"{self.path}: kernel {launch.kernel} ({symbol}) runs {threads} threads per block; "
                        f"{self.device.name} allows {limit}: rebuild the package for this device"
                    )

    def _kernel_code(self, contents: GPUPackageContents) -> bytes:
        """OpenCL source; for CUDA the cubin when the GPU is the package's arch, else its PTX."""
        if self.kind == "opencl":
            return contents.kernels["kernels.cl"]
        found = _ARCH_RE.search(self._plan.target)
        if found is None:
            raise PackageError(f"{self.path}: target {self._plan.target!r} names no -arch=sm_XX")
        built = int(found.group(1))
        major, minor = self.device.compute_capability  # type: ignore[attr-defined]
        if major * 10 + minor == built:
            return contents.kernels["kernels.cubin"]
        if major * 10 + minor < built:
            raise GPUError(
                f"{self.path}: kernels built for sm_{built}, but {self.device.name} is sm_{major}{minor}: "
                f"rebuild the package with target 'cuda -arch=sm_{major}{minor}'"
            )
        return contents.kernels["kernels.ptx"]  # the driver compiles it for this newer GPU

    def _variant(self, v: PlanVariant) -> GPUVariant:
        inputs = [TensorInfo.from_plan(t) for t in v.inputs]
        outputs = [TensorInfo.from_plan(t) for t in v.outputs]
        launches = []
        for call in v.calls:
            kernel = self._plan.gpu[call.kernel]
            params = self._plan.kernels[call.kernel]
            scratch = self._scratch_offsets[call.kernel]
            refs: list[_Arg] = [
                (a.kind, a.index, a.offset // DTYPES[dtype]) for a, (dtype, _) in zip(call.args, params)
            ]
            refs += [
                ("scratch", 0, offset // DTYPES[dtype]) for (dtype, _), offset in zip(kernel.scratch, scratch)
            ]
            launches.append(
                [(k.kernel, k.grid, k.block, tuple(refs[i] for i in k.args)) for k in kernel.launches]
            )
        return GPUVariant(inputs, outputs, v.calls, launches)

    def _where(self) -> str:
        return f" on {self.device.name}"

    def close(self) -> None:
        """Free the model's device memory and kernels."""
        with self._lock:
            self._graphs.clear()  # closing the device frees them
            self.device.close()

    def __enter__(self) -> GPUModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------- running

    def run(
        self,
        inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray],
        outputs: Mapping[str, np.ndarray] | None = None,
        num_threads: int | None = None,
    ) -> dict[str, np.ndarray]:
        """Run the model; inputs by name or in order, numpy arrays. Preallocated `outputs` (by name) are
        filled. `num_threads` is accepted for CompiledModel's signature and unused (the GPU's threads
        come from the plan)."""
        values = self._input_values(inputs)
        variant = self._pick_variant(values)
        arrays = [_host_input(v, t) for v, t in zip(values, variant.inputs)]
        results = self._host_outputs(outputs, variant)
        with self._lock:
            for buf, a in zip(self._buffers["input"], arrays):
                self.device.upload(buf, a)
            self._launch_all(variant, self._buffers)
            for buf, a in zip(self._buffers["output"], results):
                self.device.download(buf, a)
        return dict(zip(self._output_names, results))

    def run_dlpack(
        self, inputs: Mapping[str, object] | Sequence[object], outputs: Mapping[str, object] | None = None
    ):
        """CUDA only: run on device tensors (anything with `__dlpack__`: torch, cupy, jax arrays on this
        GPU), read in place, C-contiguous and of the compiled dtype and shape. Returns a dict of outputs:
        the given `outputs` tensors (filled in place), else `DeviceArray`s (`torch.from_dlpack(a)` takes
        one without a copy; `a.numpy()` copies it to the host). Returns once the outputs are complete."""
        if self.kind != "cuda":
            raise TypeError(f"run_dlpack needs a CUDA package; {self.path} is {self.kind} (use run)")
        values = self._input_values(inputs)
        variant = self._pick_variant(values)
        stream = int(self.device.stream)  # type: ignore[attr-defined]
        views = [self._device_tensor(v, t, stream, "input") for v, t in zip(values, variant.inputs)]
        given = dict(outputs or {})
        unknown = [n for n in given if n not in self._output_names]
        if unknown:
            raise ValueError(
                f"unknown output {unknown[0]!r}; expected outputs: {', '.join(self._output_names)}"
            )
        out_views = {
            n: self._device_tensor(v, t, stream, "output")
            for t in variant.outputs
            for n, v in given.items()
            if n == t.name
        }
        results: list[object] = []
        out_buffers = []
        for t in variant.outputs:
            if t.name in out_views:
                view = out_views[t.name]
                out_buffers.append(DeviceBuffer(view.data_ptr, t.nbytes))
                results.append(given[t.name])
            else:
                buf = self.device.alloc(t.nbytes)
                out_buffers.append(buf)
                results.append(self._device_array(buf, t))
        buffers = {
            **self._buffers,
            "input": [DeviceBuffer(v.data_ptr, t.nbytes) for v, t in zip(views, variant.inputs)],
            "output": out_buffers,
        }
        with self._lock:
            self._launch_all(variant, buffers)
            self.device.synchronize()
        del views, out_views  # the producers may reuse their memory now that the kernels are done
        return dict(zip(self._output_names, results))

    def _device_array(self, buf: DeviceBuffer, t: TensorInfo) -> DeviceArray:
        device = self.device
        return DeviceArray(device, buf, t.shape, t.dtype, KDL_CUDA, device.index, lambda: device.free(buf))  # type: ignore[attr-defined]

    def _device_tensor(self, obj: object, t: TensorInfo, stream: int, role: str):
        view = dlpack_view(obj, stream)
        want = (KDL_CUDA, self.device.index)  # type: ignore[attr-defined]
        if view.device != want:
            raise ValueError(
                f"{role} {t.name!r}: expected a tensor on CUDA device {want[1]}, got DLPack device {view.device}"
            )
        if view.dtype != t.dtype:
            raise ValueError(
                f"{role} {t.name!r}: expected dtype {t.dtype}, got {view.dtype or 'an unsupported type'}"
            )
        if view.shape != t.shape:
            raise ValueError(f"{role} {t.name!r}: expected shape {t.shape}, got {view.shape}")
        if not view.contiguous or view.data_ptr % t.dtype.itemsize:
            raise ValueError(
                f"{role} {t.name!r}: the tensor must be C-contiguous and aligned (.contiguous())"
            )
        return view

    def _launch_all(self, variant: GPUVariant, buffers: dict[str, list[DeviceBuffer]]) -> None:
        """Every kernel of `variant`, in order: replayed as one graph where the device records them, else
        launched one by one. Weights, workspace and scratch never move, so a graph is keyed by the
        variant and the input and output addresses."""
        key = (id(variant), *(b.handle for kind in ("input", "output") for b in buffers[kind]))
        if key not in self._graphs and key in self._seen_once:
            if len(self._graphs) >= MAX_GRAPHS:
                oldest = self._graphs.pop(next(iter(self._graphs)))
                if oldest is not None:
                    self.device.release(oldest)
            self._graphs[key] = self.device.capture(lambda: self._launch_calls(variant, buffers))
        graph = self._graphs.get(key)
        if graph is None:
            # recorded from the second call with these addresses on: run_dlpack's fresh output buffers
            # may never come back, and recording costs more than launching once
            if len(self._seen_once) >= 4 * MAX_GRAPHS:
                self._seen_once.clear()
            self._seen_once.add(key)
            self._launch_calls(variant, buffers)
        else:
            self.device.replay(graph)

    def _launch_calls(self, variant: GPUVariant, buffers: dict[str, list[DeviceBuffer]]) -> None:
        for call in variant.launches:
            self._launch_call(call, buffers)

    def _launch_call(self, call: list[_Launch], buffers: dict[str, list[DeviceBuffer]]) -> None:
        for kernel, grid, block, args in call:
            bound = [(buffers[kind][index], offset) for kind, index, offset in args]
            self.device.launch(self._program, kernel, grid, block, bound)

    def _host_outputs(
        self, outputs: Mapping[str, np.ndarray] | None, variant: GPUVariant
    ) -> list[np.ndarray]:
        given = dict(outputs or {})
        unknown = [n for n in given if n not in self._output_names]
        if unknown:
            raise ValueError(
                f"unknown output {unknown[0]!r}; expected outputs: {', '.join(self._output_names)}"
            )
        results = []
        for t in variant.outputs:
            a = given.get(t.name)
            if a is None:
                a = np.empty(t.shape, t.dtype)
            else:
                check_array(a, t, "output")
                if not (a.flags.c_contiguous and a.flags.writeable):
                    raise ValueError(
                        f"output {t.name!r}: a preallocated output must be C-contiguous and writeable"
                    )
            results.append(a)
        return results

    # ------------------------------------------------------------------------- profiling

    def profile(
        self,
        inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray] | None = None,
        repeat: int = 20,
        warmup: int = 3,
        seed: int = 0,
    ) -> list[KernelTime]:
        """Time every call of the execution plan on the device (CUDA events; OpenCL: the host clock
        around a finished queue): each call's launches `repeat` times after `warmup` whole runs."""
        feeds = self.random_inputs(seed) if inputs is None else inputs
        values = self._input_values(feeds)
        variant = self._pick_variant(values)
        info = kernel_info(self._manifest)
        timed = []
        with self._lock:
            for buf, v, t in zip(self._buffers["input"], values, variant.inputs):
                self.device.upload(buf, _host_input(v, t))
            for _ in range(max(warmup, 0)):
                self._launch_all(variant, self._buffers)
            for i, (call, launches) in enumerate(zip(variant.calls, variant.launches)):
                spent = [
                    self.device.elapsed(lambda launches=launches: self._launch_call(launches, self._buffers))
                    * 1e3
                    for _ in range(max(repeat, 1))
                ]
                task, flops = info.get(call.kernel, ("", 0))
                timed.append(KernelTime(i, call.kernel, task, statistics.median(spent), min(spent), flops))
        return timed


def _scratch_layout(gpu: dict) -> tuple[dict[str, list[int]], int]:
    """Each kernel function's scratch buffers placed in one arena (calls run one after another, so
    every function's scratch starts at 0), and the arena's size."""
    offsets: dict[str, list[int]] = {}
    size = 0
    for symbol, kernel in gpu.items():
        pos, mine = 0, []
        for _, nbytes in kernel.scratch:
            mine.append(pos)
            pos += -(-nbytes // SCRATCH_ALIGNMENT) * SCRATCH_ALIGNMENT
        offsets[symbol] = mine
        size = max(size, pos)
    return offsets, size


def _host_input(a: object, t: TensorInfo) -> np.ndarray:
    check_array(a, t, "input")
    return np.ascontiguousarray(a)
