"""The compile pipeline's shortcuts: the thread pool compiled once per target and linked next to each
kernel module gives the same library interface as the pool compiled into the module."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from aotc.codegen.irbuilder import CodegenError
from aotc.codegen.llvm import (
    build_llvm_ir,
    compile_to_object,
    link_shared,
    thread_pool_ir,
    thread_pool_object,
)
from aotc.codegen.module import load_library
from aotc.ir.expr import Buffer, Load, Var, cast, const
from aotc.ir.stmt import BufferStore, PrimFunc
from aotc.target import parse_target
from tests.test_codegen_llvm import HOST, P, loop

N = 1024


def count_func(name: str = "count") -> PrimFunc:
    """b[i] += 1 for i < n, in a parallel loop."""
    n, b, i = Buffer("N", "int64", (1,)), Buffer("B", "int32", (N,)), Var("i")
    body = BufferStore(b, Load(b, (i,)) + cast("int32", const(1)), (i,))
    return PrimFunc(name, (n, b), loop(i, Load(n, (const(0),)), P, body, N))


def dynamic_symbols(path: str) -> set[str]:
    out = subprocess.run(["readelf", "--dyn-syms", "-W", path], capture_output=True, text=True, check=True)
    return {
        line.split()[-1] for line in out.stdout.splitlines() if " GLOBAL " in line and " UND " not in line
    }


def library(tmp_path, pool_inside: bool):
    path = str(tmp_path / f"lib{int(pool_inside)}.so")
    obj = compile_to_object(build_llvm_ir([count_func()], HOST, thread_pool=pool_inside), HOST)
    link_shared([obj] if pool_inside else [obj, thread_pool_object(HOST)], path)
    return path


def test_separate_pool_gives_the_same_library_interface(tmp_path):
    inside, separate = library(tmp_path, True), library(tmp_path, False)
    assert dynamic_symbols(inside) == dynamic_symbols(separate)
    assert not any("aotc.pool" in s for s in dynamic_symbols(separate)), "the pool's entry is hidden"
    for path in (inside, separate):
        lib = load_library(path)
        for threads in (1, 2, 3):
            lib.set_num_threads(threads)
            b = np.zeros(N, np.int32)
            for _ in range(5):
                lib.kernel("count")(np.array([700], np.int64), b)
            np.testing.assert_array_equal(b, np.where(np.arange(N) < 700, 5, 0))


def test_kernel_module_without_pool_declares_it_and_stops_it_at_unload():
    ir = build_llvm_ir([count_func()], HOST, thread_pool=False)
    assert "declare hidden void @aotc.pool.parallel(" in ir
    assert "define" not in "".join(
        line for line in ir.splitlines() if "@aotc.pool." in line and "call" not in line
    )
    assert "call void @aotc.pool.shutdown()" in ir  # the kernel module's finalizer stops the pool first


def test_pool_object_is_compiled_once_per_target():
    assert thread_pool_object(HOST) is thread_pool_object(HOST)
    arm = parse_target("llvm -mtriple=aarch64-linux-gnu")
    assert thread_pool_object(arm)[:4] == b"\x7fELF" and thread_pool_object(arm) is not thread_pool_object(
        HOST
    )
    assert "define hidden void @aotc.pool.parallel(" in thread_pool_ir(arm)


@pytest.mark.parametrize("pool_inside", [True, False])
def test_a_kernel_named_like_a_function_the_pool_calls_is_refused(pool_inside):
    with pytest.raises(CodegenError, match="clashes"):
        build_llvm_ir([count_func("getpid")], HOST, thread_pool=pool_inside)


def test_compile_time_benchmark_quick_run(capsys):
    """benchmarks/compile_time.py keeps running, both ways, kernels timed, regions reused (figures are not
    checked)."""
    import pathlib
    import sys

    bench = str(pathlib.Path(__file__).parent.parent / "benchmarks")
    sys.path.insert(0, bench)
    try:
        import compile_time
    finally:
        sys.path.remove(bench)
    assert compile_time.main(["--quick", "--compare", "--kernels", "1", "--rounds", "1", "--reuse"]) == 0
    out = capsys.readouterr().out
    assert "CPU class" in out and "new: median" in out and "old: median" in out and "mutants median" in out
    assert "OUTPUTS DIFFER" not in out and out.count("bit-exact") == 4
