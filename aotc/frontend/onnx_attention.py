"""ONNX frontend: Attention-family operators (Attention, RotaryEmbedding and the newer sequence-model operators).

Each operator is decomposed into existing graph ops (matmul, softmax, elementwise, reshape, transpose,
concat, strided_slice, take), following ONNX's reference implementation (onnx/reference/ops) step by step
where its numerics are defined there: the scale split as sqrt(scale) on Q and on K, the additive bias of
0 / -inf, the fully-masked-row guard decided on that bias.
"""

from __future__ import annotations

import numpy as np
import onnx

from aotc.frontend.onnx import OnnxConverter, OnnxNode, converts
from aotc.graph.ir import Value
from aotc.topi.elemwise import broadcast_shape

VERSIONS: dict[str, tuple[int, ...]] = {
    # 23: the causal mask aligned bottom-right, to the past length, and a fully masked query row zero (23's
    #     text as errata-corrected in place, which the reference and backend tests follow); a mask shorter
    #     than the total length is not defined by 23: padded as 24 says (ONNX's reference does so for 23).
    # 24: nonpad_kv_seqlen (the external cache: padding mask, causal offset nonpad - q length per batch),
    #     a mask shorter than the total length padded with -inf / False.
    # 25: left_window_size / right_window_size; q_num_heads / kv_num_heads are invalid on 4-D inputs.
    "Attention": (23, 24, 25),
    "RotaryEmbedding": (23,),
    "SwiGLU": (28,),
    "CausalConvWithState": (27,),
    "LinearAttention": (27,),
}
"""ONNX operator -> the versions of it that this module converts (merged into aotc.frontend.onnx.VERSIONS)."""

_FLOATS = ("float16", "float32", "float64")
_SOFTMAX_PRECISIONS = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.DOUBLE: "float64",
}


def _cut(cv: OnnxConverter, x: Value, axis: int, start: int, stop: int, step: int = 1) -> Value:
    """x[..., start:stop:step, ...] along `axis` (nonempty)."""
    shape = x.type.shape
    if (start, stop, step) == (0, shape[axis], 1):
        return x
    begin, end, strides = [0] * len(shape), list(shape), [1] * len(shape)
    begin[axis], end[axis], strides[axis] = start, stop, step
    return cv.emit(
        "strided_slice", [x], {"begin": tuple(begin), "end": tuple(end), "strides": tuple(strides)}
    )


def _reshape(cv: OnnxConverter, x: Value, shape: tuple[int, ...]) -> Value:
    return x if x.type.shape == tuple(shape) else cv.emit("reshape", [x], {"shape": tuple(shape)})


def _cast(cv: OnnxConverter, x: Value, dtype: str) -> Value:
    return x if x.type.dtype == dtype else cv.emit("cast", [x], {"dtype": dtype})


def _fill(cv: OnnxConverter, value: float, shape: tuple[int, ...], dtype: str, hint: str) -> Value:
    return cv.constant(np.full(shape, value, dtype), hint)


# --- Attention -----------------------------------------------------------------------------------------------


def _split_heads(cv: OnnxConverter, x: Value, heads: int, what: str) -> Value:
    """A 3-D [batch, seq, heads * size] operand as [batch, heads, seq, size]."""
    b, s, hidden = x.type.shape
    if heads <= 0 or hidden % heads:
        raise cv.fail(f"{what} {x.type}: hidden size {hidden} is not a multiple of {heads} heads")
    return cv.emit("transpose", [_reshape(cv, x, (b, s, heads, hidden // heads))], {"perm": (0, 2, 1, 3)})


def _attention_operands(cv: OnnxConverter, n: OnnxNode) -> tuple[Value, Value, Value]:
    """Q, K, V as 4-D [batch, heads, seq, head size], checked against each other."""
    q, k, v = n.inputs[:3]
    dtype = q.type.dtype
    if dtype not in _FLOATS:
        raise cv.fail(f"Q of type {dtype}; Attention is defined on float16/32/64 (bfloat16 is not supported)")
    if k.type.dtype != dtype or v.type.dtype != dtype:
        raise cv.fail(f"Q, K and V of types {dtype}, {k.type.dtype}, {v.type.dtype}: aotc needs one type")
    rank = len(q.type.shape)
    if rank not in (3, 4) or len(k.type.shape) != rank or len(v.type.shape) != rank:
        raise cv.fail(f"Q {q.type}, K {k.type} and V {v.type} must all be 3-D or all 4-D")
    q_heads, kv_heads = n.attr("q_num_heads"), n.attr("kv_num_heads")
    if rank == 3:
        if q_heads is None or kv_heads is None:
            raise cv.fail("3-D inputs need both q_num_heads and kv_num_heads")
        q, k, v = (
            _split_heads(cv, q, q_heads, "Q"),
            _split_heads(cv, k, kv_heads, "K"),
            _split_heads(cv, v, kv_heads, "V"),
        )
    elif q_heads is not None or kv_heads is not None:
        if not n.older_than(25):
            raise cv.fail_version("q_num_heads and kv_num_heads must not be given for 4-D inputs")
        if (q_heads or q.type.shape[1], kv_heads or k.type.shape[1]) != (q.type.shape[1], k.type.shape[1]):
            raise cv.fail(
                f"q_num_heads={q_heads} and kv_num_heads={kv_heads} contradict the 4-D inputs Q {q.type} and K {k.type}"
            )
    (bq, hq, _, dq), (bk, hk, sk, dk), (bv, hv, sv, _) = q.type.shape, k.type.shape, v.type.shape
    if not bq == bk == bv or hk != hv or sk != sv or dq != dk:
        raise cv.fail(
            f"Q {q.type}, K {k.type} and V {v.type} (as [batch, heads, seq, head size]) disagree: they need one "
            "batch, K and V one head count and length, Q and K one head size"
        )
    if hq % hk:
        raise cv.fail(f"{hq} query heads are not a multiple of {hk} key/value heads")
    return q, k, v


def _with_past(cv: OnnxConverter, n: OnnxNode, x: Value, i: int, what: str) -> Value:
    """K or V after its past (input i), concatenated along the sequence."""
    past = n.input(i)
    if past is None:
        return x
    s = x.type.shape
    if (
        past.type.dtype != x.type.dtype
        or len(past.type.shape) != 4
        or past.type.shape[:2] + past.type.shape[3:] != s[:2] + s[3:]
    ):
        raise cv.fail(
            f"{what} {past.type} does not match the incoming {x.type} ([batch, heads, seq, head size])"
        )
    return cv.emit("concat", [past, x], {"axis": 2})


def _attention_bias(
    cv: OnnxConverter, n: OnnxNode, dtype: str, batch: int, heads: int, q_len: int, total: int, past: int
) -> Value | None:
    """The additive bias [..., q_len, total] of 0 / -inf (and a float mask's values): mask, causal frontier,
    sliding window and padding composed as ONNX's reference does, or None when nothing is masked."""
    mask, nonpad = n.input(3), n.input(6)
    allowed: list[Value] = []
    float_mask = None
    if mask is not None:
        mask = _padded_mask(cv, mask, dtype, (batch, heads, q_len, total))
        if mask.type.dtype == "bool":
            allowed.append(mask)
        else:
            float_mask = mask
    causal = bool(n.attr("is_causal", 0))
    left, right = n.attr("left_window_size", -1), n.attr("right_window_size", -1)
    if left < -1 or right < -1:
        raise cv.fail(f"left_window_size {left} and right_window_size {right} must be -1 or nonnegative")
    i = np.arange(q_len, dtype=np.int64)[:, None]
    j = np.arange(total, dtype=np.int64)[None, :]
    if nonpad is None:
        # the causal offset is the past length (0 without one): query i attends keys j <= i + offset. (ONNX's
        # reference takes the query count from the mask's shape, so a mask broadcast over the queries gets
        # query 0's frontier on every row; aotc follows the spec and the function body.)
        static = np.ones((q_len, total), bool)
        if causal:
            static &= j <= i + past
        if left >= 0:
            static &= (i + past) - j <= left
        if right >= 0:
            static &= j - (i + past) <= right
        if not static.all():
            allowed.append(cv.constant(static, "frontier"))
    else:
        # an external cache: per batch, offset = nonpad - q_len and keys from nonpad on are padding
        if n.input(4) is not None:
            raise cv.fail("nonpad_kv_seqlen cannot be combined with past_key / past_value")
        if nonpad.type.dtype != "int64" or nonpad.type.shape != (batch,):
            raise cv.fail(f"nonpad_kv_seqlen {nonpad.type} must be int64[{batch}] (one length per batch)")
        lengths = _reshape(cv, nonpad, (batch, 1, 1, 1))
        allowed.append(cv.emit("less", [cv.constant(j, "key_index"), lengths]))
        # diff = (i + offset) - j = i - j - q_len + nonpad
        diff = cv.emit("add", [cv.constant(i - j - q_len, "diff"), lengths])
        zero = cv.constant(np.int64(0), "zero")
        if causal:
            allowed.append(cv.emit("greater_equal", [diff, zero]))
        if left >= 0:
            allowed.append(cv.emit("less_equal", [diff, cv.constant(np.int64(left), "left")]))
        if right >= 0:
            allowed.append(cv.emit("greater_equal", [diff, cv.constant(np.int64(-right), "right")]))
    bias = None
    if allowed:
        both = allowed[0]
        for a in allowed[1:]:
            both = cv.emit("logical_and", [both, a])
        zero, ninf = cv.constant(0, "zero", dtype), cv.constant(-np.inf, "neg_inf", dtype)
        bias = cv.emit("where", [both, zero, ninf])
    if float_mask is not None:
        bias = float_mask if bias is None else cv.emit("add", [bias, float_mask])
    return bias


def _padded_mask(cv: OnnxConverter, mask: Value, dtype: str, full: tuple[int, ...]) -> Value:
    """attn_mask (bool, or a float of Q's type or narrower, as Q's type) padded along its last axis to the
    total length (False / -inf, as ONNX's reference pads a shorter mask) and checked to broadcast to `full`."""
    mdtype, shape = mask.type.dtype, mask.type.shape
    if mdtype != "bool":
        if mdtype not in _FLOATS or np.dtype(mdtype).itemsize > np.dtype(dtype).itemsize:
            raise cv.fail(
                f"attn_mask of type {mdtype}: aotc takes a bool mask or a float one of Q's type {dtype} "
                "(or a narrower float)"
            )
        if mdtype != dtype:
            mask = cv.emit("cast", [mask], {"dtype": dtype})
    if not 1 <= len(shape) <= 4:
        raise cv.fail(f"attn_mask {mask.type} must have rank 1 to 4")
    total = full[-1]
    if shape[-1] > total or (shape[-1] == 1 and total > 1):
        # a last axis of 1 would broadcast by the spec of 23 but be padded by 24's and the reference
        raise cv.fail(
            f"attn_mask {mask.type}: its last axis must be the total sequence length {total} (or shorter, above 1)"
        )
    if shape[-1] < total:
        fill = False if mdtype == "bool" else -np.inf
        pad = _fill(cv, fill, (*shape[:-1], total - shape[-1]), mask.type.dtype, "mask_pad")
        mask = cv.emit("concat", [mask, pad], {"axis": len(shape) - 1})
    try:
        fits = broadcast_shape(mask.type.shape, full) == full
    except ValueError:
        fits = False
    if not fits:
        raise cv.fail(
            f"attn_mask {mask.type} does not broadcast to [batch, q heads, q length, total length] {list(full)}"
        )
    return mask


def _softmax_last(cv: OnnxConverter, x: Value) -> Value:
    """Softmax over the last axis; on float16 step by step, each a float16 tensor (the sum accumulated in
    float32), as ONNX's reference computes it on a float16 array."""
    axis = len(x.type.shape) - 1
    if x.type.dtype != "float16":
        return cv.emit("softmax", [x], {"axis": axis})
    reduced = {"axes": (axis,), "keepdims": True}
    exps = cv.emit("exp", [cv.emit("subtract", [x, cv.emit("reduce_max", [x], reduced)])])
    return cv.emit("divide", [exps, cv.emit("reduce_sum", [exps], reduced)])


@converts("Attention")
def _attention(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """softmax(Q K^T * scale (softcapped) + bias) V, by heads; K and V repeated for grouped-query heads by
    folding the query heads of one key/value head into its query rows."""
    q, k, v = _attention_operands(cv, n)
    dtype = q.type.dtype
    (batch, q_heads, q_len, head_size), kv_heads, v_size = q.type.shape, k.type.shape[1], v.type.shape[3]
    if (n.input(4) is None) != (n.input(5) is None):
        raise cv.fail("past_key and past_value must be given together")
    past = n.input(4).type.shape[2] if n.input(4) is not None else 0
    keys, values = _with_past(cv, n, k, 4, "past_key"), _with_past(cv, n, v, 5, "past_value")
    total = keys.type.shape[2]

    # sqrt(scale) on Q and on K, as the reference scales: in float64 for the default 1 / sqrt(head size),
    # in float32 for a given one (a float attribute, which the reference reads as a float32)
    scale = n.attr("scale")
    root = np.sqrt(1 / np.sqrt(head_size)) if scale is None else np.sqrt(np.float32(scale))
    root = cv.constant(root, "sqrt_scale", dtype)
    group = q_heads // kv_heads
    scaled_q = _reshape(cv, cv.emit("multiply", [q, root]), (batch, kv_heads, group * q_len, head_size))
    keys_t = cv.emit("transpose", [cv.emit("multiply", [keys, root])], {"perm": (0, 1, 3, 2)})
    scores = _reshape(cv, cv.emit("matmul", [scaled_q, keys_t]), (batch, q_heads, q_len, total))
    raw = scores
    softcap = n.attr("softcap", 0.0)
    work = dtype
    if softcap > 0:
        # the reference divides by the softcap as a float32 scalar, which numpy promotes float16 scores to:
        # from here on a float16 node computes in float32 up to the softmax's cast back
        work = "float32" if dtype == "float16" else dtype
        scores = _cast(cv, scores, work)
        cap = cv.constant(softcap, "softcap", work)
        scores = cv.emit("multiply", [cv.emit("tanh", [cv.emit("divide", [scores, cap])]), cap])

    bias = _attention_bias(cv, n, dtype, batch, q_heads, q_len, total, past)
    logits = scores if bias is None else cv.emit("add", [scores, _cast(cv, bias, work)])
    precision = n.attr("softmax_precision")
    wide = work
    if precision is not None:
        if precision not in _SOFTMAX_PRECISIONS:
            raise cv.fail(f"softmax_precision {precision} is not supported (1 float, 10 float16, 11 double)")
        wide = _SOFTMAX_PRECISIONS[precision]
    probs = _softmax_last(cv, _cast(cv, logits, wide))
    if bias is not None:
        # a query row whose bias is -inf everywhere attends nothing: zeros, not softmax's NaN
        axis = len(bias.type.shape) - 1
        row_max = cv.emit("reduce_max", [bias], {"axes": (axis,), "keepdims": True})
        empty = cv.emit("equal", [row_max, cv.constant(-np.inf, "neg_inf", dtype)])
        if not (empty.is_constant and not empty.data.any()):
            probs = cv.emit("where", [empty, cv.constant(0, "zero", wide), probs])
    probs = _cast(cv, probs, dtype)

    grouped = _reshape(cv, probs, (batch, kv_heads, group * q_len, total))
    y = _reshape(cv, cv.emit("matmul", [grouped, values]), (batch, q_heads, q_len, v_size))
    if len(n.inputs[0].type.shape) == 3:
        y = _reshape(cv, cv.emit("transpose", [y], {"perm": (0, 2, 1, 3)}), (batch, q_len, q_heads * v_size))
    results = [y, keys, values]
    if len(n.outputs) > 3 and n.outputs[3] in cv.used:
        results.append(_cast(cv, _qk_output(cv, n, raw, scores, logits, probs, softcap), dtype))
    return results


def _qk_output(
    cv: OnnxConverter, n: OnnxNode, raw: Value, capped: Value, logits: Value, probs: Value, softcap: float
) -> Value:
    mode = n.attr("qk_matmul_output_mode", 0)
    if mode == 0 and softcap > 0:
        # the spec's mode 0 is the raw product, ONNX's reference gives it after the softcap
        raise cv.fail(
            "qk_matmul_output_mode 0 with a softcap is ambiguous (the spec and ONNX's reference differ)"
        )
    chosen = {0: raw, 1: capped, 2: logits, 3: probs}.get(mode)
    if chosen is None:
        raise cv.fail(f"qk_matmul_output_mode {mode} is not one of 0, 1, 2, 3")
    return chosen


# --- RotaryEmbedding -----------------------------------------------------------------------------------------


@converts("RotaryEmbedding")
def _rotary_embedding(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """Rotates the first rotary_embedding_dim features of each head by the position's angles: halves
    (x1, x2) or, interleaved, even and odd features, as (cos x1 - sin x2, sin x1 + cos x2). The caches are
    gathered by position_ids at run time when those are given."""
    x, cos, sin, positions = n.inputs[0], n.inputs[1], n.inputs[2], n.input(3)
    dtype, shape = x.type.dtype, x.type.shape
    if dtype not in ("float16", "float32"):
        raise cv.fail(
            f"X of type {dtype}; RotaryEmbedding is defined on float16/32 (bfloat16 is not supported)"
        )
    if cos.type.dtype != dtype or sin.type.dtype != dtype:
        raise cv.fail(f"cos_cache {cos.type} and sin_cache {sin.type} must have X's type {dtype}")
    heads = n.attr("num_heads", 0)
    if len(shape) == 3:
        if heads <= 0 or shape[2] % heads:
            raise cv.fail(f"a 3-D X {x.type} needs num_heads dividing its hidden size, got {heads}")
        batch, seq = shape[:2]
        x4 = _reshape(cv, x, (batch, seq, heads, shape[2] // heads))  # [batch, seq, heads, size]
    elif len(shape) == 4:
        if heads and heads != shape[1]:
            raise cv.fail(f"num_heads={heads} contradicts the 4-D X {x.type} ([batch, heads, seq, size])")
        batch, seq = shape[0], shape[2]
        x4 = x  # [batch, heads, seq, size]
    else:
        raise cv.fail(f"X {x.type} must be 3-D or 4-D")
    size = x4.type.shape[3]
    dim = n.attr("rotary_embedding_dim", 0) or size
    if dim % 2 or not 0 < dim <= size:
        raise cv.fail(f"rotary_embedding_dim {dim} must be even and at most the head size {size}")
    half = dim // 2
    if positions is not None:
        if positions.type.dtype != "int64" or len(positions.type.shape) != 2 or len(cos.type.shape) != 2:
            raise cv.fail(
                f"position_ids {positions.type} must be int64 [batch, seq] and the caches 2-D, got {cos.type}"
            )
        cos = cv.emit("take", [cos, positions], {"axis": 0})
        sin = cv.emit("take", [sin, positions], {"axis": 0})
    for cache in (cos, sin):
        ok = len(cache.type.shape) == 3 and cache.type.shape[2] == half
        try:
            ok = ok and broadcast_shape(cache.type.shape, (batch, seq, half)) == (batch, seq, half)
        except ValueError:
            ok = False
        if not ok:
            raise cv.fail(
                f"the cos/sin values {cache.type} must be [{batch}, {seq}, {half}] (rotary dim / 2)"
            )
    # the caches broadcast over the heads: [batch, seq, 1, half] or [batch, 1, seq, half]
    axis = 2 if len(shape) == 3 else 1
    cos, sin = (_reshape(cv, c, (*c.type.shape[:axis], 1, *c.type.shape[axis:])) for c in (cos, sin))

    last = 3
    rotated = _cut(cv, x4, last, 0, dim)
    if n.attr("interleaved", 0):
        x1, x2 = _cut(cv, rotated, last, 0, dim, 2), _cut(cv, rotated, last, 1, dim, 2)
    else:
        x1, x2 = _cut(cv, rotated, last, 0, half), _cut(cv, rotated, last, half, dim)
    real = cv.emit("subtract", [cv.emit("multiply", [cos, x1]), cv.emit("multiply", [sin, x2])])
    imag = cv.emit("add", [cv.emit("multiply", [sin, x1]), cv.emit("multiply", [cos, x2])])
    if n.attr("interleaved", 0):
        pairs = [_reshape(cv, p, (*p.type.shape, 1)) for p in (real, imag)]
        out = _reshape(cv, cv.emit("concat", pairs, {"axis": 4}), rotated.type.shape)
    else:
        out = cv.emit("concat", [real, imag], {"axis": last})
    if dim < size:
        out = cv.emit("concat", [out, _cut(cv, x4, last, dim, size)], {"axis": last})
    return [_reshape(cv, out, shape)]


# --- gated activations and causal convolution ----------------------------------------------------------------


@converts("SwiGLU")
def _swiglu(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """Swish_alpha(A) * B = A * sigmoid(alpha * A) * B, on inputs of one shape (no broadcasting)."""
    a, b = n.inputs[:2]
    if a.type != b.type or a.type.dtype not in _FLOATS:
        raise cv.fail(f"A {a.type} and B {b.type} must be float tensors of one type and shape")
    alpha = n.attr("alpha", 1.0)
    gate = a if alpha == 1.0 else cv.emit("multiply", [a, cv.constant(alpha, "alpha", a.type.dtype)])
    swish = cv.emit("multiply", [a, cv.emit("sigmoid", [gate])])
    return [cv.emit("multiply", [swish, b], out=n.outputs[0])]


@converts("CausalConvWithState")
def _causal_conv_with_state(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """A depthwise 1-D convolution over [past_state (zeros if absent), input] with no padding, so each
    output position sees itself and the k - 1 before it; present_state is the last k - 1 positions of that
    concatenation. activation silu / swish: x * sigmoid(x) in float32, rounded once."""
    x, weight, bias, past = n.inputs[0], n.inputs[1], n.input(2), n.input(3)
    dtype = x.type.dtype
    if len(x.type.shape) != 3 or len(weight.type.shape) != 3:
        raise cv.fail(
            f"input {x.type} and weight {weight.type} must be 3-D ([batch, channels, length], [channels, 1, k])"
        )
    (batch, channels, length), k = x.type.shape, weight.type.shape[2]
    if weight.type.shape[:2] != (channels, 1) or weight.type.dtype != dtype:
        raise cv.fail(f"weight {weight.type} must be {dtype}[{channels}, 1, k] for input {x.type}")
    if bias is not None and (bias.type.shape != (channels,) or bias.type.dtype != dtype):
        raise cv.fail(f"bias {bias.type} must be {dtype}[{channels}]")
    activation = n.attr("activation", "none")
    if activation not in ("none", "silu", "swish"):
        raise cv.fail(f"activation {activation!r} is not one of none, silu, swish")
    state = (batch, channels, k - 1)
    if past is not None and (past.type.shape != state or past.type.dtype != dtype):
        raise cv.fail(f"past_state {past.type} must be {dtype}{list(state)}")
    if k > 1:
        pad = past if past is not None else cv.constant(np.zeros(state, dtype), "zero_state")
        padded = cv.emit("concat", [pad, x], {"axis": 2})
    else:
        padded = x
    total = padded.type.shape[2]
    lifted = _reshape(cv, padded, (batch, channels, 1, total))
    kernel = _reshape(cv, weight, (channels, 1, 1, k))
    attrs = {"strides": (1, 1), "dilations": (1, 1), "pads": (0, 0, 0, 0), "groups": channels}
    conv = cv.emit("conv2d", [lifted, kernel] + ([bias] if bias is not None else []), attrs)
    y = _reshape(cv, conv, (batch, channels, length))
    if activation != "none":
        wide = y if dtype != "float16" else cv.emit("cast", [y], {"dtype": "float32"})
        y = cv.emit("multiply", [wide, cv.emit("sigmoid", [wide])])
        if dtype == "float16":
            y = cv.emit("cast", [y], {"dtype": dtype})
    results = [y]
    if len(n.outputs) > 1 and n.outputs[1] in cv.used:
        if k == 1:  # no state to carry: an empty [batch, channels, 0]
            results.append(cv.constant(np.zeros((batch, channels, 0), dtype), "present_state"))
        else:
            results.append(_cut(cv, padded, 2, total - (k - 1), total))
    return results


# --- LinearAttention -----------------------------------------------------------------------------------------

LINEAR_ATTENTION_MAX_STEPS = 64
"""The longest sequence whose LinearAttention recurrence aotc unrolls into graph ops at build time (about
ten ops a step): the delta rules and a decay per key feature; the others have a closed form."""


def _step(cv: OnnxConverter, x: Value, t: int, shape: tuple[int, ...]) -> Value:
    """Step t of a [batch, T, ...] sequence, reshaped to `shape`."""
    return _reshape(cv, _cut(cv, x, 1, t, t + 1), shape)


@converts("LinearAttention")
def _linear_attention(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """The recurrence of ONNX's reference, in float32: per step the state [batch, kv heads, d_k, d_v] is
    decayed by exp(decay) (gated rules), corrected by beta * (v - S^T k) (delta rules), grows by k v^T, and
    is read by the query heads it serves; unrolled over the (static) sequence, or in closed form where
    there is one."""
    query, key, value, past, decay, beta = (n.input(i) for i in range(6))
    dtype = query.type.dtype
    rule = n.attr("update_rule", "gated_delta")
    if rule not in ("linear", "gated", "delta", "gated_delta"):
        raise cv.fail(f"update_rule {rule!r} is not one of linear, gated, delta, gated_delta")
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if gated != (decay is not None) or delta != (beta is not None):
        raise cv.fail(
            f"update_rule {rule!r} takes {'a' if gated else 'no'} decay and {'a' if delta else 'no'} beta input"
        )
    q_heads, kv_heads = n.attr("q_num_heads"), n.attr("kv_num_heads")
    if q_heads is None or kv_heads is None or kv_heads <= 0 or q_heads <= 0 or q_heads % kv_heads:
        raise cv.fail(f"q_num_heads {q_heads} must be a positive multiple of kv_num_heads {kv_heads}")
    if dtype not in ("float16", "float32"):
        raise cv.fail(
            f"query of type {dtype}; LinearAttention is defined on float16/32 (bfloat16 is not supported)"
        )
    operands = [v for v in (query, key, value, decay, beta) if v is not None]
    if any(len(v.type.shape) != 3 or v.type.dtype != dtype for v in operands):
        raise cv.fail(
            f"query, key, value, decay and beta must be 3-D [batch, T, ...] tensors of type {dtype}"
        )
    (batch, steps, q_hidden), group = query.type.shape, q_heads // kv_heads
    if q_hidden % q_heads or key.type.shape[2] % kv_heads or value.type.shape[2] % kv_heads:
        raise cv.fail(f"hidden sizes {query.type}, {key.type}, {value.type} do not split into the heads")
    d_k, d_v = q_hidden // q_heads, value.type.shape[2] // kv_heads
    if key.type.shape != (batch, steps, kv_heads * d_k) or value.type.shape[:2] != (batch, steps):
        raise cv.fail(f"key {key.type} and value {value.type} do not match query {query.type}")
    if decay is not None and decay.type.shape not in (
        (batch, steps, kv_heads),
        (batch, steps, kv_heads * d_k),
    ):
        raise cv.fail(f"decay {decay.type} must be [{batch}, {steps}, {kv_heads}] or [.., {kv_heads * d_k}]")
    if beta is not None and beta.type.shape not in ((batch, steps, kv_heads), (batch, steps, 1)):
        raise cv.fail(f"beta {beta.type} must be [{batch}, {steps}, {kv_heads}] or [.., 1]")
    state_shape = (batch, kv_heads, d_k, d_v)
    if past is not None and (past.type.shape != state_shape or past.type.dtype not in ("float16", "float32")):
        raise cv.fail(f"past_state {past.type} must be float16/32{list(state_shape)}")

    def wide(v: Value | None) -> Value | None:
        return v if v is None or v.type.dtype == "float32" else _cast(cv, v, "float32")

    query, key, value, beta, state, decay = (wide(v) for v in (query, key, value, beta, past, decay))
    scale = n.attr("scale", 0.0) or 1 / np.sqrt(d_k)
    dims = (batch, steps, kv_heads, group, d_k, d_v)
    if not delta and (decay is None or decay.type.shape[2] == kv_heads):
        out, state = _parallel_linear_attention(cv, query, key, value, state, decay, dims)
    else:
        if steps > LINEAR_ATTENTION_MAX_STEPS:
            raise cv.fail(
                f"a sequence of {steps} steps: aotc unrolls the recurrence of the delta rules and of a decay per "
                f"key feature, up to {LINEAR_ATTENTION_MAX_STEPS} steps"
            )
        out, state = _unrolled_linear_attention(cv, query, key, value, state, decay, beta, dims)
    out = cv.emit("multiply", [out, cv.constant(scale, "scale", "float32")])
    state_dtype = past.type.dtype if past is not None else dtype
    return [_cast(cv, out, dtype), _cast(cv, state, state_dtype)]


def _unrolled_linear_attention(
    cv: OnnxConverter,
    query: Value,
    key: Value,
    value: Value,
    state: Value | None,
    decay: Value | None,
    beta: Value | None,
    dims: tuple[int, ...],
) -> tuple[Value, Value]:
    """The recurrence step by step: the output [batch, T, q heads * d_v] (unscaled) and the last state."""
    batch, steps, kv_heads, group, d_k, d_v = dims
    gates = cv.emit("exp", [decay]) if decay is not None else None
    reads = []
    for t in range(steps):
        k_t, v_t = (
            _step(cv, key, t, (batch, kv_heads, 1, d_k)),
            _step(cv, value, t, (batch, kv_heads, 1, d_v)),
        )
        if gates is not None and state is not None:
            per_key = gates.type.shape[2] // kv_heads
            state = cv.emit("multiply", [state, _step(cv, gates, t, (batch, kv_heads, per_key, 1))])
        if beta is not None:
            if state is not None:
                v_t = cv.emit("subtract", [v_t, cv.emit("matmul", [k_t, state])])
            v_t = cv.emit("multiply", [_step(cv, beta, t, (batch, beta.type.shape[2], 1, 1)), v_t])
        outer = cv.emit("multiply", [_reshape(cv, k_t, (batch, kv_heads, d_k, 1)), v_t])
        state = outer if state is None else cv.emit("add", [state, outer])
        q_t = _step(cv, query, t, (batch, kv_heads, group, d_k))
        reads.append(_reshape(cv, cv.emit("matmul", [q_t, state]), (batch, 1, kv_heads * group * d_v)))
    return (reads[0] if len(reads) == 1 else cv.emit("concat", reads, {"axis": 1})), state


def _parallel_linear_attention(
    cv: OnnxConverter,
    query: Value,
    key: Value,
    value: Value,
    state: Value | None,
    decay: Value | None,
    dims: tuple[int, ...],
) -> tuple[Value, Value]:
    """The linear and gated rules (a decay per head) in closed form, for any length: with G the running
    sum of the decay (0 without one), o_t = exp(G_t) q_t S_0 + sum over s <= t of exp(G_t - G_s) (q_t . k_s)
    v_s, and S_T = exp(G_T) S_0 + sum over s of exp(G_T - G_s) k_s v_s^T."""
    batch, steps, kv_heads, group, d_k, d_v = dims
    heads = cv.emit(
        "transpose", [_reshape(cv, query, (batch, steps, kv_heads, group, d_k))], {"perm": (0, 2, 3, 1, 4)}
    )
    q = _reshape(cv, heads, (batch, kv_heads, group * steps, d_k))
    k_t = cv.emit("transpose", [_reshape(cv, key, (batch, steps, kv_heads, d_k))], {"perm": (0, 2, 3, 1)})
    v = cv.emit("transpose", [_reshape(cv, value, (batch, steps, kv_heads, d_v))], {"perm": (0, 2, 1, 3)})
    scores = _reshape(cv, cv.emit("matmul", [q, k_t]), (batch, kv_heads, group, steps, steps))
    causal = cv.constant(np.tril(np.ones((steps, steps), bool)), "causal")
    if decay is None:
        weights = cv.emit("where", [causal, scores, cv.constant(0, "zero", "float32")])
    else:
        total = cv.emit("cumsum", [cv.emit("transpose", [decay], {"perm": (0, 2, 1)})], {"axis": 2})
        rows, cols = (_reshape(cv, total, (batch, kv_heads, *s)) for s in ((steps, 1), (1, steps)))
        gaps = cv.emit(
            "where", [causal, cv.emit("subtract", [rows, cols]), cv.constant(-np.inf, "neg_inf", "float32")]
        )
        factors = _reshape(cv, cv.emit("exp", [gaps]), (batch, kv_heads, 1, steps, steps))
        weights = cv.emit("multiply", [scores, factors])
    out = cv.emit("matmul", [_reshape(cv, weights, (batch, kv_heads, group * steps, steps)), v])
    if state is not None:
        from_past = cv.emit("matmul", [q, state])
        if decay is not None:
            grown = _reshape(cv, cv.emit("exp", [total]), (batch, kv_heads, 1, steps, 1))
            from_past = cv.emit(
                "multiply", [_reshape(cv, from_past, (batch, kv_heads, group, steps, d_v)), grown]
            )
            from_past = _reshape(cv, from_past, (batch, kv_heads, group * steps, d_v))
        out = cv.emit("add", [out, from_past])
    if decay is None:
        added = cv.emit("matmul", [k_t, v])
    else:
        last = _cut(cv, total, 2, steps - 1, steps)
        since = _reshape(
            cv, cv.emit("exp", [cv.emit("subtract", [last, total])]), (batch, kv_heads, 1, steps)
        )
        added = cv.emit("matmul", [cv.emit("multiply", [k_t, since]), v])
        if state is not None:
            state = cv.emit(
                "multiply", [state, _reshape(cv, cv.emit("exp", [last]), (batch, kv_heads, 1, 1))]
            )
    state = added if state is None else cv.emit("add", [state, added])
    out = cv.emit(
        "transpose", [_reshape(cv, out, (batch, kv_heads, group, steps, d_v))], {"perm": (0, 3, 1, 2, 4)}
    )
    return _reshape(cv, out, (batch, steps, kv_heads * group * d_v)), state


# --- FlexAttention (ai.onnx.preview) -------------------------------------------------------------------------

FLEX_ATTENTION_ATTRIBUTES = ("scale", "score_mod", "prob_mod", "softmax_precision")
"""The attributes of ai.onnx.preview FlexAttention-1, the one version onnx 1.23 defines (nodes of other
domains skip the frontend's schema check of attributes)."""


def _modifier(cv: OnnxConverter, n: OnnxNode, name: str, x: Value) -> Value:
    """`x` through subgraph attribute `name` (score_mod, prob_mod): one input, one output of its shape and
    type, converted in place."""
    graph = n.attr(name)
    if graph is None:
        return x
    if not isinstance(graph, onnx.GraphProto) or len(graph.input) != 1 or len(graph.output) != 1:
        raise cv.fail(f"{name} must be a graph of one input and one output")
    (y,) = cv.convert_subgraph(graph, [x], name)
    if y.type != x.type:
        raise cv.fail(f"{name} returns {y.type}; it must keep its input's {x.type}")
    return y


@converts("ai.onnx.preview.FlexAttention")
def _flex_attention(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """softmax(score_mod(Q K^T * scale)), through prob_mod, times V, as ONNX's reference computes it: the
    scale as sqrt(scale) on Q and on K (taken in float32), the scores in Q's type, then softmax and the
    product with V in the softmax precision (float32 for float16 inputs), the result in V's type."""
    unknown = sorted(set(n.attrs) - set(FLEX_ATTENTION_ATTRIBUTES))
    if unknown:
        raise cv.fail(f"attribute {', '.join(unknown)} is not defined for FlexAttention-1")
    q, k, v = n.inputs[:3]
    dtype = q.type.dtype
    if dtype not in _FLOATS or k.type.dtype != dtype or v.type.dtype != dtype:
        raise cv.fail(
            f"Q, K and V of types {dtype}, {k.type.dtype}, {v.type.dtype}: aotc needs one of float16/32/64"
        )
    if any(len(x.type.shape) != 4 for x in (q, k, v)):
        raise cv.fail(f"Q {q.type}, K {k.type} and V {v.type} must be 4-D")
    (batch, q_heads, q_len, size), (bk, kv_heads, kv_len, k_size), (bv, v_heads, v_len, v_size) = (
        q.type.shape,
        k.type.shape,
        v.type.shape,
    )
    if (
        not batch == bk == bv
        or kv_heads != v_heads
        or kv_len != v_len
        or size != k_size
        or q_heads % kv_heads
    ):
        raise cv.fail(
            f"Q {q.type}, K {k.type} and V {v.type} disagree: one batch, K and V one head count and length, Q "
            "and K one head size, and query heads a multiple of key/value heads"
        )
    precision = n.attr("softmax_precision")
    if precision is None:
        wide = "float64" if dtype == "float64" else "float32"
    elif precision in _SOFTMAX_PRECISIONS:
        wide = _SOFTMAX_PRECISIONS[precision]
    else:
        raise cv.fail(f"softmax_precision {precision} is not supported (1 float, 10 float16, 11 double)")
    scale = n.attr("scale")
    scale = 1.0 / np.sqrt(size) if scale is None else scale
    root = cv.constant(np.sqrt(np.float32(scale)), "sqrt_scale", dtype)
    group = q_heads // kv_heads
    scaled_q = _reshape(cv, cv.emit("multiply", [q, root]), (batch, kv_heads, group * q_len, size))
    keys_t = cv.emit("transpose", [cv.emit("multiply", [k, root])], {"perm": (0, 1, 3, 2)})
    scores = _reshape(cv, cv.emit("matmul", [scaled_q, keys_t]), (batch, q_heads, q_len, kv_len))
    if wide != dtype:
        scores = cv.emit("cast", [scores], {"dtype": wide})
    scores = _modifier(cv, n, "score_mod", scores)
    probs = _modifier(cv, n, "prob_mod", _softmax_last(cv, scores))
    values = v if wide == dtype else cv.emit("cast", [v], {"dtype": wide})
    grouped = _reshape(cv, probs, (batch, kv_heads, group * q_len, kv_len))
    y = _reshape(cv, cv.emit("matmul", [grouped, values]), (batch, q_heads, q_len, v_size))
    return [y if wide == dtype else cv.emit("cast", [y], {"dtype": dtype})]
