"""ONNX quantized models: QDQ models written by onnxruntime's quantize_static (per tensor and per channel,
uint8 and int8 activations) imported with their groups folded into qnn kernels, against onnxruntime running
the same model. Quantized outputs: within 1 LSB on >= 99.9% of values, never more than 2 (the histogram is
in the failure message); float outputs (after the last DequantizeLinear): within 2 x the output scale.
"""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import aotc
from aotc.build import load_variants
from aotc.codegen.llvm import build_llvm_ir, compile_to_assembly
from aotc.frontend.errors import ConversionError
from aotc.frontend.onnx import load_onnx
from aotc.graph.interpret import run_graph
from aotc.graph.partition import extract_tasks
from aotc.graph.passes import optimize
from aotc.ir.dot import dot_forms, integer_winograd_rule
from aotc.recipe import Recipe
from aotc.schedule.layout import rewrite_layout
from aotc.schedule.lower import lower
from aotc.search.untuned import untuned_schedule
from aotc.target import parse_target
from aotc.te.tensor import NARROW_WEIGHTS
from aotc.validate import compare, format_report_row
from recipes.zoo import onnx_models as zoo

from .onnx_util import make_graph_model, weight_ints
from .test_dot_products import runs_here

MODELS = {
    "residual_block": (zoo.residual_block, {"qnn.conv2d_nhwc": 4, "qnn.add": 1}),
    "depthwise_separable": (zoo.depthwise_separable, {"qnn.conv2d_nhwc": 2, "qnn.depthwise_conv2d_nhwc": 1}),
    "dense_head": (zoo.dense_head, {"qnn.dense": 2, "qnn.add": 1}),
    "pooled_stem": (zoo.pooled_stem, {"qnn.conv2d_nhwc": 2, "qnn.max_pool2d_nhwc": 1}),
    # ResNet's 7x7 stride-2 stem, whose window rows become channels (window_columns_as_channels)
    "resnet_stem": (
        lambda: zoo.pooled_stem(size=20, kernel=7, stride=2),
        {"qnn.conv2d_nhwc": 2, "qnn.max_pool2d_nhwc": 1},
    ),
}
FLOAT_OPS = {"conv2d", "dense", "matmul", "add", "relu", "clip", "max_pool2d"}
SEEDS = range(4)


def quantized_model(
    tmp_path, name: str, per_channel: bool, activations: str, float_model: onnx.ModelProto | None = None
) -> tuple[str, str, float]:
    """The zoo model `name` (or `float_model`) quantized into tmp_path, with its last QuantizeLinear's output
    made a second graph output; (path, that quantized output's name, the float output's scale)."""
    path = tmp_path / f"{name}_{'channel' if per_channel else 'tensor'}_{activations}.onnx"
    zoo.quantize(float_model or MODELS[name][0](), path, per_channel, activations)
    model = onnx.load(path)
    last_dq = next(n for n in model.graph.node if model.graph.output[0].name in n.output)
    model.graph.output.append(helper.make_empty_tensor_value_info(last_dq.input[0]))
    onnx.save(model, path)
    scales = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return str(path), last_dq.input[0], float(scales[last_dq.input[1]])


def seeded_inputs(path: str) -> list[dict[str, np.ndarray]]:
    (vi,) = onnx.load(path).graph.input
    shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
    return [
        {vi.name: np.random.default_rng(100 + s).standard_normal(shape).astype(np.float32)} for s in SEEDS
    ]


def onnxruntime_outputs(path: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def pooled(runs: list[dict]) -> dict[str, np.ndarray]:
    return {name: np.concatenate([r[name].reshape(-1) for r in runs]) for name in runs[0]}


def assert_matches(got: dict, ref: dict, quantized: str, float_scale: float | None, what: str) -> None:
    """The quantized output by the LSB rule; every float output within 2 x `float_scale`."""
    (row,) = compare({quantized: got[quantized]}, {quantized: ref[quantized]}, 0.0, 0.0)
    assert row["ok"], f"{what}:\n{format_report_row(row)}"
    for name, value in ref.items():
        if name != quantized and float_scale is not None:
            err = np.abs(got[name].astype(np.float64) - value).max()
            assert err <= 2 * float_scale, f"{what}: {name} off by {err / float_scale:.2f} x its scale"


@pytest.mark.parametrize(
    "name, per_channel, activations", list(itertools.product(MODELS, (False, True), ("uint8", "int8")))
)
def test_quantize_static_model_folds_into_qnn_kernels_and_matches_onnxruntime(
    tmp_path, name, per_channel, activations
):
    path, quantized, scale = quantized_model(tmp_path, name, per_channel, activations)
    graph = load_onnx(path)
    ops = Counter(n.op for n in graph.nodes)
    for op, count in MODELS[name][1].items():
        assert ops[op] == count, f"{op}: {dict(ops)}"
    assert not FLOAT_OPS & set(ops), f"float ops left unfolded: {dict(ops)}"
    assert ops["qnn.quantize"] == 1 and ops["qnn.dequantize"] == 1  # the model's input and output only
    feeds = seeded_inputs(path)
    got = pooled([run_graph(graph, f) for f in feeds])
    ref = pooled([onnxruntime_outputs(path, f) for f in feeds])
    assert_matches(got, ref, quantized, scale, f"{name} (numpy evaluator)")


@pytest.mark.parametrize(
    "name, per_channel, activations",
    [
        ("residual_block", True, "uint8"),
        ("depthwise_separable", False, "int8"),
        ("dense_head", True, "int8"),
        ("pooled_stem", True, "uint8"),
        ("resnet_stem", True, "uint8"),
        ("resnet_stem", False, "int8"),
    ],
)
def test_compiled_qdq_package_equals_the_graph_and_matches_onnxruntime(
    tmp_path, name, per_channel, activations
):
    path, quantized, scale = quantized_model(tmp_path, name, per_channel, activations)
    graph = load_onnx(path)
    model = aotc.compile(path, output=tmp_path / f"{name}.aotc", validate=False, log=lambda _: None).load()
    for feeds in seeded_inputs(path)[:2]:
        got = model.run(feeds)
        expected = run_graph(graph, feeds)
        for out, value in expected.items():
            np.testing.assert_array_equal(got[out], value, err_msg=out)
        assert_matches(got, onnxruntime_outputs(path, feeds), quantized, scale, f"{name} (package)")


def untuned_assembly(model: str, target: str) -> str:
    """The assembly of the untuned kernels a build of `model` for `target` compiles."""
    recipe = Recipe(model=Path(model), target=target)
    ((graph, groups),) = load_variants(recipe)
    t = parse_target(target)
    funcs = []
    for i, task in enumerate(extract_tasks(groups)):
        state, _ = rewrite_layout(untuned_schedule(task.dag, t))
        funcs.append(lower(state, f"k{i}"))
    return compile_to_assembly(build_llvm_ir(funcs, t), t)


def test_reduce_range_weights_run_on_avx2_maddubs_and_match_onnxruntime(tmp_path):
    """7-bit weights (quantize_static's reduce_range, the tests' default) built for znver3 (AVX2): every
    conv and dense layer is marked NARROW_WEIGHTS, its kernels sum products with vpmaddubsw, and the
    package equals the graph and matches onnxruntime; full-range weights are not marked (vpmaddwd, where
    the package equals the graph too)."""
    full = zoo.quantize(zoo.residual_block(), tmp_path / "full.onnx", True, "uint8", reduce_range=False)
    layers = ("qnn.conv2d_nhwc", "qnn.depthwise_conv2d_nhwc", "qnn.dense")
    assert not any(
        n.attrs.get(NARROW_WEIGHTS) for n in optimize(load_onnx(str(full)), narrow_dots=True).nodes
    )
    znver3_runs_here = runs_here(parse_target("llvm -mcpu=znver3"))
    if znver3_runs_here:  # full-range weights on vpmaddwd: the package equals the graph bit for bit
        package = aotc.compile(
            str(full), "llvm -mcpu=znver3", output=tmp_path / "full.aotc", validate=False, log=lambda _: None
        )
        feeds = seeded_inputs(str(full))[0]
        got, expected = package.load().run(feeds), run_graph(load_onnx(str(full)), feeds)
        for out, value in expected.items():
            np.testing.assert_array_equal(got[out], value, err_msg=f"{out} (full-range weights)")
    for name, per_channel, activations in (
        ("residual_block", True, "uint8"),
        ("depthwise_separable", False, "int8"),
    ):
        path, quantized, scale = quantized_model(tmp_path, name, per_channel, activations)
        marked = [
            n.attrs.get(NARROW_WEIGHTS)
            for n in optimize(load_onnx(path), narrow_dots=True).nodes
            if n.op in layers
        ]
        assert marked and all(marked), marked
        package = aotc.compile(
            path, "llvm -mcpu=znver3", output=tmp_path / f"{name}.aotc", validate=False, log=lambda _: None
        )
        assert "\tvpmaddubsw\t" in untuned_assembly(path, "llvm -mcpu=znver3")
        if not znver3_runs_here:
            continue
        model, graph = package.load(), load_onnx(path)
        for feeds in seeded_inputs(path)[:2]:
            got = model.run(feeds)
            for out, value in run_graph(graph, feeds).items():
                np.testing.assert_array_equal(got[out], value, err_msg=out)
            assert_matches(
                got, onnxruntime_outputs(path, feeds), quantized, scale, f"{name} (znver3 package)"
            )


@pytest.mark.parametrize("per_channel, activations", [(True, "uint8"), (False, "int8")])
def test_integer_winograd_package_equals_the_direct_convs_and_matches_onnxruntime(
    tmp_path, per_channel, activations
):
    """A residual block of 16 channels built for znver3 (AVX2 without VNNI): its two 3x3 stride-1 convs
    run as integer Winograd F(2, 3) (docs/int8.md#integer-winograd), the stem (3 channels) and the 1x1
    stride-2 conv stay direct; the package equals the numpy evaluator's direct convs bit for bit and
    matches onnxruntime. Compile-only where znver3's code cannot run."""
    name = f"residual16_{activations}"
    path, quantized, scale = quantized_model(
        tmp_path, name, per_channel, activations, zoo.residual_block(channels=16, size=10)
    )
    rule = integer_winograd_rule(dot_forms(parse_target("llvm -mcpu=znver3")))
    ops = Counter(n.op for n in optimize(load_onnx(path), integer_winograd=rule).nodes)
    assert ops["qnn.conv2d_winograd_nhwc"] == 2 and ops["qnn.conv2d_nhwc"] == 2, dict(ops)
    target = "llvm -mcpu=znver3"
    package = aotc.compile(path, target, output=tmp_path / f"{name}.aotc", validate=False, log=lambda _: None)
    built = Counter(n.op for t in package.result.tasks for g in t.groups for n in g.nodes)
    assert built["qnn.conv2d_winograd_nhwc"] == 2, dict(built)
    if not runs_here(parse_target(target)):
        return
    model, graph = package.load(), load_onnx(path)
    for feeds in seeded_inputs(path):
        got = model.run(feeds)
        for out, value in run_graph(graph, feeds).items():
            np.testing.assert_array_equal(got[out], value, err_msg=out)
        assert_matches(got, onnxruntime_outputs(path, feeds), quantized, scale, f"{name} (znver3 package)")


def _float_model(name: str) -> onnx.ModelProto:
    """grouped_conv: a 3x3 Conv with group=2 and a Relu; matmuls: MatMul, Relu, MatMul (QLinearMatMul's form)."""
    rng = np.random.default_rng(5)
    if name == "grouped_conv":
        inits = {"w": (rng.standard_normal((8, 2, 3, 3)) * 0.4).astype(np.float32)}
        nodes = [
            helper.make_node("Conv", ["input", "w"], ["c"], group=2, pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["output"]),
        ]
        shape = [1, 4, 6, 6]
    else:
        inits = {
            "w1": (rng.standard_normal((32, 24)) * 0.25).astype(np.float32),
            "w2": (rng.standard_normal((24, 10)) * 0.3).astype(np.float32),
        }
        nodes = [
            helper.make_node("MatMul", ["input", "w1"], ["h"]),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("MatMul", ["r", "w2"], ["output"]),
        ]
        shape = [2, 32]
    model = make_graph_model(nodes, {}, ["output"], inits, opset=17)
    model.graph.input.append(helper.make_tensor_value_info("input", TensorProto.FLOAT, shape))
    return model


@pytest.mark.parametrize(
    "name, quant_format, per_channel, expected",
    [
        ("grouped_conv", "QDQ", True, "qnn.conv2d_nhwc"),
        ("depthwise_separable", "QOperator", False, "qnn.depthwise_conv2d_nhwc"),
        ("depthwise_separable", "QOperator", True, "qnn.depthwise_conv2d_nhwc"),
        ("matmuls", "QOperator", True, "qnn.dense"),
    ],
)
def test_grouped_conv_and_qlinear_operators_match_onnxruntime(
    tmp_path, name, quant_format, per_channel, expected
):
    """A grouped conv folds too; QLinearConv / QLinearMatMul (QOperator format) map onto the same kernels."""
    model = MODELS[name][0]() if name in MODELS else _float_model(name)
    path = str(zoo.quantize(model, tmp_path / f"{name}.onnx", per_channel, "int8", quant_format))
    graph = load_onnx(path)
    ops = Counter(n.op for n in graph.nodes)
    assert ops[expected] >= 1 and not FLOAT_OPS & set(ops), dict(ops)
    feeds = seeded_inputs(path)
    got = pooled([run_graph(graph, f) for f in feeds])
    ref = pooled([onnxruntime_outputs(path, f) for f in feeds])
    quantized = onnx.load(path)
    (last_dq,) = [n for n in quantized.graph.node if "output" in n.output]
    scale = next(numpy_helper.to_array(t) for t in quantized.graph.initializer if t.name == last_dq.input[1])
    assert np.abs(got["output"] - ref["output"]).max() <= 2 * float(scale)


# --- QuantizeLinear / DequantizeLinear on their own, and groups that stay in float ---------------------------


def _qdq_roundtrip_model(dtype: str, per_channel: bool) -> tuple[onnx.ModelProto, np.ndarray]:
    """x -> QuantizeLinear -> q (an output) -> DequantizeLinear -> y, scales powers of two so that x holds
    exact ties; and the input."""
    channels = 3
    scales = np.array([0.25, 0.5, 0.125] if per_channel else [0.25], np.float32)
    zero_points = np.array([-3, 0, 5] if dtype == "int8" else [120, 128, 7], dtype)[: scales.size]
    shape = () if not per_channel else (channels,)
    inits = {"scale": scales.reshape(shape), "zero": zero_points.reshape(shape)}
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"], name="quantize", axis=1),
        helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["y"], name="dequantize", axis=1),
    ]
    model = make_graph_model(nodes, {}, ["q", "y"], inits, opset=13)
    model.graph.input.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, channels, 4, 5]))
    rng = np.random.default_rng(7)
    ties = (rng.integers(-300, 300, (2, channels, 4, 5)) + 0.5) * 0.125  # k + 1/2 steps of every scale
    x = np.where(rng.random(ties.shape) < 0.5, ties, rng.standard_normal(ties.shape) * 20).astype(np.float32)
    return model, x


@pytest.mark.parametrize("dtype, per_channel", list(itertools.product(("int8", "uint8"), (False, True))))
def test_quantize_and_dequantize_linear_equal_onnxruntime(tmp_path, dtype, per_channel):
    """Rounding half to even at exact ties, saturation, per-channel zero points: bit for bit."""
    model, x = _qdq_roundtrip_model(dtype, per_channel)
    path = str(tmp_path / "qdq.onnx")
    onnx.save(model, path)
    got = run_graph(load_onnx(path), {"x": x})
    ref = onnxruntime_outputs(path, {"x": x})
    assert got["q"].dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got["q"], ref["q"])
    np.testing.assert_array_equal(got["y"], ref["y"])


def _conv_clip_model(low: float, high: float, alpha: float) -> onnx.ModelProto:
    """uint8 x -> DQ, DQ(int8 w per channel), DQ(int32 bias) -> Conv -> Clip(low, high) -> Q -> DQ, then
    DQ -> Gemm(alpha) -> Q -> DQ: hand-written QDQ groups."""
    rng = np.random.default_rng(3)
    w_scale = rng.uniform(0.005, 0.02, 6).astype(np.float32)
    x_scale, y_scale, g_scale = np.float32(0.03), np.float32(0.02), np.float32(0.05)
    inits = {
        "x_scale": x_scale,
        "x_zero": np.uint8(120),
        "w": weight_ints(rng, "int8", (6, 4, 3, 3)),
        "w_scale": w_scale,
        "w_zero": np.zeros(6, np.int8),
        "b": rng.integers(-500, 500, 6).astype(np.int32),
        "b_scale": (x_scale * w_scale).astype(np.float32),
        "b_zero": np.zeros(6, np.int32),
        "low": np.float32(low),
        "high": np.float32(high),
        "y_scale": y_scale,
        "y_zero": np.uint8(0),
        "g": weight_ints(rng, "int8", (5, 6 * 6 * 6)),
        "g_scale": np.float32(0.01),
        "g_zero": np.int8(0),
        "out_scale": g_scale,
        "out_zero": np.uint8(128),
        "flat": np.array([1, -1], np.int64),
    }
    nodes = [
        helper.make_node("DequantizeLinear", ["x", "x_scale", "x_zero"], ["xf"]),
        helper.make_node("DequantizeLinear", ["w", "w_scale", "w_zero"], ["wf"], axis=0),
        helper.make_node("DequantizeLinear", ["b", "b_scale", "b_zero"], ["bf"], axis=0),
        helper.make_node("Conv", ["xf", "wf", "bf"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c", "low", "high"], ["r"], name="clip"),
        helper.make_node("QuantizeLinear", ["r", "y_scale", "y_zero"], ["y"], name="conv_out"),
        helper.make_node("DequantizeLinear", ["y", "y_scale", "y_zero"], ["yf"]),
        helper.make_node("Reshape", ["yf", "flat"], ["flatf"]),
        helper.make_node("QuantizeLinear", ["flatf", "y_scale", "y_zero"], ["flatq"]),
        helper.make_node("DequantizeLinear", ["flatq", "y_scale", "y_zero"], ["flatd"]),
        helper.make_node("DequantizeLinear", ["g", "g_scale", "g_zero"], ["gf"]),
        helper.make_node("Gemm", ["flatd", "gf"], ["h"], name="gemm", transB=1, alpha=alpha),
        helper.make_node("QuantizeLinear", ["h", "out_scale", "out_zero"], ["out"], name="gemm_out"),
    ]
    model = make_graph_model(nodes, {}, ["y", "out"], inits, opset=13)
    model.graph.input.append(helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 4, 6, 6]))
    return model


@pytest.mark.parametrize(
    "low, high, alpha, float_ops",
    [(0.0, 6.0, 1.0, set()), (0.0, 3.0, 0.5, {"conv2d", "clip", "dense"})],
    ids=["relu6_folds", "clip_and_alpha_stay_float"],
)
def test_hand_written_groups_fold_or_stay_float_and_match_onnxruntime(tmp_path, low, high, alpha, float_ops):
    path = str(tmp_path / "conv_clip.onnx")
    onnx.save(_conv_clip_model(low, high, alpha), path)
    graph = load_onnx(path)
    ops = {n.op for n in graph.nodes}
    assert float_ops == FLOAT_OPS & ops, ops
    assert ("qnn.conv2d_nhwc" in ops) == (not float_ops)
    rng = np.random.default_rng(11)
    feeds = [{"x": rng.integers(0, 256, (1, 4, 6, 6)).astype(np.uint8)} for _ in SEEDS]
    got = pooled([run_graph(graph, f) for f in feeds])
    ref = pooled([onnxruntime_outputs(path, f) for f in feeds])
    for out in ("y", "out"):
        assert_matches(got, ref, out, None, f"{out} ({'float' if float_ops else 'folded'})")


def dq_op_q(tmp_path, op: onnx.NodeProto, out_scale: float, shape: list[int], extra: dict) -> tuple:
    """uint8 x -> DequantizeLinear (scale 0.03, zero point 17) -> `op` (xf -> r) -> QuantizeLinear with
    `out_scale` and the same zero point: (the imported graph, a seeded x, onnxruntime's y for it)."""
    inits = {"s": np.float32(0.03), "z": np.uint8(17), "os": np.float32(out_scale), **extra}
    nodes = [
        helper.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
        op,
        helper.make_node("QuantizeLinear", ["r", "os", "z"], ["y"]),
    ]
    model = make_graph_model(nodes, {}, ["y"], inits, opset=13)
    model.graph.input.append(helper.make_tensor_value_info("x", TensorProto.UINT8, shape))
    path = str(tmp_path / "dq_op_q.onnx")
    onnx.save(model, path)
    x = np.random.default_rng(5).integers(0, 256, shape).astype(np.uint8)
    return load_onnx(path), x, onnxruntime_outputs(path, {"x": x})["y"]


@pytest.mark.parametrize(
    "out_scale, pads, folds",
    [(0.03, [1, 1, 1, 1], True), (0.05, [1, 1, 1, 1], False), (0.03, [0, 0, 1, 1], True)],
)
def test_max_pool_between_dq_and_q_folds_only_with_its_input_quantization(tmp_path, out_scale, pads, folds):
    """DQ -> MaxPool -> Q with the input's own scale and zero point runs on the 8-bit values (padded taps
    ignored); with another scale it stays float. Either way bit for bit onnxruntime's."""
    pool = helper.make_node("MaxPool", ["xf"], ["r"], kernel_shape=[3, 3], strides=[2, 2], pads=pads)
    graph, x, expected = dq_op_q(tmp_path, pool, out_scale, [1, 5, 7, 7], {})
    ops = {n.op for n in graph.nodes}
    assert ("qnn.max_pool2d_nhwc" in ops) == folds and ("max_pool2d" in ops) != folds, ops
    np.testing.assert_array_equal(run_graph(graph, {"x": x})["y"], expected)


@pytest.mark.parametrize(
    "op, out_scale, folds", [("Flatten", 0.03, True), ("Reshape", 0.03, True), ("Reshape", 0.05, False)]
)
def test_reshape_between_dq_and_q_folds_only_with_its_input_quantization(tmp_path, op, out_scale, folds):
    """DQ -> Reshape / Flatten -> Q with the input's own scale and zero point reshapes the 8-bit values;
    with another scale it stays float. Either way bit for bit onnxruntime's."""
    node = helper.make_node(op, ["xf", "shape"] if op == "Reshape" else ["xf"], ["r"])
    graph, x, expected = dq_op_q(tmp_path, node, out_scale, [1, 5, 3, 2], {"shape": np.array([1, -1])})
    ops = Counter(n.op for n in graph.nodes)
    assert (ops["qnn.quantize"] == 0) == folds, dict(ops)
    np.testing.assert_array_equal(run_graph(graph, {"x": x})["y"], expected)


# --- bad input ------------------------------------------------------------------------------------------------


def test_unsupported_zero_point_type_is_an_error_naming_node_and_field(tmp_path):
    # (a run-time scale is a kernel input: tests/test_onnx_quant_runtime.py)
    int16 = make_graph_model(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], name="q_int16")],
        {},
        ["y"],
        {"s": np.float32(0.1), "z": np.int16(0)},
        opset=13,
    )
    int16.graph.input.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]))
    with pytest.raises(ConversionError, match=r"q_int16 \(QuantizeLinear\).*y_zero_point.*int16"):
        load_onnx(int16.SerializeToString())
