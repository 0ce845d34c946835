"""Low-precision and sub-byte element types (bfloat16, float8, float4, float8e8m0, int4/uint4, int2/uint2).

The graph carries a tensor of such a type as its storage bits, one element per uint8 (uint16 for bfloat16),
laid out as ml_dtypes lays out its arrays (a sub-byte element in the low bits of its byte), so a package
boundary passes an ml_dtypes array through as it is. Kernels never compute on the bits: `lowp_decode`
widens them exactly to float32 (int8/uint8 for the integers), `lowp_encode` rounds a value to them with
the rules of ONNX's Cast (round to nearest even, saturation, NaN and infinity per format), and `bitcast`
reads bits as another type of the same width. Every format is described once, in FORMATS.
"""

from __future__ import annotations

from dataclasses import dataclass

from aotc import te
from aotc.ir.expr import (
    Expr,
    cast,
    const,
    eq,
    logical_or,
    maximum,
    reinterpret,
    round_,
    select,
)
from aotc.te.tensor import Operation
from aotc.topi.registry import OpPattern, register

__all__ = ["FORMATS", "Format", "decoded_dtype"]


@dataclass(frozen=True)
class Format:
    """An element type stored as bits: `name` is ml_dtypes' (and the package's) name for it.

    Floats: `ebits` exponent and `mbits` mantissa bits, exponent `bias`, and `special`: "ieee" (the top
    exponent holds infinities and NaNs), "fn" (finite, NaN is every bit of the magnitude set), "fnuz" (finite,
    no negative zero, NaN is the sign bit alone: 0x80), "none" (finite, no NaN: float4e2m1) or "e8m0" (an
    unsigned power of two, 0xFF NaN). Integers: `ebits` = `mbits` = 0, `signed` says two's complement."""

    name: str
    storage: str
    bits: int
    kind: str  # "float" or "int"
    ebits: int = 0
    mbits: int = 0
    bias: int = 0
    special: str = ""
    signed: bool = True

    @property
    def max_magnitude(self) -> int:
        """The bits of the largest finite magnitude (sign bit clear)."""
        ones = (1 << (self.ebits + self.mbits)) - 1
        if self.special == "ieee":
            return ones - (1 << self.mbits)  # the top exponent is infinities and NaNs
        if self.special == "fn":
            return ones - 1  # all ones is NaN
        return ones

    @property
    def sign_bit(self) -> int:
        return 1 << (self.ebits + self.mbits)


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format("bfloat16", "uint16", 16, "float", 8, 7, 127, "ieee"),
        Format("float8_e4m3fn", "uint8", 8, "float", 4, 3, 7, "fn"),
        Format("float8_e4m3fnuz", "uint8", 8, "float", 4, 3, 8, "fnuz"),
        Format("float8_e5m2", "uint8", 8, "float", 5, 2, 15, "ieee"),
        Format("float8_e5m2fnuz", "uint8", 8, "float", 5, 2, 16, "fnuz"),
        Format("float4_e2m1fn", "uint8", 4, "float", 2, 1, 1, "none"),
        Format("float8_e8m0fnu", "uint8", 8, "float", 8, 0, 127, "e8m0", signed=False),
        Format("int4", "uint8", 4, "int"),
        Format("uint4", "uint8", 4, "int", signed=False),
        Format("int2", "uint8", 2, "int"),
        Format("uint2", "uint8", 2, "int", signed=False),
    )
}
"""ml_dtypes name -> its format. ONNX's elem types 16 to 26 are these."""

ROUND_MODES = ("up", "down", "nearest")
"""float8e8m0's rounding modes (Cast-24's round_mode); the other formats round to nearest even."""


def decoded_dtype(fmt: Format) -> str:
    """The type `lowp_decode` widens a format to exactly: float32, int8 or uint8."""
    if fmt.kind == "float":
        return "float32"
    return "int8" if fmt.signed else "uint8"


def _u32(v: int) -> Expr:
    return const(v, "uint32")


def _f32_bits(bits: Expr) -> Expr:
    return reinterpret("float32", bits)


def decode(b: Expr, fmt: Format) -> Expr:
    """The value of the bits `b` (a uint8 or uint16 element), exactly, in `decoded_dtype(fmt)`."""
    u = cast("uint32", b) % _u32(1 << fmt.bits)  # a byte's bits above the element are not its value
    if fmt.kind == "int":
        if not fmt.signed:
            return cast("uint8", u)
        half = 1 << (fmt.bits - 1)
        return cast("int8", cast("int32", (u + _u32(half)) % _u32(1 << fmt.bits)) - const(half, "int32"))
    if fmt.name == "bfloat16":  # the upper half of a float32
        return _f32_bits(u * _u32(1 << 16))
    if fmt.special == "e8m0":  # 2 ** (u - 127); 0 is the float32 subnormal 2 ** -127
        power = select(eq(u, _u32(0)), _u32(1 << 22), u * _u32(1 << 23))
        return _f32_bits(select(eq(u, _u32(0xFF)), _u32(0x7FC00000), power))
    m_scale, field = 1 << fmt.mbits, 1 << fmt.ebits
    sign = u // _u32(fmt.sign_bit)
    mag = u % _u32(fmt.sign_bit)
    e, m = mag // _u32(m_scale), mag % _u32(m_scale)
    f32_sign = sign * _u32(1 << 31)
    # a normal value: its float32 bits (every format's exponents lie inside float32's)
    normal = _f32_bits(
        f32_sign + (e + _u32(127 - fmt.bias)) * _u32(1 << 23) + m * _u32(1 << (23 - fmt.mbits))
    )
    # a subnormal one: m * 2 ** (1 - bias - mbits), a normal float32; the sign by a product keeps -0
    sub = cast("float32", m) * const(2.0 ** (1 - fmt.bias - fmt.mbits), "float32")
    sub = sub * select(eq(sign, _u32(1)), const(-1.0, "float32"), const(1.0, "float32"))
    value = select(eq(e, _u32(0)), sub, normal)
    nan = _f32_bits(f32_sign + _u32(0x7FC00000))
    if fmt.special == "ieee":
        top = eq(e, _u32(field - 1))
        inf = _f32_bits(f32_sign + _u32(0x7F800000))
        value = select(top, select(eq(m, _u32(0)), inf, nan), value)
    elif fmt.special == "fn":
        value = select(eq(mag, _u32(fmt.sign_bit - 1)), nan, value)
    elif fmt.special == "fnuz":
        value = select(eq(u, _u32(fmt.sign_bit)), _f32_bits(_u32(0xFFC00000)), value)  # as ml_dtypes
    return value


def encode(x: Expr, fmt: Format, saturate: bool = True, round_mode: str = "up") -> Expr:
    """`x` (any numeric type) rounded to the format's bits, in its storage type, as ONNX's Cast does it:
    floats to nearest even, to the largest finite value when saturating (`saturate` only matters where the
    format has an infinity or a NaN to overflow to; float4e2m1 always saturates), float8e8m0 by
    `round_mode` on float32 as ONNX's reference; integers truncated toward zero, then wrapped."""
    if fmt.kind == "int":
        whole = cast("int64", x) if x.dtype != "bool" else cast("int64", cast("uint8", x))
        return cast(fmt.storage, whole % const(1 << fmt.bits, "int64"))
    if fmt.special == "e8m0":
        return cast(fmt.storage, _encode_e8m0(_as_float(x, "float32"), saturate, round_mode))
    return cast(fmt.storage, _encode_float(_as_float(x, "float64"), fmt, saturate))


def _as_float(x: Expr, dtype: str) -> Expr:
    if x.dtype == "bool":
        x = cast("uint8", x)
    return cast(dtype, x)


def _encode_float(x: Expr, fmt: Format, saturate: bool) -> Expr:
    """Round a float64 (which holds every float32, float16 and int32 exactly: one rounding only)."""
    # the magnitude's bits as a nonnegative int64, from the bits with the sign bit subtracted (fabs may
    # keep a NaN's sign on a GPU; the GPU code's floor division of 64-bit values is signed)
    u = reinterpret("uint64", x)
    negative = u >= const(1 << 63, "uint64")
    sign = select(negative, const(1, "int32"), const(0, "int32"))
    abs_bits = cast("int64", select(negative, u - const(1 << 63, "uint64"), u))
    a = reinterpret("float64", abs_bits)
    inf_bits = const(0x7FF << 52, "int64")
    is_nan, is_inf = abs_bits > inf_bits, eq(abs_bits, inf_bits)
    # the binade of a, at least the format's smallest normal one: a = n * 2 ** (e - mbits), n < 2 ** (mbits + 1)
    emin = 1 - fmt.bias
    e = maximum(
        cast("int32", abs_bits // const(1 << 52, "int64")) - const(1023, "int32"), const(emin, "int32")
    )
    scale = reinterpret(
        "float64", cast("int64", const(1023 + fmt.mbits, "int32") - e) * const(1 << 52, "int64")
    )
    n = cast("int32", round_(a * scale))  # exact scaling by a power of two, then the one rounding
    mag = (e - const(emin, "int32")) * const(1 << fmt.mbits, "int32") + n
    top = const(fmt.max_magnitude, "int32")
    over = logical_or(mag > top, is_inf)
    sign_bit = const(fmt.sign_bit, "int32")
    zero = const(0, "int32")
    if fmt.special == "fnuz":
        # no infinity and no negative zero (a negative value that rounds to 0 is 0); NaN is 0x80, as is an
        # overflow unless saturating
        finite = select(eq(mag, zero), zero, sign * sign_bit + mag)
        code = select(over, sign * sign_bit + top if saturate else sign_bit, finite)
        return select(is_nan, sign_bit, code)
    if fmt.special == "none":
        # float4e2m1 has neither infinity nor NaN: it always saturates, and ml_dtypes (ONNX's reference)
        # gives NaN as a zero of the other sign
        nan = (const(1, "int32") - sign) * sign_bit
        return select(is_nan, nan, sign * sign_bit + select(over, top, mag))
    # ieee: the top exponent is infinity (mantissa 0) and NaN (quiet: its top mantissa bit); fn: all ones NaN
    inf = top + const(1, "int32")
    nan = inf + const(1 << (fmt.mbits - 1), "int32") if fmt.special == "ieee" else inf
    overflow = top if saturate else inf if fmt.special == "ieee" else nan
    return sign * sign_bit + select(is_nan, nan, select(over, overflow, mag))


def _encode_e8m0(x: Expr, saturate: bool, round_mode: str) -> Expr:
    """ONNX's float8e8m0 cast (onnx.numpy_helper.to_float8e8m0): the float32 exponent, the sign dropped,
    rounded by `round_mode` from the mantissa; NaN and infinity are 0xFF, as is an exponent 254 rounded up
    unless saturating."""
    u = reinterpret("uint32", x)
    exponent = cast("int32", (u // _u32(1 << 23)) % _u32(256))
    fraction = u % _u32(1 << 23)
    if round_mode == "up":
        up = fraction > _u32(0)
    elif round_mode == "nearest":
        # as the reference: the guard bit, and the round bit, the sticky bits or a nonzero exponent
        rest = logical_or(fraction % _u32(1 << 22) > _u32(0), exponent > const(0, "int32"))
        up = select(fraction >= _u32(1 << 22), rest, const(False, "bool"))
    else:
        up = const(False, "bool")
    if saturate:
        up = select(eq(exponent, const(254, "int32")), const(False, "bool"), up)
    rounded = exponent + cast("int32", up)
    return select(eq(exponent, const(255, "int32")), const(255, "int32"), rounded)


def _check_storage(x: Operation, fmt: Format, op: str) -> None:
    if x.dtype != fmt.storage:
        raise te.TEError(f"{op}: {fmt.name} is stored as {fmt.storage}, got {x.dtype}")


@register("lowp_decode", OpPattern.ELEMWISE)
def _lowp_decode(inputs, attrs):
    """attrs: format (a FORMATS name). The storage bits -> float32 (int8/uint8 for the integer formats)."""
    x, fmt = inputs[0], _format(attrs)
    _check_storage(x, fmt, "lowp_decode")
    return [te.compute(x.shape, lambda *i: decode(x[i], fmt), "lowp_decode", tag="elemwise")]


@register("lowp_encode", OpPattern.ELEMWISE)
def _lowp_encode(inputs, attrs):
    """attrs: format, saturate (default true), round_mode (float8e8m0: up, down or nearest). Any numeric
    type -> the format's storage bits."""
    x, fmt = inputs[0], _format(attrs)
    saturate, round_mode = bool(attrs.get("saturate", True)), attrs.get("round_mode", "up")
    if round_mode not in ROUND_MODES:
        raise te.TEError(f"lowp_encode: round_mode {round_mode!r} is not one of {', '.join(ROUND_MODES)}")
    return [
        te.compute(x.shape, lambda *i: encode(x[i], fmt, saturate, round_mode), "lowp_encode", tag="elemwise")
    ]


@register("bitcast", OpPattern.ELEMWISE)
def _bitcast(inputs, attrs):
    """attrs: dtype, a numeric type of the input's width: the same bits read as it (ONNX BitCast)."""
    x, dtype = inputs[0], attrs["dtype"]
    try:
        reinterpret(dtype, const(0, x.dtype))
    except TypeError as e:
        raise te.TEError(str(e)) from None
    return [te.compute(x.shape, lambda *i: reinterpret(dtype, x[i]), "bitcast", tag="elemwise")]


def _format(attrs: dict) -> Format:
    name = attrs.get("format")
    if name not in FORMATS:
        raise te.TEError(f"unknown low-precision format {name!r}; known: {', '.join(FORMATS)}")
    return FORMATS[name]
