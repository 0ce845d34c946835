"""Indexing and data movement: TopK, the scatters, GatherND, ReverseSequence, Einsum, Col2Im, MaxUnpool.

Every read index is clamped into its tensor (a select evaluates both branches), so an index that the
operator leaves undefined reads some element rather than outside the buffer; what the operators define is
computed exactly (integer results and the elements picked are exact).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from aotc import te
from aotc.ir.expr import (
    INDEX,
    Expr,
    cast,
    const,
    eq,
    is_float,
    logical_and,
    logical_not,
    logical_or,
    maximum,
    minimum,
    ne,
    reduce_identity,
    select,
)
from aotc.te.tensor import Operation
from aotc.topi.registry import OpPattern, register

SCATTER_REDUCTIONS = ("none", "add", "mul", "max", "min")
MUL_CHAIN_LIMIT = 64
"""The most updates that may reach one output element of a scatter with reduction mul: there is no product
reduction, so the products are a chain of that many selects, in the updates' order."""


def _clamp(i: Expr, extent: int) -> Expr:
    return minimum(maximum(i, const(0)), const(extent - 1))


def _wrap_index(t: Expr, extent: int) -> Expr:
    """An index read from a tensor as INDEX, negative ones counted from the end."""
    t = cast(INDEX, t)
    return select(t < 0, t + extent, t)


def _precedes(a: Expr, b: Expr, largest: bool) -> Expr:
    """Whether value `a` comes strictly before `b` in TopK's order; NaN is greater than every number (a
    total order, so the ranks below are a permutation)."""
    if not is_float(a.dtype):
        return a > b if largest else a < b
    a_nan, b_nan = ne(a, a), ne(b, b)
    if largest:
        return logical_or(logical_and(a_nan, logical_not(b_nan)), a > b)
    return logical_or(logical_and(b_nan, logical_not(a_nan)), a < b)


def _same(a: Expr, b: Expr) -> Expr:
    return logical_or(eq(a, b), logical_and(ne(a, a), ne(b, b))) if is_float(a.dtype) else eq(a, b)


def topk_indices(x: Operation, k: int, axis: int, largest: bool = True, name: str = "topk") -> Operation:
    """The int64 indices along `axis` of the k largest (smallest) elements, in order, ties to the lower
    index (ONNX TopK). Two stages: each element's rank (the elements before it in that order), then the
    index holding each rank below k."""
    axis %= x.ndim
    extent = x.shape[axis]
    if not 1 <= k <= extent:
        raise te.TEError(f"topk: k={k} must be in [1, {extent}] (axis {axis} of {list(x.shape)})")
    if x.dtype == "bool":
        raise te.TEError("topk is not defined on bool tensors")

    def at(i: Sequence[Expr], j: Expr) -> tuple[Expr, ...]:
        return (*i[:axis], j, *i[axis + 1 :])

    r = te.reduce_axis(extent, "r")

    def rank(*i):
        other, mine = x[at(i, r.var)], x[i]
        before = logical_or(_precedes(other, mine, largest), logical_and(_same(other, mine), r.var < i[axis]))
        return te.sum(select(before, const(1), const(0)), r)

    ranks = te.compute(x.shape, rank, f"{name}_rank", tag="topk")
    m = te.reduce_axis(extent, "m")
    shape = tuple(k if d == axis else s for d, s in enumerate(x.shape))
    # exactly one element has each rank: the sum picks its index
    return te.compute(
        shape,
        lambda *i: te.sum(select(eq(ranks[at(i, m.var)], i[axis]), m.var, const(0)), m),
        name,
        tag="topk",
    )


def _combine(reduction: str, old: Expr, new: Expr) -> Expr:
    if reduction == "add":
        return old + new
    if reduction == "mul":
        return old * new
    if reduction == "max":
        return maximum(old, new)
    if reduction == "min":
        return minimum(old, new)
    return new


def _scatter(
    data: Operation,
    reduction: str,
    extents: Sequence[int],
    match,
    update,
    name: str,
) -> Operation:
    """out[i] = data[i] combined, in order, with update(i, u) for every update position u (a point of
    `extents`, the axes updates are gathered over) where match(i, u) holds. Without duplicates `none`
    writes the update; duplicates take the last (as ONNX's reference does); mul is an unrolled chain."""
    if reduction not in SCATTER_REDUCTIONS:
        raise te.TEError(f"{name}: unknown reduction {reduction!r}")
    if reduction != "none" and data.dtype == "bool":
        raise te.TEError(f"{name}: reduction {reduction} is not defined on bool tensors")
    count = math.prod(extents)
    if reduction == "mul":
        if count > MUL_CHAIN_LIMIT:
            raise te.TEError(
                f"{name}: reduction mul over {count} updates per element (at most {MUL_CHAIN_LIMIT})"
            )

        def chain(*i):
            out = data[i]
            for u in itertools.product(*(range(e) for e in extents)):
                at = tuple(const(v) for v in u)
                out = select(match(i, at), out * update(i, at), out)
            return out

        return te.compute(data.shape, chain, name, tag="scatter")
    axes = [te.reduce_axis(e, f"u{d}") for d, e in enumerate(extents)]
    u = tuple(a.var for a in axes)
    if reduction == "none":
        flat = u[0]
        for d in range(1, len(u)):
            flat = flat * extents[d] + u[d]
        last = te.compute(
            data.shape,
            lambda *i: te.max(select(match(i, u), flat, const(-1)), axes),
            f"{name}_last",
            tag="scatter",
        )

        def write(*i):
            pos, at, rest = maximum(last[i], const(0)), [], 1
            for e in reversed(extents):
                at.insert(0, (pos // rest) % e if rest > 1 else pos % e)
                rest *= e
            return select(last[i] >= 0, update(i, tuple(at)), data[i])

        return te.compute(data.shape, write, name, tag="scatter")
    combiner = {"add": te.sum, "max": te.max, "min": te.min}[reduction]
    identity = reduce_identity({"add": "sum"}.get(reduction, reduction), data.dtype)
    total = te.compute(
        data.shape,
        lambda *i: combiner(select(match(i, u), update(i, u), identity), axes),
        f"{name}_{reduction}",
        tag="scatter",
    )
    return te.compute(data.shape, lambda *i: _combine(reduction, data[i], total[i]), name, tag="scatter")


def scatter_elements(
    data: Operation, indices: Operation, updates: Operation, axis: int, reduction: str = "none"
) -> Operation:
    """ONNX ScatterElements: updates[j] goes to data[j with axis `axis` replaced by indices[j]]."""
    axis %= data.ndim
    if indices.shape != updates.shape or indices.ndim != data.ndim:
        raise te.TEError(
            f"scatter_elements: indices {list(indices.shape)} and updates {list(updates.shape)} must have one "
            f"shape, of the rank of data {list(data.shape)}"
        )
    if any(s > data.shape[d] for d, s in enumerate(updates.shape) if d != axis):
        raise te.TEError(
            f"scatter_elements: updates {list(updates.shape)} exceed data {list(data.shape)} off axis {axis}"
        )
    extent = data.shape[axis]

    def source(i, u):
        return tuple(u[0] if d == axis else _clamp(v, updates.shape[d]) for d, v in enumerate(i))

    def match(i, u):
        conds = [
            i[d] < updates.shape[d]
            for d in range(data.ndim)
            if d != axis and updates.shape[d] < data.shape[d]
        ]
        return logical_and(eq(_wrap_index(indices[source(i, u)], extent), i[axis]), *conds)

    def update(i, u):
        return updates[source(i, u)]

    return _scatter(data, reduction, [updates.shape[axis]], match, update, "scatter_elements")


def scatter_nd(data: Operation, indices: Operation, updates: Operation, reduction: str = "none") -> Operation:
    """ONNX ScatterND: indices [*B, q] name elements (q = rank) or slices of data; updates [*B, *data[q:]]."""
    q = indices.shape[-1] if indices.ndim else 0
    batch = indices.shape[:-1]
    if indices.ndim < 2 or not 1 <= q <= data.ndim or updates.shape != batch + data.shape[q:]:
        raise te.TEError(
            f"scatter_nd: indices {list(indices.shape)} (rank >= 2, last extent in [1, {data.ndim}]) and "
            f"updates {list(updates.shape)} do not fit data {list(data.shape)}"
        )

    def match(i, u):
        return logical_and(*(eq(_wrap_index(indices[(*u, const(d))], data.shape[d]), i[d]) for d in range(q)))

    def update(i, u):
        return updates[(*u, *i[q:])]

    return _scatter(data, reduction, batch, match, update, "scatter_nd")


def gather_nd(data: Operation, indices: Operation, batch_dims: int = 0) -> Operation:
    """ONNX GatherND: out[b, m, r] = data[b, indices[b, m, :], r] (b: the first `batch_dims` axes)."""
    b = batch_dims
    q = indices.shape[-1] if indices.ndim else 0
    if (
        indices.ndim < 1
        or not 1 <= q <= data.ndim - b
        or indices.ndim <= b
        or indices.shape[:b] != data.shape[:b]
    ):
        raise te.TEError(
            f"gather_nd: indices {list(indices.shape)} do not index data {list(data.shape)} "
            f"(batch_dims {batch_dims})"
        )
    shape = indices.shape[:-1] + data.shape[b + q :]
    mid = indices.ndim - 1

    def body(*i):
        at = [*i[:b]]
        for d in range(q):
            extent = data.shape[b + d]
            at.append(_clamp(_wrap_index(indices[(*i[:mid], const(d))], extent), extent))
        return data[(*at, *i[mid:])]

    if not shape:
        raise te.TEError("gather_nd: a 0-d result")
    return te.compute(shape, body, "gather_nd", tag="gather_nd")


def reverse_sequence(x: Operation, lens: Operation, batch_axis: int, time_axis: int) -> Operation:
    """ONNX ReverseSequence: the first lens[b] elements along `time_axis` of batch b reversed."""
    steps, batch = x.shape[time_axis], x.shape[batch_axis]
    if lens.shape != (batch,):
        raise te.TEError(f"reverse_sequence: sequence_lens {list(lens.shape)} must be [{batch}]")

    def body(*i):
        n = minimum(maximum(cast(INDEX, lens[(i[batch_axis],)]), const(0)), const(steps))
        t = i[time_axis]
        at = list(i)
        at[time_axis] = _clamp(select(t < n, n - 1 - t, t), steps)
        return x[tuple(at)]

    return te.compute(x.shape, body, "reverse_sequence", tag="reverse_sequence")


def einsum(
    operands: Sequence[Operation], terms: Sequence[str], output: str, name: str = "einsum"
) -> Operation:
    """The sum over the letters not in `output` of the product of the operands (term i subscripts operand
    i, one letter per axis; a letter repeated reads a diagonal; no letters: a 0-d result). With no letter
    summed, the one reduce axis has extent 1."""
    extents: dict[str, int] = {}
    for t, term in zip(operands, terms):
        if len(term) != t.ndim:
            raise te.TEError(f"einsum: subscripts {term!r} for an operand of shape {list(t.shape)}")
        for c, s in zip(term, t.shape):
            if extents.setdefault(c, s) != s:
                raise te.TEError(f"einsum: letter {c!r} has extents {extents[c]} and {s}")
    if any(c not in extents for c in output) or len(set(output)) != len(output):
        raise te.TEError(f"einsum: output subscripts {output!r} must be distinct letters of the inputs")
    summed = [c for c in extents if c not in output]
    axes = [te.reduce_axis(extents[c], f"k_{c}") for c in summed] or [te.reduce_axis(1, "k")]
    dtype = operands[0].dtype
    if any(t.dtype != dtype for t in operands):
        raise te.TEError(f"einsum: operands of types {[t.dtype for t in operands]}")

    def body(*i):
        letter = dict(zip(output, i)) | {c: a.var for c, a in zip(summed, axes)}
        term = None
        for t, sub in zip(operands, terms):
            read = t[tuple(letter[c] for c in sub)]
            term = read if term is None else term * read
        return te.sum(term, axes)

    return te.compute(tuple(extents[c] for c in output), body, name, tag="einsum")


def col2im(
    x: Operation,
    image: Sequence[int],
    block: Sequence[int],
    dilations: Sequence[int],
    pads: Sequence[int],
    strides: Sequence[int],
) -> Operation:
    """ONNX Col2Im: x [N, C * prod(block), L] of sliding blocks summed into images [N, C, *image]."""
    rank = len(image)
    size = math.prod(block)
    counts = [
        (image[d] + pads[d] + pads[d + rank] - dilations[d] * (block[d] - 1) - 1) // strides[d] + 1
        for d in range(rank)
    ]
    if x.ndim != 3 or x.shape[1] % size or math.prod(counts) != x.shape[2] or min(counts) < 1:
        raise te.TEError(
            f"col2im: input {list(x.shape)} is not [N, C * {size}, {math.prod(counts)}] for image "
            f"{list(image)}, block {list(block)}"
        )
    channels = x.shape[1] // size
    axes = [te.reduce_axis(b, f"k{d}") for d, b in enumerate(block)]

    def body(n, c, *y):
        conds, channel, column = [], c * size, const(0)
        for d in range(rank):
            k = axes[d].var
            p = y[d] + pads[d] - k * dilations[d]
            conds.append(p >= 0)
            if strides[d] > 1:
                conds.append(eq(p % strides[d], 0))
                p = p // strides[d]
            conds.append(p < counts[d])
            column = column * counts[d] + _clamp(p, counts[d])
            channel = channel + k * math.prod(block[d + 1 :])
        zero = const(0, x.dtype)
        return te.sum(select(logical_and(*conds), x[n, channel, column], zero), axes)

    return te.compute((x.shape[0], channels, *image), body, "col2im", tag="col2im")


def max_unpool(x: Operation, indices: Operation, shape: Sequence[int]) -> Operation:
    """ONNX MaxUnpool: out (of `shape`, [N, C, *spatial]) is 0 but where indices (MaxPool's, flat over the
    whole output) put the element of x; each index is looked for in its own (n, c) plane, where MaxPool's
    are (the last one wins)."""
    if indices.shape != x.shape or len(shape) != x.ndim or tuple(shape[:2]) != x.shape[:2]:
        raise te.TEError(
            f"max_unpool: x {list(x.shape)}, indices {list(indices.shape)}, output {list(shape)}"
        )
    spatial_in, spatial_out = x.shape[2:], tuple(shape[2:])
    plane = math.prod(spatial_out)
    axes = [te.reduce_axis(s, f"p{d}") for d, s in enumerate(spatial_in)]
    p = tuple(a.var for a in axes)

    def flat(values: Sequence[Expr], extents: Sequence[int]) -> Expr:
        out = values[0]
        for v, e in zip(values[1:], extents[1:]):
            out = out * e + v
        return out

    def last_of(n, c, *o):
        target = (n * shape[1] + c) * plane + flat(o, spatial_out)
        hit = eq(cast(INDEX, indices[(n, c, *p)]), target)
        return te.max(select(hit, flat(p, spatial_in), const(-1)), axes)

    last = te.compute(tuple(shape), last_of, "max_unpool_last", tag="max_unpool")

    def body(n, c, *o):
        pos, at, rest = maximum(last[(n, c, *o)], const(0)), [], 1
        for e in reversed(spatial_in):
            at.insert(0, (pos // rest) % e if rest > 1 else pos % e)
            rest *= e
        return select(last[(n, c, *o)] >= 0, x[(n, c, *at)], const(0, x.dtype))

    return te.compute(tuple(shape), body, "max_unpool", tag="max_unpool")


def tensor_scatter(
    cache: Operation, update: Operation, writes: Operation | None, axis: int, circular: bool
) -> Operation:
    """ONNX TensorScatter: `update` written into `cache` along `axis` from position writes[b] of each batch
    b (0 without `writes`), wrapping around the axis when `circular`; the other positions keep `cache`."""
    axis %= cache.ndim
    length, steps = cache.shape[axis], update.shape[axis]
    if (
        axis == 0
        or update.ndim != cache.ndim
        or steps > length
        or any(a != b for d, (a, b) in enumerate(zip(update.shape, cache.shape)) if d != axis)
    ):
        raise te.TEError(
            f"tensor_scatter: update {list(update.shape)} does not fit cache {list(cache.shape)} on axis {axis}"
        )
    if writes is not None and writes.shape != (cache.shape[0],):
        raise te.TEError(f"tensor_scatter: write_indices {list(writes.shape)} must be [{cache.shape[0]}]")

    def body(*i):
        start = cast(INDEX, writes[(i[0],)]) if writes is not None else const(0)
        t = i[axis] - start
        if circular:
            t = t % length
        at = list(i)
        at[axis] = _clamp(t, steps)
        inside = logical_and(t >= 0, t < steps)
        return select(inside, update[tuple(at)], cache[i])

    return te.compute(cache.shape, body, "tensor_scatter", tag="tensor_scatter")


@register("tensor_scatter", OpPattern.INJECTIVE)
def _tensor_scatter(inputs, attrs):
    """past_cache, update, optional write_indices; attrs: axis, circular."""
    writes = inputs[2] if len(inputs) > 2 else None
    return [tensor_scatter(inputs[0], inputs[1], writes, attrs["axis"], attrs.get("circular", False))]


@register("topk_indices", OpPattern.COMM_REDUCE)
def _topk_indices(inputs, attrs):
    """x; attrs: k, axis, largest. The int64 indices of TopK (its values: gather_elements)."""
    return [topk_indices(inputs[0], attrs["k"], attrs["axis"], attrs.get("largest", True))]


@register("scatter_elements", OpPattern.COMM_REDUCE)
def _scatter_elements(inputs, attrs):
    """data, indices, updates; attrs: axis, reduction."""
    return [scatter_elements(*inputs[:3], attrs.get("axis", 0), attrs.get("reduction", "none"))]


@register("scatter_nd", OpPattern.COMM_REDUCE)
def _scatter_nd(inputs, attrs):
    """data, indices [*B, q], updates; attrs: reduction."""
    return [scatter_nd(*inputs[:3], attrs.get("reduction", "none"))]


@register("gather_nd", OpPattern.INJECTIVE)
def _gather_nd(inputs, attrs):
    """data, indices; attrs: batch_dims."""
    return [gather_nd(inputs[0], inputs[1], attrs.get("batch_dims", 0))]


@register("reverse_sequence", OpPattern.INJECTIVE)
def _reverse_sequence(inputs, attrs):
    """x, sequence_lens; attrs: batch_axis, time_axis."""
    return [reverse_sequence(inputs[0], inputs[1], attrs["batch_axis"], attrs["time_axis"])]


@register("einsum", OpPattern.COMM_REDUCE)
def _einsum(inputs, attrs):
    """operands; attrs: terms (one subscript string per operand), output (explicit, no ellipsis)."""
    return [einsum(inputs, attrs["terms"], attrs["output"])]


@register("col2im", OpPattern.COMM_REDUCE)
def _col2im(inputs, attrs):
    """x; attrs: image, block, dilations, pads, strides."""
    return [
        col2im(inputs[0], attrs["image"], attrs["block"], attrs["dilations"], attrs["pads"], attrs["strides"])
    ]


@register("max_unpool", OpPattern.COMM_REDUCE)
def _max_unpool(inputs, attrs):
    """x, indices; attrs: shape (the output's)."""
    return [max_unpool(inputs[0], inputs[1], attrs["shape"])]
