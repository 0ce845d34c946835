"""ONNX operators of issue 19's coverage item: BitShift, GatherElements, ArgMax/ArgMin, Trilu, RMSNormalization,
LayerNormalization's Mean and InvStdDev outputs, NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss,
ReduceL1/L2/SumSquare/LogSumExp, Xor, CumSum, Hardmax, OneHot and LpNormalization, against onnxruntime (or ONNX's reference evaluator where
onnxruntime has no kernel for the opset), through the frontend and the graph interpreter and, once, compiled.

Integer and index results must be equal; float results within rtol 1e-4, atol 1e-5 (float16: rtol 1e-3,
atol 1e-3, about one float16 ulp at these magnitudes).
"""

from __future__ import annotations

import aotc_runtime
import numpy as np
import onnx
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

from aotc.frontend.errors import ConversionError
from aotc.frontend.onnx import load_onnx
from aotc.graph.interpret import run_graph

from .onnx_util import (
    Input,
    assert_outputs_match,
    built_package,
    case,
    make_graph_model,
    op_model,
    random_feeds,
    reference_outputs,
    run_onnxruntime,
)

TOL = {"float16": (1e-3, 1e-3)}
"""(rtol, atol) per dtype where not the default (1e-4, 1e-5); integers and bools compare exactly."""


def check(model: onnx.ModelProto, feeds: dict) -> None:
    assert_outputs_match(
        run_graph(load_onnx(model.SerializeToString()), feeds),
        model,
        reference_outputs(model, feeds),
        tol=TOL,
    )


def _indices(shape, extent, dtype="int64", seed=3):
    return np.random.default_rng(seed).integers(-extent, extent, shape).astype(dtype)


CASES = [
    case("GatherElements", [Input((3, 4)), _indices((2, 4), 3)], id="gather-elements-axis0-negative"),
    case("GatherElements", [Input((3, 4)), _indices((3, 2), 4, "int32")], axis=1, id="gather-elements-axis1"),
    case("GatherElements", [Input((2, 3, 4), "int64", -9, 9), _indices((2, 3, 5), 4)], axis=-1, id="gather-elements-int"),
    case("GatherElements", [Input((4,)), Input((6,), "int64", -4, 4)], id="gather-elements-run-time-indices"),
    case("ArgMax", [Input((3, 4, 5))], id="argmax"),
    case("ArgMax", [Input((3, 4, 5))], axis=-1, keepdims=0, id="argmax-last-no-keepdims"),
    case("ArgMin", [Input((3, 4, 5))], axis=1, id="argmin-axis1"),
    case("ArgMax", [Input((4, 6), "int32", 0, 3)], axis=1, id="argmax-ties-first"),
    case("ArgMax", [Input((4, 6), "int32", 0, 3)], axis=1, select_last_index=1, id="argmax-ties-last"),
    case("ArgMin", [Input((6, 4), "uint8", 0, 3)], axis=0, keepdims=0, select_last_index=1, id="argmin-ties-last"),
    case("ArgMax", [Input((5, 3), "float16")], opset=13, id="argmax-float16"),
    case("ArgMin", [Input((5, 3))], axis=1, opset=11, id="argmin-11"),
    case("Trilu", [Input((4, 5))], opset=14, id="triu"),
    case("Trilu", [Input((2, 4, 5)), np.array(1, np.int64)], upper=0, opset=14, id="tril-k1"),
    case("Trilu", [Input((5, 3), "int32", -9, 9), np.array(-2, np.int64)], opset=14, id="triu-k-2-int"),
    case("Trilu", [Input((3, 3), "bool"), np.array(7, np.int64)], upper=0, opset=14, id="tril-bool-beyond"),
    case("RMSNormalization", [Input((2, 3, 4)), Input((4,))], opset=23, id="rms-last"),
    case("RMSNormalization", [Input((2, 3, 4)), Input((3, 4))], axis=1, epsilon=1e-3, opset=23, id="rms-axis1"),
    case("RMSNormalization", [Input((2, 3)), Input((2, 3))], axis=0, opset=23, id="rms-axis0"),
    case("RMSNormalization", [Input((2, 8), "float16"), Input((8,), "float16")], opset=23, id="rms-float16"),
    case("LayerNormalization", [Input((2, 3, 4)), Input((4,)), Input((4,))], outputs=3, id="layer-norm-stats"),
    case("LayerNormalization", [Input((2, 3, 4)), Input((3, 4))], outputs=3, axis=1, id="layer-norm-stats-axis1"),
    case("LayerNormalization", [Input((3, 4)), Input((3, 4))], outputs=2, axis=0, id="layer-norm-mean-axis0"),
    case("NegativeLogLikelihoodLoss", [Input((3, 5)), np.array([0, 4, 2])], reduction="none", opset=13, id="nll-none"),
    case("NegativeLogLikelihoodLoss", [Input((3, 5)), np.array([0, 4, 2]), Input((5,), low=0.1)], reduction="sum", opset=13, id="nll-sum-weight"),
    case("NegativeLogLikelihoodLoss", [Input((2, 4, 3)), np.array([[0, 1, 3], [1, 2, 0]], np.int32)], opset=13, id="nll-mean-int32"),
    case("NegativeLogLikelihoodLoss", [Input((2, 4, 3)), np.array([[0, -1, 3], [-1, 2, 0]]), Input((4,), low=0.1)], ignore_index=-1, opset=22, id="nll-mean-weight-ii"),
    case("NegativeLogLikelihoodLoss", [Input((2, 4, 3)), np.array([[0, 4, 3], [4, 2, 0]])], ignore_index=4, opset=13, id="nll-mean-ii-beyond"),
    case("SoftmaxCrossEntropyLoss", [Input((3, 5)), np.array([1, 4, 0])], opset=13, id="sce-mean"),
    case("SoftmaxCrossEntropyLoss", [Input((2, 5, 2)), np.array([[1, 3], [0, 2]]), Input((5,), low=0.1)], outputs=2, reduction="none", ignore_index=3, opset=13, id="sce-none-weight-ii-log-prob"),
    case("SoftmaxCrossEntropyLoss", [Input((3, 5), "float64"), np.array([1, 4, 0])], reduction="sum", opset=12, id="sce-sum-float64"),
    case("ReduceL1", [Input((3, 4, 5))], axes=[1], opset=13, id="reduce-l1"),
    case("ReduceL1", [Input((3, 4), "int32", -9, 9), np.array([-1])], keepdims=0, opset=18, id="reduce-l1-int-18"),
    case("ReduceL2", [Input((3, 4, 5))], keepdims=0, opset=13, id="reduce-l2-all"),
    case("ReduceSumSquare", [Input((3, 4, 5)), np.array([0, 2])], opset=18, id="reduce-sum-square"),
    case("ReduceLogSumExp", [Input((3, 4, 5), low=-50, high=80)], axes=[2], keepdims=0, opset=13, id="reduce-log-sum-exp"),
    case("ReduceLogSumExp", [Input((2, 6), "float64"), np.array([1])], opset=28, id="reduce-log-sum-exp-28"),
    case("Xor", [Input((3, 4), "bool"), Input((4,), "bool")], id="xor-bcast"),
    case("CumSum", [Input((5,)), np.array(0)], id="cumsum"),
    case("CumSum", [Input((3, 4), "int32", -9, 9), np.array(-1, np.int32)], exclusive=1, reverse=1, opset=14, id="cumsum-int-exclusive-reverse"),
    case("CumSum", [Input((3, 4, 2), "float64"), np.array(1)], reverse=1, id="cumsum-reverse"),
    case("Hardmax", [Input((3, 4, 5))], opset=13, id="hardmax"),
    case("Hardmax", [Input((3, 4, 5))], axis=0, opset=13, id="hardmax-axis0"),
    case("Hardmax", [Input((3, 4, 5))], opset=11, id="hardmax-11-2d"),
    case("Hardmax", [Input((3, 4), "float16")], axis=-1, opset=11, id="hardmax-11-last"),
    case("OneHot", [Input((2, 3), "int64", -5, 7), np.array(5), np.array([0.5, 3.0], np.float32)], opset=11, id="one-hot"),
    case("OneHot", [Input((4,), "int64", 0, 3), np.array([3]), Input((2,))], axis=0, opset=11, id="one-hot-axis0-run-time-values"),
    case("OneHot", [Input((2, 2), "float32", -3, 3), np.array(3), np.array([0, 1])], axis=1, opset=28, id="one-hot-float-indices"),
    case("LpNormalization", [Input((3, 4))], id="lp-norm-l2"),
    case("LpNormalization", [Input((3, 4, 2))], axis=1, p=1, opset=22, id="lp-norm-l1"),
    case("LpNormalization", [np.array([[0.0, 0.0], [3.0, 4.0]], np.float32)], axis=1, id="lp-norm-zero-norm"),
]  # fmt: skip


@pytest.mark.parametrize("op_type, operands, kw", CASES)
def test_operator_matches_the_reference(op_type, operands, kw):
    check(*op_model(op_type, operands, **kw))


def _shift_feeds(dtype: str) -> dict:
    """Every shift amount from -2 to the width + 1 against small, extreme and (signed) negative values."""
    info = np.iinfo(dtype)
    chosen = {0, 1, 3, 5, int(info.max), int(info.max) // 3, int(info.min), int(info.min) + 1, -1, -7}
    values = np.array(sorted(v for v in chosen if info.min <= v <= info.max), dtype)
    amounts = np.arange(-2 if info.min else 0, info.bits + 2).astype(dtype)
    x, y = np.meshgrid(values, amounts, indexing="ij")
    return {"x0": np.ascontiguousarray(x), "x1": np.ascontiguousarray(y)}


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64"])
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bitshift_matches_the_reference_on_extreme_values_and_every_shift(dtype, direction):
    """BitShift-28 (the reference evaluator: onnxruntime defines no signed kernel): negative shifts and shifts
    of the width or more give the sign fill; a signed left shift drops what passes the sign bit."""
    feeds = _shift_feeds(dtype)
    shape = feeds["x0"].shape
    model, _ = op_model("BitShift", [Input(shape, dtype), Input(shape, dtype)], opset=28, direction=direction)
    check(model, feeds)


def test_bitshift_11_matches_onnxruntime_with_broadcasting():
    model, feeds = op_model("BitShift", [Input((3, 4), "uint32", 0, 1000), Input((4,), "uint32", 0, 31)], opset=11, direction="RIGHT")  # fmt: skip
    assert_outputs_match(
        run_graph(load_onnx(model.SerializeToString()), feeds), model, run_onnxruntime(model, feeds), tol=TOL
    )


@pytest.mark.parametrize(
    "op_type, operands, kw, message",
    [
        ("BitShift", [Input((3,)), Input((3,))], {"direction": "LEFT", "opset": 28}, r"input 0 \(X, value x0\) is tensor\(float\), which type constraint T of BitShift-28 \(opset 28\) does not allow"),
        ("BitShift", [Input((3,), "int32"), Input((3,), "int32")], {"direction": "UP", "opset": 28}, r"direction must be LEFT or RIGHT"),
        ("ArgMax", [Input((3,), "bool")], {}, r"node argmax_node \(ArgMax\): input 0 \(data, value x0\) is tensor\(bool\), which type constraint T of ArgMax-13"),
        ("GatherElements", [Input((3, 4)), np.zeros((3,), np.int64)], {}, r"indices int64\[3\] must have the rank of data"),
        ("Trilu", [Input((4,))], {"opset": 14}, r"Trilu needs an input of rank 2 or more, got float32\[4\]"),
        ("RMSNormalization", [Input((2, 3)), Input((3,))], {"stash_type": 0, "opset": 23}, r"stash_type=0 is not supported"),
        ("RMSNormalization", [Input((2, 3)), Input((3,), "float64")], {"opset": 23}, r"a scale of type float64 for an input of type float32"),
        ("ReduceL2", [Input((2, 3), "int32")], {"opset": 13}, r"ReduceL2 is computed on float tensors here, got int32"),
        ("ReduceL1", [Input((2, 3)), np.zeros(0, np.int64)], {"noop_with_empty_axes": 1, "opset": 18}, r"noop_with_empty_axes with no axes is not supported"),
        ("NegativeLogLikelihoodLoss", [Input((2, 3)), np.array([0, 1])], {"reduction": "max", "opset": 13}, r"reduction must be one of none, sum, mean, got 'max'"),
        ("NegativeLogLikelihoodLoss", [Input((2, 3)), np.array([0, 1, 2])], {"opset": 13}, r"a target int64\[3\] for an input float32\[2, 3\]"),
    ],
)  # fmt: skip
def test_what_the_operators_do_not_define_is_refused_naming_node_and_reason(op_type, operands, kw, message):
    model, _ = op_model(op_type, operands, **kw)
    with pytest.raises(ConversionError, match=message):
        load_onnx(model.SerializeToString())


@pytest.mark.parametrize("upper", [0, 1])
def test_trilu_k_fed_at_run_time_is_a_kernel_input(upper):
    model, feeds = op_model("Trilu", [Input((2, 3, 5)), Input((), "int64")], opset=14, upper=upper)
    graph = load_onnx(model.SerializeToString())  # one build serves every k
    for k in (-4, -1, 0, 2, 6):
        feeds["x1"] = np.array(k, np.int64)
        assert_outputs_match(run_graph(graph, feeds), model, reference_outputs(model, feeds), tol=TOL)


def test_a_quantized_weight_fed_at_run_time_is_a_kernel_input_and_constants_still_fix_it():
    nodes = [helper.make_node("MatMulInteger", ["a", "b"], ["y"], name="mmi")]
    model = make_graph_model(nodes, {"a": Input((2, 3), "uint8"), "b": Input((3, 4), "uint8")}, ["y"])
    b = np.arange(12, dtype=np.uint8).reshape(3, 4)
    a = np.arange(6, dtype=np.uint8).reshape(2, 3)
    expected = a.astype(np.int32) @ b.astype(np.int32)
    got = run_graph(load_onnx(model.SerializeToString()), {"a": a, "b": b})["y"]
    np.testing.assert_array_equal(got, expected)
    got = run_graph(load_onnx(model.SerializeToString(), constants={"b": b}), {"a": a})["y"]
    np.testing.assert_array_equal(got, expected)


def test_the_new_operators_compile_and_match_onnxruntime(tmp_path):
    """One package of them all (int8 shifts both ways, GatherElements, ArgMax with ties, Trilu, RMS and layer
    normalization with its statistics), run with aotc_runtime."""
    nodes = [
        helper.make_node("BitShift", ["s", "t"], ["left"], direction="LEFT"),
        helper.make_node("BitShift", ["s", "t"], ["right"], direction="RIGHT"),
        helper.make_node("GatherElements", ["x", "idx"], ["gathered"], axis=1),
        helper.make_node("ArgMax", ["q"], ["arg"], axis=1, select_last_index=1, keepdims=0),
        helper.make_node("ArgMin", ["x"], ["argmin"], axis=0),
        helper.make_node("Trilu", ["x", "k"], ["tri"], upper=0),
        helper.make_node("RMSNormalization", ["x", "g"], ["rms"], axis=1),
        helper.make_node("LayerNormalization", ["x", "g"], ["ln", "mean", "inv"], axis=-1),
    ]
    shifts = _shift_feeds("int8")
    inputs = {
        "s": Input(shifts["x0"].shape, "int8"),
        "t": Input(shifts["x1"].shape, "int8"),
        "x": Input((6, 16)),
        "q": Input((6, 16), "int32", 0, 4),
    }
    inits = {
        "idx": _indices((6, 5), 16),
        "k": np.array(-1, np.int64),
        "g": np.linspace(0.5, 2, 16, dtype=np.float32),
    }
    outputs = ["left", "right", "gathered", "arg", "argmin", "tri", "rms", "ln", "mean", "inv"]
    model = make_graph_model(nodes, inputs, outputs, inits, opset=28)
    feeds = random_feeds(model, inputs)
    feeds["s"], feeds["t"] = shifts["x0"], shifts["x1"]
    shapes = {k: list(v.shape) for k, v in feeds.items()}
    got = aotc_runtime.load(str(built_package(model, tmp_path, inputs=shapes))).run(feeds)
    assert_outputs_match(got, model, ReferenceEvaluator(model).run(None, feeds), tol=TOL)


def test_empty_axes_fed_at_run_time_are_known_and_reduce_every_axis():
    """An input of zero size has one value (nothing), so axes fed at run time as one are known at compile
    time (empty axes: all of them); read as a tensor it gives an empty result, a constant."""
    nodes = [helper.make_node("ReduceL2", ["x", "axes"], ["y"], name="l2", keepdims=0)]
    model = make_graph_model(nodes, {"x": Input((2, 3)), "axes": Input((0,), "int64")}, ["y"], opset=18)
    graph = load_onnx(model.SerializeToString())
    assert [v.name for v in graph.inputs] == ["x", "axes"]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = run_graph(graph, {"x": x, "axes": np.zeros(0, np.int64)})
    np.testing.assert_allclose(got["y"], np.sqrt((x * x).sum()), rtol=1e-6)
    relu = make_graph_model([helper.make_node("Relu", ["x"], ["y"])], {"x": Input((1, 0, 4))}, ["y"])
    (y,) = load_onnx(relu.SerializeToString()).outputs
    assert y.is_constant and str(y.type) == "float32[1, 0, 4]"


def test_an_empty_slice_of_a_shape_folds_and_concat_drops_it():
    """As the _expanded LayerNormalization bodies do with axis 0: Shape, an empty Slice of it, Concat."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Slice", ["s", "zero", "zero"], ["none"]),
        helper.make_node("Concat", ["none", "six"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    inits = {"zero": np.array([0]), "six": np.array([6])}
    model = make_graph_model(nodes, {"x": Input((2, 3))}, ["y"], inits, opset=13)
    check(model, random_feeds(model))
