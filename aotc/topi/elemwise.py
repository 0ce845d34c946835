"""Element-wise and broadcasting computes: numpy broadcasting rules and the scalar functions of operators."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from aotc import te
from aotc.ir.expr import (
    Expr,
    abs_,
    binary,
    call,
    cast,
    ceil,
    const,
    dtype_bits,
    dtype_max,
    dtype_min,
    eq,
    erf,
    exp,
    floor,
    is_int,
    log,
    logical_and,
    logical_not,
    logical_or,
    maximum,
    minimum,
    ne,
    power,
    round_,
    select,
    sigmoid,
    sqrt,
    tanh,
)
from aotc.te.tensor import Operation


def broadcast_shape(*shapes: Sequence[int]) -> tuple[int, ...]:
    """The numpy broadcast of `shapes`; raises TEError when two extents differ and neither is 1."""
    ndim = max((len(s) for s in shapes), default=0)
    out = [1] * ndim
    for shape in shapes:
        for d, extent in enumerate(shape, ndim - len(shape)):
            if extent != 1 and out[d] not in (1, extent):
                raise te.TEError(f"shapes {[list(s) for s in shapes]} do not broadcast")
            if extent != 1:
                out[d] = extent
    return tuple(out)


def broadcast_index(shape: Sequence[int], idx: Sequence[Expr]) -> tuple[Expr, ...]:
    """Indices into a tensor of `shape` for the point `idx` of its (right-aligned) broadcast."""
    lead = len(idx) - len(shape)
    return tuple(const(0) if extent == 1 else idx[lead + d] for d, extent in enumerate(shape))


def broadcast_read(t: Operation, idx: Sequence[Expr]) -> Expr:
    return t[broadcast_index(t.shape, idx)]


def map_inputs(
    inputs: Sequence[Operation], fn: Callable[..., Expr], name: str, tag: str = "broadcast"
) -> Operation:
    """`fn` applied point-wise over the broadcast of `inputs`."""
    shape = broadcast_shape(*(t.shape for t in inputs))
    return te.compute(shape, lambda *i: fn(*(broadcast_read(t, i) for t in inputs)), name, tag=tag)


def cast_to(v: Expr, dtype: str) -> Expr:
    """ONNX Cast: float -> int truncates; anything -> bool is `!= 0`."""
    if dtype == "bool" and v.dtype != "bool":
        return ne(v, const(0, v.dtype))
    return cast(dtype, v)


def divide(a: Expr, b: Expr) -> Expr:
    """True division for floats, division truncated toward zero for integers (C and ONNX semantics)."""
    if a.dtype.startswith("float"):
        return a / b
    q = a // b
    signs_differ = ne(a < const(0, a.dtype), b < const(0, b.dtype))
    return select(logical_and(ne(a % b, const(0, a.dtype)), signs_differ), q + 1, q)


def mod(a: Expr, b: Expr) -> Expr:
    """Floor modulo, the sign of the divisor (Python's `%`, numpy's np.mod; ONNX Mod with fmod=0). Exact:
    floats as numpy's npy_divmod (the C fmod, then moved into the divisor's sign), integers in integer
    arithmetic; an integer divisor of 0 gives 0 (numpy's result; ONNX leaves it undefined)."""
    return a % b


def fmod(a: Expr, b: Expr) -> Expr:
    """Truncated modulo, the sign of the dividend (C's fmod, numpy's np.fmod; ONNX Mod with fmod=1): the
    floor modulo of the magnitudes with the dividend's sign for floats, so exact, a NaN for a zero divisor or
    an infinite dividend, the dividend for an infinite divisor (a dividend of -0 gives +0, which ONNX
    allows); for signed integers the floor modulo moved back by the divisor where the signs differ (no
    overflow: |floor mod| < |b| and the result has the dividend's sign)."""
    if a.dtype.startswith("float"):
        m = abs_(a) % abs_(b)
        return select(a < const(0, a.dtype), -m, m)
    if a.dtype.startswith("uint"):
        return a % b
    r = a % b
    zero = const(0, a.dtype)
    return select(logical_and(ne(r, zero), ne(r < zero, a < zero)), r - b, r)


def pow_(a: Expr, b: Expr) -> Expr:
    """ONNX Pow, in the base's dtype. An integer base is raised in float64 and truncated toward zero, as
    onnxruntime does (std::pow, then a cast): exact while |result| < 2**53, and 2 ** -1 is 0."""
    if a.dtype.startswith("float"):
        return power(a, cast(a.dtype, b))
    return cast(a.dtype, power(cast("float64", a), cast("float64", b)))


def _unsigned(dtype: str) -> str:
    return dtype if dtype.startswith("uint") else f"u{dtype}"


def _power_of_two(s: Expr, bits: int, dtype: str) -> Expr:
    """2 ** s in `dtype` for 0 <= s < bits (bits a power of two): one factor 2 ** (2 ** b) per bit b of s,
    each a constant of `dtype` (an unsigned one, whose products wrap: 2 ** 63 is one)."""
    p = const(1, dtype)
    for b in range(bits.bit_length() - 1):
        bit = eq((s // (1 << b)) % 2, const(1, s.dtype))
        p = p * select(bit, const(1 << (1 << b), dtype), const(1, dtype))
    return p


def left_shift(a: Expr, s: Expr) -> Expr:
    """ONNX BitShift LEFT (BitShift-28's semantics): a * 2 ** s modulo 2 ** bits, computed in the unsigned
    type of a's width (bits shifted past the sign bit are dropped); a shift that is negative or not
    smaller than the width gives 0. (The loop IR has no shift: products of powers of two are exact.)"""
    bits = dtype_bits(a.dtype)
    valid = logical_and(s >= const(0, s.dtype), s < const(bits, s.dtype))
    count = select(valid, s, const(0, s.dtype))
    u = _unsigned(a.dtype)
    shifted = cast(a.dtype, cast(u, a) * _power_of_two(count, bits, u))
    return select(valid, shifted, const(0, a.dtype))


def right_shift(a: Expr, s: Expr) -> Expr:
    """ONNX BitShift RIGHT (BitShift-28's semantics): floor(a / 2 ** s), so arithmetic (sign-extending) on
    signed types; a shift that is negative or not smaller than the width gives the sign fill alone (-1
    for a negative a, else 0), as does a shift of width - 1 of a signed a (2 ** (bits - 1) does not fit)."""
    bits = dtype_bits(a.dtype)
    signed = not a.dtype.startswith("uint")
    top = bits - 1 if signed else bits  # shifts from here on give the sign fill
    fill = (
        select(a < const(0, a.dtype), const(-1, a.dtype), const(0, a.dtype)) if signed else const(0, a.dtype)
    )
    valid = logical_and(s >= const(0, s.dtype), s < const(top, s.dtype))
    count = select(valid, s, const(0, s.dtype))
    return select(valid, a // _power_of_two(count, bits, a.dtype), fill)


def clip(v: Expr, lo: float | None, hi: float | None) -> Expr:
    if lo is not None:
        v = maximum(v, const(lo, v.dtype))
    if hi is not None:
        v = minimum(v, const(hi, v.dtype))
    return v


def hard_sigmoid(v: Expr, alpha: float, beta: float) -> Expr:
    return clip(v * alpha + beta, 0.0, 1.0)


def gelu(v: Expr, approximate: str = "none") -> Expr:
    if approximate == "tanh":
        inner = (v + v * v * v * 0.044715) * math.sqrt(2.0 / math.pi)
        return v * 0.5 * (tanh(inner) + 1.0)
    return v * 0.5 * (erf(v * (1.0 / math.sqrt(2.0))) + 1.0)


def _zero(v: Expr) -> Expr:
    return const(0, v.dtype)


# --- element-wise math of the ONNX frontend's onnx_math (trigonometric, predicates, activations, bits) ---


def widened(fn: Callable[..., Expr]) -> Callable[..., Expr]:
    """`fn` computed in float32 for a float16 operand and rounded once (as onnxruntime computes float16
    activations): each float16 step rounding to 11 bits would compound; other dtypes as they are."""

    def wide(v: Expr, **attrs) -> Expr:
        if v.dtype != "float16":
            return fn(v, **attrs)
        return cast("float16", fn(cast("float32", v), **attrs))

    return wide


def expm1(v: Expr) -> Expr:
    """exp(v) - 1 without the cancellation near 0 (Kahan's: (u - 1) * v / log(u) with u = exp(v) rounded;
    v itself where u rounds to 1, -1 where u - 1 does, u where it is infinite)."""
    u = exp(v)
    um1 = u - 1.0
    accurate = select(eq(u, const(math.inf, v.dtype)), u, um1 * v / log(u))
    return select(eq(u, const(1.0, v.dtype)), v, select(eq(um1, const(-1.0, v.dtype)), um1, accurate))


def log1p(v: Expr) -> Expr:
    """log(1 + v) without losing v's low bits for small |v| (Goldberg's: log(w) * v / (w - 1) with
    w = 1 + v rounded, v itself where w rounds to 1); for v in [0, 1] here (no infinities)."""
    w = v + 1.0
    return select(eq(w, const(1.0, v.dtype)), v, log(w) * (v / (w - 1.0)))


def sign(v: Expr) -> Expr:
    """-1, 0 or 1 (-0 gives 0 and NaN stays NaN, as numpy's sign and ONNX's reference)."""
    one, zero = const(1, v.dtype), _zero(v)
    if v.dtype.startswith("uint"):
        return select(v > zero, one, zero)
    rest = select(ne(v, v), v, zero) if v.dtype.startswith("float") else zero
    return select(v > zero, one, select(v < zero, const(-1, v.dtype), rest))


def is_inf(v: Expr, detect_negative: bool = True, detect_positive: bool = True) -> Expr:
    """Whether v is an infinity of a detected sign (neither detected: always false)."""
    inf = const(math.inf, v.dtype)
    if detect_negative and detect_positive:
        return eq(abs_(v), inf)
    if detect_negative or detect_positive:
        return eq(v, inf if detect_positive else -inf)
    return logical_and(eq(v, inf), eq(v, -inf))


def selu(v: Expr, alpha: float = 1.67326319217681884765625, gamma: float = 1.05070102214813232421875) -> Expr:
    return select(v > _zero(v), v * gamma, expm1(v) * (alpha * gamma))


def celu(v: Expr, alpha: float = 1.0) -> Expr:
    """max(0, v) + min(0, alpha * (exp(v / alpha) - 1)): the second term is 0 for v > 0 and the first for
    v <= 0, whatever alpha's sign."""
    return select(v > _zero(v), v, expm1(v / alpha) * alpha)


def mish(v: Expr) -> Expr:
    """v * tanh(softplus(v)), softplus as max(v, 0) + log1p(exp(-|v|)) (no overflow, no cancellation)."""
    return v * tanh(maximum(v, _zero(v)) + log1p(exp(-abs_(v))))


def shrink(v: Expr, bias: float = 0.0, lambd: float = 0.5) -> Expr:
    """v + bias below -lambd, v - bias above lambd, 0 between. On integers (the frontend requires an
    integral bias that fits and lambd >= 0, so nothing overflows) the bounds are the integers the
    comparisons with lambd select: v < -lambd is v < ceil(-lambd), v > lambd is v > floor(lambd)."""
    if v.dtype.startswith("float"):
        return select(v < -lambd, v + bias, select(v > lambd, v - bias, _zero(v)))
    lo = max(math.ceil(-lambd), dtype_min(v.dtype))
    hi = min(math.floor(lambd), dtype_max(v.dtype))
    b = const(int(bias), v.dtype)
    return select(v < const(lo, v.dtype), v + b, select(v > const(hi, v.dtype), v - b, _zero(v)))


def bitwise_not(v: Expr) -> Expr:
    """Every bit flipped: xor with all ones (-1, or the unsigned maximum)."""
    ones = dtype_max(v.dtype) if v.dtype.startswith("uint") else -1
    return binary("bitxor", v, const(ones, v.dtype))


def _trig(name: str) -> Callable[[Expr], Expr]:
    return lambda v: call(name, v)


TRIG = ("sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh")
"""Math calls that are graph ops of the same name (libm's functions of one float)."""


UNARY: dict[str, Callable[..., Expr]] = {
    "identity": lambda v: v,
    "negative": lambda v: -v,
    "abs": abs_,
    "exp": exp,
    "log": log,
    "sqrt": sqrt,
    "reciprocal": lambda v: 1.0 / v,
    "erf": erf,
    "tanh": tanh,
    "sigmoid": sigmoid,
    "floor": floor,
    "ceil": ceil,
    "round": round_,
    "logical_not": logical_not,
    "relu": lambda v: maximum(v, _zero(v)),
    "leaky_relu": lambda v, alpha=0.01: select(v >= _zero(v), v, v * alpha),
    "elu": lambda v, alpha=1.0: select(v >= _zero(v), v, (exp(v) - 1.0) * alpha),
    "softplus": lambda v: maximum(v, _zero(v)) + log(exp(-abs_(v)) + 1.0),
    "clip": lambda v, min=None, max=None: clip(v, min, max),
    "hard_sigmoid": lambda v, alpha=0.2, beta=0.5: hard_sigmoid(v, alpha, beta),
    "hard_swish": lambda v: v * hard_sigmoid(v, 1.0 / 6.0, 0.5),
    "gelu": gelu,
    "cast": cast_to,
    **{name: _trig(name) for name in TRIG},
    "sign": sign,
    "isnan": lambda v: ne(v, v),
    "isinf": is_inf,
    "selu": widened(selu),
    "celu": widened(celu),
    "mish": widened(mish),
    "shrink": widened(shrink),
    "softsign": widened(lambda v: v / (abs_(v) + 1.0)),
    "thresholded_relu": widened(lambda v, alpha=1.0: select(v > alpha, v, _zero(v))),
    "swish": widened(lambda v, alpha=1.0: v * sigmoid(v * alpha)),
    "bitwise_not": bitwise_not,
}
"""Scalar function of each element-wise unary operator; keyword arguments are the operator's attrs."""

BINARY: dict[str, Callable[[Expr, Expr], Expr]] = {
    "add": lambda a, b: a + b,
    "subtract": lambda a, b: a - b,
    "multiply": lambda a, b: a * b,
    "divide": divide,
    "mod": mod,
    "fmod": fmod,
    "power": pow_,
    "maximum": maximum,
    "minimum": minimum,
    "equal": eq,
    "less": lambda a, b: a < b,
    "less_equal": lambda a, b: a <= b,
    "greater": lambda a, b: a > b,
    "greater_equal": lambda a, b: a >= b,
    "logical_and": logical_and,
    "logical_or": logical_or,
    "prelu": lambda a, slope: select(a >= _zero(a), a, a * slope),
    "left_shift": left_shift,
    "right_shift": right_shift,
    "bitwise_and": lambda a, b: binary("bitand", a, b),
    "bitwise_or": lambda a, b: binary("bitor", a, b),
    "bitwise_xor": lambda a, b: binary("bitxor", a, b),
}
"""Scalar function of each broadcasting binary operator."""

LOGICAL = frozenset({"logical_not", "logical_and", "logical_or"})
"""Operators of bool operands only."""
INTEGER_ONLY = frozenset({"left_shift", "right_shift", "bitwise_and", "bitwise_or", "bitwise_xor"})
INTEGER_ONLY |= {"bitwise_not"}
"""Operators of integer operands of one type only."""
NOT_ON_BOOL = (frozenset(UNARY) | frozenset(BINARY)) - LOGICAL - {"identity", "cast", "equal"}
NOT_ON_BOOL -= {"less", "less_equal", "greater", "greater_equal"}
"""Operators that are arithmetic on their operands, which must not be bool (False < True compares)."""


def check_operands(name: str, dtypes: Sequence[str]) -> None:
    """Raise TEError when operator `name` is not defined on operands of `dtypes` (bool arithmetic, logical
    operators or a `where` condition on other types): a refusal when the graph is built, not a codegen
    error of the kernel later."""
    if name in LOGICAL and any(d != "bool" for d in dtypes):
        raise te.TEError(f"{name} needs bool operands, got {', '.join(dtypes)}")
    if name == "where" and dtypes and dtypes[0] != "bool":
        raise te.TEError(f"where needs a bool condition, got {dtypes[0]}")
    if name in INTEGER_ONLY and (not all(is_int(d) for d in dtypes) or len(set(dtypes)) > 1):
        raise te.TEError(f"{name} needs integer operands of one type, got {', '.join(dtypes)}")
    if name in NOT_ON_BOOL and "bool" in dtypes:
        raise te.TEError(f"{name} is not defined on bool operands ({', '.join(dtypes)})")
