import pytest

from aotc.target import TargetError, host_target, parse_target


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
