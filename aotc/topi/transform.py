"""Injective computes: each output element is one input element picked by an index expression."""

from __future__ import annotations

import math
from collections.abc import Sequence

from aotc import te
from aotc.ir.expr import (
    INDEX,
    Expr,
    cast,
    ceil,
    const,
    floor,
    maximum,
    minimum,
    select,
)
from aotc.te.tensor import Operation
from aotc.topi.elemwise import broadcast_read, broadcast_shape


def reshape(x: Operation, shape: Sequence[int], name: str = "reshape") -> Operation:
    shape = tuple(int(s) for s in shape)
    if math.prod(shape) != math.prod(x.shape):
        raise te.TEError(f"reshape: cannot reshape {list(x.shape)} to {list(shape)}")
    return te.compute(shape, lambda *i: x[reshape_index(x.shape, shape, i)], name, tag="reshape")


def reshape_index(src: Sequence[int], dst: Sequence[int], idx: Sequence[Expr]) -> tuple[Expr, ...]:
    """Indices into `src` of the point `idx` of its reshape to `dst`.

    Extents are matched in groups of equal product, so dims that are only split, merged, added or
    removed (size 1) keep plain index expressions.
    """
    src_dims = [d for d, s in enumerate(src) if s != 1]
    dst_dims = [d for d, s in enumerate(dst) if s != 1]
    out: list[Expr] = [const(0)] * len(src)
    i = j = 0
    while i < len(src_dims):
        gs, gd = [src_dims[i]], [dst_dims[j]]
        ps, pd = src[gs[0]], dst[gd[0]]
        i, j = i + 1, j + 1
        while ps != pd:
            if ps < pd:
                gs.append(src_dims[i])
                ps *= src[src_dims[i]]
                i += 1
            else:
                gd.append(dst_dims[j])
                pd *= dst[dst_dims[j]]
                j += 1
        flat = idx[gd[0]]
        for d in gd[1:]:
            flat = flat * dst[d] + idx[d]
        stride = ps
        for k, d in enumerate(gs):
            stride //= src[d]
            v = flat // stride if stride > 1 else flat
            out[d] = v % src[d] if k > 0 else v
    return tuple(out)


def transpose(x: Operation, perm: Sequence[int], name: str = "transpose") -> Operation:
    perm = [int(p) % x.ndim for p in perm]
    if sorted(perm) != list(range(x.ndim)):
        raise te.TEError(f"transpose: {perm} is not a permutation of {x.ndim} axes")
    inverse = [perm.index(d) for d in range(x.ndim)]
    shape = tuple(x.shape[p] for p in perm)
    return te.compute(shape, lambda *i: x[tuple(i[inverse[d]] for d in range(x.ndim))], name, tag="transpose")


def concat(inputs: Sequence[Operation], axis: int, name: str = "concat") -> Operation:
    ndim = inputs[0].ndim
    axis %= ndim
    for t in inputs[1:]:
        if t.ndim != ndim or any(
            a != b for d, (a, b) in enumerate(zip(t.shape, inputs[0].shape)) if d != axis
        ):
            raise te.TEError(f"concat: shapes {[list(t.shape) for t in inputs]} differ off axis {axis}")
    offsets = [0]
    for t in inputs:
        offsets.append(offsets[-1] + t.shape[axis])
    shape = list(inputs[0].shape)
    shape[axis] = offsets[-1]

    def read(k: int, i: tuple[Expr, ...]) -> Expr:
        at = list(i)
        if offsets[k]:
            at[axis] = i[axis] - offsets[k]
        return inputs[k][tuple(at)]

    def body(*i):
        out = read(len(inputs) - 1, i)
        for k in range(len(inputs) - 2, -1, -1):
            out = select(i[axis] < offsets[k + 1], read(k, i), out)
        return out

    return te.compute(shape, body, name, tag="concat")


def strided_slice(
    x: Operation,
    begin: Sequence[int],
    end: Sequence[int],
    strides: Sequence[int],
    name: str = "strided_slice",
) -> Operation:
    """Axis d picks the indices range(begin[d], end[d], strides[d]) (already resolved: no negatives
    counting from the end, no clamping; end may be -1 for a negative stride)."""
    ranges = [range(int(b), int(e), int(s)) for b, e, s in zip(begin, end, strides)]
    shape = tuple(len(r) for r in ranges)
    if len(ranges) != x.ndim or any(
        not r or r[0] >= n or r[-1] >= n or min(r) < 0 for r, n in zip(ranges, x.shape)
    ):
        raise te.TEError(
            f"strided_slice: begin {list(begin)}, end {list(end)}, strides {list(strides)} "
            f"select an empty or out-of-range slice of {list(x.shape)}"
        )

    def at(i: Expr, r: range) -> Expr:
        step = i * r.step if r.step != 1 else i
        return step + r.start if r.start else step

    return te.compute(
        shape, lambda *i: x[tuple(at(v, r) for v, r in zip(i, ranges))], name, tag="strided_slice"
    )


def take(data: Operation, indices: Operation, axis: int = 0, name: str = "take") -> Operation:
    """numpy.take along `axis`; negative indices count from the end, out-of-range ones are clamped."""
    axis %= data.ndim
    q = indices.ndim
    extent = data.shape[axis]
    shape = data.shape[:axis] + indices.shape + data.shape[axis + 1 :]

    def body(*i):
        k = cast(INDEX, indices[i[axis : axis + q]])
        k = select(k < 0, k + extent, k)
        k = minimum(maximum(k, const(0)), const(extent - 1))
        return data[i[:axis] + (k,) + i[axis + q :]]

    return te.compute(shape, body, name, tag="take")


def broadcast_to(x: Operation, shape: Sequence[int], name: str = "broadcast_to") -> Operation:
    out = broadcast_shape(x.shape, shape)
    return te.compute(out, lambda *i: broadcast_read(x, i), name, tag="broadcast")


def source_coordinate(i: Expr, in_size: int, out_size: int, scale: float, mode: str) -> Expr:
    """Float32 coordinate in the input of output index `i` (ONNX Resize coordinate_transformation_mode)."""
    x = cast("float32", i)
    if mode == "asymmetric":
        return x / scale
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if out_size > 1 else const(0.0, "float32")
    if mode == "half_pixel_symmetric":
        offset = in_size / 2.0 * (1.0 - out_size / (in_size * scale))
        return (x + 0.5) / scale - 0.5 + offset
    if mode == "align_corners":
        return x * float(in_size - 1) / float(out_size - 1) if out_size > 1 else const(0.0, "float32")
    raise te.TEError(f"resize: unsupported coordinate_transformation_mode {mode!r}")


def _nearest(c: Expr, rounding: str, in_size: int) -> Expr:
    rounded = {
        "round_prefer_floor": lambda: ceil(c - 0.5),
        "round_prefer_ceil": lambda: floor(c + 0.5),
        "floor": lambda: floor(c),
        "ceil": lambda: ceil(c),
    }
    if rounding not in rounded:
        raise te.TEError(f"resize: unsupported nearest_mode {rounding!r}")
    k = cast(INDEX, rounded[rounding]())
    return minimum(maximum(k, const(0)), const(in_size - 1))


def _linear_taps(c: Expr, in_size: int) -> list[tuple[Expr, Expr]]:
    """The two (index, weight) taps of linear interpolation at coordinate `c` (clamped to the input)."""
    c = minimum(maximum(c, const(0.0, "float32")), const(float(in_size - 1), "float32"))
    i0 = cast(INDEX, floor(c))
    frac = c - cast("float32", i0)
    i1 = minimum(i0 + 1, const(in_size - 1))
    return [(i0, 1.0 - frac), (i1, frac)]


def resize(
    x: Operation,
    size: Sequence[int],
    scales: Sequence[float],
    mode: str = "nearest",
    coordinate_transformation_mode: str = "half_pixel",
    nearest_mode: str = "round_prefer_floor",
    name: str = "resize",
) -> Operation:
    """ONNX Resize, nearest or (multi-)linear over every axis whose extent changes or whose scale is not 1."""
    size = tuple(int(s) for s in size)
    axes = [d for d in range(x.ndim) if size[d] != x.shape[d] or scales[d] != 1.0]
    if mode not in ("nearest", "linear"):
        raise te.TEError(f"resize: unsupported mode {mode!r}")
    if mode == "linear" and not x.dtype.startswith("float"):
        raise te.TEError(f"resize: linear mode needs a float tensor, got {x.dtype}")

    def coord(d: int, i: Expr) -> Expr:
        return source_coordinate(i, x.shape[d], size[d], scales[d], coordinate_transformation_mode)

    def body(*i):
        if mode == "nearest":
            at = list(i)
            for d in axes:
                at[d] = _nearest(coord(d, i[d]), nearest_mode, x.shape[d])
            return x[tuple(at)]
        taps = {d: _linear_taps(coord(d, i[d]), x.shape[d]) for d in axes}
        out = None
        for corner in range(2 ** len(axes)):
            at, weight = list(i), None
            for bit, d in enumerate(axes):
                index, w = taps[d][(corner >> bit) & 1]
                at[d] = index
                weight = w if weight is None else weight * w
            term = x[tuple(at)] if weight is None else cast(x.dtype, weight) * x[tuple(at)]
            out = term if out is None else out + term
        return out

    return te.compute(size, body, name, tag=f"resize_{mode}")


def gather_elements(
    data: Operation, indices: Operation, axis: int = 0, name: str = "gather_elements"
) -> Operation:
    """ONNX GatherElements: out[i] = data[i with axis `axis` replaced by indices[i]], of indices' shape
    (every other axis no longer than data's); negative indices count from the end, out-of-range ones are
    clamped."""
    axis %= data.ndim
    if indices.ndim != data.ndim or any(
        n > m for d, (n, m) in enumerate(zip(indices.shape, data.shape)) if d != axis
    ):
        raise te.TEError(
            f"gather_elements: indices of shape {list(indices.shape)} do not fit data of shape "
            f"{list(data.shape)} off axis {axis}"
        )
    if indices.dtype not in ("int32", "int64"):
        raise te.TEError(f"gather_elements: indices must be int32 or int64, got {indices.dtype}")
    extent = data.shape[axis]

    def body(*i):
        k = cast(INDEX, indices[i])
        k = select(k < 0, k + extent, k)
        k = minimum(maximum(k, const(0)), const(extent - 1))
        return data[i[:axis] + (k,) + i[axis + 1 :]]

    return te.compute(indices.shape, body, name, tag="gather_elements")


def trilu(x: Operation, k: int = 0, upper: bool = True, name: str = "trilu") -> Operation:
    """ONNX Trilu over the last two axes: the elements on and above (upper) or on and below (lower) the
    k-th diagonal are kept, the others are 0 (False for bool)."""
    if x.ndim < 2:
        raise te.TEError(f"trilu: needs a tensor of rank 2 or more, got {list(x.shape)}")
    zero = const(0, x.dtype)

    def body(*i):
        offset = i[-1] - i[-2]
        keep = offset >= const(k) if upper else offset <= const(k)
        return select(keep, x[i], zero)

    return te.compute(x.shape, body, name, tag="trilu")
