"""Tuning candidates compile each parallel region on its own and keep its object (`build_module`'s
`object_cache`): the library computes what the whole module computes, and a region an earlier candidate
had is not compiled again."""

import glob

import numpy as np

from aotc.codegen import llvm
from aotc.codegen.module import build_module, load_library
from aotc.ir.expr import Buffer, Load, Var, cast, const
from aotc.ir.stmt import Allocate, BufferStore, ForKind, PrimFunc, Seq

from .test_codegen_llvm import HOST, loop

N = 1000


def kernel(name: str, second_step: int) -> PrimFunc:
    """Two parallel loops: b[i] = a[i] * 3, then c[i] = b[i] + `second_step`."""
    a, b, c = (Buffer(n, "int32", (N,)) for n in "abc")
    i, j = Var("i"), Var("j")
    first = loop(i, N, ForKind.PARALLEL, BufferStore(b, Load(a, (i,)) * cast("int32", const(3)), (i,)))
    second = loop(
        j, N, ForKind.PARALLEL, BufferStore(c, Load(b, (j,)) + cast("int32", const(second_step)), (j,))
    )
    return PrimFunc(name, (a, b, c), Seq((first, second)))


def run(path: str, name: str) -> np.ndarray:
    a = np.arange(N, dtype=np.int32)
    b, c = np.zeros(N, np.int32), np.zeros(N, np.int32)
    lib = load_library(path)
    lib.set_num_threads(2)
    lib.kernel(name)(a, b, c)
    return c


def test_split_libraries_compute_what_whole_ones_do_and_reuse_regions(tmp_path, monkeypatch):
    compiled = []
    real = llvm.compile_to_object
    monkeypatch.setattr(
        llvm, "compile_to_object", lambda ir, *a, **k: compiled.append(ir) or real(ir, *a, **k)
    )
    cache = str(tmp_path / "objects")

    build_module([kernel("k", 5)], HOST, str(tmp_path / "whole.so"))
    build_module([kernel("k", 5)], HOST, str(tmp_path / "one.so"), object_cache=cache)
    assert len(glob.glob(f"{cache}/*.o")) == 2  # its two regions, each in a module of its own
    expected = np.arange(N, dtype=np.int32) * 3 + 5
    np.testing.assert_array_equal(run(str(tmp_path / "whole.so"), "k"), expected)
    np.testing.assert_array_equal(run(str(tmp_path / "one.so"), "k"), expected)

    compiled.clear()  # the next candidate shares the first region: only the second one is new
    build_module([kernel("k", 7)], HOST, str(tmp_path / "two.so"), object_cache=cache)
    regions = [ir for ir in compiled if "aotc.region." in ir and "define hidden void" in ir]
    assert len(regions) == 1 and len(glob.glob(f"{cache}/*.o")) == 3
    np.testing.assert_array_equal(run(str(tmp_path / "two.so"), "k"), np.arange(N, dtype=np.int32) * 3 + 7)


def test_a_region_is_named_by_its_own_code_alone():
    """The same region in a kernel with more buffers (another stage) has the same module text: its alias
    scopes are its own buffers', and it declares only what it calls."""
    small = kernel("k", 5)
    a, b, c = small.params
    d, i = Buffer("d", "int32", (N,)), Var("i")
    extra = loop(i, N, ForKind.PARALLEL, BufferStore(d, Load(c, (i,)) - Load(a, (i,)), (i,)))
    large = PrimFunc("k", (a, b, c, d), Seq((small.body, extra)))
    _, small_regions = llvm.build_llvm_modules([small], HOST)
    _, large_regions = llvm.build_llvm_modules([large], HOST)
    assert len(small_regions) == 2 and len(large_regions) == 3
    assert set(small_regions) < set(large_regions)
    for region in small_regions:
        assert "!noalias" in region and "aotc.pool" not in region and "aligned_alloc" not in region
        assert region.count("distinct !{") == 3  # the region's domain and its two buffers' scopes


def test_a_region_using_a_global_of_its_module_stays_in_it(tmp_path):
    """A heap buffer inside a parallel loop is cached in a global of the kernels' module between calls."""
    a, c, t = Buffer("a", "int32", (N,)), Buffer("c", "int32", (N,)), Buffer("t", "int32", (N,), "global")
    i, j = Var("i"), Var("j")
    fill = loop(j, N, ForKind.SERIAL, BufferStore(t, Load(a, (j,)), (j,)))
    body = Seq((fill, BufferStore(c, Load(t, (i,)) + cast("int32", const(1)), (i,))))
    func = PrimFunc("h", (a, c), loop(i, N, ForKind.PARALLEL, Allocate(t, body)))
    split = llvm.build_llvm_modules([func], HOST)
    assert split[1] == [] and 'define internal void @"h.par"' in split[0]
    b = tmp_path / "h.so"
    build_module([func], HOST, str(b), object_cache=str(tmp_path / "objects"))
    a_in, c_out = np.arange(N, dtype=np.int32), np.zeros(N, np.int32)
    load_library(str(b)).kernel("h")(a_in, c_out)
    np.testing.assert_array_equal(c_out, a_in + 1)
    two = llvm.build_llvm_modules([kernel("k", 1)], HOST)  # and a region without one leaves
    assert len(two[1]) == 2 and 'declare hidden void @"aotc.region.' in two[0] and "k.par" not in two[0]
