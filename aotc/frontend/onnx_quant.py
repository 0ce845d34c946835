"""ONNX quantized models: QuantizeLinear / DequantizeLinear, QDQ groups folded into integer kernels,
QLinearConv / QLinearMatMul, ConvInteger / MatMulInteger (int32 results), and the com.microsoft operators
onnxruntime's QOperator format writes (QLinearAdd, QGemm, QLinearGlobalAveragePool).

A QDQ model (what `onnxruntime.quantization.quantize_static` writes with QuantFormat.QDQ) keeps its float
operators and brackets them: DQ(x_q), DQ(w_q) [, DQ(bias_int32)] -> Conv [-> Relu] -> Q. Read literally
each such group dequantizes, runs in float and quantizes again; onnxruntime fuses it into one integer
kernel (QLinearConv, QGemm, QLinearAdd), and so does aotc, onto the `qnn.*` operators of the TFLite
frontend.

How: every node first converts as written (DQ -> qnn.dequantize, the float operator, Q -> qnn.quantize),
so any QDQ model imports and computes what the ONNX spec says. When a QuantizeLinear converts, it looks
back in the ONNX graph for a group that ends at it (`_fold`); if every detail fits an integer kernel, it
emits that kernel instead, and the float nodes it replaces are dead and dropped by `live_nodes`. A group
that does not fit stays in its float form.

Layout: ONNX convolutions are NCHW, the qnn ones NHWC. A folded convolution transposes its input to NHWC
and its result back to NCHW, and remembers the NHWC result as the NCHW value's twin: a following folded
convolution or add reads the twin, so the transposes between folded ops are dead code too.

Arithmetic: the folded kernels accumulate in int32 exactly and requantize as onnxruntime's integer kernels
do (`requantize: float`: a float32 multiply by input_scale * weight_scale / output_scale, rounded half to
even), not in TFLite's fixed point, whose 31-bit multiplier is off by up to 1/2^(shift+1) LSB and so
disagreed in 1 LSB on ~4% of a small ResNet block's outputs (float requantization: see the tests).
ConvInteger and MatMulInteger return the int32 accumulator itself (the qnn kernels' out_dtype int32).

Weights: the qnn kernels take one weight zero point. Constant weights whose per-channel zero points differ
are re-encoded at import, w - zero_point[c] + z for one z (`one_zero_point`), which is exact whenever the
centered values fit one 8-bit type.

Run-time parameters: a scale, zero point or weight fed or computed at run time is a kernel input. Q/DQ then
compute element-wise (aotc.frontend.onnx_lowp), the integer operators as ONNX's reference does (int32
products and convolutions of the centered operands, float requantization in the reference's order); QDQ
groups with such parameters are not folded. Constant ones, the usual case, keep the fused qnn kernels.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx

from aotc.frontend.errors import ConversionError

# This module extends the ONNX frontend: its converters use the converter API that onnx.py defines.
from aotc.frontend.onnx import OnnxConverter, OnnxNode, attr_value, conv_window, converts, onnx_axis
from aotc.frontend.onnx_lowp import dequantize_linear, general_qdq, quantize_linear
from aotc.graph.ir import Value
from aotc.topi.quantized import ACTIVATIONS

QUANT_DTYPES = ("int8", "uint8")
TO_NHWC, TO_NCHW = (0, 2, 3, 1), (0, 3, 1, 2)
_ONNX_QUANT_DTYPES = {
    onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.UINT8: "uint8",
}
# A bias quantized with a scale this close to input_scale * weight_scale is used as it is (what
# onnxruntime's fused kernels do); one further off is requantized from its float value.
BIAS_SCALE_RTOL = 1e-5


@dataclass(frozen=True)
class QParams:
    """Scale and zero point of a quantized tensor: one value (per tensor) or one per entry of `axis`."""

    scales: tuple[float, ...]
    zero_points: tuple[int, ...]
    dtype: str
    axis: int | None  # None: per tensor

    @property
    def per_tensor(self) -> bool:
        return self.axis is None

    @property
    def scale(self) -> float:
        return self.scales[0]

    @property
    def zero_point(self) -> int:
        return self.zero_points[0]

    def broadcast(self, values: tuple, rank: int, dtype: str) -> np.ndarray:
        """`values` (scales or zero points) shaped to broadcast against a tensor of `rank` along `axis`."""
        data = np.asarray(values, dtype)
        if self.per_tensor:
            return data.reshape(())
        return data.reshape([len(values) if d == self.axis else 1 for d in range(rank)])


@dataclass
class _QuantState:
    """What the quantized converters of one model share: the ONNX graph's wiring, the dequantized values
    and the NHWC twins of folded convolutions' results."""

    producers: dict[str, onnx.NodeProto]
    uses: Counter
    outputs: set[str]
    dequantized: dict[str, tuple[Value, QParams]] = field(default_factory=dict)  # DQ output -> (x_q, params)
    nhwc: dict[Value, Value] = field(default_factory=dict)  # NCHW value -> its NHWC twin

    def single_use(self, name: str) -> bool:
        """`name` feeds exactly one node and is no graph output: a fold may replace its producer."""
        return self.uses[name] == 1 and name not in self.outputs


_STATES: weakref.WeakKeyDictionary[OnnxConverter, _QuantState] = weakref.WeakKeyDictionary()


def _state(cv: OnnxConverter) -> _QuantState:
    if cv not in _STATES:
        nodes = cv.graph.node
        _STATES[cv] = _QuantState(
            producers={o: p for p in nodes for o in p.output if o},
            uses=Counter(i for p in nodes for i in p.input if i),
            outputs={o.name for o in cv.graph.output},
        )
    return _STATES[cv]


# --- QuantizeLinear / DequantizeLinear --------------------------------------------------------------------


def _qparams(
    cv: OnnxConverter,
    n: OnnxNode,
    scale_input: int,
    prefix: str,
    dtype: str | None,
    data: Value | None,
    axis: int = 1,
) -> QParams:
    """The scale (input `scale_input`) and zero point (the next input) of the tensor `data` of node `n`
    (None: its output, which must be quantized per tensor); `prefix` names them as the spec does (x, y,
    w...), `dtype` is the quantized type when a data input gives it, `axis` the per-channel axis."""
    scale = cv.const_input(n, scale_input, f"{prefix}_scale")
    zero = cv.const_input(n, scale_input + 1, f"{prefix}_zero_point")
    if scale is None:
        raise cv.fail(f"needs input {scale_input} ({prefix}_scale)")
    if n.attr("block_size", 0):
        raise cv.fail(f"block_size={n.attr('block_size')}: blocked quantization is not supported")
    if scale.dtype != np.float32:
        raise cv.fail(f"{prefix}_scale is {scale.dtype}; only float32 scales are supported")
    dtype = dtype or (str(zero.dtype) if zero is not None else _output_dtype(cv, n))
    allowed = QUANT_DTYPES + (("int32",) if n.op_type == "DequantizeLinear" else ())
    if dtype not in allowed:
        raise cv.fail(f"{prefix}_zero_point: element type {dtype} is not supported ({', '.join(allowed)})")
    if zero is not None and str(zero.dtype) != dtype:
        raise cv.fail(f"{prefix}_zero_point is {zero.dtype}, the quantized tensor {dtype}")
    if zero is not None and zero.size != scale.size:
        raise cv.fail(f"{prefix}_zero_point has {zero.size} values, {prefix}_scale {scale.size}")
    scales = scale.reshape(-1)
    if not np.all(np.isfinite(scales)) or np.any(scales <= 0):
        raise cv.fail(f"{prefix}_scale must be positive and finite, got {scales.tolist()}")
    zeros = tuple(int(z) for z in zero.reshape(-1)) if zero is not None else (0,) * scales.size
    if scale.ndim > 1 or (data is None and scale.size > 1):
        raise cv.fail(
            f"{prefix}_scale must be a scalar{'' if data is None else ' or 1-D'}, got {list(scale.shape)}"
        )
    if scale.size == 1:  # a scalar, or [1] as quantizers write a per-tensor bias scale
        return QParams((float(scales[0]),), zeros[:1], dtype, None)
    axis = onnx_axis(cv, axis, len(data.type.shape))
    if scale.size != data.type.shape[axis]:
        raise cv.fail(
            f"{prefix}_scale has {scale.size} values; axis {axis} of {data.type} has {data.type.shape[axis]}"
        )
    return QParams(tuple(float(s) for s in scales), zeros, dtype, axis)


def _output_dtype(cv: OnnxConverter, n: OnnxNode) -> str:
    """A QuantizeLinear's output type without a zero point: its output_dtype attribute, else uint8."""
    code = n.attr("output_dtype", 0)
    if not code:
        return "uint8"
    if code not in _ONNX_QUANT_DTYPES:
        raise cv.fail(f"output_dtype={code} is not supported (int8, uint8)")
    return _ONNX_QUANT_DTYPES[code]


@converts("DequantizeLinear")
def _dequantize_linear(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    if general_qdq(cv, n):  # low-precision, 16-bit, blocked, float16-scaled or run-time parameters
        return [dequantize_linear(cv, n)]
    x = n.inputs[0]
    q = _qparams(cv, n, 1, "x", x.type.dtype, x, n.attr("axis", 1))
    _state(cv).dequantized[n.outputs[0]] = (x, q)
    return [dequantize(cv, x, q, n.outputs[0])]


def dequantize(cv: OnnxConverter, x: Value, q: QParams, out: str | None = None) -> Value:
    """(x - zero_point) * scale in float32, as the ONNX spec computes it."""
    rank = len(x.type.shape)
    zero = q.broadcast(q.zero_points, rank, "int32")
    scale = q.broadcast(q.scales, rank, "float32")
    if x.is_constant:  # weights and biases: numpy gives the same float32 values, whatever their size
        data = (x.data.astype(np.int32) - zero).astype(np.float32) * scale
        return cv.constant(data, "dequantized", out=out)
    if q.per_tensor and q.dtype in QUANT_DTYPES:
        attrs = {"scale": q.scale, "zero_point": q.zero_point}
        return cv.emit("qnn.dequantize", [x], attrs, out)
    # Per channel (or int32) as broadcast element-wise ops: the layout pass reshapes their constants for
    # NHWC, where it would keep a qnn.dequantize's channel `axis` as it is.
    v = x if x.type.dtype == "int32" else cv.emit("cast", [x], {"dtype": "int32"})
    if any(q.zero_points):
        v = cv.emit("subtract", [v, cv.constant(zero, "zero_point")])
    v = cv.emit("cast", [v], {"dtype": "float32"})
    return cv.emit("multiply", [v, cv.constant(scale, "scale")], out=out)


@converts("QuantizeLinear")
def _quantize_linear(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    if general_qdq(cv, n):  # low-precision, 16-bit, blocked, float16-scaled or run-time parameters
        return [quantize_linear(cv, n)]
    x = n.inputs[0]
    if x.type.dtype != "float32":
        raise cv.fail(f"input x is {x.type.dtype}; only float32 is supported")
    if n.attr("saturate", 1) != 1:
        raise cv.fail("saturate=0 applies to float8 outputs only, which are not supported")
    q = _qparams(cv, n, 1, "y", None, x, n.attr("axis", 1))
    folded = _fold(cv, n, q)
    return [folded if folded is not None else quantize(cv, x, q, n.outputs[0])]


def quantize(cv: OnnxConverter, x: Value, q: QParams, out: str | None = None) -> Value:
    """saturate(round(x / scale) + zero_point), rounding half to even, as the ONNX spec computes it."""
    if q.per_tensor:
        attrs = {
            "output_scale": q.scale,
            "output_zero_point": q.zero_point,
            "out_dtype": q.dtype,
            "rounding": "half_even",
        }
        return cv.emit("qnn.quantize", [x], attrs, out)
    rank = len(x.type.shape)
    info = np.iinfo(q.dtype)
    v = cv.emit("divide", [x, cv.constant(q.broadcast(q.scales, rank, "float32"), "scale")])
    v = cv.emit("round", [v])
    v = cv.emit("add", [v, cv.constant(q.broadcast(q.zero_points, rank, "float32"), "zero_point")])
    v = cv.emit("clip", [v], {"min": float(info.min), "max": float(info.max)})
    return cv.emit("cast", [v], {"dtype": q.dtype}, out)


# --- QDQ groups folded into integer kernels ---------------------------------------------------------------


@dataclass(frozen=True)
class _Group:
    """A foldable group ending at a QuantizeLinear: its anchor node, the fused activation, the output."""

    anchor: OnnxNode
    activation: str
    out: QParams
    out_name: str


def _fold(cv: OnnxConverter, n: OnnxNode, out: QParams) -> Value | None:
    """The integer kernel computing QuantizeLinear `n` and the float group before it, or None (the group
    then stays as it is: dequantize, float ops, quantize)."""
    if not out.per_tensor:
        return None
    st = _state(cv)
    proto = st.producers[n.outputs[0]]
    group = _match_group(cv, st, proto.input[0], out, n.outputs[0])
    if group is None:
        return None
    try:
        return _FOLDS[group.anchor.op_type](cv, st, group)
    except ConversionError:
        # the float form is already in the graph and correct: a kernel the qnn ops refuse
        # (say, a requantization multiplier out of range) keeps it
        return None


def _match_group(cv: OnnxConverter, st: _QuantState, name: str, out: QParams, out_name: str) -> _Group | None:
    """anchor [-> Relu | Clip] -> the QuantizeLinear, each intermediate value used only there."""
    producer = st.producers.get(name)
    if producer is None or not st.single_use(name):
        return None
    activation = "NONE"
    if producer.op_type in ("Relu", "Clip"):
        activation = _activation(cv, producer)
        name = producer.input[0]
        producer = st.producers.get(name)
        if activation is None or producer is None or not st.single_use(name):
            return None
    if producer.op_type not in _FOLDS or producer.domain not in ("", "ai.onnx"):
        return None
    return _Group(_onnx_node(cv, producer), activation, out, out_name)


def _activation(cv: OnnxConverter, proto: onnx.NodeProto) -> str | None:
    """The qnn fused activation a Relu or Clip node is, or None for a Clip with other bounds."""
    if proto.op_type == "Relu":
        return "RELU"
    bounds = []
    for i in (1, 2):
        v = cv.values.get(proto.input[i]) if i < len(proto.input) and proto.input[i] else None
        if v is not None and not v.is_constant:
            return None
        bounds.append(None if v is None else float(v.data.reshape(-1)[0]))
    for name, (low, high) in ACTIVATIONS.items():
        if name != "NONE" and bounds == [low, high]:
            return name
    return None


def _onnx_node(cv: OnnxConverter, proto: onnx.NodeProto) -> OnnxNode:
    return OnnxNode(
        proto.name or proto.op_type,
        proto.op_type,
        [cv.values[i] if i else None for i in proto.input],
        {a.name: attr_value(a) for a in proto.attribute},
        list(proto.output),
    )


def _dequantized_input(st: _QuantState, name: str) -> tuple[Value, QParams] | None:
    """(x_q, its parameters) when ONNX value `name` is a DequantizeLinear of an 8-bit tensor."""
    found = st.dequantized.get(name)
    if found is None or found[1].dtype not in QUANT_DTYPES:
        return None
    return found


def _input_names(st: _QuantState, n: OnnxNode) -> list[str]:
    return list(st.producers[n.outputs[0]].input)


def _io_attrs(x: QParams, out: QParams, activation: str) -> dict:
    return {
        "input_scale": x.scale,
        "input_zero_point": x.zero_point,
        "output_scale": out.scale,
        "output_zero_point": out.zero_point,
        "activation": activation,
        "out_dtype": out.dtype,
        "requantize": "float",
    }


def _weight_attrs(w: QParams) -> dict:
    return {"weight_scales": w.scales, "weight_zero_points": w.zero_points}


def _quantized_operands(
    st: _QuantState, n: OnnxNode, weight_axis: int
) -> tuple[Value, QParams, Value, QParams] | None:
    """(x_q, x params, w_q, w params) of a Conv / MatMul / Gemm whose inputs 0 and 1 are dequantized, with
    x per tensor and w a constant quantized per tensor or along `weight_axis` with one zero point."""
    names = _input_names(st, n)
    x, w = _dequantized_input(st, names[0]), _dequantized_input(st, names[1])
    if x is None or w is None:
        return None
    (xv, xq), (wv, wq) = x, w
    if not xq.per_tensor or not wv.is_constant or len(set(wq.zero_points)) != 1:
        return None
    if not wq.per_tensor and wq.axis != weight_axis:
        return None
    return xv, xq, wv, wq


def _int32_bias(cv: OnnxConverter, st: _QuantState, name: str, scales: np.ndarray) -> Value | None:
    """The bias as int32 at scale input_scale * weight_scale[c] (`scales`, one per output channel): the
    DequantizeLinear's int32 input when it has that scale, else a float constant quantized here; None if
    the bias is computed at run time or does not fit int32."""
    channels = scales.size
    found = st.dequantized.get(name)
    if found is not None and found[1].dtype == "int32" and found[0].is_constant:
        data, q = found
        same_scale = len(q.scales) in (1, channels) and np.allclose(
            np.broadcast_to(np.asarray(q.scales, np.float64), (channels,)),
            scales,
            rtol=BIAS_SCALE_RTOL,
            atol=0,
        )
        if same_scale and data.type.num_elements == channels and not any(q.zero_points):
            return cv.constant(data.data.reshape(channels).astype(np.int32), "bias")
    value = cv.values[name]
    if not value.is_constant or value.type.num_elements != channels:
        return None
    real = value.data.astype(np.float64).reshape(channels) / scales
    if np.abs(real).max(initial=0) >= 2**31 - 1:
        return None
    return cv.constant(np.round(real).astype(np.int32), "bias")


def _bias_scales(x: QParams, w: QParams, channels: int) -> np.ndarray:
    """input_scale * weight_scale[c] in float32, as the quantizer computes a bias's scale."""
    product = np.float32(x.scale) * np.asarray(w.scales, np.float32)
    return np.broadcast_to(product, (channels,)).astype(np.float64)


def as_nhwc(cv: OnnxConverter, v: Value) -> Value:
    """The NHWC form of the NCHW value `v`: its twin, or a transpose (made once)."""
    st = _state(cv)
    if v not in st.nhwc:
        st.nhwc[v] = cv.emit("transpose", [v], {"perm": TO_NHWC})
    return st.nhwc[v]


def _as_nchw(cv: OnnxConverter, y: Value, out: str) -> Value:
    """The NCHW form of a folded op's NHWC result `y`, as ONNX value `out`; `y` becomes its twin."""
    v = cv.emit("transpose", [y], {"perm": TO_NCHW}, out)
    _state(cv).nhwc[v] = y
    return v


def _fold_conv(cv: OnnxConverter, st: _QuantState, group: _Group) -> Value | None:
    n = group.anchor
    operands = _quantized_operands(st, n, weight_axis=0)
    if operands is None or len(n.inputs[0].type.shape) != 4:
        return None
    x, xq, w, wq = operands
    names = _input_names(st, n)
    channels = w.type.shape[0]
    bias = []
    if len(names) > 2 and names[2]:
        b = _int32_bias(cv, st, names[2], _bias_scales(xq, wq, channels))
        if b is None:
            return None
        bias = [b]
    return qnn_conv(cv, n, x, xq, w, wq, bias, _io_attrs(xq, group.out, group.activation), group.out_name)


def qnn_conv(
    cv: OnnxConverter,
    n: OnnxNode,
    x: Value,
    xq: QParams,
    w: Value,
    wq: QParams,
    bias: list[Value],
    attrs: dict,
    out: str,
) -> Value:
    """The NCHW Conv node `n` on x_q [N, C, H, W] and constant w_q [O, C/group, KH, KW] as a qnn
    convolution in NHWC (grouped ones too, the group count following from the shapes)."""
    if len(x.type.shape) != 4:
        raise cv.fail(f"only 2-D quantized convolutions are supported, got input {x.type}")
    window = conv_window(cv, n, x, w.type.shape[2:])
    channels, group = x.type.shape[1], int(n.attr("group", 1))
    out_channels = w.type.shape[0]
    if group < 1 or channels % group or out_channels % group or w.type.shape[1] != channels // group:
        raise cv.fail(f"group={group} does not fit input {x.type} and weight {w.type}")
    attrs = {k: v for k, v in window.attrs.items() if k != "kernel"} | attrs | _weight_attrs(wq)
    if group == channels and group > 1:
        op, weight = "qnn.depthwise_conv2d_nhwc", w.data.transpose(1, 2, 3, 0)  # [1, KH, KW, C*M]
        attrs["depth_multiplier"] = out_channels // channels
    else:
        op, weight = "qnn.conv2d_nhwc", w.data.transpose(0, 2, 3, 1)  # OHWI, I = C / group
    weight = cv.constant(np.ascontiguousarray(weight), "weight_ohwi")
    y = cv.emit(op, [as_nhwc(cv, x), weight, *bias], attrs)
    return _as_nchw(cv, y, out)


def _fold_matmul(cv: OnnxConverter, st: _QuantState, group: _Group) -> Value | None:
    """MatMul(x [..., K], w [K, N]) with w per tensor or per column."""
    n = group.anchor
    operands = _quantized_operands(st, n, weight_axis=1)
    if operands is None or len(n.inputs[1].type.shape) != 2:
        return None
    x, xq, w, wq = operands
    return qnn_dense(cv, x, xq, w.data.T, wq, [], _io_attrs(xq, group.out, group.activation), group.out_name)


def _fold_gemm(cv: OnnxConverter, st: _QuantState, group: _Group) -> Value | None:
    """Gemm(x, w) + bias with alpha = beta = 1 and x not transposed."""
    n = group.anchor
    trans_b = bool(n.attr("transB", 0))
    if n.attr("alpha", 1.0) != 1.0 or n.attr("beta", 1.0) != 1.0 or n.attr("transA", 0):
        return None
    operands = _quantized_operands(st, n, weight_axis=0 if trans_b else 1)
    if operands is None:
        return None
    x, xq, w, wq = operands
    weight = w.data if trans_b else w.data.T  # [N, K]
    names = _input_names(st, n)
    bias = []
    if len(names) > 2 and names[2]:
        b = _int32_bias(cv, st, names[2], _bias_scales(xq, wq, weight.shape[0]))
        if b is None:
            return None
        bias = [b]
    return qnn_dense(cv, x, xq, weight, wq, bias, _io_attrs(xq, group.out, group.activation), group.out_name)


def qnn_dense(
    cv: OnnxConverter,
    x: Value,
    xq: QParams,
    weight: np.ndarray,
    wq: QParams,
    bias: list[Value],
    attrs: dict,
    out: str | None,
) -> Value:
    """qnn.dense of x_q [..., K] and a constant weight [N, K]; `out` None: an intermediate."""
    w = cv.constant(np.ascontiguousarray(weight), "weight_nk")
    return cv.emit("qnn.dense", [x, w, *bias], attrs | _weight_attrs(wq), out)


def _fold_add(cv: OnnxConverter, st: _QuantState, group: _Group) -> Value | None:
    """DQ(a_q) + DQ(b_q), both per tensor, as qnn.add; in NHWC when both operands have NHWC twins."""
    operands = _per_tensor_operands(st, group)
    if operands is None:
        return None
    (av, aq), (bv, bq) = operands
    return qnn_add(cv, av, bv, _add_attrs(aq, bq, group.out, group.activation), group.out_name)


def _per_tensor_operands(st: _QuantState, group: _Group) -> tuple[tuple, tuple] | None:
    """The (quantized value, QParams) of the anchor's two inputs, when both are per-tensor DQ outputs."""
    names = _input_names(st, group.anchor)
    a, b = _dequantized_input(st, names[0]), _dequantized_input(st, names[1])
    if a is None or b is None or not (a[1].per_tensor and b[1].per_tensor):
        return None
    return a, b


def _add_attrs(a: QParams, b: QParams, out: QParams, activation: str) -> dict:
    return {
        "a_scale": a.scale,
        "a_zero_point": a.zero_point,
        "b_scale": b.scale,
        "b_zero_point": b.zero_point,
        "output_scale": out.scale,
        "output_zero_point": out.zero_point,
        "activation": activation,
        "out_dtype": out.dtype,
        "requantize": "float",
    }


def qnn_add(cv: OnnxConverter, a: Value, b: Value, attrs: dict, out: str) -> Value:
    """qnn.add of a_q and b_q (numpy broadcasting); in NHWC when both have NHWC twins of one shape."""
    st = _state(cv)
    if a in st.nhwc and b in st.nhwc and a.type.shape == b.type.shape:
        return _as_nchw(cv, cv.emit("qnn.add", [st.nhwc[a], st.nhwc[b]], attrs), out)
    return cv.emit("qnn.add", [a, b], attrs, out)


def _fold_mul(cv: OnnxConverter, st: _QuantState, group: _Group) -> Value | None:
    """DQ(a_q) * DQ(b_q), both per tensor, as qnn.mul (float rescale, as QLinearMul); in NHWC where
    `_nhwc_operands` allows, so that it fuses into the convolution before it."""
    operands = _per_tensor_operands(st, group)
    if operands is None:
        return None
    (av, aq), (bv, bq) = operands
    attrs = _add_attrs(aq, bq, group.out, group.activation)
    pair = _nhwc_operands(cv, st, av, bv)
    if pair is not None:
        return _as_nchw(cv, cv.emit("qnn.mul", list(pair), attrs), group.out_name)
    return cv.emit("qnn.mul", [av, bv], attrs, group.out_name)


def _nhwc_operands(cv: OnnxConverter, st: _QuantState, a: Value, b: Value) -> tuple[Value, Value] | None:
    """The operands of a 4-D broadcasting op in NHWC, where one of them has an NHWC twin and the other is
    4-D too (its twin, or a transpose) or one element; None otherwise (the op then stays in NCHW)."""
    if a not in st.nhwc and b not in st.nhwc:
        return None
    forms = []
    for v in (a, b):
        if len(v.type.shape) == 4:
            forms.append(as_nhwc(cv, v))
        elif v.type.num_elements == 1:
            forms.append(v)
        else:
            return None
    return forms[0], forms[1]


UNARY_ELEMENTWISE = ("HardSwish", "HardSigmoid", "Sigmoid", "LeakyRelu")
"""Float ONNX operators that quantize_static leaves between a DequantizeLinear and a QuantizeLinear and that
`_fold_unary` moves onto the NHWC twin (layout does not change an element-wise op's values)."""


def _fold_unary(cv: OnnxConverter, st: _QuantState, group: _Group) -> Value | None:
    """DQ(x_q) -> an element-wise op -> Q, x_q with an NHWC twin: the same float nodes on the twin, so that
    they fuse into the convolution that produced x_q."""
    # in NCHW they sat between two transposes and fused into the next convolution instead, recomputed for
    # every read of its input
    source = _input_names(st, group.anchor)[0]
    found = _dequantized_input(st, source)
    if found is None or group.activation != "NONE" or found[0] not in st.nhwc or not found[1].per_tensor:
        return None
    x, xq = found
    chain = _elementwise_chain(cv.values[group.anchor.outputs[0]], cv.values[source])
    if chain is None:
        return None
    y = dequantize(cv, st.nhwc[x], xq)
    for node in chain:
        y = cv.emit(node.op, [y if not v.is_constant else v for v in node.inputs], node.attrs)
    return _as_nchw(cv, quantize(cv, y, group.out), group.out_name)


def _elementwise_chain(result: Value, source: Value, limit: int = 8) -> list | None:
    """The graph nodes from `source` to `result`, each with one run-time input (the previous value) and
    scalar constants otherwise, in order; None if the path is not such a chain."""
    chain = []
    v = result
    while v is not source:
        node = v.producer
        if node is None or len(chain) == limit or len(node.outputs) != 1:
            return None
        runtime = [u for u in node.inputs if not u.is_constant]
        if len(runtime) != 1 or any(u.type.num_elements != 1 for u in node.inputs if u.is_constant):
            return None
        chain.append(node)
        v = runtime[0]
    return chain[::-1]


def _fold_concat(cv: OnnxConverter, st: _QuantState, group: _Group) -> Value | None:
    """Concat of 4-D DQ(x_q) per tensor -> Q, one x_q with an NHWC twin: in NHWC, each input requantized
    where its parameters differ, so that this fuses into the convolution producing that input."""
    n = group.anchor
    found = [_dequantized_input(st, name) for name in _input_names(st, n)]
    if group.activation != "NONE" or any(f is None or not f[1].per_tensor for f in found):
        return None
    if any(len(x.type.shape) != 4 for x, _ in found) or not any(x in st.nhwc for x, _ in found):
        return None
    out = group.out
    parts = []
    for x, xq in found:
        v = as_nhwc(cv, x)
        if (xq.scale, xq.zero_point, xq.dtype) != (out.scale, out.zero_point, out.dtype):
            v = quantize(cv, dequantize(cv, v, xq), out)  # QLinearConcat's arithmetic, half to even
        parts.append(v)
    axis = TO_NCHW[onnx_axis(cv, int(n.attr("axis")), 4)]
    return _as_nchw(cv, cv.emit("concat", parts, {"axis": axis}), group.out_name)


def _fold_max_pool(cv: OnnxConverter, st: _QuantState, group: _Group) -> Value | None:
    """DQ(x_q) -> MaxPool -> Q with x's own scale and zero point (what quantize_static writes: a max pool
    keeps its input's quantization) as qnn.max_pool2d_nhwc on x_q, in NHWC. Exact: the max commutes with
    the increasing dequantize, and Q(DQ(v)) = v. Read literally the group dequantizes a whole feature map
    to float and back (ResNet-18's first pool: 1 ms, a tenth of the model)."""
    n = group.anchor
    found = _dequantized_input(st, _input_names(st, n)[0])
    out = group.out
    if found is None or len(n.inputs[0].type.shape) != 4 or n.attr("kernel_shape") is None:
        return None
    x, xq = found
    same = xq.per_tensor and (xq.scale, xq.zero_point, xq.dtype) == (out.scale, out.zero_point, out.dtype)
    indices = len(st.producers[n.outputs[0]].output) > 1 and st.producers[n.outputs[0]].output[1]
    dilated = any(d != 1 for d in n.attr("dilations", [1, 1]))
    if not same or indices or dilated or n.attr("ceil_mode", 0):
        return None
    window = conv_window(cv, n, x, n.attr("kernel_shape"))
    attrs = {k: window.attrs[k] for k in ("kernel", "strides", "pads")} | {
        "input_scale": xq.scale,
        "input_zero_point": xq.zero_point,
        "output_scale": out.scale,
        "output_zero_point": out.zero_point,
        "activation": group.activation,
        "out_dtype": out.dtype,
    }
    return _as_nchw(cv, cv.emit("qnn.max_pool2d_nhwc", [as_nhwc(cv, x)], attrs), group.out_name)


def _fold_reshape(cv: OnnxConverter, st: _QuantState, group: _Group) -> Value | None:
    """DQ(x_q) -> Reshape / Flatten -> Q with x's own scale and zero point (quantize_static brackets them
    so) as a reshape of x_q: exact, Q(DQ(v)) = v. Read literally, the float reshape's quantize is computed
    inside the next kernel for every one of its outputs (MobileNetV2's classifier: 0.2 of 3 ms)."""
    n = group.anchor
    found = _dequantized_input(st, _input_names(st, n)[0])
    out = group.out
    if found is None or group.activation != "NONE":
        return None
    x, xq = found
    if not (xq.per_tensor and (xq.scale, xq.zero_point, xq.dtype) == (out.scale, out.zero_point, out.dtype)):
        return None
    shape = cv.values[n.outputs[0]].type.shape
    return cv.emit("reshape", [x], {"shape": tuple(shape)}, group.out_name)


_FOLDS: dict[str, Callable[[OnnxConverter, _QuantState, _Group], Value | None]] = {
    "Conv": _fold_conv,
    "MatMul": _fold_matmul,
    "Gemm": _fold_gemm,
    "Add": _fold_add,
    "MaxPool": _fold_max_pool,
    "Reshape": _fold_reshape,
    "Flatten": _fold_reshape,
    "Mul": _fold_mul,
    "Concat": _fold_concat,
} | dict.fromkeys(UNARY_ELEMENTWISE, _fold_unary)


# --- QLinearConv / QLinearMatMul: the quantized operators of the default domain --------------------------


@converts("QLinearConv")
def _qlinear_conv(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """Inputs x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point [, int32 bias]: a
    qnn convolution when inputs 1-7 are constants, else the reference's arithmetic (`_qlinear_conv_general`)."""
    if _runtime_params(n, 1, 8):
        return [_qlinear_conv_general(cv, n)]
    x = n.inputs[0]
    xq = _qparams(cv, n, 1, "x", x.type.dtype, x)
    w, wq = _weight_qparams(cv, n, 3, "w", axis=0)
    out = _qparams(cv, n, 6, "y", None, None)
    _require_per_tensor(cv, xq, "x")
    bias = [v for v in n.inputs[8:9] if v is not None]
    if bias and bias[0].type.dtype != "int32":
        raise cv.fail(f"input 8 (B) is {bias[0].type.dtype}; the bias of QLinearConv is int32")
    return [qnn_conv(cv, n, x, xq, w, wq, bias, _io_attrs(xq, out, "NONE"), n.outputs[0])]


@converts("QLinearMatMul")
def _qlinear_matmul(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """Inputs a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point: qnn.dense when b
    is a constant [K, N] matrix quantized per tensor or per column and the rest constant float32, else the
    reference's arithmetic (`_qlinear_matmul_general`)."""
    a, b = n.inputs[0], n.inputs[3]
    scale_types = {v.type.dtype for v in (n.input(1), n.input(4), n.input(6)) if v is not None}
    if "float16" in scale_types or len(b.type.shape) != 2 or _runtime_params(n, 1, 8):
        return [_qlinear_matmul_general(cv, n)]
    aq = _qparams(cv, n, 1, "a", a.type.dtype, a)
    if len(b.type.shape) != 2:
        raise cv.fail(f"input 3 (b) must be a 2-D matrix, got {b.type}")
    b, bq = _weight_qparams(cv, n, 3, "b", axis=-1)
    out = _qparams(cv, n, 6, "y", None, None)
    _require_per_tensor(cv, aq, "a")
    return [qnn_dense(cv, a, aq, b.data.T, bq, [], _io_attrs(aq, out, "NONE"), n.outputs[0])]


def _weight_qparams(cv: OnnxConverter, n: OnnxNode, i: int, name: str, axis: int) -> tuple[Value, QParams]:
    """Constant weight input `i` and its parameters (per tensor or along `axis`), with one zero point."""
    w = n.inputs[i]
    q = _qparams(cv, n, i + 1, name, w.type.dtype, w, axis)
    return _constant_weight(cv, n, i, name, q)


def _constant_weight(cv: OnnxConverter, n: OnnxNode, i: int, name: str, q: QParams) -> tuple[Value, QParams]:
    """Weight input `i` (spec name `name`), which must be a constant, with one zero point (`one_zero_point`)."""
    w = n.inputs[i]
    if not w.is_constant:
        raise cv.run_time_value_error(
            n,
            i,
            name,
            "quantized weights are laid out at compile time, and a product of two run-time tensors has no "
            "qnn kernel",
        )
    data, one = one_zero_point(cv, name, w.data, q)
    return (w if one is q else cv.constant(data, f"{name}_recoded")), one


def one_zero_point(cv: OnnxConverter, name: str, data: np.ndarray, q: QParams) -> tuple[np.ndarray, QParams]:
    """Constant quantized `data` with parameters `q` re-encoded with a single zero point: the values
    data - zero_point[c] + z for one z, in int8 or uint8 (q's type first), z as close to 0 as the values
    allow; exact, and refused when the centered values span more than one 8-bit type holds."""
    if len(set(q.zero_points)) == 1:
        return data, q
    centered = data.astype(np.int32) - q.broadcast(q.zero_points, data.ndim, "int32")
    lo, hi = int(centered.min()), int(centered.max())
    for dtype in sorted(QUANT_DTYPES, key=lambda d: d != q.dtype):
        info = np.iinfo(dtype)
        z_lo, z_hi = max(int(info.min) - lo, int(info.min)), min(int(info.max) - hi, int(info.max))
        if z_lo <= z_hi:
            z = min(max(0, z_lo), z_hi)
            one = QParams(q.scales, (z,) * len(q.zero_points), dtype, q.axis)
            return (centered + z).astype(dtype), one
    zero = f"{name.lower()}_zero_point"
    raise cv.fail(
        f"{zero}: the per-channel zero points {list(q.zero_points)} differ and leave {name} - {zero} from "
        f"{lo} to {hi}, more values than one 8-bit zero point can encode (the qnn kernels take one weight "
        f"zero point)"
    )


def _require_per_tensor(cv: OnnxConverter, q: QParams, name: str) -> None:
    if not q.per_tensor:
        raise cv.fail(f"{name}_scale: {name} must be quantized per tensor, it has {len(q.scales)} scales")


# --- ConvInteger / MatMulInteger: int32 results of 8-bit operands ------------------------------------------


def _require_8bit(cv: OnnxConverter, n: OnnxNode, i: int, name: str) -> Value:
    v = n.input(i)
    if v is None:
        raise cv.fail(f"needs input {i} ({name})")
    if v.type.dtype not in QUANT_DTYPES:
        raise cv.fail(f"input {i} ({name}) is {v.type.dtype}; only int8 and uint8 are supported")
    return v


def _integer_operand(
    cv: OnnxConverter, n: OnnxNode, i: int, name: str, zero_input: int, axis: int | None = None
) -> QParams:
    """Type and zero point of the 8-bit input `i` (spec name `name`) of ConvInteger / MatMulInteger, whose
    zero point (input `zero_input`, 0 when absent) is a scalar or, with `axis`, one value per entry of that
    axis. These operators have no scales: QParams' scales are 1."""
    v = _require_8bit(cv, n, i, name)
    prefix = name.lower()
    zero = cv.const_input(n, zero_input, f"{prefix}_zero_point")
    if zero is None:
        return QParams((1.0,), (0,), v.type.dtype, None)
    if str(zero.dtype) != v.type.dtype:
        raise cv.fail(f"{prefix}_zero_point is {zero.dtype}, {name} {v.type.dtype}; they must be of one type")
    zeros = tuple(int(z) for z in zero.reshape(-1))
    if zero.size == 1:
        return QParams((1.0,), zeros, v.type.dtype, None)
    if axis is None or zero.ndim != 1 or zero.size != v.type.shape[axis]:
        allowed = (
            "a scalar" if axis is None else f"a scalar or one value per entry of axis {axis} of {v.type}"
        )
        raise cv.fail(f"{prefix}_zero_point has shape {list(zero.shape)}; only {allowed} is supported")
    return QParams((1.0,) * len(zeros), zeros, v.type.dtype, axis)


@converts("ConvInteger")
def _conv_integer(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """Inputs x, w [, x_zero_point, w_zero_point]: the int32 convolution of x - x_zero_point and a constant
    w - w_zero_point (per tensor or per output channel), the qnn convolution's accumulator (out_dtype int32;
    padding reads x_zero_point, so padded taps add 0); with w or a zero point at run time, an int32 conv."""
    if _runtime_params(n, 1, 4):
        return [_conv_integer_general(cv, n)]
    xq = _integer_operand(cv, n, 0, "x", 2)
    w, wq = _constant_weight(cv, n, 1, "w", _integer_operand(cv, n, 1, "w", 3, axis=0))
    attrs = {"input_zero_point": xq.zero_point, "out_dtype": "int32"}
    return [qnn_conv(cv, n, n.inputs[0], xq, w, wq, [], attrs, n.outputs[0])]


@converts("MatMulInteger")
def _matmul_integer(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """Inputs A, B [, a_zero_point, b_zero_point]: the int32 product of A - a_zero_point [..., K] (a per
    tensor zero point) and a constant matrix B - b_zero_point [K, N] (per tensor or per column), qnn.dense's
    accumulator (out_dtype int32); with B or a zero point at run time, an int32 matmul."""
    if _runtime_params(n, 1, 4):
        return [_matmul_integer_general(cv, n)]
    aq = _integer_operand(cv, n, 0, "A", 2)
    b = _require_8bit(cv, n, 1, "B")
    if len(b.type.shape) != 2:
        raise cv.fail(f"input 1 (B) must be a 2-D matrix, got {b.type}")
    b, bq = _constant_weight(cv, n, 1, "B", _integer_operand(cv, n, 1, "B", 3, axis=1))
    attrs = {"input_zero_point": aq.zero_point, "out_dtype": "int32"}
    return [qnn_dense(cv, n.inputs[0], aq, b.data.T, bq, [], attrs, n.outputs[0])]


# --- run-time weights, scales or zero points: the general integer path -------------------------------------
# The qnn kernels take their weights laid out at compile time and their scales and zero points as
# attributes. Given any of them at run time, these operators compute as ONNX's reference does: the 8-bit
# operands widened to int32 minus their zero points, the product or convolution accumulated in int32, and
# for the QLinear ones the float requantization in the reference's order of float operations.


def _runtime_params(n: OnnxNode, first: int, stop: int) -> bool:
    """Whether any of inputs first..stop-1 (weights, scales, zero points) is fed or computed at run time."""
    return any(v is not None and not v.is_constant for v in n.inputs[first:stop])


def _per_channel(cv: OnnxConverter, n: OnnxNode, i: int, what: str, rank: int, axis: int | None) -> Value:
    """Input `i` (spec name `what`) shaped to broadcast against a rank-`rank` tensor: a single value, or with
    `axis` a 1-D tensor of one value per entry of that axis (of `channels` = its length)."""
    v = n.inputs[i]
    if v.type.num_elements == 1:
        return cv.emit("reshape", [v], {"shape": ()})
    if axis is not None and len(v.type.shape) == 1:
        return cv.emit(
            "reshape", [v], {"shape": tuple(v.type.shape[0] if d == axis else 1 for d in range(rank))}
        )
    allowed = "a scalar" if axis is None else f"a scalar or a 1-D tensor along axis {axis}"
    raise cv.fail(f"input {i} ({what}) has shape {list(v.type.shape)}; only {allowed} is supported")


def _centered(
    cv: OnnxConverter, n: OnnxNode, i: int, name: str, zero_input: int, axis: int | None = None
) -> Value:
    """8-bit input `i` (spec name `name`) widened to int32 minus its zero point (input `zero_input`, if
    given): a scalar or, with `axis`, one value per entry of that axis of input `i`."""
    v = _require_8bit(cv, n, i, name)
    wide = cv.emit("cast", [v], {"dtype": "int32"})
    zero = n.input(zero_input)
    if zero is None:
        return wide
    what = f"{name.lower()}_zero_point"
    if zero.type.dtype != v.type.dtype:
        raise cv.fail(f"input {zero_input} ({what}) is {zero.type.dtype}, {name} {v.type.dtype}")
    rank = len(v.type.shape)
    if axis is not None and len(zero.type.shape) == 1 and zero.type.shape[0] not in (1, v.type.shape[axis]):
        raise cv.fail(f"input {zero_input} ({what}) has {zero.type.shape[0]} values; {name} is {v.type}")
    zero = _per_channel(cv, n, zero_input, what, rank, None if axis is None else axis % rank)
    return cv.emit("subtract", [wide, cv.emit("cast", [zero], {"dtype": "int32"})])


def _conv_int32(
    cv: OnnxConverter, n: OnnxNode, x: Value, w: Value, bias: list[Value], out: str | None = None
) -> Value:
    """The int32 convolution (conv2d, or conv3d; a 1-D one lifted to [N, C, 1, L]) of the centered x and w
    with Conv's attributes; zero padding, which is x_zero_point before centering."""
    window = conv_window(cv, n, x, w.type.shape[2:])
    channels, out_channels, group = x.type.shape[1], w.type.shape[0], int(n.attr("group", 1))
    if group < 1 or channels % group or out_channels % group or w.type.shape[1] != channels // group:
        raise cv.fail(f"group={group} does not fit input {x.type} and weight {w.type}")
    attrs = {k: v for k, v in window.attrs.items() if k != "kernel"} | {"groups": group}
    op = "conv3d" if window.rank == 3 else "conv2d"
    if not window.lifted:
        return cv.emit(op, [x, w, *bias], attrs, out)
    lifted = [cv.emit("reshape", [v], {"shape": (*v.type.shape[:2], 1, v.type.shape[2])}) for v in (x, w)]
    y = cv.emit(op, [*lifted, *bias], attrs)
    return cv.emit("reshape", [y], {"shape": (*y.type.shape[:2], y.type.shape[3])}, out)


def _requantize(
    cv: OnnxConverter, n: OnnxNode, acc: Value, scales: list[Value], zero: int | None, dtype: str, out: str
) -> Value:
    """The int32 accumulator times scales[0] * scales[1] / scales[2] (computed in the scales' type, as the
    reference's numpy does), in float64, plus the output zero point (input `zero`), rounded half to even
    and saturated to `dtype`: ONNX's reference requantization."""
    types = {s.type.dtype for s in scales}
    if len(types) != 1 or not types <= {"float32", "float16"}:
        raise cv.fail(f"the scales must be float32 (float16 for QLinearMatMul-21), got {sorted(types)}")
    scale_type = types.pop()

    def rounded(op: str, a: Value, b: Value) -> Value:  # a float16 operation: exact in float32, rounded once
        if scale_type == "float32":
            return cv.emit(op, [a, b])
        wide = [cv.emit("cast", [v], {"dtype": "float32"}) for v in (a, b)]
        return cv.emit("cast", [cv.emit(op, wide)], {"dtype": "float16"})

    multiplier = rounded("divide", rounded("multiply", scales[0], scales[1]), scales[2])
    y = cv.emit(
        "multiply",
        [cv.emit("cast", [acc], {"dtype": "float64"}), cv.emit("cast", [multiplier], {"dtype": "float64"})],
    )
    if zero is not None and n.input(zero) is not None:  # added before rounding: half to even sees its parity
        y_zero = _per_channel(cv, n, zero, "y_zero_point", 0, None)
        y = cv.emit("add", [y, cv.emit("cast", [y_zero], {"dtype": "float64"})])
    info = np.iinfo(dtype)
    y = cv.emit("clip", [cv.emit("round", [y])], {"min": float(info.min), "max": float(info.max)})
    return cv.emit("cast", [y], {"dtype": dtype}, out)


def _output_type(cv: OnnxConverter, n: OnnxNode, data: Value) -> str:
    """The quantized output type: y_zero_point's (input 7), else the data input's."""
    y_zero = n.input(7)
    dtype = y_zero.type.dtype if y_zero is not None else data.type.dtype
    if dtype not in QUANT_DTYPES:
        raise cv.fail(f"y_zero_point is {dtype}; only int8 and uint8 are supported")
    return dtype


def _qlinear_matmul_general(cv: OnnxConverter, n: OnnxNode) -> Value:
    """QLinearMatMul as ONNX's reference computes it, for what qnn.dense does not take (a weight, scale or
    zero point at run time, float16 scales, a `b` that is not a 2-D matrix): (a - a_zero_point) @
    (b - b_zero_point) in int32, times a_scale * b_scale / y_scale computed in the scales' type, in float64,
    plus y_zero_point, rounded half to even and saturated. b's scale and zero point: one or one per column."""
    a, b = _require_8bit(cv, n, 0, "a"), _require_8bit(cv, n, 3, "b")
    scales = [n.input(i) for i in (1, 4, 6)]
    if any(s is None for s in scales):
        raise cv.fail("needs a_scale, b_scale and y_scale (inputs 1, 4, 6)")
    if scales[0].type.dtype == "float16" and n.older_than(21):
        raise cv.fail_version("float16 scales are defined from QLinearMatMul-21")
    dtype = _output_type(cv, n, a)
    acc = cv.emit("matmul", [_centered(cv, n, 0, "a", 2), _centered(cv, n, 3, "b", 5, axis=-1)])
    rank = len(acc.type.shape)
    factors = [
        _per_channel(cv, n, 1, "a_scale", rank, None),
        _per_channel(cv, n, 4, "b_scale", rank, rank - 1 if len(b.type.shape) > 1 else None),
        _per_channel(cv, n, 6, "y_scale", rank, None),
    ]
    if len(factors[1].type.shape) and factors[1].type.num_elements != b.type.shape[-1]:
        raise cv.fail(
            f"b_scale has {factors[1].type.num_elements} values; b {b.type} has {b.type.shape[-1]} columns"
        )
    return _requantize(cv, n, acc, factors, 7, dtype, n.outputs[0])


def _qlinear_conv_general(cv: OnnxConverter, n: OnnxNode) -> Value:
    """QLinearConv with a weight, scale or zero point at run time, as ONNX's reference computes it: the
    int32 convolution of x - x_zero_point and w - w_zero_point (per tensor or per output channel) plus the
    int32 bias, times x_scale * w_scale / y_scale in float32, in float64, plus y_zero_point, rounded half to
    even and saturated."""
    x, w = _require_8bit(cv, n, 0, "x"), _require_8bit(cv, n, 3, "w")
    if len(x.type.shape) < 3 or len(w.type.shape) != len(x.type.shape):
        raise cv.fail(f"x {x.type} and w {w.type} must be [N, C, ...] and [M, C/group, ...] of one rank")
    bias = [v for v in n.inputs[8:9] if v is not None]
    if bias and (bias[0].type.dtype != "int32" or bias[0].type.shape != (w.type.shape[0],)):
        raise cv.fail(f"input 8 (B) is {bias[0].type}; the bias of QLinearConv is int32 [M]")
    dtype = _output_type(cv, n, x)
    acc = _conv_int32(cv, n, _centered(cv, n, 0, "x", 2), _centered(cv, n, 3, "w", 5, axis=0), bias)
    rank = len(acc.type.shape)
    w_scale = _per_channel(cv, n, 4, "w_scale", rank, 1)
    if len(w_scale.type.shape) and w_scale.type.num_elements != w.type.shape[0]:
        raise cv.fail(
            f"w_scale has {w_scale.type.num_elements} values; w {w.type} has {w.type.shape[0]} channels"
        )
    factors = [
        _per_channel(cv, n, 1, "x_scale", rank, None),
        w_scale,
        _per_channel(cv, n, 6, "y_scale", rank, None),
    ]
    return _requantize(cv, n, acc, factors, 7, dtype, n.outputs[0])


def _conv_integer_general(cv: OnnxConverter, n: OnnxNode) -> Value:
    """ConvInteger with a weight or zero point at run time, as ONNX's reference: the int32 convolution of
    x - x_zero_point (a scalar) and w - w_zero_point (a scalar or one per output channel)."""
    x, w = _require_8bit(cv, n, 0, "x"), _require_8bit(cv, n, 1, "w")
    if len(x.type.shape) < 3 or len(w.type.shape) != len(x.type.shape):
        raise cv.fail(f"x {x.type} and w {w.type} must be [N, C, ...] and [M, C/group, ...] of one rank")
    xc, wc = _centered(cv, n, 0, "x", 2), _centered(cv, n, 1, "w", 3, axis=0)
    return _conv_int32(cv, n, xc, wc, [], n.outputs[0])


def _matmul_integer_general(cv: OnnxConverter, n: OnnxNode) -> Value:
    """MatMulInteger with B or a zero point at run time, as ONNX's reference: the int32 numpy matmul of
    A - a_zero_point (a scalar) and B - b_zero_point (a scalar or one per column)."""
    a, b = _centered(cv, n, 0, "A", 2), _centered(cv, n, 1, "B", 3, axis=-1)
    return cv.emit("matmul", [a, b], out=n.outputs[0])


# --- com.microsoft: QLinearAdd, QGemm, QLinearGlobalAveragePool (onnxruntime's QOperator format) ----------


@converts("com.microsoft.QLinearAdd")
def _qlinear_add(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """Inputs A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point, all per tensor,
    numpy broadcasting: qnn.add as onnxruntime's MlasQLinearAdd computes it."""
    a, b = _require_8bit(cv, n, 0, "A"), _require_8bit(cv, n, 3, "B")
    if a.type.dtype != b.type.dtype:
        raise cv.fail(f"input 0 (A) is {a.type.dtype}, input 3 (B) {b.type.dtype}; they must be of one type")
    aq = _qparams(cv, n, 1, "A", a.type.dtype, a)
    bq = _qparams(cv, n, 4, "B", b.type.dtype, b)
    out = _qparams(cv, n, 6, "C", a.type.dtype, None)
    _require_per_tensor(cv, aq, "A")
    _require_per_tensor(cv, bq, "B")
    return [qnn_add(cv, a, b, _add_attrs(aq, bq, out, "NONE"), n.outputs[0])]


@converts("com.microsoft.QGemm")
def _qgemm(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """Inputs A, a_scale, a_zero_point, B, b_scale, b_zero_point [, C] [, y_scale, y_zero_point]; attrs
    alpha, transA, transB. The int32 product of A - a_zero_point [M, K] (per tensor) and a constant
    B - b_zero_point (per tensor or per column), plus the int32 bias C, times alpha * a_scale * b_scale[n]:
    requantized with y_scale / y_zero_point (qnn.dense, `requantize: float`), or as float32 without them
    (qnn.dense's int32 accumulator, cast and scaled as onnxruntime's output processor does)."""
    a = _require_8bit(cv, n, 0, "A")
    b = _require_8bit(cv, n, 3, "B")
    if len(a.type.shape) != 2 or len(b.type.shape) != 2:
        raise cv.fail(f"A and B must be 2-D matrices, got {a.type} and {b.type}")
    aq = _qparams(cv, n, 1, "a", a.type.dtype, a)
    _require_per_tensor(cv, aq, "a")
    trans_b = bool(n.attr("transB", 0))
    b, bq = _weight_qparams(cv, n, 3, "b", axis=0 if trans_b else 1)
    if n.attr("transA", 0):
        a = cv.emit("transpose", [a], {"perm": (1, 0)})
    weight = b.data if trans_b else b.data.T  # [N, K]
    units = weight.shape[0]
    bias = _qgemm_bias(cv, n, units)
    # onnxruntime scales by alpha * a_scale * b_scale[n] in float32, in that order: alpha joins a_scale
    alpha = np.float32(n.attr("alpha", 1.0))
    scaled = QParams((float(alpha * np.float32(aq.scale)),), aq.zero_points, aq.dtype, None)
    if (n.input(7) is None) != (n.input(8) is None):
        raise cv.fail("y_scale and y_zero_point must be given together (a quantized output) or not at all")
    if n.input(7) is not None:
        out = _qparams(cv, n, 7, "y", a.type.dtype, None)
        return [qnn_dense(cv, a, aq, weight, bq, bias, _io_attrs(scaled, out, "NONE"), n.outputs[0])]
    acc = qnn_dense(
        cv, a, aq, weight, bq, bias, {"input_zero_point": aq.zero_point, "out_dtype": "int32"}, None
    )
    scales = np.float32(scaled.scale) * np.asarray(bq.scales, np.float32)
    acc = cv.emit("cast", [acc], {"dtype": "float32"})
    return [cv.emit("multiply", [acc, cv.constant(scales, "scale")], out=n.outputs[0])]


def _qgemm_bias(cv: OnnxConverter, n: OnnxNode, units: int) -> list[Value]:
    """QGemm's input C as qnn.dense's int32 bias [N]: a constant of shape [], [1], [N] or [1, N], or a
    run-time [N]; [] when absent."""
    c = n.input(6)
    if c is None:
        return []
    if c.type.dtype != "int32":
        raise cv.fail(f"input 6 (C) is {c.type.dtype}; the bias of QGemm is int32")
    if c.is_constant and c.type.shape in ((), (1,), (units,), (1, units)):
        return [cv.constant(np.broadcast_to(c.data.reshape(-1), (units,)).astype(np.int32), "bias")]
    if c.type.shape == (units,):
        return [c]
    raise cv.fail(
        f"input 6 (C) is {c.type}; only a bias per column ([N] = [{units}], a constant [1, N] or scalar) "
        f"is supported"
    )


@converts("com.microsoft.QLinearGlobalAveragePool")
def _qlinear_global_average_pool(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """Inputs X, x_scale, x_zero_point, y_scale, y_zero_point, per tensor; attr channels_last: the mean
    over the spatial axes, qnn.mean with onnxruntime's float requantization (`requantize: float`); in NHWC
    when X has an NHWC twin."""
    x = _require_8bit(cv, n, 0, "X")
    rank = len(x.type.shape)
    if rank < 3:
        raise cv.fail(f"input 0 (X) must have a batch, a channel and spatial axes, got {x.type}")
    xq = _qparams(cv, n, 1, "x", x.type.dtype, x)
    _require_per_tensor(cv, xq, "x")
    out = _qparams(cv, n, 3, "y", x.type.dtype, None)
    attrs = {
        "input_scale": xq.scale,
        "input_zero_point": xq.zero_point,
        "output_scale": out.scale,
        "output_zero_point": out.zero_point,
        "out_dtype": out.dtype,
        "keepdims": True,
        "requantize": "float",
    }
    st = _state(cv)
    channels_last = bool(n.attr("channels_last", 0))
    if not channels_last and rank == 4 and x in st.nhwc:
        return [_as_nchw(cv, cv.emit("qnn.mean", [st.nhwc[x]], attrs | {"axes": (1, 2)}), n.outputs[0])]
    axes = tuple(range(1, rank - 1)) if channels_last else tuple(range(2, rank))
    return [cv.emit("qnn.mean", [x], attrs | {"axes": axes}, n.outputs[0])]
