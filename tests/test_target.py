import platform

import pytest

from aotc.target import HOST_CPU_ENV, TargetError, host_target, parse_target


def test_explicit_cpu_and_features():
    t = parse_target("llvm -mcpu=znver4 -mattr=+avx512f,+avx2")
    assert t.mcpu == "znver4" and t.mattr == ("+avx512f", "+avx2")
    assert t.hw.vector_bytes == 64 and t.hw.cache_line_bytes == 64
    assert str(t) == "llvm -mcpu=znver4 -mattr=+avx512f,+avx2"


def test_cross_triple_has_neon_width():
    t = parse_target("llvm -mtriple=aarch64-linux-gnu")
    assert t.triple == "aarch64-linux-gnu"
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
        ("opencl", "unknown kind"),
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
    assert (t.mcpu, t.mattr, t.hw.vector_bytes, t.hw.num_cores) == ("znver3", (), 32, 2)
    assert host_target() == parse_target("llvm")
    assert parse_target("llvm -mattr=-fma").mattr == ("-fma",)
    assert parse_target("llvm -mcpu=znver4").hw.vector_bytes == 64  # a named CPU is not the host
    monkeypatch.setenv(HOST_CPU_ENV, "x86-64")
    assert parse_target("llvm").hw.vector_bytes == 16


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
