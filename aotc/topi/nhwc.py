"""NHWC operators (TFLite layout): convolutions, pooling and their registrations.

Weights arrive in TFLite's layouts (OHWI for CONV_2D and TRANSPOSE_CONV, [1, KH, KW, C*M] for
DEPTHWISE_CONV_2D). Output channels are the innermost, vectorized axis, so a conv first copies an
OHWI weight to [KH, KW, I, O] in a small stage of its own: the inner loop then loads weight vectors
contiguously instead of gathering them (the copy costs one pass over the weight per call).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from aotc import te
from aotc.ir.expr import Expr, const, dtype_min, eq, is_float, logical_and, select
from aotc.te.tensor import Operation
from aotc.topi import nn
from aotc.topi.nn import as_pads, as_pair, taps_inside, uniform_windows
from aotc.topi.registry import OpPattern, register

Window = tuple[tuple[int, int], tuple[int, int, int, int], tuple[int, int]]


def window_attrs(attrs: dict) -> Window:
    """(strides, pads (top, left, bottom, right), dilations) from a node's attrs."""
    return as_pair(attrs.get("strides", 1)), as_pads(attrs.get("pads", 0)), as_pair(attrs.get("dilations", 1))


def out_extent(size: int, k: int, s: int, d: int, p_begin: int, p_end: int, what: str) -> int:
    out = (size + p_begin + p_end - d * (k - 1) - 1) // s + 1
    if out < 1:
        raise te.TEError(
            f"{what}: window {k} (dilation {d}) does not fit extent {size} with pads {p_begin}, {p_end}"
        )
    return out


def pad_hw(data: Operation, pads: tuple[int, int, int, int], value: float | int, name: str) -> Operation:
    """`data` [N, H, W, C] padded on H and W with `value`."""
    pt, pl, pb, pr = pads
    return nn.pad(data, (0, pt, pl, 0), (0, pb, pr, 0), value=value, name=name)


def conv2d_nhwc(
    data: Operation,
    weight: Operation,
    window: Window,
    groups: int = 1,
    acc_dtype: str | None = None,
    pad_value: float | int = 0,
    term: Callable[[Expr, Expr], Expr] | None = None,
    name: str = "conv2d_nhwc",
) -> Operation:
    """out[n, y, x, o] = sum over (ky, kx, i) of term(data[n, y*sh + ky*dh - pt, x*sw + kx*dw - pl, g*I + i],
    weight[o, ky, kx, i]) with g = o // (O / groups); `term` defaults to the product in `acc_dtype`."""
    (sh, sw), pads, (dh, dw) = window
    n, h, w, c = data.shape
    oc, kh, kw, icg = weight.shape
    if groups < 1 or c % groups or oc % groups or icg != c // groups:
        raise te.TEError(
            f"{name}: input channels {c}, weight {list(weight.shape)} (OHWI) and groups={groups} do not fit"
        )
    oh = out_extent(h, kh, sh, dh, pads[0], pads[2], name)
    ow = out_extent(w, kw, sw, dw, pads[1], pads[3], name)
    acc_dtype = acc_dtype or data.dtype
    term = term or (lambda a, b: a.astype(acc_dtype) * b.astype(acc_dtype))
    padded = pad_hw(data, pads, pad_value, f"{name}_pad")
    rc, ry, rx = te.reduce_axis(icg, "rc"), te.reduce_axis(kh, "ry"), te.reduce_axis(kw, "rx")
    ocg = oc // groups

    def body(nn_, yy, xx, ff):
        cin = rc.var if groups == 1 else (ff // ocg) * icg + rc.var
        a = padded[nn_, yy * sh + ry.var * dh, xx * sw + rx.var * dw, cin]
        return te.sum(term(a, weight[ff, ry.var, rx.var, rc.var]), [ry, rx, rc])

    return te.compute((n, oh, ow, oc), body, name, tag="conv2d_nhwc" if groups == 1 else "group_conv2d_nhwc")


def depthwise_conv2d_nhwc(
    data: Operation,
    weight: Operation,
    window: Window,
    depth_multiplier: int = 1,
    acc_dtype: str | None = None,
    pad_value: float | int = 0,
    term: Callable[[Expr, Expr], Expr] | None = None,
    name: str = "depthwise_conv2d_nhwc",
) -> Operation:
    """Weight [1, KH, KW, C*M]; output channel o reads input channel o // M."""
    (sh, sw), pads, (dh, dw) = window
    n, h, w, c = data.shape
    one, kh, kw, oc = weight.shape
    mult = int(depth_multiplier)
    if one != 1 or oc != c * mult:
        raise te.TEError(
            f"{name}: weight {list(weight.shape)} does not fit {c} channels with depth_multiplier {mult}"
        )
    oh = out_extent(h, kh, sh, dh, pads[0], pads[2], name)
    ow = out_extent(w, kw, sw, dw, pads[1], pads[3], name)
    acc_dtype = acc_dtype or data.dtype
    term = term or (lambda a, b: a.astype(acc_dtype) * b.astype(acc_dtype))
    padded = pad_hw(data, pads, pad_value, f"{name}_pad")
    ry, rx = te.reduce_axis(kh, "ry"), te.reduce_axis(kw, "rx")

    def body(nn_, yy, xx, ff):
        src = ff // mult if mult > 1 else ff
        a = padded[nn_, yy * sh + ry.var * dh, xx * sw + rx.var * dw, src]
        return te.sum(term(a, weight[0, ry.var, rx.var, ff]), [ry, rx])

    return te.compute((n, oh, ow, oc), body, name, tag="depthwise_conv2d_nhwc")


def conv2d_transpose_nhwc(
    data: Operation,
    weight: Operation,
    strides: Sequence[int],
    pads: Sequence[int],
    output_size: Sequence[int],
    name: str = "conv2d_transpose_nhwc",
) -> Operation:
    """TFLite TRANSPOSE_CONV: data [N, H, W, I], weight [O, KH, KW, I];
    out[n, y, x, o] = sum of data[n, iy, ix, i] * w[o, ky, kx, i] over y = iy*sh + ky - pt, x = ix*sw + kx - pl.

    As a gather: the input dilated by the stride and shifted by kh - 1 - pt (zeros elsewhere), then a
    plain convolution with the flipped kernel (two stages: dilate+pad, conv)."""
    sh, sw = as_pair(strides)
    pt, pl, _, _ = as_pads(pads)
    oh, ow = (int(v) for v in output_size)
    n, h, w, c = data.shape
    oc, kh, kw, ic = weight.shape
    if ic != c:
        raise te.TEError(f"{name}: weight {list(weight.shape)} (OHWI) does not fit {c} input channels")
    if oh < 1 or ow < 1:
        raise te.TEError(f"{name}: output_size {list(output_size)} is empty")
    bt, bl = kh - 1 - pt, kw - 1 - pl

    def source(p, before, s, size):
        j = p - before if before else p
        conds = [j >= 0, j < (size - 1) * s + 1] + ([eq(j % s, 0)] if s > 1 else [])
        return (j // s if s > 1 else j), conds

    def dilate_pad(nn_, yy, xx, cc):
        y, cy = source(yy, bt, sh, h)
        x, cx = source(xx, bl, sw, w)
        return select(logical_and(*cy, *cx), data[nn_, y, x, cc], const(0, data.dtype))

    padded = te.compute((n, oh + kh - 1, ow + kw - 1, c), dilate_pad, f"{name}_dilate_pad", tag="dilate_pad")
    rc, ry, rx = te.reduce_axis(c, "rc"), te.reduce_axis(kh, "ry"), te.reduce_axis(kw, "rx")

    def body(nn_, yy, xx, ff):
        return te.sum(
            padded[nn_, yy + ry.var, xx + rx.var, rc.var]
            * weight[ff, kh - 1 - ry.var, kw - 1 - rx.var, rc.var],
            [ry, rx, rc],
        )

    return te.compute((n, oh, ow, oc), body, name, tag="conv2d_transpose_nhwc")


def pool2d_nhwc(
    data: Operation,
    kind: str,
    kernel: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int],
    name: str = "pool2d_nhwc",
    finish: Callable[[Expr, Expr], Expr] | None = None,
) -> Operation:
    """Max or average pooling over H and W of [N, H, W, C]; padded taps are excluded (TFLite).

    For "avg", `finish(sum, count)` turns the window sum and its count of taps inside the input into
    the output (default: sum / count, floats only); integer sums accumulate in int32."""
    n, h, w, c = data.shape
    kh, kw = as_pair(kernel)
    sh, sw = as_pair(strides)
    pt, pl, pb, pr = as_pads(pads)
    oh = out_extent(h, kh, sh, 1, pt, pb, name)
    ow = out_extent(w, kw, sw, 1, pl, pr, name)
    ry, rx = te.reduce_axis(kh, "ry"), te.reduce_axis(kw, "rx")
    if kind == "max":
        padded = pad_hw(data, (pt, pl, pb, pr), dtype_min(data.dtype), f"{name}_pad")
        return te.compute(
            (n, oh, ow, c),
            lambda b, y, x, ch: te.max(padded[b, y * sh + ry.var, x * sw + rx.var, ch], [ry, rx]),
            name,
            tag="pool_max",
        )
    if kind != "avg":
        raise te.TEError(f"{name}: kind must be 'max' or 'avg', got {kind!r}")
    acc = data.dtype if is_float(data.dtype) else "int32"
    if finish is None and not is_float(data.dtype):
        raise te.TEError(f"{name}: average pooling of {data.dtype} needs the quantized operator")
    padded = pad_hw(data, (pt, pl, pb, pr), 0, f"{name}_pad")
    total = te.compute(
        (n, oh, ow, c),
        lambda b, y, x, ch: te.sum(padded[b, y * sh + ry.var, x * sw + rx.var, ch].astype(acc), [ry, rx]),
        f"{name}_sum",
        tag="pool_sum",
    )
    finish = finish or (lambda s, k: s / k.astype(s.dtype))
    uniform = uniform_windows(oh, sh, 1, kh, pt, 0, h) and uniform_windows(ow, sw, 1, kw, pl, 0, w)

    def count(yy, xx):
        if uniform:
            return const(kh * kw, "int32")
        ny = taps_inside(yy, sh, 1, kh, pt, 0, h)
        nx = taps_inside(xx, sw, 1, kw, pl, 0, w)
        return (ny * nx).astype("int32")

    return te.compute(
        (n, oh, ow, c), lambda b, y, x, ch: finish(total[b, y, x, ch], count(y, x)), name, tag="elemwise"
    )


def with_bias_nhwc(out: Operation, inputs: Sequence[Operation]) -> list[Operation]:
    """`out` plus the optional bias input (inputs[2], one value per output channel)."""
    if len(inputs) < 3:
        return [out]
    return [nn.bias_add(out, inputs[2], axis=out.ndim - 1, name=f"{out.name}_bias")]


@register("conv2d_nhwc", OpPattern.OUT_ELEMWISE_FUSABLE)
def _conv2d_nhwc(inputs, attrs):
    """data NHWC, weight OHWI, optional bias [O]; attrs: strides, pads (t, l, b, r), dilations.
    Grouped when the weight has fewer input channels than the data (groups = C // I)."""
    data, weight = inputs[:2]
    groups = data.shape[3] // weight.shape[3] if weight.shape[3] else 0
    return with_bias_nhwc(conv2d_nhwc(data, weight, window_attrs(attrs), groups=groups), inputs)


@register("depthwise_conv2d_nhwc", OpPattern.OUT_ELEMWISE_FUSABLE)
def _depthwise_conv2d_nhwc(inputs, attrs):
    """data NHWC, weight [1, KH, KW, C*M], optional bias [C*M]; attrs: strides, pads, dilations,
    depth_multiplier."""
    out = depthwise_conv2d_nhwc(
        inputs[0], inputs[1], window_attrs(attrs), depth_multiplier=attrs.get("depth_multiplier", 1)
    )
    return with_bias_nhwc(out, inputs)


@register("conv2d_transpose_nhwc", OpPattern.OUT_ELEMWISE_FUSABLE)
def _conv2d_transpose_nhwc(inputs, attrs):
    """data [N, H, W, I], weight [O, KH, KW, I], optional bias [O]; attrs: strides, pads, output_size."""
    out = conv2d_transpose_nhwc(
        inputs[0], inputs[1], attrs.get("strides", 1), attrs.get("pads", 0), attrs["output_size"]
    )
    return with_bias_nhwc(out, inputs)


@register("pool2d_nhwc", OpPattern.OUT_ELEMWISE_FUSABLE)
def _pool2d_nhwc(inputs, attrs):
    """attrs: kind ("max" | "avg"), kernel, strides, pads; avg excludes padded taps from the count."""
    return [
        pool2d_nhwc(inputs[0], attrs["kind"], attrs["kernel"], attrs.get("strides", 1), attrs.get("pads", 0))
    ]
