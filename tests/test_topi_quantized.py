"""Quantized (int8/uint8) operators against numpy re-implementations of TFLite's reference kernels
(python/numpy int64, written independently of the tensor expressions), evaluated by the numpy
reference evaluator and compiled with the default schedule: integer kernels must match exactly;
softmax, logistic and hard_swish within 1 LSB."""

from __future__ import annotations

import math

import numpy as np

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


def rounding_divide_by_pot(x, exponent: int):
    x = np.asarray(x, np.int64)
    mask = (1 << exponent) - 1
    threshold = (mask >> 1) + (x < 0)
    return (x >> exponent) + ((x & mask) > threshold)


def multiply_by_quantized_multiplier(x, multiplier: int, shift: int):
    left, right = max(shift, 0), max(-shift, 0)
    x = np.asarray(x, np.int64) * (1 << left)
    assert np.all((x >= INT32_MIN) & (x <= INT32_MAX)), "int32 overflow in the reference"
    return rounding_divide_by_pot(srdhm(x, multiplier), right)


def per_channel_mbqm(acc, scales):
    """MultiplyByQuantizedMultiplier along the last axis with one scale per channel (or one)."""
    out = np.empty_like(acc, np.int64)
    for c in range(acc.shape[-1]):
        m, s = quantize_multiplier(scales[c if len(scales) > 1 else 0])
        out[..., c] = multiply_by_quantized_multiplier(acc[..., c], m, s)
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
    return finish(per_channel_mbqm(acc, conv_scales(attrs, x.dtype == np.uint8)), attrs)


def ref_dense(inputs, attrs):
    x, w = inputs[:2]
    acc = (x.astype(np.int64) - attrs["input_zero_point"]) @ (
        w.astype(np.int64) - attrs["weight_zero_points"][0]
    ).T
    if len(inputs) > 2:
        acc = acc + inputs[2]
    return finish(per_channel_mbqm(acc, conv_scales(attrs, True)), attrs)


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
