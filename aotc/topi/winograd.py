"""Winograd convolution F(m x m, 3 x 3) in NCHW or NHWC (Lavin & Gray 2016), as TVM and Ansor use it.

A 3x3 stride-1 conv is computed on tiles of m x m outputs from (m + 2) x (m + 2) input tiles:
V = B^T d B per tile and input channel, M = sum over channels of U * V (a batch of (m + 2)^2 matrix
products), Y = A^T M A per tile and output channel. The weight transform U = G g G^T happens once,
at build time (`transform_weight`). F(4, 3) does 36 multiply-adds per 16 outputs and channel pair
where the direct conv does 144.

An int8 conv runs F(4, 3) or F(2, 3) in integers, exactly (docs/int8.md#integer-winograd): the data
transform B^T d B of the zero-point-centered bytes fits int16 (at most 100 * 255 for F(4, 3)); each row
of G is scaled to integers (D G), so the weights (DG) g (DG)^T are int16 too, and the batched products are
int16 pairs that vpmaddwd sums into int32; A^T diag(L / s) M diag(L / s) A is L^2 times the conv's sum
modulo 2^32, which `_divide_exactly` undoes where the graph proved the sum small enough
(`integer_sum_limit`). F(4, 3) does 36 products per 16 outputs and channel pair, F(2, 3) 16 per 4, where
the direct conv does 144 and 36.

The two transforms are explicit sums whose coefficients depend on the position inside the tile; each
stage's `const_index_axes` attr names those axes (and their period), which a schedule unrolls so that
every coefficient becomes a literal and the zero terms vanish (Ansor's
`auto_scheduler_simplify_const_tensor_indices`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from aotc import te
from aotc.ir.expr import Expr, cast, const, eq, is_float, select
from aotc.te.tensor import CONST_INDEX_AXES, Operation

KERNEL = 3

# Interpolation points of the Cook-Toom construction (the last point is infinity).
_POINTS = {2: (0, 1, -1), 4: (0, 1, -1, 2, -2)}


def tile_sizes() -> tuple[int, ...]:
    return tuple(_POINTS)


def matrices(m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A^T [m, a], G [a, 3], B^T [a, a]) of F(m, 3), a = m + 2, exact rationals as float64."""
    if m not in _POINTS:
        raise ValueError(f"Winograd tile {m} is not one of {', '.join(map(str, _POINTS))}")
    pts = [Fraction(p) for p in _POINTS[m]]
    a = m + KERNEL - 1
    n = a - 1
    # A^T: output j at point p is p^j; the point at infinity contributes only to the last output.
    at = [[p**j for p in pts] + [Fraction(int(j == m - 1))] for j in range(m)]
    # G: the kernel polynomial evaluated at each point, scaled by 1 / prod(p - q).
    g = []
    for i, p in enumerate(pts):
        den = Fraction(1)
        for k, q in enumerate(pts):
            if k != i:
                den *= p - q
        g.append([p**j / den for j in range(KERNEL)])
    g.append([Fraction(int(j == KERNEL - 1)) for j in range(KERNEL)])
    # B^T: the coefficients of prod_{q != p}(x - q), and of the full product for the infinity row.
    bt = []
    for i in range(n):
        poly = [Fraction(1)]
        for k, q in enumerate(pts):
            if k != i:
                poly = _times_linear(poly, -q)
        bt.append(poly + [Fraction(0)] * (a - len(poly)))
    full = [Fraction(1)]
    for q in pts:
        full = _times_linear(full, -q)
    bt.append(full)
    return (
        np.array(at, dtype=np.float64),
        np.array(g, dtype=np.float64),
        np.array(bt, dtype=np.float64),
    )


def _times_linear(poly: list[Fraction], c: Fraction) -> list[Fraction]:
    """poly(x) * (x + c), coefficients lowest degree first."""
    out = [Fraction(0)] * (len(poly) + 1)
    for i, v in enumerate(poly):
        out[i] += v * c
        out[i + 1] += v
    return out


# The int8 conv's Winograd tiles, the larger first: F(4, 3) where its sums are provably exact, else F(2, 3).
INTEGER_TILES = (4, 2)


def integer_row_scales(m: int) -> np.ndarray:
    """s[e]: the smallest integer that makes row e of F(m, 3)'s G integral (F(4, 3): 4 6 6 24 24 1)."""
    _, g, _ = matrices(m)
    out = []
    for row in g:
        out.append(next(k for k in range(1, 1 << 10) if np.allclose(row * k, np.round(row * k), atol=1e-9)))
    return np.array(out, dtype=np.int64)


def integer_output_factor(m: int) -> int:
    """L^2, L = lcm of `integer_row_scales`: the factor the integer output transform's result carries
    (F(2, 3): 4; F(4, 3): 576)."""
    return _integer_lcm(m) ** 2


def _integer_lcm(m: int) -> int:
    return int(np.lcm.reduce(integer_row_scales(m)))


def integer_sum_limit(m: int) -> int:
    """The magnitude a conv's int32 sum must stay below for F(m, 3) to recover it exactly: the output
    transform gives L^2 * sum modulo 2^32, L^2 = 2^a * b with b odd; times b's inverse modulo 2^32 that is
    2^a * sum, which int32 holds exactly below 2^(31 - a)."""
    factor = integer_output_factor(m)
    shift = (factor & -factor).bit_length() - 1
    return 1 << (31 - shift)


def integer_transform_weight(weight: np.ndarray, m: int) -> np.ndarray:
    """Integer OIHW 3x3 weights [K, C, 3, 3] -> int16 U [a, a, C, K] = (DG) g (DG)^T, D =
    diag(`integer_row_scales(m)`), exactly (int64 arithmetic, then checked to fit int16)."""
    dg = _integer_g(m)
    u = np.einsum("ei,kcij,fj->efck", dg, weight.astype(np.int64), dg)
    if u.size and (u.min() < np.iinfo(np.int16).min or u.max() > np.iinfo(np.int16).max):
        raise ValueError(f"F({m}, 3) integer weights span [{u.min()}, {u.max()}], past int16")
    return np.ascontiguousarray(u.astype(np.int16))


def _integer_g(m: int) -> np.ndarray:
    """DG: G with each row scaled to integers."""
    _, g, _ = matrices(m)
    return np.round(g * integer_row_scales(m)[:, None]).astype(np.int64)


def _integer_at(m: int) -> np.ndarray:
    """A^T diag(L / s): the output transform that undoes D up to the common factor L."""
    at, _, _ = matrices(m)
    return np.round(at * (_integer_lcm(m) // integer_row_scales(m))[None, :]).astype(np.int64)


def transform_weight(weight: np.ndarray, m: int) -> np.ndarray:
    """OIHW 3x3 weights [K, C, 3, 3] -> U [a, a, C, K] = G g G^T per channel pair (in float64); integer
    weights -> the int16 `integer_transform_weight`."""
    if np.issubdtype(weight.dtype, np.integer):
        return integer_transform_weight(weight, m)
    _, g, _ = matrices(m)
    u = np.einsum("ei,kcij,fj->efck", g, weight.astype(np.float64), g)
    return np.ascontiguousarray(u.astype(weight.dtype))


def weight_transform(weight: Operation, m: int, name: str = "winograd_weight") -> Operation:
    """U [a, a, C, K] = G g G^T of OIHW 3x3 weights `weight` [K, C, 3, 3] as loop stages, one dimension at
    a time as the data transform is: what `transform_weight` computes at build time, for a package that
    computes it when it loads (in the weights' dtype, not float64; integer weights in int16, as
    `integer_transform_weight`)."""
    _, g, _ = matrices(m)
    k, c, kh, kw = weight.shape
    if (kh, kw) != (KERNEL, KERNEL):
        raise te.TEError(f"{name}: weights {list(weight.shape)} are not 3x3")
    a = m + KERNEL - 1
    dtype = weight.dtype

    def read(*index: Expr) -> Expr:
        return weight[index]

    if not is_float(dtype):
        g, dtype = _integer_g(m), "int16"

        def read(*index: Expr) -> Expr:
            return cast("int16", weight[index])

    # rows[e, k, c, j] = sum_i G[e, i] g[k, c, i, j]
    rows = te.compute(
        (a, k, c, KERNEL),
        lambda e, kk, cc, j: _transform(e, g, [read(kk, cc, i, j) for i in range(KERNEL)], dtype),
        f"{name}_rows",
        tag="winograd_weight",
        attrs={CONST_INDEX_AXES: ((0, 1),)},
    )
    return te.compute(
        (a, a, c, k),
        lambda e, f, cc, kk: _transform(f, g, [rows[e, kk, cc, j] for j in range(KERNEL)], dtype),
        name,
        tag="winograd_weight",
        attrs={CONST_INDEX_AXES: ((1, 1),)},
    )


def output_tiles(h: int, w: int, pads: tuple[int, int, int, int], m: int) -> tuple[int, int, int, int]:
    """Output height and width of the 3x3 stride-1 conv, and its tiles along each."""
    pt, pl, pb, pr = pads
    oh, ow = h + pt + pb - KERNEL + 1, w + pl + pr - KERNEL + 1
    return oh, ow, -(-oh // m), -(-ow // m)


# Axis order of each stage per layout, as positions in its NCHW-ordered logical axes: in NHWC the
# channels (input c, output k) go innermost.
_ORDERS = {
    "NCHW": {"data": (0, 1, 2, 3), "rows": (0, 1, 2, 3, 4), "v": (0, 1, 2, 3, 4, 5)},
    "NHWC": {"data": (0, 2, 3, 1), "rows": (0, 2, 3, 4, 1), "v": (0, 2, 5, 3, 4, 1)},
}


def conv2d_winograd(
    data: Operation,
    u: Operation,
    m: int,
    padding: Sequence[int] = (1, 1, 1, 1),
    layout: str = "NCHW",
    name: str = "conv2d_winograd",
) -> Operation:
    """A conv with a 3x3 kernel, stride 1, on `data` in `layout` (NCHW or NHWC), from pre-transformed
    weights `u` [a, a, C, K]. In NHWC the data transform keeps channels innermost, so the batched
    products read both operands contiguously along the channels they sum."""
    from aotc.topi.nn import pad

    if layout not in _ORDERS:
        raise te.TEError(f"{name}: layout {layout!r} is not one of {', '.join(_ORDERS)}")
    order = _ORDERS[layout]
    at, _, bt = matrices(m)
    a = m + KERNEL - 1
    n, c, h, w = _logical(data.shape, order["data"])
    if tuple(u.shape[:3]) != (a, a, c):
        raise te.TEError(f"{name}: transformed weight {list(u.shape)} does not fit F({m}, 3) on {c} channels")
    k = u.shape[3]
    pt, pl, pb, pr = padding
    oh, ow, th, tw = _checked_tiles(data, h, w, padding, m, name)
    # Pad (or crop) so that every tile's input window lies inside.
    before = _physical((0, 0, pt, pl), order["data"])
    after = _physical((0, 0, m * th + 2 - h - pt, m * tw + 2 - w - pl), order["data"])
    padded = _Laid(pad(data, before, after, name=f"{name}_pad"), order["data"])
    dtype = data.dtype
    # B^T d B as two passes of one dimension each (fewer terms, and small bodies to lower).
    rows = _compute(
        (n, c, th, a, m * tw + 2),
        order["rows"],
        lambda nn, cc, t_h, e1, xw: _transform(
            e1, bt, [padded(nn, cc, t_h * m + r, xw) for r in range(a)], dtype
        ),
        f"{name}_rows",
        "winograd_data",
        ((3, 1),),
    )
    v = _compute(
        (n, c, th, a, a, tw),
        order["v"],
        lambda nn, cc, t_h, e1, e2, t_w: _transform(
            e2, bt, [rows(nn, cc, t_h, e1, t_w * m + r) for r in range(a)], dtype
        ),
        f"{name}_data",
        "winograd_data",
        ((3, 1), (4, 1)),
    )
    rc = te.reduce_axis(c, "rc")
    prod = te.compute(
        (a, a, n, th, tw, k),
        lambda e1, e2, nn, t_h, t_w, kk: te.sum(v(nn, rc.var, t_h, e1, e2, t_w) * u[e1, e2, rc.var, kk], rc),
        f"{name}_gemm",
        tag="winograd_gemm",
    )
    # A^T M A, again one dimension at a time.
    cols = te.compute(
        (a, m, n, th, tw, k),
        lambda e1, m2, nn, t_h, t_w, kk: _transform(
            m2, at, [prod[e1, e, nn, t_h, t_w, kk] for e in range(a)], dtype
        ),
        f"{name}_cols",
        tag="winograd_out",
        attrs={CONST_INDEX_AXES: ((1, 1),)},
    )
    out = _compute(
        (n, k, oh, ow),
        order["data"],
        lambda nn, kk, yy, xx: _transform(
            yy % m, at, [cols[e, xx % m, nn, yy // m, xx // m, kk] for e in range(a)], dtype
        ),
        name,
        "winograd_out",
        ((2, m), (3, m)),
    )
    return out.op


# The integer conv's tiles (rows of its batched products) are padded to a multiple of this, so that a
# register block of that many rows divides them (ResNet's 14x14 stage: 49 tiles -> 52).
INTEGER_TILE_ROWS = 4


def integer_conv2d_winograd_nhwc(
    data: Operation,
    u: Operation,
    padding: Sequence[int],
    pad_value: int,
    zero_point: int,
    m: int,
    name: str = "integer_conv2d_winograd",
) -> Operation:
    """The int32 sums of a 3x3 stride-1 conv of 8-bit NHWC `data` (padded with `pad_value`, each value
    read as `data - zero_point`) with the int16 weights `u` [a, a, C, K] of `integer_transform_weight`
    for F(m, 3): the conv's accumulator, exactly where every sum is below `integer_sum_limit(m)` in
    magnitude. Each image's tiles are one axis P (padded to INTEGER_TILE_ROWS with tiles of padding
    rows) of the batched int16 products, which vpmaddwd sums in pairs of channels."""
    from aotc.topi.nn import pad

    _, _, bt = matrices(m)
    at = _integer_at(m)
    a = m + KERNEL - 1
    n, h, w, c = data.shape
    if tuple(u.shape[:3]) != (a, a, c) or u.dtype != "int16":
        raise te.TEError(f"{name}: weight {u.dtype} {list(u.shape)} is not int16 F({m}, 3) on {c} channels")
    k = u.shape[3]
    pt, pl = padding[:2]
    oh, ow, th, tw = _checked_tiles(data, h, w, padding, m, name)
    tiles = -(-th * tw // INTEGER_TILE_ROWS) * INTEGER_TILE_ROWS
    rows_of_tiles = -(-tiles // tw)
    padded = pad(
        data,
        (0, pt, pl, 0),
        (0, m * rows_of_tiles + 2 - h - pt, m * tw + 2 - w - pl, 0),
        value=pad_value,
        name=f"{name}_pad",
    )

    def read(*index: Expr) -> Expr:
        v = cast("int16", padded[index])
        return v - const(zero_point, "int16") if zero_point else v

    # B^T d B as two passes of one dimension each, channels innermost.
    rows = te.compute(
        (n, rows_of_tiles, a, m * tw + 2, c),
        lambda nn, t_h, e1, xw, cc: _transform(
            e1, bt, [read(nn, t_h * m + r, xw, cc) for r in range(a)], "int16"
        ),
        f"{name}_rows",
        tag="winograd_data",
        attrs={CONST_INDEX_AXES: ((2, 1),)},
    )
    v = te.compute(
        (n, tiles, a, a, c),
        lambda nn, p, e1, e2, cc: _transform(
            e2, bt, [rows[nn, p // tw, e1, (p % tw) * m + r, cc] for r in range(a)], "int16"
        ),
        f"{name}_data",
        tag="winograd_data",
        attrs={CONST_INDEX_AXES: ((2, 1), (3, 1))},
    )
    rc = te.reduce_axis(c, "rc")
    prod = te.compute(
        (a, a, n, tiles, k),
        lambda e1, e2, nn, p, kk: te.sum(
            cast("int32", v[nn, p, e1, e2, rc.var]) * cast("int32", u[e1, e2, rc.var, kk]), rc
        ),
        f"{name}_gemm",
        tag="winograd_gemm",
    )
    # A^T M A, one dimension at a time, then the exact division by the weights' scale.
    cols = te.compute(
        (a, m, n, tiles, k),
        lambda e1, m2, nn, p, kk: _transform(m2, at, [prod[e1, e, nn, p, kk] for e in range(a)], "int32"),
        f"{name}_cols",
        tag="winograd_out",
        attrs={CONST_INDEX_AXES: ((1, 1),)},
    )
    factor = integer_output_factor(m)
    return te.compute(
        (n, oh, ow, k),
        lambda nn, yy, xx, kk: _divide_exactly(
            _transform(
                yy % m, at, [cols[e, xx % m, nn, (yy // m) * tw + xx // m, kk] for e in range(a)], "int32"
            ),
            factor,
        ),
        name,
        tag="winograd_out",
        attrs={CONST_INDEX_AXES: ((1, m), (2, m))},
    )


def _checked_tiles(data: Operation, h: int, w: int, padding: Sequence[int], m: int, name: str) -> tuple:
    """`output_tiles`, or an error where the conv has no output."""
    oh, ow, th, tw = output_tiles(h, w, tuple(padding), m)
    if oh < 1 or ow < 1:
        raise te.TEError(f"{name}: no output for input {list(data.shape)} and pads {list(padding)}")
    return oh, ow, th, tw


def _divide_exactly(v: Expr, factor: int) -> Expr:
    """s from int32 v = factor * s modulo 2^32, where |s| < `integer_sum_limit`: factor = 2^a * b with b
    odd; v times b's inverse modulo 2^32 (wrapping) is 2^a * s exactly, then an arithmetic shift."""
    shift = (factor & -factor).bit_length() - 1
    odd = factor >> shift
    if odd > 1:
        inverse = pow(odd, -1, 1 << 32)
        v = v * const(inverse - (1 << 32) if inverse >= 1 << 31 else inverse, v.dtype)
    return v // const(1 << shift, v.dtype) if shift else v


def _logical(values: Sequence, order: Sequence[int]) -> tuple:
    """Physical values (extents, indices) of a tensor stored with axes `order`, in logical order."""
    out = [None] * len(order)
    for pos, axis in enumerate(order):
        out[axis] = values[pos]
    return tuple(out)


def _physical(values: Sequence, order: Sequence[int]) -> tuple:
    return tuple(values[axis] for axis in order)


@dataclass(frozen=True)
class _Laid:
    """A stage read by logical indices, stored with its axes in `order`."""

    op: Operation
    order: tuple[int, ...]

    def __call__(self, *index: Expr) -> Expr:
        return self.op[_physical(index, self.order)]


def _compute(
    logical_shape: Sequence[int],
    order: Sequence[int],
    body: Callable[..., Expr],
    name: str,
    tag: str,
    const_axes: tuple[tuple[int, int], ...],
) -> _Laid:
    """A stage defined on logical axes, stored in `order`; `const_axes` (logical axis, period) say which
    axes its coefficients depend on."""
    order = tuple(order)

    def physical_body(*index):
        return body(*_logical(index, order))

    names = list(inspect.signature(body).parameters)
    physical_body.__signature__ = inspect.Signature(
        [inspect.Parameter(names[axis], inspect.Parameter.POSITIONAL_ONLY) for axis in order]
    )
    op = te.compute(
        _physical(logical_shape, order),
        physical_body,
        name,
        tag=tag,
        attrs={CONST_INDEX_AXES: tuple((order.index(axis), period) for axis, period in const_axes)},
    )
    return _Laid(op, order)


def _combination(terms: list[tuple[float, Expr]], dtype: str) -> Expr:
    """sum(coef * value) over the nonzero coefficients, +-1 as additions and subtractions."""
    acc: Expr | None = None
    for coef, value in terms:
        if coef == 0:
            continue
        mag = abs(coef)
        t = value if mag == 1 else value * const(float(mag) if is_float(dtype) else int(mag), dtype)
        if acc is None:
            acc = t if coef > 0 else -t
        else:
            acc = acc + t if coef > 0 else acc - t
    return acc if acc is not None else const(0.0, dtype)


def _transform(key: Expr, matrix: np.ndarray, values: Sequence[Expr], dtype: str) -> Expr:
    """Row `key` of `matrix` times the vector `values`: a piecewise of the rows' combinations, which
    share the value expressions (so lowering converts each read once)."""
    return _piecewise(
        key,
        matrix.shape[0],
        lambda i: _combination([(matrix[i, r], values[r]) for r in range(len(values))], dtype),
    )


def _piecewise(key: Expr, extent: int, leaf: Callable[[int], Expr]) -> Expr:
    """The value `leaf(i)` where key == i: a select chain that folds to one leaf once the key is a
    constant (an unrolled loop)."""
    out = leaf(extent - 1)
    for i in range(extent - 2, -1, -1):
        out = select(eq(key, i), leaf(i), out)
    return out
