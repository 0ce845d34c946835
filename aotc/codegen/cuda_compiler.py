"""CUDA C -> cubin or PTX, with no GPU needed: NVRTC in-process, else nvcc from PATH.

NVRTC comes from the `aotc[cuda]` extra (`cuda-bindings`, NVIDIA's own Python binding, and the
`nvidia-cuda-nvrtc` wheel holding libnvrtc, which `cuda.pathfinder` finds inside site-packages). It compiles
a kernel source in about 0.1 s against nvcc's 0.3 s and needs no toolkit. Nothing here touches the CUDA
driver API: on a machine without a GPU `cuInit` fails, and a `cuda.core` call was seen to hang.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Any

_ARCH = re.compile(r"sm_(\d+)([af]?)")
_OUTPUTS = ("cubin", "ptx")
_COMPILERS = ("nvrtc", "nvcc")
# NVRTC's flow callback: (payload, reserved) -> 1 cancels the compilation, 0 lets it go on
_FLOW_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)


class GPUCompileError(RuntimeError):
    """The CUDA compiler is missing or rejected a kernel source."""


@dataclass(frozen=True)
class _Nvrtc:
    """The loaded binding and libnvrtc's version, or why NVRTC cannot be used."""

    module: Any = None
    version: tuple[int, int] | None = None
    archs: tuple[int, ...] = ()  # the SM numbers it compiles for (75, 80, ... 121 for 13.0)
    reason: str = ""


@functools.cache
def _load_nvrtc() -> _Nvrtc:
    try:
        from cuda.bindings import nvrtc
    except ImportError as e:
        return _Nvrtc(reason=f"cuda-bindings is not installed ({e}); pip install 'aotc[cuda]'")
    try:
        # the first call loads libnvrtc through cuda.pathfinder (the nvidia-cuda-nvrtc wheel, then the
        # system); a missing library raises its DynamicLibNotFoundError, a broken install anything
        err, major, minor = nvrtc.nvrtcVersion()
    except Exception as e:
        return _Nvrtc(reason=f"libnvrtc could not be loaded ({type(e).__name__}: {e})")
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return _Nvrtc(reason=f"nvrtcVersion failed: {err!r}")
    err, archs = nvrtc.nvrtcGetSupportedArchs()
    archs = tuple(archs) if err == nvrtc.nvrtcResult.NVRTC_SUCCESS else ()
    return _Nvrtc(module=nvrtc, version=(major, minor), archs=archs)


def nvrtc_version() -> tuple[int, int] | None:
    """libnvrtc's (major, minor) when the binding imports and the library loads, else None."""
    return _load_nvrtc().version


def nvcc_path() -> str | None:
    """The `nvcc` on PATH, if any (CUDA compiles without a GPU)."""
    return shutil.which("nvcc")


def cuda_compiler_name() -> str | None:
    """Which route `compile_cuda` takes here: "nvrtc", "nvcc", or None when neither exists."""
    if nvrtc_version() is not None:
        return "nvrtc"
    if nvcc_path() is not None:
        return "nvcc"
    return None


def compile_cuda(
    source: str,
    arch: str,
    output: str = "cubin",
    timeout: float = 120.0,
    *,
    compiler: str | None = None,
) -> bytes:
    """`source` compiled for `arch` (e.g. sm_90): a cubin, or PTX (text, no trailing NUL) with `output="ptx"`.

    Uses NVRTC when it loads, else nvcc; `compiler="nvrtc"` or `"nvcc"` insists on one. Raises
    GPUCompileError when no compiler exists, the compiler rejects the source (its log in the message), or
    it runs past `timeout` seconds.
    """
    if output not in _OUTPUTS:
        raise ValueError(f"output must be 'cubin' or 'ptx', got {output!r}")
    m = _ARCH.fullmatch(arch) if isinstance(arch, str) else None
    if m is None:
        raise ValueError(f"arch must look like sm_90 (or sm_90a), got {arch!r}")
    if compiler not in (None, *_COMPILERS):
        raise ValueError(f"compiler must be 'nvrtc', 'nvcc' or None, got {compiler!r}")
    if not isinstance(source, str):
        raise TypeError(f"CUDA source must be a str, got {type(source).__name__}")
    if "\0" in source:
        raise ValueError("CUDA source contains a NUL character")
    # PTX is for a virtual architecture: the driver finishes it for whatever GPU loads it
    arch_flag = f"-arch={arch}" if output == "cubin" else f"-arch=compute_{m.group(1)}{m.group(2)}"
    loaded = _load_nvrtc()
    if compiler == "nvrtc" or (compiler is None and loaded.module is not None):
        if loaded.module is None:
            raise GPUCompileError(f"NVRTC is not available: {loaded.reason}")
        return _compile_nvrtc(loaded, source, arch, arch_flag, output, timeout)
    nvcc = nvcc_path()
    if nvcc is None:
        why = "nvcc is not on PATH" if compiler == "nvcc" else f"neither NVRTC ({loaded.reason}) nor nvcc"
        raise GPUCompileError(
            f"no CUDA compiler: {why}; pip install 'aotc[cuda]' or install the CUDA toolkit"
        )
    return _compile_nvcc(nvcc, source, arch, arch_flag, output, timeout)


def _compile_nvrtc(
    loaded: _Nvrtc, source: str, arch: str, arch_flag: str, output: str, timeout: float
) -> bytes:
    nvrtc = loaded.module
    ok = nvrtc.nvrtcResult.NVRTC_SUCCESS
    name = f"NVRTC {loaded.version[0]}.{loaded.version[1]}"
    sm = int(_ARCH.fullmatch(arch).group(1))
    if loaded.archs and sm not in loaded.archs:
        known = ", ".join(f"sm_{a}" for a in loaded.archs)
        raise GPUCompileError(f"{name} does not compile for {arch} (it knows {known})")
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"kernel.cu", 0, [], [])
    if err != ok:
        raise GPUCompileError(f"{name} could not create a program for {arch}: {err!r}")
    try:
        # NVRTC runs in this process with the GIL released; the flow callback is how it can be
        # stopped, so the timeout holds as it does for nvcc's subprocess
        deadline = time.monotonic() + timeout
        callback = _FLOW_CALLBACK(lambda _payload, _reserved: int(time.monotonic() > deadline))
        (err,) = nvrtc.nvrtcSetFlowCallback(prog, ctypes.cast(callback, ctypes.c_void_p).value, 0)
        if err != ok:
            raise GPUCompileError(f"{name} refused a flow callback: {err!r}")
        # -default-device: a function without __device__/__global__ is device code (there is no host)
        options = [arch_flag.encode(), b"-default-device"]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(options), options)
        if err == nvrtc.nvrtcResult.NVRTC_ERROR_CANCELLED:
            raise GPUCompileError(f"{name} took more than {timeout:.0f} s for {arch}")
        if err != ok:
            log = _nvrtc_bytes(nvrtc, prog, "ProgramLog").decode(errors="replace").strip()
            raise GPUCompileError(f"{name} failed for {arch} ({err.name}):\n{log}")
        data = _nvrtc_bytes(nvrtc, prog, "CUBIN" if output == "cubin" else "PTX")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    if not data:
        raise GPUCompileError(f"{name} returned an empty {output} for {arch}")
    return data


def _nvrtc_bytes(nvrtc: Any, prog: Any, what: str) -> bytes:
    """NVRTC's CUBIN, PTX or ProgramLog of a compiled program, less the NUL that ends the text ones."""
    err, size = getattr(nvrtc, f"nvrtcGet{what}Size")(prog)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise GPUCompileError(f"nvrtcGet{what}Size failed: {err!r}")
    buf = b" " * size
    (err,) = getattr(nvrtc, f"nvrtcGet{what}")(prog, buf)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise GPUCompileError(f"nvrtcGet{what} failed: {err!r}")
    return buf if what == "CUBIN" else buf.rstrip(b"\0")


def _compile_nvcc(nvcc: str, source: str, arch: str, arch_flag: str, output: str, timeout: float) -> bytes:
    with tempfile.TemporaryDirectory(prefix="aotc-cuda-") as tmp:
        src, dst = os.path.join(tmp, "kernel.cu"), os.path.join(tmp, f"kernel.{output}")
        with open(src, "w") as f:
            f.write(source)
        try:
            proc = subprocess.run(
                [nvcc, f"-{output}", arch_flag, "-O3", src, "-o", dst],
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            raise GPUCompileError(f"nvcc took more than {timeout:.0f} s for {arch}") from None
        except OSError as e:
            raise GPUCompileError(f"nvcc at {nvcc} could not be run: {e}") from None
        if proc.returncode != 0:
            raise GPUCompileError(f"nvcc failed for {arch}:\n{proc.stderr.strip()}")
        with open(dst, "rb") as f:
            return f.read()
