"""Sampling computes: resizing by per-axis tap tables, GridSample, AffineGrid, RoiAlign and DeformConv.

Coordinates computed from tensor values (a grid, offsets, regions) may be NaN or huge: each is clamped as a
float to a margin around the input before it is rounded, and every index is clamped again as an integer
before it is read, so no value makes a read leave its tensor (a NaN coordinate gives an unspecified
element of the input, as ONNX leaves it undefined).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import product

from aotc import te
from aotc.ir.expr import (
    INDEX,
    Expr,
    abs_,
    cast,
    const,
    eq,
    floor,
    logical_and,
    logical_or,
    maximum,
    minimum,
    round_,
    select,
)
from aotc.te.tensor import Operation
from aotc.topi.registry import OpPattern, register

_MARGIN = 4.0
"""How far outside an axis a coordinate is clamped to: beyond every tap of a cubic kernel (two each side)."""


def _clamp_index(i: Expr, extent: int) -> Expr:
    return minimum(maximum(i, const(0)), const(extent - 1))


def _compute_dtype(dtype: str) -> str:
    """The float type interpolation runs in: float64 for float64 tensors, else float32."""
    return "float64" if dtype == "float64" else "float32"


# --- Resize by tap tables -------------------------------------------------------------------------------------


def resize_axis(
    x: Operation,
    axis: int,
    index: Operation,
    weight: Operation | None = None,
    outside: Operation | None = None,
    extrapolation_value: float = 0.0,
    name: str = "resize_axis",
) -> Operation:
    """Resize along one axis by a table of taps: out[.., o, ..] = sum_k weight[o, k] * x[.., index[o, k], ..]
    (index [out, K] already within the axis; no weight: K is 1 and the element is taken as it is). Where
    `outside[o]` is true (tf_crop_and_resize beyond the input) the output is `extrapolation_value`."""
    if index.ndim != 2 or (weight is not None and weight.shape != index.shape):
        raise te.TEError(f"resize_axis: index {list(index.shape)} and weight tables must be [out, taps]")
    if weight is None and index.shape[1] != 1:
        raise te.TEError("resize_axis: taps without weights must be one per output")
    if weight is not None and not x.dtype.startswith("float"):
        raise te.TEError(f"resize_axis: interpolation needs a float tensor, got {x.dtype}")
    extent, taps = x.shape[axis], index.shape[1]
    shape = x.shape[:axis] + (index.shape[0],) + x.shape[axis + 1 :]
    acc = _compute_dtype(x.dtype)

    def body(*i):
        o = i[axis]

        def read(k: int) -> Expr:
            at = i[:axis] + (_clamp_index(cast(INDEX, index[o, k]), extent),) + i[axis + 1 :]
            return x[at]

        if weight is None:
            value = read(0)
        else:
            total = None
            for k in range(taps):
                term = cast(acc, weight[o, k]) * cast(acc, read(k))
                total = term if total is None else total + term
            value = cast(x.dtype, total)
        if outside is not None:
            value = select(outside[o], const(extrapolation_value, x.dtype), value)
        return value

    return te.compute(shape, body, name, tag="resize_axis")


@register("resize_axis", OpPattern.INJECTIVE)
def _resize_axis(inputs, attrs):
    """x, int32 index [out, taps], optional float weight [out, taps], optional bool outside [out]; attrs:
    axis, weighted, extrapolation_value (present when `outside` is given)."""
    x, index, rest = inputs[0], inputs[1], list(inputs[2:])
    weight = rest.pop(0) if attrs.get("weighted", True) else None
    outside = rest.pop(0) if rest else None
    value = attrs.get("extrapolation_value", 0.0)
    return [resize_axis(x, attrs["axis"], index, weight, outside, value)]


# --- GridSample -------------------------------------------------------------------------------------------


def _reflect(v: Expr, low: float, high: float, dtype: str) -> Expr:
    """ONNX GridSample's reflection of `v` by the borders [low, high] until it lies between them."""
    span = const(high - low, dtype)

    def fold(dx: Expr) -> tuple[Expr, Expr]:
        n = floor(dx / span)
        r = dx - n * span
        even = eq(floor(n * const(0.5, dtype)) * const(2.0, dtype), n)
        return even, r

    even_lo, r_lo = fold(const(low, dtype) - v)
    even_hi, r_hi = fold(v - const(high, dtype))
    below = select(even_lo, const(low, dtype) + r_lo, const(high, dtype) - r_lo)
    above = select(even_hi, const(high, dtype) - r_hi, const(low, dtype) + r_hi)
    return select(v < const(low, dtype), below, select(v > const(high, dtype), above, v))


def _cubic_weights(t: Expr, a: float, dtype: str) -> list[Expr]:
    """Keys' cubic convolution weights of the four taps around a point `t` (in [0, 1)) past the second."""
    c = lambda v: const(v, dtype)  # noqa: E731
    t = abs_(t)
    s, u = t + c(1.0), c(1.0) - t
    w = u + c(1.0)
    return [
        ((c(a) * s - c(5 * a)) * s + c(8 * a)) * s - c(4 * a),
        ((c(a + 2) * t - c(a + 3)) * t) * t + c(1.0),
        ((c(a + 2) * u - c(a + 3)) * u) * u + c(1.0),
        ((c(a) * w - c(5 * a)) * w + c(8 * a)) * w - c(4 * a),
    ]


def grid_sample(
    x: Operation,
    grid: Operation,
    mode: str = "linear",
    padding_mode: str = "zeros",
    align_corners: bool = False,
    name: str = "grid_sample",
) -> Operation:
    """ONNX GridSample (as ONNX's reference computes it): x [N, C, *spatial] read at the points of grid
    [N, *out, rank] (normalized to [-1, 1], the last axis listing the innermost spatial axis first)."""
    rank = x.ndim - 2
    if grid.ndim != rank + 2 or grid.shape[0] != x.shape[0] or grid.shape[-1] != rank:
        raise te.TEError(f"grid_sample: grid {list(grid.shape)} does not fit input {list(x.shape)}")
    if mode not in ("nearest", "linear", "cubic") or padding_mode not in ("zeros", "border", "reflection"):
        raise te.TEError(f"grid_sample: unsupported mode {mode!r} or padding_mode {padding_mode!r}")
    if mode != "nearest" and not x.dtype.startswith("float"):
        raise te.TEError(f"grid_sample: {mode} interpolation needs a float tensor, got {x.dtype}")
    dims = x.shape[2:]
    if padding_mode == "reflection" and align_corners and min(dims) == 1:
        raise te.TEError("grid_sample: reflection about the corners of an axis of extent 1 is undefined")
    dt = _compute_dtype(grid.dtype)
    c = lambda v: const(float(v), dt)  # noqa: E731
    borders = [(0.0, d - 1.0) if align_corners else (-0.5, d - 0.5) for d in dims]

    def source(j: int, g: Expr) -> Expr:
        d = dims[j]
        v = (g + c(1)) / c(2) * c(d - 1) if align_corners else ((g + c(1)) * c(d) - c(1)) / c(2)
        if mode == "nearest":
            v = round_(v)  # round half to even, as PyTorch and ONNX's reference do
        low, high = borders[j]
        if padding_mode == "border":
            v = select(logical_or(v < c(low), v > c(high)), minimum(maximum(v, c(0)), c(d - 1)), v)
        elif padding_mode == "reflection":
            v = _reflect(v, low, high, dt)
        # a coordinate far outside reads nothing but zeros (or was moved inside above); NaN stays NaN
        return minimum(maximum(v, c(-_MARGIN)), c(d - 1 + _MARGIN))

    def tap(j: int, i: Expr) -> tuple[Expr, Expr | None]:
        """(index to read, in-range condition or None) of integer tap `i` on spatial axis j."""
        d = dims[j]
        if padding_mode == "zeros":
            return _clamp_index(i, d), logical_and(i >= const(0), i < const(d))
        if padding_mode == "reflection":
            low, high = borders[j]
            i = cast(INDEX, _reflect(cast(dt, i), low, high, dt))
        return _clamp_index(i, d), None

    once = te.reduce_axis(1, "once")

    def locate(n, *o):
        """The source coordinate (rounded, moved inside, clamped) on spatial axis o[-1] of each point."""
        *at, j = o
        value = source(rank - 1, cast(dt, grid[(n, *at, 0)]))
        for axis in range(rank - 2, -1, -1):
            value = select(eq(j, const(axis)), source(axis, cast(dt, grid[(n, *at, rank - 1 - axis)])), value)
        return te.sum(value, once)

    # A stage of its own, as a sum of one term: every tap below reads the coordinates, long expressions
    # that a schedule inlining every reduction-free stage (the GPUs') would repeat in each tap.
    located = te.compute(grid.shape, locate, f"{name}_coords", tag="grid_sample")

    def body(n, ch, *o):
        coords = [located[(n, *o, j)] for j in range(rank)]
        per_axis: list[list[tuple[Expr, Expr | None, Expr | None]]] = []
        for j, v in enumerate(coords):
            if mode == "nearest":
                per_axis.append([(*tap(j, cast(INDEX, v)), None)])
                continue
            base = floor(v)
            t = v - base
            i0 = cast(INDEX, base)
            if mode == "linear":
                taps = [(i0, c(1) - t), (i0 + 1, t)]
            else:
                taps = list(zip([i0 - 1, i0, i0 + 1, i0 + 2], _cubic_weights(t, -0.75, dt)))
            per_axis.append([(*tap(j, i), w) for i, w in taps])
        total = None
        for combo in product(*per_axis):
            at = tuple(index for index, _, _ in combo)
            conds = [cond for _, cond, _ in combo if cond is not None]
            value = x[(n, ch, *at)]
            if conds:
                value = select(logical_and(*conds), value, const(0, x.dtype))
            if mode == "nearest":
                return value
            weight = None
            for _, _, w in combo:
                weight = w if weight is None else weight * w
            term = weight * cast(dt, value)
            total = term if total is None else total + term
        return cast(x.dtype, total)

    return te.compute((*x.shape[:2], *grid.shape[1:-1]), body, name, tag="grid_sample")


@register("grid_sample", OpPattern.INJECTIVE)
def _grid_sample(inputs, attrs):
    """x [N, C, *spatial], grid [N, *out, rank]; attrs: mode (nearest/linear/cubic), padding_mode
    (zeros/border/reflection), align_corners."""
    return [
        grid_sample(
            inputs[0],
            inputs[1],
            attrs.get("mode", "linear"),
            attrs.get("padding_mode", "zeros"),
            bool(attrs.get("align_corners", False)),
        )
    ]


# --- AffineGrid -------------------------------------------------------------------------------------------


def affine_grid(theta: Operation, base: Operation, name: str = "affine_grid") -> Operation:
    """ONNX AffineGrid: out[n, *s, i] = sum_j theta[n, i, j] * base[*s, j], base the homogeneous
    normalized coordinates (x, y[, z], 1) of each output point (a constant the frontend computes)."""
    rank = base.ndim - 1
    if theta.ndim != 3 or theta.shape[1:] != (rank, rank + 1) or base.shape[-1] != rank + 1:
        raise te.TEError(f"affine_grid: theta {list(theta.shape)} does not fit base {list(base.shape)}")
    dt = _compute_dtype(theta.dtype)

    def body(n, *s):
        spatial, i = s[:-1], s[-1]
        total = None
        for j in range(rank + 1):
            term = cast(dt, theta[n, i, j]) * cast(dt, base[(*spatial, j)])
            total = term if total is None else total + term
        return cast(theta.dtype, total)

    return te.compute((theta.shape[0], *base.shape[:-1], rank), body, name, tag="affine_grid")


@register("affine_grid", OpPattern.INJECTIVE)
def _affine_grid(inputs, attrs):
    """theta [N, rank, rank + 1], base [*spatial, rank + 1] (constant)."""
    return [affine_grid(inputs[0], inputs[1])]


# --- RoiAlign ---------------------------------------------------------------------------------------------


def roi_align(
    x: Operation,
    rois: Operation,
    batch_indices: Operation,
    output_size: Sequence[int],
    sampling: Sequence[int],
    spatial_scale: float = 1.0,
    half_pixel: bool = True,
    mode: str = "avg",
    name: str = "roi_align",
) -> Operation:
    """ONNX RoiAlign over x [N, C, H, W] for rois [R, 4] (x1, y1, x2, y2) of batch_indices [R]: each output
    bin averages (or takes the max of) `sampling` (gh, gw) bilinear samples, as ONNX's reference does (for
    max, the largest of the four weighted corners of each sample)."""
    if x.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 4 or batch_indices.shape != (rois.shape[0],):
        raise te.TEError(
            f"roi_align: x {list(x.shape)}, rois {list(rois.shape)}, batch_indices {list(batch_indices.shape)}"
        )
    if mode not in ("avg", "max"):
        raise te.TEError(f"roi_align: unsupported mode {mode!r}")
    if not x.dtype.startswith("float"):
        raise te.TEError(f"roi_align: needs a float tensor, got {x.dtype}")
    batch, height, width = x.shape[0], x.shape[2], x.shape[3]
    (ph_n, pw_n), (gh, gw) = output_size, sampling
    dt = _compute_dtype(x.dtype)
    c = lambda v: const(float(v), dt)  # noqa: E731
    ky, kx = te.reduce_axis(gh, "iy"), te.reduce_axis(gw, "ix")

    def points(axis: int, bins: int, samples: int):
        """The sample coordinates along one axis (0: x, 1: y) of each region: [R, bins, samples]."""

        def locate(r, p, k):
            offset = c(0.5 if half_pixel else 0.0)
            start = cast(dt, rois[r, axis]) * c(spatial_scale) - offset
            extent = cast(dt, rois[r, axis + 2]) * c(spatial_scale) - offset - start
            if not half_pixel:  # malformed regions are forced to 1x1
                extent = maximum(extent, c(1))
            size = extent / c(bins)
            return start + cast(dt, p) * size + (cast(dt, k) + c(0.5)) * size / c(samples)

        return te.compute((rois.shape[0], bins, samples), locate, f"{name}_{'xy'[axis]}", tag="roi_align")

    # stages of their own: the four corners of every sample read them
    ys, xs = points(1, ph_n, gh), points(0, pw_n, gw)

    def body(r, ch, ph, pw):
        y, xx = ys[r, ph, ky.var], xs[r, pw, kx.var]
        skip = logical_or(y < c(-1), y > c(height), xx < c(-1), xx > c(width))

        def taps(v: Expr, extent: int) -> tuple[Expr, Expr, Expr]:
            v = minimum(maximum(v, c(0)), c(extent - 1))  # past the last element: that element, weight 1
            low = _clamp_index(cast(INDEX, floor(v)), extent)
            high = minimum(low + 1, const(extent - 1))
            return low, high, v - cast(dt, low)

        y0, y1, ly = taps(y, height)
        x0, x1, lx = taps(xx, width)
        hy, hx = c(1) - ly, c(1) - lx
        n = _clamp_index(cast(INDEX, batch_indices[r]), batch)
        corners = [(y0, x0, hy * hx), (y0, x1, hy * lx), (y1, x0, ly * hx), (y1, x1, ly * lx)]
        values = [w * cast(dt, x[n, ch, yi, xi]) for yi, xi, w in corners]
        if mode == "avg":
            value = select(skip, c(0), values[0] + values[1] + values[2] + values[3])
            return te.sum(value / c(gh * gw), [ky, kx])
        best = maximum(maximum(values[0], values[1]), maximum(values[2], values[3]))
        return te.max(select(skip, c(0), best), [ky, kx])

    shape = (rois.shape[0], x.shape[1], ph_n, pw_n)
    if x.dtype == dt:
        return te.compute(shape, body, name, tag="roi_align")
    acc = te.compute(shape, body, f"{name}_acc", tag="roi_align")
    return te.compute(shape, lambda *i: cast(x.dtype, acc[i]), name, tag="roi_align")


@register("roi_align", OpPattern.COMM_REDUCE)
def _roi_align(inputs, attrs):
    """x [N, C, H, W], rois [R, 4], batch_indices [R]; attrs: output_size, sampling (samples per bin, per
    axis), spatial_scale, half_pixel, mode (avg/max)."""
    return [
        roi_align(
            inputs[0],
            inputs[1],
            inputs[2],
            attrs["output_size"],
            attrs["sampling"],
            attrs.get("spatial_scale", 1.0),
            attrs.get("half_pixel", True),
            attrs.get("mode", "avg"),
        )
    ]


# --- DeformConv -------------------------------------------------------------------------------------------


def deform_conv2d(
    x: Operation,
    w: Operation,
    offset: Operation,
    bias: Operation | None,
    mask: Operation | None,
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
    group: int = 1,
    offset_group: int = 1,
    name: str = "deform_conv2d",
) -> Operation:
    """ONNX DeformConv in 2-D: a grouped convolution whose every kernel tap reads x bilinearly (zero outside)
    at its place moved by `offset` [N, offset_group * kh * kw * 2, oh, ow] (dy, dx pairs), the read scaled
    by `mask` [N, offset_group * kh * kw, oh, ow] when given."""
    n_, cin, height, width = x.shape
    cout, cin_g, kh, kw = w.shape
    oh, ow = offset.shape[2:]
    if cin != cin_g * group or cout % group or cin % offset_group:
        raise te.TEError(f"deform_conv2d: x {list(x.shape)}, w {list(w.shape)}, group {group}")
    if offset.shape != (n_, offset_group * kh * kw * 2, oh, ow) or (
        mask is not None and mask.shape != (n_, offset_group * kh * kw, oh, ow)
    ):
        raise te.TEError(f"deform_conv2d: offset {list(offset.shape)} or mask do not fit kernel {kh}x{kw}")
    dt = _compute_dtype(x.dtype)
    c = lambda v: const(float(v), dt)  # noqa: E731
    cout_g, cin_og = cout // group, cin // offset_group
    kc, ky, kx = te.reduce_axis(cin_g, "rc"), te.reduce_axis(kh, "ry"), te.reduce_axis(kw, "rx")

    def sample(nb: Expr, ch: Expr, y: Expr, xx: Expr) -> Expr:
        y = minimum(maximum(y, c(-_MARGIN)), c(height - 1 + _MARGIN))
        xx = minimum(maximum(xx, c(-_MARGIN)), c(width - 1 + _MARGIN))
        fy, fx = floor(y), floor(xx)
        ty, tx = y - fy, xx - fx
        y0, x0 = cast(INDEX, fy), cast(INDEX, fx)
        total = None
        for yi, wy in ((y0, c(1) - ty), (y0 + 1, ty)):
            for xi, wx in ((x0, c(1) - tx), (x0 + 1, tx)):
                inside = logical_and(yi >= 0, yi < height, xi >= 0, xi < width)
                read = x[nb, ch, _clamp_index(yi, height), _clamp_index(xi, width)]
                term = wy * wx * cast(dt, select(inside, read, const(0, x.dtype)))
                total = term if total is None else total + term
        return total

    def body(nb, oc, i, j):
        ch = oc // cout_g * cin_g + kc.var
        og = ch // cin_og
        tap = (og * kh + ky.var) * kw + kx.var
        dy, dx = offset[nb, tap * 2, i, j], offset[nb, tap * 2 + 1, i, j]
        y = cast(dt, i * strides[0] - pads[0] + ky.var * dilations[0]) + cast(dt, dy)
        xx = cast(dt, j * strides[1] - pads[1] + kx.var * dilations[1]) + cast(dt, dx)
        value = sample(nb, ch, y, xx) * cast(dt, w[oc, kc.var, ky.var, kx.var])
        if mask is not None:
            value = value * cast(dt, mask[nb, tap, i, j])
        return te.sum(value, [kc, ky, kx])

    acc = te.compute((n_, cout, oh, ow), body, f"{name}_acc", tag="deform_conv2d")

    def finish(nb, oc, i, j):
        value = acc[nb, oc, i, j]
        if bias is not None:
            value = value + cast(dt, bias[oc])
        return cast(x.dtype, value)

    return te.compute(acc.shape, finish, name, tag="deform_conv2d")


@register("deform_conv2d", OpPattern.COMM_REDUCE)
def _deform_conv2d(inputs, attrs):
    """x, w, offset, then bias and mask as attrs has_bias / has_mask say; attrs: strides, pads (top, left),
    dilations, group, offset_group."""
    x, w, offset, rest = inputs[0], inputs[1], inputs[2], list(inputs[3:])
    bias = rest.pop(0) if attrs.get("has_bias") else None
    mask = rest.pop(0) if attrs.get("has_mask") else None
    return [
        deform_conv2d(
            x,
            w,
            offset,
            bias,
            mask,
            attrs["strides"],
            attrs["pads"],
            attrs["dilations"],
            attrs.get("group", 1),
            attrs.get("offset_group", 1),
        )
    ]
