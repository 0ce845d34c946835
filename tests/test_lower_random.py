"""Property tests: random valid schedules of real operators, compiled, equal the numpy reference."""

import numpy as np
import pytest

from aotc import te
from aotc.codegen.module import build_module, load_library
from aotc.ir.expr import cast
from aotc.ir.printer import func_str
from aotc.schedule.layout import apply_layouts, rewrite_layout
from aotc.schedule.lower import lower
from aotc.schedule.state import State
from aotc.schedule.steps import effective_consumers
from aotc.schedule.tiling import follow_tiling, multi_level_tile
from aotc.target import host_target
from aotc.te.reference import evaluate
from aotc.te.tensor import LAYOUT_FREE
from aotc.topi import nn

from .random_schedules import random_state

RTOL = 1e-5


def _matmul():
    a = te.placeholder((19, 13), name="A")
    b = te.placeholder((13, 23), name="B")
    return te.ComputeDAG([nn.matmul(a, b)])


def _dense_bias_relu():
    x = te.placeholder((7, 24), name="x")
    w = te.placeholder((18, 24), name="w", tag=LAYOUT_FREE)
    b = te.placeholder((18,), name="b")
    return te.ComputeDAG([nn.relu(nn.bias_add(nn.dense(x, w), b))])


def _int_dense_bias():
    """An int8 dense layer whose bias the lowering moves into the sum's first value."""
    x = te.placeholder((7, 24), "int8", name="x")
    w = te.placeholder((18, 24), "int8", name="w", tag=LAYOUT_FREE)
    b = te.placeholder((18,), "int32", name="b")
    k = te.reduce_axis(24, "k")
    acc = te.compute(
        (7, 18), lambda i, j: te.sum(cast("int32", x[i, k.var]) * cast("int32", w[j, k.var]), k), "acc"
    )
    return te.ComputeDAG([te.compute((7, 18), lambda i, j: (acc[i, j] + b[j]) * 3, "out")])


def _conv2d():
    x = te.placeholder((1, 4, 9, 10), name="x")
    w = te.placeholder((6, 2, 3, 3), name="w", tag=LAYOUT_FREE)
    return te.ComputeDAG([nn.conv2d_nchw(x, w, stride=(2, 1), padding=(1, 1, 0, 1), groups=2)])


def _conv2d_plain():
    x = te.placeholder((1, 3, 8, 8), name="x")
    w = te.placeholder((5, 3, 3, 3), name="w", tag=LAYOUT_FREE)
    return te.ComputeDAG([nn.conv2d_nchw(x, w, padding=1)])


def _depthwise():
    x = te.placeholder((1, 6, 10, 7), name="x")
    w = te.placeholder((6, 1, 3, 3), name="w", tag=LAYOUT_FREE)
    return te.ComputeDAG([nn.depthwise_conv2d_nchw(x, w, stride=1, padding=1)])


def _max_pool():
    x = te.placeholder((1, 3, 9, 9), name="x")
    return te.ComputeDAG([nn.pool2d_nchw(x, "max", 3, stride=2, padding=1)])


def _avg_pool():
    x = te.placeholder((1, 3, 8, 7), name="x")
    return te.ComputeDAG([nn.pool2d_nchw(x, "avg", 2, stride=2, padding=(0, 0, 1, 1))])


def _softmax():
    x = te.placeholder((5, 37), name="x")
    return te.ComputeDAG([nn.softmax(x)])


def _reduction():
    x = te.placeholder((4, 11, 6), name="x")
    return te.ComputeDAG([nn.reduce(x, "sum", [0, 2])])


def _reduce_max():
    x = te.placeholder((3, 50), name="x")
    return te.ComputeDAG([nn.reduce(x, "max", [1], keepdims=True)])


WORKLOADS = {
    "matmul": _matmul,
    "dense_bias_relu": _dense_bias_relu,
    "int_dense_bias": _int_dense_bias,
    "conv2d_groups": _conv2d,
    "conv2d": _conv2d_plain,
    "depthwise": _depthwise,
    "max_pool": _max_pool,
    "avg_pool": _avg_pool,
    "softmax": _softmax,
    "reduction": _reduction,
    "reduce_max": _reduce_max,
}
SEEDS_PER_WORKLOAD = 12


def run_state(state, dag, tmp_path, inputs):
    """Run the state's kernel, its layout-free weights re-laid out to follow its tiles."""
    state, layouts = rewrite_layout(state)
    func = lower(state, "kernel")
    path = build_module([func], host_target(), str(tmp_path / "k.so"))
    kernel = load_library(path).kernel("kernel")
    outs = [np.zeros(o.shape, o.dtype) for o in dag.outputs]
    kernel(*apply_layouts([inputs[p.name] for p in dag.placeholders], layouts), *outs)
    return outs, func


def random_inputs(dag, seed):
    rng = np.random.default_rng(seed)

    def draw(p):
        if p.dtype.startswith("int"):
            return rng.integers(-128, 128, p.shape).astype(p.dtype)
        return rng.uniform(-1, 1, p.shape).astype(p.dtype)

    return {p.name: draw(p) for p in dag.placeholders}


def check_random_schedule(workload, state_seed, input_seed, tmp_path):
    dag = WORKLOADS[workload]()
    state = random_state(dag, state_seed)
    inputs = random_inputs(dag, input_seed)
    refs = evaluate(dag, inputs, float_dtype="float64")
    outs, func = run_state(state, dag, tmp_path, inputs)
    for out, ref in zip(outs, refs):
        scale = float(np.max(np.abs(ref))) or 1.0
        np.testing.assert_allclose(
            out, ref, rtol=RTOL, atol=RTOL * scale, err_msg=f"{state}\n{func_str(func)}"
        )


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
@pytest.mark.parametrize("seed", range(SEEDS_PER_WORKLOAD))
def test_random_schedule_matches_numpy(workload, seed, tmp_path):
    check_random_schedule(workload, 1000 * seed + len(workload), seed, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("workload", sorted(WORKLOADS))
@pytest.mark.parametrize("seed", range(SEEDS_PER_WORKLOAD, 300))
def test_many_random_schedules_match_numpy(workload, seed, tmp_path):
    check_random_schedule(workload, 7919 * seed + len(workload), seed, tmp_path)


def _features(state):
    from aotc.schedule.steps import SplitStep

    tags = {type(s).tag for s in state.steps}
    non_dividing = any(
        isinstance(s, SplitStep) and s.extent and s.extent % int(np.prod(s.lengths)) for s in state.steps
    )
    rewritten = {"layout"} if rewrite_layout(state)[1] else set()
    outer = any(
        st.attach is not None and st.attach[0] not in effective_consumers(state, i)
        for i, st in enumerate(state.stages)
    )
    return (
        tags | ({"non-dividing"} if non_dividing else set()) | rewritten | ({"outer-CA"} if outer else set())
    )


def test_the_seeded_schedules_cover_every_feature():
    """The random schedules above must exercise compute_at (also at a loop enclosing the consumer's own
    location), cache_write, rfactor, non-dividing splits and weight layout rewrites."""
    covered = set()
    for workload in WORKLOADS:
        for seed in range(SEEDS_PER_WORKLOAD):
            covered |= _features(random_state(WORKLOADS[workload](), 1000 * seed + len(workload)))
    assert {
        "CA",
        "CHW",
        "CHR",
        "RF",
        "SA",
        "SP",
        "RE",
        "FU",
        "AN",
        "PR",
        "CI",
        "non-dividing",
        "layout",
        "outer-CA",
    } <= covered
    for workload in WORKLOADS:
        per = set()
        for seed in range(SEEDS_PER_WORKLOAD):
            per |= _features(random_state(WORKLOADS[workload](), 1000 * seed + len(workload)))
        assert {"CA", "CHW", "RF", "SP", "non-dividing"} <= per, workload


def test_padded_input_computed_per_outer_tile_matches_numpy(tmp_path):
    """A conv's pad stage computed at the outer (parallel) tile loop of the stage that holds the conv's
    cache_write: each tile pads only the rows it reads, into a tile-local buffer."""
    x = te.placeholder((1, 8, 10, 12), name="x")
    w = te.placeholder((16, 8, 3, 3), name="w", tag=LAYOUT_FREE)
    dag = te.ComputeDAG([nn.conv2d_nchw(x, w, padding=1, name="conv")])
    s = State.initial(dag).cache_write("conv")
    local, out, pad = (s.stage_id(n) for n in ("conv.local", "conv", "conv_pad"))
    lengths = {
        "nn": [1, 1, 1],
        "ff": [2, 1, 8],
        "yy": [1, 1, 3],
        "xx": [3, 1, 4],
        "rc": [4],
        "ry": [3],
        "rx": [3],
    }
    s, spatial = multi_level_tile(s, local, "SSRSRS", lengths)
    s, at = follow_tiling(s, out, spatial, 2)
    s = s.compute_at(local, out, at)
    s = s.compute_at(pad, out, 3)
    assert s.stages[pad].attach[0] == out and out not in effective_consumers(s, pad)
    s = s.fuse(out, [0, 1, 2, 3]).parallel(out, 0)
    inputs = random_inputs(dag, 0)
    (got,), func = run_state(s, dag, tmp_path, inputs)
    assert "conv_pad: float32[1, 8, 5, 14] local" in func_str(func)
    np.testing.assert_allclose(got, evaluate(dag, inputs)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("depthwise", [False, True])
def test_default_schedule_pads_per_parallel_tile(depthwise, tmp_path):
    """The untuned schedule of a padded conv computes the padded input inside each parallel tile (a block
    of rows, or of channels for a depthwise conv) rather than in a separate pass, and stays exact."""
    import dataclasses

    from aotc.schedule.default import default_schedule

    target = dataclasses.replace(host_target(), num_cores=2)
    assert target.hw.num_cores == 2
    x = te.placeholder((1, 16, 12, 10), name="x")
    if depthwise:
        w = te.placeholder((16, 1, 3, 3), name="w", tag=LAYOUT_FREE)
        dag = te.ComputeDAG([nn.depthwise_conv2d_nchw(x, w, stride=1, padding=1)])
    else:
        w = te.placeholder((8, 16, 3, 3), name="w", tag=LAYOUT_FREE)
        dag = te.ComputeDAG([nn.conv2d_nchw(x, w, padding=1)])
    state = default_schedule(dag, target)
    pad = next(st for st in state.stages if st.name.endswith("_pad"))
    assert pad.attach is not None, "the padded input is computed per tile"
    inputs = random_inputs(dag, 0)
    (got,), func = run_state(state, dag, tmp_path, inputs)
    assert " local" in func_str(func).split("_pad:")[1].splitlines()[0]
    np.testing.assert_allclose(got, evaluate(dag, inputs)[0], rtol=1e-5, atol=1e-5)


def test_an_integer_sum_starts_from_its_bias_and_a_float_one_does_not():
    """`acc[i, j] + b[j]` read once: the int32 sum starts from b[j] and the reader loses the add; the
    float dense layer's bias add stays where the graph put it (a different rounding order)."""
    for make, folded in ((_int_dense_bias, True), (_dense_bias_relu, False)):
        dag = make()
        text = func_str(lower(State.initial(dag), "k"))
        init = next(line for line in text.splitlines() if line.strip().startswith(("acc[", "dense[")))
        assert ("b[" in init) is folded, text
        assert ("+ b[" in text) is not folded, text
