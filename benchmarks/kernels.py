"""GFLOP/s of hand-written good states (SSRSRS tiling, cache_write, parallel, vectorize, unroll)
next to numpy/OpenBLAS on the same shapes, measured in the same run, with 1 and 2 threads.

    python benchmarks/kernels.py [--quick]

The kernels' own thread pool spins briefly after each region, then sleeps, as in a deployed package;
OpenBLAS's threads spin too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np
from timing import median_seconds

from aotc import te
from aotc.codegen.llvm import build_llvm_ir, compile_to_object, link_shared
from aotc.codegen.module import load_library
from aotc.schedule.lower import lower
from aotc.schedule.state import State
from aotc.schedule.tiling import follow_tiling, multi_level_tile
from aotc.target import host_target
from aotc.topi import nn


def gemm_state(n: int) -> State:
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    dag = te.ComputeDAG([nn.matmul(a, b)])
    s = State.initial(dag).cache_write(2)  # stage 2: matmul.local, 3: matmul
    i_tiles = [2, 1, 8] if n >= 256 else [1, 2, 4]
    j_tiles = [4, 1, 32] if n >= 256 else [1, 1, 32]
    k_tile = [256] if n >= 256 else [n]
    op = s.stages[2].op
    (i, j), k = (a.name for a in op.axes), op.reduce_axes[0].name
    s, spatial = multi_level_tile(s, 2, "SSRSRS", {i: i_tiles, j: j_tiles, k: k_tile})
    s, at = follow_tiling(s, 3, spatial, 2)
    s = s.compute_at(2, 3, at)
    s = s.fuse(3, [0, 1]).parallel(3, 0)
    s = s.vectorize(3, len(s.stages[3].iters) - 1)
    s = s.vectorize(2, len(s.stages[2].iters) - 1)
    return s.pragma(2, 0, "auto_unroll_max_step$64")


def conv_state(c: int = 64, hw: int = 56, f: int = 64) -> State:
    x = te.placeholder((1, c, hw, hw), name="x")
    w = te.placeholder((f, c, 3, 3), name="w")
    dag = te.ComputeDAG([nn.conv2d_nchw(x, w, padding=1)])
    s = State.initial(dag).cache_write("conv2d")
    local, out, pad = (s.stage_id(n) for n in ("conv2d.local", "conv2d", "conv2d_pad"))
    lengths = {
        "nn": [1, 1, 1],
        "ff": [1, 1, 8],
        "yy": [1, 1, 2],
        "xx": [1, 1, 8],
        "rc": [8],
        "ry": [3],
        "rx": [3],
    }
    s, spatial = multi_level_tile(s, local, "SSRSRS", lengths)
    s, at = follow_tiling(s, out, spatial, 2)
    s = s.compute_at(local, out, at)
    s = s.fuse(out, [0, 1, 2, 3]).parallel(out, 0)
    s = s.vectorize(out, len(s.stages[out].iters) - 1)
    s = s.vectorize(local, len(s.stages[local].iters) - 1)
    s = s.pragma(local, 0, "auto_unroll_max_step$64")
    s = s.fuse(pad, [0, 1]).parallel(pad, 0)  # the pad at root, parallel over channels
    return s.vectorize(pad, len(s.stages[pad].iters) - 1)


def _set_numpy_threads(n: int) -> None:
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(n)
    except ImportError:
        pass


def compile_kernel(state: State, workdir: str, name: str) -> tuple[object, dict]:
    target = host_target()
    t0 = time.perf_counter()
    func = lower(state, name)
    t1 = time.perf_counter()
    ir = build_llvm_ir([func], target)
    obj = compile_to_object(ir, target)
    t2 = time.perf_counter()
    path = os.path.join(workdir, f"{name}.so")
    link_shared([obj], path)
    t3 = time.perf_counter()
    return load_library(path), {"lower": t1 - t0, "llvm": t2 - t1, "link": t3 - t2}


def bench_gemm(n: int, workdir: str, threads: list[int]) -> list[str]:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype("float32")
    b = rng.standard_normal((n, n)).astype("float32")
    c = np.zeros((n, n), "float32")
    lib, _ = compile_kernel(gemm_state(n), workdir, f"gemm{n}")
    kernel = lib.kernel(f"gemm{n}")
    call = kernel.prepare(a, b, c)
    call()
    np.testing.assert_allclose(c, a @ b, rtol=1e-3, atol=1e-3)
    flops = 2.0 * n**3
    rows = []
    for t in threads:
        lib.set_num_threads(t)
        _set_numpy_threads(t)
        ours = median_seconds(call, 0.3, 5)
        peer = median_seconds(lambda: np.matmul(a, b), 0.3, 5)
        rows.append(_row(f"gemm {n}^3", t, flops, ours, peer))
    return rows


def bench_conv(workdir: str, threads: list[int]) -> list[str]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 64, 56, 56)).astype("float32")
    w = rng.standard_normal((64, 64, 3, 3)).astype("float32")
    y = np.zeros((1, 64, 56, 56), "float32")
    lib, _ = compile_kernel(conv_state(), workdir, "conv3x3")
    call = lib.kernel("conv3x3").prepare(x, w, y)
    call()
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = np.stack(
        [padded[0, :, dy : dy + 56, dx : dx + 56] for dy in range(3) for dx in range(3)], axis=1
    ).reshape(64 * 9, 56 * 56)
    wmat = w.reshape(64, 64 * 9)

    def numpy_conv():
        p = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
        im2col = np.stack([p[0, :, dy : dy + 56, dx : dx + 56] for dy in range(3) for dx in range(3)], axis=1)
        return wmat @ im2col.reshape(64 * 9, 56 * 56)

    np.testing.assert_allclose(y.reshape(64, -1), wmat @ cols, rtol=1e-3, atol=1e-3)
    flops = 2.0 * 64 * 64 * 9 * 56 * 56
    rows = []
    for t in threads:
        lib.set_num_threads(t)
        _set_numpy_threads(t)
        ours = median_seconds(call, 0.3, 5)
        peer = median_seconds(numpy_conv, 0.3, 5)
        rows.append(_row("conv3x3 1x64x56x56 f64 (numpy: im2col+sgemm)", t, flops, ours, peer))
    return rows


def _row(name: str, threads: int, flops: float, ours: float, peer: float) -> str:
    g_ours, g_peer = flops / ours / 1e9, flops / peer / 1e9
    return f"{name:<46} {threads:>2}  {g_ours:8.1f}  {g_peer:8.1f}  {peer / ours:6.2f}x"


def compile_time(n: int, workdir: str, repeat: int) -> dict[str, float]:
    samples = []
    for r in range(repeat):
        _, parts = compile_kernel(gemm_state(n), workdir, f"ct{r}")
        samples.append(parts)
    return {k: statistics.median(p[k] for p in samples) for k in samples[0]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small shapes only (smoke run)")
    args = ap.parse_args(argv)
    threads = [1, 2] if (os.cpu_count() or 1) >= 2 else [1]
    sizes = [128] if args.quick else [1024, 512, 128]
    print(f"target: {host_target().mcpu}, numpy {np.__version__}")
    print(
        f"{'workload':<46} {'th':>2}  {'aotc':>8}  {'numpy':>8}  {'ratio':>7}   (GFLOP/s; ratio = aotc/numpy speed)"
    )
    with tempfile.TemporaryDirectory() as workdir:
        for n in sizes:
            for row in bench_gemm(n, workdir, threads):
                print(row, flush=True)
        if not args.quick:
            for row in bench_conv(workdir, threads):
                print(row, flush=True)
        ct = compile_time(512, workdir, 3 if args.quick else 9)
        total = sum(ct.values())
        print(
            f"compile time of the 512^3 GEMM kernel (median): {total * 1000:.1f} ms "
            f"(lower {ct['lower'] * 1000:.1f}, LLVM O3 {ct['llvm'] * 1000:.1f}, link {ct['link'] * 1000:.1f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
