"""The TFLite operator converters: one function per builtin operator (or family), float and int8 forms.

Each takes the `Converter` and the `TfOperator` and returns the Values of the operator's outputs. Layout
stays NHWC; convolutions and pools map onto the NHWC operators, int8 arithmetic onto the `qnn.*` ones
(which compute TFLite's fixed-point multipliers from the float scales given here).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tflite

from aotc.frontend.tflite import Converter, QuantParams, TfOperator
from aotc.graph.ir import Value

Convert = Callable[[Converter, TfOperator], list[Value]]

CONVERTERS: dict[str, Convert] = {}

QUANTIZED_DTYPES = ("int8", "uint8")
_ACT = tflite.ActivationFunctionType
_ACT_NAMES = {
    _ACT.NONE: "NONE",
    _ACT.RELU: "RELU",
    _ACT.RELU_N1_TO_1: "RELU_N1_TO_1",
    _ACT.RELU6: "RELU6",
    _ACT.TANH: "TANH",
    _ACT.SIGN_BIT: "SIGN_BIT",
}


def _converts(*codes: str, quantized: bool = False):
    """Register a converter; one without `quantized` refuses ops whose runtime tensors are integer-quantized."""

    def wrap(fn: Convert) -> Convert:
        def convert(cv: Converter, op: TfOperator) -> list[Value]:
            if not quantized and _is_quantized(cv, op):
                raise cv.fail(f"the quantized form of {op.code} is not supported (only its float form)")
            return fn(cv, op)

        for code in codes:
            CONVERTERS[code] = convert
        return fn

    return wrap


def _is_quantized(cv: Converter, op: TfOperator) -> bool:
    runtime = [t for t in op.inputs if t >= 0 and cv.tensor(t).data is None] + op.outputs
    return any(cv.tensor(t).dtype in QUANTIZED_DTYPES + ("int16",) for t in runtime)


def _quantized_input(cv: Converter, op: TfOperator, i: int = 0) -> bool:
    """Whether the op's input `i` is int8/uint8 (the op runs its quantized form); int16 is refused."""
    dtype = cv.input_tensor(i).dtype
    if dtype == "int16":
        raise cv.fail("16-bit quantized tensors are not supported (int8 and uint8 are)")
    return dtype in QUANTIZED_DTYPES


def _out(op: TfOperator, i: int = 0) -> int:
    return op.outputs[i]


# --- activations and quantization attributes --------------------------------------------------------------


def _activation_name(cv: Converter, op: TfOperator) -> str:
    """The fused activation as the interpreter applies it: a clamp range (CalculateActivationRange),
    which is unbounded for TANH, so that LiteRT ignores a fused TANH on these operators, and so do we."""
    code = op.opt("FusedActivationFunction", _ACT.NONE)
    name = _ACT_NAMES.get(code)
    if name is None or name == "SIGN_BIT":
        raise cv.fail(f"fused activation {name or code} is not supported")
    return "NONE" if name == "TANH" else name


def _with_activation(cv: Converter, op: TfOperator, graph_op: str, inputs: list[Value], attrs: dict) -> Value:
    """A float op followed by its fused activation as its own node; the last node writes the op's output."""
    act = _activation_name(cv, op)
    if act == "NONE":
        return cv.emit(graph_op, inputs, attrs, _out(op))
    y = cv.emit(graph_op, inputs, attrs)
    return _activate(cv, y, act, _out(op))


def _activate(cv: Converter, y: Value, act: str, out: int | None) -> Value:
    if act == "RELU":
        return cv.emit("relu", [y], {}, out)
    low = -1.0 if act == "RELU_N1_TO_1" else 0.0
    return cv.emit("clip", [y], {"min": low, "max": 6.0 if act == "RELU6" else 1.0}, out)


def _per_tensor(cv: Converter, index: int) -> QuantParams:
    q = cv.quant(index)
    if not q.per_tensor:
        raise cv.fail(
            f"tensor {cv.tensor(index).name} must be quantized per tensor, it has {len(q.scales)} scales"
        )
    return q


def _io_quant(cv: Converter, op: TfOperator, inp: int = 0) -> dict[str, Any]:
    """input/output scale and zero point of a one-input quantized op, and its output dtype."""
    qi, qo = _per_tensor(cv, op.inputs[inp]), _per_tensor(cv, _out(op))
    return {
        "input_scale": qi.scale,
        "input_zero_point": qi.zero_point,
        "output_scale": qo.scale,
        "output_zero_point": qo.zero_point,
        "out_dtype": cv.tensor(_out(op)).dtype,
    }


def _weight_quant(cv: Converter, op: TfOperator, i: int, axis: int) -> dict[str, Any]:
    """The weights' scales and zero points, and how the op requantizes its int32 sums."""
    t = cv.input_tensor(i)
    q = cv.quant(t.index)
    if t.dtype != "int8":
        raise cv.fail(f"weights {t.name} are {t.dtype}; quantized operators need int8 weights")
    if not q.per_tensor and (q.axis != axis or len(q.scales) != t.shape[axis]):
        raise cv.fail(
            f"weights {t.name} {list(t.shape)} have {len(q.scales)} scales along axis {q.axis}; "
            f"expected one per tensor or one per entry of axis {axis}"
        )
    return {"weight_scales": q.scales, "weight_zero_points": q.zero_points, "requantize": cv.requantize}


def _bias(cv: Converter, op: TfOperator, i: int, quantized: bool) -> list[Value]:
    t = cv.input_tensor(i)
    if t is None:
        return []
    want = "int32" if quantized else "float32"
    if t.dtype != want:
        raise cv.fail(f"bias {t.name} is {t.dtype}; expected {want}")
    return [cv.value(t.index)]


# --- windows: padding exactly as TFLite's ComputePaddingHeightWidth ---------------------------------------


def out_size(padding: int, size: int, kernel: int, stride: int, dilation: int) -> int:
    effective = (kernel - 1) * dilation + 1
    if padding == tflite.Padding.SAME:
        return (size + stride - 1) // stride
    return (size + stride - effective) // stride


def padding_before_after(padding: int, size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int]:
    """TFLite's (before, after) padding of one spatial axis: the odd unit of a SAME total goes after."""
    effective = (kernel - 1) * dilation + 1
    total = max((out_size(padding, size, kernel, stride, dilation) - 1) * stride + effective - size, 0)
    return total // 2, total - total // 2


def _window(
    cv: Converter, op: TfOperator, hw: Sequence[int], kernel: Sequence[int], dilations=(1, 1)
) -> dict:
    padding = op.opt("Padding", tflite.Padding.SAME)
    if padding not in (tflite.Padding.SAME, tflite.Padding.VALID):
        raise cv.fail(f"unknown padding {padding}")
    strides = (op.opt("StrideH", 1), op.opt("StrideW", 1))
    if min(strides) < 1 or min(dilations) < 1:
        raise cv.fail(f"strides {strides} and dilations {tuple(dilations)} must be positive")
    (top, bottom), (left, right) = (
        padding_before_after(padding, s, k, st, d) for s, k, st, d in zip(hw, kernel, strides, dilations)
    )
    if any(out_size(padding, s, k, st, d) < 1 for s, k, st, d in zip(hw, kernel, strides, dilations)):
        raise cv.fail(f"window {tuple(kernel)} does not fit the input {tuple(hw)}")
    return {"strides": tuple(strides), "pads": (top, left, bottom, right)}


def _nhwc(cv: Converter, v: Value, what: str) -> tuple[int, int, int, int]:
    if len(v.type.shape) != 4:
        raise cv.fail(f"{what} must be 4-D NHWC, got {v.type}")
    return v.type.shape


# --- convolution, fully connected, matmul, pooling --------------------------------------------------------


@_converts("CONV_2D", quantized=True)
def _conv2d(cv: Converter, op: TfOperator) -> list[Value]:
    x, w = cv.input(0), cv.input(1)
    _, h, wd, c = _nhwc(cv, x, "input")
    o, kh, kw, i = _nhwc(cv, w, "filter")
    quantized = _quantized_input(cv, op)
    if c != i and (quantized or c % i or o % (c // i)):
        raise cv.fail(f"input has {c} channels, the filter {w.type} expects {i}")
    dilations = (op.opt("DilationHFactor", 1), op.opt("DilationWFactor", 1))
    attrs = _window(cv, op, (h, wd), (kh, kw), dilations) | {"dilations": dilations}
    return [_conv_node(cv, op, "conv2d_nhwc", [x, w, *_bias(cv, op, 2, quantized)], attrs, quantized, 0)]


@_converts("DEPTHWISE_CONV_2D", quantized=True)
def _depthwise(cv: Converter, op: TfOperator) -> list[Value]:
    x, w = cv.input(0), cv.input(1)
    _, h, wd, c = _nhwc(cv, x, "input")
    one, kh, kw, cm = _nhwc(cv, w, "filter")
    if one != 1 or cm % c:
        raise cv.fail(f"depthwise filter {w.type} does not match an input of {c} channels")
    dilations = (op.opt("DilationHFactor", 1), op.opt("DilationWFactor", 1))
    attrs = _window(cv, op, (h, wd), (kh, kw), dilations) | {
        "dilations": dilations,
        "depth_multiplier": cm // c,
    }
    quantized = _quantized_input(cv, op)
    inputs = [x, w, *_bias(cv, op, 2, quantized)]
    return [_conv_node(cv, op, "depthwise_conv2d_nhwc", inputs, attrs, quantized, 3)]


def _conv_node(
    cv: Converter,
    op: TfOperator,
    name: str,
    inputs: list[Value],
    attrs: dict,
    quantized: bool,
    channel_axis: int,
) -> Value:
    """`name` with the fused activation, or its qnn. form with the quantization parameters (per-channel
    weight scales along the filter's `channel_axis`)."""
    if not quantized:
        _float_weights(cv, op, 1)
        return _with_activation(cv, op, name, inputs, attrs)
    attrs |= (
        _io_quant(cv, op) | _weight_quant(cv, op, 1, channel_axis) | {"activation": _activation_name(cv, op)}
    )
    return cv.emit(f"qnn.{name}", inputs, attrs, _out(op))


@_converts("TRANSPOSE_CONV")
def _transpose_conv(cv: Converter, op: TfOperator) -> list[Value]:
    """Inputs: output shape, filter [O, KH, KW, I], data [N, H, W, I], optional bias [O]."""
    shape = cv.const_input(0, "output_shape")
    w, x = cv.input(1), cv.input(2)
    n, h, wd, c = _nhwc(cv, x, "input")
    o, kh, kw, i = _nhwc(cv, w, "filter")
    _float_weights(cv, op, 1)
    if shape is None or shape.size != 4:
        raise cv.fail("needs a constant 4-D output_shape input")
    _, oh, ow, oc = (int(s) for s in shape)
    if c != i or oc != o:
        raise cv.fail(f"filter {w.type} does not map {c} input channels to the {oc} of output_shape")
    padding = op.opt("Padding", tflite.Padding.SAME)
    strides = (op.opt("StrideH", 1), op.opt("StrideW", 1))
    top, _ = padding_before_after(padding, oh, kh, strides[0], 1)
    left, _ = padding_before_after(padding, ow, kw, strides[1], 1)
    full_h, full_w = (h - 1) * strides[0] + kh, (wd - 1) * strides[1] + kw
    attrs = {
        "strides": strides,
        "pads": (top, left, full_h - oh - top, full_w - ow - left),
        "output_size": (oh, ow),
    }
    return [_with_activation(cv, op, "conv2d_transpose_nhwc", [x, w, *_bias(cv, op, 3, False)], attrs)]


def _float_weights(cv: Converter, op: TfOperator, i: int) -> None:
    t = cv.input_tensor(i)
    if t.dtype != "float32":
        raise cv.fail(
            f"weights {t.name} are {t.dtype} under a float input (a hybrid-quantized model); not supported"
        )


@_converts("FULLY_CONNECTED", quantized=True)
def _fully_connected(cv: Converter, op: TfOperator) -> list[Value]:
    x, w = cv.input(0), cv.input(1)
    if op.opt("WeightsFormat", 0) != 0:
        raise cv.fail("shuffled weight formats are not supported")
    if len(w.type.shape) != 2:
        raise cv.fail(f"weights must be [units, depth], got {w.type}")
    units, depth = w.type.shape
    shape = x.type.shape
    if x.type.num_elements % depth:
        raise cv.fail(f"input {x.type} does not hold whole rows of depth {depth}")
    keep = bool(op.opt("KeepNumDims", False))
    if keep and shape[-1] != depth:
        raise cv.fail(f"keep_num_dims needs the input's last axis to be {depth}, got {x.type}")
    rows = x.type.num_elements // depth
    quantized = _quantized_input(cv, op)
    bias = _bias(cv, op, 2, quantized)
    if quantized:
        attrs = _io_quant(cv, op) | _weight_quant(cv, op, 1, 0) | {"activation": _activation_name(cv, op)}
        if not keep and shape != (rows, depth):
            x = cv.emit("reshape", [x], {"shape": (rows, depth)})
        return [cv.emit("qnn.dense", [x, w, *bias], attrs, _out(op))]
    _float_weights(cv, op, 1)
    if shape != (rows, depth):
        x = cv.emit("reshape", [x], {"shape": (rows, depth)})
    if not keep or len(shape) == 2:
        return [_with_activation(cv, op, "dense", [x, w, *bias], {})]
    y = cv.emit("dense", [x, w, *bias])
    act = _activation_name(cv, op)
    if act == "NONE":
        return [cv.emit("reshape", [y], {"shape": (*shape[:-1], units)}, _out(op))]
    y = cv.emit("reshape", [y], {"shape": (*shape[:-1], units)})
    return [_activate(cv, y, act, _out(op))]


@_converts("BATCH_MATMUL")
def _batch_matmul(cv: Converter, op: TfOperator) -> list[Value]:
    a, b = cv.input(0), cv.input(1)
    if op.opt("AdjX", False):
        a = _swap_last(cv, a)
    if op.opt("AdjY", False):
        b = _swap_last(cv, b)
    return [cv.emit("matmul", [a, b], {}, _out(op))]


def _swap_last(cv: Converter, v: Value) -> Value:
    n = len(v.type.shape)
    if n < 2:
        raise cv.fail(f"adjoint of a {n}-D operand {v.type}")
    return cv.emit("transpose", [v], {"perm": (*range(n - 2), n - 1, n - 2)})


@_converts("AVERAGE_POOL_2D", "MAX_POOL_2D", quantized=True)
def _pool(cv: Converter, op: TfOperator) -> list[Value]:
    x = cv.input(0)
    _, h, w, _ = _nhwc(cv, x, "input")
    kernel = (op.opt("FilterHeight", 1), op.opt("FilterWidth", 1))
    attrs = _window(cv, op, (h, w), kernel) | {"kernel": kernel}
    kind = "avg" if op.code == "AVERAGE_POOL_2D" else "max"
    if not _quantized_input(cv, op):
        return [_with_activation(cv, op, "pool2d_nhwc", [x], attrs | {"kind": kind})]
    attrs |= _io_quant(cv, op) | {"activation": _activation_name(cv, op)}
    return [cv.emit(f"qnn.{kind}_pool2d_nhwc", [x], attrs, _out(op))]


# --- element-wise -----------------------------------------------------------------------------------------

_BINARY = {"ADD": "add", "SUB": "subtract", "MUL": "multiply", "DIV": "divide"}


@_converts(*_BINARY, quantized=True)
def _binary(cv: Converter, op: TfOperator) -> list[Value]:
    a, b = cv.input(0), cv.input(1)
    if not _quantized_input(cv, op):
        return [_with_activation(cv, op, _BINARY[op.code], [a, b], {})]
    if op.code not in ("ADD", "MUL"):
        raise cv.fail(f"the quantized form of {op.code} is not supported (ADD and MUL are)")
    qa, qb, qo = (_per_tensor(cv, t) for t in (op.inputs[0], op.inputs[1], _out(op)))
    attrs = {
        "a_scale": qa.scale,
        "a_zero_point": qa.zero_point,
        "b_scale": qb.scale,
        "b_zero_point": qb.zero_point,
        "output_scale": qo.scale,
        "output_zero_point": qo.zero_point,
        "activation": _activation_name(cv, op),
        "out_dtype": cv.tensor(_out(op)).dtype,
    }
    attrs["requantize"] = cv.requantize  # ADD and MUL: XNNPACK rescales both in float32
    return [cv.emit(f"qnn.{op.code.lower()}", [a, b], attrs, _out(op))]


@_converts("MAXIMUM", "MINIMUM")
def _min_max(cv: Converter, op: TfOperator) -> list[Value]:
    return [cv.emit(op.code.lower(), [cv.input(0), cv.input(1)], {}, _out(op))]


@_converts("SQUARED_DIFFERENCE")
def _squared_difference(cv: Converter, op: TfOperator) -> list[Value]:
    d = cv.emit("subtract", [cv.input(0), cv.input(1)])
    return [cv.emit("multiply", [d, d], {}, _out(op))]


_UNARY: dict[str, tuple[str, dict[str, Any]]] = {
    "RELU": ("relu", {}),
    "RELU6": ("clip", {"min": 0.0, "max": 6.0}),
    "RELU_N1_TO_1": ("clip", {"min": -1.0, "max": 1.0}),
    "LOGISTIC": ("sigmoid", {}),
    "TANH": ("tanh", {}),
    "HARD_SWISH": ("hard_swish", {}),
    "EXP": ("exp", {}),
    "SQRT": ("sqrt", {}),
}


@_converts(*_UNARY, "LOGISTIC", "HARD_SWISH", quantized=True)
def _unary(cv: Converter, op: TfOperator) -> list[Value]:
    x = cv.input(0)
    if not _quantized_input(cv, op):
        graph_op, attrs = _UNARY[op.code]
        return [cv.emit(graph_op, [x], attrs, _out(op))]
    if op.code not in ("LOGISTIC", "HARD_SWISH"):
        raise cv.fail(f"the quantized form of {op.code} is not supported")
    return [cv.emit(f"qnn.{op.code.lower()}", [x], _io_quant(cv, op), _out(op))]


@_converts("LEAKY_RELU")
def _leaky_relu(cv: Converter, op: TfOperator) -> list[Value]:
    return [cv.emit("leaky_relu", [cv.input(0)], {"alpha": float(op.opt("Alpha", 0.2))}, _out(op))]


@_converts("GELU")
def _gelu(cv: Converter, op: TfOperator) -> list[Value]:
    approximate = "tanh" if op.opt("Approximate", False) else "none"
    return [cv.emit("gelu", [cv.input(0)], {"approximate": approximate}, _out(op))]


@_converts("RSQRT")
def _rsqrt(cv: Converter, op: TfOperator) -> list[Value]:
    return [cv.emit("reciprocal", [cv.emit("sqrt", [cv.input(0)])], {}, _out(op))]


# --- reductions and softmax -------------------------------------------------------------------------------

_REDUCE = {"MEAN": "reduce_mean", "SUM": "reduce_sum", "REDUCE_MAX": "reduce_max"}


@_converts(*_REDUCE, quantized=True)
def _reduce(cv: Converter, op: TfOperator) -> list[Value]:
    x = cv.input(0)
    ndim = len(x.type.shape)
    given = cv.const_input(1, "axes")
    if given is None:
        raise cv.fail("needs a constant axes input")
    axes = tuple(sorted({_axis(cv, int(a), ndim) for a in given.reshape(-1)}))
    attrs = {"axes": axes, "keepdims": bool(op.opt("KeepDims", False))}
    if not axes:
        return [cv.emit("identity", [x], {}, _out(op))]
    if not _quantized_input(cv, op):
        return [cv.emit(_REDUCE[op.code], [x], attrs, _out(op))]
    if op.code != "MEAN":
        raise cv.fail(f"the quantized form of {op.code} is not supported (MEAN is)")
    return [cv.emit("qnn.mean", [x], attrs | _io_quant(cv, op), _out(op))]


@_converts("SOFTMAX", quantized=True)
def _softmax(cv: Converter, op: TfOperator) -> list[Value]:
    x = cv.input(0)
    beta = float(op.opt("Beta", 1.0))
    if _quantized_input(cv, op):
        return [cv.emit("qnn.softmax", [x], {"beta": beta} | _io_quant(cv, op), _out(op))]
    if beta != 1.0:
        x = cv.emit("multiply", [x, cv.constant(np.float32(beta), "beta")])
    return [cv.emit("softmax", [x], {"axis": len(x.type.shape) - 1}, _out(op))]


@_converts("LOG_SOFTMAX")
def _log_softmax(cv: Converter, op: TfOperator) -> list[Value]:
    x = cv.input(0)
    return [cv.emit("log_softmax", [x], {"axis": len(x.type.shape) - 1}, _out(op))]


# --- shapes, layout, indexing (also on int8 values: they move raw values) ----------------------------------


def _axis(cv: Converter, axis: int, ndim: int) -> int:
    if not -ndim <= axis < max(ndim, 1):
        raise cv.fail(f"axis {axis} is out of range for rank {ndim}")
    return axis % max(ndim, 1)


def _reshape_to(cv: Converter, op: TfOperator, x: Value, shape: Sequence[int]) -> Value:
    shape = tuple(int(s) for s in shape)
    if math.prod(shape) != x.type.num_elements:
        raise cv.fail(f"cannot reshape {x.type} to {list(shape)}")
    if shape == x.type.shape:
        return cv.emit("identity", [x], {}, _out(op))
    return cv.emit("reshape", [x], {"shape": shape}, _out(op))


@_converts("RESHAPE", quantized=True)
def _reshape(cv: Converter, op: TfOperator) -> list[Value]:
    x = cv.input(0)
    given = cv.const_input(1, "shape") if cv.input_tensor(1) is not None else None
    if given is None and op.options is not None and op.options.NewShapeLength():
        given = op.options.NewShapeAsNumpy()
    if given is None:
        if cv.shapes_overridden:
            raise cv.fail("needs a constant shape input when input shapes are given")
        given = np.asarray(cv.tensor(_out(op)).shape)
    shape = [int(s) for s in np.asarray(given).reshape(-1)]
    if not x.is_constant:
        shape = cv.batch.reshape_target(shape, x.type.shape)
    if shape.count(-1) > 1 or any(s < -1 for s in shape):
        raise cv.fail(f"cannot reshape {x.type} to {shape}")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        shape[shape.index(-1)] = x.type.num_elements // known if known else 0
    return [_reshape_to(cv, op, x, shape)]


@_converts("SQUEEZE", quantized=True)
def _squeeze(cv: Converter, op: TfOperator) -> list[Value]:
    x = cv.input(0)
    shape = x.type.shape
    dims = (
        op.options.SqueezeDimsAsNumpy() if op.options is not None and op.options.SqueezeDimsLength() else []
    )
    axes = {_axis(cv, int(a), len(shape)) for a in dims} or {d for d, s in enumerate(shape) if s == 1}
    if any(shape[a] != 1 for a in axes):
        raise cv.fail(f"cannot squeeze axes {sorted(axes)} of {x.type}: their extents are not 1")
    return [_reshape_to(cv, op, x, [s for d, s in enumerate(shape) if d not in axes])]


@_converts("EXPAND_DIMS", quantized=True)
def _expand_dims(cv: Converter, op: TfOperator) -> list[Value]:
    x = cv.input(0)
    given = cv.const_input(1, "axis")
    if given is None or given.size != 1:
        raise cv.fail("needs a constant scalar axis input")
    shape = list(x.type.shape)
    axis = _axis(cv, int(given.reshape(-1)[0]), len(shape) + 1)
    shape.insert(axis, 1)
    return [_reshape_to(cv, op, x, shape)]


@_converts("TRANSPOSE", quantized=True)
def _transpose(cv: Converter, op: TfOperator) -> list[Value]:
    x = cv.input(0)
    perm = cv.const_input(1, "perm")
    ndim = len(x.type.shape)
    perm = tuple(_axis(cv, int(p), ndim) for p in perm.reshape(-1))
    if sorted(perm) != list(range(ndim)):
        raise cv.fail(f"perm {list(perm)} is not a permutation of {ndim} axes")
    return [cv.emit("transpose", [x], {"perm": perm}, _out(op))]


@_converts("CONCATENATION", quantized=True)
def _concatenation(cv: Converter, op: TfOperator) -> list[Value]:
    parts = [cv.value(t) for t in op.inputs]
    axis = _axis(cv, op.opt("Axis", 0), len(parts[0].type.shape))
    if not _quantized_input(cv, op):
        if len(parts) == 1:
            return [_with_activation(cv, op, "identity", parts, {})]
        return [_with_activation(cv, op, "concat", parts, {"axis": axis})]
    if _activation_name(cv, op) != "NONE":
        raise cv.fail("a fused activation on a quantized CONCATENATION is not supported")
    qo = _per_tensor(cv, _out(op))
    out_dtype = cv.tensor(_out(op)).dtype
    same = []
    for t, v in zip(op.inputs, parts):
        qi = _per_tensor(cv, t)
        if (qi.scale, qi.zero_point) == (qo.scale, qo.zero_point) and v.type.dtype == out_dtype:
            same.append(v)
            continue
        attrs = {
            "input_scale": qi.scale,
            "input_zero_point": qi.zero_point,
            "output_scale": qo.scale,
            "output_zero_point": qo.zero_point,
            "out_dtype": out_dtype,
        }
        same.append(cv.emit("qnn.requantize", [v], attrs))
    if len(same) == 1:
        return [cv.emit("identity", same, {}, _out(op))]
    return [cv.emit("concat", same, {"axis": axis}, _out(op))]


def _slice(cv: Converter, op: TfOperator, x: Value, ranges: Sequence[range], out: int | None) -> Value:
    if any(len(r) == 0 for r in ranges):
        raise cv.fail(f"the slice of {x.type} is empty; zero-sized tensors are not supported")
    if all(r == range(s) for r, s in zip(ranges, x.type.shape)):
        return cv.emit("identity", [x], {}, out)
    attrs = {
        "begin": tuple(r.start for r in ranges),
        "end": tuple(r.stop for r in ranges),
        "strides": tuple(r.step for r in ranges),
    }
    return cv.emit("strided_slice", [x], attrs, out)


@_converts("SPLIT", quantized=True)
def _split(cv: Converter, op: TfOperator) -> list[Value]:
    axis_data = cv.const_input(0, "axis")
    x = cv.input(1)
    shape = x.type.shape
    axis = _axis(cv, int(axis_data.reshape(-1)[0]), len(shape))
    parts = len(op.outputs)
    if shape[axis] % parts:
        raise cv.fail(f"axis {axis} of {x.type} does not split into {parts} equal parts")
    size = shape[axis] // parts
    outs = []
    for k, out in enumerate(op.outputs):
        ranges = [range(s) for s in shape]
        ranges[axis] = range(k * size, (k + 1) * size)
        outs.append(_slice(cv, op, x, ranges, out))
    return outs


@_converts("SLICE", quantized=True)
def _slice_op(cv: Converter, op: TfOperator) -> list[Value]:
    x = cv.input(0)
    begin, size = cv.const_input(1, "begin"), cv.const_input(2, "size")
    shape = x.type.shape
    if begin is None or size is None or begin.size != len(shape) or size.size != len(shape):
        raise cv.fail(f"needs constant begin and size with one entry per axis of {x.type}")
    ranges = []
    for b, s, n in zip(begin.reshape(-1), size.reshape(-1), shape):
        b, s = int(b), int(s)
        end = n if s == -1 else b + s
        if not 0 <= b <= end <= n:
            raise cv.fail(f"slice begin {begin.tolist()} size {size.tolist()} is out of range for {x.type}")
        ranges.append(range(b, end))
    return [_slice(cv, op, x, ranges, _out(op))]


@_converts("STRIDED_SLICE", quantized=True)
def _strided_slice(cv: Converter, op: TfOperator) -> list[Value]:
    x = cv.input(0)
    begin, end, strides = (cv.const_input(i, what) for i, what in ((1, "begin"), (2, "end"), (3, "strides")))
    shape = x.type.shape
    if begin is None or end is None or strides is None:
        raise cv.fail("needs constant begin, end and strides")
    if op.opt("EllipsisMask", 0) or op.opt("NewAxisMask", 0):
        raise cv.fail("ellipsis_mask and new_axis_mask are not supported")
    begin, end, strides = (np.asarray(a).reshape(-1).astype(np.int64) for a in (begin, end, strides))
    if not len(begin) == len(end) == len(strides) <= len(shape):
        raise cv.fail(f"begin/end/strides of lengths {len(begin)}/{len(end)}/{len(strides)} for {x.type}")
    begin_mask, end_mask = op.opt("BeginMask", 0), op.opt("EndMask", 0)
    shrink = op.opt("ShrinkAxisMask", 0)
    offset = bool(op.opt("Offset", False))
    ranges, keep = [], []
    for d, n in enumerate(shape):
        if d >= len(begin):
            ranges.append(range(n))
            keep.append(n)
            continue
        b, e, s = int(begin[d]), int(end[d]), int(strides[d])
        if s == 0:
            raise cv.fail("strides must be nonzero")
        if offset:
            e += b
        if shrink >> d & 1:
            index = b + n if b < 0 else b
            if not 0 <= index < n:
                raise cv.fail(f"shrink index {b} is out of range for axis {d} of {x.type}")
            ranges.append(range(index, index + 1))
            continue
        start = None if begin_mask >> d & 1 else b
        stop = None if end_mask >> d & 1 else e
        r = range(*slice(start, stop, s).indices(n))
        ranges.append(r)
        keep.append(len(r))
    if not any(shrink >> d & 1 for d in range(len(shape))):
        return [_slice(cv, op, x, ranges, _out(op))]
    sliced = _slice(cv, op, x, ranges, None)
    return [_reshape_to(cv, op, sliced, keep)]


@_converts("PAD", "PADV2", quantized=True)
def _pad(cv: Converter, op: TfOperator) -> list[Value]:
    x = cv.input(0)
    paddings = cv.const_input(1, "paddings")
    ndim = len(x.type.shape)
    if paddings is None or paddings.shape != (ndim, 2) or (paddings < 0).any():
        raise cv.fail(f"needs constant non-negative paddings of shape [{ndim}, 2]")
    value: float | int = 0.0
    quantized = _quantized_input(cv, op)
    if quantized:
        value = _per_tensor(cv, _out(op)).zero_point
    given = cv.const_input(2, "constant_values") if op.code == "PADV2" else None
    if given is not None:
        value = given.reshape(-1)[0].item()
    if not paddings.any():
        return [cv.emit("identity", [x], {}, _out(op))]
    attrs = {
        "before": tuple(int(p) for p in paddings[:, 0]),
        "after": tuple(int(p) for p in paddings[:, 1]),
        "mode": "constant",
        "value": int(value) if quantized or x.type.dtype.startswith("int") else float(value),
    }
    return [cv.emit("pad", [x], attrs, _out(op))]


@_converts("GATHER", quantized=True)
def _gather(cv: Converter, op: TfOperator) -> list[Value]:
    data, indices = cv.input(0), cv.input(1)
    if op.opt("BatchDims", 0):
        raise cv.fail("batch_dims is not supported")
    if indices.type.dtype not in ("int32", "int64"):
        raise cv.fail(f"indices must be int32 or int64, got {indices.type.dtype}")
    axis = _axis(cv, op.opt("Axis", 0), len(data.type.shape))
    return [cv.emit("take", [data, indices], {"axis": axis}, _out(op))]


@_converts("RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR", quantized=True)
def _resize(cv: Converter, op: TfOperator) -> list[Value]:
    x = cv.input(0)
    n, h, w, c = _nhwc(cv, x, "input")
    size = cv.const_input(1, "size")
    if size is None or size.size != 2:
        raise cv.fail("needs a constant size input [new_height, new_width]")
    oh, ow = (int(s) for s in size.reshape(-1))
    align, half = bool(op.opt("AlignCorners", False)), bool(op.opt("HalfPixelCenters", False))
    if align and half:
        raise cv.fail("align_corners together with half_pixel_centers is not supported")
    bilinear = op.code == "RESIZE_BILINEAR"
    if bilinear and _quantized_input(cv, op):
        raise cv.fail("the quantized form of RESIZE_BILINEAR is not supported")
    ctm = "align_corners" if align else "half_pixel" if half else "asymmetric"
    attrs = {
        "size": (n, oh, ow, c),
        "scales": (1.0, oh / h, ow / w, 1.0),
        "mode": "linear" if bilinear else "nearest",
        "coordinate_transformation_mode": ctm,
        "nearest_mode": "floor" if ctm == "asymmetric" else "round_prefer_ceil",
    }
    if (oh, ow) == (h, w) and not align:
        return [cv.emit("identity", [x], {}, _out(op))]
    return [cv.emit("resize", [x], attrs, _out(op))]


# --- quantize / dequantize --------------------------------------------------------------------------------


def dequantized(data: np.ndarray, q: QuantParams) -> np.ndarray:
    """float32 value of quantized constant data, per tensor or per channel (as TFLite's reference)."""
    shape = [1] * data.ndim
    if not q.per_tensor:
        shape[q.axis] = -1
    scale = np.asarray(q.scales, np.float64).reshape(shape)
    zero = np.asarray(q.zero_points, np.int64).reshape(shape)
    return (scale * (data.astype(np.int64) - zero)).astype(np.float32)


@_converts("DEQUANTIZE", quantized=True)
def _dequantize(cv: Converter, op: TfOperator) -> list[Value]:
    t = cv.input_tensor(0)
    if t.data is not None:
        if t.dtype == "float16":
            return [cv.constant(t.data.astype(np.float32), "dequantized")]
        if t.dtype in QUANTIZED_DTYPES:
            return [cv.constant(dequantized(t.data, cv.quant(t.index)), "dequantized")]
        raise cv.fail(f"cannot dequantize a constant of type {t.dtype}")
    if t.dtype not in QUANTIZED_DTYPES:
        raise cv.fail(f"dequantizing a run-time {t.dtype} tensor is not supported (int8, uint8 are)")
    q = cv.quant(t.index)
    attrs = {"scale": q.scales, "zero_point": q.zero_points, "axis": q.axis}
    return [cv.emit("qnn.dequantize", [cv.value(t.index)], attrs, _out(op))]


@_converts("QUANTIZE", quantized=True)
def _quantize(cv: Converter, op: TfOperator) -> list[Value]:
    t = cv.input_tensor(0)
    out = cv.tensor(_out(op))
    if out.dtype not in QUANTIZED_DTYPES:
        raise cv.fail(f"quantizing to {out.dtype} is not supported (int8, uint8 are)")
    qo = _per_tensor(cv, _out(op))
    attrs: dict[str, Any] = {
        "output_scale": qo.scale,
        "output_zero_point": qo.zero_point,
        "out_dtype": out.dtype,
    }
    if t.dtype in QUANTIZED_DTYPES:
        qi = _per_tensor(cv, t.index)
        # a requantization: under `float` as XNNPACK's convert computes it (LiteRT's default path); int8 ->
        # int8 else as LiteRT's builtin kernel on x86, whose last rounding shift rounds half up
        attrs |= {"input_scale": qi.scale, "input_zero_point": qi.zero_point, "requantize": cv.requantize}
        if t.dtype == out.dtype == "int8":
            attrs["rounding"] = "half_up"
    elif t.dtype != "float32":
        raise cv.fail(f"quantizing a {t.dtype} tensor is not supported")
    return [cv.emit("qnn.quantize", [cv.value(t.index)], attrs, _out(op))]
