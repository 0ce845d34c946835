import os
import platform
import re
import subprocess
import sys

import pytest

from aotc.target import (
    CPU_FEATURES,
    HOST_CPU_ENV,
    TargetError,
    check_features_checkable,
    cpu_features,
    host_target,
    parse_target,
)


def test_explicit_cpu_and_features():
    t = parse_target("llvm -mcpu=znver4 -mattr=+avx512f,+avx2")
    assert t.mcpu == "znver4" and t.mattr == ("+avx512f", "+avx2")
    assert t.hw.vector_bytes == 64 and t.hw.cache_line_bytes == 64
    assert str(t) == "llvm -mcpu=znver4 -mattr=+avx512f,+avx2"


def test_cross_triple_has_neon_width():
    t = parse_target("llvm -mtriple=aarch64-linux-gnu")
    assert t.triple == "aarch64-unknown-linux-gnu"  # as LLVM reads it
    assert t.hw.vector_bytes == 16
    assert parse_target(str(t)) == t


def test_native_is_the_host():
    host = host_target()
    native = parse_target("llvm -mcpu=native -num-cores=2")
    assert native.mcpu == host.mcpu and native.mattr == host.mattr
    assert native.hw.num_cores == 2
    assert parse_target("llvm").mcpu == host.mcpu


def test_cuda_arch():
    assert parse_target("cuda -arch=sm_90").arch == "sm_90"


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty"),
        ("rocm", "unknown kind"),
        ("opencl -arch=sm_80", "unknown option -arch"),
        ("llvm -mcpu", "-key=value"),
        ("llvm -foo=1", "unknown option -foo"),
        ("llvm -mattr=avx2", "must start with"),
        ("llvm -num-cores=0", "positive integer"),
        ("llvm -mtriple=riscv64-linux-gnu", "unsupported triple"),
        ("cuda -arch=90", "sm_80"),
    ],
)
def test_bad_targets_name_the_problem(text, message):
    with pytest.raises(TargetError, match=message):
        parse_target(text)


def test_host_cpu_knob_makes_native_that_cpu_with_its_default_features(monkeypatch):
    monkeypatch.setenv(HOST_CPU_ENV, "znver3")
    t = parse_target("llvm -mcpu=native -num-cores=2")
    assert (t.mcpu, t.hw.vector_bytes, t.hw.num_cores) == ("znver3", 32, 2)
    assert all(a.startswith("-") for a in t.mattr)  # only what this host lacks (SSE4a on Intel) is off
    assert host_target() == parse_target("llvm")
    assert parse_target("llvm -mattr=-fma").mattr == ("-fma",)
    assert parse_target("llvm -mcpu=znver4").hw.vector_bytes == 64  # a named CPU is not the host
    monkeypatch.setenv(HOST_CPU_ENV, "x86-64")
    assert parse_target("llvm").hw.vector_bytes == 16


@pytest.mark.parametrize("cpu", ["znver3", "alderlake", "haswell", "x86-64-v3", "skylake-avx512", "znver4"])
def test_host_cpu_knob_never_needs_a_feature_the_host_lacks(monkeypatch, cpu):
    """alderlake's AVX-VNNI is no znver4's, znver3's SSE4a no Intel CPU's: the knob turns them off."""
    if platform.machine() != "x86_64":
        pytest.skip("the known-CPU tables are x86-64's")
    monkeypatch.delenv(HOST_CPU_ENV, raising=False)
    real = set(cpu_features(host_target()))
    monkeypatch.setenv(HOST_CPU_ENV, cpu)
    try:
        emulated = host_target()
    except TargetError as err:
        assert "wider than" in str(err)
        return
    assert emulated.mcpu == cpu
    assert set(cpu_features(emulated)) <= real


def test_host_cpu_knob_unset_empty_or_native_is_the_real_host(monkeypatch):
    monkeypatch.delenv(HOST_CPU_ENV, raising=False)
    real = host_target()
    for value in ("", "native"):
        monkeypatch.setenv(HOST_CPU_ENV, value)
        assert host_target() == real


def _vector_add_asm(t) -> str:
    """Assembly LLVM makes of a 16-float vector add for target `t`."""
    import llvmlite.binding as llvm

    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    ir = (
        "define void @f(ptr %a, ptr %b) {\n  %x = load <16 x float>, ptr %a\n  %y = load <16 x float>, ptr %b\n"
        "  %z = fadd <16 x float> %x, %y\n  store <16 x float> %z, ptr %a\n  ret void\n}\n"
    )
    tm = llvm.Target.from_triple(t.triple).create_target_machine(cpu=t.mcpu, features=t.features, opt=2)
    return tm.emit_assembly(llvm.parse_assembly(ir))


def test_host_cpu_knob_gives_avx2_code_on_any_x86_host(monkeypatch):
    monkeypatch.delenv(HOST_CPU_ENV, raising=False)
    real = host_target()
    if platform.machine() != "x86_64" or real.hw.vector_bytes < 32:
        pytest.skip("needs an x86-64 host with AVX2")
    if real.hw.vector_bytes == 64:  # the check below tells the two apart
        assert "zmm" in _vector_add_asm(real)
    monkeypatch.setenv(HOST_CPU_ENV, "znver3")
    asm = _vector_add_asm(parse_target("llvm"))
    assert "ymm" in asm and "zmm" not in asm


@pytest.mark.parametrize("value, message", [("zen3", "not a known x86-64 CPU"), ("x86-64-v4", "wider than")])
def test_host_cpu_knob_refuses_unknown_or_wider_cpus(monkeypatch, value, message):
    if platform.machine() != "x86_64":
        pytest.skip("the known-CPU tables are x86-64's")
    monkeypatch.delenv(HOST_CPU_ENV, raising=False)
    if message == "wider than" and host_target().hw.vector_bytes >= 64:
        pytest.skip(f"{host_target().mcpu} runs AVX-512: no x86 CPU is wider")
    monkeypatch.setenv(HOST_CPU_ENV, value)
    with pytest.raises(TargetError, match=message):
        parse_target("llvm")


# ----------------------------------------------------------------------------- CPU features


def test_named_x86_cpus_have_their_features():
    skx = cpu_features(parse_target("llvm -mcpu=skylake-avx512"))
    assert {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx2", "fma"} <= set(skx)
    assert "avx512vnni" not in skx and list(skx) == sorted(skx)
    assert "avx512vnni" in cpu_features(parse_target("llvm -mcpu=cascadelake"))
    zen3 = cpu_features(parse_target("llvm -mcpu=znver3"))
    assert {"avx", "avx2", "fma"} <= set(zen3) and not any(f.startswith("avx512") for f in zen3)
    assert cpu_features(parse_target("llvm -mcpu=x86-64")) == ()


def test_mattr_is_resolved_with_what_it_implies_and_removes():
    assert {"avx512f", "avx2", "avx", "fma"} <= set(
        cpu_features(parse_target("llvm -mcpu=x86-64 -mattr=+avx512bw"))
    )
    no_avx2 = cpu_features(parse_target("llvm -mcpu=skylake-avx512 -mattr=-avx2"))
    assert "avx" in no_avx2 and "avx2" not in no_avx2 and not any(f.startswith("avx512") for f in no_avx2)
    # tuning flags and extensions aotc's code cannot reach are no requirement
    assert cpu_features(parse_target("llvm -mcpu=x86-64 -mattr=+prefer-256-bit,+sha")) == ()


def test_arm_features():
    assert cpu_features(parse_target("llvm -mtriple=aarch64-linux-gnu")) == ("fp-armv8", "neon")
    v1 = cpu_features(parse_target("llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-v1"))
    assert {"neon", "dotprod", "i8mm", "sve", "lse"} <= set(v1)
    assert "sve" in cpu_features(parse_target("llvm -mtriple=aarch64-linux-gnu -mattr=+sve"))
    assert "neon" in cpu_features(parse_target("llvm -mtriple=armv7a-linux-gnueabihf -mcpu=cortex-a53"))
    assert cpu_features(parse_target("cuda -arch=sm_80")) == ()


def _cpuinfo_flags() -> set[str]:
    with open("/proc/cpuinfo") as f:
        line = next(line for line in f if line.startswith(("flags", "Features")))
    return set(line.split(":", 1)[1].split())


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo"), reason="reads /proc/cpuinfo")
def test_host_features_are_ones_the_host_has(monkeypatch):
    monkeypatch.delenv(HOST_CPU_ENV, raising=False)
    host = parse_target("llvm")
    features = cpu_features(host)
    flags = _cpuinfo_flags()
    names = CPU_FEATURES[host.isa]
    assert [f for f in features if names[f] not in flags] == []
    if host.isa == "x86_64" and "avx2" in flags:
        assert "avx2" in features  # the host's own features are found, not just a safe subset


def _add_asm(target, vector_type: str) -> str:
    """Assembly LLVM emits for `target` of a 512-bit vector add of `vector_type` (e.g. `<64 x i8>`)."""
    import llvmlite.binding as llvm

    add = "fadd" if "float" in vector_type else "add"
    ir = (
        f'define void @f(ptr %a, ptr %b) "min-legal-vector-width"="512" {{\n  %x = load {vector_type}, ptr %a\n'
        f"  %y = load {vector_type}, ptr %b\n  %z = {add} {vector_type} %x, %y\n"
        f"  store {vector_type} %z, ptr %a\n  ret void\n}}\n"
    )
    backend = llvm.Target.from_triple(target.triple)
    tm = backend.create_target_machine(cpu=target.mcpu, features=target.features, opt=2)
    return tm.emit_assembly(llvm.parse_assembly(ir))


@pytest.mark.parametrize("cpu", ["knl", "skylake-avx512", "znver3", "sandybridge", "x86-64"])
def test_features_agree_with_the_code_llvm_emits(cpu):
    """knl has AVX-512F without BW: a 64-byte add is one zmm instruction there, a byte add is not."""
    target = parse_target(f"llvm -mcpu={cpu}")
    features = cpu_features(target)
    floats, ints, bytes_ = (_add_asm(target, t) for t in ("<16 x float>", "<8 x i32>", "<64 x i8>"))
    assert ("avx512f" in features) == bool(re.search(r"vaddps[^\n]*%zmm", floats))
    assert ("avx" in features) == bool(re.search(r"vaddps[^\n]*%[yz]mm", floats))
    assert ("avx2" in features) == bool(re.search(r"vpaddd[^\n]*%[yz]mm", ints))
    assert ("avx512bw" in features) == bool(re.search(r"vpaddb[^\n]*%zmm", bytes_))


# ----------------------------------------------------------------------------- names LLVM does not know


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "llvm -mcpu=pentium9000",
            r"'pentium9000' is not a CPU LLVM knows for x86_64 \(some it knows: pentium",
        ),
        ("llvm -mtriple=aarch64-linux-gnu -mcpu=skylake", "'skylake' is not a CPU LLVM knows for aarch64"),
        ("llvm -mcpu=znver3 -mattr=+foo", r"-mattr '\+foo' is not a feature LLVM knows for x86_64"),
        ("llvm -mattr=+avx2,-bar", r"'llvm -mattr=\+avx2,-bar': -mattr '-bar' is not a feature"),
        ("llvm -mattr=+avx5l2f", r"some it knows: avx512f"),
        ("llvm -mcpu=help", "'help' is not a CPU"),
    ],
)
def test_unknown_llvm_names_are_target_errors(text, message):
    with pytest.raises(TargetError, match=message):
        parse_target(text)


def test_unknown_cpu_no_longer_aborts_code_generation(tmp_path):
    """LLVM warned about the name, then ended the process with `LLVM ERROR: 64-bit code requested on a
    subtarget that doesn't support it`; a Target made without parse_target is refused when its hardware
    parameters are resolved (x86-64), or by codegen."""
    code = (
        "from aotc.codegen.llvm import CodegenError, compile_to_object\n"
        "from aotc.target import Target, TargetError\n"
        "try:\n"
        "    compile_to_object('define i32 @f(i32 %x) {\\n  ret i32 %x\\n}\\n', Target('llvm', mcpu='pentium9000'))\n"
        "except (CodegenError, TargetError) as err:\n"
        "    print('refused:', err)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=120)
    assert "LLVM ERROR" not in proc.stderr and proc.returncode == 0, proc.stderr
    assert "refused:" in proc.stdout and "'pentium9000' is not a CPU" in proc.stdout


@pytest.mark.parametrize(
    "text, vector_bytes, veclib",
    [
        ("llvm -mcpu=skylake-avx512", 64, ("e", "d", "b")),
        ("llvm -mcpu=skylake-avx512 -mattr=-avx512f", 32, ("d", "b")),  # the CPU's class said 64
        ("llvm -mcpu=haswell -mattr=-fma", 32, ("c", "b")),  # libmvec's AVX2 variants use FMA
        ("llvm -mcpu=sandybridge", 32, ("c", "b")),
        ("llvm -mcpu=x86-64", 16, ("b",)),
    ],
)
def test_vector_width_and_math_variants_follow_the_resolved_features(text, vector_bytes, veclib):
    """Code for a target must not use what its features turn off: no zmm and no AVX-512 libmvec call
    on `-mattr=-avx512f` (the runtime's CPU check, built from the same features, would not catch it)."""
    from aotc.codegen.vecmath import LIBMVEC_PATH, veclib_for

    target = parse_target(text)
    assert target.hw.vector_bytes == vector_bytes
    if os.path.exists(LIBMVEC_PATH) and target.triple.startswith("x86_64"):
        assert veclib_for(target).isas == veclib


def test_as_target_takes_a_target_or_a_string_and_refuses_the_rest():
    from aotc.target import as_target

    t = parse_target("llvm -mcpu=skylake-avx512")
    assert as_target(t) is t
    assert as_target("llvm -mcpu=skylake-avx512") == t
    with pytest.raises(TypeError, match="target: expected a Target or a target string"):
        as_target(42)


def test_a_feature_the_runtime_cannot_check_is_refused_unless_the_host_has_it():
    """`+egpr` (APX) is outside CPU_FEATURES, so `requires` could not carry it: the package died with
    SIGILL (rc 132) in validation and on any CPU without APX."""
    with pytest.raises(TargetError, match=r"-mattr \+egpr: a package cannot record this feature"):
        check_features_checkable(parse_target("llvm -mcpu=znver4 -mattr=+egpr"))
    check_features_checkable(parse_target("llvm -mcpu=znver3 -mattr=+avx2,+fma"))  # in the table
    host = host_target()
    check_features_checkable(parse_target(f"llvm -mcpu={host.mcpu} -mattr={','.join(host.mattr)}"))
    # a record's target (another team's CPU) still parses: only what a build targets is checked
    parse_target("llvm -mcpu=sapphirerapids -mattr=+amx-tile,+egpr")


def test_gpu_targets_have_per_arch_limits():
    h100, a100, ocl = (
        parse_target("cuda -arch=sm_90"),
        parse_target("cuda -arch=sm_80"),
        parse_target("opencl"),
    )
    assert h100.is_gpu and ocl.is_gpu and not parse_target("llvm").is_gpu and not h100.is_cpu
    assert (h100.hw.num_cores, a100.hw.num_cores) == (132, 108)
    assert parse_target("cuda -arch=sm_86").hw.max_threads_per_multiprocessor == 1536
    assert (h100.hw.max_threads_per_block, h100.hw.warp_size, h100.hw.max_shared_memory_per_block) == (
        1024,
        32,
        48 * 1024,
    )
    assert (ocl.hw.max_threads_per_block, ocl.hw.max_shared_memory_per_block, str(ocl)) == (
        256,
        32768,
        "opencl",
    )


@pytest.mark.parametrize(
    "given, llvm_reads",
    [
        ("armv7a-linux-gnueabihf", "armv7a-unknown-linux-gnueabihf"),
        ("aarch64-linux-gnu", "aarch64-unknown-linux-gnu"),
        ("aarch64-unknown-linux-gnu", "aarch64-unknown-linux-gnu"),
        ("x86_64-pc-linux-gnu", "x86_64-pc-linux-gnu"),
    ],
)
def test_short_triples_are_normalized_for_llvm(given, llvm_reads):
    assert parse_target(f"llvm -mtriple={given}").triple == llvm_reads


def test_armv7_objects_use_the_hard_float_abi_gnueabihf_names():
    """LLVM reads `armv7a-linux-gnueabihf` by position (vendor `linux`, OS `gnueabihf`) and emitted
    soft-float objects, which Debian's armhf loader refuses as not found."""
    from aotc import te
    from aotc.codegen.llvm import build_llvm_ir, compile_to_object
    from aotc.schedule.default import default_schedule
    from aotc.schedule.lower import lower

    a = te.placeholder((8,), name="A")
    dag = te.ComputeDAG([te.compute((8,), lambda i: a[i] * 2.0, "double")])
    target = parse_target("llvm -mtriple=armv7a-linux-gnueabihf -mcpu=cortex-a7")
    obj = compile_to_object(build_llvm_ir([lower(default_schedule(dag, target), "double")], target), target)
    from aotc_runtime.elf import read_elf

    attributes = read_elf(obj).section(".ARM.attributes")
    assert attributes is not None and b"\x1c\x01" in attributes  # Tag_ABI_VFP_args: VFP registers
