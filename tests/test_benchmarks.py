"""The benchmark scripts must keep running (smoke runs on small shapes; timings are not checked)."""

import pathlib
import sys

import pytest

BENCH = pathlib.Path(__file__).parent.parent / "benchmarks"


def _import(name):
    sys.path.insert(0, str(BENCH))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(BENCH))


def test_kernel_benchmark_quick_run(capsys):
    assert _import("kernels").main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "gemm 128^3" in out and "compile time" in out


def test_e2e_benchmark_quick_run(capsys):
    assert _import("e2e").main(["--quick", "--models", "mlp"]) == 0
    assert "mlp" in capsys.readouterr().out


@pytest.mark.slow
def test_tuning_benchmark_quick_run(capsys):
    assert _import("tuning").main(["--quick"]) == 0
    assert "gemm 128^3" in capsys.readouterr().out
