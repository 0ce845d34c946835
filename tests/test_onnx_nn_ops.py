"""ONNX reductions, normalizations, pooling and signal operators of aotc/frontend/onnx_nn.py (ReduceProd,
ReduceLogSum, CumProd, MeanVarianceNormalization, LRN, GroupNormalization, LpPool, EyeLike, Tile, the
Hann/Hamming/Blackman windows, MelWeightMatrix, DFT, STFT) against onnxruntime, or ONNX's reference
evaluator where onnxruntime has no kernel for the opset, through the frontend and the graph interpreter
and, once, compiled.

Integer results must be equal; float results within rtol 1e-4, atol 1e-5 (float16: rtol 1e-3, atol 1e-3,
about one float16 ulp at these magnitudes; the DFTs, whose outputs sum up to 40 terms of magnitude 2 and
which onnxruntime computes in float32: atol 1e-4).
"""

from __future__ import annotations

import aotc_runtime
import numpy as np
import onnx
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

from aotc.frontend.errors import ConversionError, UnsupportedOpsetError
from aotc.frontend.onnx import RunTimeValueError, load_onnx
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
)

TOL = {"float16": (1e-3, 1e-3)}
"""(rtol, atol) per dtype where not the default (1e-4, 1e-5); integers and bools compare exactly."""


def i64(*values):
    return np.array(values, np.int64)


SCALE = np.linspace(0.5, 1.5, 6, dtype=np.float32)
BIAS = np.linspace(-1, 1, 6, dtype=np.float32)

CASES = [
    case("ReduceProd", [Input((3, 4, 5), low=0.5, high=1.5)], axes=[1], opset=13, id="reduce-prod"),
    case("ReduceProd", [Input((3, 4), "int32", -3, 4), i64(-1)], keepdims=0, opset=18, id="reduce-prod-int-18"),
    case("ReduceProd", [Input((2, 3), low=0.5, high=1.5)], keepdims=0, opset=11, id="reduce-prod-all"),
    case("ReduceProd", [Input((2, 3)), np.zeros(0, np.int64)], noop_with_empty_axes=1, opset=18, id="reduce-prod-noop"),
    case("ReduceProd", [Input((4, 6), "float16", 0.5, 1.5)], axes=[1], opset=13, id="reduce-prod-float16"),
    case("ReduceLogSum", [Input((3, 4, 5), low=0.1)], opset=13, id="reduce-log-sum-all"),
    case("ReduceLogSum", [Input((3, 4, 5), low=0.1), i64(0, 2)], keepdims=0, opset=18, id="reduce-log-sum-18"),
    case("ReduceLogSum", [Input((2, 6), "float64", 0.1), i64(-1)], opset=28, id="reduce-log-sum-28"),
    case("CumProd", [Input((6,), low=0.5, high=1.5), np.array(0)], opset=26, id="cumprod"),
    case("CumProd", [Input((3, 4), "int32", -3, 4), np.array(-1, np.int32)], exclusive=1, reverse=1, opset=26, id="cumprod-int-exclusive-reverse"),
    case("CumProd", [Input((3, 4, 2), "float64"), np.array(1)], exclusive=1, opset=26, id="cumprod-exclusive"),
    case("MeanVarianceNormalization", [Input((2, 3, 4, 5))], opset=13, id="mvn"),
    case("MeanVarianceNormalization", [Input((2, 3, 4))], axes=[1], opset=9, id="mvn-axis1-9"),
    case("LRN", [Input((1, 5, 3, 3))], size=3, opset=13, id="lrn"),
    case("LRN", [Input((2, 6, 2, 3))], size=5, alpha=0.01, beta=0.5, bias=2.0, opset=13, id="lrn-attributes"),
    case("LRN", [Input((1, 4, 3, 3), "float16")], size=3, opset=13, id="lrn-float16"),
    case("GroupNormalization", [Input((2, 6, 3, 3)), SCALE, BIAS], num_groups=3, opset=21, id="group-norm"),
    case("GroupNormalization", [Input((2, 6, 4)), SCALE, BIAS], num_groups=1, epsilon=1e-2, opset=21, id="group-norm-1"),
    case("GroupNormalization", [Input((1, 6, 2, 2), "float16"), SCALE.astype(np.float16), BIAS.astype(np.float16)], num_groups=2, opset=21, id="group-norm-float16"),
    case("LpPool", [Input((1, 2, 6, 7))], kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1], opset=11, id="lp-pool-2"),
    case("LpPool", [Input((2, 3, 9))], kernel_shape=[3], p=3, id="lp-pool-1d-p3"),
    case("LpPool", [Input((1, 2, 5, 5))], kernel_shape=[2, 2], p=1, auto_pad="SAME_UPPER", id="lp-pool-p1-same"),
    case("LpPool", [Input((1, 1, 6, 6))], kernel_shape=[2, 2], dilations=[2, 2], opset=18, id="lp-pool-dilations"),
    case("LpPool", [Input((1, 1, 6, 6))], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1, opset=22, id="lp-pool-ceil"),
    case("LpPool", [Input((1, 2, 4, 5, 3))], kernel_shape=[2, 3, 2], pads=[0, 1, 1, 1, 0, 0], strides=[1, 2, 1], p=3, opset=18, id="lp-pool-3d"),
    case("LpPool", [Input((1, 2, 5, 5), "float16")], kernel_shape=[2, 2], strides=[2, 2], opset=18, id="lp-pool-float16"),
    case("EyeLike", [Input((3, 4))], k=1, id="eye-like"),
    case("EyeLike", [Input((4, 3), "int64")], k=-1, dtype=onnx.TensorProto.INT32, opset=22, id="eye-like-int32"),
    case("EyeLike", [Input((3, 3))], dtype=onnx.TensorProto.BOOL, id="eye-like-bool"),
    case("Tile", [Input((2, 3)), i64(2, 3)], id="tile"),
    case("Tile", [Input((2, 1, 3), "int64", -9, 9), i64(1, 4, 1)], opset=13, id="tile-int"),
    case("HannWindow", [np.array(10, np.int32)], id="hann"),
    case("HammingWindow", [np.array(7)], periodic=0, id="hamming-symmetric"),
    case("BlackmanWindow", [np.array(9)], output_datatype=onnx.TensorProto.DOUBLE, id="blackman-double"),
    case("MelWeightMatrix", [np.array(8), np.array(64), np.array(8000), np.array(0.0, np.float32), np.array(4000.0, np.float32)], id="mel-weight-matrix"),
]  # fmt: skip


@pytest.mark.parametrize("op_type, operands, kw", CASES)
def test_operator_matches_the_reference(op_type, operands, kw):
    model, feeds = op_model(op_type, operands, **kw)
    assert_outputs_match(
        run_graph(load_onnx(model.SerializeToString()), feeds),
        model,
        reference_outputs(model, feeds),
        tol=TOL,
    )


DFT_CASES = [
    case("DFT", [Input((2, 8, 1))], id="dft-17-real"),
    case("DFT", [Input((3, 5, 4, 2)), None, np.array(1)], inverse=1, opset=20, id="dft-inverse-axis1"),
    case("DFT", [Input((2, 9, 1)), np.array(12)], onesided=1, opset=20, id="rfft-padded"),
    case("DFT", [Input((2, 5, 2)), np.array(8)], onesided=1, inverse=1, opset=20, id="irfft"),
    case("DFT", [Input((3, 10, 2)), np.array(6)], axis=-2, opset=17, id="dft-17-truncated"),
    case("DFT", [Input((4, 3, 2), "float64"), None, np.array(0)], opset=20, id="dft-axis0-float64"),
    case("STFT", [Input((2, 20, 1)), np.array(4), Input((8,))], id="stft-window"),
    case("STFT", [Input((1, 16, 2)), np.array(3), None, np.array(6)], onesided=0, id="stft-complex"),
]  # fmt: skip


@pytest.mark.parametrize("op_type, operands, kw", DFT_CASES)
def test_dft_and_stft_match_the_reference(op_type, operands, kw):
    model, feeds = op_model(op_type, operands, **kw)
    got = run_graph(load_onnx(model.SerializeToString()), feeds)
    assert_outputs_match(got, model, reference_outputs(model, feeds), tol=TOL, atol=1e-4)


@pytest.mark.parametrize(
    "op_type, operands, kw, message",
    [
        ("GroupNormalization", [Input((1, 6, 2)), SCALE, BIAS], {"num_groups": 4, "opset": 21}, r"node groupnormalization_node \(GroupNormalization\): num_groups=4 must divide the 6 channels"),
        ("GroupNormalization", [Input((1, 6, 2)), SCALE[:3], BIAS[:3]], {"num_groups": 3, "opset": 21}, r"scale must be one float32 per channel \(6\)"),
        ("DFT", [Input((2, 8, 2))], {"onesided": 1, "opset": 20}, r"onesided=1 takes a real input for the forward DFT"),
        ("DFT", [Input((2, 8, 1)), None, np.array(-1)], {"opset": 20}, r"axis -1 must be in \[-3, -2\] or \[0, 1\]"),
        ("STFT", [Input((1, 16, 2)), np.array(4)], {}, r"onesided=1 \(the default\) needs a real signal"),
        ("DFT", [Input((1, 4096, 2))], {"opset": 20}, r"a DFT of 4096 points over 4096 samples: .* constant 8192x8192 matrix"),
        ("ReduceLogSum", [Input((2, 3), "int32")], {"opset": 13}, r"ReduceLogSum is computed on float tensors here, got int32"),
        ("LpPool", [Input((1, 1, 4, 4))], {"kernel_shape": [2, 2], "p": 0}, r"p must be a positive integer, got 0"),
        ("HannWindow", [np.array(1)], {"periodic": 0}, r"a symmetric window \(periodic=0\) of size 1 divides by size - 1 = 0"),
        ("Tile", [Input((2, 3)), i64(2, 0)], {}, r"repeats \[2, 0\] must be positive"),
    ],
)  # fmt: skip
def test_what_aotc_does_not_compute_is_refused_naming_node_and_reason(op_type, operands, kw, message):
    model, _ = op_model(op_type, operands, **kw)
    with pytest.raises(ConversionError, match=message):
        load_onnx(model.SerializeToString())


def test_lrn_of_even_size_on_a_3d_input_matches_the_operator_definition():
    """onnxruntime takes odd sizes only and the reference evaluator 4-D inputs: the definition in numpy,
    the window c - floor((size - 1) / 2) to c + ceil((size - 1) / 2)."""
    model, feeds = op_model("LRN", [Input((2, 6, 5))], size=4, alpha=0.01, beta=0.5, bias=2.0, opset=13)
    x = feeds["x0"].astype(np.float64)
    square_sum = np.stack([(x[:, max(0, c - 1) : c + 3] ** 2).sum(axis=1) for c in range(6)], axis=1)
    expected = (x / (2.0 + 0.01 / 4 * square_sum) ** 0.5).astype(np.float32)
    assert_outputs_match(run_graph(load_onnx(model.SerializeToString()), feeds), model, [expected], tol=TOL)


def test_group_normalization_18_is_refused_as_deprecated():
    """GroupNormalization-18 (scale and bias per group) is deprecated; 21's are per channel."""
    model, _ = op_model("GroupNormalization", [Input((1, 6, 2)), SCALE[:3], BIAS[:3]], num_groups=3, opset=18)
    with pytest.raises(UnsupportedOpsetError, match=r"GroupNormalization-18 \(the version opset 18 imports\) is deprecated"):  # fmt: skip
        load_onnx(model.SerializeToString())


def test_tile_repeats_fed_at_run_time_are_a_run_time_value_that_constants_fix():
    model, _ = op_model("Tile", [Input((2, 3)), Input((2,), "int64")])
    with pytest.raises(
        RunTimeValueError, match=r"node tile_node \(Tile\): input 1 \(repeats, value x1\)"
    ) as e:
        load_onnx(model.SerializeToString())
    assert e.value.inputs == ("x1",)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = run_graph(load_onnx(model.SerializeToString(), constants={"x1": i64(3, 2)}), {"x0": x})["y0"]
    np.testing.assert_array_equal(got, np.tile(x, (3, 2)))


def test_the_operators_compile_and_match_the_reference(tmp_path):
    """One package (the product reduction and scan, LRN's and LpPool's pools, GroupNormalization, a DFT's
    float64 matrix product), run with aotc_runtime."""
    nodes = [
        helper.make_node("ReduceProd", ["x", "axis1"], ["prod"], keepdims=0),
        helper.make_node("CumProd", ["x", "axis2"], ["cumprod"], reverse=1),
        helper.make_node("LRN", ["x"], ["lrn"], size=3),
        helper.make_node("LpPool", ["x"], ["lp"], kernel_shape=[2, 2], pads=[1, 1, 0, 0], p=3),
        helper.make_node("GroupNormalization", ["x", "scale", "bias"], ["gn"], num_groups=2),
        helper.make_node("Unsqueeze", ["x", "axis_last"], ["signal"]),
        helper.make_node("DFT", ["signal", "", "axis2"], ["dft"], onesided=1),
    ]
    inputs = {"x": Input((2, 4, 5, 6), low=0.5, high=1.5)}
    inits = {
        "axis1": i64(1),
        "axis2": np.array(2),
        "axis_last": i64(-1),
        "scale": np.linspace(0.5, 1.5, 4, dtype=np.float32),
        "bias": np.linspace(-1, 1, 4, dtype=np.float32),
    }
    outputs = ["prod", "cumprod", "lrn", "lp", "gn", "dft"]
    model = make_graph_model(nodes, inputs, outputs, inits, opset=26)
    feeds = random_feeds(model, inputs)
    got = aotc_runtime.load(str(built_package(model, tmp_path, inputs={"x": [2, 4, 5, 6]}))).run(feeds)
    assert_outputs_match(got, model, ReferenceEvaluator(model).run(None, feeds), tol=TOL, atol=1e-4)
