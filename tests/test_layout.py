"""The NHWC layout pass: same outputs as the NCHW graph (numpy reference), convs rewritten, few transposes."""

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from aotc.build import build
from aotc.frontend.onnx import load_onnx
from aotc.graph.interpret import run_graph
from aotc.graph.layout import to_nhwc
from aotc.graph.passes import fold_batch_norm, remove_identities
from aotc.recipe import load_recipe
from recipes.zoo import onnx_models as models

from .onnx_util import IR_VERSION, run_onnxruntime

CASES = {
    "small_cnn": lambda: models.small_cnn(),
    "mobilenet_v2": lambda: models.mobilenet_v2(width_mult=0.35, size=32, classes=10),
    "resnet18": lambda: models.resnet18(width=8, size=32, classes=10),
}


def _graph(case):
    return fold_batch_norm(remove_identities(load_onnx(CASES[case]().SerializeToString())))


@pytest.mark.parametrize("case", CASES)
def test_nhwc_graph_computes_the_same_outputs(case):
    ref_graph, graph = _graph(case), to_nhwc(_graph(case))
    (x,) = ref_graph.inputs
    feed = {x.name: np.random.default_rng(0).standard_normal(x.type.shape).astype(np.float32)}
    ref, out = run_graph(ref_graph, feed), run_graph(graph, feed)
    assert ref.keys() == out.keys()
    for name in ref:
        np.testing.assert_allclose(out[name], ref[name], rtol=1e-4, atol=1e-5 * np.abs(ref[name]).max())
    ops = Counter(n.op for n in graph.nodes)
    assert ops["conv2d"] == 0 and ops["conv2d_nhwc"] + ops["depthwise_conv2d_nhwc"] > 0
    assert ops["transpose"] == 2, ops  # into NHWC at the input, out of it before the classifier


def test_graph_without_convs_is_unchanged():
    graph = load_onnx(models.mlp().SerializeToString())
    before = [n.op for n in graph.nodes]
    assert [n.op for n in to_nhwc(graph).nodes] == before


@pytest.mark.parametrize("nhwc", [True, False])
def test_build_in_either_layout_matches_onnxruntime(tmp_path, nhwc):
    """NHWC (the default) and `nhwc: false` compile, and the build's own validation against onnxruntime
    passes."""
    model = models.save(models.mobilenet_v2(width_mult=0.35, size=32, classes=10), tmp_path / "m.onnx")
    recipe = tmp_path / "r.yaml"
    layout = "" if nhwc else "nhwc: false\n"
    recipe.write_text(f"model: {model}\noutput: {tmp_path / 'm.aotc'}\n{layout}tuning: {{tophub: none}}\n")
    result = build(load_recipe(recipe))
    assert result.validation  # a mismatch raises ValidationError
    assert any("nhwc" in t.name for t in result.tasks) == nhwc


def _squeeze_excite() -> onnx.ModelProto:
    """conv -> relu, scaled per channel by sigmoid(conv(relu(conv(mean over H, W)))): the scale [N, C, 1, 1]
    multiplies the activation [N, C, H, W]."""
    rng = np.random.default_rng(4)

    def weight(name, k, c):
        return numpy_helper.from_array((rng.standard_normal((k, c, 1, 1)) * 0.5).astype(np.float32), name)

    inits = [
        numpy_helper.from_array((rng.standard_normal((16, 3, 3, 3)) * 0.3).astype(np.float32), "w0"),
        weight("w1", 4, 16),
        weight("w2", 16, 4),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"]),
        helper.make_node("GlobalAveragePool", ["r0"], ["p"]),
        helper.make_node("Conv", ["p", "w1"], ["c1"]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"]),
        helper.make_node("Sigmoid", ["c2"], ["s"]),
        helper.make_node("Mul", ["r0", "s"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "se", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)


def test_broadcast_between_activations_stays_in_nhwc():
    model = _squeeze_excite()
    graph = to_nhwc(load_onnx(model.SerializeToString()))
    feed = {"x": np.random.default_rng(5).standard_normal((1, 3, 12, 12)).astype(np.float32)}
    (ref,) = run_onnxruntime(model, feed)
    (out,) = run_graph(graph, feed).values()
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    assert [n.op for n in graph.nodes].count("transpose") == 2  # the input and the output


def test_a_transpose_back_to_nchw_moves_after_the_ops_that_do_not_need_it():
    """A quantized model's importer writes its integer convs in NHWC and a transpose back to NCHW after
    the last: the per-channel dequantize and the global average pool after it run on the NHWC value (its
    axis moved to the channels' place), and the transpose moves to the pooled [1, 1, 1, C] value (ResNet-18's
    QDQ pool had been a strided transpose of 7x7x512 and a reduction of 49 bytes per channel: 0.07-0.09 ms
    at 2 threads on Zen 5, now 0.002). Same outputs."""
    from aotc.graph.ir import Graph, Node, TensorType, Value

    x = Value("x", TensorType((1, 5, 6, 8), "uint8"))
    chain = [("transpose", {"perm": (0, 3, 1, 2)}, (1, 8, 5, 6), "uint8")]
    chain.append(
        (
            "qnn.dequantize",
            {"scale": tuple(0.01 * (1 + c) for c in range(8)), "zero_point": tuple(range(8)), "axis": 1},
            (1, 8, 5, 6),
            "float32",
        )
    )
    chain.append(("reduce_mean", {"axes": (2, 3), "keepdims": True}, (1, 8, 1, 1), "float32"))
    chain.append(
        (
            "qnn.quantize",
            {"output_scale": 0.02, "output_zero_point": 3, "out_dtype": "uint8", "rounding": "half_even"},
            (1, 8, 1, 1),
            "uint8",
        )
    )
    nodes, v = [], x
    for i, (op, attrs, shape, dtype) in enumerate(chain):
        out = Value(f"v{i}", TensorType(shape, dtype))
        node = Node(op, [v], [out], attrs, name=f"n{i}")
        out.producer = node
        nodes.append(node)
        v = out
    graph = Graph([x], [v], nodes)
    feed = {"x": np.random.default_rng(0).integers(0, 256, (1, 5, 6, 8)).astype(np.uint8)}
    ref = run_graph(graph, feed)
    ops = [(n.op, tuple(n.outputs[0].type.shape)) for n in to_nhwc(graph).nodes]
    assert ops == [
        ("qnn.dequantize", (1, 5, 6, 8)),
        ("reduce_mean", (1, 1, 1, 8)),
        ("qnn.quantize", (1, 1, 1, 8)),
        ("transpose", (1, 8, 1, 1)),
    ], ops
    assert next(n for n in graph.nodes if n.op == "qnn.dequantize").attrs["axis"] == 3
    out = run_graph(graph, feed)
    np.testing.assert_array_equal(out[v.name], ref[v.name])


def test_an_op_with_a_shape_attribute_stays_in_nchw():
    """broadcast_to names its shape in NCHW order: after a transpose back to NCHW it is not moved into NHWC
    (it was, with its NCHW shape, and its compute failed: "shapes do not broadcast"). Same outputs."""
    from aotc.graph.ir import Graph, Node, TensorType, Value

    x = Value("x", TensorType((1, 8, 7, 16), "float32"))
    t = Value("t", TensorType((1, 16, 8, 7), "float32"))
    b = Value("b", TensorType((2, 16, 8, 7), "float32"))
    transpose = Node("transpose", [x], [t], {"perm": (0, 3, 1, 2)}, name="to_nchw")
    broadcast = Node("broadcast_to", [t], [b], {"shape": (2, 16, 8, 7)}, name="twice")
    t.producer, b.producer = transpose, broadcast
    graph = Graph([x], [b], [transpose, broadcast])
    feed = {"x": np.random.default_rng(0).standard_normal((1, 8, 7, 16)).astype(np.float32)}
    ref = run_graph(graph, feed)
    assert [n.op for n in to_nhwc(graph).nodes] == ["transpose", "broadcast_to"]
    np.testing.assert_array_equal(run_graph(graph, feed)["b"], ref["b"])
