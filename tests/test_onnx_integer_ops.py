"""ONNX integer operators on the qnn kernels, against onnxruntime running the same model: ConvInteger and
MatMulInteger (int32 results, exact), and the com.microsoft operators of onnxruntime's QOperator format,
QLinearAdd, QGemm and QLinearGlobalAveragePool (0 LSB). Every model is built here with onnx.helper from
seeded random values. ConvInteger with per-channel weight zero points, which onnxruntime refuses, is
checked against the ONNX reference evaluator instead.
"""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import aotc
from aotc.frontend.errors import ConversionError
from aotc.frontend.onnx import load_onnx
from aotc.graph.interpret import evaluate_node, run_graph
from aotc.graph.ir import Node, TensorType, Value
from aotc.te import TEError
from recipes.zoo import onnx_models as zoo

from .onnx_util import IR_VERSION, weight_ints

DTYPES = ("uint8", "int8")
FLOAT_OPS = {"conv2d", "dense", "matmul", "add", "reduce_mean", "relu", "clip"}


def model_of(
    nodes: list[onnx.NodeProto],
    inputs: dict[str, tuple[str, tuple[int, ...]]],
    outputs: list[str],
    inits: dict[str, np.ndarray],
) -> onnx.ModelProto:
    """A model of `nodes` (the default domain, opset 17, and com.microsoft) with runtime `inputs`
    (name -> (dtype, shape)) and constants `inits`."""
    graph = helper.make_graph(
        nodes,
        "integer_ops",
        [
            helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(np.dtype(d)), list(s))
            for k, (d, s) in inputs.items()
        ],
        [helper.make_empty_tensor_value_info(o) for o in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)


def random_ints(rng: np.random.Generator, dtype: str, shape) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)


def scalar(value, dtype: str) -> np.ndarray:
    return np.array(value, dtype)


def feeds_for(model: onnx.ModelProto, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in model.graph.input:
        dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        feeds[vi.name] = (
            rng.standard_normal(shape).astype(dtype)
            if dtype == np.float32
            else random_ints(rng, dtype.name, shape)
        )
    return feeds


def onnxruntime_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def assert_exact(model: onnx.ModelProto, seeds=range(3), reference=onnxruntime_run) -> Counter:
    """aotc's import of `model` (the numpy evaluator) equals `reference` bit for bit on seeded inputs; the
    imported graph's operator counts."""
    graph = load_onnx(model.SerializeToString())
    for seed in seeds:
        feeds = feeds_for(model, seed)
        got, ref = run_graph(graph, feeds), reference(model, feeds)
        for name, value in ref.items():
            assert got[name].dtype == value.dtype, f"{name}: {got[name].dtype}, expected {value.dtype}"
            differ = np.count_nonzero(got[name] != value)
            assert differ == 0, f"{name} (seed {seed}): {differ} of {value.size} values differ"
    return Counter(n.op for n in graph.nodes)


# --- ConvInteger ----------------------------------------------------------------------------------------------


def conv_integer_model(
    x_dtype: str, w_dtype: str, group: int, w_zero, x_zero=None, seed: int = 0, **attrs
) -> onnx.ModelProto:
    """x [2, 4, 7, 6] -> ConvInteger(w [8, 4 / group, 3, 3], zero points) -> y int32."""
    rng = np.random.default_rng(seed)
    inits = {"w": weight_ints(rng, w_dtype, (8, 4 // group, 3, 3))}
    names = ["x", "w"]
    if x_zero is not None:
        inits["x_zero"] = scalar(x_zero, x_dtype)
        names.append("x_zero")
    if w_zero is not None:
        inits["w_zero"] = np.asarray(w_zero, w_dtype)
        names += ["w_zero"] if x_zero is not None else ["", "w_zero"]
    node = helper.make_node("ConvInteger", names, ["y"], name="conv_integer", group=group, **attrs)
    return model_of([node], {"x": (x_dtype, (2, 4, 7, 6))}, ["y"], inits)


@pytest.mark.parametrize("x_dtype, w_dtype", list(itertools.product(DTYPES, DTYPES)))
@pytest.mark.parametrize(
    "group, attrs",
    [
        (1, {"pads": [1, 0, 2, 1], "strides": [2, 1]}),
        (2, {"auto_pad": "SAME_UPPER", "strides": [1, 2]}),
        (4, {"pads": [2, 1, 2, 1], "dilations": [2, 1]}),  # depthwise, multiplier 2
    ],
    ids=["padded_strided", "grouped_same_upper", "depthwise_dilated"],
)
def test_conv_integer_equals_onnxruntime(x_dtype, w_dtype, group, attrs):
    """Nonzero zero points on both sides; padding reads x_zero_point (padded taps add 0)."""
    model = conv_integer_model(
        x_dtype, w_dtype, group, w_zero=-5 if w_dtype == "int8" else 131, x_zero=7, **attrs
    )
    ops = assert_exact(model)
    assert ops["qnn.depthwise_conv2d_nhwc" if group == 4 else "qnn.conv2d_nhwc"] == 1, dict(ops)
    assert not FLOAT_OPS & set(ops), dict(ops)


@pytest.mark.parametrize("x_zero, w_zero", [(None, None), (None, 3), (200, None)])
def test_conv_integer_optional_zero_points_equal_onnxruntime(x_zero, w_zero):
    assert_exact(conv_integer_model("uint8", "uint8", 1, w_zero=w_zero, x_zero=x_zero, pads=[1, 1, 1, 1]))


def reference_evaluator_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return dict(zip([o.name for o in model.graph.output], ReferenceEvaluator(model).run(None, feeds)))


@pytest.mark.parametrize("w_dtype", DTYPES)
def test_conv_integer_per_channel_weight_zero_points_are_re_encoded_exactly(w_dtype):
    """One w_zero_point per output channel (onnxruntime's ConvInteger refuses them: the ONNX reference
    evaluator is the oracle): the constant weight is re-encoded with one zero point, exactly."""
    rng = np.random.default_rng(4)
    zeros = rng.integers(-20, 20, 8) + (0 if w_dtype == "int8" else 128)
    model = conv_integer_model("uint8", w_dtype, 1, w_zero=zeros, x_zero=9, pads=[1, 1, 1, 1])
    w = numpy_helper.to_array(model.graph.initializer[0]).astype(np.int32)
    info = np.iinfo(w_dtype)  # keep w - w_zero_point within one 8-bit range: re-encodable
    w = np.clip(w, info.min + 20, int(info.max) - 20).astype(w_dtype)
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(w, "w"))
    ops = assert_exact(model, reference=reference_evaluator_run)
    assert ops["qnn.conv2d_nhwc"] == 1, dict(ops)


# --- MatMulInteger -------------------------------------------------------------------------------------------


def matmul_integer_model(
    a_dtype: str, b_dtype: str, a_shape, b_zero, a_zero=5, seed: int = 1
) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits = {"b": weight_ints(rng, b_dtype, (a_shape[-1], 6)), "a_zero": scalar(a_zero, a_dtype)}
    inits["b_zero"] = np.asarray(b_zero, b_dtype)
    node = helper.make_node("MatMulInteger", ["a", "b", "a_zero", "b_zero"], ["y"], name="matmul_integer")
    return model_of([node], {"a": (a_dtype, a_shape)}, ["y"], inits)


@pytest.mark.parametrize("a_dtype, b_dtype", list(itertools.product(DTYPES, DTYPES)))
@pytest.mark.parametrize("per_column", [False, True], ids=["per_tensor", "per_column"])
def test_matmul_integer_equals_onnxruntime(a_dtype, b_dtype, per_column):
    """A [2, 3, 20] (rank 3), constant B [20, 6]; b_zero_point per tensor or per column (differing)."""
    base = 0 if b_dtype == "int8" else 128
    b_zero = np.array([base - 7, base + 3, base, base + 11, base - 2, base + 1]) if per_column else base - 9
    model = matmul_integer_model(a_dtype, b_dtype, (2, 3, 20), b_zero)
    if per_column:  # keep b - b_zero_point within one 8-bit range: re-encodable
        b = numpy_helper.to_array(model.graph.initializer[0])
        info = np.iinfo(b_dtype)
        b = np.clip(b.astype(np.int32), info.min + 11, int(info.max) - 11).astype(b_dtype)
        model.graph.initializer[0].CopyFrom(numpy_helper.from_array(b, "b"))
    ops = assert_exact(model)
    assert ops["qnn.dense"] == 1 and not FLOAT_OPS & set(ops), dict(ops)


@pytest.mark.parametrize("op_type", ["QLinearConv", "QLinearMatMul"])
def test_qlinear_ops_with_differing_per_channel_weight_zero_points_equal_onnxruntime(op_type):
    """QLinearConv / QLinearMatMul whose per-channel weight zero points differ (they were refused before
    weights were re-encoded with one zero point): 0 LSB."""
    rng = np.random.default_rng(9)
    conv = op_type == "QLinearConv"
    inits = {
        "x_scale": np.float32(0.05),
        "x_zero": scalar(100, "uint8"),
        "w": weight_ints(rng, "int8", (5, 3, 3, 3) if conv else (8, 5)),
        "w_scale": rng.uniform(0.01, 0.02, 5).astype(np.float32),
        "w_zero": np.array([1, -2, 3, 0, 5], np.int8),
        "y_scale": np.float32(0.3 if conv else 0.15),
        "y_zero": scalar(128, "uint8"),
    }
    attrs = {"pads": [1, 1, 1, 1]} if conv else {}
    node = helper.make_node(op_type, ["x", *inits], ["y"], name=op_type.lower(), **attrs)
    inputs = {"x": ("uint8", (2, 3, 5, 5) if conv else (4, 8))}
    ops = assert_exact(model_of([node], inputs, ["y"], inits))
    assert ops["qnn.conv2d_nhwc" if conv else "qnn.dense"] == 1, dict(ops)


# --- com.microsoft: QLinearAdd, QGemm, QLinearGlobalAveragePool ---------------------------------------------------


def ms_node(op_type: str, inputs: list[str], outputs: list[str], **attrs) -> onnx.NodeProto:
    return helper.make_node(op_type, inputs, outputs, name=op_type.lower(), domain="com.microsoft", **attrs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b_shape", [(2, 5, 4, 3), (5, 1, 1), (3,)], ids=["same", "channel", "last"])
def test_qlinear_add_equals_onnxruntime(dtype, b_shape):
    """A [2, 5, 4, 3] + B (broadcast), nonzero zero points, scales whose ratios round: 0 LSB."""
    rng = np.random.default_rng(7)
    zero = 0 if dtype == "int8" else 128
    inits = {
        "a_scale": np.float32(0.037),
        "a_zero": scalar(zero - 11, dtype),
        "b_scale": np.float32(0.052),
        "b_zero": scalar(zero + 6, dtype),
        "c_scale": np.float32(0.061),
        "c_zero": scalar(zero + 3, dtype),
    }
    inputs = {"a": (dtype, (2, 5, 4, 3))}
    if b_shape == (3,):
        inits["b"] = random_ints(rng, dtype, b_shape)  # a constant operand, as a quantized bias
    else:
        inputs["b"] = (dtype, b_shape)
    node = ms_node(
        "QLinearAdd", ["a", "a_scale", "a_zero", "b", "b_scale", "b_zero", "c_scale", "c_zero"], ["c"]
    )
    ops = assert_exact(model_of([node], inputs, ["c"], inits))
    assert ops == {"qnn.add": 1}, dict(ops)


def qgemm_model(
    dtype: str, per_column: bool, quantized_out: bool, trans_a: int, trans_b: int, alpha: float, bias: bool
) -> onnx.ModelProto:
    """QGemm of A [4, 12] (or its transpose) and a constant B [12, 5] (or [5, 12]), int8 B (uint8 too
    with a uint8 A, where onnxruntime allows it), per-column b scales and zero points."""
    rng = np.random.default_rng(11)
    m, k, n = 4, 12, 5
    b_dtype = "int8" if dtype == "int8" or per_column else "uint8"
    b_base = 0 if b_dtype == "int8" else 128
    b = weight_ints(rng, b_dtype, (n, k) if trans_b else (k, n))
    zero = 0 if dtype == "int8" else 128
    inits = {
        "a_scale": np.float32(0.021),
        "a_zero": scalar(zero - 13, dtype),
        "b": b,
        "b_scale": rng.uniform(0.003, 0.02, n).astype(np.float32) if per_column else np.float32(0.0125),
        "b_zero": np.array([b_base - 3, b_base + 2, b_base, b_base + 5, b_base - 1], b_dtype)
        if per_column
        else scalar(b_base + 4, b_dtype),
        "c": rng.integers(-3000, 3000, n).astype(np.int32),
        "y_scale": np.float32(0.17),
        "y_zero": scalar(zero + 9, dtype),
    }
    names = ["a", "a_scale", "a_zero", "b", "b_scale", "b_zero", "c" if bias else ""]
    names += ["y_scale", "y_zero"] if quantized_out else []
    attrs = {"transA": trans_a, "transB": trans_b, "alpha": alpha}
    node = ms_node("QGemm", names, ["y"], **attrs)
    inputs = {"a": (dtype, (k, m) if trans_a else (m, k))}
    return model_of([node], inputs, ["y"], {k_: v for k_, v in inits.items() if k_ in names})


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "per_column, quantized_out, trans_a, trans_b, alpha, bias",
    [
        (False, True, 0, 1, 1.0, True),  # what quantize_static writes
        (True, True, 0, 0, 1.0, True),
        (True, True, 1, 1, 0.75, False),
        (False, False, 0, 1, 1.0, True),  # float output
        (True, False, 1, 0, 1.5, True),
    ],
    ids=["tensor", "column", "column_transA_alpha", "float_out", "float_out_column_alpha"],
)
def test_qgemm_equals_onnxruntime(dtype, per_column, quantized_out, trans_a, trans_b, alpha, bias):
    """Nonzero zero points, per-column b scales and (differing) zero points, alpha folded into a_scale as
    onnxruntime multiplies it; the quantized output 0 LSB, the float output bit for bit."""
    ops = assert_exact(qgemm_model(dtype, per_column, quantized_out, trans_a, trans_b, alpha, bias))
    assert ops["qnn.dense"] == 1 and not FLOAT_OPS & set(ops), dict(ops)
    if not quantized_out:
        assert ops["cast"] == 1 and ops["multiply"] == 1, dict(ops)


def qlinear_global_average_pool_model(dtype: str, channels_last: int, shape) -> onnx.ModelProto:
    zero = 0 if dtype == "int8" else 128
    inits = {
        "x_scale": np.float32(0.043),
        "x_zero": scalar(zero + 17, dtype),
        "y_scale": np.float32(0.011),
        "y_zero": scalar(zero - 4, dtype),
    }
    node = ms_node("QLinearGlobalAveragePool", ["x", *inits], ["y"], channels_last=channels_last)
    return model_of([node], {"x": (dtype, shape)}, ["y"], inits)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "channels_last, shape", [(0, (2, 6, 5, 7)), (1, (2, 5, 7, 6)), (0, (1, 3, 9))], ids=["nchw", "nhwc", "1d"]
)
def test_qlinear_global_average_pool_equals_onnxruntime(dtype, channels_last, shape):
    """The int32 sum times x_scale / (y_scale * count) in float32, rounded half to even (onnxruntime's x86
    kernel; its Arm kernel rounds in fixed point)."""
    ops = assert_exact(qlinear_global_average_pool_model(dtype, channels_last, shape))
    assert ops == {"qnn.mean": 1}, dict(ops)


def test_qlinear_global_average_pool_after_qlinear_conv_reads_its_nhwc_twin():
    """QLinearConv -> QLinearGlobalAveragePool: the pool reduces the convolution's NHWC result, so the
    only transposes are the model's entry and exit."""
    rng = np.random.default_rng(8)
    inits = {
        "x_scale": np.float32(0.05),
        "x_zero": scalar(-3, "int8"),
        "w": random_ints(rng, "int8", (6, 3, 3, 3)),
        "w_scale": rng.uniform(0.01, 0.02, 6).astype(np.float32),
        "w_zero": np.zeros(6, np.int8),
        "c_scale": np.float32(0.2),
        "c_zero": scalar(4, "int8"),
        "y_scale": np.float32(0.03),
        "y_zero": scalar(-7, "int8"),
    }
    conv_inputs = ["x", "x_scale", "x_zero", "w", "w_scale", "w_zero", "c_scale", "c_zero"]
    nodes = [
        helper.make_node("QLinearConv", conv_inputs, ["c"], name="conv", pads=[1, 1, 1, 1]),
        ms_node("QLinearGlobalAveragePool", ["c", "c_scale", "c_zero", "y_scale", "y_zero"], ["y"]),
    ]
    ops = assert_exact(model_of(nodes, {"x": ("int8", (1, 3, 6, 6))}, ["y"], inits))
    assert ops == {"transpose": 2, "qnn.conv2d_nhwc": 1, "qnn.mean": 1}, dict(ops)


# --- models quantize_static writes in the QOperator format ------------------------------------------------------


def quantized_output(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with its last DequantizeLinear's quantized input a second graph output."""
    last_dq = next(n for n in model.graph.node if model.graph.output[0].name in n.output)
    model.graph.output.append(helper.make_empty_tensor_value_info(last_dq.input[0]))
    return model


@pytest.mark.parametrize(
    "name, per_channel, activations",
    list(itertools.product(("residual_block", "dense_head"), (False, True), DTYPES)),
)
def test_qoperator_models_equal_onnxruntime(tmp_path, name, per_channel, activations):
    """QLinearConv, QLinearMatMul, QLinearAdd (after convolutions: in NHWC, no transposes between them) and
    QGemm as quantize_static writes them: the quantized output 0 LSB, the dequantized one bit for bit."""
    path = zoo.quantize(
        getattr(zoo, name)(), tmp_path / f"{name}.onnx", per_channel, activations, "QOperator"
    )
    model = quantized_output(onnx.load(path))
    kinds = {(n.domain, n.op_type) for n in model.graph.node}
    assert ("com.microsoft", "QLinearAdd") in kinds, kinds
    ops = assert_exact(model, seeds=range(4))
    assert not FLOAT_OPS & set(ops), dict(ops)
    if name == "residual_block":
        assert ops["qnn.add"] == 1 and ops["transpose"] == 2, dict(ops)  # the model's entry and exit
    else:
        assert ops["qnn.dense"] == 2 and ops["qnn.add"] == 1, dict(ops)


def test_compiled_package_equals_onnxruntime(tmp_path):
    """ConvInteger and MatMulInteger (int32 out of the kernel, the input zero point folded into a bias at
    build time), QGemm with a float output and QLinearGlobalAveragePool, compiled: equal to the graph and
    to onnxruntime."""
    rng = np.random.default_rng(3)
    inits = {
        "w": weight_ints(rng, "int8", (6, 4, 3, 3)),
        "x_zero": scalar(3, "uint8"),
        "w_zero": scalar(0, "int8"),
        "b": weight_ints(rng, "int8", (20, 7)),
        "a_zero": scalar(250, "uint8"),
        "b_zero": scalar(-2, "int8"),
        "x_scale": np.float32(0.05),
        "x_zero_q": scalar(131, "uint8"),
        "g": weight_ints(rng, "int8", (7, 5)),
        "g_scale": np.float32(0.02),
        "g_zero": scalar(0, "int8"),
        "g_bias": rng.integers(-500, 500, 7).astype(np.int32),
        "y_scale": np.float32(0.01),
        "y_zero": scalar(120, "uint8"),
    }
    nodes = [
        helper.make_node("ConvInteger", ["x", "w", "x_zero", "w_zero"], ["conv"], pads=[1, 1, 1, 1]),
        helper.make_node("MatMulInteger", ["a", "b", "a_zero", "b_zero"], ["mm"]),
        ms_node(
            "QGemm", ["q", "x_scale", "x_zero_q", "g", "g_scale", "g_zero", "g_bias"], ["gemm"], transB=1
        ),
        ms_node("QLinearGlobalAveragePool", ["p", "x_scale", "x_zero_q", "y_scale", "y_zero"], ["pool"]),
    ]
    inputs = {
        "x": ("uint8", (1, 4, 6, 6)),
        "a": ("uint8", (3, 20)),
        "q": ("uint8", (2, 5)),
        "p": ("uint8", (1, 8, 5, 5)),
    }
    model = model_of(nodes, inputs, ["conv", "mm", "gemm", "pool"], inits)
    path = tmp_path / "integer_ops.onnx"
    onnx.save(model, path)
    graph = load_onnx(str(path))
    package = aotc.compile(
        str(path), output=tmp_path / "integer_ops.aotc", validate=False, log=lambda _: None
    )
    compiled = package.load()
    for seed in range(2):
        feeds = feeds_for(model, seed)
        got, expected, ref = compiled.run(feeds), run_graph(graph, feeds), onnxruntime_run(model, feeds)
        for name in ref:
            np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
            np.testing.assert_array_equal(got[name], ref[name], err_msg=name)


# --- the int32 output of the qnn kernels ---------------------------------------------------------------------


def test_qnn_conv_and_dense_int32_output_add_the_bias_and_refuse_an_activation():
    rng = np.random.default_rng(2)
    x = random_ints(rng, "int8", (1, 5, 5, 3))
    w = random_ints(rng, "int8", (4, 3, 3, 3))
    bias = rng.integers(-1000, 1000, 4).astype(np.int32)
    attrs = {"strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1), "input_zero_point": -3}
    attrs |= {"weight_zero_points": (2,), "out_dtype": "int32"}

    def node(op: str, values: list[np.ndarray], node_attrs: dict) -> Node:
        ins = [Value(f"v{i}", TensorType(v.shape, str(v.dtype))) for i, v in enumerate(values)]
        return Node(op, ins, [], node_attrs, name=op)

    (y,) = evaluate_node(node("qnn.conv2d_nhwc", [x, w, bias], attrs), [x, w, bias])
    xp = np.pad(x.astype(np.int64) + 3, ((0, 0), (1, 1), (1, 1), (0, 0)))
    wc = w.astype(np.int64) - 2
    expected = np.array(
        [
            [
                [[(xp[0, i : i + 3, j : j + 3, :] * wc[o]).sum() for o in range(4)] for j in range(5)]
                for i in range(5)
            ]
        ]
    )
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, expected + bias)

    flat, dense_w = x.reshape(5, 15), random_ints(rng, "int8", (4, 15))
    (d,) = evaluate_node(node("qnn.dense", [flat, dense_w, bias], attrs), [flat, dense_w, bias])
    np.testing.assert_array_equal(d, (flat.astype(np.int64) + 3) @ (dense_w.astype(np.int64) - 2).T + bias)

    with pytest.raises(TEError, match="int32 has no fused activation"):
        evaluate_node(node("qnn.dense", [flat, dense_w], attrs | {"activation": "RELU"}), [flat, dense_w])


# --- bad input ------------------------------------------------------------------------------------------------


def test_bad_integer_operator_inputs_are_errors_naming_node_and_input():
    # (run-time weights are kernel inputs: tests/test_onnx_quant_runtime.py)
    int16 = model_of(
        [helper.make_node("ConvInteger", ["x", "w"], ["y"], name="conv_int16")],
        {"x": ("int16", (1, 2, 4, 4))},
        ["y"],
        {"w": np.ones((3, 2, 1, 1), np.uint8)},
    )
    # refused by the schema check (ConvInteger-10's T1 is int8 or uint8) before the converter sees it
    with pytest.raises(
        ConversionError, match=r"conv_int16 \(ConvInteger\): input 0 \(x, value x\) is tensor\(int16\), which"
    ):
        load_onnx(int16.SerializeToString())

    wide = conv_integer_model("uint8", "uint8", 1, w_zero=np.array([0, 255] * 4, np.uint8))
    with pytest.raises(ConversionError, match=r"conv_integer \(ConvInteger\): w_zero_point: the per-channel"):
        load_onnx(wide.SerializeToString())

    per_row = matmul_integer_model("uint8", "uint8", (2, 8), b_zero=3, a_zero=np.array([1, 2], np.uint8))
    with pytest.raises(
        ConversionError, match=r"matmul_integer \(MatMulInteger\): a_zero_point has shape \[2\]"
    ):
        load_onnx(per_row.SerializeToString())

    model = qgemm_model("uint8", False, True, 0, 1, 1.0, True)
    model.graph.node[0].input[8] = ""  # y_scale without y_zero_point
    with pytest.raises(ConversionError, match=r"qgemm \(QGemm\): y_scale and y_zero_point"):
        load_onnx(model.SerializeToString())
