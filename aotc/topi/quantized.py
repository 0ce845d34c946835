"""Quantized (int8/uint8) operators with TFLite's fixed-point arithmetic, and their registrations.

Scales are float attrs; the computes derive TFLite's int32 multipliers and shifts themselves
(QuantizeMultiplier) and apply them as MultiplyByQuantizedMultiplier does, in int64 arithmetic:
SaturatingRoundingDoublingHighMul(x, m) is floor((x*m + 2^30) / 2^31) for the positive multipliers
QuantizeMultiplier makes, and RoundingDivideByPOT(y, r) is y / 2^r rounded half away from zero.

Per-channel multipliers and shifts are small constant tables: a [C] stage whose body is a balanced
select tree over the channel index (log2(C) compares). A table cannot be a graph constant because the
operator contract gives a compute only its node's inputs; the tree keeps the compute self-contained.
The DAG analysis never inlines a table (a compute with branches and no reads): each kernel call fills
the [C] buffer once and the requantize loop loads from it.
Channels with different shifts share one rounding shift S = max(shift): RoundingDivideByPOT(y, r)
equals RoundingDivideByPOT(y * 2^(S-r), S), so only the multiplier and a power-of-two factor vary
per channel and every shift stays a constant (an arithmetic shift, no vector division).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from aotc import te
from aotc.ir.expr import (
    Expr,
    cast,
    const,
    dtype_max,
    dtype_min,
    exp,
    floor,
    maximum,
    minimum,
    ne,
    round_,
    select,
)
from aotc.te.tensor import NARROW_WEIGHTS, Operation
from aotc.topi import winograd
from aotc.topi.elemwise import broadcast_read, broadcast_shape
from aotc.topi.nhwc import conv2d_nhwc, depthwise_conv2d_nhwc, pool2d_nhwc, window_attrs
from aotc.topi.nn import as_pads, reduced_index
from aotc.topi.registry import OpPattern, register

QUANT_DTYPES = ("int8", "uint8")
QUANTIZE_ROUNDING = ("half_away", "half_even")
REQUANTIZE_ROUNDING = ("half_away", "half_up")
REQUANTIZE_MODES = ("fixed_point", "float")
"""How conv, dense, add, mul and mean requantize: TFLite's fixed-point multipliers (the default), or a float32
multiply rounded half to even (onnxruntime's MlasRequantizeOutput, MlasQLinearAdd, MlasQLinearMul,
MlasQLinearGlobalAveragePool on x86; LiteRT's XNNPACK kernels)."""
ACCUMULATOR_DTYPE = "int32"
"""The out_dtype of conv and dense that skips requantization: their result is the int32 accumulator (plus the
bias), as ONNX's ConvInteger and MatMulInteger compute it; no scales are read."""
ACTIVATIONS: dict[str, tuple[float | None, float | None]] = {
    "NONE": (None, None),
    "RELU": (0.0, None),
    "RELU6": (0.0, 6.0),
    "RELU_N1_TO_1": (-1.0, 1.0),
}
# int8 weights within +-64: a pair of products with a uint8 sums to at most 255 * 128 < 2**15
NARROW_BOUND = 64


def f32(v: float) -> float:
    """`v` rounded to float32 (TFLite stores scales as float32)."""
    return float(np.float32(v))


def round_half_away(v: float) -> int:
    """TfLiteRound / std::round on a Python float."""
    return int(math.copysign(math.floor(abs(v) + 0.5), v)) if abs(v) < 2**52 else int(v)


def quantize_multiplier(real: float) -> tuple[int, int]:
    """TFLite QuantizeMultiplier: `real` = m * 2^(shift - 31) with m in [2^30, 2^31), or (0, 0)."""
    if real == 0.0:
        return 0, 0
    if real < 0 or not math.isfinite(real):
        raise te.TEError(f"quantized multiplier must be a positive finite scale, got {real}")
    q, shift = math.frexp(real)
    fixed = round_half_away(q * 2**31)
    if fixed == 2**31:
        fixed //= 2
        shift += 1
    if shift < -31:
        return 0, 0
    if shift > 30:
        raise te.TEError(f"quantized multiplier {real} is too large (shift {shift} > 30)")
    return fixed, shift


def activation_range(activation: str, scale: float, zero_point: int, dtype: str) -> tuple[int, int]:
    """CalculateActivationRangeQuantized: the fused activation's bounds in the output's quantized domain."""
    if activation not in ACTIVATIONS:
        raise te.TEError(f"unknown fused activation {activation!r}; known: {', '.join(ACTIVATIONS)}")
    lo, hi = int(dtype_min(dtype)), int(dtype_max(dtype))
    low, high = ACTIVATIONS[activation]

    def quantize(v: float) -> int:
        return zero_point + round_half_away(float(np.float32(v) / np.float32(scale)))

    if low is not None:
        lo = max(lo, quantize(low))
    if high is not None:
        hi = min(hi, quantize(high))
    return lo, hi


def const_table(values: Sequence[int | float], dtype: str, name: str) -> Operation:
    """A [len(values)] tensor of constants: a balanced select tree over the index."""

    def tree(i: Expr, lo: int, hi: int) -> Expr:
        if hi - lo == 1:
            return const(values[lo], dtype)
        mid = (lo + hi) // 2
        return select(i < mid, tree(i, lo, mid), tree(i, mid, hi))

    return te.compute((len(values),), lambda c: tree(c, 0, len(values)), name, tag="const_table")


class Tables:
    """Where per-channel tables come from: `given` inputs of the node (taken in order: a graph pass made
    them constants, `requantize_tables`), else select trees; `made` collects the values of each table."""

    def __init__(self, given: Sequence[Operation] = ()):
        self.given = list(given)
        self.made: list[np.ndarray] = []

    def table(self, values: list, dtype: str, name: str) -> Operation:
        self.made.append(np.asarray(values, dtype))
        if not self.given:
            return const_table(values, dtype, name)
        t = self.given.pop(0)
        if tuple(t.shape) != (len(values),) or t.dtype != dtype:
            raise te.TEError(
                f"{name}: expected a [{len(values)}] {dtype} table, got {list(t.shape)} {t.dtype}"
            )
        return t


class PerChannel:
    """Constants that are either one value or one per channel (a table read at the channel index)."""

    def __init__(
        self,
        values: Sequence[int | float],
        dtype: str,
        name: str,
        channels: int | None = None,
        tables: Tables | None = None,
    ):
        values = list(values)
        if channels is not None and len(values) not in (1, channels):
            raise te.TEError(f"{name}: expected 1 or {channels} values, got {len(values)}")
        self.dtype = dtype
        self.uniform = all(v == values[0] for v in values)
        self.value = values[0]
        self.table = None if self.uniform else (tables or Tables()).table(values, dtype, name)

    def at(self, channel: Expr | None) -> Expr:
        if self.table is None:
            return const(self.value, self.dtype)
        return self.table[channel]


class FixedPointMultiplier:
    """MultiplyByQuantizedMultiplier(x, QuantizeMultiplier(scale[c])) for one scale or one per channel."""

    def __init__(
        self, scales: Sequence[float], name: str, channels: int | None = None, tables: Tables | None = None
    ):
        pairs = [quantize_multiplier(s) for s in scales]
        rights = [max(-shift, 0) for _, shift in pairs]
        self.shift = max(rights)
        mults = [m << max(shift, 0) for m, shift in pairs]
        posts = [1 << (self.shift - r) for r in rights]
        # 32-bit factors where they fit: a product of two sign-extended int32 values is one vpmuldq, where a
        # general int64 product takes vpmullq (several times the cost, in every requantizing kernel)
        self.mult = PerChannel(mults, _int_dtype(mults), f"{name}_mult", channels, tables)
        self.post = PerChannel(posts, _int_dtype(posts), f"{name}_post", channels, tables)

    def apply(self, x: Expr, channel: Expr | None = None, half_up: bool = False) -> Expr:
        """int32 result of the int32 (or narrower) value `x`.

        The final shift rounds half away from zero (TFLite's reference kernels), or half up as LiteRT's
        builtin kernels do on x86 (`half_up`: ruy's conv and fully connected, the depthwise conv).
        """
        y = (cast("int64", x) * cast("int64", self.mult.at(channel)) + (1 << 30)) // (1 << 31)
        if self.shift == 0:
            return cast("int32", y)
        if self.mult.dtype == "int32":
            # |x * m| < 2^62 with m < 2^31: the high half fits int32, and the next product is 32 x 32 bits
            y = cast("int64", cast("int32", y))
        if not self.post.uniform or self.post.value != 1:
            y = y * cast("int64", self.post.at(channel))
        half = const(1 << (self.shift - 1), "int64")
        if not half_up:
            half = half - select(y < 0, const(1, "int64"), const(0, "int64"))
        rounded = (y + half) // (1 << self.shift)
        return cast("int32", rounded)


def _int_dtype(values: Sequence[int]) -> str:
    """int32 where every value fits it, else int64."""
    return "int32" if all(-(1 << 31) <= v < (1 << 31) for v in values) else "int64"


class FloatMultiplier:
    """round_half_even(float32(x) * scale[c]) for one scale or one per channel: onnxruntime's requantization
    (`requantize: float`), whose result is a float holding an integer."""

    def __init__(
        self, scales: Sequence[float], name: str, channels: int | None = None, tables: Tables | None = None
    ):
        self.scale = PerChannel([f32(s) for s in scales], "float32", f"{name}_scale", channels, tables)

    def apply(self, x: Expr, channel: Expr | None = None) -> Expr:
        return round_(cast("float32", x) * self.scale.at(channel))


def requantize_mode(attrs: dict, what: str) -> str:
    mode = attrs.get("requantize", "fixed_point")
    if mode not in REQUANTIZE_MODES:
        raise te.TEError(f"{what}: requantize must be one of {', '.join(REQUANTIZE_MODES)}, got {mode!r}")
    return mode


def rounding_divide_by_pot(x: Expr, exponent: int) -> Expr:
    """gemmlowp RoundingDivideByPOT on an integer expression: x / 2^exponent rounded half away from zero."""
    if exponent == 0:
        return x
    one, zero = const(1, x.dtype), const(0, x.dtype)
    return (x + (1 << (exponent - 1)) - select(x < 0, one, zero)) // (1 << exponent)


def clamp_cast(v: Expr, lo: int, hi: int, dtype: str) -> Expr:
    return cast(dtype, minimum(maximum(v, const(lo, v.dtype)), const(hi, v.dtype)))


def round_half_away_expr(v: Expr) -> Expr:
    """std::round on a float expression, exact for every float (the fraction v - trunc(v) is exact)."""
    zero, one = const(0.0, v.dtype), const(1.0, v.dtype)
    t = select(v >= zero, floor(v), -floor(-v))
    f = v - t
    return t + select(f >= 0.5, one, select(f <= -0.5, -one, zero))


def _out_dtype(attrs: dict, what: str) -> str:
    dtype = attrs.get("out_dtype", "int8")
    if dtype not in QUANT_DTYPES:
        raise te.TEError(f"{what}: out_dtype must be int8 or uint8, got {dtype!r}")
    return dtype


def _check_quantized(x: Operation, what: str) -> None:
    if x.dtype not in QUANT_DTYPES:
        raise te.TEError(f"{what}: input must be int8 or uint8, got {x.dtype}")


def _output_stage(
    acc: Operation,
    attrs: dict,
    scales: Sequence[float],
    channel_axis: int | None,
    name: str,
    bias: Operation | None = None,
    half_up: bool = False,
    tables: Tables | None = None,
) -> Operation:
    """requantize an int32 accumulator: (acc + bias[c]) * scale[c] + output_zero_point, clamped to the
    activation's range, cast to out_dtype (the multiply as `requantize` says)."""
    out_dtype = _out_dtype(attrs, name)
    out_scale, out_zp = attrs["output_scale"], int(attrs["output_zero_point"])
    channels = acc.shape[channel_axis] if channel_axis is not None else None
    lo, hi = activation_range(attrs.get("activation", "NONE"), out_scale, out_zp, out_dtype)
    if requantize_mode(attrs, name) == "float":
        mult = FloatMultiplier(scales, f"{name}_requant", channels, tables)

        def rescale(v: Expr, c: Expr | None) -> Expr:
            return clamp_cast(mult.apply(v, c) + float(out_zp), lo, hi, out_dtype)
    else:
        mult = FixedPointMultiplier(scales, f"{name}_requant", channels, tables)

        def rescale(v: Expr, c: Expr | None) -> Expr:
            return clamp_cast(mult.apply(v, c, half_up) + out_zp, lo, hi, out_dtype)

    def body(*i):
        c = i[channel_axis] if channel_axis is not None else None
        v = acc[i]
        if bias is not None:
            v = v + bias[c]
        return rescale(v, c)

    return te.compute(acc.shape, body, name, tag="requantize")


def _accumulator_output(acc: Operation, attrs: dict, name: str, bias: Operation | None) -> Operation:
    """The int32 accumulator as the result (out_dtype int32), the bias [C] added along the last axis."""
    activation = attrs.get("activation", "NONE")
    if activation != "NONE":
        raise te.TEError(f"{name}: out_dtype int32 has no fused activation, got {activation!r}")
    if bias is None:
        return acc
    if bias.dtype != ACCUMULATOR_DTYPE:
        raise te.TEError(f"{name}: the bias must be int32, got {bias.dtype}")
    return te.compute(acc.shape, lambda *i: acc[i] + bias[i[-1]], f"{name}_bias", tag="elemwise")


def _conv_scales(attrs: dict, out_channels: int, per_tensor_in_float: bool) -> list[float]:
    """Effective scales input_scale * weight_scale[c] / output_scale, as TFLite's Prepare computes them:
    in double, except the legacy per-tensor path that multiplies input and weight scales in float32."""
    in_scale, out_scale = f32(attrs["input_scale"]), f32(attrs["output_scale"])
    w_scales = [f32(s) for s in _as_tuple(attrs["weight_scales"])]
    if len(w_scales) not in (1, out_channels):
        raise te.TEError(f"weight_scales: expected 1 or {out_channels} values, got {len(w_scales)}")
    if attrs.get("requantize") == "float":  # onnxruntime: X_scale * W_scale[c] / Y_scale in float32
        return [f32(np.float32(in_scale) * np.float32(w) / np.float32(out_scale)) for w in w_scales]
    if per_tensor_in_float and len(w_scales) == 1:
        return [float(np.float32(in_scale) * np.float32(w_scales[0])) / out_scale]
    return [in_scale * w / out_scale for w in w_scales]


def _output_scales(op: str, attrs: dict, out_channels: int, data_dtype: str) -> list[float]:
    """The requantization scales of conv or dense `op` (its compute and `requantize_tables` agree on
    them): TFLite multiplies per-tensor scales in float32 for dense layers and uint8 convs."""
    return _conv_scales(attrs, out_channels, per_tensor_in_float=op == "qnn.dense" or data_dtype == "uint8")


def _as_tuple(v) -> tuple:
    return tuple(v) if isinstance(v, (tuple, list)) else (v,)


def _centered(v: Expr, zero_point: int) -> Expr:
    v = cast("int32", v)
    return v - zero_point if zero_point else v


def _quantized_term(in_zp: int, w_zp: int) -> Callable[[Expr, Expr], Expr]:
    def term(a: Expr, b: Expr) -> Expr:
        return _centered(a, in_zp) * _centered(b, w_zp)

    return term


MAC_OPS = ("qnn.conv2d_nhwc", "qnn.depthwise_conv2d_nhwc", "qnn.dense")


def mac_zero_point(op: str, dtype: str, same_sign_as: str | None = None) -> int:
    """The zero point a conv or dense layer with `input_zero_point_in_bias` still subtracts from its
    `dtype` input: -128 for int8 (an int8 input), whose factor x + 128 is then the uint8 that a dot-product
    instruction reads (vpdpbusd, usdot: uint8 x int8; docs/int8.md), else 0. With `same_sign_as` (the
    weight's dtype, for a target whose forms read factors of one signedness: sdot/udot) the factor takes
    the weight's signedness instead: 0 where the dtypes match, else x + 128 (int8) or x - 128 (uint8)."""
    if op not in MAC_OPS:
        return 0
    if same_sign_as is None:
        return -128 if dtype == "int8" else 0
    if dtype == same_sign_as:
        return 0
    return -128 if dtype == "int8" else 128


def _mac_input_zero_point(attrs: dict, op: str, dtype: str) -> int:
    """The input zero point the multiply-accumulate subtracts: the node's `mac_zero_point` (else the default
    `mac_zero_point`) when the graph folded -(input_zero_point - m) * sum(weight) into the bias
    (`input_zero_point_in_bias`)."""
    if not attrs.get("input_zero_point_in_bias"):
        return int(attrs["input_zero_point"])
    return int(attrs.get("mac_zero_point", mac_zero_point(op, dtype)))


def _weight_zero_point(attrs: dict, what: str) -> int:
    zps = {int(z) for z in _as_tuple(attrs.get("weight_zero_points", (0,)))}
    if len(zps) > 1:
        raise te.TEError(f"{what}: per-channel weight_zero_points must all be equal, got {sorted(zps)}")
    return zps.pop()


def _mark_narrow(acc: Operation, attrs: dict) -> None:
    """The accumulation of a layer the graph marked NARROW_WEIGHTS carries the mark (ir/dot.py's maddubs)."""
    if attrs.get(NARROW_WEIGHTS):
        acc.attrs[NARROW_WEIGHTS] = True


def qnn_conv(inputs: Sequence[Operation], attrs: dict, depthwise: bool) -> Operation:
    data, weight = inputs[:2]
    what = "qnn.depthwise_conv2d_nhwc" if depthwise else "qnn.conv2d_nhwc"
    _check_quantized(data, what)
    _check_quantized(weight, what)
    in_zp = int(attrs["input_zero_point"])
    out_channels = weight.shape[3] if depthwise else weight.shape[0]
    term = _quantized_term(_mac_input_zero_point(attrs, what, data.dtype), _weight_zero_point(attrs, what))
    name = what.replace(".", "_")
    if depthwise:
        acc = depthwise_conv2d_nhwc(
            data,
            weight,
            window_attrs(attrs),
            attrs.get("depth_multiplier", 1),
            acc_dtype="int32",
            pad_value=in_zp,
            term=term,
            name=f"{name}_acc",
        )
    else:
        groups = data.shape[3] // weight.shape[3] if weight.shape[3] else 0
        acc = conv2d_nhwc(
            data,
            weight,
            window_attrs(attrs),
            groups=groups,
            acc_dtype="int32",
            pad_value=in_zp,
            term=term,
            name=f"{name}_acc",
        )
    _mark_narrow(acc, attrs)
    bias = inputs[2] if len(inputs) > 2 else None
    if attrs.get("out_dtype") == ACCUMULATOR_DTYPE:
        return _accumulator_output(acc, attrs, name, bias)
    scales = _output_scales(what, attrs, out_channels, data.dtype)
    tables = Tables(inputs[3:]) if attrs.get("requantize_tables") else None
    return _output_stage(acc, attrs, scales, 3, name, bias, half_up=True, tables=tables)


@register("qnn.conv2d_nhwc", OpPattern.OUT_ELEMWISE_FUSABLE)
def _qnn_conv2d(inputs, attrs):
    """x NHWC, w OHWI (int8/uint8), optional int32 bias [O]; attrs: strides, pads, dilations,
    input_scale, input_zero_point, weight_scales, weight_zero_points, output_scale, output_zero_point,
    activation, out_dtype; input_zero_point_in_bias (the bias already holds -input_zero_point * sum(w),
    so the multiply-accumulate skips the subtraction; padding still reads input_zero_point); requantize
    (one of REQUANTIZE_MODES). out_dtype int32 (ACCUMULATOR_DTYPE) skips requantization: the result is the
    int32 accumulator plus the bias, and the scales and output zero point are not read."""
    return [qnn_conv(inputs, attrs, depthwise=False)]


@register("qnn.conv2d_winograd_nhwc", OpPattern.OUT_ELEMWISE_FUSABLE)
def _qnn_conv2d_winograd(inputs, attrs):
    """qnn.conv2d_nhwc of a 3x3 stride-1 conv whose weight zero point is 0, from int16 weights U [a, a, C,
    O] (aotc.topi.winograd.integer_transform_weight of the OIHW weights for tile `tile`); attrs as
    qnn.conv2d_nhwc's plus `tile`. Bit-exact with the direct conv (the same int32 sums) where every sum
    stays below aotc.topi.winograd.integer_sum_limit(tile), which the graph pass proves before it makes one."""
    data, u = inputs[:2]
    what = "qnn.conv2d_nhwc"
    _check_quantized(data, what)
    if _weight_zero_point(attrs, what):
        raise te.TEError("qnn.conv2d_winograd_nhwc: the weight zero point must be 0")
    acc = winograd.integer_conv2d_winograd_nhwc(
        data,
        u,
        as_pads(attrs.get("pads", 0)),
        pad_value=int(attrs["input_zero_point"]),
        zero_point=_mac_input_zero_point(attrs, what, data.dtype),
        m=int(attrs["tile"]),
        name="qnn_conv2d_winograd_nhwc_acc",
    )
    bias = inputs[2] if len(inputs) > 2 else None
    name = "qnn_conv2d_nhwc"
    if attrs.get("out_dtype") == ACCUMULATOR_DTYPE:
        return [_accumulator_output(acc, attrs, name, bias)]
    scales = _output_scales(what, attrs, u.shape[3], data.dtype)
    tables = Tables(inputs[3:]) if attrs.get("requantize_tables") else None
    return [_output_stage(acc, attrs, scales, 3, name, bias, half_up=True, tables=tables)]


@register("qnn.depthwise_conv2d_nhwc", OpPattern.OUT_ELEMWISE_FUSABLE)
def _qnn_depthwise_conv2d(inputs, attrs):
    """As qnn.conv2d_nhwc with weight [1, KH, KW, C*M] and depth_multiplier."""
    return [qnn_conv(inputs, attrs, depthwise=True)]


@register("qnn.dense", OpPattern.OUT_ELEMWISE_FUSABLE)
def _qnn_dense(inputs, attrs):
    """x [..., K], w [N, K], optional int32 bias [N] -> [..., N] (TFLite FULLY_CONNECTED); attrs as
    qnn.conv2d_nhwc's without the window."""
    data, weight = inputs[:2]
    _check_quantized(data, "qnn.dense")
    _check_quantized(weight, "qnn.dense")
    n, k = weight.shape
    if data.shape[-1] != k:
        raise te.TEError(f"qnn.dense: input {list(data.shape)} does not fit weight {list(weight.shape)}")
    term = _quantized_term(
        _mac_input_zero_point(attrs, "qnn.dense", data.dtype), _weight_zero_point(attrs, "qnn.dense")
    )
    rk = te.reduce_axis(k, "k")
    lead = data.shape[:-1]

    def body(*i):
        return te.sum(term(data[(*i[:-1], rk.var)], weight[i[-1], rk.var]), rk)

    acc = te.compute((*lead, n), body, "qnn_dense_acc", tag="dense")
    _mark_narrow(acc, attrs)
    bias = inputs[2] if len(inputs) > 2 else None
    if attrs.get("out_dtype") == ACCUMULATOR_DTYPE:
        return [_accumulator_output(acc, attrs, "qnn_dense", bias)]
    scales = _output_scales("qnn.dense", attrs, n, data.dtype)
    tables = Tables(inputs[3:]) if attrs.get("requantize_tables") else None
    return [_output_stage(acc, attrs, scales, acc.ndim - 1, "qnn_dense", bias, half_up=True, tables=tables)]


def requantize_tables(op: str, attrs: dict, out_channels: int, data_dtype: str) -> list[np.ndarray]:
    """The per-channel tables (multipliers, shifts' factors or float scales) that the requantization of a
    conv or dense `op` reads, in the order it takes them as inputs 3... under `requantize_tables: true`;
    empty where every channel shares its constants. A graph pass makes them constants: as select trees
    each kernel call would rebuild them, one compare per tree level and lane (on a 960-channel depthwise
    conv, most of its time)."""
    scales = _output_scales(op, attrs, out_channels, data_dtype)
    tables = Tables()
    if requantize_mode(attrs, op) == "float":
        FloatMultiplier(scales, op, out_channels, tables)
    else:
        FixedPointMultiplier(scales, op, out_channels, tables)
    return tables.made


XNNPACK_CONVERT_RANGE = (2.0**-8, 2.0**7)
"""The int8 -> int8 scale ratios XNNPACK's convert takes; LiteRT runs others on its builtin kernel."""


def _requantize(x: Operation, attrs: dict, name: str, half_up: bool = False) -> Operation:
    """x rescaled to the output's scale and zero point: TFLite's fixed-point multiplier (`half_up`: its last
    shift rounds half up), or XNNPACK's int8 convert under `requantize: float`."""
    _check_quantized(x, name)
    out_dtype = _out_dtype(attrs, name)
    real = f32(attrs["input_scale"]) / f32(attrs["output_scale"])
    in_zp, out_zp = int(attrs["input_zero_point"]), int(attrs["output_zero_point"])
    lo, hi = int(dtype_min(out_dtype)), int(dtype_max(out_dtype))
    ratio = f32(np.float32(attrs["input_scale"]) / np.float32(attrs["output_scale"]))
    xnnpack = x.dtype == out_dtype == "int8" and XNNPACK_CONVERT_RANGE[0] <= ratio <= XNNPACK_CONVERT_RANGE[1]
    if requantize_mode(attrs, name) == "float" and xnnpack:
        # XNNPACK's qs8 convert: a multiplier with 8 fraction bits, lrintf(256 * ratio), rounding half up
        m = int(np.rint(np.float32(256.0) * np.float32(ratio)))

        def body(*i):
            return clamp_cast(((cast("int32", x[i]) - in_zp) * m + 128) // 256 + out_zp, lo, hi, out_dtype)
    else:
        mult = FixedPointMultiplier([real], name)

        def body(*i):
            return clamp_cast(
                mult.apply(cast("int32", x[i]) - in_zp, None, half_up) + out_zp, lo, hi, out_dtype
            )

    return te.compute(x.shape, body, name.replace(".", "_"), tag="requantize")


@register("qnn.quantize", OpPattern.ELEMWISE)
def _qnn_quantize(inputs, attrs):
    """float32 -> out_dtype: round(x / output_scale) + output_zero_point, clamped; `rounding` is
    "half_away" (from zero: TFLite, the default) or "half_even" (ONNX QuantizeLinear).
    An int8/uint8 input (TFLite QUANTIZE int -> int) is requantized (`_requantize`), `rounding` "half_away"
    (TFLite's reference kernel, the default) or "half_up" (LiteRT's builtin kernel on x86)."""
    x = inputs[0]
    if x.dtype in QUANT_DTYPES:
        rounding = attrs.get("rounding", "half_away")
        if rounding not in REQUANTIZE_ROUNDING:
            raise te.TEError(
                f"qnn.quantize: an integer input's rounding must be one of {', '.join(REQUANTIZE_ROUNDING)}, "
                f"got {rounding!r}"
            )
        return [_requantize(x, attrs, "qnn.quantize", half_up=rounding == "half_up")]
    if x.dtype != "float32":
        raise te.TEError(f"qnn.quantize: input must be float32, int8 or uint8, got {x.dtype}")
    out_dtype = _out_dtype(attrs, "qnn.quantize")
    scale, zp = f32(attrs["output_scale"]), int(attrs["output_zero_point"])
    lo, hi = float(dtype_min(out_dtype)), float(dtype_max(out_dtype))
    rounding = attrs.get("rounding", "half_away")
    if rounding not in QUANTIZE_ROUNDING:
        raise te.TEError(
            f"qnn.quantize: rounding must be one of {', '.join(QUANTIZE_ROUNDING)}, got {rounding!r}"
        )
    round_fn = round_half_away_expr if rounding == "half_away" else round_

    def body(*i):
        q = round_fn(x[i] / scale) + float(zp)
        return cast(out_dtype, minimum(maximum(q, const(lo)), const(hi)))

    return [te.compute(x.shape, body, "qnn_quantize", tag="elemwise")]


@register("qnn.dequantize", OpPattern.ELEMWISE)
def _qnn_dequantize(inputs, attrs):
    """int8/uint8 -> float32: (x - zero_point[c]) * scale[c] along `axis` (one value: per tensor)."""
    x = inputs[0]
    _check_quantized(x, "qnn.dequantize")
    scales = [f32(s) for s in _as_tuple(attrs["scale"])]
    zps = [int(z) for z in _as_tuple(attrs["zero_point"])]
    axis = attrs.get("axis", -1) % max(x.ndim, 1)
    channels = x.shape[axis] if x.ndim else 1
    scale = PerChannel(scales, "float32", "qnn_dequantize_scale", channels if len(scales) > 1 else None)
    zp = PerChannel(zps, "int32", "qnn_dequantize_zp", channels if len(zps) > 1 else None)

    def body(*i):
        c = i[axis] if x.ndim else None
        return cast("float32", cast("int32", x[i]) - zp.at(c)) * scale.at(c)

    return [te.compute(x.shape, body, "qnn_dequantize", tag="elemwise")]


@register("qnn.requantize", OpPattern.ELEMWISE)
def _qnn_requantize(inputs, attrs):
    """attrs: input_scale, input_zero_point, output_scale, output_zero_point, out_dtype."""
    return [_requantize(inputs[0], attrs, "qnn.requantize")]


ADD_LEFT_SHIFT = 20


@register("qnn.add", OpPattern.BROADCAST)
def _qnn_add(inputs, attrs):
    """TFLite int8/uint8 ADD: both inputs rescaled to twice the larger input scale at 2^20 resolution,
    summed, then rescaled to the output (numpy broadcasting); `requantize: float` adds as onnxruntime's
    QLinearAdd does instead."""
    a, b = inputs
    _check_quantized(a, "qnn.add")
    _check_quantized(b, "qnn.add")
    out_dtype = _out_dtype(attrs, "qnn.add")
    if requantize_mode(attrs, "qnn.add") == "float":
        return [_float_add(a, b, attrs, out_dtype)]
    sa, sb, so = f32(attrs["a_scale"]), f32(attrs["b_scale"]), f32(attrs["output_scale"])
    twice_max = 2.0 * max(sa, sb)
    ma = FixedPointMultiplier([sa / twice_max], "qnn_add_a")
    mb = FixedPointMultiplier([sb / twice_max], "qnn_add_b")
    mo = FixedPointMultiplier([twice_max / ((1 << ADD_LEFT_SHIFT) * so)], "qnn_add_out")
    za, zb, zo = int(attrs["a_zero_point"]), int(attrs["b_zero_point"]), int(attrs["output_zero_point"])
    lo, hi = activation_range(attrs.get("activation", "NONE"), so, zo, out_dtype)
    shape = broadcast_shape(a.shape, b.shape)

    def body(*i):
        va = ma.apply((cast("int32", broadcast_read(a, i)) - za) * (1 << ADD_LEFT_SHIFT))
        vb = mb.apply((cast("int32", broadcast_read(b, i)) - zb) * (1 << ADD_LEFT_SHIFT))
        return clamp_cast(mo.apply(va + vb) + zo, lo, hi, out_dtype)

    return [te.compute(shape, body, "qnn_add", tag="broadcast")]


def _float_add(a: Operation, b: Operation, attrs: dict, out_dtype: str) -> Operation:
    """MlasQLinearAdd: round_half_even((a - za) * (sa / so) + (b - zb) * (sb / so)) + zo in float32."""
    so = f32(attrs["output_scale"])
    ra = f32(np.float32(attrs["a_scale"]) / np.float32(so))
    rb = f32(np.float32(attrs["b_scale"]) / np.float32(so))
    za, zb, zo = int(attrs["a_zero_point"]), int(attrs["b_zero_point"]), int(attrs["output_zero_point"])
    lo, hi = activation_range(attrs.get("activation", "NONE"), so, zo, out_dtype)

    def body(*i):
        va = cast("float32", cast("int32", broadcast_read(a, i)) - za) * ra
        vb = cast("float32", cast("int32", broadcast_read(b, i)) - zb) * rb
        q = round_(va + vb) + float(zo)
        return cast(out_dtype, minimum(maximum(q, const(float(lo))), const(float(hi))))

    return te.compute(broadcast_shape(a.shape, b.shape), body, "qnn_add", tag="broadcast")


@register("qnn.mul", OpPattern.BROADCAST)
def _qnn_mul(inputs, attrs):
    """TFLite int8/uint8 MUL: (a - za) * (b - zb) rescaled by a_scale * b_scale / output_scale (numpy
    broadcasting); `requantize: float` as XNNPACK's qs8 multiply, float32 rounded half to even."""
    a, b = inputs
    _check_quantized(a, "qnn.mul")
    _check_quantized(b, "qnn.mul")
    out_dtype = _out_dtype(attrs, "qnn.mul")
    sa, sb, so = f32(attrs["a_scale"]), f32(attrs["b_scale"]), f32(attrs["output_scale"])
    za, zb, zo = int(attrs["a_zero_point"]), int(attrs["b_zero_point"]), int(attrs["output_zero_point"])
    lo, hi = activation_range(attrs.get("activation", "NONE"), so, zo, out_dtype)
    if requantize_mode(attrs, "qnn.mul") == "float":
        # both peers compute the ratio in float32, in this order: a_scale * b_scale / output_scale;
        # onnxruntime's QLinearMul adds the zero point before rounding (1 LSB apart, at most, near a tie)
        mult = FloatMultiplier([f32(np.float32(sa) * np.float32(sb) / np.float32(so))], "qnn_mul")

        def rescale(prod: Expr) -> Expr:
            return clamp_cast(mult.apply(prod) + float(zo), lo, hi, out_dtype)
    else:
        fixed = FixedPointMultiplier([sa * sb / so], "qnn_mul")

        def rescale(prod: Expr) -> Expr:
            return clamp_cast(fixed.apply(prod) + zo, lo, hi, out_dtype)

    def body(*i):
        prod = (cast("int32", broadcast_read(a, i)) - za) * (cast("int32", broadcast_read(b, i)) - zb)
        return rescale(prod)

    return [te.compute(broadcast_shape(a.shape, b.shape), body, "qnn_mul", tag="broadcast")]


def _qnn_pool(inputs, attrs, kind: str) -> Operation:
    x = inputs[0]
    name = f"qnn.{kind}_pool2d_nhwc"
    _check_quantized(x, name)
    out_dtype = _out_dtype({"out_dtype": attrs.get("out_dtype", x.dtype)}, name)
    lo, hi = activation_range(
        attrs.get("activation", "NONE"), attrs["output_scale"], int(attrs["output_zero_point"]), out_dtype
    )

    def rounded_mean(total: Expr, count: Expr) -> Expr:
        half = count // 2
        q = select(total > 0, _trunc_div(total + half, count), _trunc_div(total - half, count))
        return clamp_cast(q, lo, hi, out_dtype)

    pooled = pool2d_nhwc(
        x,
        kind,
        attrs["kernel"],
        attrs.get("strides", 1),
        attrs.get("pads", 0),
        name=name.replace(".", "_"),
        finish=rounded_mean,
    )
    if kind == "avg":
        return pooled
    return te.compute(pooled.shape, lambda *i: clamp_cast(pooled[i], lo, hi, out_dtype), f"{pooled.name}_act")


def _trunc_div(a: Expr, b: Expr) -> Expr:
    """C integer division (truncation toward zero) for a positive divisor."""
    q = a // b
    zero = const(0, a.dtype)
    return select(a < zero, q + select(ne(a % b, zero), const(1, a.dtype), zero), q)


@register("qnn.avg_pool2d_nhwc", OpPattern.OUT_ELEMWISE_FUSABLE)
def _qnn_avg_pool(inputs, attrs):
    """attrs: kernel, strides, pads, activation, input/output scale and zero point (equal in TFLite),
    out_dtype; the window sum over taps inside the input, divided by their count rounding half away."""
    return [_qnn_pool(inputs, attrs, "avg")]


@register("qnn.max_pool2d_nhwc", OpPattern.OUT_ELEMWISE_FUSABLE)
def _qnn_max_pool(inputs, attrs):
    return [_qnn_pool(inputs, attrs, "max")]


@register("qnn.mean", OpPattern.COMM_REDUCE)
def _qnn_mean(inputs, attrs):
    """TFLite's integer MEAN (reference_integer_ops::Mean): sum(x - input_zero_point) rescaled by
    input_scale / output_scale, divided by the count rounding half away from zero, + output_zero_point.
    `requantize: float`: onnxruntime's QLinearGlobalAveragePool (x86) instead, the sum times the float32
    input_scale / (output_scale * count) rounded half to even."""
    x = inputs[0]
    _check_quantized(x, "qnn.mean")
    out_dtype = _out_dtype({"out_dtype": attrs.get("out_dtype", x.dtype)}, "qnn.mean")
    axes = sorted({int(a) % x.ndim for a in _as_tuple(attrs["axes"])})
    keepdims = bool(attrs.get("keepdims", False))
    in_zp, out_zp = int(attrs["input_zero_point"]), int(attrs["output_zero_point"])
    count = math.prod(x.shape[a] for a in axes)
    raxes = {a: te.reduce_axis(x.shape[a], f"k{a}") for a in axes}
    kept = [d for d in range(x.ndim) if d not in raxes]
    out_shape = (
        tuple(1 if d in raxes else x.shape[d] for d in range(x.ndim))
        if keepdims
        else tuple(x.shape[d] for d in kept)
    )

    def source(i):
        return reduced_index(x.ndim, raxes, keepdims, i)

    total = te.compute(
        out_shape,
        lambda *i: te.sum(cast("int32", x[source(i)]) - in_zp, list(raxes.values())),
        "qnn_mean_sum",
        tag="reduce_sum",
    )
    lo, hi = int(dtype_min(out_dtype)), int(dtype_max(out_dtype))
    if requantize_mode(attrs, "qnn.mean") == "float":
        in_scale, out_scale = np.float32(attrs["input_scale"]), np.float32(attrs["output_scale"])
        scale = f32(in_scale / (out_scale * np.float32(count)))

        def body(*i):
            return clamp_cast(round_(cast("float32", total[i]) * scale) + float(out_zp), lo, hi, out_dtype)
    else:
        mult = FixedPointMultiplier([f32(attrs["input_scale"]) / f32(attrs["output_scale"])], "qnn_mean")
        half = const(count // 2, "int32")
        n = const(count, "int32")

        def body(*i):
            v = mult.apply(total[i])
            q = select(v > 0, _trunc_div(v + half, n), _trunc_div(v - half, n))
            return clamp_cast(q + out_zp, lo, hi, out_dtype)

    return [te.compute(out_shape, body, "qnn_mean", tag="elemwise")]


def _float_requantize_out(v: Expr, attrs: dict, out_dtype: str) -> Expr:
    """TFLite's lookup-table quantization of a float result: round(v / output_scale) + zero point, clamped."""
    inv = f32(1.0 / np.float32(attrs["output_scale"]))
    q = round_half_away_expr(v * inv) + float(int(attrs["output_zero_point"]))
    lo, hi = float(dtype_min(out_dtype)), float(dtype_max(out_dtype))
    return cast(out_dtype, minimum(maximum(q, const(lo)), const(hi)))


def _dequantized(x: Operation, attrs: dict, i) -> Expr:
    return cast("float32", cast("int32", x[i]) - int(attrs["input_zero_point"])) * f32(attrs["input_scale"])


@register("qnn.logistic", OpPattern.ELEMWISE)
def _qnn_logistic(inputs, attrs):
    """1 / (1 + exp(-x)) in float32 on the dequantized input, quantized as TFLite's int8 lookup table."""
    x = inputs[0]
    _check_quantized(x, "qnn.logistic")
    out_dtype = _out_dtype({"out_dtype": attrs.get("out_dtype", x.dtype)}, "qnn.logistic")

    def body(*i):
        d = _dequantized(x, attrs, i)
        return _float_requantize_out(1.0 / (exp(-d) + 1.0), attrs, out_dtype)

    return [te.compute(x.shape, body, "qnn_logistic", tag="elemwise")]


@register("qnn.hard_swish", OpPattern.ELEMWISE)
def _qnn_hard_swish(inputs, attrs):
    """x * relu6(x + 3) / 6 in TFLite's 16-bit fixed point (`HardSwishFixedPoint`), which LiteRT runs on both
    paths; in float32 for the scales that kernel refuses (an output multiplier of 1 or more)."""
    x = inputs[0]
    _check_quantized(x, "qnn.hard_swish")
    out_dtype = _out_dtype({"out_dtype": attrs.get("out_dtype", x.dtype)}, "qnn.hard_swish")
    fixed = HardSwishFixedPoint(attrs)
    if fixed.output_exponent <= 0:
        lo, hi = int(dtype_min(out_dtype)), int(dtype_max(out_dtype))

        def body(*i):
            return clamp_cast(fixed.apply(cast("int32", x[i])), lo, hi, out_dtype)
    else:

        def body(*i):
            d = _dequantized(x, attrs, i)
            relu6 = minimum(maximum(d + 3.0, const(0.0)), const(6.0))
            return _float_requantize_out(d * relu6 * f32(1.0 / 6.0), attrs, out_dtype)

    return [te.compute(x.shape, body, "qnn_hard_swish", tag="elemwise")]


class HardSwishFixedPoint:
    """TFLite's quantized HardSwish (reference_ops::HardSwish, its Prepare's multipliers) in int32 expressions
    holding its 16-bit fixed-point values."""

    # the input on a 2^7 finer scale, rescaled once to the output's scale and once to a [-1, 1] "relu-ish"
    # factor, the two multiplied

    def __init__(self, attrs: dict):
        hires = np.float32(1.0 / 128.0) * np.float32(attrs["input_scale"])
        out_m, self.output_exponent = quantize_multiplier(float(hires / np.float32(attrs["output_scale"])))
        rel_m, self.reluish_exponent = quantize_multiplier(float(hires / np.float32(3.0 / 32768.0)))
        self.output_multiplier, self.reluish_multiplier = _int16_multiplier(out_m), _int16_multiplier(rel_m)
        self.input_zero_point = int(attrs["input_zero_point"])
        self.output_zero_point = int(attrs["output_zero_point"])

    def apply(self, x: Expr) -> Expr:
        """The int32 output (zero point added, not yet clamped) of the int32 input value `x`."""
        hires = (x - self.input_zero_point) * 128  # |x - zp| <= 255: no int16 saturation
        preshift = _rounding_doubling_high_mul16(hires, self.output_multiplier)
        e = self.reluish_exponent
        reluish = _saturate16(hires * (1 << (e - 1))) if e > 0 else hires
        reluish = _rounding_doubling_high_mul16(reluish, self.reluish_multiplier)
        if e > 0:
            reluish = _saturate16(reluish * 2)
        elif e < 0:
            reluish = rounding_divide_by_pot(reluish, -e)
        reluish = (reluish + (1 << 15)) // 2  # [-1, 1] -> [0, 1]
        # SaturatingDoublingHighMul: truncates toward zero (no overflow: reluish >= 0)
        product = _trunc_div(reluish * preshift, const(1 << 15, "int32"))
        return rounding_divide_by_pot(product, -self.output_exponent) + self.output_zero_point


def _int16_multiplier(m: int) -> int:
    """DownScaleInt32ToInt16Multiplier: the int32 multiplier's high half, rounded."""
    return 32767 if m >= (1 << 31) - 1 - (1 << 15) else (m + (1 << 15)) >> 16


def _rounding_doubling_high_mul16(a: Expr, b: int) -> Expr:
    """gemmlowp's int16 SaturatingRoundingDoublingHighMul for a positive `b`: a * b / 2^15, ties up."""
    return (a * b + (1 << 14)) // (1 << 15)


def _saturate16(v: Expr) -> Expr:
    return minimum(maximum(v, const(-(1 << 15), v.dtype)), const((1 << 15) - 1, v.dtype))


@register("qnn.softmax", OpPattern.COMM_REDUCE)
def _qnn_softmax(inputs, attrs):
    """Softmax over the last axis as TFLite's int8 kernel computes it: exp(-input_scale * beta * (max - x))
    in float32, normalized by the row sum, quantized to the output."""
    x = inputs[0]
    _check_quantized(x, "qnn.softmax")
    out_dtype = _out_dtype({"out_dtype": attrs.get("out_dtype", x.dtype)}, "qnn.softmax")
    coef = f32(-f32(attrs["input_scale"]) * f32(attrs.get("beta", 1.0)))
    axis = x.ndim - 1
    rows = x.shape[:axis]
    k = te.reduce_axis(x.shape[axis], "k")
    mx = te.compute(rows, lambda *i: te.max(x[(*i, k.var)], k), "qnn_softmax_max", tag="softmax_reduce")

    def e(i):
        return exp(cast("float32", cast("int32", mx[i[:axis]]) - cast("int32", x[i])) * coef)

    ex = te.compute(x.shape, lambda *i: e(i), "qnn_softmax_exp", tag="elemwise")
    k2 = te.reduce_axis(x.shape[axis], "k")
    total = te.compute(rows, lambda *i: te.sum(ex[(*i, k2.var)], k2), "qnn_softmax_sum", tag="softmax_reduce")
    out_scale = f32(attrs["output_scale"])
    zp = float(int(attrs["output_zero_point"]))
    lo, hi = float(dtype_min(out_dtype)), float(dtype_max(out_dtype))

    def body(*i):
        inv = 1.0 / (total[i[:axis]] * out_scale)
        q = round_half_away_expr(ex[i] * inv) + zp
        return cast(out_dtype, minimum(maximum(q, const(lo)), const(hi)))

    return [te.compute(x.shape, body, "qnn_softmax", tag="softmax_norm")]
