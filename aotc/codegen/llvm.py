"""LLVM CPU code generation: loop-IR PrimFuncs to LLVM IR text, object code and shared libraries.

Each PrimFunc becomes an exported C function `int32_t name(void **args)` (args[i] is the data
pointer of params[i]; returns 0, or nonzero when a heap allocation failed). Every library also
exports its thread pool's `aotc_set_num_threads(int)`, `aotc_set_call_threads(int)`,
`aotc_get_max_threads()` and `aotc_bind_threads(const int32_t *cpus, int n)` (the pool is in the kernels'
module, or in a module of its own compiled once per target: `thread_pool_object`), and a NUL-terminated
JSON description of each kernel's parameters in the symbol `__aotc_meta_<name>`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
import threading
import time

import llvmlite.binding as llvm

from aotc.codegen.irbuilder import (
    KERNEL_ALIGNMENT,
    CodegenError,
    FunctionBuilder,
    ModuleBuilder,
    string_const,
)
from aotc.codegen.stmtgen import StmtGen, all_buffers, free_heap_block, stored_buffers
from aotc.codegen.threadpool import EXTERNALS as POOL_EXTERNALS
from aotc.codegen.threadpool import declare_thread_pool, emit_thread_pool
from aotc.codegen.vecmath import LIBMVEC_PATH, VecLib, veclib_for
from aotc.ir.dot import dot_forms
from aotc.ir.expr import Buffer
from aotc.ir.stmt import PrimFunc
from aotc.target import Target, TargetError, check_llvm_names, cpu_features

__all__ = [
    "CodegenError",
    "build_llvm_ir",
    "build_llvm_modules",
    "cached_object",
    "compile_to_assembly",
    "compile_to_object",
    "link_shared",
    "META_PREFIX",
    "thread_pool_ir",
    "thread_pool_object",
]

META_PREFIX = "__aotc_meta_"
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_RESERVED = ("aotc_set_num_threads", "aotc_set_call_threads", "aotc_get_max_threads", "aotc_bind_threads")


def build_llvm_ir(funcs: list[PrimFunc], target: Target, thread_pool: bool = True) -> str:
    """Textual LLVM IR of a module holding one exported kernel per PrimFunc; without `thread_pool`, its
    kernels call the pool of `thread_pool_object(target)`, which the library must link."""
    return _kernel_module(funcs, target, thread_pool).render(target.triple)


def build_llvm_modules(funcs: list[PrimFunc], target: Target) -> tuple[str, list[str]]:
    """`build_llvm_ir(funcs, target, thread_pool=False)` as the kernels' module and one module per parallel
    region, named by its text (`ModuleBuilder.render_split`): a tuning candidate's regions that an earlier
    candidate had are not compiled again (`cached_object`)."""
    return _kernel_module(funcs, target, False).render_split(target.triple)


def _kernel_module(funcs: list[PrimFunc], target: Target, thread_pool: bool) -> ModuleBuilder:
    _check_cpu(target)
    mod = ModuleBuilder(
        size_type="i32" if target.isa == "arm" else "i64",
        dot_forms=dot_forms(target),
        convert_lanes=_convert_lanes(target),
    )
    veclib = veclib_for(target)
    for func in funcs:
        _check_name(func.name, mod)
    for func in funcs:
        _emit_kernel(mod, func, veclib)
    if thread_pool:
        emit_thread_pool(mod, target.isa)
    else:
        declare_thread_pool(mod)
    _emit_heap_release(mod)
    for func in funcs:
        if func.name in mod.decls or func.name in POOL_EXTERNALS:
            raise CodegenError(f"kernel name {func.name!r} clashes with the external function it calls")
    return mod


def _convert_lanes(target: Target) -> int:
    """`ModuleBuilder.convert_lanes` of `target`: its widest cvtps2dq (x86-64 has SSE2's at least)."""
    if target.isa != "x86_64":
        return 0
    return 8 if "avx" in cpu_features(target) else 4


def thread_pool_ir(target: Target) -> str:
    """Textual LLVM IR of the thread pool alone, for kernel modules built with `thread_pool=False`."""
    _check_cpu(target)
    mod = ModuleBuilder(size_type="i32" if target.isa == "arm" else "i64")
    emit_thread_pool(mod, target.isa, separate=True)
    return mod.render(target.triple)


def thread_pool_object(target: Target, opt_level: int = 3) -> bytes:
    """The object code of `thread_pool_ir(target)`, compiled once per process and target: the tuner links
    it into every candidate's library instead of compiling the pool again each time."""
    key = (target.triple, target.mcpu, target.features, target.isa, opt_level)
    obj = _POOL_OBJECTS.get(key)
    if obj is None:
        obj = _POOL_OBJECTS[key] = compile_to_object(thread_pool_ir(target), target, opt_level)
    return obj


_POOL_OBJECTS: dict[tuple[str, str, str, str, int], bytes] = {}


def _check_cpu(target: Target) -> None:
    if not target.is_cpu:
        raise CodegenError(f"the LLVM CPU code generator cannot compile for target {target}")


def _emit_heap_release(mod: ModuleBuilder) -> None:
    """Free the kernels' cached heap blocks when the library is unloaded (after the pool stopped): each
    open and close of a model leaked them."""
    if not mod.heap_slots:
        return
    mod.declare("free", "declare void @free(ptr) nounwind")
    fb = FunctionBuilder("define internal void @aotc.heap.release() nounwind")
    for slot in mod.heap_slots:
        free_heap_block(fb, fb.op(f"atomicrmw xchg ptr {slot}, ptr null acq_rel"))
    fb.ret("void")
    mod.functions.append(fb.render())
    mod.finalizers.append("@aotc.heap.release")


def _check_name(name: str, mod: ModuleBuilder) -> None:
    if not _NAME_RE.match(name) or name in _RESERVED or name.startswith(META_PREFIX):
        raise CodegenError(f"kernel name {name!r} is not a usable C identifier")
    if mod.unique_name(name) != name:
        raise CodegenError(f"two kernels are named {name!r}")


def _alias_scopes(mod: ModuleBuilder, func: PrimFunc) -> dict[Buffer, str]:
    """One alias scope per buffer: distinct buffers never overlap, so accesses are marked noalias."""
    bufs = all_buffers(func)
    if len(bufs) < 2:
        return {}
    return dict(zip(bufs, mod.alias_scopes(func.name, len(bufs)), strict=True))


def _emit_kernel(mod: ModuleBuilder, func: PrimFunc, veclib: VecLib | None) -> None:
    if len(set(func.params)) != len(func.params):
        raise CodegenError(f"kernel {func.name!r} lists the same buffer twice among its params")
    fb = FunctionBuilder(f'define i32 @"{func.name}"(ptr %args) #0 align {KERNEL_ALIGNMENT}')
    gen = StmtGen(
        mod,
        fb,
        veclib,
        _alias_scopes(mod, func),
        func.name,
        lambda: fb.ret("i32 1"),
        read_only=frozenset(func.params) - stored_buffers(func.body),
    )
    for i, buf in enumerate(func.params):
        slot = fb.op(f"getelementptr ptr, ptr %args, i64 {i}") if i else "%args"
        gen.bind_buffer(buf, fb.op(f"load ptr, ptr {slot}"))  # ABI alignment: 4 on 32-bit Arm
    gen.stmt(func.body)
    fb.ret("i32 0")
    mod.functions.append(fb.render())
    mod.globals.append(_metadata_global(func))


def _metadata_global(func: PrimFunc) -> str:
    params = [
        {"name": b.name, "dtype": b.dtype, "shape": list(b.shape), "num_elements": b.num_elements}
        for b in func.params
    ]
    text, n = string_const(json.dumps({"name": func.name, "params": params}).encode())
    return f'@"{META_PREFIX}{func.name}" = constant [{n} x i8] {text}, align 1'


# ----------------------------------------------------------------------------- object code

_LOCK = threading.Lock()


# The most loads and stores the machine schedulers keep apart in one scheduling region; beyond it LLVM cuts
# its dependence maps down as it builds them (a more conservative order for the rest). LLVM's default,
# 1000, let the schedulers take 1-3 s on one region that a tuning candidate had unrolled; smaller regions,
# every kernel's loops among them, are scheduled as before.
SCHEDULER_REGION_MEMORY_OPS = 200


@functools.cache
def _init_llvm() -> None:
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    # A process-wide option (LLVM's command line): set once, as the first compilation starts.
    llvm.set_option("aotc", f"-dag-maps-huge-region={SCHEDULER_REGION_MEMORY_OPS}")


@functools.lru_cache(maxsize=64)
def _llvm_target(target: Target) -> llvm.Target:
    """LLVM's backend for `target`, whose CPU and feature names are checked (once per target)."""
    _init_llvm()
    try:  # LLVM ignores an unknown name with a warning, then may abort the process
        check_llvm_names(target)
    except TargetError as err:
        raise CodegenError(f"cannot compile for target {target}: {err}") from None
    try:
        return llvm.Target.from_triple(target.triple)
    except RuntimeError as err:
        raise CodegenError(f"LLVM has no backend for triple {target.triple!r}: {err}") from None


def _target_machine(target: Target, opt_level: int) -> llvm.TargetMachine:
    """A new target machine for each module. LLVM's ELF object lowering keeps the `llvm.used` globals of
    every module it emitted as bare pointers (`TargetLoweringObjectFileELF::Used`), so a machine that
    outlives a module puts a later module's global at a reused address in a section of its own, as if it
    were retained: the same IR then gave other object bytes now and then (a rebuilt package's library
    differed from the first build's). Creating one takes 0.1 ms."""
    cpu = llvm.get_host_cpu_name() if target.mcpu == "native" else target.mcpu
    return _llvm_target(target).create_target_machine(
        cpu=cpu, features=target.features, opt=opt_level, reloc="pic", codemodel="default"
    )


def compile_to_object(
    ir_text: str, target: Target, opt_level: int = 3, seconds: dict[str, float] | None = None
) -> bytes:
    """Parse and verify `ir_text`, optimize it (new pass manager) and emit an ELF object; `seconds`, if
    given, receives the time of each phase ("parse", "optimize", "emit")."""
    return _compile(ir_text, target, opt_level, False, seconds)  # type: ignore[return-value]


def cached_object(ir_text: str, target: Target, cache_dir: str) -> bytes:
    """`compile_to_object(ir_text, target)`, kept in `cache_dir` under a digest of the target and the text
    (written whole, then renamed: builder processes share the folder)."""
    digest = hashlib.sha256(f"{target}\n{ir_text}".encode()).hexdigest()[:32]
    path = os.path.join(cache_dir, f"{digest}.o")
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        pass
    obj = compile_to_object(ir_text, target)
    os.makedirs(cache_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache_dir, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(obj)
    os.replace(tmp, path)
    return obj


def compile_to_assembly(ir_text: str, target: Target, opt_level: int = 3) -> str:
    """The assembly `compile_to_object` would assemble (to see which instructions a kernel uses)."""
    return _compile(ir_text, target, opt_level, True, None)  # type: ignore[return-value]


def _compile(
    ir_text: str, target: Target, opt_level: int, assembly: bool, seconds: dict[str, float] | None
) -> bytes | str:
    with _LOCK:
        tm = _target_machine(target, opt_level)
        clock = _PhaseClock(seconds)
        try:
            mod = llvm.parse_assembly(ir_text, context=llvm.create_context())
            mod.triple = target.triple
            mod.data_layout = str(tm.target_data)
            mod.verify()
        except RuntimeError as err:
            raise CodegenError(f"generated LLVM IR is invalid: {err}") from None
        clock.lap("parse")
        _optimize(mod, tm, opt_level)
        clock.lap("optimize")
        out = tm.emit_assembly(mod) if assembly else tm.emit_object(mod)
        clock.lap("emit")
        return out


class _PhaseClock:
    """Adds the seconds since the previous lap to `seconds[phase]` (nothing when `seconds` is None)."""

    def __init__(self, seconds: dict[str, float] | None) -> None:
        self.seconds = seconds
        self.last = time.perf_counter()

    def lap(self, phase: str) -> None:
        if self.seconds is not None:
            now = time.perf_counter()
            self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self.last
            self.last = now


def _optimize(mod: llvm.ModuleRef, tm: llvm.TargetMachine, opt_level: int) -> None:
    if opt_level <= 0:
        return
    pto = llvm.create_pipeline_tuning_options(speed_level=min(opt_level, 3))
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_unrolling = True
    pto.loop_interleaving = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)


# ----------------------------------------------------------------------------- linking

_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64", "/lib64", "/usr/lib", "/lib")


def _find_lib(soname: str, dev_name: str | None = None) -> str | None:
    for d in _LIB_DIRS:
        path = os.path.join(d, soname)
        if os.path.exists(path):
            return path
    if dev_name and shutil.which("gcc"):
        out = subprocess.run(["gcc", f"-print-file-name={dev_name}"], capture_output=True, text=True).stdout
        if os.path.isabs(out.strip()):
            return os.path.realpath(out.strip())
    return None


# Per foreign architecture: the lld emulation, the GNU cross linker, where Debian's cross C library
# lives, and the Debian packages of that linker and library
_CROSS = {
    "aarch64": (
        "aarch64linux",
        "aarch64-linux-gnu-ld",
        "/usr/aarch64-linux-gnu/lib",
        ("gcc-aarch64-linux-gnu", "libc6-dev-arm64-cross"),
    ),
    "arm": (
        "armelf_linux_eabi",
        "arm-linux-gnueabihf-ld",
        "/usr/arm-linux-gnueabihf/lib",
        ("gcc-arm-linux-gnueabihf", "libc6-dev-armhf-cross"),
    ),
}


@functools.cache
def _link_inputs(arch: str | None = None) -> tuple[tuple[str, ...], list[str], dict[bytes, str]]:
    """The linker command, libraries every module needs, and libraries needed when a symbol prefix
    occurs: the host's, or for a foreign `arch` a cross linker and the cross C library."""
    host = platform.machine()
    if arch is None or arch == host:
        ld = "/usr/bin/ld" if os.path.exists("/usr/bin/ld") else shutil.which("ld")
        if ld is None:
            raise CodegenError("no linker: /usr/bin/ld not found")
        # libpthread is empty on glibc >= 2.34 (its functions moved into libc) and needed before it
        libs = [lib for lib in map(_find_lib, ("libm.so.6", "libpthread.so.0", "libc.so.6")) if lib]
        on_use = {b"_ZGV": LIBMVEC_PATH, b"hf2": _find_lib("libgcc_s.so.1")}
        return (ld,), libs, {k: v for k, v in on_use.items() if v and os.path.exists(v)}
    if arch not in _CROSS:
        raise CodegenError(f"linking for {arch} on this {host} host is not supported (only aarch64 and arm)")
    emulation, gnu_linker, libdir, (gcc_package, libc_package) = _CROSS[arch]
    lld, gnu_ld = shutil.which("ld.lld"), shutil.which(gnu_linker)
    if lld is None and gnu_ld is None:
        raise CodegenError(
            f"no linker for {arch}: install ld.lld (apt-get install lld) or the GNU cross linker "
            f"(apt-get install {gcc_package})"
        )
    libs = [os.path.join(libdir, so) for so in ("libm.so.6", "libc.so.6")]
    missing = [lib for lib in libs if not os.path.exists(lib)]
    if missing:
        raise CodegenError(
            f"no C library for {arch}: {', '.join(missing)} not found (apt-get install {libc_package})"
        )
    cmd = (lld, "-m", emulation) if lld is not None else (gnu_ld,)
    on_use = {b"hf2": os.path.join(libdir, "libgcc_s.so.1")}
    return cmd, libs, {k: v for k, v in on_use.items() if os.path.exists(v)}  # type: ignore[return-value]


def link_shared(
    objects: list[bytes], out_path: str, arch: str | None = None, needs_libc: bool = True
) -> None:
    """Link objects into a shared library at `out_path` (atomically replaced) needing libc and libm, for
    `arch` (a target's `isa`; None: this host's). `needs_libc=False` (this host's arch only) leaves their
    symbols to the process that loads it, which must have them: a tuning candidate loaded into Python.
    """
    ld, libs, on_use = _link_inputs(arch)
    if not needs_libc and (arch is None or arch == platform.machine()):
        libs = []  # reading libc.so's symbol table was 15 of the linker's 19 ms per candidate (Zen 3)
    libs = libs + [lib for marker, lib in on_use.items() if any(marker in obj for obj in objects)]
    out_dir = os.path.dirname(os.path.abspath(out_path))
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".aotc-link-") as tmp:
        paths = []
        for i, obj in enumerate(objects):
            path = os.path.join(tmp, f"m{i}.o")
            with open(path, "wb") as f:
                f.write(obj)
            paths.append(path)
        tmp_out = os.path.join(tmp, "out.so")
        cmd = [*ld, "-shared", "-z", "noexecstack", "-o", tmp_out, *paths, *libs]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise CodegenError(f"linking {out_path} failed: {proc.stderr.strip()}")
        os.replace(tmp_out, out_path)
