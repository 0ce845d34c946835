"""ONNX frontend: low-precision and sub-byte element types (bfloat16, float8, float4, float8e8m0, int4, int2)
and BitCast.

A tensor of such a type is its storage bits in the graph (aotc.topi.lowp), tagged with its format in
`OnnxConverter.formats`. Operators that read the format convert it (Cast, CastLike, QuantizeLinear,
DequantizeLinear); data movement passes the bits on; the operators of BFLOAT16_IN_FLOAT32 compute on
bfloat16 decoded to float32 (`widened`, `narrowed`); any other operator given one is refused by
`check_inputs`, so no kernel ever computes on the bits as if they were integers.
"""

from __future__ import annotations

# This module extends the ONNX frontend: its converters use the converter API that onnx.py defines.
import dataclasses

import ml_dtypes
import numpy as np
import onnx

from aotc.frontend.onnx import OnnxConverter, OnnxNode, converts
from aotc.frontend.onnx_schema import signature
from aotc.graph.ir import Value
from aotc.ir.expr import DTYPES, dtype_bits, unique_name
from aotc.topi.lowp import FORMATS

__all__ = [
    "BFLOAT16_IN_FLOAT32",
    "FLOAT8_SATURATES",
    "MOVES_BITS",
    "READS_FORMAT",
    "READS_SHAPE",
    "VERSIONS",
    "cast",
    "check_inputs",
    "decode",
    "dequantize_linear",
    "general_qdq",
    "narrowed",
    "quantize_linear",
    "widened",
]

VERSIONS: dict[str, tuple[int, ...]] = {
    "BitCast": (26,),
}
"""ONNX operator -> the versions of it that this module converts (merged into aotc.frontend.onnx.VERSIONS)."""

READS_FORMAT = frozenset({"Cast", "CastLike", "QuantizeLinear", "DequantizeLinear", "Range"})
"""Operators whose converters read a low-precision input's format (Range: its constants, which
`OnnxConverter.const_input` gives as ml_dtypes arrays)."""
MOVES_BITS = {
    **dict.fromkeys(("Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose"), 0),
    **dict.fromkeys(("Gather", "Slice", "Expand", "Tile", "Compress", "ReverseSequence"), 0),
    "OneHot": 2,  # values[1] or values[0] at each point: a selection
}
"""Operators that only move (select, copy) the elements of one input, by index: their output 0 has its
format."""
READS_SHAPE = frozenset({"Shape", "Size"})
"""Operators that read a tensor's shape only."""
BFLOAT16_IN_FLOAT32 = frozenset(
    {
        *("Abs", "Neg", "Sign", "Floor", "Ceil", "Round", "Relu", "ThresholdedRelu", "IsNaN", "IsInf"),
        *("Sqrt", "Reciprocal", "Exp", "Log", "Erf", "Softplus", "Tanh", "Sin", "Cos", "Tan", "Asin"),
        *("Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh"),
        *("Add", "Sub", "Mul", "Div", "Pow", "Mod", "PRelu", "Max", "Min", "Clip", "Where"),
        *("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"),
        *("ReduceMax", "ReduceMin", "MatMul", "Einsum"),
    }
)
"""Operators computed on bfloat16 inputs in float32 (each decoded exactly), each bfloat16 output rounded
once to nearest even (bool and integer outputs as they are): ONNX's reference for each is one numpy
operation on ml_dtypes' bfloat16 arrays, which computes in float32 (matmul accumulating in float32) and
rounds once per output; checked against onnx.reference.ReferenceEvaluator on random bfloat16 inputs
(tests/test_onnx_lowp.py). Left out, so refused, where the reference rounds intermediate steps to
bfloat16 and differs: Sum and Mean of 3 (pairwise), Gemm (alpha * A @ B, + beta * C), Sigmoid, Softsign,
HardSigmoid, HardSwish, Elu, Selu, LeakyRelu, Mish, Gelu, Celu, Softmax, LogSoftmax, LayerNormalization,
Attention, CumSum and the sums and products (ReduceSum, ReduceMean, ReduceProd, ReduceL1/L2...), which numpy
accumulates in bfloat16; and ArgMax, ArgMin, Hardmax, which pick a different index around NaN or ties."""

FLOAT8 = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
FLOAT8_SATURATES = frozenset(FLOAT8)
"""The formats Cast's `saturate` applies to (and float8e8m0, by its own rule); bfloat16 overflows to
infinity and float4e2m1 always saturates."""


def check_inputs(cv: OnnxConverter, n: OnnxNode) -> str | None:
    """Refuse node `n` if it reads a low-precision input it cannot; the format its output 0 carries when it
    only moves input 0's bits, else None."""
    tagged = [(i, v) for i, v in enumerate(n.inputs) if v is not None and v.name in cv.formats]
    if not tagged or n.op_type in READS_FORMAT or n.op_type in READS_SHAPE:
        return None
    if n.op_type in MOVES_BITS and [i for i, _ in tagged] == [MOVES_BITS[n.op_type]]:
        return cv.formats[tagged[0][1].name]
    if n.op_type in BFLOAT16_IN_FLOAT32 and all(cv.formats[v.name] == "bfloat16" for _, v in tagged):
        return None  # `widened` decodes them
    i, v = tagged[0]
    raise cv.fail(
        f"input {i} ({v.name}) has element type {cv.formats[v.name]}; aotc reads such tensors only in "
        f"{', '.join(sorted(READS_FORMAT))} and moves them in {', '.join(sorted(MOVES_BITS))}"
    )


def widened(cv: OnnxConverter, n: OnnxNode) -> OnnxNode:
    """Node `n` as its converter is to see it: for an operator of BFLOAT16_IN_FLOAT32, each bfloat16 input
    decoded to float32 and each output the schema types as one of them renamed (`narrowed` rounds it to
    bfloat16 under its ONNX name); `n` itself otherwise."""
    tagged = [v for v in n.inputs if v is not None and v.name in cv.formats]
    if n.op_type not in BFLOAT16_IN_FLOAT32 or not tagged:
        return n
    sig = signature(n.op_type, "", n.version) if n.version is not None else None
    if sig is None:
        raise cv.fail("a bfloat16 input, and no schema to say which outputs are bfloat16")
    # an output is bfloat16 where its type constraint is one a bfloat16 input binds (Pow's base, not its
    # exponent; Where's X and Y, not its condition)
    formals = [*sig.inputs[:-1], *[sig.inputs[-1]] * (len(n.inputs) - len(sig.inputs) + 1)]
    bound = {f.type_str for f, v in zip(formals, n.inputs) if v is not None and v.name in cv.formats}
    out_formals = [*sig.outputs, *[sig.outputs[-1]] * max(0, len(n.outputs) - len(sig.outputs))]
    outputs = [
        unique_name(f"{o}/float32", cv.value_names) if o and f.type_str in bound else o
        for f, o in zip(out_formals, n.outputs)
    ]
    inputs = [decode(cv, v) if v is not None else None for v in n.inputs]
    return dataclasses.replace(n, inputs=inputs, outputs=outputs)


def narrowed(cv: OnnxConverter, n: OnnxNode, wide: OnnxNode, results: list[Value]) -> list[Value]:
    """The converter's `results` for `wide` (`widened(cv, n)`): each output it renamed, a float32 value,
    rounded once to bfloat16 under `n`'s name for it."""
    out = []
    for i, v in enumerate(results):
        if v is not None and i < len(n.outputs) and wide.outputs[i] != n.outputs[i]:
            if v.type.dtype != "float32":
                raise cv.fail(f"output {i} computed as {v.type.dtype}, not float32, cannot be bfloat16")
            attrs = {"format": "bfloat16", "saturate": False, "round_mode": "up"}
            v = cv.emit("lowp_encode", [v], attrs, n.outputs[i])
            cv.formats[v.name] = "bfloat16"
        out.append(v)
    return out


def cast(cv: OnnxConverter, n: OnnxNode, x: Value, target: str) -> Value:
    """Cast or CastLike where the input or the target (`target`: a dtype or a FORMATS name) is a
    low-precision type: the input widened exactly (lowp_decode), then rounded to the target once
    (lowp_encode, with Cast's saturate and round_mode) or cast as any other value."""
    source = cv.formats.get(x.name)
    if source == target:
        return x
    v = x
    if source is not None:
        v = cv.emit("lowp_decode", [v], {"format": source})
    if target in FORMATS:
        attrs = {
            "format": target,
            "saturate": bool(n.attr("saturate", 1)) and target in FLOAT8_SATURATES | {"float8_e8m0fnu"},
            "round_mode": n.attr("round_mode", "up"),
        }
        v = cv.emit("lowp_encode", [v], attrs, n.outputs[0])
        cv.formats[v.name] = target
        return v
    if v.type.dtype != target:
        v = cv.emit("cast", [v], {"dtype": target}, n.outputs[0])
    return v


def decode(cv: OnnxConverter, v: Value, out: str | None = None) -> Value:
    """A tagged value widened exactly to float32 (int8/uint8 for the integer formats) (an untagged one as it is)."""
    if v.name not in cv.formats:
        return v
    return cv.emit("lowp_decode", [v], {"format": cv.formats[v.name]}, out)


@converts("BitCast")
def _bitcast(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """The input's bits read as `to`, a numeric type of the same width (BitCast-26); a bool's byte is 0 or
    1, so bool reads as int8/uint8 as it casts, and nothing else is read as bool."""
    x, code = n.inputs[0], n.attr("to")
    try:
        to = "bool" if code == onnx.TensorProto.BOOL else onnx.helper.tensor_dtype_to_np_dtype(code).name
    except (KeyError, ValueError, TypeError):
        to = None
    if to not in DTYPES:
        raise cv.fail(f"cannot bit-cast to element type {code}: not a type aotc computes on")
    if to == x.type.dtype:
        return [x]
    if "bool" in (to, x.type.dtype):
        if x.type.dtype == "bool" and to in ("int8", "uint8"):
            return [cv.emit("cast", [x], {"dtype": to}, n.outputs[0])]
        raise cv.fail(f"cannot bit-cast {x.type.dtype} to {to}: only bool's byte reads as int8 or uint8")
    if dtype_bits(to) != dtype_bits(x.type.dtype):
        raise cv.fail(f"cannot bit-cast {x.type.dtype} to {to}: their widths differ")
    return [cv.emit("bitcast", [x], {"dtype": to}, n.outputs[0])]


# --- QuantizeLinear / DequantizeLinear of the types onnx_quant's integer kernels do not take ---------------

WIDE_INTS = {"int16": (-32768, 32767), "uint16": (0, 65535), "int8": (-128, 127), "uint8": (0, 255)}
"""Quantized integer types computed here (int8/uint8 only when blocked), with their ranges."""


QUANT_TYPES_SINCE = {name: 19 for name in FLOAT8} | {"int16": 21, "uint16": 21, "int4": 21, "uint4": 21}
QUANT_TYPES_SINCE |= {"float4_e2m1fn": 23, "int2": 25, "uint2": 25}
"""The QuantizeLinear/DequantizeLinear version that added each quantized type (the changelog's T2/T1)."""


def general_qdq(cv: OnnxConverter, n: OnnxNode) -> bool:
    """Whether a QuantizeLinear/DequantizeLinear is this module's: a low-precision tensor or zero point,
    int16/uint16, a float16 scale, a low-precision output_dtype, blocked quantization, or a scale or zero
    point computed or fed at run time."""
    if any(v is not None and v.name in cv.formats for v in n.inputs):
        return True
    if any(v is not None and not v.is_constant for v in n.inputs[1:3]):
        return True  # run-time scale or zero point: kernel inputs, which the qnn ops do not take
    zero, scale = n.input(2), n.input(1)
    if zero is not None and zero.type.dtype in ("int16", "uint16"):
        return True
    if n.attr("block_size", 0) or (scale is not None and scale.type.dtype == "float16"):
        return True
    return _onnx_type(n.attr("output_dtype", 0)) in set(FORMATS) | {"int16", "uint16"}


def _onnx_type(code: int) -> str | None:
    """A tensor element type code as a FORMATS name or a dtype (None: 0 or one aotc does not know)."""
    if not code:
        return None
    try:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(code)
    except (KeyError, ValueError, TypeError):
        return None
    return dtype.name if dtype.name in FORMATS or dtype.name in DTYPES else None


def _values(cv: OnnxConverter, v: Value) -> np.ndarray:
    """A constant's values as numbers: a tagged one's bits read as its ml_dtypes type, widened."""
    data = np.asarray(v.data)
    if v.name in cv.formats:
        data = data.view(np.dtype(getattr(ml_dtypes, cv.formats[v.name])))
        return data.astype(np.float32 if FORMATS[cv.formats[v.name]].kind == "float" else np.int32)
    return data


Param = np.ndarray | Value
"""A scale or zero point: a constant's values, or a run-time value (a kernel input or computed)."""


def _shape(values: Param) -> tuple[int, ...]:
    return tuple(values.shape) if isinstance(values, np.ndarray) else tuple(values.type.shape)


def _broadcast(cv: OnnxConverter, n: OnnxNode, values: Param, x: Value, what: str) -> Param:
    """A scale or zero point shaped to broadcast against `x`: one value, one per entry of `axis`, or with
    block_size one per block of that many entries along `axis` (the same shape as x's otherwise); a
    run-time one by reshape / broadcast / slice ops, as ONNX's reference (`reshape_input`) does."""
    shape, block, vshape = x.type.shape, n.attr("block_size", 0), _shape(values)
    const = isinstance(values, np.ndarray)
    size = int(np.prod(vshape, dtype=np.int64))
    if size == 1 and not block:
        return values.reshape(()) if const else cv.emit("reshape", [values], {"shape": ()})
    axis = n.attr("axis", 1)
    if not -len(shape) <= axis < len(shape):
        raise cv.fail(f"axis {axis} is out of range for {x.type}")
    axis %= len(shape)
    if not block:
        if len(vshape) != 1 or size != shape[axis]:
            raise cv.fail(f"{what} has shape {list(vshape)}; axis {axis} of {x.type} has {shape[axis]}")
        dims = tuple(size if d == axis else 1 for d in range(len(shape)))
        return values.reshape(dims) if const else cv.emit("reshape", [values], {"shape": dims})
    blocks = -(-shape[axis] // block) if block > 0 else 0
    expected = tuple(blocks if d == axis else s for d, s in enumerate(shape))
    if block < 0 or vshape != expected:
        raise cv.fail(f"block_size={block}: {what} has shape {list(vshape)}, expected {list(expected)}")
    if const:
        return np.repeat(values, block, axis=axis).take(range(shape[axis]), axis=axis)
    # repeat each entry `block` times along axis: [.., blocks, 1, ..] -> [.., blocks, block, ..], merged,
    # then cut to x's extent (the last block may be partial)
    split = (*expected[:axis], blocks, 1, *expected[axis + 1 :])
    v = cv.emit("reshape", [values], {"shape": split})
    v = cv.emit("broadcast_to", [v], {"shape": (*split[: axis + 1], block, *split[axis + 2 :])})
    v = cv.emit("reshape", [v], {"shape": (*shape[:axis], blocks * block, *shape[axis + 1 :])})
    if blocks * block == shape[axis]:
        return v
    attrs = {"begin": (0,) * len(shape), "end": tuple(shape), "strides": (1,) * len(shape)}
    return cv.emit("strided_slice", [v], attrs)


def _operand(cv: OnnxConverter, v: Param, hint: str, dtype: str) -> Value:
    """A broadcast scale or zero point as a graph value of `dtype`: a constant, or the run-time value cast."""
    if isinstance(v, np.ndarray):
        return cv.constant(v, hint, dtype)
    return v if v.type.dtype == dtype else cv.emit("cast", [v], {"dtype": dtype})


def _nonzero(zero: Param | None) -> bool:
    """Whether a zero point may be nonzero: a run-time one may."""
    return zero is not None and (not isinstance(zero, np.ndarray) or bool(np.any(zero)))


def _quant_params(cv: OnnxConverter, n: OnnxNode, x: Value, quantized: Value | None) -> tuple:
    """(scale as float32, zero point as float32 or None, the quantized type): a dtype or FORMATS name.
    Each is a constant's values or, fed or computed at run time, a graph value (float32; an int32 zero
    point float64, which holds it exactly)."""
    scale_v, zero_v = n.input(1), n.input(2)
    if scale_v is None or scale_v.type.dtype not in ("float32", "float16") or scale_v.name in cv.formats:
        raise cv.fail("the scale must be float32 or float16")
    if scale_v.is_constant:
        scale = np.asarray(scale_v.data).astype(np.float32)
        if not np.all(np.isfinite(scale)) or np.any(scale == 0):
            raise cv.fail(f"the scale must be finite and nonzero, got {scale.reshape(-1)[:8].tolist()}")
    else:  # float16 widens to float32 exactly
        scale = _operand(cv, scale_v, "scale", "float32")
    if quantized is not None:
        qtype = cv.formats.get(quantized.name, quantized.type.dtype)
    elif zero_v is not None:
        qtype = cv.formats.get(zero_v.name, zero_v.type.dtype)
    else:
        qtype = _onnx_type(n.attr("output_dtype", 0)) or "uint8"
    if zero_v is not None and cv.formats.get(zero_v.name, zero_v.type.dtype) != qtype:
        raise cv.fail(
            f"the zero point is {cv.formats.get(zero_v.name, zero_v.type.dtype)}, the quantized {qtype}"
        )
    prefix = "y" if n.op_type == "QuantizeLinear" else "x"
    # int32 (DequantizeLinear only) comes here when its scale or zero point is a run-time value
    wide = WIDE_INTS if n.op_type == "QuantizeLinear" else {**WIDE_INTS, "int32": (-(2**31), 2**31 - 1)}
    if qtype not in FORMATS and qtype not in wide:
        raise cv.fail(
            f"{prefix}_zero_point: element type {qtype} is not supported ({', '.join([*wide, *FORMATS])})"
        )
    since = QUANT_TYPES_SINCE.get(qtype, 10)
    if n.older_than(since) or (scale_v.type.dtype == "float16" and n.older_than(19)):
        what = f"{prefix}_zero_point: element type {qtype}" if n.older_than(since) else "a float16 scale"
        raise cv.fail_version(f"{what} is not defined before {n.op_type}-{max(since, 19)}")
    zero_type = "float64" if qtype == "int32" else "float32"
    zero = None
    float_format = qtype in FORMATS and FORMATS[qtype].kind == "float"
    if zero_v is not None and zero_v.is_constant:
        zero = _broadcast(cv, n, _values(cv, zero_v).astype(zero_type), x, "zero_point")
        if float_format and qtype != "float4_e2m1fn" and np.any(zero):
            raise cv.fail(f"a {qtype} zero point must be 0, got {zero.reshape(-1)[:8].tolist()}")
    elif zero_v is not None and not (float_format and qtype != "float4_e2m1fn"):
        # a float8 zero point is 0 by definition: the reference ignores it
        zero = _broadcast(cv, n, _operand(cv, decode(cv, zero_v), "zero_point", zero_type), x, "zero_point")
    return _broadcast(cv, n, scale, x, "scale"), zero, qtype


def dequantize_linear(cv: OnnxConverter, n: OnnxNode) -> Value:
    """(x - zero_point) * scale in float32, as ONNX's reference (a float8 or float4 x has no zero point to
    subtract), the result in the scale's type. An int32 x (run-time parameters) is computed in float64,
    where the reference's float32 x minus its int32 zero point is exact, then rounded once."""
    x = n.inputs[0]
    scale, zero, qtype = _quant_params(cv, n, x, x)
    v = decode(cv, x)
    v = v if v.type.dtype == "float32" else cv.emit("cast", [v], {"dtype": "float32"})
    work = "float64" if qtype == "int32" else "float32"
    if work != "float32":
        v = cv.emit("cast", [v], {"dtype": work})
    if _nonzero(zero) and not (qtype in FORMATS and FORMATS[qtype].kind == "float"):
        v = cv.emit("subtract", [v, _operand(cv, zero, "zero_point", work)])
    out_dtype = n.inputs[1].type.dtype
    last = n.outputs[0] if out_dtype == work else None
    v = cv.emit("multiply", [v, _operand(cv, scale, "scale", work)], out=last)
    return v if out_dtype == work else cv.emit("cast", [v], {"dtype": out_dtype}, n.outputs[0])


def quantize_linear(cv: OnnxConverter, n: OnnxNode) -> Value:
    """x / scale, then: integers rounded half to even, plus the zero point, saturated to the type's range;
    float8 cast (with `saturate`); float4e2m1 plus its zero point, cast: as ONNX's reference."""
    x = n.inputs[0]
    if x.type.dtype != "float32" or x.name in cv.formats or n.inputs[1].type.dtype != "float32":
        raise cv.fail(
            f"x is {x.type.dtype} and its scale {n.inputs[1].type.dtype}; only float32 is supported"
        )
    scale, zero, qtype = _quant_params(cv, n, x, None)
    out = n.outputs[0]
    v = cv.emit("divide", [x, _operand(cv, scale, "scale", "float32")])
    fmt = FORMATS.get(qtype)
    if fmt is not None and fmt.kind == "float":
        if qtype == "float4_e2m1fn" and _nonzero(zero):
            v = cv.emit("add", [v, _operand(cv, zero, "zero_point", "float32")])
        attrs = {"format": qtype, "saturate": bool(n.attr("saturate", 1)) and qtype in FLOAT8_SATURATES}
        v = cv.emit("lowp_encode", [v], attrs, out)
        cv.formats[v.name] = qtype
        return v
    lo, hi = WIDE_INTS.get(qtype) or _int_range(fmt)
    v = cv.emit("round", [v])
    if _nonzero(zero):  # exact in float32: the rounded quotient saturates long before 2 ** 24
        v = cv.emit("add", [v, _operand(cv, zero, "zero_point", "float32")])
    v = cv.emit("clip", [v], {"min": float(lo), "max": float(hi)})
    if fmt is None:
        return cv.emit("cast", [v], {"dtype": qtype}, out)
    v = cv.emit("lowp_encode", [cv.emit("cast", [v], {"dtype": "int32"})], {"format": qtype}, out)
    cv.formats[v.name] = qtype
    return v


def _int_range(fmt) -> tuple[int, int]:
    return (-(1 << (fmt.bits - 1)), (1 << (fmt.bits - 1)) - 1) if fmt.signed else (0, (1 << fmt.bits) - 1)
