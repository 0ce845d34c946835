"""ONNX indexing and data-movement operators (aotc/frontend/onnx_indexing.py): TopK, ScatterElements,
Scatter, ScatterND, TensorScatter, GatherND, ReverseSequence, DepthToSpace, SpaceToDepth, CenterCropPad,
Einsum, Col2Im, MaxUnpool, Compress, NonZero, Unique and Pad mode wrap, against onnxruntime (or ONNX's
reference evaluator where onnxruntime has no kernel for the opset), through the frontend and the graph
interpreter and, once, compiled.

Integer and index results must be equal; float results within rtol 1e-4, atol 1e-5.
"""

from __future__ import annotations

import aotc_runtime
import numpy as np
import onnx
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

import aotc
from aotc.frontend.errors import ConversionError, UnsupportedOpsetError
from aotc.frontend.onnx import RunTimeValueError, load_onnx
from aotc.graph.interpret import run_graph

from .onnx_util import (
    Input,
    assert_outputs_match,
    case,
    make_graph_model,
    random_feeds,
    reference_outputs,
    single_op_model,
)


def _ints(values, dtype="int64"):
    return np.array(values, dtype)


CASES = [
    case("TopK", [Input((3, 5)), _ints([3])], outputs=2, axis=1, id="topk"),
    case("TopK", [Input((4, 3)), _ints([2])], outputs=2, axis=0, largest=0, id="topk-smallest-axis0"),
    case("TopK", [Input((4, 6), "int32", 0, 3), _ints([4])], outputs=2, id="topk-ties-lower-index-first"),
    case("TopK", [Input((2, 5), "uint64", 0, 4), _ints([5])], outputs=2, largest=0, id="topk-uint64-ties"),
    case("TopK", [Input((3, 4))], outputs=2, k=2, opset=9, id="topk-1-attribute"),
    case("TopK", [Input((2, 3, 4)), _ints([1])], outputs=2, axis=-2, opset=24, id="topk-24"),
    case(
        "ScatterElements",
        [Input((3, 4)), _ints([[1, 0, 2], [-1, 2, 0]]), Input((2, 3))],
        axis=1,
        id="scatter-elements-negative",
    ),
    case(
        "ScatterElements",
        [Input((3, 4)), _ints([[1, 0, 2, 1], [1, 2, 1, 0]], "int32"), Input((2, 4))],
        reduction="add",
        opset=16,
        id="scatter-elements-add-duplicates",
    ),
    case(
        "ScatterElements",
        [Input((3, 4), "int32", -5, 5), _ints([[1, 0], [1, 1]]), Input((2, 2), "int32", -5, 5)],
        axis=0,
        reduction="mul",
        opset=16,
        id="scatter-elements-mul",
    ),
    case(
        "ScatterElements",
        [Input((2, 4)), _ints([[3, 3, 0]]), Input((1, 3))],
        axis=1,
        reduction="max",
        opset=18,
        id="scatter-elements-max",
    ),
    case(
        "ScatterElements",
        [Input((2, 4)), _ints([[3, 3, 0]]), Input((1, 3))],
        axis=1,
        reduction="min",
        opset=18,
        id="scatter-elements-min",
    ),
    case("Scatter", [Input((3, 3)), _ints([[1, 0, 2]]), Input((1, 3))], opset=10, id="scatter-9"),
    case(
        "ScatterND", [Input((4, 3)), _ints([[0, 1], [2, 2], [3, 0]]), Input((3,))], id="scatter-nd-elements"
    ),
    case(
        "ScatterND",
        [Input((4, 2, 3)), _ints([[0], [2], [0]]), Input((3, 2, 3))],
        reduction="add",
        opset=16,
        id="scatter-nd-add-slices",
    ),
    case(
        "ScatterND",
        [Input((4, 3)), _ints([[0, 1], [0, 1], [-1, 0]]), Input((3,))],
        reduction="mul",
        opset=16,
        id="scatter-nd-mul",
    ),
    case(
        "ScatterND",
        [Input((4, 3), "int64", -9, 9), _ints([[[1], [3]]]), Input((1, 2, 3), "int64", -9, 9)],
        reduction="max",
        opset=18,
        id="scatter-nd-max",
    ),
    case("ScatterND", [Input((4, 3)), _ints([1, 2]), Input(())], id="scatter-nd-one-update"),
    case("GatherND", [Input((2, 3, 4)), _ints([[0, -1], [1, 2]])], id="gather-nd"),
    case("GatherND", [Input((2, 3, 4)), _ints([[[0, 1]], [[1, 2]]])], batch_dims=1, id="gather-nd-batch"),
    case("GatherND", [Input((2, 3)), _ints([1, 2])], id="gather-nd-scalar"),
    case("ReverseSequence", [Input((4, 3)), _ints([4, 2, 1])], id="reverse-sequence-time-major"),
    case(
        "ReverseSequence",
        [Input((3, 4, 2)), Input((3,), "int64", 1, 5)],
        batch_axis=0,
        time_axis=1,
        id="reverse-sequence-run-time-lens",
    ),
    case("DepthToSpace", [Input((1, 8, 2, 3))], blocksize=2, id="depth-to-space-dcr"),
    case("DepthToSpace", [Input((2, 8, 2, 3))], blocksize=2, mode="CRD", id="depth-to-space-crd"),
    case("SpaceToDepth", [Input((2, 2, 4, 6))], blocksize=2, id="space-to-depth"),
    case("CenterCropPad", [Input((5, 4, 3)), _ints([3, 7])], axes=[0, -2], opset=18, id="center-crop-pad"),
    case("Einsum", [Input((2, 3, 4)), Input((2, 4, 5))], equation="bij,bjk->bik", opset=12, id="einsum-bmm"),
    case("Einsum", [Input((2, 3, 3))], equation="...ii ->...i", opset=12, id="einsum-diagonal"),
    case("Einsum", [Input((5,)), Input((5,))], equation="i,i", opset=12, id="einsum-inner-scalar"),
    case("Einsum", [Input((3, 4))], equation="ij->ji", opset=12, id="einsum-transpose"),
    case("Einsum", [Input((3, 4), "int32", -5, 5)], equation="ij->i", opset=12, id="einsum-sum-int"),
    case(
        "Einsum",
        [Input((2, 1, 3, 4)), Input((3, 4, 5))],
        equation="...ij,...jk",
        opset=12,
        id="einsum-ellipsis-broadcast",
    ),
    case("Einsum", [Input((3, 4), "float16"), Input((4,), "float16")], equation="ij,j->i", id="einsum-f16"),
    case(
        "Col2Im",
        [Input((1, 8, 6)), _ints([3, 4]), _ints([2, 2])],
        opset=18,
        id="col2im",
    ),
    case(
        "Col2Im",
        [Input((2, 4, 6)), _ints([5, 5]), _ints([2, 2])],
        strides=[2, 2],
        pads=[1, 0, 0, 1],
        dilations=[1, 2],
        opset=18,
        id="col2im-strides-pads-dilations",
    ),
    case(
        "MaxUnpool",
        # MaxPool's indices: flat over the whole [1, 2, 4, 4] output, each in its window of its plane
        [Input((1, 2, 2, 2)), _ints([[[[0, 3], [9, 14]], [[17, 22], [24, 31]]]])],
        kernel_shape=[2, 2],
        strides=[2, 2],
        id="max-unpool",
    ),
    case("Compress", [Input((3, 4)), np.array([True, False, True])], axis=-2, id="compress-axis"),
    case("Compress", [Input((3, 2)), np.array([False, True, True, False, True])], id="compress-flattened"),
    case("Compress", [Input((3,)), np.array([True, False, True, False])], id="compress-long-condition"),
    case("NonZero", [np.array([[1, 0], [3, 4]], np.float32)], id="nonzero-constant"),
    case(
        "Unique",
        [np.array([2, 1, 1, 3, 4, 3], np.float32)],
        outputs=4,
        sorted=0,
        opset=11,
        id="unique-first-occurrence",
    ),
    case(
        "Unique",
        [np.array([[1, 0, 0], [1, 0, 0], [2, 3, 4]], np.int64)],
        outputs=4,
        axis=0,
        opset=11,
        id="unique-sorted-axis",
    ),
    case("Pad", [Input((3, 4)), _ints([2, 5, 1, 1])], mode="wrap", opset=19, id="pad-wrap"),
]


@pytest.mark.parametrize("op_type, operands, kw", CASES)
def test_operator_matches_onnxruntime(op_type, operands, kw):
    kw = dict(kw)
    outputs, opset = kw.pop("outputs", 1), kw.pop("opset", 18)
    model = single_op_model(op_type, operands, outputs, opset, **kw)
    specs = {f"x{i}": op for i, op in enumerate(operands) if isinstance(op, Input)}
    feeds = random_feeds(model, specs)
    got = run_graph(load_onnx(model.SerializeToString()), feeds)
    assert_outputs_match(got, model, reference_outputs(model, feeds))


REFUSED = [
    case(
        "Compress",
        [Input((3, 4)), Input((3,), "bool")],
        error=RunTimeValueError,
        message=r"node compress_node \(Compress\): input 1 \(condition, value x1\) must be a constant: the "
        r"output's shape is the count of its trues.*constants",
        id="compress-run-time-condition",
    ),
    case(
        "NonZero",
        [Input((3, 4))],
        error=RunTimeValueError,
        message=r"input 0 \(X, value x0\) must be a constant",
        id="nonzero-run-time",
    ),
    case(
        "ScatterElements",
        [Input((3, 4)), _ints([[1, 0]]), Input((1, 2))],
        reduction="max",
        opset=16,
        error=ConversionError,
        message=r"ScatterElements-16 \(opset 16\): reduction 'max' is not one of none, add, mul",
        id="scatter-max-before-18",
    ),
    case(
        "ScatterND",
        [Input((100, 2)), np.zeros((100, 1), np.int64), Input((100, 2))],
        reduction="mul",
        opset=16,
        error=ConversionError,
        message=r"reduction mul with 100 updates: aotc multiplies at most 64",
        id="scatter-nd-long-mul",
    ),
    case(
        "Einsum",
        [Input((3, 4))],
        equation="ij->k",
        opset=12,
        error=ConversionError,
        message=r"node einsum_node \(Einsum\): equation 'ij->k': output letters must be distinct letters",
        id="einsum-unknown-output-letter",
    ),
    case(
        "MaxUnpool",
        [Input((1, 1, 2, 2)), _ints([[[[0, 3], [9, 14]]]]), _ints([1, 1, 5, 5])],
        kernel_shape=[2, 2],
        strides=[2, 2],
        error=ConversionError,
        message=r"output_shape \[1, 1, 5, 5\] differs from \[1, 1, 4, 4\].*place the indices differently",
        id="max-unpool-ambiguous-output-shape",
    ),
    case(
        "Pad",
        [Input((3, 4)), _ints([1, 0, -1, 0])],
        mode="wrap",
        opset=19,
        error=ConversionError,
        message=r"pad mode 'wrap' with negative pads",
        id="pad-wrap-crop",
    ),
    case(
        "Pad",
        [Input((3, 4)), _ints([1, 0, 1, 0])],
        mode="wrap",
        opset=18,
        error=ConversionError,
        message=r"Pad-18 \(opset 18\): pad mode 'wrap' is not supported",
        id="pad-wrap-before-19",
    ),
    case(
        "SpaceToDepth",
        [Input((1, 1, 4, 4))],
        blocksize=2,
        mode="CRD",
        opset=13,
        error=ConversionError,
        message=r"attribute mode is not defined for SpaceToDepth-13",
        id="space-to-depth-mode-before-28",
    ),
    case(
        "TopK",
        [Input((3, 4)), Input((1,), "int64")],
        outputs=2,
        error=RunTimeValueError,
        message=r"node topk_node \(TopK\): input 1 \(K, value x1\) must be a constant",
        id="topk-run-time-k",
    ),
]


@pytest.mark.parametrize("op_type, operands, kw", REFUSED)
def test_what_aotc_cannot_do_is_refused_naming_node_and_reason(op_type, operands, kw):
    kw = dict(kw)
    outputs, opset = kw.pop("outputs", 1), kw.pop("opset", 18)
    error, message = kw.pop("error"), kw.pop("message")
    model = single_op_model(op_type, operands, outputs, opset, **kw)
    with pytest.raises(error, match=message):
        load_onnx(model.SerializeToString())


def test_scatter_11_is_deprecated_and_refused():
    model = single_op_model("Scatter", [Input((3, 3)), _ints([[1, 0, 2]]), Input((1, 3))], opset=11)
    with pytest.raises(UnsupportedOpsetError, match=r"Scatter-11 .* is deprecated"):
        load_onnx(model.SerializeToString())


def test_compress_with_the_condition_given_as_a_constant_converts():
    """The condition fed at run time is a RunTimeValueError; given in `constants`, it is a gather."""
    node = helper.make_node("Compress", ["x", "c"], ["y"], axis=1)
    model = make_graph_model([node], {"x": Input((2, 4)), "c": Input((4,), "bool")}, ["y"])
    condition = np.array([True, False, False, True])
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    got = run_graph(load_onnx(model.SerializeToString(), constants={"c": condition}), {"x": x})
    np.testing.assert_array_equal(got["y"], x[:, condition])


def test_compiled_indexing_operators_match_onnxs_reference(tmp_path):
    """TopK, ScatterElements, ScatterND, GatherND, Einsum, Col2Im and TensorScatter compiled by LLVM and run
    with aotc_runtime."""
    nodes = [
        helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=1),
        helper.make_node("ScatterElements", ["x", "sidx", "upd"], ["scattered"], axis=1, reduction="add"),
        helper.make_node("ScatterND", ["x", "ndidx", "row"], ["nd"]),
        helper.make_node("GatherND", ["x", "gidx"], ["gathered"]),
        helper.make_node("Einsum", ["x", "w"], ["product"], equation="ij,jk->ik"),
        helper.make_node("Col2Im", ["cols", "image", "block"], ["image_out"]),
        helper.make_node("TensorScatter", ["cache", "new", "writes"], ["present"], mode="circular"),
    ]
    rng = np.random.default_rng(0)
    feeds = {
        "x": rng.standard_normal((3, 6)).astype(np.float32),
        "upd": rng.standard_normal((3, 2)).astype(np.float32),
        "row": rng.standard_normal((2, 6)).astype(np.float32),
        "w": rng.standard_normal((6, 4)).astype(np.float32),
        "cols": rng.standard_normal((1, 4, 6)).astype(np.float32),
        "cache": rng.standard_normal((2, 5, 3)).astype(np.float32),
        "new": rng.standard_normal((2, 2, 3)).astype(np.float32),
        "writes": np.array([1, 4], np.int64),
    }
    inits = {
        "k": _ints([4]),
        "sidx": _ints([[5, 5], [0, -1], [2, 3]]),
        "ndidx": _ints([[2], [0]]),
        "gidx": _ints([[0, 5], [2, 1], [1, 1]]),
        "image": _ints([3, 4]),
        "block": _ints([2, 2]),
    }
    inputs = {k: Input(v.shape, str(v.dtype)) for k, v in feeds.items()}
    outputs = ["values", "indices", "scattered", "nd", "gathered", "product", "image_out", "present"]
    model = make_graph_model(nodes, inputs, outputs, inits, opset=24)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    shapes = {k: {"shape": list(v.shape)} for k, v in feeds.items()}
    package = aotc.compile(
        str(path), inputs=shapes, validate=False, output=tmp_path / "m.aotc", log=lambda _: None
    )
    got = aotc_runtime.load(str(package.path)).run(feeds)
    assert_outputs_match(got, model, ReferenceEvaluator(model).run(None, feeds))
