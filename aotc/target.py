"""Compilation targets: parsing of target strings, host detection and hardware parameters."""

from __future__ import annotations

import difflib
import functools
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field, replace

from aotc_runtime.package import CPU_FLAGS

_ARCH_TRIPLES = {
    "x86_64": "x86_64-unknown-linux-gnu",
    "aarch64": "aarch64-unknown-linux-gnu",
    "arm": "armv7a-unknown-linux-gnueabihf",
}


class TargetError(ValueError):
    """A target string or target name that aotc (or LLVM) cannot compile for."""


@dataclass(frozen=True)
class HardwareParams:
    num_cores: int
    vector_bytes: int
    vector_registers: int = 16  # architectural SIMD registers: 16 ymm on AVX2, 32 zmm on AVX-512
    cache_line_bytes: int = 64
    # GPU limits (a CPU target keeps the defaults, which nothing reads there)
    max_threads_per_block: int = 1024
    warp_size: int = 32
    max_shared_memory_per_block: int = 48 * 1024  # statically declared __shared__ / __local
    max_threads_per_multiprocessor: int = 2048
    registers_per_block: int = 65536
    max_vthread_extent: int = 8


# Per CUDA architecture: (SMs of its reference part, max threads per SM). Threads per block (1024), warp
# size (32), registers per block (64 K) and static shared memory per block (48 KiB: more needs the driver's
# opt-in) are the same on all of them (CUDA C Programming Guide, "Compute Capabilities").
_CUDA_ARCHS = {
    "sm_80": (108, 2048),  # A100
    "sm_86": (84, 1536),  # RTX 3090 / A40
    "sm_89": (128, 1536),  # RTX 4090 / L40
    "sm_90": (132, 2048),  # H100 SXM
}
CUDA_ARCHS = tuple(_CUDA_ARCHS)

# OpenCL devices differ widely (Intel, Mali, Adreno, PoCL): the portable floor. 256 work-items and 32 KiB
# of local memory are what OpenCL's full profile guarantees or nearly every GPU gives; a warp size of 1
# promises no lock-step execution.
_OPENCL_HW = HardwareParams(
    num_cores=1,
    vector_bytes=16,
    max_threads_per_block=256,
    warp_size=1,
    max_shared_memory_per_block=32 * 1024,
    max_threads_per_multiprocessor=256,
    registers_per_block=0,
    max_vthread_extent=8,
)


@dataclass(frozen=True)
class Target:
    """`llvm -mcpu=... -mattr=... -mtriple=... -num-cores=N`, `cuda -arch=sm_XX` or `opencl`."""

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
            return normalized_triple(self.mtriple)
        if self.kind == "cuda":
            return "nvptx64-nvidia-cuda"
        if self.kind == "opencl":
            return "spir64-unknown-unknown"
        import llvmlite.binding as llvm

        return llvm.get_process_triple()

    @property
    def features(self) -> str:
        return ",".join(self.mattr)

    @property
    def is_cpu(self) -> bool:
        return self.kind == "llvm"

    @property
    def is_gpu(self) -> bool:
        """CUDA or OpenCL: kernels launched over a grid of thread blocks (`HardwareParams` bounds them)."""
        return self.kind in ("cuda", "opencl")

    @property
    def isa(self) -> str:
        """The instruction set architecture: x86_64, aarch64, arm (or nvptx64 for CUDA)."""
        return arch_of(self.triple)

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
        elif self.kind == "cuda":
            parts.append(f"-arch={self.arch}")
        return " ".join(parts)


def _vector_bytes(target: Target) -> int:
    """The widest vectors the target's code may use, from the features LLVM resolves for its -mcpu and
    -mattr (so `-mcpu=skylake-avx512 -mattr=-avx512f` gets 32 bytes, not its CPU class's 64)."""
    if target.isa != "x86_64":
        return 16
    feats = set(cpu_features(target))
    if "avx512f" in feats:
        return 64
    return 32 if "avx" in feats else 16


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
features for it, less those this host lacks, so an AVX-512 machine compiles, tunes and runs the code an
AVX2 machine would get."""


_OS_NAMES = ("linux", "android", "none", "windows", "darwin", "freebsd")


def normalized_triple(triple: str) -> str:
    """`arch-vendor-os-env` as LLVM reads it: `armv7a-linux-gnueabihf` is `armv7a-unknown-linux-gnueabihf`.
    LLVM takes the parts by position, so the short form's `linux` is read as the vendor and `gnueabihf`
    as the OS, and an ARM object then gets the soft-float ABI, which Debian's armhf loader refuses."""
    parts = triple.split("-")
    if len(parts) in (2, 3) and parts[1] in _OS_NAMES:
        parts.insert(1, "unknown")
    return "-".join(parts)


def arch_of(triple: str) -> str:
    """The architecture a triple names ("x86_64", "aarch64", "arm" for any 32-bit ARM)."""
    head = triple.split("-")[0]
    if head.startswith("arm") or head.startswith("thumb"):
        return "arm"
    return head


def _default_hardware(t: Target) -> HardwareParams:
    if t.kind == "opencl":
        return _OPENCL_HW
    if t.kind == "cuda":
        # an arch past the table gets the newest one's figures: the per-block limits have not changed
        known = [a for a in CUDA_ARCHS if int(a[3:]) <= int(t.arch[3:] or 0)] or [CUDA_ARCHS[0]]
        sms, threads_per_sm = _CUDA_ARCHS[known[-1]]
        return HardwareParams(num_cores=sms, vector_bytes=16, max_threads_per_multiprocessor=threads_per_sm)
    cores = t.num_cores or host_cores()
    arch = t.isa
    vector_bytes = _vector_bytes(t)
    # AVX-512 doubles the register file along with the width; AArch64 has 32 NEON registers, ARMv7 16
    registers = 32 if arch == "aarch64" or (arch == "x86_64" and vector_bytes == 64) else 16
    return HardwareParams(num_cores=cores, vector_bytes=vector_bytes, vector_registers=registers)


def host_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def cpu_class() -> str:
    """The CPU class every figure is measured on: LLVM's name for the host CPU, its widest vector ISA,
    the model name and the cores this process may use (e.g. `znver4 (AVX-512, AMD EPYC, 2 cores)`)."""
    import platform

    import llvmlite.binding as llvm

    feats = llvm.get_host_cpu_features()
    isa = "AVX-512" if feats.get("avx512f") else "AVX2" if feats.get("avx2") else "SSE/NEON"
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(
                (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model
            )
    except OSError:
        pass
    return f"{llvm.get_host_cpu_name()} ({isa}, {model}, {host_cores()} cores)"


def host_target() -> Target:
    """The machine we run on: its CPU name and every feature LLVM reports for it, or the CPU that
    $AOTC_HOST_CPU names with LLVM's own features for it, those this host lacks turned off."""
    import llvmlite.binding as llvm

    cpu = llvm.get_host_cpu_name()
    feats = llvm.get_host_cpu_features()
    mattr = tuple(sorted(f"+{name}" for name, on in feats.items() if on))
    real = Target("llvm", mcpu=cpu, mattr=mattr)
    emulated = os.environ.get(HOST_CPU_ENV, "").strip()
    if not emulated or emulated == "native":
        return real
    if arch_of(real.triple) == "x86_64" and emulated not in _AVX512_CPUS | _AVX2_CPUS | _SSE_CPUS:
        known = ", ".join(sorted(_AVX512_CPUS | _AVX2_CPUS | _SSE_CPUS))
        raise TargetError(f"{HOST_CPU_ENV}={emulated!r}: not a known x86-64 CPU (known: {known})")
    target = Target("llvm", mcpu=emulated)
    # A narrower vector class is a subset this host runs; a wider one would fault on the first instruction.
    if target.hw.vector_bytes > real.hw.vector_bytes:
        raise TargetError(
            f"{HOST_CPU_ENV}={emulated!r}: its {target.hw.vector_bytes}-byte vectors are wider than this "
            f"host's ({cpu}, {real.hw.vector_bytes} bytes), whose CPU could not run the code"
        )
    # LLVM's features for that CPU may hold extensions this host lacks (znver3's SSE4a on an Intel
    # host): they are turned off, or the code could fault here and a package would be refused
    lacking = sorted(set(cpu_features(target)) - set(cpu_features(real)))
    return replace(target, mattr=tuple(f"-{f}" for f in lacking), hw=None) if lacking else target


def as_target(target: Target | str) -> Target:
    """`target` itself, or the Target a target string names (`parse_target`); TypeError for anything else."""
    if isinstance(target, Target):
        return target
    if isinstance(target, str):
        return parse_target(target)
    raise TypeError(
        f"target: expected a Target or a target string such as 'llvm', got {type(target).__name__}"
    )


def parse_target(text: str) -> Target:
    """Parse a target string; `llvm -mcpu=native` (or bare `llvm`) means the host."""
    try:
        words = shlex.split(text)
    except ValueError as err:
        raise TargetError(f"target {text!r}: {err}") from None
    if not words:
        raise TargetError("empty target string")
    kind, opts = words[0], words[1:]
    if kind not in ("llvm", "cuda", "opencl"):
        raise TargetError(f"target {text!r}: unknown kind {kind!r} (expected 'llvm', 'cuda' or 'opencl')")
    values: dict[str, str] = {}
    for opt in opts:
        if not opt.startswith("-") or "=" not in opt:
            raise TargetError(f"target {text!r}: option {opt!r} is not of the form -key=value")
        key, value = opt[1:].split("=", 1)
        allowed = {"llvm": ("mcpu", "mattr", "mtriple", "num-cores"), "cuda": ("arch",), "opencl": ()}[kind]
        if key not in allowed:
            raise TargetError(
                f"target {text!r}: unknown option -{key} (allowed: {', '.join(allowed) or 'none'})"
            )
        values[key] = value
    if kind == "cuda":
        arch = values.get("arch", "sm_80")
        if not arch.startswith("sm_") or not arch[3:].isdigit():
            raise TargetError(f"target {text!r}: -arch must look like sm_80, got {arch!r}")
        return Target("cuda", arch=arch)
    if kind == "opencl":
        return Target("opencl")
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
    if triple and arch_of(triple) not in _ARCH_TRIPLES:
        raise TargetError(f"target {text!r}: unsupported triple {triple!r}")
    host = host_target() if cpu == "native" and not triple else None
    try:
        # a Target's hardware parameters come from its resolved features, which check the names first
        if host is not None:
            target = replace(host, mattr=host.mattr + mattr, num_cores=cores, hw=None)
        else:
            target = Target("llvm", mcpu=cpu, mattr=mattr, mtriple=triple, num_cores=cores)
        check_llvm_names(target)
        return target
    except TargetError as err:
        raise TargetError(f"target {text!r}: {err}") from None


# ----------------------------------------------------------------------------- LLVM's names

_HELP_LINE = re.compile(r"^  (\S+)\s+- ")
_FD_LOCK = threading.Lock()


# -mattr names that change no instruction a CPU may lack: LLVM's tuning flags, the x86-64 baseline, and
# extensions only intrinsics reach (aotc emits none of those), so a package need not require them.
_TUNING_PREFIXES = ("prefer-", "fast-", "slow-", "tuning-", "false-deps-", "idivl-", "idivq-", "lea-", "pad-")
_NO_CHECK_NEEDED = {
    "x86_64": {"64bit", "cmov", "cx8", "fxsr", "mmx", "sse", "sse2", "macrofusion", "branchfusion"}
    | {"aes", "vaes", "pclmul", "vpclmulqdq", "sha", "sha512", "rdrnd", "rdseed", "crc32", "fsgsbase"}
    | {"xsave", "xsavec", "xsaveopt", "xsaves", "clflushopt", "clwb", "clzero", "invpcid", "rdpid", "shstk"}
    | {"sahf", "prfchw", "cx16", "adx", "pku", "wbnoinvd", "mwaitx", "rdpru", "vzeroupper"},
}


def check_features_checkable(target: Target) -> None:
    """For a target a package is built for (not a record's, which may come from any CPU): refuse a `+feature` of -mattr that a package's `requires` could not carry: one outside
    CPU_FEATURES (so the runtime never checks it) that this host lacks too. LLVM may use such a feature
    from plain IR (`+egpr`, APX's extra registers), and the package would then die with SIGILL on a CPU
    without it, here first (validation)."""
    if not target.is_cpu:
        return
    known = CPU_FEATURES.get(target.isa, {})
    host: set[str] = set()
    if target.isa == arch_of(_llvm().get_process_triple()):
        host = {name for name, on in _llvm().get_host_cpu_features().items() if on}
    harmless = _NO_CHECK_NEEDED.get(target.isa, set())
    unchecked = [
        name
        for a in target.mattr
        if a.startswith("+")
        and (name := a[1:]) not in set(known) | host | harmless
        and not name.startswith(_TUNING_PREFIXES)
    ]
    if unchecked:
        raise TargetError(
            f"-mattr {', '.join('+' + f for f in unchecked)}: a package cannot record "
            f"{'this feature' if len(unchecked) == 1 else 'these features'} for the runtime to check on the "
            f"device, and this host lacks {'it' if len(unchecked) == 1 else 'them'}; the features a package may "
            f"require on {target.isa} are: {', '.join(sorted(known))}"
        )


def _llvm():
    import llvmlite.binding as llvm

    _init_llvm_targets(llvm)
    return llvm


@functools.cache
def _init_llvm_targets(llvm) -> None:
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()


def _captured_output(action) -> str:
    """What `action()` writes to file descriptors 1 and 2 (LLVM prints there, past Python's streams)."""
    sys.stdout.flush()
    sys.stderr.flush()
    with _FD_LOCK, tempfile.TemporaryFile() as tmp:
        saved = [os.dup(1), os.dup(2)]
        try:
            os.dup2(tmp.fileno(), 1)
            os.dup2(tmp.fileno(), 2)
            action()
        finally:
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)
        tmp.seek(0)
        return tmp.read().decode(errors="replace")


_UNRECOGNIZED = re.compile(r"'([^']*)' is not a recognized (processor|feature) for this target")


@functools.cache
def _unrecognized_names(triple: str, cpu: str, features: str) -> tuple[str, ...]:
    """The CPU and feature names among `cpu` and `features` that LLVM warns it does not know."""
    llvm = _llvm()
    try:
        backend = llvm.Target.from_triple(triple)
    except RuntimeError as err:
        raise TargetError(f"LLVM has no backend for triple {triple!r}: {err}") from None
    text = _captured_output(lambda: backend.create_target_machine(cpu=cpu, features=features, opt=0))
    return tuple(dict.fromkeys(m.group(1) for m in _UNRECOGNIZED.finditer(text)))


_HELP_SCRIPT = """
import sys
import llvmlite.binding as llvm
llvm.initialize_all_targets()
llvm.Target.from_triple(sys.argv[1]).create_target_machine(cpu="help", features="")
"""


@functools.cache
def _llvm_catalogue(triple: str) -> tuple[frozenset[str], frozenset[str]]:
    """The CPU and the feature names LLVM lists for `triple` (empty if it cannot be asked)."""
    # LLVM prints its -mcpu=help listing once per process, so a fresh one is asked
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _HELP_SCRIPT, triple], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.SubprocessError):
        return frozenset(), frozenset()
    cpus: set[str] = set()
    features: set[str] = set()
    section = None
    for line in (proc.stderr + proc.stdout).splitlines():
        if line.startswith("Available CPUs"):
            section = cpus
        elif line.startswith("Available features"):
            section = features
        elif section is not None and (m := _HELP_LINE.match(line)):
            section.add(m.group(1))
    return frozenset(cpus), frozenset(features)


def _some_of(name: str, names: frozenset[str], fallback: list[str]) -> str:
    if not names:
        return "`llc -mcpu=help` lists them"
    close = difflib.get_close_matches(name, sorted(names), n=6, cutoff=0.5)
    return (
        "some it knows: "
        + ", ".join(close or [n for n in fallback if n in names] or sorted(names)[:12])
        + ", ..."
    )


_COMMON_CPUS = ["x86-64-v3", "x86-64-v4", "haswell", "skylake-avx512", "znver3", "znver4", "generic"]
_COMMON_CPUS += ["neoverse-n1", "neoverse-v1", "cortex-a72", "cortex-a53", "apple-m1"]


def check_llvm_names(target: Target) -> None:
    """Refuse a `-mcpu` or `-mattr` name LLVM does not know for the target's architecture.

    LLVM only warns about such a name (on stderr, when a target machine is made) and ignores it; an
    unknown x86-64 CPU then aborts the whole process later in code generation ("LLVM ERROR: 64-bit
    code requested on a subtarget that doesn't support it"). So the warning is caught here, once per
    (triple, CPU, features), and made a TargetError that lists known names."""
    if not target.is_cpu:
        return
    cpu = "" if target.mcpu == "native" else target.mcpu
    # `help` makes LLVM print its lists rather than warn: no CPU or feature has that name
    listing = [name for name in (cpu, *(a[1:] for a in target.mattr)) if name in ("help", "cpuhelp")]
    unknown = tuple(listing) or _unrecognized_names(target.triple, cpu, target.features)
    if not unknown:
        return
    cpus, features = _llvm_catalogue(target.triple)
    if cpu in unknown or cpu in listing:
        raise TargetError(
            f"-mcpu {cpu!r} is not a CPU LLVM knows for {target.isa} ({_some_of(cpu, cpus, _COMMON_CPUS)})"
        )
    attr = next(a for a in target.mattr if a in unknown or a[1:] in listing)
    isa = sorted(CPU_FEATURES.get(target.isa, {}))
    raise TargetError(
        f"-mattr {attr!r} is not a feature LLVM knows for {target.isa} ({_some_of(attr[1:], features, isa)})"
    )


# ----------------------------------------------------------------------------- CPU features

CPU_FEATURES = CPU_FLAGS  # one table: the runtime checks a package's `requires` with it
"""Per architecture: the instruction-set extensions LLVM may select from the IR aotc emits (plain IR, x86's
`pause`, and the dot-product intrinsics of aotc/ir/dot.py, whose features avx512vnni, avxvnni, avx512bw and
avx2 are listed), in LLVM's spelling, each with the flag Linux shows for it in
/proc/cpuinfo ("flags" on x86, "Features" on ARM). Extensions only intrinsics reach (AES, SHA, AMX,
CRC32, RDRAND, ...) and the baseline of each architecture (x86-64's SSE2) are not listed: code from
aotc cannot fault for their lack."""


def cpu_features(target: Target) -> tuple[str, ...]:
    """The CPU features (LLVM's names, sorted) that code generated for `target` may use.

    They are the extensions of `CPU_FEATURES` that LLVM enables for the target's `-mcpu` with its
    `-mattr`, implied features included (`+avx512bw` brings `avx512f`, `avx2`, `fma`...) and
    disabled ones removed (`-avx2` also drops AVX-512), as LLVM itself resolves them. llvmlite exposes
    no query for a target machine's features, so each is asked of LLVM's inliner, which inlines a
    function into a caller only when the callee's resolved feature bits are a subset of the caller's:
    a callee compiled for `-mattr` plus `+F` inlines into a caller compiled for `-mattr` exactly when
    `F` (with all it implies) is already on. Other explicit `+feature`s of `-mattr` are left out:
    the tuning flags are no CPU feature, and no other extension is reachable from aotc's IR. The
    result is cached per (triple, CPU, features); a CUDA target needs none."""
    if not target.is_cpu:
        return ()
    check_llvm_names(target)
    cpu = _llvm().get_host_cpu_name() if target.mcpu == "native" else target.mcpu
    return _enabled_features(target.triple, cpu, target.features)


def code_features(target: Target) -> frozenset[str]:
    """What a CPU target's generated code depends on besides its CPU model: its resolved features
    (`cpu_features`, as `+name`) and the tuning flags its `-mattr` names. Two spellings of one CPU
    (`-mcpu=native` with the host's feature list, `-mcpu=znver5` alone) give one set."""
    if not target.is_cpu:
        return frozenset()
    tuning = {a for a in target.mattr if a[1:].startswith(_TUNING_PREFIXES)}
    return frozenset({f"+{f}" for f in cpu_features(target)} | tuning)


@functools.cache
def _known_candidates(triple: str) -> list[str]:
    """The extensions of `CPU_FEATURES` this LLVM knows (it would ignore others, so they seem on)."""
    names = sorted(CPU_FEATURES.get(arch_of(triple), {}))
    unknown = set(_unrecognized_names(triple, "", ",".join(f"+{f}" for f in names)))
    return [f for f in names if f"+{f}" not in unknown]


@functools.cache
def _enabled_features(triple: str, cpu: str, features: str) -> tuple[str, ...]:
    llvm = _llvm()
    candidates = _known_candidates(triple)
    # probe 0 asks for nothing beyond the caller's own features: it must inline, or the method is broken
    probes = ["", *(f"+{f}" for f in candidates)]
    lines = ["@aotc.probe.sink = global i32 0"]
    for i, extra in enumerate(probes):
        callee = ",".join(x for x in (features, extra) if x)
        lines += [
            f"define internal void @callee{i}() #{2 * i} {{\n  store volatile i32 {i}, ptr @aotc.probe.sink\n"
            "  ret void\n}",
            f"define void @caller{i}() #{2 * i + 1} {{\n  call void @callee{i}()\n  ret void\n}}",
            f'attributes #{2 * i} = {{ "target-cpu"="{cpu}" "target-features"="{callee}" }}',
            f'attributes #{2 * i + 1} = {{ "target-cpu"="{cpu}" "target-features"="{features}" }}',
        ]
    mod = llvm.parse_assembly("\n".join(lines))
    mod.triple = triple
    tm = llvm.Target.from_triple(triple).create_target_machine(cpu=cpu, features=features, opt=2)
    pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=2))
    pb.getModulePassManager().run(mod, pb)
    inlined = ["call " not in str(mod.get_function(f"caller{i}")) for i in range(len(probes))]
    if not inlined[0]:
        raise TargetError(f"could not ask LLVM for the features of {triple} -mcpu={cpu} -mattr={features}")
    return tuple(f for f, on in zip(candidates, inlined[1:]) if on)
