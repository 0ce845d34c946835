"""Compute definitions of neural-network operators in tensor expressions (one function per operator)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from aotc import te
from aotc.ir.expr import (
    Expr,
    const,
    dtype_min,
    eq,
    exp,
    log,
    logical_and,
    maximum,
    minimum,
    rsqrt,
    select,
    sqrt,
)
from aotc.te.tensor import IterVar, Operation
from aotc.topi.elemwise import broadcast_index, broadcast_read, broadcast_shape, divide


def matmul(a: Operation, b: Operation, name: str = "matmul") -> Operation:
    """numpy.matmul: C[..., i, j] = sum_k A[..., i, k] * B[..., k, j]; batch dims broadcast, 1-D operands."""
    a_shape = (1, *a.shape) if a.ndim == 1 else a.shape
    b_shape = (*b.shape, 1) if b.ndim == 1 else b.shape
    (m, k), (k2, n) = a_shape[-2:], b_shape[-2:]
    if k != k2:
        raise te.TEError(f"matmul: inner dimensions differ ({k} vs {k2})")
    batch = broadcast_shape(a_shape[:-2], b_shape[:-2])
    rows = (m,) if a.ndim > 1 else ()
    cols = (n,) if b.ndim > 1 else ()
    rk = te.reduce_axis(k, "k")

    def body(*idx):
        lead, rest = idx[: len(batch)], idx[len(batch) :]
        a_idx = (*broadcast_index(a_shape[:-2], lead), *rest[: len(rows)], rk.var)
        b_idx = (*broadcast_index(b_shape[:-2], lead), rk.var, *rest[len(rows) :])
        return te.sum(a[a_idx] * b[b_idx], rk)

    tag = "batch_matmul" if batch else "matmul"
    return te.compute((*batch, *rows, *cols), body, name, tag=tag)


def dense(data: Operation, weight: Operation, name: str = "dense") -> Operation:
    """Y[i, j] = sum_k X[i, k] * W[j, k] (weight in [out, in] layout)."""
    (m, k), (n, k2) = data.shape, weight.shape
    if k != k2:
        raise te.TEError(f"dense: inner dimensions differ ({k} vs {k2})")
    rk = te.reduce_axis(k, "k")
    return te.compute((m, n), lambda i, j: te.sum(data[i, rk.var] * weight[j, rk.var], rk), name, tag="dense")


def pad(
    data: Operation,
    before: Sequence[int],
    after: Sequence[int],
    value: float = 0.0,
    name: str = "pad",
    mode: str = "constant",
) -> Operation:
    """Pad (or crop, for negative amounts) every axis; `mode` is constant, reflect or edge."""
    if not any(before) and not any(after):
        return data
    if mode not in ("constant", "reflect", "edge"):
        raise te.TEError(f"pad: unknown mode {mode!r}")
    shape = tuple(s + b + a for s, b, a in zip(data.shape, before, after))
    if mode == "reflect" and any(b >= s or a >= s for s, b, a in zip(data.shape, before, after)):
        raise te.TEError(
            f"pad: reflect pads {list(before)}, {list(after)} must be smaller than {list(data.shape)}"
        )

    def body(*idx):
        conds, src = [], []
        for i, b, a, s in zip(idx, before, after, data.shape):
            j = i - b if b else i
            if mode == "constant":
                conds += [i >= b] if b > 0 else []
                conds += [i < s + b] if a > 0 else []
            elif mode == "reflect":
                j = select(j < 0, -j, j) if b > 0 else j
                j = select(j >= s, 2 * (s - 1) - j, j) if a > 0 else j
            else:
                j = maximum(j, 0) if b > 0 else j
                j = minimum(j, s - 1) if a > 0 else j
            src.append(j)
        if not conds:
            return data[tuple(src)]
        return select(logical_and(*conds), data[tuple(src)], const(value, data.dtype))

    return te.compute(shape, body, name, tag="pad")


def window_columns(data: Operation, taps: int, stride: int, out_width: int) -> Operation:
    """NHWC `data` -> [N, H, out_width, taps * C]: output column w holds the `taps` pixels from `stride * w`
    on, each pixel's C channels in turn, as one run of channels (in NHWC, one run of the input row). A conv
    of KW <= taps columns reads its window rows as channels of a (KH x 1) conv."""
    n, height, width, channels = data.shape
    if stride * (out_width - 1) + taps > width:
        raise te.TEError(f"window_columns: {out_width} columns of {taps} taps read past a width of {width}")

    def body(b, h, w, r):
        return data[b, h, w * stride + r // channels, r % channels]

    return te.compute((n, height, out_width, taps * channels), body, "window_columns", tag="window_columns")


def strided_window_input(
    data: Operation,
    pads: tuple[int, int, int, int],
    stride: tuple[int, int],
    value: float = 0.0,
    name: str = "pad",
):
    """The padded input of a windowed op, and `read(n, c, yy, ky, xx, kx)` = padded[n, c, yy*sh+ky, xx*sw+kx].

    With a stride above 1 the padded input is stored split by stride phase, [n, c, sh, sw, H/sh, W/sw],
    so that consecutive outputs read consecutive elements (contiguous vector loads, no gathers).
    """
    sh, sw = stride
    pt, pl, pb, pr = pads
    if sh == 1 and sw == 1:
        padded = pad(data, (0, 0, pt, pl), (0, 0, pb, pr), value=value, name=name)

        def read_plain(n, c, yy, ky, xx, kx):
            return padded[n, c, yy + ky, xx + kx]

        return padded, read_plain
    nb, ch, h, w = data.shape
    hq, wq = -(-(h + pt + pb) // sh), -(-(w + pl + pr) // sw)

    def body(nn, cc, py, px, yq, xq):
        y = yq * sh + py - pt
        x = xq * sw + px - pl
        inside = logical_and(y >= 0, y < h, x >= 0, x < w)
        return select(inside, data[nn, cc, y, x], const(value, data.dtype))

    phases = te.compute((nb, ch, sh, sw, hq, wq), body, name, tag="pad")

    def read_phased(n, c, yy, ky, xx, kx):
        return phases[n, c, ky % sh, kx % sw, yy + ky // sh, xx + kx // sw]

    return phases, read_phased


def conv2d_nchw(
    data: Operation,
    weight: Operation,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
    name: str = "conv2d",
) -> Operation:
    """NCHW conv with OIHW weights; `padding` is (top, left, bottom, right) or one int or (h, w)."""
    n, c, h, w = data.shape
    oc, icg, kh, kw = weight.shape
    sh, sw = as_pair(stride)
    dh, dw = as_pair(dilation)
    pt, pl, pb, pr = as_pads(padding)
    if c % groups or oc % groups or icg != c // groups:
        raise te.TEError(
            f"conv2d: channels {c}/{oc} do not match groups={groups} and weight {list(weight.shape)}"
        )
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
    _, read = strided_window_input(data, (pt, pl, pb, pr), (sh, sw), name=f"{name}_pad")
    rc = te.reduce_axis(icg, "rc")
    ry = te.reduce_axis(kh, "ry")
    rx = te.reduce_axis(kw, "rx")
    ocg = oc // groups

    def body(nn, ff, yy, xx):
        cin = rc.var if groups == 1 else (ff // ocg) * icg + rc.var
        return te.sum(
            read(nn, cin, yy, ry.var * dh, xx, rx.var * dw) * weight[ff, rc.var, ry.var, rx.var],
            [rc, ry, rx],
        )

    return te.compute((n, oc, oh, ow), body, name, tag="conv2d_nchw" if groups == 1 else "group_conv2d_nchw")


def depthwise_conv2d_nchw(
    data: Operation,
    weight: Operation,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    name: str = "depthwise_conv2d",
) -> Operation:
    """Depthwise conv: weight [C * multiplier, 1, KH, KW]."""
    n, c, h, w = data.shape
    oc, one, kh, kw = weight.shape
    if one != 1 or oc % c:
        raise te.TEError(f"depthwise conv: weight {list(weight.shape)} does not fit {c} channels")
    mult = oc // c
    sh, sw = as_pair(stride)
    dh, dw = as_pair(dilation)
    pt, pl, pb, pr = as_pads(padding)
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
    _, read = strided_window_input(data, (pt, pl, pb, pr), (sh, sw), name=f"{name}_pad")
    ry = te.reduce_axis(kh, "ry")
    rx = te.reduce_axis(kw, "rx")

    def body(nn, ff, yy, xx):
        src_c = ff // mult if mult > 1 else ff
        return te.sum(
            read(nn, src_c, yy, ry.var * dh, xx, rx.var * dw) * weight[ff, 0, ry.var, rx.var], [ry, rx]
        )

    return te.compute((n, oc, oh, ow), body, name, tag="depthwise_conv2d_nchw")


def pool2d_nchw(
    data: Operation,
    kind: str,
    kernel: int | Sequence[int],
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    count_include_pad: bool = False,
    name: str = "pool",
    dilation: int | Sequence[int] = 1,
    ceil_mode: bool = False,
) -> Operation:
    """Max or average pooling over H and W; `padding` is (top, left, bottom, right) or one int or (h, w)."""
    n, c, h, w = data.shape
    kh, kw = as_pair(kernel)
    sh, sw = as_pair(stride)
    dh, dw = as_pair(dilation)
    pt, pl, pb, pr = as_pads(padding)
    oh = _pool_extent(h, kh, sh, dh, pt, pb, ceil_mode)
    ow = _pool_extent(w, kw, sw, dw, pl, pr, ceil_mode)
    if oh < 1 or ow < 1:
        raise te.TEError(f"pool2d: window {kh}x{kw} does not fit input {h}x{w} with pads {[pt, pl, pb, pr]}")
    extra_b = max(0, (oh - 1) * sh + dh * (kh - 1) + 1 - (h + pt + pb))
    extra_r = max(0, (ow - 1) * sw + dw * (kw - 1) + 1 - (w + pl + pr))
    pads = (pt, pl, pb + extra_b, pr + extra_r)
    ry = te.reduce_axis(kh, "ry")
    rx = te.reduce_axis(kw, "rx")

    def window(read, nn, cc, yy, xx):
        return read(nn, cc, yy, ry.var * dh, xx, rx.var * dw)

    if kind == "max":
        _, read = strided_window_input(data, pads, (sh, sw), value=dtype_min(data.dtype), name=f"{name}_pad")
        return te.compute((n, c, oh, ow), lambda *i: te.max(window(read, *i), [ry, rx]), name, tag="pool_max")
    if kind != "avg":
        raise te.TEError(f"pool2d: kind must be 'max' or 'avg', got {kind!r}")
    _, read = strided_window_input(data, pads, (sh, sw), name=f"{name}_pad")
    total = te.compute(
        (n, c, oh, ow), lambda *i: te.sum(window(read, *i), [ry, rx]), f"{name}_sum", tag="pool_sum"
    )
    lo_y, hi_y, lo_x, hi_x = (-pt, h + pb, -pl, w + pr) if count_include_pad else (0, h, 0, w)
    if all(
        uniform_windows(o, s, d, k, p, lo, hi)
        for o, s, d, k, p, lo, hi in ((oh, sh, dh, kh, pt, lo_y, hi_y), (ow, sw, dw, kw, pl, lo_x, hi_x))
    ):
        return te.compute((n, c, oh, ow), lambda *i: total[i] / float(kh * kw), name, tag="elemwise")

    def count(yy, xx):
        ny = taps_inside(yy, sh, dh, kh, pt, lo_y, hi_y)
        nx = taps_inside(xx, sw, dw, kw, pl, lo_x, hi_x)
        return (ny * nx).astype(data.dtype)

    return te.compute(
        (n, c, oh, ow), lambda nn, cc, yy, xx: total[nn, cc, yy, xx] / count(yy, xx), name, tag="elemwise"
    )


def _pool_extent(size: int, k: int, s: int, d: int, p_begin: int, p_end: int, ceil_mode: bool) -> int:
    span = size + p_begin + p_end - d * (k - 1) - 1
    if not ceil_mode:
        return span // s + 1
    out = -(-span // s) + 1
    return out - 1 if (out - 1) * s >= size + p_begin else out


def taps_inside(o, s: int, d: int, k: int, p_begin: int, lo: int, hi: int):
    """How many of the window's k taps (start o*s - p_begin, step d) lie in [lo, hi)."""
    start = o * s - p_begin
    first = maximum((lo - start + d - 1) // d, 0)
    last = minimum((hi - 1 - start) // d, k - 1)
    return maximum(last - first + 1, 0)


def uniform_windows(out: int, s: int, d: int, k: int, p_begin: int, lo: int, hi: int) -> bool:
    """True if every window along this axis has all k taps in [lo, hi)."""
    starts = (-p_begin, (out - 1) * s - p_begin)
    return all(lo <= st and st + d * (k - 1) < hi for st in starts)


def softmax(x: Operation, axis: int = -1, name: str = "softmax") -> Operation:
    """Numerically stable softmax along `axis` (four stages: max, exp, sum, normalize)."""
    nd = len(x.shape)
    if not nd:
        raise te.TEError(f"{name} needs an input of rank 1 or more, got a 0-d tensor")
    axis = axis % nd
    k = te.reduce_axis(x.shape[axis], "k")

    def at(idx, v):
        full = list(idx)
        full.insert(axis, v)
        return tuple(full)

    red_shape = tuple(s for d, s in enumerate(x.shape) if d != axis)
    mx = te.compute(red_shape, lambda *i: te.max(x[at(i, k.var)], k), f"{name}_maxelem", tag="softmax_reduce")
    ex = te.compute(
        x.shape,
        lambda *i: exp(x[i] - mx[tuple(v for d, v in enumerate(i) if d != axis)]),
        f"{name}_exp",
        tag="elemwise",
    )
    k2 = te.reduce_axis(x.shape[axis], "k")
    sm = te.compute(
        red_shape, lambda *i: te.sum(ex[at(i, k2.var)], k2), f"{name}_expsum", tag="softmax_reduce"
    )
    return te.compute(
        x.shape,
        lambda *i: ex[i] / sm[tuple(v for d, v in enumerate(i) if d != axis)],
        f"{name}_norm",
        tag="softmax_norm",
    )


def log_softmax(x: Operation, axis: int = -1, name: str = "log_softmax") -> Operation:
    """x - max - log(sum(exp(x - max))) along `axis` (three stages: max, sum of exp, output)."""
    if not x.ndim:
        raise te.TEError(f"{name} needs an input of rank 1 or more, got a 0-d tensor")
    axis %= x.ndim
    red_shape = tuple(s for d, s in enumerate(x.shape) if d != axis)

    def at(idx, v):
        return (*idx[:axis], v, *idx[axis:])

    def drop(idx):
        return idx[:axis] + idx[axis + 1 :]

    k = te.reduce_axis(x.shape[axis], "k")
    mx = te.compute(red_shape, lambda *i: te.max(x[at(i, k.var)], k), f"{name}_maxelem", tag="softmax_reduce")
    k2 = te.reduce_axis(x.shape[axis], "k")
    sm = te.compute(
        red_shape,
        lambda *i: te.sum(exp(x[at(i, k2.var)] - mx[i]), k2),
        f"{name}_expsum",
        tag="softmax_reduce",
    )
    return te.compute(
        x.shape, lambda *i: x[i] - mx[drop(i)] - log(sm[drop(i)]), f"{name}_norm", tag="softmax_norm"
    )


def reduced_index(ndim: int, raxes: dict[int, IterVar], keepdims: bool, out_index: Sequence) -> tuple:
    """The input index a reduction's output point `out_index` reads: reduce variables on `raxes`."""
    it = iter(out_index)
    idx = []
    for d in range(ndim):
        if d in raxes:
            idx.append(raxes[d].var)
            if keepdims:
                next(it)
        else:
            idx.append(next(it))
    return tuple(idx)


def reduce(
    x: Operation, kind: str, axes: Sequence[int], keepdims: bool = False, name: str = "reduce"
) -> Operation:
    """Sum / max / min / mean / product of `x` over `axes` (all axes with keepdims=False gives a 0-d tensor)."""
    if x.dtype == "bool":  # refused here, where the graph is built, rather than by the codegen later
        raise te.TEError(f"reduce_{kind} is not defined on bool tensors")
    nd = len(x.shape)
    axes = sorted({a % nd for a in axes})
    raxes = {a: te.reduce_axis(x.shape[a], f"k{a}") for a in axes}
    out_shape = (
        tuple(1 if d in raxes else s for d, s in enumerate(x.shape))
        if keepdims
        else tuple(s for d, s in enumerate(x.shape) if d not in raxes)
    )
    combiner = {"sum": te.sum, "mean": te.sum, "max": te.max, "min": te.min, "prod": te.prod}.get(kind)
    if combiner is None:
        raise te.TEError(f"reduce: unknown kind {kind!r}")

    def body(*i):
        return combiner(x[reduced_index(nd, raxes, keepdims, i)], [raxes[a] for a in axes])

    red = te.compute(out_shape, body, name if kind != "mean" else f"{name}_sum", tag=f"reduce_{kind}")
    if kind != "mean":
        return red
    count = const(math.prod(x.shape[a] for a in axes), x.dtype)
    return te.compute(out_shape, lambda *i: divide(red[i], count), name, tag="elemwise")


def normalize(
    x: Operation,
    axes: Sequence[int],
    epsilon: float,
    affine: Callable[[tuple, Expr], Expr],
    name: str = "norm",
) -> Operation:
    """`affine(idx, (x - mean) / sqrt(var + epsilon))` with mean and variance over `axes`.

    Three stages: sum, centered sum of squares (two reductions), and the element-wise output.
    """
    axes = sorted({a % x.ndim for a in axes})
    red_shape = tuple(s for d, s in enumerate(x.shape) if d not in axes)
    count = float(math.prod(x.shape[a] for a in axes))

    def full(idx, ks):
        it, kt = iter(idx), iter(ks)
        return tuple(next(kt).var if d in axes else next(it) for d in range(x.ndim))

    def kept(idx):
        return tuple(v for d, v in enumerate(idx) if d not in axes)

    k1 = [te.reduce_axis(x.shape[a], f"k{a}") for a in axes]
    total = te.compute(red_shape, lambda *i: te.sum(x[full(i, k1)], k1), f"{name}_sum", tag="norm_reduce")
    k2 = [te.reduce_axis(x.shape[a], f"k{a}") for a in axes]

    def sq_dev(*i):
        dev = x[full(i, k2)] - total[i] / count
        return te.sum(dev * dev, k2)

    sqsum = te.compute(red_shape, sq_dev, f"{name}_sqsum", tag="norm_reduce")

    def body(*i):
        r = kept(i)
        return affine(i, (x[i] - total[r] / count) * rsqrt(sqsum[r] / count + epsilon))

    return te.compute(x.shape, body, name, tag="norm")


def layer_norm(
    x: Operation, scale: Operation, bias: Operation | None, axis: int = -1, epsilon: float = 1e-5
) -> Operation:
    """Normalize over axes [axis, ndim); scale and bias broadcast against those trailing axes."""
    axis %= x.ndim

    def affine(i, y):
        y = y * broadcast_read(scale, i[axis:])
        return y + broadcast_read(bias, i[axis:]) if bias is not None else y

    return normalize(x, range(axis, x.ndim), epsilon, affine, "layer_norm")


def instance_norm(x: Operation, scale: Operation, bias: Operation, epsilon: float = 1e-5) -> Operation:
    """Normalize each (n, c) over the spatial axes; per-channel scale and bias."""
    return normalize(x, range(2, x.ndim), epsilon, lambda i, y: y * scale[i[1]] + bias[i[1]], "instance_norm")


def batch_norm(
    x: Operation,
    scale: Operation,
    bias: Operation,
    mean: Operation,
    var: Operation,
    epsilon: float = 1e-5,
    name: str = "batch_norm",
) -> Operation:
    """Inference batch norm over axis 1: (x - mean) * scale / sqrt(var + epsilon) + bias."""

    def body(*i):
        c = i[1]
        return (x[i] - mean[c]) * (scale[c] * rsqrt(var[c] + epsilon)) + bias[c]

    return te.compute(x.shape, body, name, tag="batch_norm")


def conv2d_transpose_nchw(
    data: Operation,
    weight: Operation,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
    output_padding: int | Sequence[int] = 0,
    name: str = "conv2d_transpose",
) -> Operation:
    """Transposed conv, weight [C, OC / groups, KH, KW]: a conv with the flipped kernel over the input
    dilated by the stride and padded by dilation * (k - 1) - pad (two stages: dilate+pad, conv)."""
    n, c, h, w = data.shape
    ic, ocg, kh, kw = weight.shape
    if ic != c or c % groups:
        raise te.TEError(
            f"conv2d_transpose: weight {list(weight.shape)} does not fit {c} channels, groups={groups}"
        )
    sh, sw = as_pair(stride)
    dh, dw = as_pair(dilation)
    pt, pl, pb, pr = as_pads(padding)
    oph, opw = as_pair(output_padding)
    bt, bl = dh * (kh - 1) - pt, dw * (kw - 1) - pl
    bb, br = dh * (kh - 1) - pb + oph, dw * (kw - 1) - pr + opw
    span_h, span_w = (h - 1) * sh + 1, (w - 1) * sw + 1
    ph, pw = span_h + bt + bb, span_w + bl + br
    oh, ow = ph - dh * (kh - 1), pw - dw * (kw - 1)
    if oh < 1 or ow < 1:
        raise te.TEError(f"conv2d_transpose: pads {[pt, pl, pb, pr]} leave no output for input {h}x{w}")

    def source(i, before, after, span, s):
        j = i - before if before else i
        conds = ([j >= 0] if before > 0 else []) + ([j < span] if after > 0 else [])
        conds += [eq(j % s, 0)] if s > 1 else []
        return (j // s if s > 1 else j), conds

    def dilate_pad(nn, cc, yy, xx):
        y, cy = source(yy, bt, bb, span_h, sh)
        x, cx = source(xx, bl, br, span_w, sw)
        if not cy + cx:
            return data[nn, cc, y, x]
        return select(logical_and(*cy, *cx), data[nn, cc, y, x], const(0, data.dtype))

    padded = te.compute((n, c, ph, pw), dilate_pad, f"{name}_dilate_pad", tag="dilate_pad")
    icg = c // groups
    rc = te.reduce_axis(icg, "rc")
    ry = te.reduce_axis(kh, "ry")
    rx = te.reduce_axis(kw, "rx")

    def body(nn, ff, yy, xx):
        cin = rc.var if groups == 1 else (ff // ocg) * icg + rc.var
        f = ff if groups == 1 else ff % ocg
        return te.sum(
            padded[nn, cin, yy + ry.var * dh, xx + rx.var * dw]
            * weight[cin, f, kh - 1 - ry.var, kw - 1 - rx.var],
            [rc, ry, rx],
        )

    return te.compute((n, ocg * groups, oh, ow), body, name, tag="conv2d_transpose_nchw")


# n-D windows (N, C, then the spatial axes) for the ranks the 2-D computes above do not cover (3-D): those
# keep their own definitions, so that their workload keys, and the records tuned for them, stay valid.
# `pads` are ONNX's: every axis's begin, then every axis's end.


def _window_args(
    what: str,
    rank: int,
    kernel: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    """kernel, strides, dilations, begin and end pads as lists of `rank` ints, checked."""
    if len(kernel) != rank or len(strides) != rank or len(dilations) != rank or len(pads) != 2 * rank:
        raise te.TEError(
            f"{what}: a {rank}-D window needs {rank} kernel extents, strides and dilations and {2 * rank} pads, "
            f"got {list(kernel)}, {list(strides)}, {list(dilations)}, {list(pads)}"
        )
    if min(kernel) < 1 or min(strides) < 1 or min(dilations) < 1:
        raise te.TEError(
            f"{what}: kernel {list(kernel)}, strides {list(strides)}, dilations {list(dilations)}"
        )
    ints = [[int(e) for e in v] for v in (kernel, strides, dilations, pads[:rank], pads[rank:])]
    return ints[0], ints[1], ints[2], ints[3], ints[4]


def pool_nd(
    data: Operation,
    kind: str,
    kernel: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
    ceil_mode: bool = False,
    count_include_pad: bool = False,
    name: str = "pool",
) -> Operation:
    """Max or average pooling over every axis after N and C. An average divides by the window's taps
    inside the input (inside the padded input with `count_include_pad`); ceil_mode's extra taps past the
    end padding count for neither."""
    n, c, *sizes = data.shape
    kernel, strides, dilations, begins, ends = _window_args(
        name, len(sizes), kernel, strides, pads, dilations
    )
    outs = [_pool_extent(*a, ceil_mode) for a in zip(sizes, kernel, strides, dilations, begins, ends)]
    if min(outs) < 1:
        raise te.TEError(f"{name}: window {kernel} does not fit input {sizes} with pads {list(pads)}")
    extra = [
        max(0, (o - 1) * s + d * (k - 1) + 1 - (size + b + e))
        for o, s, d, k, size, b, e in zip(outs, strides, dilations, kernel, sizes, begins, ends)
    ]
    value = dtype_min(data.dtype) if kind == "max" else 0.0
    ends_read = [e + x for e, x in zip(ends, extra)]
    padded = pad(data, (0, 0, *begins), (0, 0, *ends_read), value=value, name=f"{name}_pad")
    raxes = [te.reduce_axis(k, f"r{i}") for i, k in enumerate(kernel)]

    def window(nn, cc, *o):
        taps = (oi * s + r.var * d for oi, s, r, d in zip(o, strides, raxes, dilations))
        return padded[(nn, cc, *taps)]

    shape = (n, c, *outs)
    if kind == "max":
        return te.compute(shape, lambda *i: te.max(window(*i), raxes), name, tag="pool_max")
    if kind != "avg":
        raise te.TEError(f"{name}: kind must be 'max' or 'avg', got {kind!r}")
    total = te.compute(shape, lambda *i: te.sum(window(*i), raxes), f"{name}_sum", tag="pool_sum")
    bounds = [(-b, size + e) if count_include_pad else (0, size) for size, b, e in zip(sizes, begins, ends)]
    axes = list(zip(outs, strides, dilations, kernel, begins, bounds))
    if all(uniform_windows(o, s, d, k, b, lo, hi) for o, s, d, k, b, (lo, hi) in axes):
        return te.compute(shape, lambda *i: total[i] / float(math.prod(kernel)), name, tag="elemwise")

    def average(nn, cc, *o):
        count = math.prod(
            taps_inside(oi, s, d, k, b, lo, hi) for oi, (_, s, d, k, b, (lo, hi)) in zip(o, axes)
        )
        return total[(nn, cc, *o)] / count.astype(data.dtype)

    return te.compute(shape, average, name, tag="elemwise")


def max_pool_indices(
    data: Operation,
    pooled: Operation,
    kernel: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
    storage_order: int = 0,
    name: str = "max_pool_indices",
) -> Operation:
    """ONNX MaxPool's Indices, for any number of spatial axes: the int64 index into the flattened `data`
    (N, C, spatial...) of the first tap, in row-major scan order of the window, inside the input whose value
    equals the window's maximum `pooled`; `storage_order` 1 numbers the spatial axes column-major (the
    first fastest), as ONNX does. Two stages: the smallest matching row-major index, then its number."""
    n, c, *sizes = data.shape
    if tuple(pooled.shape[:2]) != (n, c) or len(pooled.shape) != len(data.shape):
        raise te.TEError(f"{name}: pooled {list(pooled.shape)} does not fit data {list(data.shape)}")
    rank = len(sizes)
    kernel, strides, dilations, begins, ends = _window_args(name, rank, kernel, strides, pads, dilations)
    outs = list(pooled.shape[2:])
    reach = [(o - 1) * s + d * (k - 1) + 1 for o, s, d, k in zip(outs, strides, dilations, kernel)]
    extra = [max(0, r - (size + b + e)) for r, size, b, e in zip(reach, sizes, begins, ends)]
    value = dtype_min(data.dtype)
    padded = pad(data, (0, 0, *begins), (0, 0, *(e + x for e, x in zip(ends, extra))), value, f"{name}_pad")
    raxes = [te.reduce_axis(k, f"r{i}") for i, k in enumerate(kernel)]
    plane = math.prod(sizes)
    row_strides = [math.prod(sizes[a + 1 :]) for a in range(rank)]

    def first(nn, cc, *o):
        starts = [oi * s + r.var * d for oi, s, r, d in zip(o, strides, raxes, dilations)]
        taps = [t - b for t, b in zip(starts, begins)]
        inside = [cond for t, size in zip(taps, sizes) for cond in (t >= 0, t < size)]
        hit = logical_and(*inside, eq(padded[(nn, cc, *starts)], pooled[(nn, cc, *o)]))
        flat = sum((t * st for t, st in zip(taps, row_strides)), const(0))
        return te.min(select(hit, flat, const(plane)), raxes)

    found = te.compute(tuple(pooled.shape), first, f"{name}_first", tag="arg_reduce")
    col_strides = [math.prod(sizes[:a]) for a in range(rank)]

    def number(nn, cc, *o):
        r = found[(nn, cc, *o)]
        if storage_order:
            r = sum(
                ((r // rs) % size * cs for rs, size, cs in zip(row_strides, sizes, col_strides)), const(0)
            )
        return (nn * c + cc) * plane + r

    return te.compute(tuple(pooled.shape), number, name, tag="elemwise")


def conv_nd(
    data: Operation,
    weight: Operation,
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
    groups: int = 1,
    name: str = "conv",
) -> Operation:
    """Convolution of N, C, spatial... data with O, C / groups, kernel... weights."""
    n, c, *sizes = data.shape
    oc, icg, *kernel = weight.shape
    kernel, strides, dilations, begins, ends = _window_args(
        name, len(sizes), kernel, strides, pads, dilations
    )
    if groups < 1 or c % groups or oc % groups or icg != c // groups:
        raise te.TEError(
            f"{name}: channels {c}/{oc} do not match groups={groups} and weight {list(weight.shape)}"
        )
    outs = [
        (size + b + e - d * (k - 1) - 1) // s + 1
        for size, k, s, d, b, e in zip(sizes, kernel, strides, dilations, begins, ends)
    ]
    if min(outs) < 1:
        raise te.TEError(f"{name}: kernel {kernel} does not fit input {sizes} with pads {list(pads)}")
    padded = pad(data, (0, 0, *begins), (0, 0, *ends), name=f"{name}_pad")
    rc = te.reduce_axis(icg, "rc")
    raxes = [te.reduce_axis(k, f"r{i}") for i, k in enumerate(kernel)]
    ocg = oc // groups

    def body(nn, ff, *o):
        cin = rc.var if groups == 1 else (ff // ocg) * icg + rc.var
        taps = (oi * s + r.var * d for oi, s, r, d in zip(o, strides, raxes, dilations))
        return te.sum(padded[(nn, cin, *taps)] * weight[(ff, rc.var, *(r.var for r in raxes))], [rc, *raxes])

    return te.compute((n, oc, *outs), body, name, tag=f"conv{len(sizes)}d")


def conv_transpose_nd(
    data: Operation,
    weight: Operation,
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
    groups: int = 1,
    output_padding: Sequence[int] | None = None,
    name: str = "conv_transpose",
) -> Operation:
    """Transposed convolution, weight [C, O / groups, kernel...]: as conv2d_transpose_nchw, a convolution
    with the flipped kernel over the input dilated by the strides and padded by dilation * (k - 1) - pad."""
    n, c, *sizes = data.shape
    ic, ocg, *kernel = weight.shape
    rank = len(sizes)
    kernel, strides, dilations, begins, ends = _window_args(name, rank, kernel, strides, pads, dilations)
    extra = [int(e) for e in (output_padding if output_padding is not None else [0] * rank)]
    if ic != c or groups < 1 or c % groups or len(extra) != rank:
        raise te.TEError(
            f"{name}: weight {list(weight.shape)} does not fit {c} channels, groups={groups}, "
            f"output_padding {extra}"
        )
    before = [d * (k - 1) - b for d, k, b in zip(dilations, kernel, begins)]
    after = [d * (k - 1) - e + x for d, k, e, x in zip(dilations, kernel, ends, extra)]
    spans = [(size - 1) * s + 1 for size, s in zip(sizes, strides)]
    padded_sizes = [span + b + a for span, b, a in zip(spans, before, after)]
    outs = [p - d * (k - 1) for p, d, k in zip(padded_sizes, dilations, kernel)]
    if min(outs) < 1:
        raise te.TEError(f"{name}: pads {list(pads)} leave no output for input {sizes}")

    def dilate_pad(nn, cc, *ii):
        src, conds = [], []
        for i, b, a, span, s in zip(ii, before, after, spans, strides):
            j = i - b if b else i
            conds += ([j >= 0] if b > 0 else []) + ([j < span] if a > 0 else [])
            conds += [eq(j % s, 0)] if s > 1 else []
            src.append(j // s if s > 1 else j)
        read = data[(nn, cc, *src)]
        return select(logical_and(*conds), read, const(0, data.dtype)) if conds else read

    padded = te.compute((n, c, *padded_sizes), dilate_pad, f"{name}_dilate_pad", tag="dilate_pad")
    icg = c // groups
    rc = te.reduce_axis(icg, "rc")
    raxes = [te.reduce_axis(k, f"r{i}") for i, k in enumerate(kernel)]

    def body(nn, ff, *o):
        cin = rc.var if groups == 1 else (ff // ocg) * icg + rc.var
        f = ff if groups == 1 else ff % ocg
        taps = (oi + r.var * d for oi, r, d in zip(o, raxes, dilations))
        flipped = (k - 1 - r.var for k, r in zip(kernel, raxes))
        return te.sum(padded[(nn, cin, *taps)] * weight[(cin, f, *flipped)], [rc, *raxes])

    return te.compute((n, ocg * groups, *outs), body, name, tag=f"conv{rank}d_transpose")


def bias_add(x: Operation, bias: Operation, axis: int = 1, name: str = "bias_add") -> Operation:
    return te.compute(x.shape, lambda *i: x[i] + bias[i[axis]], name, tag="elemwise")


def relu(x: Operation, name: str = "relu") -> Operation:
    return te.compute(x.shape, lambda *i: maximum(x[i], const(0.0, x.dtype)), name, tag="elemwise")


def as_pair(v: int | Sequence[int]) -> tuple[int, int]:
    """An (h, w) pair from one int or two."""
    if isinstance(v, int):
        return v, v
    a, b = v
    return int(a), int(b)


def as_pads(p: int | Sequence[int]) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) padding from one int, an (h, w) pair or all four."""
    if isinstance(p, int):
        return p, p, p, p
    if len(p) == 2:
        return p[0], p[1], p[0], p[1]
    t, l, b, r = p
    return int(t), int(l), int(b), int(r)


def arg_reduce(
    x: Operation,
    kind: str,
    axis: int,
    keepdims: bool = True,
    select_last_index: bool = False,
    name: str = "arg_reduce",
) -> Operation:
    """ONNX ArgMax / ArgMin (`kind` max or min): the int64 index along `axis` of the first (or, with
    `select_last_index`, the last) greatest or smallest element. Two stages: the extreme value, then the
    smallest (largest) index holding it."""
    if kind not in ("max", "min"):
        raise te.TEError(f"arg_reduce: unknown kind {kind!r}")
    if x.dtype == "bool":
        raise te.TEError(f"arg{kind} is not defined on bool tensors")
    if not x.ndim:
        raise te.TEError(f"arg{kind} needs an input of rank 1 or more, got a 0-d tensor")
    axis %= x.ndim
    extent = x.shape[axis]
    kept = tuple(s for d, s in enumerate(x.shape) if d != axis)
    out_shape = tuple(1 if d == axis else s for d, s in enumerate(x.shape)) if keepdims else kept

    def source(i, k):
        rest = i[:axis] + i[axis + 1 :] if keepdims else i
        return (*rest[:axis], k, *rest[axis:])

    k1 = te.reduce_axis(extent, "k")
    combiner = te.max if kind == "max" else te.min
    best = te.compute(
        out_shape, lambda *i: combiner(x[source(i, k1.var)], k1), f"{name}_value", tag="arg_reduce"
    )
    k2 = te.reduce_axis(extent, "k")
    if select_last_index:
        return te.compute(
            out_shape,
            lambda *i: te.max(select(eq(x[source(i, k2.var)], best[i]), k2.var, const(-1)), k2),
            name,
            tag="arg_reduce",
        )
    return te.compute(
        out_shape,
        lambda *i: te.min(select(eq(x[source(i, k2.var)], best[i]), k2.var, const(extent)), k2),
        name,
        tag="arg_reduce",
    )


def rms_norm(x: Operation, scale: Operation | None, axis: int = -1, epsilon: float = 1e-5) -> Operation:
    """ONNX RMSNormalization: x / sqrt(mean(x * x) + epsilon) over axes [axis, ndim), times `scale`
    (broadcast against those trailing axes) when given. Two stages: the sum of squares, the output."""
    axis %= x.ndim
    axes = range(axis, x.ndim)
    red_shape = x.shape[:axis]
    count = float(math.prod(x.shape[a] for a in axes))
    ks = [te.reduce_axis(x.shape[a], f"k{a}") for a in axes]

    def sq(*i):
        v = x[(*i, *(k.var for k in ks))]
        return te.sum(v * v, ks)

    sqsum = te.compute(red_shape, sq, "rms_norm_sqsum", tag="norm_reduce")

    def body(*i):
        y = x[i] / sqrt(sqsum[i[:axis]] / count + epsilon)
        return y * broadcast_read(scale, i[axis:]) if scale is not None else y

    return te.compute(x.shape, body, "rms_norm", tag="norm")


SCAN_COMBINERS = {"sum": (te.sum, 0), "prod": (te.prod, 1)}
"""A cumulative op's combiner -> (its reduction, its identity)."""


def cumulative(
    x: Operation, axis: int, combiner: str = "sum", exclusive: bool = False, reverse: bool = False
) -> Operation:
    """ONNX CumSum (`combiner` "sum") and CumProd ("prod") along `axis`: out[.., i, ..] combines
    x[.., k, ..] over k <= i (k < i when `exclusive`; k >= i, k > i when `reverse`), one reduction over
    the whole axis with the other terms the combiner's identity."""
    reduce, identity = SCAN_COMBINERS[combiner]
    name = f"cum{combiner}"
    if x.dtype == "bool":
        raise te.TEError(f"{name} is not defined on bool tensors")
    if not x.ndim:
        raise te.TEError(f"{name} needs an input of rank 1 or more, got a 0-d tensor")
    axis %= x.ndim
    k = te.reduce_axis(x.shape[axis], "k")
    neutral = const(identity, x.dtype)

    def body(*i):
        at, here = k.var, i[axis]
        if reverse:
            keep = at > here if exclusive else at >= here
        else:
            keep = at < here if exclusive else at <= here
        return reduce(select(keep, x[(*i[:axis], at, *i[axis + 1 :])], neutral), k)

    return te.compute(x.shape, body, name, tag=name)
