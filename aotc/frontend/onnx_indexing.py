"""ONNX frontend: Indexing and data-movement operators (TopK, Scatter*, GatherND, DepthToSpace, Einsum, ...).

Operators whose output shape depends on a value (Compress's condition, NonZero, Unique) convert when that
value is a constant (a weight, or a graph input given in the recipe's `constants`): they fold or become
gathers of constant indices; fed at run time, they are refused with a RunTimeValueError naming the input.
"""

from __future__ import annotations

import math
import string

import numpy as np

# This module extends the ONNX frontend: its converters use the converter API that onnx.py defines.
from aotc.frontend.onnx import OnnxConverter, OnnxNode, converts, onnx_axis
from aotc.graph.ir import Value
from aotc.topi.indexing import MUL_CHAIN_LIMIT

VERSIONS: dict[str, tuple[int, ...]] = {
    # Read against onnx.defs.get_all_schemas_with_history(); versions not noted only add element types
    # (bfloat16, refused as a type) or reword the text.
    "TopK": (1, 10, 11, 24),  # 1: k attribute; 10: k input; 11: largest, sorted, negative axis
    "ScatterElements": (11, 13, 16, 18),  # 16: reduction none/add/mul; 18: max/min
    "Scatter": (9,),  # ScatterElements-11 without reduction; Scatter-11 is deprecated
    "ScatterND": (11, 13, 16, 18),  # 16: reduction none/add/mul; 18: max/min
    "TensorScatter": (24,),
    "GatherND": (11, 12, 13),  # 12: batch_dims
    "DepthToSpace": (1, 11, 13, 28),  # 1: DCR only; 11: mode
    "SpaceToDepth": (1, 13, 28),  # before 28: DCR only; 28: mode (DCR or CRD)
    "Einsum": (12, 28),
    "ReverseSequence": (10, 28),
    "CenterCropPad": (18,),
    "Col2Im": (18,),
    "MaxUnpool": (9, 11, 22),
    "Compress": (9, 11, 28),  # 11: negative axis
    "NonZero": (9, 13),
    "Unique": (11, 28),
}
"""ONNX operator -> the versions of it that this module converts (merged into aotc.frontend.onnx.VERSIONS)."""

INDEX_DTYPES = ("int32", "int64")


def _index_input(cv: OnnxConverter, n: OnnxNode, i: int, what: str) -> Value:
    v = n.inputs[i]
    if v.type.dtype not in INDEX_DTYPES:
        raise cv.fail(f"input {i} ({what}) must be int32 or int64, got {v.type.dtype}")
    return v


def _no_bool(cv: OnnxConverter, x: Value) -> None:
    if x.type.dtype == "bool":
        raise cv.fail(f"{cv.node.op_type} is not defined on bool tensors")


# --- TopK ---------------------------------------------------------------------------------------------------


@converts("TopK")
def _topk(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """The k largest (largest=0: smallest) elements along `axis` and their int64 indices, in order (also
    for sorted=0, whose order is unspecified), equal values by lower index first. k is an attribute
    (TopK-1) or input 1, which must be a constant. NaN counts as greater than every number."""
    x = n.inputs[0]
    _no_bool(cv, x)
    if not x.type.shape:
        raise cv.fail(f"TopK needs an input of rank 1 or more, got {x.type}")
    axis = onnx_axis(cv, n.attr("axis", -1), len(x.type.shape))
    if n.older_than(10):
        k = n.attr("k")
    else:
        given = cv.const_input(n, 1, "K")
        if given is None or given.size != 1:
            raise cv.fail("K must be one value")
        k = int(given.reshape(-1)[0])
    extent = x.type.shape[axis]
    if k is None or not 1 <= k <= extent:
        raise cv.fail(f"k={k} must be in [1, {extent}], the extent of axis {axis} of {x.type}")
    largest = bool(n.attr("largest", 1))
    names = [*n.outputs, "", ""]
    indices = cv.emit("topk_indices", [x], {"k": k, "axis": axis, "largest": largest}, names[1] or None)
    values = cv.emit("gather_elements", [x, indices], {"axis": axis}, names[0] or None)
    return [values, indices]


# --- scatters and gathers -----------------------------------------------------------------------------------


def _reduction(cv: OnnxConverter, n: OnnxNode) -> str:
    reduction = n.attr("reduction", "none")
    allowed = ("none", "add", "mul") if n.older_than(18) else ("none", "add", "mul", "max", "min")
    if reduction not in allowed:
        raise cv.fail_version(f"reduction {reduction!r} is not one of {', '.join(allowed)}")
    if reduction != "none" and n.inputs[0].type.dtype == "bool":
        raise cv.fail(f"reduction {reduction} is not defined on bool tensors")
    return reduction


@converts("ScatterElements", "Scatter")
def _scatter_elements(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """updates[j] into data at j with axis `axis` replaced by indices[j] (negative ones from the end),
    combined by `reduction`; with duplicate indices and no reduction, the last update is written."""
    data, updates = n.inputs[0], n.inputs[2]
    indices = _index_input(cv, n, 1, "indices")
    ndim = len(data.type.shape)
    if not ndim or indices.type.shape != updates.type.shape or len(indices.type.shape) != ndim:
        raise cv.fail(
            f"indices {indices.type} and updates {updates.type} must have one shape, of data's rank"
        )
    if updates.type.dtype != data.type.dtype:
        raise cv.fail(f"updates {updates.type} must have data's type {data.type.dtype}")
    axis = onnx_axis(cv, n.attr("axis", 0), ndim)
    if any(s > data.type.shape[d] for d, s in enumerate(updates.type.shape) if d != axis):
        raise cv.fail(f"updates {updates.type} are larger than data {data.type} off axis {axis}")
    reduction = _reduction(cv, n)
    if reduction == "mul" and updates.type.shape[axis] > MUL_CHAIN_LIMIT:
        raise cv.fail(
            f"reduction mul with {updates.type.shape[axis]} updates along axis {axis}: aotc multiplies at "
            f"most {MUL_CHAIN_LIMIT} into one element"
        )
    attrs = {"axis": axis, "reduction": reduction}
    return [cv.emit("scatter_elements", [data, indices, updates], attrs, n.outputs[0])]


@converts("ScatterND")
def _scatter_nd(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """updates into data at the elements or slices that the last axis of indices names, combined by
    `reduction` (none: the last of duplicate indices wins)."""
    data, updates = n.inputs[0], n.inputs[2]
    indices = _index_input(cv, n, 1, "indices")
    if indices.type.dtype != "int64":
        raise cv.fail(f"indices must be int64, got {indices.type.dtype}")
    ishape, dshape = indices.type.shape, data.type.shape
    q = ishape[-1] if ishape else 0
    if not ishape or not 1 <= q <= len(dshape) or updates.type.shape != ishape[:-1] + dshape[q:]:
        raise cv.fail(f"indices {indices.type} and updates {updates.type} do not fit data {data.type}")
    if updates.type.dtype != data.type.dtype:
        raise cv.fail(f"updates {updates.type} must have data's type {data.type.dtype}")
    reduction = _reduction(cv, n)
    count = math.prod(ishape[:-1])
    if reduction == "mul" and count > MUL_CHAIN_LIMIT:
        raise cv.fail(f"reduction mul with {count} updates: aotc multiplies at most {MUL_CHAIN_LIMIT}")
    if len(ishape) == 1:  # one update: a batch of one
        indices = cv.emit("reshape", [indices], {"shape": (1, q)})
        updates = cv.emit("reshape", [updates], {"shape": (1, *updates.type.shape)})
    return [cv.emit("scatter_nd", [data, indices, updates], {"reduction": reduction}, n.outputs[0])]


@converts("TensorScatter")
def _tensor_scatter(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """past_cache with update written along `axis` (not 0, the batch) from write_indices[b] (input 2, 0 when
    absent) in each batch b; mode circular wraps around the axis. Linear writes past the end are
    invalid; here they are dropped."""
    cache, update, writes = n.inputs[0], n.inputs[1], n.input(2)
    ndim = len(cache.type.shape)
    if ndim < 2:
        raise cv.fail(f"past_cache must have rank 2 or more, got {cache.type}")
    axis = onnx_axis(cv, n.attr("axis", -2), ndim)
    mode = n.attr("mode", "linear")
    if mode not in ("linear", "circular"):
        raise cv.fail(f"mode must be linear or circular, got {mode!r}")
    shape, ushape = cache.type.shape, update.type.shape
    if (
        axis == 0
        or update.type.dtype != cache.type.dtype
        or len(ushape) != ndim
        or ushape[axis] > shape[axis]
        or any(a != b for d, (a, b) in enumerate(zip(ushape, shape)) if d != axis)
    ):
        raise cv.fail(f"update {update.type} does not fit past_cache {cache.type} on axis {axis} (not 0)")
    if writes is not None and (writes.type.dtype != "int64" or writes.type.shape != (shape[0],)):
        raise cv.fail(f"write_indices {writes.type} must be int64 of shape [{shape[0]}]")
    operands = [cache, update] + ([writes] if writes is not None else [])
    attrs = {"axis": axis, "circular": mode == "circular"}
    return [cv.emit("tensor_scatter", operands, attrs, n.outputs[0])]


@converts("GatherND")
def _gather_nd(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """The elements or slices of data that the last axis of indices names (negative ones from the end),
    after the first `batch_dims` axes, which data and indices share."""
    data = n.inputs[0]
    indices = _index_input(cv, n, 1, "indices")
    if indices.type.dtype != "int64":
        raise cv.fail(f"indices must be int64, got {indices.type.dtype}")
    b = n.attr("batch_dims", 0)
    ishape, dshape = indices.type.shape, data.type.shape
    q = ishape[-1] if ishape else 0
    if (
        not 0 <= b < min(len(ishape), len(dshape))
        or not 1 <= q <= len(dshape) - b
        or ishape[:b] != dshape[:b]
    ):
        raise cv.fail(f"indices {indices.type} do not index data {data.type} with batch_dims {b}")
    out_shape = ishape[:-1] + dshape[b + q :]
    if not out_shape:  # one element: gather it as a [1] tensor
        indices = cv.emit("reshape", [indices], {"shape": (1, q)})
        one = cv.emit("gather_nd", [data, indices], {"batch_dims": b})
        return [cv.emit("reshape", [one], {"shape": ()}, n.outputs[0])]
    return [cv.emit("gather_nd", [data, indices], {"batch_dims": b}, n.outputs[0])]


@converts("ReverseSequence")
def _reverse_sequence(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """The first sequence_lens[b] elements along time_axis of each batch b reversed, the rest kept."""
    x, lens = n.inputs[:2]
    if lens.type.dtype != "int64":
        raise cv.fail(f"sequence_lens must be int64, got {lens.type.dtype}")
    if len(x.type.shape) < 2:
        raise cv.fail(f"ReverseSequence needs an input of rank 2 or more, got {x.type}")
    batch_axis, time_axis = n.attr("batch_axis", 1), n.attr("time_axis", 0)
    if {batch_axis, time_axis} != {0, 1}:
        raise cv.fail(f"batch_axis {batch_axis} and time_axis {time_axis} must be 0 and 1")
    if lens.type.shape != (x.type.shape[batch_axis],):
        raise cv.fail(f"sequence_lens {lens.type} must have one value per batch ({x.type.shape[batch_axis]})")
    attrs = {"batch_axis": batch_axis, "time_axis": time_axis}
    return [cv.emit("reverse_sequence", [x, lens], attrs, n.outputs[0])]


# --- layout: DepthToSpace, SpaceToDepth, CenterCropPad ------------------------------------------------------


def _blocksize(cv: OnnxConverter, n: OnnxNode, x: Value) -> int:
    if len(x.type.shape) != 4:
        raise cv.fail(f"{n.op_type} needs a 4-D NCHW input, got {x.type}")
    block = n.attr("blocksize")
    if not isinstance(block, int) or block < 1:
        raise cv.fail(f"blocksize must be a positive integer, got {block}")
    return block


def _mode(cv: OnnxConverter, n: OnnxNode) -> str:
    mode = n.attr("mode", "DCR")
    if mode not in ("DCR", "CRD"):
        raise cv.fail(f"mode must be DCR or CRD, got {mode!r}")
    return mode


@converts("DepthToSpace")
def _depth_to_space(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """Depth into blocks of space: a reshape, a transpose and a reshape, as ONNX defines it."""
    x = n.inputs[0]
    bs = _blocksize(cv, n, x)
    b, c, h, w = x.type.shape
    if c % (bs * bs):
        raise cv.fail(f"channels {c} are not a multiple of blocksize² {bs * bs}")
    if _mode(cv, n) == "DCR":
        split, perm = (b, bs, bs, c // (bs * bs), h, w), (0, 3, 4, 1, 5, 2)
    else:
        split, perm = (b, c // (bs * bs), bs, bs, h, w), (0, 1, 4, 2, 5, 3)
    t = cv.emit("transpose", [cv.emit("reshape", [x], {"shape": split})], {"perm": perm})
    return [cv.emit("reshape", [t], {"shape": (b, c // (bs * bs), h * bs, w * bs)}, n.outputs[0])]


@converts("SpaceToDepth")
def _space_to_depth(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """Blocks of space into depth (the inverse of DepthToSpace; SpaceToDepth-28 adds mode CRD)."""
    x = n.inputs[0]
    bs = _blocksize(cv, n, x)
    b, c, h, w = x.type.shape
    if h % bs or w % bs:
        raise cv.fail(f"height {h} and width {w} must be multiples of blocksize {bs}")
    perm = (0, 3, 5, 1, 2, 4) if _mode(cv, n) == "DCR" else (0, 1, 3, 5, 2, 4)
    split = cv.emit("reshape", [x], {"shape": (b, c, h // bs, bs, w // bs, bs)})
    t = cv.emit("transpose", [split], {"perm": perm})
    return [cv.emit("reshape", [t], {"shape": (b, c * bs * bs, h // bs, w // bs)}, n.outputs[0])]


@converts("CenterCropPad")
def _center_crop_pad(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """Each of `axes` centered in the extent `shape` gives (input 1, a constant): cropped with the odd
    element off the end, or zero-padded with the odd element at the end."""
    x = n.inputs[0]
    ndim = len(x.type.shape)
    shape = cv.const_input(n, 1, "shape")
    axes = [onnx_axis(cv, int(a), ndim) for a in n.attr("axes", range(ndim))]
    if shape is None or shape.size != len(axes) or len(set(axes)) != len(axes):
        raise cv.fail(
            f"shape {None if shape is None else shape.tolist()} must give one extent per axis {axes}"
        )
    before, after = [0] * ndim, [0] * ndim
    for a, s in zip(axes, shape.reshape(-1).tolist()):
        if s < 1:
            raise cv.fail(f"extent {s} for axis {a}; aotc compiles tensors with at least one element")
        diff = int(s) - x.type.shape[a]
        before[a] = diff // 2 if diff >= 0 else -(-diff // 2)
        after[a] = diff - before[a]
    if not any(before) and not any(after):
        return [x]
    attrs = {"before": tuple(before), "after": tuple(after), "mode": "constant", "value": 0}
    return [cv.emit("pad", [x], attrs, n.outputs[0])]


def wrap_pad(cv: OnnxConverter, x: Value, before: list[int], after: list[int], out: str) -> Value:
    """Pad mode wrap (Pad-19): each padded axis reads the input at (j - before) mod extent, a gather of
    constant indices. Negative pads (crops) are refused: ONNX's reference (numpy.pad) rejects them and
    onnxruntime wraps the cropped input instead."""
    if min(before + after) < 0:
        raise cv.fail(f"pad mode 'wrap' with negative pads {before + after} (crops) is not supported")
    axes = [d for d in range(len(before)) if before[d] or after[d]]
    for i, d in enumerate(axes):
        extent = x.type.shape[d]
        size = extent + before[d] + after[d]
        index = cv.constant((np.arange(size, dtype=np.int64) - before[d]) % extent, "wrap")
        x = cv.emit("take", [x, index], {"axis": d}, out if i == len(axes) - 1 else None)
    return x


# --- Einsum -------------------------------------------------------------------------------------------------

_LETTERS = frozenset(string.ascii_letters)


def _parse_einsum(cv: OnnxConverter, equation: str, shapes: list[tuple[int, ...]]):
    """The terms (one subscript per axis; the axes an ellipsis stands for get the characters '0', '1', ...,
    right-aligned) and the output term of an Einsum equation, and each operand's broadcast shape."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise cv.fail(f"equation {equation!r} has {len(terms)} operand terms for {len(shapes)} inputs")
    ellipsis_rank = 0
    for term, shape in zip(terms, shapes):
        body = term.replace("...", "")
        if term.count("...") > 1 or any(c not in _LETTERS for c in body):
            raise cv.fail(f"equation {equation!r}: term {term!r} is not letters with at most one ellipsis")
        if len(body) > len(shape) or ("..." not in term and len(body) != len(shape)):
            raise cv.fail(f"equation {equation!r}: term {term!r} for an operand of shape {list(shape)}")
        ellipsis_rank = max(ellipsis_rank, len(shape) - len(body))
    dims = "".join(str(d) for d in range(ellipsis_rank))
    if ellipsis_rank > 10:
        raise cv.fail(f"equation {equation!r}: an ellipsis of {ellipsis_rank} axes (at most 10)")
    expanded, broadcast = [], [1] * ellipsis_rank
    for term, shape in zip(terms, shapes):
        k = len(shape) - len(term.replace("...", ""))
        if "..." in term:
            start = term.index("...")
            for j, s in enumerate(shape[start : start + k]):
                at = ellipsis_rank - k + j
                if broadcast[at] != 1 and s not in (1, broadcast[at]):
                    raise cv.fail(f"equation {equation!r}: ellipsis extents do not broadcast")
                broadcast[at] = max(broadcast[at], s)
        expanded.append(term.replace("...", dims[ellipsis_rank - k :]))
    if arrow:
        if rhs.count("...") > 1 or any(c not in _LETTERS for c in rhs.replace("...", "")):
            raise cv.fail(f"equation {equation!r}: output {rhs!r} is not letters with at most one ellipsis")
        output = rhs.replace("...", dims)
    else:  # implicit: the ellipsis axes, then the letters used once, in alphabetical order
        counts = {c: lhs.count(c) for c in set(lhs) if c in _LETTERS}
        output = dims + "".join(sorted(c for c, m in counts.items() if m == 1))
    used = "".join(expanded)
    if len(set(output)) != len(output) or any(c not in used for c in output):
        raise cv.fail(f"equation {equation!r}: output letters must be distinct letters of the inputs")
    return expanded, output, broadcast


@converts("Einsum")
def _einsum(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """The sum of products over the letters the output leaves out, one contraction over all operands
    (repeated letters read diagonals; ellipsis axes broadcast); float16 is computed in float32."""
    operands = list(n.inputs)
    if not operands or any(v is None for v in operands):
        raise cv.fail("Einsum needs one or more inputs")
    dtype = operands[0].type.dtype
    if dtype == "bool" or any(v.type.dtype != dtype for v in operands):
        raise cv.fail(f"operands must share one numeric type, got {[v.type.dtype for v in operands]}")
    equation = n.attr("equation")
    if not isinstance(equation, str):
        raise cv.fail("needs the equation attribute")
    terms, output, broadcast = _parse_einsum(cv, equation, [v.type.shape for v in operands])
    extents: dict[str, int] = {}
    for i, (v, term) in enumerate(zip(operands, terms)):
        shape = tuple(broadcast[int(c)] if c.isdigit() else s for c, s in zip(term, v.type.shape))
        for c, s in zip(term, shape):
            if extents.setdefault(c, s) != s:
                raise cv.fail(f"equation {equation!r}: letter {c!r} has extents {extents[c]} and {s}")
        if shape != v.type.shape:
            operands[i] = cv.emit("broadcast_to", [v], {"shape": shape})
    if dtype == "float16":
        operands = [cv.emit("cast", [v], {"dtype": "float32"}) for v in operands]
    attrs = {"terms": tuple(terms), "output": output}
    y = cv.emit("einsum", operands, attrs, None if dtype == "float16" else n.outputs[0])
    if dtype == "float16":
        y = cv.emit("cast", [y], {"dtype": "float16"}, n.outputs[0])
    return [y]


# --- Col2Im, MaxUnpool --------------------------------------------------------------------------------------


@converts("Col2Im")
def _col2im(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """Columns of sliding blocks [N, C * prod(block_shape), L] summed back into images [N, C, *image_shape]
    (inputs 1 and 2, constants)."""
    x = n.inputs[0]
    _no_bool(cv, x)
    image, block = cv.const_input(n, 1, "image_shape"), cv.const_input(n, 2, "block_shape")
    image, block = [int(s) for s in image.reshape(-1)], [int(s) for s in block.reshape(-1)]
    rank = len(image)
    if not rank or len(block) != rank or min(image + block) < 1:
        raise cv.fail(f"image_shape {image} and block_shape {block} must be positive, of one length")
    dilations = list(n.attr("dilations", [1] * rank))
    strides = list(n.attr("strides", [1] * rank))
    pads = list(n.attr("pads", [0] * 2 * rank))
    if len(dilations) != rank or len(strides) != rank or len(pads) != 2 * rank:
        raise cv.fail(f"dilations {dilations}, strides {strides}, pads {pads} for {rank} spatial axes")
    if min(dilations + strides) < 1 or min(pads) < 0:
        raise cv.fail(
            f"dilations {dilations} and strides {strides} must be positive, pads {pads} not negative"
        )
    counts = [
        (image[d] + pads[d] + pads[d + rank] - dilations[d] * (block[d] - 1) - 1) // strides[d] + 1
        for d in range(rank)
    ]
    size = math.prod(block)
    if (
        len(x.type.shape) != 3
        or x.type.shape[1] % size
        or min(counts) < 1
        or math.prod(counts) != x.type.shape[2]
    ):
        raise cv.fail(
            f"input {x.type} is not [N, C * {size}, {math.prod(counts)}] for image_shape {image}, block_shape "
            f"{block}, dilations {dilations}, pads {pads}, strides {strides}"
        )
    attrs = {
        "image": tuple(image),
        "block": tuple(block),
        "dilations": tuple(dilations),
        "pads": tuple(pads),
        "strides": tuple(strides),
    }
    return [cv.emit("col2im", [x], attrs, n.outputs[0])]


@converts("MaxUnpool")
def _max_unpool(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """Zeros with the elements of X where MaxPool's indices (flat over the output, [N, C, *spatial]) put
    them, of the shape the pooling attributes invert (output_shape, input 2, a constant, must agree). Each
    index is looked for in its own (n, c) plane, as MaxPool makes them."""
    x = n.inputs[0]
    _no_bool(cv, x)
    indices = n.inputs[1]
    if indices.type.dtype != "int64" or indices.type.shape != x.type.shape:
        raise cv.fail(f"indices {indices.type} must be int64 of X's shape {list(x.type.shape)}")
    rank = len(x.type.shape) - 2
    kernel = n.attr("kernel_shape")
    if rank < 1 or kernel is None or len(kernel) != rank:
        raise cv.fail(f"kernel_shape {kernel} for input {x.type}")
    strides = list(n.attr("strides", [1] * rank))
    pads = list(n.attr("pads", [0] * 2 * rank))
    if len(strides) != rank or len(pads) != 2 * rank:
        raise cv.fail(f"strides {strides} and pads {pads} for {rank} spatial axes")
    spatial = [
        (s - 1) * st + k - pads[d] - pads[d + rank]
        for d, (s, st, k) in enumerate(zip(x.type.shape[2:], strides, kernel))
    ]
    given = cv.const_input(n, 2, "output_shape")
    shape = (*x.type.shape[:2], *spatial)
    if given is not None:
        given = tuple(int(s) for s in given.reshape(-1))
        if len(given) != rank + 2 or given[:2] != x.type.shape[:2] or min(given) < 1:
            raise cv.fail(f"output_shape {list(given)} for input {x.type}")
        if given != shape:
            # ONNX's reference reads the indices against the shape the attributes give and pads that with
            # zeros at the end; onnxruntime reads them against output_shape: the operator is ambiguous
            raise cv.fail(
                f"output_shape {list(given)} differs from {list(shape)}, the shape kernel_shape, strides and "
                "pads give: ONNX's reference and onnxruntime place the indices differently then"
            )
    if min(shape) < 1:
        raise cv.fail(f"output shape {list(shape)} is empty")
    return [cv.emit("max_unpool", [x, indices], {"shape": shape}, n.outputs[0])]


# --- value-dependent shapes: Compress, NonZero, Unique ------------------------------------------------------


@converts("Compress")
def _compress(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """The slices along `axis` (none: of the flattened input) where condition (input 1) is true. The
    output's extent is the count of trues, so the condition must be a constant: a gather of its indices."""
    x, cond = n.inputs[:2]
    if not cond.is_constant:
        raise cv.run_time_value_error(n, 1, "condition", "the output's shape is the count of its trues")
    condition = np.asarray(cond.data).reshape(-1).astype(bool)
    axis = n.attr("axis")
    if axis is None:
        x = cv.emit("reshape", [x], {"shape": (x.type.num_elements,)}) if len(x.type.shape) != 1 else x
        axis = 0
    else:
        if n.older_than(11) and axis < 0:
            raise cv.fail_version(f"axis {axis}: negative axes are Compress-11's")
        axis = onnx_axis(cv, axis, len(x.type.shape))
    extent = x.type.shape[axis]
    if condition[extent:].any():  # a longer condition selects nothing beyond the axis: refused if it tries
        raise cv.fail(
            f"condition selects index {np.flatnonzero(condition)[-1]} of axis {axis}, of extent {extent}"
        )
    condition = condition[:extent]
    picked = np.flatnonzero(condition).astype(np.int64)
    if not picked.size:
        raise cv.fail(
            "the condition is all false: an empty output; aotc compiles tensors with at least one element"
        )
    if picked.size == extent:
        return [x]
    return [cv.emit("take", [x, cv.constant(picked, "picked")], {"axis": axis}, n.outputs[0])]


def _constant_input(cv: OnnxConverter, n: OnnxNode, why: str) -> np.ndarray:
    x = n.inputs[0]
    if not x.is_constant:
        raise cv.run_time_value_error(n, 0, "X", why)
    return np.asarray(x.data)


@converts("NonZero")
def _nonzero(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """The int64 indices [rank, count] of the nonzero elements of a constant input, folded."""
    data = _constant_input(cv, n, "the output's shape is the count of its nonzero elements")
    found = np.array(np.nonzero(data.reshape(1) if data.ndim == 0 else data), np.int64)
    if data.ndim == 0:
        found = found[:0]
    return [cv.constant(found, "nonzero", out=n.outputs[0])]


@converts("Unique")
def _unique(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """The unique elements (or slices along `axis`) of a constant input, folded: sorted (sorted=1, the
    default) or in the order they first occur, with the int64 index of each one's first occurrence, the
    index of each input element (slice) in the output, and the counts."""
    data = _constant_input(cv, n, "the output's shape is the count of its unique values")
    axis = n.attr("axis")
    if axis is not None:
        axis = onnx_axis(cv, axis, data.ndim)
    y, first, inverse, counts = np.unique(
        data if axis is not None else data.reshape(-1),
        return_index=True,
        return_inverse=True,
        return_counts=True,
        axis=axis,
    )
    inverse = inverse.reshape(-1)
    if not n.attr("sorted", 1):
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        y = np.take(y, order, axis=0 if axis is None else axis)
        first, counts, inverse = first[order], counts[order], rank[inverse]
    results = (y.astype(data.dtype), first, inverse, counts)
    return [
        cv.constant(np.asarray(v, np.int64) if i else v, "unique", out=name or None)
        for i, (v, name) in enumerate(zip(results, n.outputs))
    ]
