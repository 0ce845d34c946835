"""Compute definitions of neural-network operators in tensor expressions (one function per operator)."""

from __future__ import annotations

from collections.abc import Sequence

from aotc import te
from aotc.ir.expr import const, exp, logical_and, maximum, minimum, select
from aotc.te.tensor import Operation


def matmul(a: Operation, b: Operation, name: str = "matmul") -> Operation:
    """C[i, j] = sum_k A[i, k] * B[k, j]."""
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2:
        raise te.TEError(f"matmul: inner dimensions differ ({k} vs {k2})")
    rk = te.reduce_axis(k, "k")
    return te.compute((m, n), lambda i, j: te.sum(a[i, rk.var] * b[rk.var, j], rk), name, tag="matmul")


def dense(data: Operation, weight: Operation, name: str = "dense") -> Operation:
    """Y[i, j] = sum_k X[i, k] * W[j, k] (weight in [out, in] layout)."""
    (m, k), (n, k2) = data.shape, weight.shape
    if k != k2:
        raise te.TEError(f"dense: inner dimensions differ ({k} vs {k2})")
    rk = te.reduce_axis(k, "k")
    return te.compute((m, n), lambda i, j: te.sum(data[i, rk.var] * weight[j, rk.var], rk), name, tag="dense")


def pad(
    data: Operation, before: Sequence[int], after: Sequence[int], value: float = 0.0, name: str = "pad"
) -> Operation:
    if not any(before) and not any(after):
        return data
    shape = tuple(s + b + a for s, b, a in zip(data.shape, before, after))

    def body(*idx):
        conds = []
        src = []
        for i, b, s in zip(idx, before, data.shape):
            if b:
                conds.append(i >= b)
            if b or s + b < shape[len(src)]:
                conds.append(i < s + b)
            src.append(i - b if b else i)
        if not conds:
            return data[tuple(src)]
        return select(logical_and(*conds), data[tuple(src)], const(value, data.dtype))

    return te.compute(shape, body, name, tag="pad")


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
    sh, sw = _pair(stride)
    dh, dw = _pair(dilation)
    pt, pl, pb, pr = _pads(padding)
    if c % groups or oc % groups or icg != c // groups:
        raise te.TEError(
            f"conv2d: channels {c}/{oc} do not match groups={groups} and weight {list(weight.shape)}"
        )
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
    padded = pad(data, (0, 0, pt, pl), (0, 0, pb, pr), name=f"{name}_pad")
    rc = te.reduce_axis(icg, "rc")
    ry = te.reduce_axis(kh, "ry")
    rx = te.reduce_axis(kw, "rx")
    ocg = oc // groups

    def body(nn, ff, yy, xx):
        cin = rc.var if groups == 1 else (ff // ocg) * icg + rc.var
        return te.sum(
            padded[nn, cin, yy * sh + ry.var * dh, xx * sw + rx.var * dw]
            * weight[ff, rc.var, ry.var, rx.var],
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
    sh, sw = _pair(stride)
    dh, dw = _pair(dilation)
    pt, pl, pb, pr = _pads(padding)
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
    padded = pad(data, (0, 0, pt, pl), (0, 0, pb, pr), name=f"{name}_pad")
    ry = te.reduce_axis(kh, "ry")
    rx = te.reduce_axis(kw, "rx")

    def body(nn, ff, yy, xx):
        src_c = ff // mult if mult > 1 else ff
        return te.sum(
            padded[nn, src_c, yy * sh + ry.var * dh, xx * sw + rx.var * dw] * weight[ff, 0, ry.var, rx.var],
            [ry, rx],
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
) -> Operation:
    """Max or average pooling over H and W."""
    n, c, h, w = data.shape
    kh, kw = _pair(kernel)
    sh, sw = _pair(stride)
    pt, pl, pb, pr = _pads(padding)
    oh = (h + pt + pb - kh) // sh + 1
    ow = (w + pl + pr - kw) // sw + 1
    ry = te.reduce_axis(kh, "ry")
    rx = te.reduce_axis(kw, "rx")
    if kind == "max":
        padded = pad(data, (0, 0, pt, pl), (0, 0, pb, pr), value=float("-inf"), name=f"{name}_pad")
        return te.compute(
            (n, c, oh, ow),
            lambda nn, cc, yy, xx: te.max(padded[nn, cc, yy * sh + ry.var, xx * sw + rx.var], [ry, rx]),
            name,
            tag="pool_max",
        )
    if kind != "avg":
        raise te.TEError(f"pool2d: kind must be 'max' or 'avg', got {kind!r}")
    padded = pad(data, (0, 0, pt, pl), (0, 0, pb, pr), name=f"{name}_pad")
    total = te.compute(
        (n, c, oh, ow),
        lambda nn, cc, yy, xx: te.sum(padded[nn, cc, yy * sh + ry.var, xx * sw + rx.var], [ry, rx]),
        f"{name}_sum",
        tag="pool_sum",
    )
    if count_include_pad or not (pt or pl or pb or pr):
        return te.compute((n, c, oh, ow), lambda *i: total[i] / float(kh * kw), name, tag="elemwise")

    def count(yy, xx):
        y0 = maximum(yy * sh - pt, 0)
        y1 = minimum(yy * sh - pt + kh, h)
        x0 = maximum(xx * sw - pl, 0)
        x1 = minimum(xx * sw - pl + kw, w)
        return ((y1 - y0) * (x1 - x0)).astype(data.dtype)

    return te.compute(
        (n, c, oh, ow), lambda nn, cc, yy, xx: total[nn, cc, yy, xx] / count(yy, xx), name, tag="elemwise"
    )


def softmax(x: Operation, axis: int = -1, name: str = "softmax") -> Operation:
    """Numerically stable softmax along `axis` (four stages: max, exp, sum, normalize)."""
    nd = len(x.shape)
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


def reduce(
    x: Operation, kind: str, axes: Sequence[int], keepdims: bool = False, name: str = "reduce"
) -> Operation:
    """Sum / max / min / mean of `x` over `axes`."""
    nd = len(x.shape)
    axes = sorted(a % nd for a in axes)
    raxes = {a: te.reduce_axis(x.shape[a], f"k{a}") for a in axes}
    out_shape = (
        tuple(1 if d in raxes else s for d, s in enumerate(x.shape))
        if keepdims
        else tuple(s for d, s in enumerate(x.shape) if d not in raxes)
    )
    out_shape = out_shape or (1,)
    combiner = {"sum": te.sum, "mean": te.sum, "max": te.max, "min": te.min}.get(kind)
    if combiner is None:
        raise te.TEError(f"reduce: unknown kind {kind!r}")

    def body(*i):
        it = iter(i)
        idx = []
        for d in range(nd):
            if d in raxes:
                idx.append(raxes[d].var)
                if keepdims:
                    next(it)
            else:
                idx.append(next(it))
        return combiner(x[tuple(idx)], [raxes[a] for a in axes])

    red = te.compute(out_shape, body, name if kind != "mean" else f"{name}_sum", tag=f"reduce_{kind}")
    if kind != "mean":
        return red
    count = 1
    for a in axes:
        count *= x.shape[a]
    return te.compute(out_shape, lambda *i: red[i] / float(count), name, tag="elemwise")


def bias_add(x: Operation, bias: Operation, axis: int = 1, name: str = "bias_add") -> Operation:
    return te.compute(x.shape, lambda *i: x[i] + bias[i[axis]], name, tag="elemwise")


def relu(x: Operation, name: str = "relu") -> Operation:
    return te.compute(x.shape, lambda *i: maximum(x[i], const(0.0, x.dtype)), name, tag="elemwise")


def _pair(v: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(v, int):
        return v, v
    a, b = v
    return int(a), int(b)


def _pads(p: int | Sequence[int]) -> tuple[int, int, int, int]:
    if isinstance(p, int):
        return p, p, p, p
    if len(p) == 2:
        return p[0], p[1], p[0], p[1]
    t, l, b, r = p
    return int(t), int(l), int(b), int(r)
