"""GPU devices for aotc_runtime: one interface, an OpenCL backend (pyopencl) and a CUDA one (the driver
API of cuda.bindings), each imported only when a device of its kind is opened.

A device owns one context and one in-order queue (OpenCL) or stream (CUDA): everything enqueued on it
runs in order. Kernels take each buffer as two arguments, its base and an int64 element offset
(aotc.codegen.gpu's convention), so a launch's `args` are (buffer, element offset) pairs.

The CUDA driver is touched only by `open_device("cuda")`, through `cuInit`, whose failure (no driver, no
GPU) is reported as `GPUUnavailable`. DLPack: `dlpack_view` reads another library's device tensor
without copying, `DeviceArray` hands a device buffer out as a DLPack tensor.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "INSTALL_HINTS",
    "OPENCL_DEVICE_ENV",
    "CUDADevice",
    "DLPackView",
    "Device",
    "DeviceArray",
    "DeviceBuffer",
    "GPUError",
    "GPUUnavailable",
    "OpenCLDevice",
    "dlpack_view",
    "open_device",
]

OPENCL_DEVICE_ENV = "AOTC_OPENCL_DEVICE"
INSTALL_HINTS = {
    "opencl": "pip install 'aotc-runtime[opencl]'; without an OpenCL GPU driver, apt-get install pocl-opencl-icd "
    "runs the kernels on the CPU",
    "cuda": "pip install 'aotc-runtime[cuda]', on a machine with an NVIDIA GPU and its driver",
}


class GPUUnavailable(RuntimeError):
    """No device of the kind asked for: its Python binding, driver or device is missing."""


class GPUError(RuntimeError):
    """A device call failed: building or loading kernels, allocating, copying or launching."""


@dataclass(frozen=True)
class DeviceBuffer:
    """Device memory of `nbytes`: `handle` is a pyopencl Buffer (OpenCL) or the address (CUDA)."""

    handle: object
    nbytes: int


@dataclass(eq=False)
class Program:
    """Loaded kernels: `handle` is a pyopencl Program (OpenCL) or a CUmodule (CUDA); `kernels` caches
    the kernel handles looked up in it, and dies with it (a cache keyed by id() served a freed program's
    kernels to the next program given the same address: a tuner loads thousands)."""

    handle: object
    kernels: dict[str, object] = field(default_factory=dict)


class Device:
    """A GPU as aotc_runtime uses it: memory, programs, launches in order on one queue or stream."""

    kind = ""
    name = ""
    max_threads_per_block = 0

    def alloc(self, nbytes: int) -> DeviceBuffer:
        raise NotImplementedError

    def upload(self, buf: DeviceBuffer, array: np.ndarray, byte_offset: int = 0) -> None:
        """Copy `array` (C-contiguous) into `buf` at `byte_offset`, in queue order."""
        raise NotImplementedError

    def download(self, buf: DeviceBuffer, array: np.ndarray, byte_offset: int = 0) -> None:
        """Fill `array` (C-contiguous, writeable) from `buf` at `byte_offset`, after everything enqueued."""
        raise NotImplementedError

    def load_program(self, code: str | bytes) -> Program:
        """OpenCL C source, or a CUDA cubin or PTX image, ready to launch kernels of."""
        raise NotImplementedError

    def unload_program(self, program: Program) -> None:
        """Free what loading `program` took on the device (OpenCL: the garbage collector does)."""
        program.kernels.clear()

    def kernel(self, program: Program, name: str) -> object:
        """The kernel `name` of `program` (cached); GPUError when the program has none of that name."""
        raise NotImplementedError

    def launch(
        self,
        program: Program,
        kernel_name: str,
        grid: Sequence[int],
        block: Sequence[int],
        args: Sequence[tuple[DeviceBuffer, int]],
    ) -> None:
        """Enqueue one kernel: `grid` blocks of `block` threads, each buffer argument with its element offset."""
        raise NotImplementedError

    def synchronize(self) -> None:
        raise NotImplementedError

    def elapsed(self, fn: Callable[[], None], number: int = 1) -> float:
        """Seconds per call of `fn` (which enqueues work), over `number` calls, on the device's clock."""
        raise NotImplementedError

    def free(self, buf: DeviceBuffer) -> None:
        """Give `buf` back now (else it lives as long as the device)."""

    def capture(self, fn: Callable[[], None]) -> object | None:
        """The work `fn` enqueues, recorded once as a graph that `replay` enqueues again in one call, or
        None where the device has no graphs (OpenCL) or recording failed (then nothing ran)."""
        return None

    def replay(self, graph: object) -> None:
        """Enqueue a graph that `capture` recorded."""
        raise NotImplementedError

    def release(self, graph: object) -> None:
        """Free a graph that `capture` recorded."""

    def close(self) -> None:
        """Free what the device allocated; the device is unusable afterwards."""

    def _check_copy(self, buf: DeviceBuffer, array: np.ndarray, byte_offset: int, what: str) -> None:
        if not array.flags.c_contiguous:
            raise ValueError(f"{what}: the host array must be C-contiguous")
        if byte_offset < 0 or byte_offset + array.nbytes > buf.nbytes:
            raise ValueError(
                f"{what}: bytes [{byte_offset}, {byte_offset + array.nbytes}) lie outside a "
                f"{buf.nbytes}-byte device buffer"
            )


def open_device(kind: str, index: int = 0) -> Device:
    """The `index`-th device of `kind` ("opencl" or "cuda"); for OpenCL, $AOTC_OPENCL_DEVICE (an index
    into every platform's devices, in order) overrides `index`. Raises GPUUnavailable naming what to
    install when the binding, driver or device is missing."""
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise ValueError(f"a device index must be a non-negative int, got {index!r}")
    if kind == "opencl":
        return OpenCLDevice(index)
    if kind == "cuda":
        return CUDADevice(index)
    raise ValueError(f"device kind must be 'opencl' or 'cuda', got {kind!r}")


# ----------------------------------------------------------------------------- OpenCL


class OpenCLDevice(Device):
    """An OpenCL device through pyopencl: one context, one in-order command queue."""

    kind = "opencl"

    def __init__(self, index: int = 0) -> None:
        try:
            import pyopencl as cl
        except ImportError as err:
            raise GPUUnavailable(f"pyopencl is not installed ({err}): {INSTALL_HINTS['opencl']}") from None
        self._cl = cl
        try:
            devices = [(p, d) for p in cl.get_platforms() for d in p.get_devices()]
        except Exception as err:  # no ICD platform registered: pyopencl raises its own error types
            devices, reason = [], f" ({type(err).__name__}: {err})"
        else:
            reason = ""
        if not devices:
            raise GPUUnavailable(f"no OpenCL device found{reason}: {INSTALL_HINTS['opencl']}")
        chosen = os.environ.get(OPENCL_DEVICE_ENV)
        if chosen is not None:
            if not chosen.strip().isdigit():
                raise GPUUnavailable(f"${OPENCL_DEVICE_ENV} must be a device index, got {chosen!r}")
            index = int(chosen)
        if index >= len(devices):
            listed = "; ".join(f"{i}: {d.name} ({p.name})" for i, (p, d) in enumerate(devices))
            raise GPUUnavailable(f"no OpenCL device {index}; the devices are {listed}")
        platform, device = devices[index]
        self.name = f"{device.name.strip()} ({platform.name.strip()})"
        self.max_threads_per_block = int(device.max_work_group_size)
        self._ctx = cl.Context([device])
        self._queue = cl.CommandQueue(self._ctx)

    def alloc(self, nbytes: int) -> DeviceBuffer:
        try:
            handle = self._cl.Buffer(self._ctx, self._cl.mem_flags.READ_WRITE, size=max(int(nbytes), 1))
        except self._cl.Error as err:
            raise GPUError(f"OpenCL could not allocate {nbytes} bytes on {self.name}: {err}") from None
        return DeviceBuffer(handle, int(nbytes))

    def upload(self, buf: DeviceBuffer, array: np.ndarray, byte_offset: int = 0) -> None:
        self._check_copy(buf, array, byte_offset, "upload")
        if array.nbytes:
            self._cl.enqueue_copy(self._queue, buf.handle, array, dst_offset=byte_offset)

    def download(self, buf: DeviceBuffer, array: np.ndarray, byte_offset: int = 0) -> None:
        self._check_copy(buf, array, byte_offset, "download")
        if array.nbytes:
            self._cl.enqueue_copy(self._queue, array, buf.handle, src_offset=byte_offset, is_blocking=True)

    def load_program(self, code: str | bytes) -> object:
        source = code.decode() if isinstance(code, bytes) else code
        try:
            return Program(self._cl.Program(self._ctx, source).build())
        except self._cl.Error as err:
            raise GPUError(f"OpenCL could not build the kernels on {self.name}:\n{err}") from None

    def kernel(self, program: Program, name: str) -> object:
        """The kernel `name` of `program` (cached); GPUError when the program has none of that name."""
        kernel = program.kernels.get(name)
        if kernel is None:
            try:
                kernel = self._cl.Kernel(program.handle, name)
            except self._cl.Error as err:
                raise GPUError(f"the OpenCL program has no kernel {name!r} ({err})") from None
            program.kernels[name] = kernel
        return kernel

    def launch(
        self,
        program: Program,
        kernel_name: str,
        grid: Sequence[int],
        block: Sequence[int],
        args: Sequence[tuple[DeviceBuffer, int]],
    ) -> None:
        kernel = self.kernel(program, kernel_name)
        flat = [v for buf, offset in args for v in (buf.handle, np.int64(offset))]
        try:
            kernel.set_args(*flat)
            global_size = tuple(int(g) * int(b) for g, b in zip(grid, block))
            self._cl.enqueue_nd_range_kernel(self._queue, kernel, global_size, tuple(int(b) for b in block))
        except self._cl.Error as err:
            raise GPUError(f"OpenCL could not launch {kernel_name} on {self.name}: {err}") from None

    def synchronize(self) -> None:
        self._queue.finish()

    def elapsed(self, fn: Callable[[], None], number: int = 1) -> float:
        number = max(int(number), 1)
        self._queue.finish()
        start = time.perf_counter()
        for _ in range(number):
            fn()
        self._queue.finish()
        return (time.perf_counter() - start) / number

    def close(self) -> None:
        self._queue.finish()  # pyopencl frees the buffers and programs with their last reference


# ----------------------------------------------------------------------------- CUDA


class CUDADevice(Device):
    """An NVIDIA GPU through the CUDA driver API: its primary context and one stream."""

    kind = "cuda"

    def __init__(self, index: int = 0) -> None:
        try:
            from cuda.bindings import driver as cu
        except ImportError as err:
            raise GPUUnavailable(f"cuda-bindings is not installed ({err}): {INSTALL_HINTS['cuda']}") from None
        self._cu = cu
        try:
            (status,) = cu.cuInit(0)
        except Exception as err:  # libcuda.so missing: the binding raises when it cannot load it
            raise GPUUnavailable(
                f"the NVIDIA driver cannot be loaded ({err}): {INSTALL_HINTS['cuda']}"
            ) from None
        if status != cu.CUresult.CUDA_SUCCESS:
            raise GPUUnavailable(f"no usable NVIDIA GPU (cuInit: {self._error_name(status)})")
        count = self._call(cu.cuDeviceGetCount(), "cuDeviceGetCount")
        if index >= count:
            raise GPUUnavailable(f"no CUDA device {index}: this machine has {count}")
        self.index = index
        self._dev = self._call(cu.cuDeviceGet(index), "cuDeviceGet")
        name = self._call(cu.cuDeviceGetName(256, self._dev), "cuDeviceGetName")
        self.name = name.split(b"\0", 1)[0].decode(errors="replace")
        attr = cu.CUdevice_attribute
        major = self._attribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        minor = self._attribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
        self.compute_capability = (major, minor)
        self.max_threads_per_block = self._attribute(attr.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)
        self._ctx = self._call(cu.cuDevicePrimaryCtxRetain(self._dev), "cuDevicePrimaryCtxRetain")
        self._enter()
        self.stream = self._call(
            cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate"
        )
        self._allocations: set[int] = set()
        self._modules: list[object] = []
        self._closed = False

    @property
    def arch(self) -> str:
        """The device's SM architecture as a target names it (sm_90)."""
        return "sm_{}{}".format(*self.compute_capability)

    def _error_name(self, status: object) -> str:
        try:
            err, name = self._cu.cuGetErrorName(status)
            return name.decode() if err == self._cu.CUresult.CUDA_SUCCESS else repr(status)
        except Exception:
            return repr(status)

    def _call(self, result: tuple, what: str) -> object:
        """The value of a driver call's (status, value...) result; GPUError naming the call otherwise."""
        status, *values = result
        if status != self._cu.CUresult.CUDA_SUCCESS:
            raise GPUError(
                f"CUDA {what} failed on device {getattr(self, 'name', '?')}: {self._error_name(status)}"
            )
        return values[0] if len(values) == 1 else tuple(values)

    def _attribute(self, attr: object) -> int:
        return int(self._call(self._cu.cuDeviceGetAttribute(attr, self._dev), "cuDeviceGetAttribute"))

    def _enter(self) -> None:
        """Make the context current in the calling thread (contexts are per thread)."""
        if getattr(self, "_closed", False):
            raise GPUError(f"CUDA device {self.name} is closed")
        self._call(self._cu.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")

    def alloc(self, nbytes: int) -> DeviceBuffer:
        self._enter()
        ptr = int(self._call(self._cu.cuMemAlloc(max(int(nbytes), 1)), f"cuMemAlloc of {nbytes} bytes"))
        self._allocations.add(ptr)
        return DeviceBuffer(ptr, int(nbytes))

    def free(self, buf: DeviceBuffer) -> None:
        if self._closed or buf.handle not in self._allocations:
            return  # closing the device freed it, or it is not this device's
        self._enter()
        self._allocations.discard(buf.handle)
        self._call(self._cu.cuMemFree(buf.handle), "cuMemFree")

    def upload(self, buf: DeviceBuffer, array: np.ndarray, byte_offset: int = 0) -> None:
        self._check_copy(buf, array, byte_offset, "upload")
        if array.nbytes:
            self._enter()
            # from pageable memory this returns once the data is staged: `array` may change afterwards
            self._call(
                self._cu.cuMemcpyHtoDAsync(
                    buf.handle + byte_offset, array.ctypes.data, array.nbytes, self.stream
                ),
                "cuMemcpyHtoDAsync",
            )

    def download(self, buf: DeviceBuffer, array: np.ndarray, byte_offset: int = 0) -> None:
        self._check_copy(buf, array, byte_offset, "download")
        if not array.flags.writeable:
            raise ValueError("download: the host array must be writeable")
        if array.nbytes:
            self._enter()
            self._call(
                self._cu.cuMemcpyDtoHAsync(
                    array.ctypes.data, buf.handle + byte_offset, array.nbytes, self.stream
                ),
                "cuMemcpyDtoHAsync",
            )
            self.synchronize()

    def load_program(self, code: str | bytes) -> object:
        """A cubin, or PTX (NUL-terminated here, as the driver wants it), loaded as a module."""
        image = code.encode() if isinstance(code, str) else bytes(code)
        if not image.startswith(b"\x7fELF") and not image.endswith(b"\0"):
            image += b"\0"
        self._enter()
        module = self._call(self._cu.cuModuleLoadData(image), "cuModuleLoadData (loading the kernels)")
        self._modules.append(module)
        return Program(module)

    def unload_program(self, program: Program) -> None:
        """Unload a module this device loaded (a tuner's runner loads one per candidate)."""
        if program.handle in self._modules:
            self._modules.remove(program.handle)
            self._enter()
            self._cu.cuModuleUnload(program.handle)
        program.kernels.clear()

    def kernel(self, program: Program, name: str) -> object:
        """The kernel `name` of the module `program` (cached); GPUError when it has none of that name."""
        fn = program.kernels.get(name)
        if fn is None:
            fn = self._call(
                self._cu.cuModuleGetFunction(program.handle, name.encode()), f"cuModuleGetFunction({name})"
            )
            program.kernels[name] = fn
        return fn

    def launch(
        self,
        program: Program,
        kernel_name: str,
        grid: Sequence[int],
        block: Sequence[int],
        args: Sequence[tuple[DeviceBuffer, int]],
    ) -> None:
        self._enter()
        fn = self.kernel(program, kernel_name)
        # kernelParams is an array of pointers, one to each argument's value: a pointer, then an int64
        values = np.array([v for buf, offset in args for v in (buf.handle, offset)], dtype=np.uint64)
        pointers = values.ctypes.data + 8 * np.arange(len(values), dtype=np.uint64)
        self._call(
            self._cu.cuLaunchKernel(
                fn, *(int(g) for g in grid), *(int(b) for b in block), 0, self.stream,
                pointers.ctypes.data if len(values) else 0, 0,
            ),
            f"cuLaunchKernel({kernel_name})",
        )  # fmt: skip

    def synchronize(self) -> None:
        self._enter()
        self._call(self._cu.cuStreamSynchronize(self.stream), "cuStreamSynchronize (a kernel failed)")

    def elapsed(self, fn: Callable[[], None], number: int = 1) -> float:
        number = max(int(number), 1)
        self._enter()
        cu = self._cu
        start = self._call(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DEFAULT), "cuEventCreate")
        end = self._call(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DEFAULT), "cuEventCreate")
        try:
            self._call(cu.cuEventRecord(start, self.stream), "cuEventRecord")
            for _ in range(number):
                fn()
            self._call(cu.cuEventRecord(end, self.stream), "cuEventRecord")
            self._call(cu.cuEventSynchronize(end), "cuEventSynchronize")
            ms = self._call(cu.cuEventElapsedTime(start, end), "cuEventElapsedTime")
        finally:
            cu.cuEventDestroy(start)
            cu.cuEventDestroy(end)
        return float(ms) / 1e3 / number

    def capture(self, fn: Callable[[], None]) -> object | None:
        """A CUDA graph of the kernels `fn` launches on the stream: replaying it costs one driver call
        instead of one per kernel (the Python side of a launch is about 10 us, as long as a small kernel)."""
        cu = self._cu
        self._enter()
        mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        (status,) = cu.cuStreamBeginCapture(self.stream, mode)
        if status != cu.CUresult.CUDA_SUCCESS:
            return None
        try:
            fn()
        finally:  # a failed launch ends the capture too, leaving the stream usable
            status, *graph = cu.cuStreamEndCapture(self.stream)
        if status != cu.CUresult.CUDA_SUCCESS or not graph:
            return None
        status, *executable = cu.cuGraphInstantiate(graph[0], 0)
        cu.cuGraphDestroy(graph[0])  # the executable graph holds its own copy
        return executable[0] if status == cu.CUresult.CUDA_SUCCESS and executable else None

    def replay(self, graph: object) -> None:
        self._enter()
        self._call(self._cu.cuGraphLaunch(graph, self.stream), "cuGraphLaunch")

    def release(self, graph: object) -> None:
        if not self._closed:
            self._enter()
            self._cu.cuGraphExecDestroy(graph)

    def close(self) -> None:
        if self._closed:
            return
        try:
            self._enter()
            self._cu.cuStreamSynchronize(self.stream)
            for ptr in self._allocations:
                self._cu.cuMemFree(ptr)
            for module in self._modules:
                self._cu.cuModuleUnload(module)
            self._cu.cuStreamDestroy(self.stream)
            self._cu.cuDevicePrimaryCtxRelease(self._dev)
        finally:
            self._allocations, self._modules = set(), []
            self._closed = True


# ----------------------------------------------------------------------------- DLPack

# DLPack's C structs (dlpack.h, the unversioned "dltensor" capsule every producer still gives by default)
KDL_CPU, KDL_CUDA = 1, 2
_DL_CODES = {"i": 0, "u": 1, "f": 2, "b": 6}  # kDLInt, kDLUInt, kDLFloat, kDLBool


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [
    ("dl_tensor", _DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _DELETER),
]

_CAPSULE_NAME = b"dltensor"  # PyCapsule keeps a pointer to its name: this bytes object lives forever
_CAPSULE_NAME_PTR = ctypes.c_char_p(_CAPSULE_NAME)
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _api(name: str, restype: object, argtypes: list) -> Callable:
    """A private function object of the C API (`pythonapi[name]` is a new one; attributes are shared)."""
    fn = ctypes.pythonapi[name]
    fn.restype, fn.argtypes = restype, argtypes
    return fn


_capsule_new = _api("PyCapsule_New", ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p])
_capsule_pointer = _api("PyCapsule_GetPointer", ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p])
# the destructor gets the capsule as a bare PyObject* (it is being destroyed: no new references to it)
_capsule_is_valid = _api("PyCapsule_IsValid", ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p])
_capsule_pointer_raw = _api("PyCapsule_GetPointer", ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p])

# exported tensors not yet released by their consumer: manager_ctx (a key) -> (struct, shape, owner)
_exported: dict[int, tuple] = {}
_next_key = [1]


@_DELETER
def _release(managed: ctypes.POINTER(_DLManagedTensor)) -> None:  # type: ignore[valid-type]
    _exported.pop(managed.contents.manager_ctx or 0, None)


@_CAPSULE_DESTRUCTOR
def _capsule_destructor(capsule: int) -> None:
    # a capsule nobody consumed (still named "dltensor") releases its tensor; a consumer renames it and
    # calls the deleter itself when done
    if _capsule_is_valid(capsule, _CAPSULE_NAME):
        address = _capsule_pointer_raw(capsule, _CAPSULE_NAME)
        if address:
            _release(ctypes.cast(address, ctypes.POINTER(_DLManagedTensor)))


def _dl_dtype(dtype: np.dtype) -> _DLDataType:
    return _DLDataType(_DL_CODES[dtype.kind], dtype.itemsize * 8, 1)


class DeviceArray:
    """A tensor in device memory that DLPack consumers take without copying (`torch.from_dlpack(a)`,
    `cupy.from_dlpack(a)`); `numpy()` copies it to the host. It keeps its device buffer alive as long as
    any consumer holds the tensor. The data is complete when the producing call returns (it synchronizes),
    so the consumer's stream needs no wait."""

    def __init__(
        self,
        device: object,
        buffer: DeviceBuffer,
        shape: tuple[int, ...],
        dtype: np.dtype,
        device_type: int = KDL_CUDA,
        device_id: int = 0,
        on_free: Callable[[], None] | None = None,
    ) -> None:
        self.device, self.buffer = device, buffer
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self._dl_device = (device_type, device_id)
        self._on_free = on_free

    def __del__(self) -> None:
        if self._on_free is not None:
            with contextlib.suppress(Exception):  # at interpreter exit the device may be gone already
                self._on_free()

    def __repr__(self) -> str:
        return f"<DeviceArray {self.dtype}{list(self.shape)} on {getattr(self.device, 'name', '?')}>"

    @property
    def data_ptr(self) -> int:
        return int(self.buffer.handle)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._dl_device

    def __dlpack__(self, stream: object = None, max_version: object = None, dl_device=None, copy=None):
        if copy:
            raise BufferError("DeviceArray only exports its own memory (copy=True is not supported)")
        if dl_device is not None and tuple(dl_device) != self._dl_device:
            raise BufferError(f"DeviceArray lives on DLPack device {self._dl_device}, not {tuple(dl_device)}")
        key = _next_key[0]
        _next_key[0] += 1
        shape = (ctypes.c_int64 * max(len(self.shape), 1))(*self.shape)
        managed = _DLManagedTensor()
        managed.dl_tensor = _DLTensor(
            self.data_ptr, _DLDevice(*self._dl_device), len(self.shape), _dl_dtype(self.dtype),
            ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64)), None, 0,
        )  # fmt: skip
        managed.manager_ctx = key
        managed.deleter = _release
        _exported[key] = (managed, shape, self)
        return _capsule_new(
            ctypes.addressof(managed), _CAPSULE_NAME_PTR, ctypes.cast(_capsule_destructor, ctypes.c_void_p)
        )

    def numpy(self) -> np.ndarray:
        """A host copy."""
        out = np.empty(self.shape, self.dtype)
        self.device.download(self.buffer, out)  # type: ignore[attr-defined]
        return out


@dataclass(frozen=True)
class DLPackView:
    """Another library's tensor as DLPack describes it, borrowed: `capsule` keeps it alive."""

    data_ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype | None  # None: a type numpy has no name for
    device: tuple[int, int]
    contiguous: bool
    capsule: object


def dlpack_view(obj: object, stream: int | None = None) -> DLPackView:
    """Borrow `obj`'s memory through its `__dlpack__` (the producer orders its pending work before
    `stream`, a CUDA stream handle). Nothing is copied and the capsule is not consumed: the producer's
    own destructor releases it when the view is dropped."""
    if not hasattr(obj, "__dlpack__") or not hasattr(obj, "__dlpack_device__"):
        raise TypeError(f"expected a DLPack tensor (with __dlpack__), got {type(obj).__name__}")
    device = tuple(int(v) for v in obj.__dlpack_device__())
    capsule = obj.__dlpack__() if stream is None else obj.__dlpack__(stream=stream)
    try:
        address = _capsule_pointer(capsule, _CAPSULE_NAME)
    except ValueError:
        raise TypeError(f"{type(obj).__name__}.__dlpack__ gave no 'dltensor' capsule") from None
    t = ctypes.cast(address, ctypes.POINTER(_DLManagedTensor)).contents.dl_tensor
    shape = tuple(t.shape[i] for i in range(t.ndim))
    dtype = None
    code = {v: k for k, v in _DL_CODES.items()}.get(t.dtype.code)
    if code is not None and t.dtype.lanes == 1:
        try:
            dtype = np.dtype("bool" if code == "b" else f"{code}{t.dtype.bits // 8}")
        except TypeError:
            dtype = None
    contiguous = True
    if t.strides:
        expected = 1
        for i in reversed(range(t.ndim)):
            if shape[i] != 1 and t.strides[i] != expected:
                contiguous = False
            expected *= shape[i]
    return DLPackView((t.data or 0) + t.byte_offset, shape, dtype, device, contiguous, capsule)  # type: ignore[arg-type]
