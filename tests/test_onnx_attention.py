"""The attention-family ONNX operators (aotc.frontend.onnx_attention) against ONNX's reference
implementation (onnx.reference, from which the backend tests' expected outputs come) and, for the plain
cases, onnxruntime: each model is imported and run op by op with aotc's graph interpreter."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

from aotc.frontend.errors import ConversionError, UnsupportedOpsetError
from aotc.frontend.onnx import load_onnx
from aotc.graph.interpret import run_graph

from .onnx_util import Input, check_model, make_graph_model, random_feeds

TOL = {"float32": (1e-5, 1e-6), "float16": (2e-3, 2e-3), "float64": (1e-12, 1e-12)}
"""(rtol, atol) against the reference: float32 products summed in another order, float16 rounding."""


def model(op: str, inputs: dict[str, Input], outputs: list[str], opset: int, names=None, **attrs):
    """One `op` node over `inputs` (names: the node's input list, "" for an omitted optional one)."""
    node = helper.make_node(op, names or list(inputs), outputs, name="node", **attrs)
    return make_graph_model([node], inputs, [o for o in outputs if o], opset=opset)


def check_reference(m: onnx.ModelProto, feeds: dict, dtype: str = "float32") -> None:
    """aotc's import of `m` run by the graph interpreter equals ONNX's reference on `feeds`."""
    expected = ReferenceEvaluator(m).run(None, feeds)
    got = run_graph(load_onnx(m.SerializeToString()), feeds)
    rtol, atol = TOL[dtype]
    for out, ref in zip(m.graph.output, expected):
        value = got[out.name]
        assert value.shape == ref.shape and value.dtype == ref.dtype, (out.name, value.shape, ref.shape)
        np.testing.assert_allclose(value, ref, rtol=rtol, atol=atol, err_msg=out.name)


def qkv(batch, q_heads, kv_heads, q_len, kv_len, size, v_size=None, dtype="float32", rank=4):
    v_size = v_size or size
    if rank == 4:
        shapes = [
            (batch, q_heads, q_len, size),
            (batch, kv_heads, kv_len, size),
            (batch, kv_heads, kv_len, v_size),
        ]
    else:
        shapes = [
            (batch, q_len, q_heads * size),
            (batch, kv_len, kv_heads * size),
            (batch, kv_len, kv_heads * v_size),
        ]
    return {name: Input(s, dtype, 0.0, 1.0) for name, s in zip("QKV", shapes)}


def test_attention_plain_against_onnxruntime():
    inputs = qkv(2, 3, 3, 4, 5, 8)
    m = model("Attention", inputs, ["Y"], 23)
    check_model(m, random_feeds(m, inputs))


@pytest.mark.parametrize("opset", [23, 24])
def test_attention_3d_gqa_past_causal_mask_mode3(opset):
    """3-D inputs, 4 query heads over 2 key/value heads, a 2-step past (causal frontier shifted by it), a
    bool mask shorter than the total length (padded with False), all four outputs."""
    inputs = qkv(2, 4, 2, 3, 3, 4, v_size=6, rank=3)
    inputs |= {
        "attn_mask": Input((3, 4), "bool"),
        "past_key": Input((2, 2, 2, 4)),
        "past_value": Input((2, 2, 2, 6)),
    }
    outs = ["Y", "present_key", "present_value", "qk"]
    m = model(
        "Attention", inputs, outs, opset, q_num_heads=4, kv_num_heads=2, is_causal=1, qk_matmul_output_mode=3
    )
    feeds = random_feeds(m, inputs, seed=3)
    feeds["attn_mask"][0] = False  # a fully masked row: zeros in Y and in the probabilities
    check_reference(m, feeds)


def function_body_model(m: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """`m`'s one Attention node replaced by the nodes of its ONNX function body (as the _expanded tests)."""
    node = m.graph.node[0]
    types = {vi.name: vi.type for vi in m.graph.input}
    given = [types[x].SerializeToString() if x else onnx.TypeProto().SerializeToString() for x in node.input]
    body = onnx.FunctionProto()
    body.ParseFromString(
        onnx.defs.get_schema("Attention", opset).get_context_dependent_function(
            node.SerializeToString(), given
        )
    )
    graph = helper.make_graph(list(body.node), "expanded", m.graph.input, m.graph.output)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=m.ir_version)


def test_attention_causal_mask_broadcast_over_queries_follows_the_function_body():
    """A causal node whose mask broadcasts over the queries: ONNX's reference takes the query count from
    the mask (one row: query 0's frontier on every row); aotc follows the spec and the function body."""
    inputs = {
        "Q": Input((1, 2, 4, 4)),
        "K": Input((1, 2, 4, 4)),
        "V": Input((1, 2, 4, 3)),
        "attn_mask": Input((1, 4)),
    }
    m = model("Attention", inputs, ["Y"], 24, is_causal=1)
    feeds = random_feeds(m, inputs, seed=2)
    expected = ReferenceEvaluator(function_body_model(m, 24)).run(None, feeds)[0]
    got = run_graph(load_onnx(m.SerializeToString()), feeds)["Y"]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert not np.allclose(got, ReferenceEvaluator(m).run(None, feeds)[0], atol=1e-3)


@pytest.mark.parametrize("mode", [1, 2])
def test_attention_float_mask_softcap_scale(mode):
    inputs = qkv(1, 2, 1, 4, 6, 8) | {"attn_mask": Input((2, 4, 6))}
    m = model(
        "Attention", inputs, ["Y", "", "", "qk"], 23, softcap=1.5, scale=0.3, qk_matmul_output_mode=mode
    )
    check_reference(m, random_feeds(m, inputs, seed=mode))


def test_attention_float16_softmax_precision():
    inputs = qkv(1, 2, 2, 3, 5, 8, dtype="float16") | {"attn_mask": Input((1, 1, 3, 5), "bool")}
    m = model(
        "Attention",
        inputs,
        ["Y", "", "", "qk"],
        24,
        softmax_precision=onnx.TensorProto.FLOAT,
        qk_matmul_output_mode=3,
    )
    check_reference(m, random_feeds(m, inputs, seed=5), "float16")


def test_attention_float16_softcap_in_float32():
    """The reference divides float16 scores by a float32 softcap: the rest up to the softmax is float32."""
    inputs = qkv(1, 2, 2, 3, 5, 8, dtype="float16") | {"attn_mask": Input((3, 5), "float16")}
    m = model("Attention", inputs, ["Y", "", "", "qk"], 23, softcap=1.5, qk_matmul_output_mode=2)
    check_reference(m, random_feeds(m, inputs, seed=6), "float16")


def test_attention_nonpad_kv_seqlen_causal():
    """Attention-24's external cache: per-batch valid lengths fed at run time set the padding mask and
    the causal offset (nonpad - q length; negative: leading rows fully masked, zeros)."""
    inputs = qkv(3, 2, 2, 3, 6, 4) | {"nonpad_kv_seqlen": Input((3,), "int64")}
    names = ["Q", "K", "V", "", "", "", "nonpad_kv_seqlen"]
    m = model("Attention", inputs, ["Y"], 24, names=names, is_causal=1)
    feeds = random_feeds(m, inputs, seed=7)
    feeds["nonpad_kv_seqlen"] = np.array([6, 4, 1], np.int64)
    check_reference(m, feeds)


@pytest.mark.parametrize("left,right,causal", [(2, 0, 0), (1, 1, 0), (-1, 2, 1)])
def test_attention_25_windows(left, right, causal):
    inputs = qkv(1, 2, 2, 4, 4, 4) | {"past_key": Input((1, 2, 2, 4)), "past_value": Input((1, 2, 2, 4))}
    names = ["Q", "K", "V", "", "past_key", "past_value"]
    attrs = {"left_window_size": left, "right_window_size": right, "is_causal": causal}
    m = model("Attention", inputs, ["Y"], 25, names=names, **attrs)
    check_reference(m, random_feeds(m, inputs, seed=11))


@pytest.mark.parametrize(
    "attrs,message",
    [
        ({"softcap": 2.0}, "ambiguous"),  # mode 0 with a softcap: the spec and the reference differ
        ({"qk_matmul_output_mode": 4}, "not one of"),
        ({"q_num_heads": 2, "kv_num_heads": 2}, "must not be given for 4-D"),
    ],
)
def test_attention_refusals(attrs, message):
    m = model("Attention", qkv(1, 2, 2, 3, 3, 4), ["Y", "", "", "qk"], 25, **attrs)
    with pytest.raises(ConversionError, match=message):
        load_onnx(m.SerializeToString())


def rotary_inputs(shape, half, positions: bool, dtype="float32"):
    batch, seq = shape[0], shape[1] if len(shape) == 3 else shape[2]
    cache = (7, half) if positions else (batch, seq, half)
    inputs = {"X": Input(shape, dtype), "cos": Input(cache, dtype), "sin": Input(cache, dtype)}
    if positions:
        inputs["position_ids"] = Input((batch, seq), "int64", 0, 7)
    return inputs


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("positions", [False, True])
@pytest.mark.parametrize("rank,dim", [(4, 0), (3, 4), (4, 6)])
def test_rotary_embedding(interleaved, positions, rank, dim):
    shape = (2, 3, 5, 8) if rank == 4 else (2, 5, 3 * 8)
    attrs = {"interleaved": interleaved, "rotary_embedding_dim": dim} | (
        {"num_heads": 3} if rank == 3 else {}
    )
    inputs = rotary_inputs(shape, (dim or 8) // 2, positions)
    m = model("RotaryEmbedding", inputs, ["Y"], 23, **attrs)
    check_reference(m, random_feeds(m, inputs, seed=rank + dim))


def test_rotary_embedding_float16_against_onnxruntime():
    inputs = rotary_inputs((1, 2, 4, 8), 4, True, "float16")
    m = model("RotaryEmbedding", inputs, ["Y"], 23, interleaved=1)
    check_model(m, random_feeds(m, inputs), rtol=2e-3, atol=2e-3)


def test_rotary_embedding_refuses_odd_dim():
    m = model("RotaryEmbedding", rotary_inputs((1, 2, 4, 8), 2, False), ["Y"], 23, rotary_embedding_dim=5)
    with pytest.raises(ConversionError, match="must be even"):
        load_onnx(m.SerializeToString())


@pytest.mark.parametrize("dtype,alpha", [("float32", 1.0), ("float32", 1.702), ("float16", 0.5)])
def test_swiglu(dtype, alpha):
    inputs = {"A": Input((2, 3, 8), dtype), "B": Input((2, 3, 8), dtype)}
    m = model("SwiGLU", inputs, ["Y"], 28, alpha=alpha)
    check_reference(m, random_feeds(m, inputs), dtype)


@pytest.mark.parametrize(
    "k,length,bias,past,activation,dtype",
    [
        (4, 6, False, False, "none", "float32"),
        (4, 2, True, False, "silu", "float32"),  # shorter than the state: zeros stay in present_state
        (3, 1, True, True, "swish", "float32"),  # a decode step
        (4, 5, False, True, "silu", "float16"),
    ],
)
def test_causal_conv_with_state(k, length, bias, past, activation, dtype):
    inputs = {"input": Input((2, 3, length), dtype), "weight": Input((3, 1, k), dtype)}
    names = ["input", "weight", "bias" if bias else "", "past_state" if past else ""]
    if bias:
        inputs["bias"] = Input((3,), dtype)
    if past:
        inputs["past_state"] = Input((2, 3, k - 1), dtype)
    m = model(
        "CausalConvWithState", inputs, ["output", "present_state"], 27, names=names, activation=activation
    )
    check_reference(m, random_feeds(m, inputs, seed=k + length), dtype)


def test_causal_conv_with_state_of_a_size_1_kernel_has_an_empty_state():
    inputs = {"input": Input((1, 2, 4)), "weight": Input((2, 1, 1))}
    m = model("CausalConvWithState", inputs, ["output", "present_state"], 27)
    check_reference(m, random_feeds(m, inputs, seed=1), "float32")


@pytest.mark.parametrize(
    "rule,q_heads,kv_heads,per_key_decay,past,dtype",
    [
        ("linear", 2, 2, False, False, "float32"),
        ("gated", 2, 2, True, True, "float32"),
        ("delta", 4, 2, False, False, "float32"),
        ("gated_delta", 4, 1, False, True, "float32"),  # multi-query: one state read by 4 heads
        ("gated_delta", 2, 2, True, False, "float16"),
    ],
)
def test_linear_attention(rule, q_heads, kv_heads, per_key_decay, past, dtype):
    b, t, d_k, d_v = 2, 3, 4, 5
    inputs = {
        "query": Input((b, t, q_heads * d_k), dtype, -1.0, 1.0),
        "key": Input((b, t, kv_heads * d_k), dtype, -0.5, 0.5),
        "value": Input((b, t, kv_heads * d_v), dtype, -1.0, 1.0),
    }
    names = ["query", "key", "value", "past_state" if past else ""]
    if past:
        inputs["past_state"] = Input((b, kv_heads, d_k, d_v), "float32", -0.1, 0.1)
    if rule in ("gated", "gated_delta"):
        inputs["decay"] = Input((b, t, kv_heads * (d_k if per_key_decay else 1)), dtype, -1.0, 0.0)
    names.append("decay" if "decay" in inputs else "")
    if rule in ("delta", "gated_delta"):
        inputs["beta"] = Input((b, t, kv_heads), dtype, 0.0, 1.0)
        names.append("beta")
    m = model(
        "LinearAttention",
        inputs,
        ["output", "present_state"],
        27,
        names=names,
        update_rule=rule,
        q_num_heads=q_heads,
        kv_num_heads=kv_heads,
    )
    check_reference(m, random_feeds(m, inputs, seed=q_heads), dtype)


def test_linear_attention_refuses_missing_decay():
    inputs = {name: Input((1, 2, 8)) for name in ("query", "key", "value")}
    m = model("LinearAttention", inputs, ["output"], 27, update_rule="gated", q_num_heads=2, kv_num_heads=2)
    with pytest.raises(ConversionError, match="takes a decay"):
        load_onnx(m.SerializeToString())


def flex_model(inputs: dict[str, Input], preview: int = 1, **attrs) -> onnx.ModelProto:
    node = helper.make_node(
        "FlexAttention", list(inputs), ["Y"], name="node", domain="ai.onnx.preview", **attrs
    )
    m = make_graph_model([node], inputs, ["Y"], opset=26)
    m.opset_import.append(helper.make_opsetid("ai.onnx.preview", preview))
    return m


def score_graph(dtype: int = onnx.TensorProto.FLOAT) -> onnx.GraphProto:
    """score_mod: a causal mask (-inf above the diagonal) built from the scores' shape, plus 0.5."""
    nodes = [
        helper.make_node("Shape", ["s"], ["shape"]),
        helper.make_node("Gather", ["shape", "two"], ["rows"]),
        helper.make_node("Gather", ["shape", "three"], ["cols"]),
        helper.make_node("Range", ["zero", "rows", "one"], ["i"]),
        helper.make_node("Range", ["zero", "cols", "one"], ["j"]),
        helper.make_node("Unsqueeze", ["i", "one_axis"], ["col_i"]),
        helper.make_node("GreaterOrEqual", ["col_i", "j"], ["keep"]),
        helper.make_node("Add", ["s", "half"], ["shifted"]),
        helper.make_node("Where", ["keep", "shifted", "neg_inf"], ["out"]),
    ]
    ints = {"two": 2, "three": 3, "zero": 0, "one": 1}
    inits = [helper.make_tensor(k, onnx.TensorProto.INT64, [], [v]) for k, v in ints.items()]
    inits += [
        helper.make_tensor("one_axis", onnx.TensorProto.INT64, [1], [1]),
        helper.make_tensor("half", dtype, [], [0.5]),
        helper.make_tensor("neg_inf", dtype, [], [-np.inf]),
    ]
    io = [helper.make_tensor_value_info(x, dtype, ["B", "H", "L", "S"]) for x in ("s", "out")]
    return helper.make_graph(nodes, "score_mod", io[:1], io[1:], inits)


def prob_graph() -> onnx.GraphProto:
    io = [helper.make_tensor_value_info(x, onnx.TensorProto.FLOAT, None) for x in ("p", "out")]
    node = helper.make_node("Sqrt", ["p"], ["out"])
    return helper.make_graph([node], "prob_mod", io[:1], io[1:])


@pytest.mark.parametrize(
    "dtype,kv_heads,attrs",
    [
        ("float32", 4, {}),
        ("float32", 2, {"scale": 0.3, "score_mod": score_graph()}),
        ("float16", 1, {"score_mod": score_graph(), "prob_mod": prob_graph()}),  # mods in float32
        ("float64", 2, {"softmax_precision": onnx.TensorProto.FLOAT}),
    ],
)
def test_flex_attention(dtype, kv_heads, attrs):
    inputs = {
        "Q": Input((2, 4, 5, 8), dtype, 0.0, 1.0),
        "K": Input((2, kv_heads, 6, 8), dtype, 0.0, 1.0),
        "V": Input((2, kv_heads, 6, 3), dtype, 0.0, 1.0),
    }
    m = flex_model(inputs, **attrs)
    computed = "float32" if "softmax_precision" in attrs else dtype  # float64 in, softmax in float32
    check_reference(m, random_feeds(m, inputs, seed=kv_heads), computed)


def test_flex_attention_refusals():
    inputs = {name: Input((1, 2, 3, 4)) for name in "QKV"}
    with pytest.raises(UnsupportedOpsetError, match="ai.onnx.preview"):
        load_onnx(flex_model(inputs, preview=2).SerializeToString())
    bad = helper.make_graph(
        [helper.make_node("ReduceSum", ["s"], ["out"], keepdims=1)],
        "score_mod",
        [helper.make_tensor_value_info("s", onnx.TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, None)],
    )
    with pytest.raises(ConversionError, match="must keep its input"):
        load_onnx(flex_model(inputs, score_mod=bad).SerializeToString())


@pytest.mark.parametrize("rule,past", [("linear", False), ("linear", True), ("gated", True)])
def test_linear_attention_closed_form_beyond_the_unrolled_length(rule, past):
    """The linear and gated (a decay per head) rules in closed form, on a sequence longer than aotc
    unrolls (LINEAR_ATTENTION_MAX_STEPS); the delta rules on it are refused."""
    b, t, heads, d = 1, 80, 2, 4
    inputs = {
        "query": Input((b, t, heads * d), "float32", -1.0, 1.0),
        "key": Input((b, t, heads * d), "float32", -0.5, 0.5),
        "value": Input((b, t, heads * d), "float32", -1.0, 1.0),
    }
    if past:
        inputs["past_state"] = Input((b, heads, d, d), "float32", -0.1, 0.1)
    names = ["query", "key", "value", "past_state" if past else ""]
    if rule == "gated":
        inputs["decay"] = Input((b, t, heads), "float32", -0.2, 0.0)
        names.append("decay")
    attrs = {"update_rule": rule, "q_num_heads": heads, "kv_num_heads": heads}
    m = model("LinearAttention", inputs, ["output", "present_state"], 27, names=names, **attrs)
    feeds = random_feeds(m, inputs, seed=9)
    expected = ReferenceEvaluator(m).run(None, feeds)
    got = run_graph(load_onnx(m.SerializeToString()), feeds)
    for name, ref in zip(("output", "present_state"), expected):
        np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-5, err_msg=name)


def test_linear_attention_refuses_long_delta_rule():
    inputs = {name: Input((1, 80, 8)) for name in ("query", "key", "value")} | {"beta": Input((1, 80, 2))}
    names = ["query", "key", "value", "", "", "beta"]
    m = model(
        "LinearAttention",
        inputs,
        ["output"],
        27,
        names=names,
        update_rule="delta",
        q_num_heads=2,
        kv_num_heads=2,
    )
    with pytest.raises(ConversionError, match="up to 64 steps"):
        load_onnx(m.SerializeToString())
