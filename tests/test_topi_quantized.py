"""Quantized (int8/uint8) operators against numpy re-implementations of TFLite's reference kernels
(python/numpy int64, written independently of the tensor expressions), evaluated by the numpy
reference evaluator and compiled with the default schedule: integer kernels (hard_swish's 16-bit
fixed-point one too) must match exactly; softmax and logistic within 1 LSB."""

from __future__ import annotations

import math
import re
import time

import numpy as np
import pytest

from aotc.codegen.llvm import build_llvm_ir
from aotc.codegen.module import build_module, load_library
from aotc.graph.interpret import node_compute
from aotc.graph.ir import Node, TensorType
from aotc.schedule.default import default_schedule
from aotc.schedule.lower import lower
from aotc.target import host_target
from aotc.te.dag import ComputeDAG

from .test_topi_nhwc import compile_ops, conv_ref, depthwise_ref

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


# ----------------------------------------------------------------------------- TFLite arithmetic


def tfl_round(v):
    """std::round: half away from zero (float or array)."""
    v = np.asarray(v)
    t = np.trunc(v)
    return t + np.where(np.abs(v - t) >= 0.5, np.sign(v), 0)


def quantize_multiplier(real: float) -> tuple[int, int]:
    """QuantizeMultiplier (quantization_util.cc)."""
    if real == 0:
        return 0, 0
    q, shift = np.frexp(np.float64(real))
    fixed = int(tfl_round(q * (1 << 31)))
    if fixed == 1 << 31:
        fixed //= 2
        shift += 1
    if shift < -31:
        return 0, 0
    return fixed, int(shift)


def srdhm(a, b: int):
    """SaturatingRoundingDoublingHighMul on int32 values (int64 arrays), C truncating division."""
    a = np.asarray(a, np.int64)
    ab = a * np.int64(b)
    v = ab + np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    q = np.sign(v) * (np.abs(v) // (1 << 31))
    return np.where((a == INT32_MIN) & (b == INT32_MIN), INT32_MAX, q)


def rounding_divide_by_pot(x, exponent: int, half_up: bool = False):
    """gemmlowp's RoundingDivideByPOT (ties away from zero), or ruy's final shift (ties up)."""
    x = np.asarray(x, np.int64)
    mask = (1 << exponent) - 1
    threshold = (mask >> 1) + (0 if half_up else (x < 0))
    return (x >> exponent) + ((x & mask) > threshold)


def multiply_by_quantized_multiplier(x, multiplier: int, shift: int, half_up: bool = False):
    left, right = max(shift, 0), max(-shift, 0)
    x = np.asarray(x, np.int64) * (1 << left)
    assert np.all((x >= INT32_MIN) & (x <= INT32_MAX)), "int32 overflow in the reference"
    return rounding_divide_by_pot(srdhm(x, multiplier), right, half_up)


def per_channel_mbqm(acc, scales, half_up: bool = False):
    """MultiplyByQuantizedMultiplier along the last axis with one scale per channel (or one)."""
    out = np.empty_like(acc, np.int64)
    for c in range(acc.shape[-1]):
        m, s = quantize_multiplier(scales[c if len(scales) > 1 else 0])
        out[..., c] = multiply_by_quantized_multiplier(acc[..., c], m, s, half_up)
    return out


def activation_range(activation, scale, zp, dtype):
    info = np.iinfo(dtype)
    lo, hi = int(info.min), int(info.max)

    def q(f):
        return zp + int(tfl_round(np.float32(f) / np.float32(scale)))

    if activation in ("RELU", "RELU6"):
        lo = max(lo, q(0.0))
    if activation == "RELU6":
        hi = min(hi, q(6.0))
    if activation == "RELU_N1_TO_1":
        lo, hi = max(lo, q(-1.0)), min(hi, q(1.0))
    return lo, hi


def finish(acc, attrs):
    lo, hi = activation_range(
        attrs.get("activation", "NONE"), attrs["output_scale"], attrs["output_zero_point"], attrs["out_dtype"]
    )
    return np.clip(acc + attrs["output_zero_point"], lo, hi).astype(attrs["out_dtype"])


def f32(v):
    return float(np.float32(v))


# ----------------------------------------------------------------------------- reference kernels


def conv_scales(attrs, per_tensor_float):
    si, so = f32(attrs["input_scale"]), f32(attrs["output_scale"])
    ws = [f32(s) for s in attrs["weight_scales"]]
    if per_tensor_float and len(ws) == 1:
        return [float(np.float32(si) * np.float32(ws[0])) / so]
    return [si * w / so for w in ws]


def ref_conv(inputs, attrs, depthwise):
    x, w = inputs[:2]
    xz = x.astype(np.int64) - attrs["input_zero_point"]
    wz = w.astype(np.int64) - attrs["weight_zero_points"][0]
    if depthwise:
        acc = depthwise_ref(
            xz, wz, attrs["strides"], attrs["pads"], attrs["dilations"], attrs["depth_multiplier"], np.int64
        )
    else:
        acc = conv_ref(
            xz, wz, attrs["strides"], attrs["pads"], attrs["dilations"], x.shape[3] // w.shape[3], np.int64
        )
    if len(inputs) > 2:
        acc = acc + inputs[2]
    scales = conv_scales(attrs, x.dtype == np.uint8)
    return finish(per_channel_mbqm(acc, scales, half_up=not depthwise), attrs)


def ref_dense(inputs, attrs):
    x, w = inputs[:2]
    acc = (x.astype(np.int64) - attrs["input_zero_point"]) @ (
        w.astype(np.int64) - attrs["weight_zero_points"][0]
    ).T
    if len(inputs) > 2:
        acc = acc + inputs[2]
    return finish(per_channel_mbqm(acc, conv_scales(attrs, True), half_up=True), attrs)


def ref_add(a, b, attrs):
    sa, sb, so = f32(attrs["a_scale"]), f32(attrs["b_scale"]), f32(attrs["output_scale"])
    twice = 2 * max(sa, sb)
    ma, mb = quantize_multiplier(sa / twice), quantize_multiplier(sb / twice)
    mo = quantize_multiplier(twice / ((1 << 20) * so))
    va = multiply_by_quantized_multiplier((a.astype(np.int64) - attrs["a_zero_point"]) * (1 << 20), *ma)
    vb = multiply_by_quantized_multiplier((b.astype(np.int64) - attrs["b_zero_point"]) * (1 << 20), *mb)
    return finish(multiply_by_quantized_multiplier(va + vb, *mo), attrs)


def ref_mul(a, b, attrs):
    m = quantize_multiplier(f32(attrs["a_scale"]) * f32(attrs["b_scale"]) / f32(attrs["output_scale"]))
    prod = (a.astype(np.int64) - attrs["a_zero_point"]) * (b.astype(np.int64) - attrs["b_zero_point"])
    return finish(multiply_by_quantized_multiplier(prod, *m), attrs)


def c_div(a, b):
    return np.sign(a) * (np.abs(a) // b)


def ref_pool(x, attrs, kind):
    (kh, kw), (sh, sw), (pt, pl, pb, pr) = attrs["kernel"], attrs["strides"], attrs["pads"]
    n, h, w, c = x.shape
    oh, ow = (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1
    out = np.zeros((n, oh, ow, c), np.int64)
    for y in range(oh):
        for xx in range(ow):
            y0, x0 = y * sh - pt, xx * sw - pl
            win = x[:, max(y0, 0) : min(y0 + kh, h), max(x0, 0) : min(x0 + kw, w)].astype(np.int64)
            if kind == "max":
                out[:, y, xx] = win.max(axis=(1, 2))
            else:
                total, count = win.sum(axis=(1, 2)), win.shape[1] * win.shape[2]
                out[:, y, xx] = np.where(
                    total > 0, c_div(total + count // 2, count), c_div(total - count // 2, count)
                )
    lo, hi = activation_range(attrs["activation"], attrs["output_scale"], attrs["output_zero_point"], x.dtype)
    return np.clip(out, lo, hi).astype(x.dtype)


def ref_mean(x, attrs):
    axes = tuple(a % x.ndim for a in attrs["axes"])
    acc = (x.astype(np.int64) - attrs["input_zero_point"]).sum(axis=axes, keepdims=attrs["keepdims"])
    count = math.prod(x.shape[a] for a in axes)
    v = multiply_by_quantized_multiplier(
        acc, *quantize_multiplier(f32(attrs["input_scale"]) / f32(attrs["output_scale"]))
    )
    v = np.where(v > 0, c_div(v + count // 2, count), c_div(v - count // 2, count))
    info = np.iinfo(x.dtype)
    return np.clip(v + attrs["output_zero_point"], info.min, info.max).astype(x.dtype)


def ref_quantize(x, attrs):
    q = (
        tfl_round(np.float32(x) / np.float32(attrs["output_scale"])).astype(np.int64)
        + attrs["output_zero_point"]
    )
    info = np.iinfo(attrs["out_dtype"])
    return np.clip(q, info.min, info.max).astype(attrs["out_dtype"])


def ref_requantize(x, attrs):
    m = quantize_multiplier(f32(attrs["input_scale"]) / f32(attrs["output_scale"]))
    v = multiply_by_quantized_multiplier(x.astype(np.int64) - attrs["input_zero_point"], *m)
    info = np.iinfo(attrs["out_dtype"])
    return np.clip(v + attrs["output_zero_point"], info.min, info.max).astype(attrs["out_dtype"])


def ref_dequantize(x, attrs):
    scale = np.asarray(attrs["scale"], np.float32).astype(np.float64)
    zp = np.asarray(attrs["zero_point"], np.int64)
    shape = [1] * x.ndim
    if scale.size > 1:
        shape[attrs["axis"]] = -1
    return (
        (x.astype(np.int64) - zp.reshape(shape if zp.size > 1 else [1] * x.ndim)) * scale.reshape(shape)
    ).astype(np.float32)


# ----------------------------------------------------------------------------- random cases


def qtensor(rng, shape, dtype):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


def zero_point(rng, dtype):
    return int(rng.integers(-20, 20)) if dtype == "int8" else int(rng.integers(100, 156))


def calibrated_output(rng, real_values, dtype, attrs):
    """Output scale and zero point that spread `real_values` over most of the quantized range."""
    attrs["output_scale"] = f32(max(float(np.std(real_values)), 1e-6) / 40 * rng.uniform(0.8, 1.25))
    attrs["output_zero_point"] = zero_point(rng, dtype)
    attrs["out_dtype"] = dtype
    return attrs


def conv_case(rng, dtype, xs, ws, window, per_channel, activation, bias, depthwise=False, mult=1):
    x, w = qtensor(rng, xs, dtype), qtensor(rng, ws, "int8" if dtype == "int8" else dtype)
    out_c = ws[3] if depthwise else ws[0]
    w_zp = 0 if dtype == "int8" else int(rng.integers(100, 156))
    attrs = {
        **window,
        "input_scale": f32(rng.uniform(0.005, 0.05)),
        "input_zero_point": zero_point(rng, dtype),
        "weight_scales": tuple(f32(s) for s in rng.uniform(0.002, 0.02, out_c if per_channel else 1)),
        "weight_zero_points": (w_zp,) * (out_c if per_channel else 1),
        "activation": activation,
    }
    if depthwise:
        attrs["depth_multiplier"] = mult
    inputs = [x, w]
    if bias:
        inputs.append(rng.integers(-2000, 2000, out_c).astype(np.int32))
    xz = x.astype(np.int64) - attrs["input_zero_point"]
    wz = w.astype(np.int64) - w_zp
    acc = (
        depthwise_ref(xz, wz, window["strides"], window["pads"], window["dilations"], mult, np.int64)
        if depthwise
        else conv_ref(
            xz, wz, window["strides"], window["pads"], window["dilations"], xs[3] // ws[3], np.int64
        )
    )
    real = acc * attrs["input_scale"] * np.asarray(attrs["weight_scales"])
    attrs = calibrated_output(rng, real, dtype, attrs)
    op = "qnn.depthwise_conv2d_nhwc" if depthwise else "qnn.conv2d_nhwc"
    return op, inputs, attrs, ref_conv(inputs, attrs, depthwise)


W1 = {"strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1)}
W2 = {"strides": (2, 2), "pads": (0, 0, 1, 1), "dilations": (1, 1)}
W3 = {"strides": (1, 2), "pads": (2, 0, 2, 1), "dilations": (2, 1)}


def integer_cases(rng):
    """(name, op, inputs, attrs, expected)."""
    cases = []
    convs = [
        ("int8", (1, 7, 8, 5), (6, 3, 3, 5), W1, True, "NONE", True),
        ("int8", (2, 9, 7, 4), (16, 3, 2, 4), W3, True, "RELU6", True),
        ("int8", (1, 8, 8, 8), (8, 1, 1, 8), W2, False, "RELU", False),
        ("int8", (1, 6, 6, 6), (4, 3, 3, 3), W1, True, "NONE", True),
        ("uint8", (1, 7, 6, 3), (5, 3, 3, 3), W2, False, "RELU6", True),
    ]
    for i, (dtype, xs, ws, window, pc, act, bias) in enumerate(convs):
        cases.append((f"conv_{i}", *conv_case(rng, dtype, xs, ws, window, pc, act, bias)))
    depthwise = [
        ("int8", (1, 7, 8, 16), 1, W1, True, "RELU6"),
        ("int8", (2, 9, 9, 3), 2, W2, True, "NONE"),
        ("uint8", (1, 8, 7, 4), 1, W3, False, "RELU"),
    ]
    for i, (dtype, xs, mult, window, pc, act) in enumerate(depthwise):
        ws = (1, 3, 3, xs[3] * mult)
        cases.append((f"depthwise_{i}", *conv_case(rng, dtype, xs, ws, window, pc, act, True, True, mult)))
    for i, (dtype, m, k, n, pc, bias) in enumerate(
        [("int8", 3, 40, 10, False, True), ("uint8", 2, 17, 5, False, True), ("int8", 4, 24, 8, True, False)]
    ):
        x, w = qtensor(rng, (m, k), dtype), qtensor(rng, (n, k), dtype)
        w_zp = 0 if dtype == "int8" else int(rng.integers(100, 156))
        attrs = {
            "input_scale": f32(rng.uniform(0.005, 0.05)),
            "input_zero_point": zero_point(rng, dtype),
            "weight_scales": tuple(f32(s) for s in rng.uniform(0.002, 0.02, n if pc else 1)),
            "weight_zero_points": (w_zp,),
            "activation": "RELU" if i == 1 else "NONE",
        }
        inputs = [x, w] + ([rng.integers(-3000, 3000, n).astype(np.int32)] if bias else [])
        real = (x.astype(np.int64) - attrs["input_zero_point"]) @ (w.astype(np.int64) - w_zp).T
        attrs = calibrated_output(
            rng, real * attrs["input_scale"] * np.asarray(attrs["weight_scales"]), dtype, attrs
        )
        cases.append((f"dense_{i}", "qnn.dense", inputs, attrs, ref_dense(inputs, attrs)))
    for i, (dtype, sa, sb, act) in enumerate(
        [
            ("int8", (2, 3, 4, 5), (5,), "NONE"),
            ("uint8", (3, 1, 6), (4, 1), "RELU6"),
            ("int8", (2, 8), (2, 8), "RELU"),
        ]
    ):
        a, b = qtensor(rng, sa, dtype), qtensor(rng, sb, dtype)
        base = {
            "a_scale": f32(rng.uniform(0.01, 0.1)),
            "a_zero_point": zero_point(rng, dtype),
            "b_scale": f32(rng.uniform(0.01, 0.1)),
            "b_zero_point": zero_point(rng, dtype),
            "activation": act,
        }
        ra = (a.astype(np.float64) - base["a_zero_point"]) * base["a_scale"]
        rb = (b.astype(np.float64) - base["b_zero_point"]) * base["b_scale"]
        add = calibrated_output(rng, ra + rb, dtype, dict(base))
        cases.append((f"add_{i}", "qnn.add", [a, b], add, ref_add(a, b, add)))
        mul = calibrated_output(rng, ra * rb, dtype, dict(base))
        cases.append((f"mul_{i}", "qnn.mul", [a, b], mul, ref_mul(a, b, mul)))
    for i, (dtype, kind, kernel, strides, pads, act) in enumerate(
        [
            ("int8", "avg", (3, 3), (2, 2), (1, 1, 1, 1), "NONE"),
            ("int8", "avg", (2, 3), (1, 2), (0, 1, 1, 1), "RELU6"),
            ("uint8", "avg", (3, 3), (1, 1), (1, 1, 1, 1), "NONE"),
            ("int8", "max", (3, 3), (2, 2), (0, 0, 1, 1), "RELU"),
            ("uint8", "max", (2, 2), (2, 2), (0, 0, 0, 0), "NONE"),
        ]
    ):
        x = qtensor(rng, (2, 7, 8, 6), dtype)
        zp = zero_point(rng, dtype)
        attrs = {"kernel": kernel, "strides": strides, "pads": pads, "activation": act, "out_dtype": dtype}
        attrs |= {"input_scale": 0.05, "input_zero_point": zp, "output_scale": 0.05, "output_zero_point": zp}
        cases.append((f"{kind}_pool_{i}", f"qnn.{kind}_pool2d_nhwc", [x], attrs, ref_pool(x, attrs, kind)))
    for i, (dtype, shape, axes, keep) in enumerate(
        [
            ("int8", (2, 5, 6, 8), (1, 2), True),
            ("uint8", (3, 7, 4), (-1,), False),
            ("int8", (4, 6), (0, 1), False),
        ]
    ):
        x = qtensor(rng, shape, dtype)
        attrs = {"axes": axes, "keepdims": keep, "out_dtype": dtype}
        attrs |= {"input_scale": f32(rng.uniform(0.01, 0.1)), "input_zero_point": zero_point(rng, dtype)}
        attrs |= {
            "output_scale": f32(attrs["input_scale"] * rng.uniform(0.1, 0.5)),
            "output_zero_point": zero_point(rng, dtype),
        }
        cases.append((f"mean_{i}", "qnn.mean", [x], attrs, ref_mean(x, attrs)))
    for i, dtype in enumerate(["int8", "uint8"]):
        x = rng.normal(0, 3, (4, 33)).astype(np.float32)
        x[0, :8] = np.array([0.5, -0.5, 1.5, -2.5, 1e6, -1e6, 0.49999997, -0.49999997], np.float32) * 0.1
        attrs = {"output_scale": 0.1, "output_zero_point": zero_point(rng, dtype), "out_dtype": dtype}
        cases.append((f"quantize_{i}", "qnn.quantize", [x], attrs, ref_quantize(x, attrs)))
        xi = qtensor(rng, (3, 7, 5), dtype)
        attrs = {"input_scale": 0.02, "input_zero_point": zero_point(rng, dtype), "output_scale": 0.05}
        attrs |= {"output_zero_point": zero_point(rng, "int8"), "out_dtype": "int8"}
        cases.append((f"requantize_{i}", "qnn.requantize", [xi], attrs, ref_requantize(xi, attrs)))
        cases.append((f"quantize_int_{i}", "qnn.quantize", [xi], attrs, ref_requantize(xi, attrs)))
        per_axis = {
            "scale": tuple(f32(s) for s in rng.uniform(0.01, 0.1, 7)),
            "zero_point": (0,) * 7,
            "axis": 1,
        }
        cases.append((f"dequantize_pc_{i}", "qnn.dequantize", [xi], per_axis, ref_dequantize(xi, per_axis)))
        per_tensor = {"scale": (0.037,), "zero_point": (zero_point(rng, dtype),), "axis": 0}
        cases.append((f"dequantize_{i}", "qnn.dequantize", [xi], per_tensor, ref_dequantize(xi, per_tensor)))
    return cases


def test_quantize_multiplier_matches_tflite_examples():
    from aotc.topi.quantized import quantize_multiplier as qm

    for real in [1e-6, 0.0003, 0.25, 0.5, 0.7071, 1.0, 1.5, 3.99999999, 100.0]:
        assert qm(real) == quantize_multiplier(real), real
    assert qm(0.0) == (0, 0)
    assert qm(0.5) == (1 << 30, 0)
    assert qm(1 - 2**-40) == (1 << 30, 1)


def test_integer_quantized_ops_match_tflite_reference_exactly(tmp_path):
    cases = integer_cases(np.random.default_rng(0))
    results = compile_ops([c[:4] for c in cases], tmp_path)
    for name, _, _, _, expected in cases:
        ref, got = results[name]
        assert got.dtype == expected.dtype and got.shape == expected.shape, name
        assert expected.size < 4 or np.unique(expected).size > 3, f"{name}: degenerate case"
        np.testing.assert_array_equal(ref, expected, err_msg=f"{name} (reference evaluator)")
        np.testing.assert_array_equal(got, expected, err_msg=f"{name} (compiled)")


def one_node_graph(name: str, op: str, inputs: list, attrs: dict, expected: np.ndarray):
    """(input value, node, output value) of a graph computing `op` on runtime input 0 and constant others."""
    from aotc.graph.ir import Value

    x = Value("x", TensorType(inputs[0].shape, str(inputs[0].dtype)))
    consts = [Value(f"c{i}", TensorType(a.shape, str(a.dtype)), data=a) for i, a in enumerate(inputs[1:])]
    out = Value("y", TensorType(expected.shape, str(expected.dtype)))
    node = Node(op, [x, *consts], [out], dict(attrs), name=name)
    out.producer = node
    return x, node, out


def test_input_zero_point_folded_into_the_bias_gives_identical_results():
    """The graph pass moves -(zx - m) * sum(w) into the int32 bias of convs, depthwise convs and dense
    layers with constant weights (created when there is none), m = -128 for int8 convs (depthwise too) and
    dense layers (their factor x + 128 is a uint8), else 0; every result stays bit-exact."""
    from aotc.graph.interpret import evaluate_node
    from aotc.graph.ir import Graph
    from aotc.graph.passes import fold_input_zero_point
    from aotc.topi.quantized import mac_zero_point

    folded_ops = set()
    for name, op, inputs, attrs, expected in integer_cases(np.random.default_rng(0)):
        if op not in ("qnn.conv2d_nhwc", "qnn.depthwise_conv2d_nhwc", "qnn.dense"):
            continue
        x, node, out = one_node_graph(name, op, inputs, attrs, expected)
        fold_input_zero_point(Graph([x], [out], [node]))
        w_zps = np.asarray(attrs.get("weight_zero_points", 0))
        if attrs["input_zero_point"] != mac_zero_point(op, str(inputs[0].dtype)) and not w_zps.any():
            assert node.attrs.get("input_zero_point_in_bias") and len(node.inputs) == 3, name
            folded_ops.add((op, len(inputs) == 2))
        else:
            assert "input_zero_point_in_bias" not in node.attrs, name
        (got,) = evaluate_node(node, [inputs[0], *(v.data for v in node.inputs[1:])])
        np.testing.assert_array_equal(got, expected, err_msg=name)
    assert {op for op, _ in folded_ops} == {"qnn.conv2d_nhwc", "qnn.depthwise_conv2d_nhwc", "qnn.dense"}
    assert ("qnn.dense", True) in folded_ops, "a layer without a bias gets one"


def test_per_channel_requantize_tables_become_constant_inputs_with_identical_results():
    """The graph pass computes the per-channel multipliers once (constant inputs 3...) instead of the
    kernel's select trees; layers whose channels share one scale are left alone; results stay bit-exact."""
    from aotc.graph.interpret import evaluate_node
    from aotc.graph.ir import Graph
    from aotc.graph.passes import constant_requantize_tables

    seen = set()
    for name, op, inputs, attrs, expected in integer_cases(np.random.default_rng(1)):
        if op not in ("qnn.conv2d_nhwc", "qnn.depthwise_conv2d_nhwc", "qnn.dense"):
            continue
        x, node, out = one_node_graph(name, op, inputs, attrs, expected)
        constant_requantize_tables(Graph([x], [out], [node]))
        scales = np.atleast_1d(attrs["weight_scales"])
        if (scales != scales[0]).any():
            assert node.attrs.get("requantize_tables") and len(node.inputs) > 3, name
            assert all(v.is_constant for v in node.inputs[2:]), name
            seen.add(op)
        else:
            assert "requantize_tables" not in node.attrs, name
        (got,) = evaluate_node(node, [inputs[0], *(v.data for v in node.inputs[1:])])
        np.testing.assert_array_equal(got, expected, err_msg=name)
    assert seen == {"qnn.conv2d_nhwc", "qnn.depthwise_conv2d_nhwc", "qnn.dense"}


def test_conv_channels_padded_to_the_dot_product_depth_give_identical_results():
    """An RGB stem's 3 input channels become 4 (a zero weight channel, the input padded with its zero
    point) so the conv runs on dot-product instructions; the graph computes the same, bit for bit."""
    from aotc.graph.interpret import run_graph
    from aotc.graph.ir import Graph
    from aotc.graph.passes import fold_input_zero_point, pad_conv_channels

    checked = 0
    for name, op, inputs, attrs, expected in integer_cases(np.random.default_rng(2)):
        if op != "qnn.conv2d_nhwc" or inputs[0].shape[3] % 4 == 0 or inputs[1].shape[3] != inputs[0].shape[3]:
            continue
        x, node, out = one_node_graph(name, op, inputs, attrs, expected)
        graph = pad_conv_channels(Graph([x], [out], [node]))
        assert [n.op for n in graph.nodes] == ["pad", op], name
        assert node.inputs[0].type.shape[3] % 4 == 0 and node.inputs[1].type.shape[3] % 4 == 0
        np.testing.assert_array_equal(run_graph(graph, {"x": inputs[0]})["y"], expected, err_msg=name)
        graph = fold_input_zero_point(graph)
        np.testing.assert_array_equal(run_graph(graph, {"x": inputs[0]})["y"], expected, err_msg=name)
        checked += 1
    assert checked >= 2  # int8 and uint8 convs of 5 and 3 channels


def test_channels_of_a_transposed_nchw_input_are_padded_as_planes():
    """A conv whose 3-channel input is an NCHW -> NHWC transpose gets its padding on the NCHW planes, then
    the transpose (one vectorized pass each, not a pass over 3-byte pixels); bit for bit the same."""
    from aotc.graph.interpret import run_graph
    from aotc.graph.ir import Graph, Value
    from aotc.graph.passes import pad_conv_channels

    checked = 0
    for name, op, inputs, attrs, expected in integer_cases(np.random.default_rng(2)):
        if op != "qnn.conv2d_nhwc" or inputs[0].shape[3] % 4 == 0 or inputs[1].shape[3] != inputs[0].shape[3]:
            continue
        nchw = np.ascontiguousarray(inputs[0].transpose(0, 3, 1, 2))
        _, node, out = one_node_graph(name, op, inputs, attrs, expected)
        x = Value("x", TensorType(nchw.shape, str(nchw.dtype)))
        t = Value("t", TensorType(inputs[0].shape, str(inputs[0].dtype)))
        transpose = Node("transpose", [x], [t], {"perm": (0, 2, 3, 1)}, name="to_nhwc")
        t.producer, node.inputs[0] = transpose, t
        graph = pad_conv_channels(Graph([x], [out], [transpose, node]))
        assert [n.op for n in graph.nodes] == ["transpose", "pad", "transpose", op], name
        assert graph.nodes[1].inputs[0] is x and graph.nodes[1].attrs["after"][1] == -inputs[0].shape[3] % 4
        np.testing.assert_array_equal(run_graph(graph, {"x": nchw})["y"], expected, err_msg=name)
        checked += 1
    assert checked >= 2


# (input HxW and channels, kernel, stride, pads (top, left, bottom, right), window taps after, or None)
WINDOW_COLUMN_CASES = [
    ((17, 20, 3), 7, 2, (3, 3, 3, 3), 8),  # ResNet's stem: 21 values a window row -> 24, not 7 x 4 = 28
    ((9, 11, 3), 7, 1, (3, 2, 1, 4), 8),  # stride 1, asymmetric pads
    ((12, 13, 1), 3, 1, (1, 1, 1, 1), 4),  # one channel: 4 values a row, not 3 x 4
    ((23, 23, 3), 11, 4, (0, 0, 0, 0), 12),  # AlexNet-like: 36, not 44; the last 2 columns never read
    ((8, 8, 3), 3, 2, (1, 1, 1, 1), None),  # MobileNet's stem: 12 either way, channels padded instead
]


@pytest.mark.parametrize(
    "dtype, zero_point, weight_zero_point", [("uint8", 117, 0), ("int8", -3, 0), ("uint8", 9, 7)]
)
@pytest.mark.parametrize("nchw", [False, True], ids=["nhwc", "nchw_transposed"])
def test_window_columns_as_channels_give_identical_results(dtype, zero_point, weight_zero_point, nchw):
    """A conv with few input channels whose window rows, read as runs of channels, take fewer dot-product
    steps than its channels padded to 4 becomes a (KH x 1) conv over its input's window columns (padded
    along the width with the zero point, as NCHW planes where a transpose makes the NHWC input); bit for
    bit the same output, the zero point fold after it too; the extra taps, which read real pixels, weigh
    the weights' zero point. Where it does not pay the conv is left alone."""
    from aotc.graph.interpret import run_graph
    from aotc.graph.ir import Graph, Value
    from aotc.graph.passes import fold_input_zero_point, window_columns_as_channels

    rng = np.random.default_rng(4)
    info = np.iinfo(dtype)
    for (h, w, c), k, stride, pads, taps in WINDOW_COLUMN_CASES:
        image = rng.integers(info.min, info.max + 1, (1, h, w, c)).astype(dtype)
        weight = rng.integers(-127, 128, (16, k, k, c)).astype(np.int8)
        bias = rng.integers(-5000, 5000, 16).astype(np.int32)
        out_h = (h + pads[0] + pads[2] - k) // stride + 1
        out_w = (w + pads[1] + pads[3] - k) // stride + 1
        attrs = {
            "strides": (stride, stride),
            "pads": pads,
            "dilations": (1, 1),
            "input_scale": 0.02,
            "input_zero_point": zero_point,
            "weight_scales": tuple(0.0005 * (1 + o % 5) for o in range(16)),
            "weight_zero_points": (weight_zero_point,),
            "activation": "NONE",
            "output_scale": 0.1,
            "output_zero_point": 4,
            "out_dtype": "uint8",
        }
        out = Value("y", TensorType((1, out_h, out_w, 16), "uint8"))
        consts = [
            Value("w", TensorType(weight.shape, "int8"), data=weight),
            Value("b", TensorType((16,), "int32"), data=bias),
        ]
        feed = np.ascontiguousarray(image.transpose(0, 3, 1, 2)) if nchw else image
        x = Value("x", TensorType(feed.shape, dtype))
        nodes = []
        conv_input = x
        if nchw:
            conv_input = Value("t", TensorType(image.shape, dtype))
            nodes.append(Node("transpose", [x], [conv_input], {"perm": (0, 2, 3, 1)}, name="to_nhwc"))
            conv_input.producer = nodes[0]
        node = Node("qnn.conv2d_nhwc", [conv_input, *consts], [out], attrs, name="stem")
        out.producer = node
        expected = run_graph(Graph([x], [out], [*nodes, node]), {"x": feed})["y"]
        graph = window_columns_as_channels(Graph([x], [out], [*nodes, node]))
        what = f"{(h, w, c)} {k}x{k}/{stride} {dtype} {'nchw' if nchw else 'nhwc'}"
        if taps is None:
            assert [n.op for n in graph.nodes] == [n.op for n in nodes] + ["qnn.conv2d_nhwc"], what
            continue
        gather = graph.nodes[-2]
        assert gather.op == "window_columns" and gather.attrs["taps"] == taps, what
        assert node.inputs[1].type.shape == (16, k, 1, taps * c) and node.attrs["strides"] == (stride, 1), (
            what
        )
        if nchw:  # the planes are padded, then transposed
            assert [n.op for n in graph.nodes] == ["transpose", "pad", "transpose", "window_columns", node.op]
        np.testing.assert_array_equal(run_graph(graph, {"x": feed})["y"], expected, err_msg=what)
        graph = fold_input_zero_point(graph)
        np.testing.assert_array_equal(run_graph(graph, {"x": feed})["y"], expected, err_msg=what)


def test_depthwise_taps_padded_to_the_dot_product_depth_give_identical_results():
    """A depthwise conv's 3-tap window rows get a fourth tap of weight 0 (the weights' zero point) and one
    more column of padding on the right, with dilations and strides; same output shape, bit for bit."""
    from aotc.graph.interpret import run_graph
    from aotc.graph.ir import Graph
    from aotc.graph.passes import fold_input_zero_point, pad_depthwise_taps

    checked = set()
    for name, op, inputs, attrs, expected in integer_cases(np.random.default_rng(3)):
        if op != "qnn.depthwise_conv2d_nhwc":
            continue
        x, node, out = one_node_graph(name, op, inputs, attrs, expected)
        graph = pad_depthwise_taps(Graph([x], [out], [node]))
        padded = node.inputs[1].type.shape[2] == 4
        assert padded == (attrs.get("depth_multiplier", 1) == 1), name
        np.testing.assert_array_equal(run_graph(graph, {"x": inputs[0]})["y"], expected, err_msg=name)
        graph = fold_input_zero_point(graph)
        np.testing.assert_array_equal(run_graph(graph, {"x": inputs[0]})["y"], expected, err_msg=name)
        checked.add((padded, str(inputs[1].dtype)))
    assert checked == {(True, "int8"), (True, "uint8"), (False, "int8")}


# ----------------------------------------------------------------------------- float-based kernels


def srdhm16(a, b: int):
    """gemmlowp SaturatingRoundingDoublingHighMul on int16."""
    ab = np.asarray(a, np.int64) * b
    v = ab + np.where(ab >= 0, 1 << 14, 1 - (1 << 14))
    q = np.sign(v) * (np.abs(v) // (1 << 15))
    return np.where((np.asarray(a) == -32768) & (b == -32768), 32767, q)


def sdhm16(a, b):
    """SaturatingDoublingHighMul on int16 (truncating)."""
    ab = np.asarray(a, np.int64) * np.asarray(b, np.int64)
    q = np.sign(ab) * (np.abs(ab) // (1 << 15))
    return np.where((np.asarray(a) == -32768) & (np.asarray(b) == -32768), 32767, q)


def downscale_to_int16(m: int) -> int:
    return 32767 if m >= INT32_MAX - (1 << 15) else (m + (1 << 15)) >> 16


def ref_hard_swish_fixed_point(x, attrs, dtype):
    """reference_ops::HardSwish (int8/uint8): TFLite's 16-bit fixed-point kernel."""
    hires = np.float32(1.0 / 128.0) * np.float32(attrs["input_scale"])
    out_m, out_exp = quantize_multiplier(float(hires / np.float32(attrs["output_scale"])))
    rel_m, rel_exp = quantize_multiplier(float(hires / np.float32(3.0 / 32768.0)))
    out_m16, rel_m16 = downscale_to_int16(out_m), downscale_to_int16(rel_m)
    hi = (x.astype(np.int64) - attrs["input_zero_point"]) * 128
    preshift = srdhm16(hi, out_m16)
    r = hi
    if rel_exp > 0:
        r = np.clip(r * (1 << (rel_exp - 1)), -32768, 32767)
    r = srdhm16(r, rel_m16)
    if rel_exp > 0:
        r = np.clip(r * 2, -32768, 32767)
    if rel_exp < 0:
        r = rounding_divide_by_pot(r, -rel_exp)
    r = (r + (1 << 15)) >> 1
    out = rounding_divide_by_pot(sdhm16(r, preshift), -out_exp) + attrs["output_zero_point"]
    info = np.iinfo(dtype)
    return np.clip(out, info.min, info.max).astype(dtype)


def ref_logistic_lut(x, attrs, dtype):
    """LiteRT's int8/uint8 LOGISTIC: a float32 lookup table over every input value."""
    d = np.float32(attrs["input_scale"]) * (x.astype(np.int64) - attrs["input_zero_point"]).astype(np.float32)
    t = np.float32(1) / (np.float32(1) + np.exp(-d))
    q = tfl_round(t * (np.float32(1) / np.float32(attrs["output_scale"]))) + attrs["output_zero_point"]
    info = np.iinfo(dtype)
    return np.clip(q, info.min, info.max).astype(dtype)


def ref_softmax_lut(x, attrs, dtype):
    """LiteRT's int8/uint8 SOFTMAX: exp from a float32 table of input_scale * beta * (max - x)."""
    coef = np.float32(-np.float32(attrs["input_scale"]) * np.float32(attrs["beta"]))
    table = np.exp(coef * np.arange(256, dtype=np.float32)).astype(np.float32)
    xi = x.astype(np.int64)
    e = table[xi.max(axis=-1, keepdims=True) - xi]
    inv = np.float32(1) / (
        e.sum(axis=-1, keepdims=True, dtype=np.float32) * np.float32(attrs["output_scale"])
    )
    q = tfl_round(e * inv) + attrs["output_zero_point"]
    info = np.iinfo(dtype)
    return np.clip(q, info.min, info.max).astype(dtype)


def every_value(dtype, rows=1, rng=None):
    info = np.iinfo(dtype)
    values = np.arange(info.min, info.max + 1).astype(dtype)
    return np.stack([values if rng is None else rng.permutation(values) for _ in range(rows)])


def float_kernel_cases(rng):
    cases = []
    for dtype in ("int8", "uint8"):
        out_zp = -128 if dtype == "int8" else 0
        x = every_value(dtype)
        for i in range(3):
            attrs = {"input_scale": f32(rng.uniform(0.02, 0.12)), "input_zero_point": zero_point(rng, dtype)}
            attrs |= {"output_scale": 1 / 256, "output_zero_point": out_zp, "out_dtype": dtype}
            cases.append(
                (f"logistic_{dtype}_{i}", "qnn.logistic", [x], attrs, ref_logistic_lut(x, attrs, dtype))
            )
            hs = dict(attrs)
            hs |= {"output_scale": f32(attrs["input_scale"] * rng.uniform(0.5, 1.2))}
            hs |= {"output_zero_point": zero_point(rng, dtype)}
            cases.append(
                (
                    f"hard_swish_{dtype}_{i}",
                    "qnn.hard_swish",
                    [x],
                    hs,
                    ref_hard_swish_fixed_point(x, hs, dtype),
                )
            )
            sm = {**attrs, "beta": [1.0, 0.7, 2.0][i], "input_scale": f32(rng.uniform(0.02, 0.2))}
            rows = every_value(dtype, 3, rng)
            cases.append(
                (f"softmax_{dtype}_{i}", "qnn.softmax", [rows], sm, ref_softmax_lut(rows, sm, dtype))
            )
            short = (rng.integers(-25, 25, (2, 5, 10)) + (0 if dtype == "int8" else 128)).astype(dtype)
            cases.append(
                (f"softmax_short_{dtype}_{i}", "qnn.softmax", [short], sm, ref_softmax_lut(short, sm, dtype))
            )
    return cases


def test_float_based_kernels_within_one_lsb_on_every_input_value(tmp_path):
    """Logistic and softmax against LiteRT's float lookup-table kernels within 1 LSB, hard_swish against
    TFLite's fixed-point kernel exactly; every int8 and uint8 input value."""
    cases = float_kernel_cases(np.random.default_rng(1))
    results = compile_ops([c[:4] for c in cases], tmp_path)
    for name, _, _, _, expected in cases:
        assert expected.size < 40 or np.unique(expected).size > 10, f"{name}: degenerate case"
        for what, got in zip(("reference evaluator", "compiled"), results[name]):
            diff = np.abs(got.astype(np.int64) - expected.astype(np.int64))
            assert got.dtype == expected.dtype and diff.max() <= 1, f"{name} ({what}): off by {diff.max()}"
            assert np.mean(diff == 0) >= 0.97, f"{name} ({what}): only {np.mean(diff == 0):.1%} exact"
            assert "hard_swish" not in name or diff.max() == 0, f"{name} ({what}): off by {diff.max()}"


# ----------------------------------------------------------------------------- dtype-generic ops on int8


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_layout_ops_compile_on_quantized_values(dtype, tmp_path):
    rng = np.random.default_rng(2)
    x = qtensor(rng, (2, 3, 6, 5), dtype)
    y = qtensor(rng, (2, 3, 6, 2), dtype)
    idx = np.array([[4, 0], [-1, 2]], np.int32)
    zp = zero_point(rng, dtype)
    cases = [
        ("reshape", "reshape", [x], {"shape": (6, 1, 30)}, x.reshape(6, 1, 30)),
        ("transpose", "transpose", [x], {"perm": (0, 2, 3, 1)}, x.transpose(0, 2, 3, 1)),
        ("concat", "concat", [x, y], {"axis": 3}, np.concatenate([x, y], axis=3)),
        (
            "pad",
            "pad",
            [x],
            {"before": (0, 1, 2, 0), "after": (0, 0, 1, 3), "mode": "constant", "value": zp},
            np.pad(x, ((0, 0), (1, 0), (2, 1), (0, 3)), constant_values=zp),
        ),
        (
            "strided_slice",
            "strided_slice",
            [x],
            {"begin": (1, 2, 0, 4), "end": (2, -1, 6, 0), "strides": (1, -1, 2, -3)},
            x[1:2, 2::-1, 0:6:2, 4:0:-3],
        ),
        ("take", "take", [x, idx], {"axis": 2}, np.take(x, np.where(idx < 0, idx + 6, idx), axis=2)),
    ]
    results = compile_ops([c[:4] for c in cases], tmp_path)
    for name, _, _, _, expected in cases:
        ref, got = results[name]
        assert got.dtype == np.dtype(dtype), name
        np.testing.assert_array_equal(ref, expected, err_msg=f"{name} (reference evaluator)")
        np.testing.assert_array_equal(got, expected, err_msg=f"{name} (compiled)")


# ----------------------------------------------------------------------------- vectorization and speed


def _conv_dag(dtype: str, shape=(1, 56, 56, 64), out_c=64) -> ComputeDAG:
    types = [TensorType(shape, dtype), TensorType((out_c, 3, 3, shape[3]), dtype)]
    if dtype == "float32":
        node = Node("conv2d_nhwc", [], [], {"strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1)})
    else:
        types.append(TensorType((out_c,), "int32"))
        attrs = {
            **W1,
            "input_scale": 0.02,
            "input_zero_point": 3,
            "output_scale": 0.1,
            "output_zero_point": -5,
        }
        attrs |= {
            "weight_scales": tuple(0.001 * (1 + c % 7) for c in range(out_c)),
            "weight_zero_points": (0,),
        }
        attrs |= {"activation": "RELU6", "out_dtype": "int8"}
        node = Node("qnn.conv2d_nhwc", [], [], attrs)
    _, outs = node_compute(node, types)
    return ComputeDAG(outs)


def test_int8_conv_kernel_is_vectorized():
    """The default schedule's int8 conv multiplies and requantizes whole vectors of channels."""
    target = host_target()
    ir = build_llvm_ir(
        [lower(default_schedule(_conv_dag("int8", (1, 8, 8, 32), 32), target), "qconv")], target
    )
    vector_int_ops = re.findall(r"= (mul|add|sub|ashr)(?: nsw)? <(\d+) x i(32|64)>", ir)
    assert any(op == "mul" and bits == "32" and int(lanes) >= 4 for op, lanes, bits in vector_int_ops), ir[
        :2000
    ]
    assert any(op == "ashr" and bits == "64" for op, _, bits in vector_int_ops), (
        "requantize shift is not vectorized"
    )


def test_per_channel_tables_are_computed_once_not_inlined():
    """The per-channel multiplier tables are constant stages: the default schedule stores them in [C]
    buffers (serially: 32 values do not pay for waking the thread pool) and the requantize loop loads
    them, instead of re-evaluating a select tree for every output element."""
    from aotc.ir.printer import func_str

    dag = _conv_dag("int8", (1, 8, 8, 32), 32)
    tables = [op for op in dag.compute_ops if op.tag == "const_table"]
    assert tables and not any(dag.analysis[op].is_strictly_inlineable for op in tables)
    text = func_str(lower(default_schedule(dag, host_target()), "qconv"))
    requant = next(line for line in text.splitlines() if "= int8(" in line)
    assert all(f"{op.name}[" in requant for op in tables) and requant.count("select(") <= 1, requant
    for op in tables:
        loop = text[: text.index(f"{op.name}[")].rsplit("for ", 2)[-2:]
        assert not any("parallel" in line.split("\n")[0] for line in loop), text


@pytest.mark.slow
def test_print_int8_vs_float_conv_speed(tmp_path):
    """1x56x56x64 3x3 conv, 64 output channels, default schedule: int8 (per-channel requantized) vs float."""
    target = host_target()
    rng = np.random.default_rng(0)
    rates = {}
    for dtype in ("float32", "int8"):
        dag = _conv_dag(dtype)
        lib = load_library(
            build_module([lower(default_schedule(dag, target), "k")], target, str(tmp_path / f"{dtype}.so"))
        )
        args = [
            rng.integers(-100, 100, p.shape).astype(p.dtype)
            if p.dtype != "float32"
            else rng.random(p.shape, np.float32)
            for p in dag.placeholders
        ]
        out = np.zeros(dag.outputs[0].shape, dag.outputs[0].dtype)
        run = lib.kernel("k").prepare(*args, out)
        run()
        reps, start = 20, time.perf_counter()
        for _ in range(reps):
            run()
        seconds = (time.perf_counter() - start) / reps
        rates[dtype] = 2 * 56 * 56 * 64 * 64 * 9 / seconds / 1e9
        print(f"{dtype}: {seconds * 1e3:.2f} ms, {rates[dtype]:.1f} GOP/s")
    print(f"int8 / float32: {rates['int8'] / rates['float32']:.2f}")


@pytest.mark.parametrize(
    ("op", "w_shape", "dtype", "bound", "zero_points", "marked"),
    [
        ("qnn.conv2d_nhwc", (4, 3, 3, 8), "int8", 64, (0,), True),
        ("qnn.conv2d_nhwc", (4, 3, 3, 8), "int8", 65, (0,), False),  # one weight past +-64
        ("qnn.depthwise_conv2d_nhwc", (1, 3, 3, 8), "int8", 64, (0,), True),
        ("qnn.dense", (4, 8), "int8", 64, (0,), True),
        ("qnn.dense", (4, 8), "int8", 40, (3,), False),  # a weight zero point: w - 3 is the factor
        ("qnn.dense", (4, 8), "uint8", 64, (0,), False),  # uint8 weights: not vpmaddubsw's signed factor
    ],
)
def test_narrow_weights_are_marked_only_within_64(op, w_shape, dtype, bound, zero_points, marked):
    """mark_narrow_weights: constant int8 weights at zero point 0 whose every value lies within +-64 (the
    bound itself included: 255 * 64 * 2 < 2**15) get NARROW_WEIGHTS; anything else keeps its workload."""
    from aotc.graph.ir import Graph, Value
    from aotc.graph.passes import mark_narrow_weights
    from aotc.te.tensor import NARROW_WEIGHTS

    rng = np.random.default_rng(0)
    w = rng.integers(-bound, bound + 1, w_shape)
    w.flat[0] = bound  # the bound itself occurs
    x = Value("x", TensorType((1, 4, 4, 8) if op != "qnn.dense" else (2, 8), "uint8"))
    weight = Value("w", TensorType(w_shape, dtype), data=(w if dtype == "int8" else w + 64).astype(dtype))
    out = Value("y", TensorType((1,), "uint8"))
    node = Node(op, [x, weight], [out], {"weight_zero_points": zero_points}, name="layer")
    mark_narrow_weights(Graph([x], [out], [node]))
    assert bool(node.attrs.get(NARROW_WEIGHTS)) == marked
    runtime = Node(op, [x, Value("w2", TensorType(w_shape, dtype))], [out], {}, name="runtime_weight")
    mark_narrow_weights(Graph([x], [out], [runtime]))
    assert NARROW_WEIGHTS not in runtime.attrs  # a weight fed at run time is never vouched for
