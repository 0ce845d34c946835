"""Winograd F(m, 3) convolutions: the transform matrices, the compute against onnxruntime's direct conv,
the graph pass that chooses them, and the schedules (default and searched) of their transforms."""

import random

import aotc_runtime
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from aotc import te
from aotc.build import build, load_model
from aotc.codegen.module import build_module, load_library
from aotc.frontend.onnx import load_onnx
from aotc.graph.passes import optimize
from aotc.recipe import load_recipe
from aotc.schedule.default import default_schedule
from aotc.schedule.layout import apply_layouts, rewrite_layout
from aotc.schedule.lower import lower
from aotc.schedule.state import Annotation
from aotc.search.annotation import sample_initial_population
from aotc.search.sketch import generate_sketches
from aotc.target import host_target
from aotc.te.reference import evaluate
from aotc.te.tensor import LAYOUT_FREE
from aotc.topi import winograd

from .onnx_util import IR_VERSION, run_onnxruntime

# F(4, 3) rounds differently from the direct sum: errors stay within 2e-6 of the output's scale here.
TOL = 2e-5


@pytest.mark.parametrize("m", winograd.tile_sizes())
def test_matrices_compute_a_correlation(m):
    at, g, bt = winograd.matrices(m)
    rng = np.random.default_rng(m)
    d, k = rng.standard_normal(m + 2), rng.standard_normal(3)
    expected = [sum(d[i + j] * k[j] for j in range(3)) for i in range(m)]
    np.testing.assert_allclose(at @ ((g @ k) * (bt @ d)), expected, rtol=1e-12, atol=1e-12)


def _conv_model(x_shape, weight: np.ndarray, pads, stride: int = 1) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=list(pads), strides=[stride, stride])
    graph = helper.make_graph([node], "conv", [x], [y], [numpy_helper.from_array(weight, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)


def _compile(state, path, name="k"):
    state, layouts = rewrite_layout(state)
    func = lower(state, name)
    build_module([func], host_target(), str(path))
    return load_library(path).kernel(name), layouts


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize(
    "m, shape, out_channels, pads",
    [
        (4, (1, 16, 12, 12), 24, (1, 1, 1, 1)),
        (4, (1, 16, 9, 13), 16, (1, 1, 1, 1)),  # partial tiles at the bottom and right
        (2, (2, 8, 7, 6), 8, (0, 1, 2, 1)),  # asymmetric pads, batch 2
    ],
)
def test_default_schedule_matches_onnxruntime(m, shape, out_channels, pads, layout, tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    w = (rng.standard_normal((out_channels, shape[1], 3, 3)) / np.sqrt(9 * shape[1])).astype(np.float32)
    (ref,) = run_onnxruntime(_conv_model(shape, w, pads), {"x": x})
    if layout == "NHWC":
        x, ref = x.transpose(0, 2, 3, 1).copy(), ref.transpose(0, 2, 3, 1)
    data = te.placeholder(x.shape, name="data")
    u = te.placeholder((m + 2, m + 2, shape[1], out_channels), name="u", tag=LAYOUT_FREE)
    dag = te.ComputeDAG([winograd.conv2d_winograd(data, u, m, pads, layout)])
    kernel, layouts = _compile(default_schedule(dag, host_target()), tmp_path / "k.so")
    y = np.zeros(ref.shape, np.float32)
    kernel(*apply_layouts([x, winograd.transform_weight(w, m)], layouts), y)
    np.testing.assert_allclose(y, ref, rtol=0, atol=TOL * np.abs(ref).max())


def test_default_schedule_unrolls_the_constant_indices():
    data = te.placeholder((1, 16, 8, 8), name="data")
    u = te.placeholder((6, 6, 16, 16), name="u", tag=LAYOUT_FREE)
    dag = te.ComputeDAG([winograd.conv2d_winograd(data, u, 4, name="wc")])
    s = default_schedule(dag, host_target())
    for name in ("wc_rows", "wc_data", "wc_cols", "wc"):
        iters = s.stages[s.stage_id(name)].iters
        assert any(it.annotation == Annotation.UNROLL for it in iters), name
        assert iters[-1].annotation == Annotation.VECTORIZE, name


@pytest.mark.parametrize("layout, shape", [("NCHW", (1, 16, 9, 10)), ("NHWC", (1, 9, 10, 16))])
def test_searched_schedules_compute_the_dag(layout, shape, tmp_path):
    """Sketches (with SimplifyComputeWithConstTensor) and their random annotations stay correct."""
    data = te.placeholder(shape, name="data")
    u = te.placeholder((6, 6, 16, 16), name="u", tag=LAYOUT_FREE)
    dag = te.ComputeDAG([winograd.conv2d_winograd(data, u, 4, layout=layout)])
    sketches = generate_sketches(dag, host_target())
    for sketch in sketches:
        iters = sketch.stages[sketch.stage_id("conv2d_winograd_data")].iters
        assert [it.annotation for it in iters[-3:-1]] == [Annotation.UNROLL] * 2
    states = sample_initial_population(dag, sketches, 6, random.Random(1), host_target())
    assert len(states) >= 3
    rng = np.random.default_rng(2)
    inputs = [rng.uniform(-1, 1, p.shape).astype(np.float32) for p in dag.placeholders]
    (ref,) = evaluate(dag, {p.name: a for p, a in zip(dag.placeholders, inputs)}, float_dtype="float64")
    for i, state in enumerate(states):
        kernel, layouts = _compile(state, tmp_path / f"k{i}.so")
        y = np.zeros(ref.shape, np.float32)
        kernel(*apply_layouts(inputs, layouts), y)
        np.testing.assert_allclose(y, ref, rtol=0, atol=TOL * np.abs(ref).max(), err_msg=str(state))


def _net(seed: int = 0) -> onnx.ModelProto:
    """Convs the pass takes (3x3, stride 1, >= 16 channels) and ones it leaves (stride 2, 8 channels,
    1x1), with a bias and a relu after the first."""
    rng = np.random.default_rng(seed)

    def weight(name, k, c, size):
        return numpy_helper.from_array(
            (rng.standard_normal((k, c, size, size)) * 0.2).astype(np.float32), name
        )

    inits = [
        weight("w1", 16, 16, 3),
        numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b1"),
        weight("w2", 16, 16, 3),
        weight("w3", 8, 16, 3),
        weight("w4", 8, 8, 3),
        weight("w5", 16, 8, 1),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Conv", ["c2", "w3"], ["c3"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["c3", "w4"], ["c4"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["c4", "w5"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 14, 14])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "net", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)


@pytest.mark.parametrize("nhwc", [False, True])
def test_pass_rewrites_only_the_convs_where_winograd_pays(nhwc):
    model = _net()
    graph = optimize(load_onnx(model.SerializeToString()), nhwc=nhwc)
    ops = [n.op for n in graph.nodes if n.op.startswith("conv")]
    suffix = "_nhwc" if nhwc else ""
    assert ops == [f"conv2d_winograd{suffix}"] + [f"conv2d{suffix}"] * 4
    first = next(n for n in graph.nodes if n.op.startswith("conv2d_winograd"))
    w1 = numpy_helper.to_array(model.graph.initializer[0])
    np.testing.assert_array_equal(first.inputs[1].data, winograd.transform_weight(w1, 4))
    assert first.attrs == {"tile": 4, "pads": (1, 1, 1, 1)}


def test_recipe_can_turn_winograd_off(tmp_path):
    (tmp_path / "net.onnx").write_bytes(_net().SerializeToString())
    recipe = tmp_path / "net.yaml"
    recipe.write_text("model: net.onnx\nvalidate: false\nwinograd: false\ntuning: {tophub: none}\n")
    graph = load_model(load_recipe(recipe))
    assert [n.op for n in graph.nodes if n.op.startswith("conv")] == ["conv2d_nhwc"] * 5


@pytest.mark.parametrize("nhwc", [False, True])
def test_built_package_matches_onnxruntime(tmp_path, nhwc):
    model = _net(1)
    (tmp_path / "net.onnx").write_bytes(model.SerializeToString())
    recipe = tmp_path / "net.yaml"
    recipe.write_text(
        f"model: net.onnx\noutput: net.aotc\nvalidate: true\nnhwc: {str(nhwc).lower()}\ntuning: {{tophub: none}}\n"
    )
    result = build(load_recipe(recipe), log=lambda _: None)
    task = "conv2d_winograd_nhwc" if nhwc else "conv2d_winograd"
    assert any(task in t.name for t in result.tasks), [t.name for t in result.tasks]
    x = np.random.default_rng(3).standard_normal((1, 16, 14, 14)).astype(np.float32)
    (ref,) = run_onnxruntime(model, {"x": x})
    got = aotc_runtime.load(str(result.package)).run({"x": x})["y"]
    np.testing.assert_allclose(got, ref, rtol=0, atol=TOL * np.abs(ref).max())
