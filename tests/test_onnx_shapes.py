"""Zero-size tensors and 3-D windows (issue 19), against onnxruntime.

A tensor with no elements has one value (nothing): the frontend folds every graph op that reads one into a
constant (empty, or a reduction's identity over an empty set), so no kernel sees a zero extent; a package
still takes and returns such tensors with their shapes and dtypes. 3-D pooling and (transposed)
convolutions are graph ops of their own.

Tolerances: integer and bool results equal; float32 rtol 1e-4, atol 1e-5 (a 3-D window sums up to 54
products: float32 rounding stays well inside).
"""

from __future__ import annotations

import shutil

import aotc_runtime
import numpy as np
import onnx
import pytest
from onnx import helper

from aotc.frontend.errors import ConversionError
from aotc.frontend.onnx import load_onnx
from aotc.graph.interpret import run_graph

from .onnx_util import (
    Input,
    assert_outputs_match,
    built_package,
    make_graph_model,
    random_feeds,
    run_onnxruntime,
    single_op_model,
)

RTOL, ATOL = 1e-4, 1e-5


def check(model: onnx.ModelProto, feeds: dict | None = None):
    """The model through load_onnx and the graph interpreter against onnxruntime; returns the Graph."""
    feeds = random_feeds(model) if feeds is None else feeds
    graph = load_onnx(model.SerializeToString())
    assert_outputs_match(run_graph(graph, feeds), model, run_onnxruntime(model, feeds), rtol=RTOL, atol=ATOL)
    return graph


def i64(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


# ----------------------------------------------------------------------------- zero-size tensors

E = Input((2, 0, 4))  # a graph input with no elements


@pytest.mark.parametrize(
    ("op_type", "operands", "attrs"),
    [
        pytest.param("ReduceSum", [E, i64(1)], {"keepdims": 1}, id="sum-of-empty-set-is-0"),
        pytest.param("ReduceSum", [E, i64(2)], {"keepdims": 1}, id="sum-over-a-non-empty-axis-is-empty"),
        pytest.param("ReduceMax", [E, i64(1)], {"keepdims": 0}, id="max-of-empty-set-is-minus-inf"),
        pytest.param("ReduceMin", [Input((2, 0, 4), "int32"), i64(1)], {"keepdims": 1}, id="int-min-is-max"),
        pytest.param("ReduceL2", [E, i64(1)], {"keepdims": 1}, id="l2-of-empty-set-is-0"),
        pytest.param("ReduceLogSumExp", [E, i64(1)], {"keepdims": 1}, id="logsumexp-is-minus-inf"),
        pytest.param("Relu", [E], {}, id="relu"),
        pytest.param("Add", [Input((2, 0, 1)), Input((4,))], {}, id="add-broadcasts"),
        pytest.param("Transpose", [E], {"perm": [2, 0, 1]}, id="transpose"),
        pytest.param("Trilu", [Input((3, 0, 5), "int64"), np.array(1, np.int64)], {}, id="trilu"),
        pytest.param("Reshape", [E, i64(0, -1)], {}, id="reshape"),
        pytest.param("Concat", [E, Input((2, 3, 4))], {"axis": 1}, id="concat-drops-the-empty-part"),
        pytest.param("Shape", [Input((3, 4, 5))], {"start": 2, "end": 1}, id="shape-start-past-end"),
        pytest.param("Size", [E], {}, id="size"),
        pytest.param("ConstantOfShape", [i64(0)], {}, id="constant-of-shape-zero"),
        pytest.param("Slice", [Input((4, 3)), i64(9), i64(12), i64(0)], {}, id="slice-out-of-bounds"),
        # no shape rule of aotc's own: ONNX's shape inference gives an output with no elements
        pytest.param("MatMul", [Input((0, 2)), Input((2, 3))], {}, id="inferred-matmul"),
        pytest.param(
            "Conv", [Input((0, 2, 4, 4)), np.ones((3, 2, 1, 1), np.float32)], {}, id="inferred-conv"
        ),
        pytest.param("Expand", [Input((1, 0, 1)), i64(2, 0, 3)], {}, id="inferred-expand"),
        pytest.param("Gather", [Input((3, 4)), np.zeros(0, np.int64)], {"axis": 0}, id="inferred-gather"),
    ],
)
def test_an_operand_with_no_elements_folds_to_a_constant(op_type, operands, attrs):
    graph = check(single_op_model(op_type, operands, opset=18, **attrs))
    assert all(v.type.num_elements for node in graph.nodes for v in node.inputs + node.outputs)


def test_castlike_reads_only_the_type_of_an_empty_like():
    model = single_op_model("CastLike", [Input((3, 4)), Input((0,), "float64")], opset=21)
    graph = check(model)
    assert [v.name for v in graph.inputs] == ["x0", "x1"]  # the package still takes `like`
    assert [n.op for n in graph.nodes] == ["cast"]


@pytest.mark.parametrize("opset", [13, 18])
def test_split_into_parts_of_size_zero(opset):
    node = helper.make_node("Split", ["x", "split"], ["a", "b", "c"], axis=1)
    model = make_graph_model([node], {"x": Input((2, 3))}, ["a", "b", "c"], {"split": i64(0, 3, 0)}, opset)
    graph = check(model)
    assert [str(v.type) for v in graph.outputs] == ["float32[2, 0]", "float32[2, 3]", "float32[2, 0]"]


def test_an_empty_result_that_needs_a_value_is_refused_cleanly():
    """A mean over an empty set has no identity, and a matmul over an empty inner axis is no empty result:
    each a ConversionError naming the node, the graph op and the operand types."""
    model = single_op_model("ReduceMean", [E, i64(1)], opset=18, keepdims=1)
    with pytest.raises(
        ConversionError, match=r"node reducemean_node \(ReduceMean\): graph op reduce_mean on "
    ):
        load_onnx(model.SerializeToString())
    model = single_op_model("MatMul", [Input((2, 0)), Input((0, 3))])
    with pytest.raises(
        ConversionError,
        match=r"node matmul_node \(MatMul\): graph op matmul on float32\[2, 0\], float32\[0, 3\], an operand "
        r"with no elements, is not supported",
    ):
        load_onnx(model.SerializeToString())


def test_a_package_takes_and_returns_tensors_with_no_elements(tmp_path):
    """Empty inputs are declared and checked by shape, empty outputs come back with their shape and dtype,
    and a reduction over an empty input is a constant output; only the Cast needs a kernel."""
    nodes = [
        helper.make_node("CastLike", ["x", "like"], ["cast"]),
        helper.make_node("ReduceSum", ["e", "axes"], ["sum"], keepdims=0),
        helper.make_node("Relu", ["e"], ["relu"]),
        helper.make_node("Shape", ["x"], ["none"], start=1, end=0),
    ]
    inputs = {"x": Input((3, 4)), "like": Input((0,), "float64"), "e": Input((2, 0, 4), "int32")}
    model = make_graph_model(nodes, inputs, ["cast", "sum", "relu", "none"], {"axes": i64(1)}, opset=21)
    loaded = aotc_runtime.load(str(built_package(model, tmp_path, "empty")))
    assert [(t.name, t.shape) for t in loaded.inputs] == [("x", (3, 4)), ("like", (0,)), ("e", (2, 0, 4))]
    feeds = random_feeds(model)
    assert_outputs_match(loaded.run(feeds), model, run_onnxruntime(model, feeds), rtol=RTOL, atol=ATOL)
    with pytest.raises(ValueError, match=r"shape"):
        loaded.run({**feeds, "e": np.zeros((2, 1, 4), np.int32)})


# ----------------------------------------------------------------------------- 3-D windows

X2 = Input((2, 3, 7, 6))
X3 = Input((1, 3, 5, 6, 7))


def pool_case(op_type, id, **attrs):
    return pytest.param(op_type, {"kernel_shape": [3, 2, 3], **attrs}, id=id)


@pytest.mark.parametrize(
    ("op_type", "attrs"),
    [
        pool_case("MaxPool", "max-default"),
        pool_case("MaxPool", "max-pads-strides", pads=[1, 0, 1, 1, 1, 2], strides=[2, 1, 2]),
        pool_case("MaxPool", "max-dilations-ceil", dilations=[2, 1, 2], strides=[2, 2, 2], ceil_mode=1),
        pool_case("MaxPool", "max-same-upper", auto_pad="SAME_UPPER", strides=[2, 2, 2]),
        pool_case("AveragePool", "avg-default"),
        pool_case("AveragePool", "avg-pads-exclude", pads=[1, 1, 1, 1, 0, 1], strides=[2, 1, 2]),
        pool_case("AveragePool", "avg-pads-include", pads=[1, 1, 1, 1, 0, 1], count_include_pad=1),
        pool_case("AveragePool", "avg-ceil-dilations", strides=[2, 2, 2], dilations=[1, 2, 2], ceil_mode=1),
        pool_case("AveragePool", "avg-same-lower", auto_pad="SAME_LOWER", strides=[2, 1, 3]),
    ],
)
def test_3d_pooling(op_type, attrs):
    graph = check(single_op_model(op_type, [X3], opset=19, **attrs))
    assert [n.op for n in graph.nodes] == [("max_pool3d" if op_type == "MaxPool" else "avg_pool3d")]


@pytest.mark.parametrize(
    ("x", "attrs"),
    [
        pytest.param(Input((2, 3, 9)), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}, id="1d"),
        pytest.param(X2, {"kernel_shape": [3, 2], "pads": [1, 0, 1, 1]}, id="2d-pads"),
        pytest.param(
            X2, {"kernel_shape": [2, 3], "strides": [2, 1], "storage_order": 1}, id="2d-column-major"
        ),
        pytest.param(X2, {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, id="2d-ceil"),
        pytest.param(X2, {"kernel_shape": [2, 2], "dilations": [2, 2]}, id="2d-dilations"),
        pytest.param(Input((2, 3, 5, 6, 7), "float32", 0, 3), {"kernel_shape": [2, 3, 2]}, id="3d-ties"),
        pytest.param(X3, {"kernel_shape": [3, 2, 2], "strides": [2, 2, 3], "storage_order": 1}, id="3d-col"),
    ],
)
def test_maxpool_indices(x, attrs):
    """MaxPool's second output: where each window's maximum lies in the flattened input (its first tap in
    scan order where values tie: integer-valued inputs)."""
    model = single_op_model("MaxPool", [x], outputs=2, opset=12, **attrs)
    feeds = random_feeds(model, {"x0": x})
    if x.high == 3:
        feeds["x0"] = np.floor(feeds["x0"])  # many equal values in a window
    graph = check(model, feeds)
    assert "max_pool_indices" in [n.op for n in graph.nodes]


def weights(*shape: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


@pytest.mark.parametrize(
    ("operands", "attrs"),
    [
        pytest.param([X3, weights(4, 3, 2, 3, 2)], {}, id="plain"),
        pytest.param(
            [X3, weights(6, 1, 3, 3, 3), weights(6)],
            {"group": 3, "pads": [1, 0, 1, 1, 2, 1], "strides": [2, 2, 1], "dilations": [1, 2, 1]},
            id="grouped-bias-pads-strides-dilations",
        ),
        pytest.param(
            [X3, weights(2, 3, 3, 3, 3)], {"auto_pad": "SAME_UPPER", "strides": [2, 2, 2]}, id="same"
        ),
    ],
)
def test_3d_convolution(operands, attrs):
    graph = check(single_op_model("Conv", operands, **attrs))
    assert [n.op for n in graph.nodes] == ["conv3d"]


@pytest.mark.parametrize(
    ("operands", "attrs"),
    [
        pytest.param([Input((1, 2, 3, 4, 5)), weights(2, 3, 3, 3, 3)], {}, id="plain"),
        pytest.param(
            [Input((1, 4, 3, 4, 3)), weights(4, 1, 2, 3, 3), weights(2)],
            {"group": 2, "strides": [2, 3, 2], "pads": [1, 0, 1, 0, 1, 1], "output_padding": [1, 1, 0]},
            id="grouped-bias-strides-pads-output-padding",
        ),
        pytest.param(
            [Input((1, 2, 3, 3, 2)), weights(2, 2, 2, 2, 3)],
            {"strides": [2, 2, 2], "dilations": [2, 1, 1], "output_shape": [6, 7, 4]},
            id="output-shape-dilations",
        ),
    ],
)
def test_3d_transposed_convolution(operands, attrs):
    graph = check(single_op_model("ConvTranspose", operands, **attrs))
    assert [n.op for n in graph.nodes] == ["conv3d_transpose"]


def test_windows_beyond_3d_and_mismatched_attributes_are_refused():
    model = single_op_model("MaxPool", [Input((1, 1, 2, 2, 2, 2))], kernel_shape=[1, 1, 1, 1])
    with pytest.raises(
        ConversionError, match=r"node maxpool_node \(MaxPool\): only 1-D, 2-D and 3-D windows"
    ):
        load_onnx(model.SerializeToString())
    model = single_op_model("AveragePool", [X3], kernel_shape=[2, 2, 2], strides=[1, 1])
    with pytest.raises(
        ConversionError, match=r"strides \[1, 1\] does not fit the 3-D input float32\[1, 3, 5, 6, 7\]"
    ):
        load_onnx(model.SerializeToString())


def test_3d_windows_compile_and_match_onnxruntime(tmp_path):
    """One package of a 3-D conv, transposed conv and both poolings (MaxPool's Indices too), run by
    aotc_runtime."""
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["conv"], pads=[1, 1, 1, 1, 1, 1], strides=[1, 2, 2]),
        helper.make_node(
            "MaxPool", ["conv"], ["max", "where"], kernel_shape=[2, 2, 2], ceil_mode=1, strides=[2, 2, 2]
        ),
        helper.make_node("AveragePool", ["x"], ["avg"], kernel_shape=[3, 3, 3], pads=[1] * 6),
        helper.make_node("ConvTranspose", ["max", "wt"], ["up"], strides=[2, 2, 2], output_padding=[1, 0, 1]),
    ]
    inits = {"w": weights(4, 3, 3, 3, 3), "b": weights(4, seed=2), "wt": weights(4, 2, 2, 2, 2, seed=3)}
    model = make_graph_model(nodes, {"x": X3}, ["avg", "up", "where"], inits)
    package = built_package(model, tmp_path, "windows")
    feeds = random_feeds(model)
    assert_outputs_match(
        aotc_runtime.load(str(package)).run(feeds),
        model,
        run_onnxruntime(model, feeds),
        rtol=RTOL,
        atol=ATOL,
    )


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("cc") is None or shutil.which("make") is None, reason="no C compiler or make"
)
def test_the_c_runtime_takes_and_returns_tensors_with_no_elements(tmp_path):
    """runtime/c reads zero-byte inputs and writes zero-byte outputs as the Python runtime does."""
    from .test_c_runtime import build_runtime, python_outputs, read_outputs, run_model

    nodes = [
        helper.make_node("CastLike", ["x", "like"], ["cast"]),
        helper.make_node("ReduceSum", ["e", "axes"], ["sum"], keepdims=0),
        helper.make_node("Relu", ["e"], ["relu"]),
    ]
    inputs = {"x": Input((3, 4)), "like": Input((0,), "float64"), "e": Input((2, 0, 4), "int32")}
    model = make_graph_model(nodes, inputs, ["cast", "sum", "relu"], {"axes": i64(1)}, opset=21)
    package = built_package(model, tmp_path, "empty", "llvm")
    feeds = random_feeds(model)
    proc = run_model(build_runtime(tmp_path / "build"), package, list(feeds.values()), tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expected = python_outputs(package, feeds)
    got = read_outputs(tmp_path, expected)
    assert [got[k].shape for k in expected] == [(3, 4), (2, 4), (2, 0, 4)]
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
