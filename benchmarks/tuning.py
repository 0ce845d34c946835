"""Tuned kernels next to their peers, measured in the same run (2 threads):

- fp32 GEMM 1024^3 vs numpy/OpenBLAS (target >= 0.9x);
- the 3x3 convs of ResNet-18's four stages and a depthwise conv vs onnxruntime running the same single-op
  model (target >= 1.0x); each side is timed three times, taking turns, and keeps its best;
- the best-so-far curve against trials, and where the tuning wall time went.

    python benchmarks/tuning.py [--gemm-trials 1000] [--conv-trials 400] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import helper, numpy_helper
from timing import median_seconds

from aotc.codegen.module import build_module, load_library
from aotc.schedule.default import default_schedule
from aotc.schedule.layout import apply_layouts, rewrite_layout
from aotc.schedule.lower import lower
from aotc.search.measure import MeasureOptions
from aotc.search.task import SearchTask, TuneResult
from aotc.target import host_target
from aotc.topi.workloads import make_workload

THREADS = 2
OPTIONS = MeasureOptions(repeat=3, min_repeat_ms=20, timeout=20.0)


def _tune(name: str, shape: list[int], trials: int) -> tuple[SearchTask, TuneResult, float]:
    task = SearchTask(make_workload(name, shape), host_target(), name)
    start = time.perf_counter()
    result = task.tune(
        trials,
        measure_options=OPTIONS,
        initial_states=[default_schedule(task.dag, task.target)],  # as `aotc build` tunes
        log=lambda line: print("   ", line, flush=True),
    )
    return task, result, time.perf_counter() - start


def _compiled(task: SearchTask, result: TuneResult, workdir: str):
    """The best state's kernel, and the weight layouts it reads (applied to the arguments as a build does)."""
    state, layouts = rewrite_layout(result.best_state)
    lib = load_library(build_module([lower(state, "best")], task.target, f"{workdir}/{task.name}.so"))
    lib.set_num_threads(THREADS)
    return lib.kernel("best"), layouts


def _set_numpy_threads(n: int) -> None:
    from threadpoolctl import threadpool_limits

    threadpool_limits(n)


def _onnx_conv(x_shape, w: np.ndarray, stride: int, pad: int, group: int) -> bytes:
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(x_shape))
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)
    node = helper.make_node(
        "Conv",
        ["x", "w"],
        ["y"],
        strides=[stride, stride],
        pads=[pad] * 4,
        group=group,
        kernel_shape=list(w.shape[2:]),
    )
    graph = helper.make_graph([node], "conv", [x], [y], [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return model.SerializeToString()


def _ort_session(model: bytes):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = THREADS
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def _best_of_turns(ours, peer, turns: int = 3) -> tuple[float, float]:
    """Median seconds of each, measured in turns (a passing load falls on both); the best turn of each."""
    times = [(median_seconds(ours), median_seconds(peer)) for _ in range(turns)]
    return min(t[0] for t in times), min(t[1] for t in times)


def _curve(task: SearchTask, result: TuneResult) -> list[str]:
    rows = []
    for h in result.history:
        gflops = task.dag.flop_count / h.best_cost / 1e9 if h.best_cost < float("inf") else 0.0
        rows.append(f"    trials {h.trials:5d}  elapsed {h.elapsed:7.1f} s  best {gflops:8.2f} GFLOP/s")
    return rows


def _split(result: TuneResult, wall: float) -> str:
    parts = ", ".join(f"{k} {v:.1f} s ({v / wall:.0%})" for k, v in result.seconds.items())
    return f"    wall {wall:.1f} s: {parts}"


def bench_gemm(trials: int, n: int, workdir: str) -> list[str]:
    task, result, wall = _tune("matmul", [n, n, n], trials)
    kernel, layouts = _compiled(task, result, workdir)
    assert not layouts, "the GEMM's operands are both inputs: nothing is re-laid out"
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    c = np.zeros((n, n), np.float32)
    call = kernel.prepare(a, b, c)
    call()
    np.testing.assert_allclose(c, a @ b, rtol=1e-3, atol=1e-3)
    _set_numpy_threads(THREADS)
    ours, peer = _best_of_turns(call, lambda: np.matmul(a, b))
    flops = 2.0 * n**3
    head = (
        f"gemm {n}^3, {result.trials} trials: aotc {flops / ours / 1e9:.1f} GFLOP/s, numpy {flops / peer / 1e9:.1f}"
        f" GFLOP/s -> {peer / ours:.2f}x (target >= 0.9x)"
    )
    return [head, *_curve(task, result), _split(result, wall)]


def bench_conv(name: str, label: str, shape: list[int], trials: int, workdir: str) -> list[str]:
    task, result, wall = _tune(name, shape, trials)
    kernel, layouts = _compiled(task, result, workdir)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(task.dag.placeholders[0].shape, dtype=np.float32)
    w = rng.standard_normal(task.dag.placeholders[1].shape, dtype=np.float32)
    y = np.zeros(task.dag.outputs[0].shape, np.float32)
    call = kernel.prepare(*apply_layouts([x, w], layouts), y)
    call()
    if name == "conv2d":
        stride, pad, group = shape[6], shape[7], 1
    else:
        stride, pad, group = shape[5], shape[6], shape[1]
    model = _onnx_conv(x.shape, w, stride, pad, group)
    sess = _ort_session(model)
    np.testing.assert_allclose(y, sess.run(None, {"x": x})[0], rtol=1e-3, atol=1e-3)
    ours, peer = _best_of_turns(call, lambda: sess.run(None, {"x": x}))
    flops = task.dag.flop_count
    head = (
        f"{label}, {result.trials} trials: aotc {ours * 1e3:.3f} ms ({flops / ours / 1e9:.1f} GFLOP/s), "
        f"onnxruntime {peer * 1e3:.3f} ms -> {peer / ours:.2f}x (target >= 1.0x)"
    )
    return [head, *_curve(task, result), _split(result, wall)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gemm-trials", type=int, default=1000)
    ap.add_argument("--conv-trials", type=int, default=400)
    ap.add_argument("--quick", action="store_true", help="small shapes and budgets (a smoke run)")
    ap.add_argument(
        "--only", default="gemm,conv,depthwise", help="comma-separated subset of gemm,conv,depthwise"
    )
    args = ap.parse_args(argv)
    n = 128 if args.quick else 1024
    gemm_trials = 32 if args.quick else args.gemm_trials
    conv_trials = 32 if args.quick else args.conv_trials
    stages = [(64, 56), (128, 28), (256, 14), (512, 7)]
    convs = [[1, 16, 14, 14, 16, 3, 1, 1]] if args.quick else [[1, c, s, s, c, 3, 1, 1] for c, s in stages]
    dw = [1, 16, 14, 14, 3, 1, 1] if args.quick else [1, 144, 56, 56, 3, 1, 1]
    out: list[str] = []
    with tempfile.TemporaryDirectory() as workdir:
        only = args.only.split(",")
        if "gemm" in only:
            out += bench_gemm(gemm_trials, n, workdir)
        for conv in convs if "conv" in only else []:
            out += bench_conv("conv2d", f"conv 3x3 {conv[:5]}", conv, conv_trials, workdir)
        if "depthwise" in only:
            out += bench_conv("depthwise", f"depthwise 3x3 {dw[:5]}", dw, conv_trials, workdir)
    print(f"\ntarget {host_target().mcpu}, {THREADS} threads, ratios = peer time / aotc time")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
