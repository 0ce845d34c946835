"""ONNX's conformance suite, the backend node tests of the installed onnx, through aotc.onnx_backend
(onnx.backend.test.BackendTest builds, runs and compares each model; issue 19, docs/onnx-conformance.md).

Each test's expected outcome: excluded ones (tests/onnx_conformance.EXCLUDED, each with its reason) skip;
those listed in tests/data/onnx_backend_refused.txt must be refused with one of aotc's REFUSALS (xfail);
all others must pass. So a wrong answer, an internal error (any other exception), a newly refused test and
a newly passing one all fail, the last two naming the list to update (`python -m tests.onnx_conformance
--write` rewrites it).

The default run takes DEFAULT_SUBSET; `-m conformance` runs every node test (about 1900, 30-60 s with a
cold cache, most of it the builds of the passing ones).
"""

from __future__ import annotations

import functools
import os
import unittest
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

import aotc.onnx_backend as onnx_backend
from aotc.frontend.errors import ConversionError, UnsupportedOperatorError
from aotc.onnx_backend import REFUSALS, AotcBackend

from .onnx_conformance import REFUSED_FILE, exclusion, load_refused, node_test_case


class Backend(AotcBackend):
    """The backend the suite drives; `use_pytest_cache` points its build cache at pytest's cache."""


@pytest.fixture(autouse=True, scope="module")
def use_pytest_cache(request, tmp_path_factory):
    cache = getattr(request.config, "cache", None)  # None with -p no:cacheprovider
    Backend.cache_dir = cache.mkdir("aotc-onnx-backend") if cache else tmp_path_factory.mktemp("onnx-backend")


# The default run's share of the suite. The whole suite's time grows with every operator aotc learns (a
# passing test is a build, ~0.1 s; a refusal costs milliseconds), so the default run takes a fixed sample
# instead: at least one passing test of each operator family aotc passes today (element-wise ops over
# several dtypes, broadcasting, the *_expanded function bodies, matmul/gemm, normalizations, softmax,
# reductions, gather/split/concat, where, pow over integers, models of opsets 1 to 11 and of the newest
# versions), models that feed axes, pads or bounds as inputs, the cases that were internal errors, one
# refusal of each kind (operator, element type, attribute) and one test per exclusion. About 160 tests, ~20 s on
# 2 cores with an empty cache after ~5 s of generating the cases (RoiAlign is left out: its builds take ~20 s).
DEFAULT_SUBSET = [
    # passing
    "abs", "add_bcast", "add_int8", "add_uint8", "batchnorm_example", "ceil", "clip_default_int8_inbounds_expanded",
    "clip_splitbounds_expanded", "concat_1d_axis_0", "concat_3d_axis_negative_2", "div_bcast", "div_int32_trunc",
    "div_uint8", "equal_bcast", "equal_uint32", "erf", "exp", "floor", "gather_2d_indices",
    "gather_negative_indices", "gelu_tanh_2", "gemm_all_attributes", "gemm_default_scalar_bias",
    "gemm_transposeA", "greater_equal_int8_expanded", "greater_uint64", "group_normalization_example_expanded",
    "layer_normalization_3d_axis1_epsilon_expanded_ver18", "layer_normalization_4d_axis_negative_3_expanded",
    "leakyrelu", "less_bcast", "less_equal_uint8_expanded", "log", "logsoftmax_axis_1_expanded_ver18",
    "logsoftmax_large_number", "matmul_2d", "matmul_4d_1d", "matmul_bcast", "max_float16", "max_int8",
    "mean_two_inputs", "min_float64", "min_uint64", "mul_bcast", "mul_uint32", "mvn_expanded", "neg",
    "prelu_broadcast", "reciprocal", "reduce_max_default_axes_keepdims_random", "relu", "sigmoid",
    "softmax_axis_0_expanded", "softmax_default_axis_expanded_ver18", "softmax_large_number",
    "split_1d_uneven_split_opset18", "split_equal_parts_2d_opset13", "sqrt", "sub_uint16", "sum_example",
    "tanh", "where_long_example",
    # Mod (integer floor and fmod, float fmod, Mod-28's float floor with its edge cases), CastLike in the
    # function bodies, float16 sums in float32 and Softmax's float16 function body (issue 19)
    "mod_mixed_sign_int8", "mod_int64_fmod", "mod_mixed_sign_float32", "mod_float_edge_cases_fmod_0_float32",
    "mod_broadcast", "softplus_expanded_ver18", "causal_conv_with_state_silu_fp16_expanded",
    "attention_4d_causal_fp16_expanded",
    # opsets outside 13-21 (issue 19 item 2): opset 1 (Not-1), 7 (And-7), 11 (Dropout-10), the newest
    # versions (Conv-22, ConvTranspose-22, MaxPool-22, AveragePool-22, Cast-25, Dropout-22's mask,
    # Shape-25, Transpose-25)
    "not_2d", "and_bcast4v3d", "dropout_default_old", "conv_with_strides_padding", "convtranspose_autopad_same",
    "maxpool_2d_same_upper", "averagepool_2d_ceil", "cast_FLOAT_to_FLOAT16", "dropout_default_mask",
    "shape_start_1_end_negative_1", "transpose_default",
    # internal errors before issue 19: integer Pow (now supported), Shape with start > end (refused: its output
    # is empty)
    "pow_types_int32_int32", "pow_types_int32_float32", "pow_types_int64_int64", "pow_types_int64_float32",
    "shape_start_greater_than_end",
    # run-time values (issue 19 item 3): axes and starts fed as inputs, built at each run with their values
    # as constants; Clip's bounds and Pad's value as kernel inputs
    "reduce_sum_keepdims_example", "slice", "clip", "constant_pad",
    # coverage (issue 19 item 4): BitShift, GatherElements, ArgMax/ArgMin, Trilu (k fed as an input),
    # RMSNormalization, LayerNormalization's Mean and InvStdDev, the two losses, CumSum, Hardmax, the
    # composite reductions with axes fed empty at run time
    "cumsum_1d_reverse_exclusive", "hardmax_axis_0", "reduce_log_sum_exp_default_axes_keepdims_random",
    "bitshift_right_int8_negative_input", "gather_elements_negative_indices", "argmax_default_axis_example",
    "argmin_keepdims_random_select_last_index", "tril_neg", "rms_normalization_3d_axis1_epsilon",
    "layer_normalization_2d_axis0", "nllloss_NCd1_mean_weight_negative_ii", "sce_mean_weight_ii_log_prob",
    # refused before this session's operator families, one test each (issue 19 item 4): the attention family,
    # element-wise math, reductions/windows/signal, indexing, recurrent and control flow, sampling and
    # Resize's modes, low-precision types and run-time quantization parameters, the small operators,
    # 3-D windows, MaxPool's Indices and zero-size tensors
    "acos", "attention_4d_gqa_with_past_and_present", "rotary_embedding_interleaved",
    "linear_attention_gated_delta", "flexattention_causal_mask", "swiglu", "sin", "isinf_negative", "mish",
    "bitwise_and_i32_2d", "reduce_prod_default_axes_keepdims_random", "cumprod_1d", "lrn", "lppool_2d_pads",
    "dft", "hannwindow", "tile", "top_k_smallest", "scatternd_add", "gathernd_example_int32_batch_dim1",
    "depthtospace_crd_mode_example", "einsum_batch_matmul", "col2im_pads", "nonzero_example",
    "lstm_with_peepholes", "gru_seq_length", "scan9_sum", "if", "gridsample_bicubic",
    "resize_upsample_scales_cubic", "resize_tf_crop_and_resize", "resize_downsample_scales_linear_align_corners",
    "deform_conv_with_mask_bias", "cast_FLOAT_to_FLOAT8E4M3FN",
    "cast_FLOAT_to_BFLOAT16", "dequantizelinear_int4", "bitcast_float32_to_int32",
    "quantizelinear_blocked_asymmetric", "qlinearmatmul_3D_uint8_float16", "dynamicquantizelinear_expanded",
    "det_nd", "tfidfvectorizer_tf_uniandbigrams_skip5", "nonmaxsuppression_two_classes",
    "averagepool_3d_dilations_small", "maxpool_with_argmax_2d_precomputed_pads", "convtranspose_3d",
    "castlike_FLOAT_to_DOUBLE", "split_zero_size_splits_opset18",
    # refused: an operator, an element type, an attribute value (a value needed at compile time that no run
    # gives: tests/test_onnx_constants.py)
    "image_decoder_decode_png_rgb", "attention_4d_causal_bf16", "maxunpool_export_with_output_shape",
    # excluded: one per exclusion
    "sequence_insert_at_back", "optional_get_element_tensor", "ai_onnx_ml_binarizer", "string_concat", "adam",
    "training_dropout", "bernoulli", "dft_inverse",
]  # fmt: skip

REFUSED = load_refused()
GENERATED = dict(vars(node_test_case(Backend)))  # its methods: the class itself would be collected as is
ALL_TESTS = sorted(name for name in GENERATED if name.startswith("test_"))


def expecting(test: str):
    """BackendTest's method for `test`, with the outcome this module expects of it."""
    func = GENERATED[test]
    reason = exclusion(test)
    if reason is not None:
        return unittest.skip(f"excluded: {reason}")(func)
    refusal_expected = test in REFUSED

    @functools.wraps(func)
    def run(self):
        try:
            func(self)
        except REFUSALS as e:
            if not refusal_expected:
                raise AssertionError(
                    f"{test} is refused, and {REFUSED_FILE.name} does not list it: a regression? "
                    f"({type(e).__name__}: {e})"
                ) from e
            refusal = f"refused: {type(e).__name__}: {e}"
        else:
            refusal = None
        # outside the except block: pytest formats the traceback of every xfail, and with the refusal
        # chained to it that costs ~0.1 s a test (over 1400 of them in the whole suite)
        if refusal is not None:
            pytest.xfail(refusal)
        if refusal_expected:
            pytest.fail(
                f"{test} passes now: take it off {REFUSED_FILE.name} (python -m tests.onnx_conformance --write)"
            )

    return run


def make_case(name: str, tests: list[str], marks: list) -> type[unittest.TestCase]:
    case = type(name, (unittest.TestCase,), {t: expecting(t) for t in tests})
    case.__module__ = __name__
    case.pytestmark = marks
    return case


OnnxBackendNodeSubset = make_case(
    "OnnxBackendNodeSubset",
    [f"test_{t}_cpu" for t in DEFAULT_SUBSET if f"test_{t}_cpu" in GENERATED],
    [],
)
OnnxBackendNodeModelTest = make_case("OnnxBackendNodeModelTest", ALL_TESTS, [pytest.mark.conformance])


def test_default_subset_names_tests_that_exist():
    """A renamed case (a new onnx) must be replaced in DEFAULT_SUBSET, not silently dropped."""
    missing = [t for t in DEFAULT_SUBSET if f"test_{t}_cpu" not in ALL_TESTS]
    assert not missing, f"not node tests of onnx {onnx.__version__}: {missing}"


def test_refused_list_names_tests_that_exist_and_are_not_excluded():
    unknown = sorted(REFUSED - set(ALL_TESTS))
    excluded = sorted(t for t in REFUSED if exclusion(t))
    assert not unknown and not excluded, f"{REFUSED_FILE.name}: unknown {unknown}, excluded {excluded}"


# ----------------------------------------------------------------------------- the backend itself


def _relu_model(shape: list, name: str = "relu_graph") -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])]
    graph = helper.make_graph(nodes, name, [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


@pytest.fixture
def backend(tmp_path, monkeypatch):
    """The backend with a fresh cache, counting the builds it starts."""
    import aotc.api

    builds = []
    compile_ = aotc.api.compile
    monkeypatch.setattr(aotc.api, "compile", lambda *a, **kw: builds.append(a[0]) or compile_(*a, **kw))

    class Fresh(AotcBackend):
        cache_dir = tmp_path / "cache"

    Fresh.builds = builds
    return Fresh


def test_prepare_builds_once_and_runs_by_position_or_name(backend):
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    rep = backend.prepare(_relu_model([2, 3]))
    (y,) = rep.run([x])
    np.testing.assert_array_equal(y, -np.maximum(x, 0))
    np.testing.assert_array_equal(rep.run({"x": x})[0], y)
    np.testing.assert_array_equal(backend.run_model(_relu_model([2, 3]), [x])[0], y)
    assert len(backend.builds) == 1  # the second prepare loaded the cached package
    assert backend.supports_device("CPU") and not backend.supports_device("CUDA")


def test_a_model_with_dynamic_dimensions_is_built_at_each_run_shape(backend):
    rep = backend.prepare(_relu_model(["n", 3]))
    assert backend.builds == []
    for rows in (2, 5, 2):
        x = np.full((rows, 3), -2.0, np.float32)
        np.testing.assert_array_equal(rep.run([x])[0], -np.maximum(x, 0))
    assert len(backend.builds) == 2


def test_refusals_are_aotc_errors_naming_the_node_and_the_model_file_is_kept(backend):
    model = _relu_model([2, 3], name="my_model")
    model.graph.node[0].op_type = "RandomUniformLike"
    with pytest.raises(
        UnsupportedOperatorError, match=r"my_model\.onnx: 1 unsupported operator: RandomUniformLike"
    ) as e:
        backend.prepare(model)
    assert isinstance(e.value, REFUSALS)
    assert Path(str(e.value).split(": ")[0]).is_file()  # the message names a file that exists
    model = _relu_model([2, 3])
    model.graph.node.append(helper.make_node("Reshape", ["x", "shape"], ["s"]))
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array([7], np.int64), "shape"))
    model.graph.output.append(helper.make_tensor_value_info("s", onnx.TensorProto.FLOAT, None))
    with pytest.raises(
        ConversionError, match=r"node Reshape_2 \(Reshape\): cannot reshape float32\[2, 3\] to \[7\]"
    ):
        backend.prepare(model)


def test_cache_keeps_the_builds_of_the_latest_sources_only(tmp_path, monkeypatch):
    (tmp_path / "not-ours").mkdir()
    for age, digest in enumerate("dcba", 1):  # "a" * 24 the oldest
        (tmp_path / (digest * 24)).mkdir()
        os.utime(tmp_path / (digest * 24), (1e9 - age, 1e9 - age))
    monkeypatch.setattr(onnx_backend, "source_digest", lambda: "e" * 64)
    assert onnx_backend.source_cache(tmp_path) == tmp_path / ("e" * 24)
    kept = {p.name for p in tmp_path.iterdir()}
    assert kept == {"not-ours", *(d * 24 for d in "edc")}  # KEEP_SOURCES = 3, the foreign directory stays
