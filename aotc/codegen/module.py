"""Building kernel shared libraries and calling their kernels from Python through ctypes."""

from __future__ import annotations

import ctypes
import itertools
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from aotc.codegen.llvm import (
    META_PREFIX,
    build_llvm_ir,
    build_llvm_modules,
    cached_object,
    compile_to_object,
    link_shared,
    thread_pool_object,
)
from aotc.ir.stmt import PrimFunc
from aotc.target import Target

__all__ = ["Kernel", "KernelError", "KernelLibrary", "ParamInfo", "build_module", "load_library"]


def build_module(
    funcs: list[PrimFunc], target: Target, out_path: str, object_cache: str | None = None
) -> str:
    """Compile PrimFuncs into the shared library `out_path`, for loading into this Python process or
    another (which has libc and libm: the library does not name them), and return that path. With an
    `object_cache` folder, each parallel region is compiled on its own and its object kept there: a tuning
    candidate reuses the regions that an earlier candidate of the task had."""
    if object_cache is None:
        objects = [compile_to_object(build_llvm_ir(funcs, target, thread_pool=False), target)]
    else:
        kernels, regions = build_llvm_modules(funcs, target)
        objects = [compile_to_object(kernels, target)]
        objects += [cached_object(region, target, object_cache) for region in regions]
    link_shared([*objects, thread_pool_object(target)], out_path, target.isa, needs_libc=False)
    return out_path


class KernelError(RuntimeError):
    """A kernel returned a nonzero status (a heap allocation failed)."""


@dataclass(frozen=True, slots=True)
class ParamInfo:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    num_elements: int


class Kernel:
    """One exported kernel; calls check the arrays against the PrimFunc's params."""

    def __init__(
        self, name: str, fn: ctypes._CFuncPtr, params: list[ParamInfo], owner: KernelLibrary
    ) -> None:
        self.name = name
        self.params = params
        self._fn = fn
        self._owner = owner
        self._argv_type = ctypes.c_void_p * len(params)

    def _check(self, arrays: tuple[np.ndarray, ...]) -> None:
        if len(arrays) != len(self.params):
            raise TypeError(f"kernel {self.name} takes {len(self.params)} arrays, got {len(arrays)}")
        spans = []
        for a, p in zip(arrays, self.params):
            if not isinstance(a, np.ndarray):
                raise TypeError(
                    f"{self.name}: argument {p.name} must be a numpy array, got {type(a).__name__}"
                )
            if a.dtype != p.dtype:
                raise TypeError(f"{self.name}: argument {p.name} has dtype {a.dtype}, expected {p.dtype}")
            if a.size != p.num_elements:
                raise ValueError(
                    f"{self.name}: argument {p.name} has {a.size} elements, expected {p.num_elements} "
                    f"(shape {p.shape})"
                )
            if not a.flags.c_contiguous:
                raise ValueError(f"{self.name}: argument {p.name} is not C-contiguous")
            start = a.ctypes.data
            spans.append((start, start + a.nbytes, p.name))
        spans.sort()
        for (_, end, first), (start, _, second) in itertools.pairwise(spans):
            if start < end:
                raise ValueError(f"{self.name}: arguments {first} and {second} overlap in memory")

    def _argv(self, arrays: tuple[np.ndarray, ...]) -> ctypes.Array:
        return self._argv_type(*(a.ctypes.data for a in arrays))

    def _raise(self, status: int) -> None:
        raise KernelError(f"kernel {self.name} failed with status {status} (out of memory)")

    def __call__(self, *arrays: np.ndarray) -> None:
        self._check(arrays)
        status = self._fn(self._argv(arrays))
        if status:
            self._raise(status)

    def prepare(self, *arrays: np.ndarray) -> Callable[[], None]:
        """Check once and return a zero-argument caller that reuses the pointer array."""
        self._check(arrays)
        argv, fn = self._argv(arrays), self._fn

        def run() -> None:
            status = fn(argv)
            if status:
                self._raise(status)

        run.arrays = arrays  # type: ignore[attr-defined]
        return run


class KernelLibrary:
    """A loaded kernel shared library."""

    def __init__(self, path: str, lib: ctypes.CDLL) -> None:
        self.path = path
        self._lib = lib
        self._kernels: dict[str, Kernel] = {}

    def kernel(self, name: str) -> Kernel:
        k = self._kernels.get(name)
        if k is None:
            try:
                fn = self._lib[name]
                meta = ctypes.string_at(ctypes.addressof(ctypes.c_char.in_dll(self._lib, META_PREFIX + name)))
            except (AttributeError, ValueError):
                raise KeyError(f"{self.path} has no aotc kernel named {name!r}") from None
            fn.restype = ctypes.c_int32
            fn.argtypes = [ctypes.c_void_p]
            k = self._kernels[name] = Kernel(name, fn, _param_infos(meta), self)
        return k

    def set_num_threads(self, n: int) -> None:
        """Threads the parallel loops of this library's kernels use (the caller and n - 1 pool workers)."""
        if n < 1:
            raise ValueError(f"number of threads must be positive, got {n}")
        self._lib.aotc_set_num_threads(ctypes.c_int(n))

    def max_threads(self) -> int:
        return int(self._lib.aotc_get_max_threads())

    def bind_threads(self, cpus: list[int]) -> None:
        """Pin the calling thread to cpus[0] and pool worker k to cpus[k mod len(cpus)] as it starts
        (workers already running stay where they are); an empty list moves the caller, and workers started
        later, back to the affinity mask the library was loaded with."""
        arr = (ctypes.c_int32 * max(1, len(cpus)))(*cpus)
        self._lib.aotc_bind_threads(arr, ctypes.c_int(len(cpus)))


def _param_infos(meta: bytes) -> list[ParamInfo]:
    params = json.loads(meta)["params"]
    return [
        ParamInfo(p["name"], np.dtype(p["dtype"]), tuple(p["shape"]), int(p["num_elements"])) for p in params
    ]


_loaded_files: dict[str, tuple[int, int]] = {}
_link_counter = itertools.count()


def load_library(path: str) -> KernelLibrary:
    """Load a kernel library; a file rebuilt at an already-loaded path is loaded afresh."""
    real = os.path.realpath(path)
    st = os.stat(real)
    file_id = (st.st_dev, st.st_ino)
    previous = _loaded_files.get(real)
    _loaded_files[real] = file_id
    if previous is None or previous == file_id:
        return KernelLibrary(path, ctypes.CDLL(real))
    alias = f"{real}.{os.getpid()}.{next(_link_counter)}.so"
    try:
        os.link(real, alias)
    except OSError:
        shutil.copyfile(real, alias)
    try:
        return KernelLibrary(path, ctypes.CDLL(alias))
    finally:
        os.unlink(alias)
