"""ONNX frontend: small operators of their own kind (DynamicQuantizeLinear, Det, TfIdfVectorizer,
NonMaxSuppression).

The first three are built from graph ops at conversion: DynamicQuantizeLinear's scale and zero point from the
input's minimum and maximum in the kernel, Det by cofactor expansion or LU with partial pivoting unrolled over
the (static) matrix size, TfIdfVectorizer's pool of n-grams as products of shifted equality masks.
NonMaxSuppression's output shape is the number of boxes it selects, which depends on every input's value: it
converts when they are all constants (folded) and is refused with a RunTimeValueError naming the input
otherwise, as NonZero and Unique are (aotc.frontend.onnx_indexing).
"""

from __future__ import annotations

import math

import numpy as np

# This module extends the ONNX frontend: its converters use the converter API that onnx.py defines.
from aotc.frontend.onnx import OnnxConverter, OnnxNode, converts
from aotc.graph.ir import Value

VERSIONS: dict[str, tuple[int, ...]] = {
    # Read against onnx.defs.get_all_schemas_with_history().
    "DynamicQuantizeLinear": (11,),
    "Det": (11, 22),  # 22 only adds bfloat16 (refused as a type)
    "TfIdfVectorizer": (9,),
    "NonMaxSuppression": (10, 11),  # 11 changed no semantics (the schemas' texts are equal)
}
"""ONNX operator -> the versions of it that this module converts (merged into aotc.frontend.onnx.VERSIONS)."""

DET_MAX_SIZE = 16
"""The largest matrix Det unrolls LU over (about 6 * n * n graph ops): beyond it, refused."""

TFIDF_MAX_TERMS = 4096
"""The most (n-gram size, skip, position in the n-gram) products TfIdfVectorizer unrolls."""


def _slice(cv: OnnxConverter, x: Value, axis: int, start: int, stop: int) -> Value:
    """x[..., start:stop, ...] along `axis`."""
    shape = x.type.shape
    if (start, stop) == (0, shape[axis]):
        return x
    begin = tuple(start if d == axis else 0 for d in range(len(shape)))
    end = tuple(stop if d == axis else s for d, s in enumerate(shape))
    return cv.emit("strided_slice", [x], {"begin": begin, "end": end, "strides": (1,) * len(shape)})


def _scalar(cv: OnnxConverter, value: float, dtype: str, hint: str) -> Value:
    return cv.constant(np.asarray(value, dtype), hint, dtype)


# --- DynamicQuantizeLinear ----------------------------------------------------------------------------------


@converts("DynamicQuantizeLinear")
def _dynamic_quantize_linear(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """uint8 quantization with parameters from the data, as ONNX defines them (float32 throughout):
    y_scale = (max(0, max(x)) - min(0, min(x))) / 255 (1 when both are 0, as onnxruntime),
    y_zero_point = round(clip(-min(0, min(x)) / y_scale, 0, 255)) and
    y = saturate(round(x / y_scale) + y_zero_point), rounding half to even."""
    x = n.inputs[0]
    if x.type.dtype != "float32":
        raise cv.fail(f"DynamicQuantizeLinear quantizes float32 tensors, got {x.type.dtype}")
    if not x.type.shape:
        x = cv.emit("reshape", [x], {"shape": (1,)})
    axes = {"axes": tuple(range(len(x.type.shape))), "keepdims": False}
    zero = _scalar(cv, 0.0, "float32", "zero")
    lo = cv.emit("minimum", [cv.emit("reduce_min", [x], axes), zero])
    hi = cv.emit("maximum", [cv.emit("reduce_max", [x], axes), zero])
    span = cv.emit("subtract", [hi, lo])
    scale = cv.emit("divide", [span, _scalar(cv, 255.0, "float32", "qmax")])
    # hi >= 0 >= lo, so the span is 0 only when both are (x all zeros), where ONNX's formula divides 0 by
    # 0: onnxruntime's scale is then 1 (ONNX's reference evaluator's 1 / 255); y and the zero point are 0
    empty = cv.emit("equal", [span, zero])
    scale = cv.emit("where", [empty, _scalar(cv, 1.0, "float32", "one"), scale], out=n.outputs[1])
    zp = cv.emit("subtract", [zero, cv.emit("divide", [lo, scale])])
    zp = cv.emit("round", [cv.emit("clip", [zp], {"min": 0.0, "max": 255.0})])
    y = cv.emit("add", [cv.emit("round", [cv.emit("divide", [x, scale])]), zp])
    y = cv.emit("clip", [y], {"min": 0.0, "max": 255.0})
    if y.type.shape != n.inputs[0].type.shape:
        y = cv.emit("reshape", [y], {"shape": n.inputs[0].type.shape})
    return [
        cv.emit("cast", [y], {"dtype": "uint8"}, n.outputs[0]),
        scale,
        cv.emit("cast", [zp], {"dtype": "uint8"}, n.outputs[2]),
    ]


# --- Det ----------------------------------------------------------------------------------------------------


@converts("Det")
def _det(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """The determinant of each [n, n] matrix of x [..., n, n], computed in float64 (as numpy does for
    float32): cofactor expansion for n <= 3, else LU with partial pivoting unrolled over n (a row swap is
    a pair of selects, the pivot the first of the greatest magnitude)."""
    x = n.inputs[0]
    shape, dtype = x.type.shape, x.type.dtype
    if dtype not in ("float16", "float32", "float64"):
        raise cv.fail(f"Det is defined on float tensors, got {dtype}")
    if len(shape) < 2 or shape[-1] != shape[-2]:
        raise cv.fail(f"Det needs square matrices in the last two axes, got {x.type}")
    size, batch = shape[-1], shape[:-2]
    if size > DET_MAX_SIZE:
        raise cv.fail(f"Det of {size}x{size} matrices: aotc unrolls LU up to {DET_MAX_SIZE}x{DET_MAX_SIZE}")
    count = math.prod(batch)
    if count == 0 or size == 0:  # no matrix (an empty result), or 0x0 ones (determinant 1, as numpy's)
        return [cv.constant(np.ones(batch, dtype), "det", out=n.outputs[0])]
    wide = cv.emit("cast", [x], {"dtype": "float64"}) if dtype != "float64" else x
    wide = cv.emit("reshape", [wide], {"shape": (count, size, size)})
    rows = [
        cv.emit("reshape", [_slice(cv, wide, 1, i, i + 1)], {"shape": (count, size)}) for i in range(size)
    ]
    det = _cofactor_det(cv, rows) if size <= 3 else _lu_det(cv, rows)
    det = cv.emit("reshape", [det], {"shape": batch})
    return [
        cv.emit("cast", [det], {"dtype": dtype}, n.outputs[0]) if dtype != "float64" else _named(cv, det, n)
    ]


def _named(cv: OnnxConverter, v: Value, n: OnnxNode) -> Value:
    return v if v.name == n.outputs[0] else cv.emit("identity", [v], out=n.outputs[0])


def _cofactor_det(cv: OnnxConverter, rows: list[Value]) -> Value:
    """The determinant of 1x1 to 3x3 matrices (rows [B, n]) as Eigen's closed forms: [B, 1]."""
    size = len(rows)
    e = [[_slice(cv, r, 1, j, j + 1) for j in range(size)] for r in rows]

    def mul(a: Value, b: Value) -> Value:
        return cv.emit("multiply", [a, b])

    def minor(r0: int, r1: int, c0: int, c1: int) -> Value:
        return cv.emit("subtract", [mul(e[r0][c0], e[r1][c1]), mul(e[r0][c1], e[r1][c0])])

    if size == 1:
        return e[0][0]
    if size == 2:
        return minor(0, 1, 0, 1)
    # expansion along the first column
    terms = [
        mul(e[0][0], minor(1, 2, 1, 2)),
        mul(e[1][0], minor(0, 2, 1, 2)),
        mul(e[2][0], minor(0, 1, 1, 2)),
    ]
    return cv.emit("add", [cv.emit("subtract", [terms[0], terms[1]]), terms[2]])


def _lu_det(cv: OnnxConverter, rows: list[Value]) -> Value:
    """The determinant of n x n matrices (rows [B, n], n >= 2) by Gaussian elimination with partial pivoting:
    the product of the pivots times the sign of the row permutation, [B, 1]. A zero pivot (the column is 0
    from the diagonal down) makes the determinant 0; no row is divided by it."""
    size = len(rows)
    rows = list(rows)  # at step k, rows[i] (i >= k) holds columns k.. of the partly eliminated matrix
    zero, one = (_scalar(cv, v, "float64", h) for v, h in ((0.0, "zero"), (1.0, "one")))
    sign: Value = one
    det: Value | None = None
    for k in range(size):
        width = size - k
        # the pivot row: pairwise swaps leave in row k the first row of greatest |a[i, k]|, i >= k
        for i in range(k + 1, size):
            pk = cv.emit("abs", [_slice(cv, rows[k], 1, 0, 1)])
            pi = cv.emit("abs", [_slice(cv, rows[i], 1, 0, 1)])
            swap = cv.emit("greater", [pi, pk])
            rows[k], rows[i] = (
                cv.emit("where", [swap, rows[i], rows[k]]),
                cv.emit("where", [swap, rows[k], rows[i]]),
            )
            sign = cv.emit("where", [swap, cv.emit("negative", [sign]), sign])
        pivot = _slice(cv, rows[k], 1, 0, 1)
        det = pivot if det is None else cv.emit("multiply", [det, pivot])
        if width == 1:
            break
        divisor = cv.emit("where", [cv.emit("equal", [pivot, zero]), one, pivot])
        head = _slice(cv, rows[k], 1, 1, width)
        for i in range(k + 1, size):
            factor = cv.emit("divide", [_slice(cv, rows[i], 1, 0, 1), divisor])
            tail = _slice(cv, rows[i], 1, 1, width)
            rows[i] = cv.emit("subtract", [tail, cv.emit("multiply", [factor, head])])
    return cv.emit("multiply", [det, sign])


# --- TfIdfVectorizer ----------------------------------------------------------------------------------------

_MODES = ("TF", "IDF", "TFIDF")


@converts("TfIdfVectorizer")
def _tfidf_vectorizer(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """Counts of the pool's n-grams in each row of x ([C] or [B, C], int32/int64) into float32 [O] or
    [B, O], O = max(ngram_indexes) + 1, weighted by `mode`; as ONNX's reference (and onnxruntime) counts
    them: for each skip s in 0..max_skip_count, the n-grams x[t], x[t + s + 1], ..., of each size in
    [min_gram_length, max_gram_length] that the pool holds, unigrams once (not once per skip)."""
    x = n.inputs[0]
    if n.attr("pool_strings") is not None:
        raise cv.fail("pool_strings: aotc compiles no string tensors; only pool_int64s is supported")
    if x.type.dtype not in ("int32", "int64"):
        raise cv.fail(f"X must be int32 or int64, got {x.type.dtype}")
    mode = n.attr("mode")
    if mode not in _MODES:
        raise cv.fail(f"mode must be one of {', '.join(_MODES)}, got {mode!r}")
    grams, outputs = _tfidf_pool(cv, n)
    shape = x.type.shape
    if len(shape) > 2 or (len(shape) == 2 and shape[0] == 0):
        raise cv.fail(f"X must be [C] or [B, C] with B > 0, got {x.type}")
    rows, width = (shape[0], shape[1]) if len(shape) == 2 else (1, math.prod(shape))
    out_shape = (rows, outputs) if len(shape) == 2 else (outputs,)
    weights = _tfidf_weights(cv, n, outputs) if mode != "TF" else None
    if not grams or width == 0:  # no n-gram to count (or none that could be read): all zero
        return [cv.constant(np.zeros(out_shape, np.float32), "counts", out=n.outputs[0])]
    max_skip = n.attr("max_skip_count")
    if max_skip < 0:
        raise cv.fail(f"max_skip_count must be >= 0, got {max_skip}")
    terms = sum(size * (1 if size == 1 else max_skip + 1) for size in grams)
    if terms > TFIDF_MAX_TERMS:
        raise cv.fail(f"{terms} shifted products to unroll; aotc unrolls up to {TFIDF_MAX_TERMS}")
    x = cv.emit("reshape", [x], {"shape": (rows, width, 1)})
    if x.type.dtype != "int64":
        x = cv.emit("cast", [x], {"dtype": "int64"})
    counts, columns = [], []
    for size, by_gram in sorted(grams.items()):
        values = np.array(list(by_gram), np.int64).reshape(len(by_gram), size)
        columns += list(by_gram.values())
        # hits[k][b, t, g]: x[b, t] is item k of n-gram g
        hits = [
            cv.emit(
                "cast", [cv.emit("equal", [x, cv.constant(values[:, k], "gram_item")])], {"dtype": "float32"}
            )
            for k in range(size)
        ]
        total: Value | None = None
        for distance in range(1, (2 if size == 1 else max_skip + 2)):
            starts = width - (size - 1) * distance
            if starts <= 0:
                break
            found = None
            for k in range(size):
                shifted = _slice(cv, hits[k], 1, k * distance, k * distance + starts)
                found = shifted if found is None else cv.emit("multiply", [found, shifted])
            found = cv.emit("reduce_sum", [found], {"axes": (1,), "keepdims": False})
            total = found if total is None else cv.emit("add", [total, found])
        counts.append(
            total if total is not None else cv.constant(np.zeros((rows, len(by_gram)), np.float32), "none")
        )
    count = counts[0] if len(counts) == 1 else cv.emit("concat", counts, {"axis": 1})
    # n-gram -> output column: a 0/1 matrix (exact: the counts are small integers)
    place = np.zeros((len(columns), outputs), np.float32)
    place[np.arange(len(columns)), columns] = 1.0
    y = cv.emit("matmul", [count, cv.constant(place, "ngram_indexes")])
    if mode == "IDF":
        seen = cv.emit("greater", [y, _scalar(cv, 0.0, "float32", "zero")])
        hit = cv.constant(weights if weights is not None else np.ones(outputs, np.float32), "weights")
        y = cv.emit("where", [seen, hit, _scalar(cv, 0.0, "float32", "zero")])
    elif mode == "TFIDF" and weights is not None:
        y = cv.emit("multiply", [y, cv.constant(weights, "weights")])
    if y.type.shape != out_shape:
        y = cv.emit("reshape", [y], {"shape": out_shape})
    return [cv.emit("identity", [y], out=n.outputs[0]) if y.name != n.outputs[0] else y]


def _tfidf_weights(cv: OnnxConverter, n: OnnxNode, outputs: int) -> np.ndarray | None:
    """The weight of each output column (None: no weights). ONNX defines weights[i] as the weight of the
    pool's i-th n-gram, which lands in column ngram_indexes[i]; onnxruntime and ONNX's reference evaluator
    weight column i by weights[i] instead. The two agree when weights[ngram_indexes[i]] == weights[i] for
    every n-gram (ngram_indexes the identity, say); otherwise the answer depends on whom one asks: refused."""
    weights = n.attr("weights")
    if not weights:
        return None
    indexes = list(n.attr("ngram_indexes"))
    if len(weights) != len(indexes):
        raise cv.fail(
            f"weights has {len(weights)} values, ngram_indexes {len(indexes)}; they must be as many"
        )
    if any(c >= len(weights) or weights[c] != w for c, w in zip(indexes, weights)):
        raise cv.fail(
            "weights[i] must equal weights[ngram_indexes[i]]: ONNX weights the pool's i-th n-gram by "
            "weights[i], onnxruntime output column i, and the two differ for these ngram_indexes"
        )
    column = np.zeros(outputs, np.float32)
    column[indexes] = weights
    return column


def _tfidf_pool(cv: OnnxConverter, n: OnnxNode) -> tuple[dict[int, dict[tuple[int, ...], int]], int]:
    """The pool's n-grams of the sizes counted ({size: {n-gram: output column}}) and the output width
    (max(ngram_indexes) + 1)."""
    pool = list(n.attr("pool_int64s") or [])
    starts = list(n.attr("ngram_counts") or [])
    indexes = list(n.attr("ngram_indexes") or [])
    lo, hi = n.attr("min_gram_length"), n.attr("max_gram_length")
    if not indexes or min(indexes) < 0:
        raise cv.fail(f"ngram_indexes must be non-empty and non-negative, got {indexes}")
    if lo < 1 or hi < lo:
        raise cv.fail(f"min_gram_length {lo} and max_gram_length {hi} must satisfy 1 <= min <= max")
    bounds = [*starts, len(pool)]
    if any(b < a for a, b in zip(bounds, bounds[1:])) or (starts and starts[0] != 0):
        raise cv.fail(f"ngram_counts {starts} must be increasing offsets into the {len(pool)} pool values")
    grams: dict[int, dict[tuple[int, ...], int]] = {}
    gram_id = 0
    for size, (a, b) in enumerate(zip(bounds, bounds[1:]), 1):
        if (b - a) % size:
            raise cv.fail(
                f"{b - a} pool values of {size}-grams (from ngram_counts) is not a multiple of {size}"
            )
        for start in range(a, b, size):
            if gram_id >= len(indexes):
                raise cv.fail(f"the pool holds more n-grams than ngram_indexes has entries ({len(indexes)})")
            gram = tuple(pool[start : start + size])
            if lo <= size <= hi:
                if gram in grams.setdefault(size, {}):
                    # the reference counts it in its last column, onnxruntime refuses the model: ambiguous
                    raise cv.fail(f"n-gram {list(gram)} is in pool_int64s twice")
                grams[size][gram] = indexes[gram_id]
            gram_id += 1
    return grams, max(indexes) + 1


# --- NonMaxSuppression --------------------------------------------------------------------------------------

_NMS_INPUTS = ("boxes", "scores", "max_output_boxes_per_class", "iou_threshold", "score_threshold")


@converts("NonMaxSuppression")
def _non_max_suppression(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """The int64 [num_selected, 3] (batch, class, box) indices that greedy non-maximum suppression selects,
    folded from constant inputs as onnxruntime (and ONNX's reference evaluator) computes them in float32:
    per batch and class, the boxes scoring above score_threshold (when given) by descending score, the
    lower index first on ties, each kept unless its IoU with a kept box exceeds iou_threshold, up to
    max_output_boxes_per_class (0 when absent)."""
    data = []
    for i, what in enumerate(_NMS_INPUTS):
        v = n.input(i)
        if v is not None and not v.is_constant:
            raise cv.run_time_value_error(
                n, i, what, "the output's shape, [number of selected boxes, 3], depends on its value"
            )
        data.append(None if v is None else np.asarray(v.data))
    boxes, scores, limit, iou, threshold = data
    if boxes.dtype != np.float32 or scores.dtype != np.float32:
        raise cv.fail(f"boxes and scores must be float32, got {boxes.dtype} and {scores.dtype}")
    if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3 or scores.shape[::2] != boxes.shape[:2]:
        raise cv.fail(
            f"boxes must be [batches, boxes, 4] and scores [batches, classes, boxes], got {list(boxes.shape)} "
            f"and {list(scores.shape)}"
        )
    center = n.attr("center_point_box", 0)
    if center not in (0, 1):
        raise cv.fail(f"center_point_box must be 0 or 1, got {center}")
    if np.isnan(boxes).any() or np.isnan(scores).any():
        raise cv.fail("boxes or scores hold NaN, which has no order among scores and no defined overlap")
    limit = max(int(limit.reshape(-1)[0]), 0) if limit is not None and limit.size else 0
    iou = np.float32(iou.reshape(-1)[0]) if iou is not None and iou.size else np.float32(0)
    if not 0 <= iou <= 1:  # onnxruntime refuses the model too
        raise cv.fail(f"iou_threshold must be in [0, 1], got {iou}")
    threshold = threshold.reshape(-1)[:1] if threshold is not None and threshold.size else None
    selected = []
    for b in range(boxes.shape[0]):
        extent = _box_extent(boxes[b], center)
        for c in range(scores.shape[1]):
            score = scores[b, c]
            candidates = np.arange(score.size) if threshold is None else np.flatnonzero(score > threshold[0])
            order = candidates[np.lexsort((candidates, -score[candidates]))]  # score down, index up
            kept: list[int] = []
            for box in order:
                if len(kept) >= limit:
                    break
                if not kept or not _suppressed(extent, int(box), np.array(kept), iou).any():
                    kept.append(int(box))
            selected += [(b, c, box) for box in kept]
    found = np.array(selected, np.int64).reshape(len(selected), 3)
    return [cv.constant(found, "selected_indices", out=n.outputs[0])]


def _box_extent(boxes: np.ndarray, center: int) -> tuple[np.ndarray, ...]:
    """(x_min, x_max, y_min, y_max, area) of float32 boxes [n, 4]: [y1, x1, y2, x2] of any two opposite
    corners (center_point_box 0) or [x_center, y_center, width, height] (1), in onnxruntime's float32 steps."""
    if center == 0:
        x_min, x_max = np.minimum(boxes[:, 1], boxes[:, 3]), np.maximum(boxes[:, 1], boxes[:, 3])
        y_min, y_max = np.minimum(boxes[:, 0], boxes[:, 2]), np.maximum(boxes[:, 0], boxes[:, 2])
    else:
        half_w, half_h = boxes[:, 2] / np.float32(2), boxes[:, 3] / np.float32(2)
        x_min, x_max = boxes[:, 0] - half_w, boxes[:, 0] + half_w
        y_min, y_max = boxes[:, 1] - half_h, boxes[:, 1] + half_h
    return x_min, x_max, y_min, y_max, (x_max - x_min) * (y_max - y_min)


def _suppressed(extent: tuple[np.ndarray, ...], box: int, kept: np.ndarray, iou: np.float32) -> np.ndarray:
    """Whether box `box` overlaps each kept box by an IoU above `iou` (onnxruntime's SuppressByIOU: boxes
    that do not intersect, or of no area, never suppress)."""
    x_min, x_max, y_min, y_max, area = extent
    ix = np.minimum(x_max[box], x_max[kept]) - np.maximum(x_min[box], x_min[kept])
    iy = np.minimum(y_max[box], y_max[kept]) - np.maximum(y_min[box], y_min[kept])
    inter = ix * iy
    union = area[box] + area[kept] - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = inter / union
    meets = (ix > 0) & (iy > 0) & (inter > 0) & (area[box] > 0) & (area[kept] > 0) & (union > 0)
    return meets & (ratio > iou)
