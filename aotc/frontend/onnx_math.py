"""ONNX frontend: Element-wise math operators (trigonometric, hyperbolic, predicates, activations, bitwise).

Each maps one to one onto a graph op of aotc.topi.elemwise (the trigonometric and hyperbolic functions are
libm's, aotc.codegen.vecmath). The element types each version allows are checked here, so that a model
outside its operator's schema is refused by name rather than computed on a guess.
"""

from __future__ import annotations

import math

from aotc.frontend.onnx import OnnxConverter, OnnxNode, converts
from aotc.graph.ir import Value
from aotc.ir.expr import dtype_max

VERSIONS: dict[str, tuple[int, ...]] = {
    # Versions from onnx.defs.get_all_schemas_with_history() (onnx 1.23): every later version only adds
    # element types (bfloat16 at 13 or 22, float8 at IsNaN-20 / IsInf-20), which aotc does not compile, so
    # the semantics are the same across each operator's versions unless noted.
    "Sin": (7, 22),
    "Cos": (7, 22),
    "Tan": (7, 22),
    "Asin": (7, 22),
    "Acos": (7, 22),
    "Atan": (7, 22),
    "Sinh": (9, 22),
    "Cosh": (9, 22),
    "Asinh": (9, 22),
    "Acosh": (9, 22),
    "Atanh": (9, 22),
    "Sign": (9, 13),
    "IsNaN": (9, 13, 20),
    "IsInf": (10, 20),  # 10: float and double only (20 adds float16)
    "Selu": (6, 22),  # 6 dropped consumed_inputs (Selu-1, older than opset 7's)
    "Celu": (12, 28),  # 12: float only (28 adds double and float16)
    "Mish": (18, 22),
    "Shrink": (9,),
    "Softsign": (1, 22),
    "ThresholdedRelu": (10, 22),
    "Swish": (24,),
    "BitwiseAnd": (18,),
    "BitwiseOr": (18,),
    "BitwiseXor": (18,),
    "BitwiseNot": (18,),
}
"""ONNX operator -> the versions of it that this module converts (merged into aotc.frontend.onnx.VERSIONS)."""

FLOATS = ("float16", "float32", "float64")
INTEGERS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")

_UNARY: dict[str, tuple[str, dict[str, float]]] = {
    "Sin": ("sin", {}),
    "Cos": ("cos", {}),
    "Tan": ("tan", {}),
    "Asin": ("asin", {}),
    "Acos": ("acos", {}),
    "Atan": ("atan", {}),
    "Sinh": ("sinh", {}),
    "Cosh": ("cosh", {}),
    "Asinh": ("asinh", {}),
    "Acosh": ("acosh", {}),
    "Atanh": ("atanh", {}),
    "Sign": ("sign", {}),
    "IsNaN": ("isnan", {}),
    "Selu": ("selu", {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875}),
    "Celu": ("celu", {"alpha": 1.0}),
    "Mish": ("mish", {}),
    "Softsign": ("softsign", {}),
    "ThresholdedRelu": ("thresholded_relu", {"alpha": 1.0}),
    "Swish": ("swish", {"alpha": 1.0}),
    "BitwiseNot": ("bitwise_not", {}),
}
"""ONNX op -> (graph op, its float attributes with ONNX's defaults)."""

_BINARY = {"BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or", "BitwiseXor": "bitwise_xor"}


def _types(n: OnnxNode) -> tuple[str, ...]:
    """The element types (of those aotc compiles) that this version of the node's operator takes."""
    if n.op_type in ("Sign", "Shrink"):
        return FLOATS + INTEGERS
    if n.op_type.startswith("Bitwise"):
        return INTEGERS
    if n.op_type == "IsInf" and n.older_than(20):
        return ("float32", "float64")
    if n.op_type == "Celu" and n.older_than(28):
        return ("float32",)
    return FLOATS


def _check_types(cv: OnnxConverter, n: OnnxNode) -> None:
    allowed = _types(n)
    for i, v in enumerate(n.inputs):
        if v is not None and v.type.dtype not in allowed:
            raise cv.fail_version(
                f"input {i} ({v.name}) is {v.type.dtype}; this version takes {', '.join(allowed)}"
            )


@converts(*_UNARY)
def _unary(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    _check_types(cv, n)
    op, defaults = _UNARY[n.op_type]
    attrs = {k: float(n.attr(k, d)) for k, d in defaults.items()}
    return [cv.emit(op, n.inputs[:1], attrs, n.outputs[0])]


@converts(*_BINARY)
def _bitwise(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    _check_types(cv, n)
    a, b = n.inputs[:2]
    if a.type.dtype != b.type.dtype:
        raise cv.fail(f"the operands must have one type, got {a.type.dtype} and {b.type.dtype}")
    return [cv.emit(_BINARY[n.op_type], [a, b], out=n.outputs[0])]


@converts("IsInf")
def _is_inf(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    _check_types(cv, n)
    attrs = {k: bool(n.attr(k, 1)) for k in ("detect_negative", "detect_positive")}
    return [cv.emit("isinf", n.inputs[:1], attrs, n.outputs[0])]


@converts("Shrink")
def _shrink(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """On integers aotc computes Shrink exactly in the integer type, which needs an integral bias that
    fits the type and lambd >= 0 (then neither x + bias nor x - bias overflows); otherwise ONNX's
    reference (float64) and onnxruntime (float32) compute it in different floats, and it is refused."""
    _check_types(cv, n)
    x = n.inputs[0]
    bias, lambd = float(n.attr("bias", 0.0)), float(n.attr("lambd", 0.5))
    if math.isnan(lambd):
        raise cv.fail("lambd is NaN")
    if not x.type.dtype.startswith("float") and (
        not math.isfinite(bias) or bias != int(bias) or not 0 <= bias <= dtype_max(x.type.dtype) or lambd < 0
    ):
        raise cv.fail(
            f"on {x.type.dtype} input {x.name}, bias {bias:g} and lambd {lambd:g} are not supported: aotc "
            "computes integer Shrink exactly, with an integral bias from 0 to the type's maximum and lambd >= 0"
        )
    return [cv.emit("shrink", [x], {"bias": bias, "lambd": lambd}, n.outputs[0])]
