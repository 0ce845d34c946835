"""Quantization parameters and weights fed at run time are kernel inputs (issue 19, item 3).

QuantizeLinear / DequantizeLinear (per tensor, per axis, blocked), MatMulInteger, ConvInteger,
QLinearMatMul and QLinearConv given their scales, zero points and weights as graph inputs build once and
match onnxruntime bit for bit on the integer outputs; given them as constants they keep the fused qnn
kernels."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import helper

import aotc
from aotc.frontend.onnx import load_onnx
from aotc.graph.interpret import run_graph

from .onnx_util import weight_ints
from .test_onnx_integer_ops import model_of, onnxruntime_run, random_ints


def with_opset(model: onnx.ModelProto, version: int) -> onnx.ModelProto:
    """`model` importing the default domain at `version` (blocked quantization needs 21)."""
    for opset in model.opset_import:
        if opset.domain == "":
            opset.version = version
    return model


def assert_matches_onnxruntime(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], seeds: int = 2
) -> Counter:
    """aotc's import of `model`, with every input fed at run time, equals onnxruntime on `feeds` (exactly;
    float outputs too, as the operations are the reference's); the graph's operator counts."""
    graph = load_onnx(model.SerializeToString())
    assert {v.name for v in graph.inputs} == set(feeds), "every parameter stays a graph input"
    got, ref = run_graph(graph, feeds), onnxruntime_run(model, feeds)
    for name, value in ref.items():
        assert got[name].dtype == value.dtype, name
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    return Counter(n.op for n in graph.nodes)


def scales(rng: np.random.Generator, shape) -> np.ndarray:
    return np.asarray(rng.uniform(0.005, 0.05, shape), np.float32)


# --- QuantizeLinear / DequantizeLinear ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("mode", ["tensor", "axis", "blocked"])
def test_quantize_and_dequantize_with_run_time_scale_and_zero_point(dtype, mode):
    rng = np.random.default_rng(len(mode) + len(dtype))
    shape, attrs, param_shape = (2, 6, 5), {}, ()
    if mode == "axis":
        attrs, param_shape = {"axis": 1}, (6,)
    elif mode == "blocked":
        attrs, param_shape = {"axis": 1, "block_size": 4}, (2, 2, 5)  # 6 = 4 + a partial block of 2
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **attrs),
        helper.make_node("DequantizeLinear", ["q", "s2", "z2"], ["y"], **attrs),
    ]
    inputs = {"x": ("float32", shape), "s": ("float32", param_shape), "z": (dtype, param_shape)}
    inputs |= {"s2": ("float32", param_shape), "z2": (dtype, param_shape)}
    model = with_opset(model_of(nodes, inputs, ["q", "y"], {}), 21)
    feeds = {
        "x": (rng.standard_normal(shape) * 3).astype(np.float32),
        "s": scales(rng, param_shape),
        "z": random_ints(rng, dtype, param_shape),
        "s2": scales(rng, param_shape),
        "z2": random_ints(rng, dtype, param_shape),
    }
    feeds["x"].flat[:4] = feeds["s"].flat[0] * np.float32([0.5, 1.5, -2.5, 1e6])  # ties and saturation
    ops = assert_matches_onnxruntime(model, feeds)
    assert not ops["qnn.quantize"] and not ops["qnn.dequantize"], dict(ops)


def test_int32_dequantize_with_a_run_time_scale_is_computed_as_the_reference():
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("DequantizeLinear", ["x", "s", "z"], ["y"])]
    inputs = {"x": ("int32", (3, 7)), "s": ("float32", ()), "z": ("int32", ())}
    model = with_opset(model_of(nodes, inputs, ["y"], {}), 21)
    x = rng.integers(-(2**31), 2**31 - 1, (3, 7)).astype(np.int32)
    feeds = {"x": x, "s": np.array(0.0123, np.float32), "z": np.array(-123456789, np.int32)}
    graph = load_onnx(model.SerializeToString())
    expected = onnx.reference.ReferenceEvaluator(model).run(None, feeds)[0]
    np.testing.assert_array_equal(run_graph(graph, feeds)["y"], expected)


def test_constant_scale_and_zero_point_keep_the_qnn_operators():
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"]),
    ]
    inits = {"s": np.float32(0.02), "z": np.uint8(120)}
    model = model_of(nodes, {"x": ("float32", (2, 3))}, ["q", "y"], inits)
    ops = Counter(n.op for n in load_onnx(model.SerializeToString()).nodes)
    assert ops["qnn.quantize"] == 1 and ops["qnn.dequantize"] == 1, dict(ops)


def test_a_scale_computed_from_the_data_is_a_kernel_input():
    """DynamicQuantizeLinear's expansion: the scale and zero point derive from x, which stays an input."""
    nodes = [
        helper.make_node("ReduceMax", ["x"], ["hi"], keepdims=0),
        helper.make_node("Div", ["hi", "c"], ["s"]),
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
    ]
    inits = {"c": np.float32(127.0), "z": np.int8(0)}
    model = model_of(nodes, {"x": ("float32", (4, 5))}, ["q"], inits)
    rng = np.random.default_rng(0)
    assert_matches_onnxruntime(model, {"x": rng.standard_normal((4, 5)).astype(np.float32)})


# --- MatMulInteger / ConvInteger ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_matmul_integer_with_run_time_b_and_zero_points(dtype):
    rng = np.random.default_rng(4)
    nodes = [helper.make_node("MatMulInteger", ["a", "b", "za", "zb"], ["y"])]
    inputs = {"a": (dtype, (2, 3, 9)), "b": (dtype, (9, 4)), "za": (dtype, ()), "zb": (dtype, (4,))}
    model = model_of(nodes, inputs, ["y"], {})
    feeds = {k: random_ints(rng, d, s) for k, (d, s) in inputs.items()}
    ops = assert_matches_onnxruntime(model, feeds)
    assert ops["matmul"] == 1 and not ops["qnn.dense"], dict(ops)


def test_conv_integer_with_run_time_weight_and_zero_points():
    rng = np.random.default_rng(5)
    nodes = [
        helper.make_node("ConvInteger", ["x", "w", "zx", "zw"], ["y"], pads=[1, 0, 1, 2], strides=[2, 1])
    ]
    inputs = {"x": ("uint8", (1, 4, 7, 6)), "w": ("uint8", (6, 4, 3, 3))}
    inputs |= {"zx": ("uint8", ()), "zw": ("uint8", ())}
    model = model_of(nodes, inputs, ["y"], {})
    feeds = {k: random_ints(rng, d, s) for k, (d, s) in inputs.items()}
    ops = assert_matches_onnxruntime(model, feeds)
    assert ops["conv2d"] == 1 and not ops["qnn.conv2d_nhwc"], dict(ops)


# --- QLinearMatMul / QLinearConv ------------------------------------------------------------------------------


def qlinear_feeds(rng: np.random.Generator, inputs: dict) -> dict[str, np.ndarray]:
    return {k: scales(rng, s) if d == "float32" else random_ints(rng, d, s) for k, (d, s) in inputs.items()}


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_qlinear_matmul_with_every_parameter_at_run_time(dtype):
    rng = np.random.default_rng(6)
    names = ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"]
    nodes = [helper.make_node("QLinearMatMul", names, ["y"])]
    shapes = [(3, 16), (), (), (16, 5), (5,), (5,), (), ()]
    types = [dtype, "float32", dtype, dtype, "float32", dtype, "float32", dtype]
    inputs = {k: (d, s) for k, d, s in zip(names, types, shapes)}
    model = model_of(nodes, inputs, ["y"], {})
    feeds = qlinear_feeds(rng, inputs)
    feeds["sy"] = np.array(0.02, np.float32)  # outputs spread over the range rather than saturated
    ops = assert_matches_onnxruntime(model, feeds)
    assert not ops["qnn.dense"], dict(ops)


def test_qlinear_conv_with_every_parameter_at_run_time():
    rng = np.random.default_rng(7)
    names = ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy", "bias"]
    nodes = [helper.make_node("QLinearConv", names, ["y"], pads=[1, 1, 1, 1], group=2)]
    shapes = [(1, 4, 6, 6), (), (), (6, 2, 3, 3), (6,), (), (), (), (6,)]
    types = ["uint8", "float32", "uint8", "int8", "float32", "int8", "float32", "uint8", "int32"]
    inputs = {k: (d, s) for k, d, s in zip(names, types, shapes)}
    model = model_of(nodes, inputs, ["y"], {})
    feeds = qlinear_feeds(rng, inputs)
    feeds["sy"], feeds["bias"] = np.array(0.05, np.float32), rng.integers(-2000, 2000, 6).astype(np.int32)
    feeds["w"] = weight_ints(rng, "int8", (6, 2, 3, 3))  # exact in onnxruntime on every x86 class
    ops = assert_matches_onnxruntime(model, feeds)
    assert ops["conv2d"] == 1 and not ops["qnn.conv2d_nhwc"], dict(ops)


def test_constant_weights_and_parameters_keep_the_fused_kernels():
    rng = np.random.default_rng(8)
    nodes = [
        helper.make_node("QLinearConv", ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy"], ["c"]),
        helper.make_node("QLinearMatMul", ["a", "sx", "zx", "b", "sw", "zw", "sy", "zy"], ["m"]),
        helper.make_node("MatMulInteger", ["a", "b", "zx", "zw"], ["mi"]),
        helper.make_node("ConvInteger", ["x", "w", "zx", "zw"], ["ci"]),
    ]
    inits = {"sx": np.float32(0.02), "zx": np.uint8(128), "sw": np.float32(0.01), "zw": np.uint8(3)}
    inits |= {"sy": np.float32(0.1), "zy": np.uint8(100)}
    inits |= {"w": random_ints(rng, "uint8", (3, 2, 3, 3)), "b": random_ints(rng, "uint8", (8, 3))}
    model = model_of(
        nodes, {"x": ("uint8", (1, 2, 5, 5)), "a": ("uint8", (2, 8))}, ["c", "m", "mi", "ci"], inits
    )
    ops = Counter(n.op for n in load_onnx(model.SerializeToString()).nodes)
    assert ops["qnn.conv2d_nhwc"] == 2 and ops["qnn.dense"] == 2, dict(ops)
    assert not ops["conv2d"] and not ops["matmul"], dict(ops)


def test_run_time_parameters_compile_and_match_onnxruntime(tmp_path):
    """The general path through LLVM: Q/DQ per axis, QLinearConv and QLinearMatMul, all fed at run time."""
    nodes = [
        helper.make_node("QuantizeLinear", ["f", "sv", "zv"], ["q"], axis=1),
        helper.make_node("DequantizeLinear", ["q", "sv", "zv"], ["dq"], axis=1),
        helper.make_node(
            "QLinearConv", ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy"], ["c"], pads=[1, 1, 1, 1]
        ),
        helper.make_node("QLinearMatMul", ["a", "sx", "zx", "b", "sy", "zx", "sy", "zy"], ["m"]),
    ]
    inputs = {"f": ("float32", (2, 3, 4)), "sv": ("float32", (3,)), "zv": ("int8", (3,))}
    inputs |= {"x": ("uint8", (1, 3, 5, 5)), "w": ("uint8", (4, 3, 3, 3)), "a": ("uint8", (2, 6))}
    inputs |= {"b": ("uint8", (6, 3)), "sw": ("float32", (4,))}
    inputs |= {k: ("float32", ()) for k in ("sx", "sy")} | {k: ("uint8", ()) for k in ("zx", "zw", "zy")}
    model = model_of(nodes, inputs, ["q", "dq", "c", "m"], {})
    path = tmp_path / "runtime_quant.onnx"
    onnx.save(model, path)
    compiled = aotc.compile(str(path), output=tmp_path / "q.aotc", validate=False, log=lambda _: None).load()
    rng = np.random.default_rng(9)
    feeds = qlinear_feeds(rng, inputs)
    feeds["f"] = rng.standard_normal((2, 3, 4)).astype(np.float32)
    feeds["sy"] = np.array(0.2, np.float32)
    got, ref = compiled.run(feeds), onnxruntime_run(model, feeds)
    for name, value in ref.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
