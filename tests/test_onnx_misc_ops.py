"""DynamicQuantizeLinear, Det, TfIdfVectorizer and NonMaxSuppression (aotc/frontend/onnx_misc.py) against
onnxruntime, through the frontend and the graph interpreter and, once (slow), compiled.

Tolerances: quantized outputs, zero points, n-gram counts and selected box indices must be equal, and so must DynamicQuantizeLinear's
scale (one float32 division, as onnxruntime's). Det: aotc computes in float64 (as numpy does for float32
matrices), onnxruntime in float32: rtol 1e-4, atol 1e-5 against onnxruntime (float32); against
numpy.linalg.det (float64, which onnxruntime has no kernel for) rtol 1e-9.
"""

from __future__ import annotations

import aotc_runtime
import numpy as np
import pytest
from onnx import helper

from aotc.frontend.errors import ConversionError
from aotc.frontend.onnx import RunTimeValueError, load_onnx
from aotc.graph.interpret import run_graph

from .onnx_util import Input, built_package, make_graph_model, random_feeds, run_onnxruntime, single_op_model


def run_aotc(model, feeds: dict) -> dict:
    return run_graph(load_onnx(model.SerializeToString()), feeds)


def assert_equal_outputs(got: dict, model, expected: list[np.ndarray]) -> None:
    for out, ref in zip(model.graph.output, expected):
        value = np.asarray(got[out.name])
        assert value.shape == ref.shape and value.dtype == ref.dtype, (out.name, value.dtype, value.shape)
        np.testing.assert_array_equal(value, ref, err_msg=out.name)


# --- DynamicQuantizeLinear ----------------------------------------------------------------------------------

DQL_DATA = {
    "mixed": lambda rng, s: rng.uniform(-3, 2, s),
    "positive": lambda rng, s: rng.uniform(0.5, 2, s),  # min adjusted to 0: zero point 0
    "negative": lambda rng, s: rng.uniform(-4, -1, s),  # max adjusted to 0: zero point 255
    "zeros": lambda rng, s: np.zeros(s),  # max == min: onnxruntime's scale 1
    "halves": lambda rng, s: rng.integers(-10, 10, s) * 0.5,  # quotients near .5: ties to even
}


@pytest.mark.parametrize("shape", [(6,), (3, 4), (2, 3, 5), (), (2, 0)], ids=str)
@pytest.mark.parametrize("data", list(DQL_DATA))
def test_dynamic_quantize_linear_equals_onnxruntime(shape, data):
    model = single_op_model("DynamicQuantizeLinear", [Input(shape)], 3, 11)
    x = np.asarray(DQL_DATA[data](np.random.default_rng(0), shape), np.float32)
    assert_equal_outputs(run_aotc(model, {"x0": x}), model, run_onnxruntime(model, {"x0": x}))


# --- Det ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, singular",
    [((1, 1), False), ((2, 2), False), ((3, 2, 2), False), ((3, 3), False), ((2, 4, 3, 3), False),
     ((4, 4), True), ((5, 5), False), ((2, 6, 6), False), ((3, 3), True)],
    ids=str,
)  # fmt: skip
def test_det_matches_onnxruntime_and_numpy(shape, singular):
    x = np.random.default_rng(1).uniform(-2, 2, shape)
    if singular:
        x[..., 1, :] = 2 * x[..., 0, :]
    if shape[-1] == 5:
        x[..., 0, 0] = 0  # a zero on the diagonal: the first column needs a row swap
    x32 = x.astype(np.float32)
    model = single_op_model("Det", [Input(shape)], 1, 22)
    got = run_aotc(model, {"x0": x32})["y0"]
    (ref,) = run_onnxruntime(model, {"x0": x32})
    assert got.shape == ref.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    model = single_op_model("Det", [Input(shape, "float64")], 1, 11)
    got = run_aotc(model, {"x0": x})["y0"]
    assert got.shape == shape[:-2] and got.dtype == np.float64
    np.testing.assert_allclose(got, np.linalg.det(x), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("shape", [(3, 0, 0), (0, 2, 2), (0, 0)], ids=str)
def test_det_of_empty_matrices_or_batches_equals_onnxruntime(shape):
    model = single_op_model("Det", [Input(shape)], 1, 22)
    x = np.zeros(shape, np.float32)
    assert_equal_outputs(run_aotc(model, {"x0": x}), model, run_onnxruntime(model, {"x0": x}))


def test_det_of_float16_is_computed_wide_and_rounded_once():
    x = np.random.default_rng(2).uniform(-2, 2, (4, 3, 3)).astype(np.float16)
    model = single_op_model("Det", [Input((4, 3, 3), "float16")], 1, 22)
    got = run_aotc(model, {"x0": x})["y0"]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got, np.linalg.det(x.astype(np.float64)).astype(np.float16), rtol=1e-3)


# --- TfIdfVectorizer ----------------------------------------------------------------------------------------


def random_tfidf(seed: int) -> tuple[dict, tuple[int, ...], str]:
    """Attributes of a random TfIdfVectorizer (up to 3 unigrams, bigrams and trigrams of values 0..4, no
    n-gram twice), an input shape and dtype."""
    rng = np.random.default_rng(seed)
    pool, counts, grams = [], [], 0
    for size in (1, 2, 3):
        counts.append(len(pool))
        drawn = {tuple(int(v) for v in rng.integers(0, 5, size)) for _ in range(int(rng.integers(0, 4)))}
        for gram in sorted(drawn):
            pool += gram
        grams += len(drawn)
    grams = max(grams, 1)
    if not pool:
        pool, counts = [1], [0, 1, 1]
    lo = int(rng.integers(1, 4))
    mode = ("TF", "IDF", "TFIDF")[seed % 3]
    attrs = dict(
        mode=mode,
        min_gram_length=lo,
        max_gram_length=int(rng.integers(lo, 4)),
        max_skip_count=int(rng.integers(0, 4)),
        ngram_counts=counts,
        pool_int64s=pool,
    )
    if seed % 2:  # weights: the identity ngram_indexes (onnxruntime's reading of weights is ONNX's there)
        attrs["ngram_indexes"] = list(range(grams))
        attrs["weights"] = [float(w) for w in rng.uniform(0.5, 2, grams)]
    else:  # columns in another order, some unused
        attrs["ngram_indexes"] = [int(i) for i in rng.permutation(grams + 2)[:grams]]
    shape = (int(rng.integers(1, 4)), int(rng.integers(1, 10))) if seed % 5 else (int(rng.integers(1, 12)),)
    return attrs, shape, ("int32", "int64")[seed % 4 // 2]


@pytest.mark.parametrize("seed", range(24))
def test_tfidf_vectorizer_equals_onnxruntime(seed):
    attrs, shape, dtype = random_tfidf(seed)
    model = single_op_model("TfIdfVectorizer", [Input(shape, dtype)], 1, 9, **attrs)
    x = np.random.default_rng(seed).integers(0, 5, shape).astype(dtype)
    assert_equal_outputs(run_aotc(model, {"x0": x}), model, run_onnxruntime(model, {"x0": x}))


def test_tfidf_vectorizer_skips_count_each_bigram_once_per_distance_and_unigrams_once():
    """x = 1 2 1 2: bigram (1, 2) at distance 1 twice and at distance 3 once; unigram 2 twice."""
    attrs = dict(mode="TF", min_gram_length=1, max_gram_length=2, max_skip_count=2, ngram_counts=[0, 1])
    model = single_op_model(
        "TfIdfVectorizer", [Input((4,), "int64")], 1, 9, ngram_indexes=[0, 1], pool_int64s=[2, 1, 2], **attrs
    )
    got = run_aotc(model, {"x0": np.array([1, 2, 1, 2], np.int64)})["y0"]
    np.testing.assert_array_equal(got, np.array([2, 3], np.float32))


# --- NonMaxSuppression --------------------------------------------------------------------------------------


def random_nms(seed: int) -> tuple[list[np.ndarray], int]:
    """Operands of a random NonMaxSuppression (coordinates on a half grid and scores in eighths: ties in
    both; a score threshold for 2 seeds in 3) and its center_point_box."""
    rng = np.random.default_rng(seed)
    batches, classes, count = int(rng.integers(1, 3)), int(rng.integers(1, 4)), int(rng.integers(1, 30))
    center = seed % 2
    if center:
        boxes = np.concatenate(
            [rng.uniform(0, 10, (batches, count, 2)), rng.uniform(0, 4, (batches, count, 2))], -1
        )
    else:
        boxes = rng.uniform(0, 10, (batches, count, 4))
    operands = [
        (np.round(boxes * 2) / 2).astype(np.float32),
        (rng.integers(0, 8, (batches, classes, count)) / 8).astype(np.float32),
        np.array([rng.integers(0, 10)], np.int64),
        np.array([rng.choice([0.0, 0.2, 0.5, 1.0, 1 / 3])], np.float32),
    ]
    if seed % 3:
        operands.append(np.array([rng.choice([0.0, 0.25, 0.5])], np.float32))
    return operands, center


@pytest.mark.parametrize("seed", range(16))
def test_non_max_suppression_of_constants_folds_to_onnxruntimes_selection(seed):
    operands, center = random_nms(seed)
    model = single_op_model("NonMaxSuppression", operands, 1, 11, center_point_box=center)
    assert_equal_outputs(run_aotc(model, {}), model, run_onnxruntime(model, {}))


def test_non_max_suppression_fed_at_run_time_is_a_run_time_value_that_constants_fix():
    operands, _ = random_nms(3)
    model = single_op_model("NonMaxSuppression", [Input(operands[0].shape), *operands[1:]], 1, 10)
    with pytest.raises(
        RunTimeValueError,
        match=r"node nonmaxsuppression_node \(NonMaxSuppression\): input 0 \(boxes, value x0\) must be a "
        r"constant: the output's shape, \[number of selected boxes, 3\], depends on its value",
    ) as e:
        load_onnx(model.SerializeToString())
    assert e.value.inputs == ("x0",)
    got = run_graph(load_onnx(model.SerializeToString(), constants={"x0": operands[0]}), {})
    assert_equal_outputs(got, model, run_onnxruntime(model, {"x0": operands[0]}))


# --- refusals -----------------------------------------------------------------------------------------------

TFIDF = dict(mode="TF", min_gram_length=1, max_gram_length=1, max_skip_count=0, ngram_counts=[0])


@pytest.mark.parametrize(
    "op_type, operands, kw, message",
    [
        ("DynamicQuantizeLinear", [Input((3,), "float64")], {"outputs": 3, "opset": 11}, r"node dynamicquantizelinear_node \(DynamicQuantizeLinear\): input 0 \(x, value x0\) is tensor\(double\), which type constraint T1 of DynamicQuantizeLinear-11 \(opset 11\) does not allow \(it allows tensor\(float\)\)"),
        ("Det", [Input((2, 3))], {}, r"node det_node \(Det\): Det needs square matrices in the last two axes, got float32\[2, 3\]"),
        ("Det", [Input((17, 17))], {}, r"Det of 17x17 matrices: aotc unrolls LU up to 16x16"),
        ("TfIdfVectorizer", [Input((4,), "int64")], {**TFIDF, "ngram_indexes": [0, 1], "pool_strings": ["a", "b"], "opset": 9}, r"pool_strings: aotc compiles no string tensors"),
        ("TfIdfVectorizer", [Input((4,), "int64")], {**TFIDF, "ngram_indexes": [0, 1], "pool_int64s": [3, 3], "opset": 9}, r"n-gram \[3\] is in pool_int64s twice"),
        ("TfIdfVectorizer", [Input((4,), "int64")], {**TFIDF, "mode": "IDF", "ngram_indexes": [1, 0], "pool_int64s": [3, 4], "weights": [1.0, 2.0], "opset": 9}, r"weights\[i\] must equal weights\[ngram_indexes\[i\]\]"),
        ("NonMaxSuppression", [np.zeros((1, 2, 4), np.float32), np.zeros((1, 1, 2), np.float32), np.array([2]), np.array([1.5], np.float32)], {"opset": 11}, r"iou_threshold must be in \[0, 1\], got 1.5"),
        ("NonMaxSuppression", [np.full((1, 2, 4), np.nan, np.float32), np.zeros((1, 1, 2), np.float32), np.array([2])], {"opset": 11}, r"boxes or scores hold NaN"),
        ("TfIdfVectorizer", [Input((4,), "float32")], {**TFIDF, "ngram_indexes": [0], "pool_int64s": [3], "opset": 9}, r"input 0 \(X, value x0\) is tensor\(float\), which type constraint T of TfIdfVectorizer-9"),
    ],
)  # fmt: skip
def test_what_aotc_does_not_compute_is_refused_naming_node_and_reason(op_type, operands, kw, message):
    kw = dict(kw)
    model = single_op_model(op_type, operands, kw.pop("outputs", 1), kw.pop("opset", 22), **kw)
    with pytest.raises(ConversionError, match=message):
        load_onnx(model.SerializeToString())


@pytest.mark.slow
def test_the_operators_compile_and_match_onnxruntime(tmp_path):
    """One package (Det by cofactors and by LU, float16 too, DynamicQuantizeLinear, TfIdfVectorizer with
    skips, a folded NonMaxSuppression), run with aotc_runtime."""
    nms = random_nms(4)[0]
    nodes = [
        helper.make_node("Det", ["m3"], ["det3"]),
        helper.make_node("Det", ["m5"], ["det5"]),
        helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "y_scale", "y_zero_point"]),
        helper.make_node(
            "TfIdfVectorizer", ["t"], ["tf"], mode="TF", min_gram_length=1, max_gram_length=2, max_skip_count=2,
            ngram_counts=[0, 3], ngram_indexes=[0, 1, 2, 3, 4], pool_int64s=[2, 3, 5, 2, 3, 5, 7],
        ),
        helper.make_node("NonMaxSuppression", [f"nms{i}" for i in range(len(nms))], ["selected"]),
        helper.make_node("Det", ["h4"], ["det_half"]),
    ]  # fmt: skip
    inputs = {
        "m3": Input((2, 3, 3)),
        "m5": Input((3, 5, 5)),
        "x": Input((4, 5)),
        "t": Input((2, 8), "int32", 0, 8),
        "h4": Input((2, 4, 4), "float16"),
    }
    outputs = ["det3", "det5", "y", "y_scale", "y_zero_point", "tf", "selected", "det_half"]
    constants = {f"nms{i}": a for i, a in enumerate(nms)}
    model = make_graph_model(nodes, inputs, outputs, constants, opset=11)
    feeds = random_feeds(model, inputs)
    shapes = {name: list(spec.shape) for name, spec in inputs.items()}
    got = aotc_runtime.load(str(built_package(model, tmp_path, inputs=shapes))).run(feeds)
    # onnxruntime has no float16 Det: numpy's, in float64 rounded once, for the last output
    reference = make_graph_model(
        nodes[:-1], dict(list(inputs.items())[:-1]), outputs[:-1], constants, opset=11
    )
    expected = run_onnxruntime(reference, {k: v for k, v in feeds.items() if k != "h4"})
    expected.append(np.linalg.det(feeds["h4"].astype(np.float64)).astype(np.float16))
    for name, ref in zip(outputs, expected):
        value = np.asarray(got[name])
        assert value.shape == ref.shape and value.dtype == ref.dtype, name
        if name == "det_half":
            np.testing.assert_allclose(value, ref, rtol=1e-3, err_msg=name)
        elif name.startswith("det"):
            np.testing.assert_allclose(value, ref, rtol=1e-4, atol=1e-5, err_msg=name)
        else:
            np.testing.assert_array_equal(value, ref, err_msg=name)
