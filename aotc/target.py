"""Compilation targets: parsing of target strings, host detection and hardware parameters."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field, replace

_ARCH_TRIPLES = {
    "x86_64": "x86_64-unknown-linux-gnu",
    "aarch64": "aarch64-unknown-linux-gnu",
    "arm": "armv7a-unknown-linux-gnueabihf",
}


class TargetError(ValueError):
    pass


@dataclass(frozen=True)
class HardwareParams:
    num_cores: int
    vector_bytes: int
    vector_registers: int = 16  # architectural SIMD registers: 16 ymm on AVX2, 32 zmm on AVX-512
    cache_line_bytes: int = 64
    max_threads_per_block: int = 1024
    warp_size: int = 32
    max_shared_memory_per_block: int = 48 * 1024


@dataclass(frozen=True)
class Target:
    """`llvm -mcpu=... -mattr=... -mtriple=... -num-cores=N` or `cuda -arch=sm_XX`."""

    kind: str
    mcpu: str = "generic"
    mattr: tuple[str, ...] = ()
    mtriple: str = ""
    arch: str = ""
    num_cores: int = 0
    hw: HardwareParams = field(default=None, compare=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.hw is None:
            object.__setattr__(self, "hw", _default_hardware(self))

    @property
    def triple(self) -> str:
        if self.mtriple:
            return self.mtriple
        if self.kind == "cuda":
            return "nvptx64-nvidia-cuda"
        import llvmlite.binding as llvm

        return llvm.get_process_triple()

    @property
    def features(self) -> str:
        return ",".join(self.mattr)

    @property
    def is_cpu(self) -> bool:
        return self.kind == "llvm"

    @property
    def isa(self) -> str:
        """The instruction set architecture: x86_64, aarch64, arm (or nvptx64 for CUDA)."""
        return _arch_of(self.triple)

    def __str__(self) -> str:
        parts = [self.kind]
        if self.kind == "llvm":
            if self.mtriple:
                parts.append(f"-mtriple={self.mtriple}")
            parts.append(f"-mcpu={self.mcpu}")
            if self.mattr:
                parts.append(f"-mattr={','.join(self.mattr)}")
            if self.num_cores:
                parts.append(f"-num-cores={self.num_cores}")
        else:
            parts.append(f"-arch={self.arch}")
        return " ".join(parts)


def _vector_bytes(arch: str, mattr: tuple[str, ...], mcpu: str) -> int:
    feats = {a.lstrip("+") for a in mattr if a.startswith("+")}
    if arch != "x86_64":
        return 16
    if "avx512f" in feats or mcpu in _AVX512_CPUS:
        return 64
    if "avx2" in feats or "avx" in feats or mcpu in _AVX2_CPUS:
        return 32
    return 16


_AVX512_CPUS = {
    "skylake-avx512",
    "cascadelake",
    "cooperlake",
    "icelake-server",
    "icelake-client",
    "sapphirerapids",
    "emeraldrapids",
    "graniterapids",
    "tigerlake",
    "znver4",
    "znver5",
    "x86-64-v4",
}
_AVX2_CPUS = {
    "haswell",
    "broadwell",
    "skylake",
    "znver1",
    "znver2",
    "znver3",
    "alderlake",
    "raptorlake",
    "x86-64-v3",
}
_SSE_CPUS = {"x86-64", "x86-64-v2"}

HOST_CPU_ENV = "AOTC_HOST_CPU"
"""Expert knob: `AOTC_HOST_CPU=znver3` makes the host (`llvm -mcpu=native`) that CPU with LLVM's default
features for it, so an AVX-512 machine compiles, tunes and runs the code an AVX2 machine would get."""


def _arch_of(triple: str) -> str:
    head = triple.split("-")[0]
    if head.startswith("arm") or head.startswith("thumb"):
        return "arm"
    return head


def _default_hardware(t: Target) -> HardwareParams:
    if t.kind == "cuda":
        return HardwareParams(num_cores=1, vector_bytes=16)
    cores = t.num_cores or _host_cores()
    arch = t.isa
    vector_bytes = _vector_bytes(arch, t.mattr, t.mcpu)
    # AVX-512 doubles the register file along with the width; AArch64 has 32 NEON registers, ARMv7 16
    registers = 32 if arch == "aarch64" or (arch == "x86_64" and vector_bytes == 64) else 16
    return HardwareParams(num_cores=cores, vector_bytes=vector_bytes, vector_registers=registers)


def _host_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def host_target() -> Target:
    """The machine we run on: its CPU name and every feature LLVM reports for it, or the CPU that
    $AOTC_HOST_CPU names, with no -mattr (LLVM's own features for that CPU)."""
    import llvmlite.binding as llvm

    cpu = llvm.get_host_cpu_name()
    feats = llvm.get_host_cpu_features()
    mattr = tuple(sorted(f"+{name}" for name, on in feats.items() if on))
    real = Target("llvm", mcpu=cpu, mattr=mattr)
    emulated = os.environ.get(HOST_CPU_ENV, "").strip()
    if not emulated or emulated == "native":
        return real
    if _arch_of(real.triple) == "x86_64" and emulated not in _AVX512_CPUS | _AVX2_CPUS | _SSE_CPUS:
        known = ", ".join(sorted(_AVX512_CPUS | _AVX2_CPUS | _SSE_CPUS))
        raise TargetError(f"{HOST_CPU_ENV}={emulated!r}: not a known x86-64 CPU (known: {known})")
    target = Target("llvm", mcpu=emulated)
    # A narrower vector class is a subset this host runs; a wider one would fault on the first instruction.
    if target.hw.vector_bytes > real.hw.vector_bytes:
        raise TargetError(
            f"{HOST_CPU_ENV}={emulated!r}: its {target.hw.vector_bytes}-byte vectors are wider than this "
            f"host's ({cpu}, {real.hw.vector_bytes} bytes), whose CPU could not run the code"
        )
    return target


def parse_target(text: str) -> Target:
    """Parse a target string; `llvm -mcpu=native` (or bare `llvm`) means the host."""
    try:
        words = shlex.split(text)
    except ValueError as err:
        raise TargetError(f"target {text!r}: {err}") from None
    if not words:
        raise TargetError("empty target string")
    kind, opts = words[0], words[1:]
    if kind not in ("llvm", "cuda"):
        raise TargetError(f"target {text!r}: unknown kind {kind!r} (expected 'llvm' or 'cuda')")
    values: dict[str, str] = {}
    for opt in opts:
        if not opt.startswith("-") or "=" not in opt:
            raise TargetError(f"target {text!r}: option {opt!r} is not of the form -key=value")
        key, value = opt[1:].split("=", 1)
        allowed = ("mcpu", "mattr", "mtriple", "num-cores") if kind == "llvm" else ("arch",)
        if key not in allowed:
            raise TargetError(f"target {text!r}: unknown option -{key} (allowed: {', '.join(allowed)})")
        values[key] = value
    if kind == "cuda":
        arch = values.get("arch", "sm_80")
        if not arch.startswith("sm_") or not arch[3:].isdigit():
            raise TargetError(f"target {text!r}: -arch must look like sm_80, got {arch!r}")
        return Target("cuda", arch=arch)
    cores = 0
    if "num-cores" in values:
        if not values["num-cores"].isdigit() or int(values["num-cores"]) < 1:
            raise TargetError(f"target {text!r}: -num-cores must be a positive integer")
        cores = int(values["num-cores"])
    mattr = tuple(a for a in values.get("mattr", "").split(",") if a)
    for a in mattr:
        if a[0] not in "+-":
            raise TargetError(f"target {text!r}: -mattr entry {a!r} must start with + or -")
    cpu = values.get("mcpu", "native" if "mtriple" not in values else "generic")
    triple = values.get("mtriple", "")
    if triple and _arch_of(triple) not in _ARCH_TRIPLES:
        raise TargetError(f"target {text!r}: unsupported triple {triple!r}")
    if cpu == "native" and not triple:
        host = host_target()
        return replace(host, mattr=host.mattr + mattr, num_cores=cores, hw=None)
    return Target("llvm", mcpu=cpu, mattr=mattr, mtriple=triple, num_cores=cores)
