"""ONNX sampling operators (aotc/frontend/onnx_sampling.py, aotc/topi/sampling.py): Resize's cubic, antialias,
tf_crop_and_resize and fractional align_corners cases, GridSample, AffineGrid, RoiAlign and DeformConv,
against onnxruntime (or ONNX's reference evaluator where onnxruntime has no kernel for the case), through
the frontend and the graph interpreter and, once, compiled (by LLVM, and as an OpenCL package where an
OpenCL platform is present: both `slow`).

Float results must match within rtol 1e-4, atol 1e-5 (the kernels compute in float32 where ONNX's reference
computes Resize's weights in float64); integer results exactly.
"""

from __future__ import annotations

import aotc_runtime
import numpy as np
import onnx
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

import aotc
from aotc.codegen.gpu import opencl_device
from aotc.execution_plan import kernel_symbol, merge_tasks, package_spec
from aotc.frontend.errors import ConversionError
from aotc.frontend.onnx import RunTimeValueError, load_onnx
from aotc.graph.interpret import run_graph
from aotc.graph.partition import extract_tasks, partition
from aotc.graph.passes import optimize
from aotc.package import write_package
from aotc.schedule.lower import lower
from aotc.search.untuned import untuned_schedule
from aotc.target import parse_target

from .onnx_util import (
    Input,
    assert_outputs_match,
    make_graph_model,
    random_feeds,
    reference_outputs,
    single_op_model,
)

RTOL, ATOL = 1e-4, 1e-5


def _f(values) -> np.ndarray:
    return np.array(values, np.float32)


def _i(values) -> np.ndarray:
    return np.array(values, np.int64)


def case(op_type, operands, *, id, feeds=None, evaluator=False, **kw):
    return pytest.param(op_type, operands, feeds, evaluator, kw, id=id)


IMAGE = Input((1, 2, 4, 5))
ROIS = _f([[0.5, 0.5, 3.2, 2.7], [1.0, 0.0, 6.0, 5.0], [-1.0, -2.0, 2.0, 1.5], [2.2, 3.3, 2.2, 3.3]])

CASES = [
    # Resize: cubic (Resize-11 and later)
    case("Resize", [IMAGE, None, _f([1, 1, 2, 1.5])], mode="cubic", opset=19, id="resize-cubic-up"),
    case(
        "Resize",
        [IMAGE, None, _f([1, 1, 0.6, 0.8])],
        mode="cubic",
        cubic_coeff_a=-0.5,
        exclude_outside=1,
        opset=13,
        id="resize-cubic-down-a-exclude",
    ),
    case(
        "Resize",
        [IMAGE, None, None, _i([1, 2, 7, 3])],
        mode="cubic",
        coordinate_transformation_mode="align_corners",
        opset=11,
        id="resize-cubic-align-sizes",
    ),
    case(
        "Resize",
        [IMAGE, None, _f([1, 1, 1.5, 2])],
        mode="cubic",
        coordinate_transformation_mode="asymmetric",
        opset=18,
        id="resize-cubic-asymmetric",
    ),
    case(
        "Resize",
        [IMAGE, None, _f([1, 1, 1.7, 0.7])],
        mode="cubic",
        coordinate_transformation_mode="pytorch_half_pixel",
        opset=13,
        id="resize-cubic-pytorch",
    ),
    # antialias (Resize-18)
    case(
        "Resize",
        [Input((1, 1, 9, 11)), None, None, _i([1, 1, 4, 5])],
        mode="linear",
        antialias=1,
        opset=18,
        id="resize-linear-antialias",
    ),
    case(
        "Resize",
        [Input((1, 1, 9, 11)), None, _f([1, 1, 0.6, 0.3])],
        mode="cubic",
        antialias=1,
        opset=19,
        id="resize-cubic-antialias",
    ),
    # tf_crop_and_resize
    case(
        "Resize",
        [IMAGE, _f([0, 0, 0.4, 0.6, 1, 1, 0.6, 0.8]), None, _i([1, 2, 3, 3])],
        mode="linear",
        coordinate_transformation_mode="tf_crop_and_resize",
        opset=13,
        id="resize-tf-crop",
    ),
    case(
        "Resize",
        [IMAGE, _f([0.4, -0.2, 1.2, 0.8]), None, _i([3, 4])],
        mode="linear",
        coordinate_transformation_mode="tf_crop_and_resize",
        extrapolation_value=10.0,
        axes=[3, 2],
        opset=18,
        id="resize-tf-crop-axes-extrapolation",
        evaluator=True,  # onnxruntime 1.32 pairs the roi with axes 2, 3, not in the order axes lists them
    ),
    case(
        "Resize",
        [IMAGE, _f([0, 0, -0.3, 0.1, 1, 1, 1.2, 0.9]), None, _i([1, 2, 5, 4])],
        mode="nearest",
        nearest_mode="round_prefer_ceil",
        coordinate_transformation_mode="tf_crop_and_resize",
        extrapolation_value=-1.0,
        opset=13,
        id="resize-tf-crop-nearest",
    ),
    case(
        "Resize",
        [IMAGE, _f([0, 0, 0.1, 0.2, 1, 1, 0.9, 0.7]), None, _i([1, 2, 3, 3])],
        mode="cubic",
        coordinate_transformation_mode="tf_crop_and_resize",
        opset=11,
        id="resize-tf-crop-cubic",
    ),
    # align_corners where the scaled length is not whole (ONNX reads the scaled length, not the extent)
    case(
        "Resize",
        [IMAGE, None, _f([1, 1, 0.6, 0.7])],
        mode="linear",
        coordinate_transformation_mode="align_corners",
        opset=13,
        id="resize-align-fractional-length",
        evaluator=True,
    ),
    # GridSample
    case(
        "GridSample", [IMAGE, Input((1, 3, 4, 2), low=-1.3, high=1.3)], opset=16, id="gridsample-16-bilinear"
    ),
    case(
        "GridSample",
        [IMAGE, Input((1, 3, 4, 2), low=-1.3, high=1.3)],
        mode="nearest",
        padding_mode="border",
        opset=16,
        id="gridsample-16-nearest-border",
    ),
    case(
        "GridSample",
        [IMAGE, Input((1, 3, 4, 2), low=-2.5, high=2.5)],
        mode="bicubic",
        padding_mode="reflection",
        align_corners=1,
        opset=16,
        id="gridsample-16-bicubic-reflection-corners",
    ),
    case(
        "GridSample",
        [IMAGE, Input((1, 2, 3, 2), low=-3.5, high=3.5)],
        mode="linear",
        padding_mode="reflection",
        opset=20,
        id="gridsample-20-linear-reflection",
    ),
    case(
        "GridSample",
        [IMAGE, Input((1, 2, 3, 2), low=-1.4, high=1.4)],
        mode="cubic",
        opset=22,
        id="gridsample-22-cubic-zeros",
    ),
    case(
        "GridSample",
        [Input((1, 2, 3, 4, 2)), Input((1, 2, 2, 3, 3), low=-1.2, high=1.2)],
        mode="linear",
        align_corners=1,
        opset=20,
        id="gridsample-volumetric-linear",
    ),
    case(
        "GridSample",
        [Input((1, 2, 3, 4, 2)), Input((1, 2, 2, 3, 3), low=-1.2, high=1.2)],
        mode="nearest",
        padding_mode="reflection",
        opset=20,
        id="gridsample-volumetric-nearest",
        evaluator=True,
    ),
    case(
        "GridSample",
        [Input((1, 2, 4, 5), "int32", -9, 9), Input((1, 3, 4, 2), low=-1.2, high=1.2)],
        mode="nearest",
        opset=20,
        id="gridsample-nearest-int32",
        evaluator=True,
    ),
    case(
        "GridSample",
        [Input((1, 2, 7)), Input((1, 5, 1), low=-1.3, high=1.3)],
        mode="cubic",
        opset=20,
        id="gridsample-1d-cubic",
        evaluator=True,  # onnxruntime 1.32 samples 4-D and 5-D inputs only, cubic 4-D only
    ),
    case(
        "GridSample",
        [Input((1, 2, 3, 4, 3)), Input((1, 2, 2, 2, 3), low=-1.6, high=1.6)],
        mode="cubic",
        padding_mode="reflection",
        opset=20,
        id="gridsample-volumetric-cubic-reflection",
        evaluator=True,
    ),
    case(
        "GridSample",
        [Input((1, 2, 4, 5), "float16"), Input((1, 2, 3, 2), "float16", low=-1.3, high=1.3)],
        opset=20,
        id="gridsample-float16",
    ),
    # AffineGrid (its size a constant)
    case("AffineGrid", [Input((2, 2, 3)), _i([2, 3, 4, 5])], opset=20, id="affine-grid-2d"),
    case(
        "AffineGrid", [Input((1, 3, 4)), _i([1, 1, 2, 3, 4])], align_corners=1, opset=20, id="affine-grid-3d"
    ),
    # RoiAlign
    case(
        "RoiAlign",
        [Input((2, 2, 6, 7)), Input((4, 4)), Input((4,), "int64")],
        feeds={"x1": ROIS, "x2": _i([0, 1, 1, 0])},
        output_height=3,
        output_width=2,
        sampling_ratio=2,
        spatial_scale=0.9,
        opset=16,
        id="roialign-half-pixel",
    ),
    case(
        "RoiAlign",
        [Input((2, 2, 6, 7)), Input((4, 4)), Input((4,), "int64")],
        feeds={"x1": ROIS, "x2": _i([1, 0, 1, 0])},
        output_height=2,
        output_width=3,
        sampling_ratio=3,
        opset=10,
        id="roialign-10-output-half-pixel",
    ),
    case(
        "RoiAlign",
        [Input((1, 2, 6, 7)), Input((4, 4)), Input((4,), "int64")],
        feeds={"x1": ROIS, "x2": _i([0, 0, 0, 0])},
        mode="max",
        coordinate_transformation_mode="output_half_pixel",
        output_height=2,
        output_width=2,
        sampling_ratio=2,
        opset=22,
        id="roialign-max",
        evaluator=True,
    ),
    case(
        "RoiAlign",
        [Input((1, 2, 6, 7)), _f([[0.5, 0.5, 3.5, 2.5], [1.0, 1.0, 4.0, 3.0]]), Input((2,), "int64")],
        feeds={"x2": _i([0, 0])},
        output_height=2,
        output_width=2,
        opset=16,
        id="roialign-sampling-ratio-0-constant-rois",
    ),
    # DeformConv
    case(
        "DeformConv",
        [Input((1, 2, 5, 5)), Input((3, 2, 2, 2)), Input((1, 8, 6, 6), low=-1.5, high=1.5)],
        pads=[1, 1, 1, 1],
        opset=19,
        id="deformconv-padding",
    ),
    case(
        "DeformConv",
        [
            Input((2, 4, 5, 6)),
            Input((4, 2, 3, 2)),
            Input((2, 24, 2, 2), low=-2.0, high=2.0),
            Input((4,)),
            Input((2, 12, 2, 2), low=0.0, high=1.0),
        ],
        group=2,
        offset_group=2,
        strides=[2, 2],
        dilations=[1, 2],
        opset=22,
        id="deformconv-groups-mask-bias",
    ),
    case(
        "DeformConv",
        [Input((1, 1, 1, 4)), Input((1, 1, 1, 2)), Input((1, 4, 1, 3), low=-0.7, high=0.7)],
        opset=19,
        id="deformconv-one-row",  # ONNX's reference divides by the height less 1 (NaN): onnxruntime
    ),
]


@pytest.mark.parametrize(("op_type", "operands", "feeds", "evaluator", "kw"), CASES)
def test_operator_matches_onnxruntime(op_type, operands, feeds, evaluator, kw):
    model = single_op_model(op_type, operands, **kw)
    specs = {f"x{i}": op for i, op in enumerate(operands) if isinstance(op, Input)}
    values = random_feeds(model, specs)
    values.update(feeds or {})
    got = run_graph(load_onnx(model.SerializeToString()), values)
    assert_outputs_match(got, model, reference_outputs(model, values, evaluator), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    ("op_type", "operands", "kw", "error", "message"),
    [
        (
            "GridSample",
            [IMAGE, Input((1, 3, 4, 2))],
            {"mode": "linear", "opset": 16},
            ConversionError,
            "mode",
        ),
        ("GridSample", [Input((1, 2, 4)), Input((1, 3, 1))], {"opset": 16}, ConversionError, "4-D"),
        (
            "Resize",
            [IMAGE, _f([1, 1, 0.5, 0.5])],
            {"mode": "cubic", "opset": 10},
            ConversionError,
            "cubic",
        ),
        (
            "Resize",
            [IMAGE, _f([]), _f([1, 1, 2, 2])],
            {"mode": "cubic", "coordinate_transformation_mode": "tf_half_pixel_for_nn", "opset": 11},
            ConversionError,
            "tf_half_pixel_for_nn",
        ),
        (
            "GridSample",
            [IMAGE, Input((1, 3, 4, 2))],
            {"mode": "cubic", "padding_mode": "border", "opset": 20},
            ConversionError,
            "border",
        ),
        (
            "Resize",
            [IMAGE, None, _f([1, 1, 0.5, 0.5])],
            {"mode": "nearest", "antialias": 1, "opset": 18},
            ConversionError,
            "antialias",
        ),
        (
            "RoiAlign",
            [IMAGE, Input((2, 4)), Input((2,), "int64")],
            {"opset": 16},
            RunTimeValueError,
            "rois",
        ),
        (
            "DeformConv",
            [Input((1, 1, 5)), Input((1, 1, 2)), Input((1, 2, 4))],
            {"opset": 19},
            ConversionError,
            "2-D",
        ),
    ],
    ids=[
        "gridsample-16-linear",
        "gridsample-16-3d",
        "resize-10-cubic",
        "resize-cubic-tf-half-pixel-for-nn",
        "gridsample-cubic-border",
        "nearest-antialias",
        "roi-runtime",
        "deform-1d",
    ],
)
def test_unsupported_cases_are_refused(op_type, operands, kw, error, message):
    """What aotc cannot convert is refused with the node, its operator and the reason."""
    model = single_op_model(op_type, operands, **kw)
    with pytest.raises(error, match=message) as e:
        load_onnx(model.SerializeToString())
    assert f"{op_type.lower()}_node ({op_type})" in str(e.value)


def sampling_model() -> tuple[onnx.ModelProto, dict]:
    """Resize (cubic, antialias, tf_crop_and_resize), GridSample (cubic with reflection; linear zeros on a
    grid far outside, where every coordinate is clamped before it becomes an index), AffineGrid, RoiAlign
    and DeformConv in one model, and its inputs."""
    nodes = [
        helper.make_node("Resize", ["x", "", "up"], ["cubic"], mode="cubic", exclude_outside=1),
        helper.make_node("Resize", ["x", "", "", "small"], ["antialiased"], mode="linear", antialias=1),
        helper.make_node(
            "Resize",
            ["x", "roi", "", "crop"],
            ["cropped"],
            mode="linear",
            coordinate_transformation_mode="tf_crop_and_resize",
            extrapolation_value=3.0,
        ),
        helper.make_node(
            "GridSample", ["x", "grid"], ["sampled"], mode="cubic", padding_mode="reflection", align_corners=1
        ),
        helper.make_node("GridSample", ["x", "far"], ["far_out"], mode="linear"),
        helper.make_node("AffineGrid", ["theta", "size"], ["affine"]),
        helper.make_node(
            "RoiAlign", ["x", "rois", "batch"], ["pooled"], output_height=2, output_width=3, sampling_ratio=2
        ),
        helper.make_node("DeformConv", ["x", "w", "offset"], ["deformed"], pads=[1, 0, 1, 0]),
    ]
    rng = np.random.default_rng(0)
    feeds = {
        "x": rng.standard_normal((1, 2, 5, 6)).astype(np.float32),
        "grid": rng.uniform(-2.5, 2.5, (1, 3, 4, 2)).astype(np.float32),
        "far": _f([[[[1e30, 0.0], [-1e30, 0.5]], [[0.2, 3e9], [-0.4, -7e20]]]]),
        "theta": rng.standard_normal((1, 2, 3)).astype(np.float32),
        "rois": ROIS[:3],
        "batch": _i([0, 0, 0]),
        "w": rng.standard_normal((3, 2, 2, 2)).astype(np.float32),
        "offset": rng.uniform(-1.5, 1.5, (1, 8, 6, 5)).astype(np.float32),
    }
    inits = {
        "up": _f([1, 1, 1.5, 1.3]),
        "small": _i([1, 2, 3, 2]),
        "roi": _f([0, 0, 0.2, -0.1, 1, 1, 0.9, 0.8]),
        "crop": _i([1, 2, 3, 4]),
        "size": _i([1, 1, 3, 4]),
    }
    inputs = {k: Input(v.shape, str(v.dtype)) for k, v in feeds.items()}
    outputs = ["cubic", "antialiased", "cropped", "sampled", "far_out", "affine", "pooled", "deformed"]
    model = make_graph_model(nodes, inputs, outputs, inits, opset=22)
    return model, feeds


def check_nonfinite_grid(runtime, feeds: dict) -> None:
    """A NaN or infinite grid reads within the input (an unspecified value for NaN, zeros for infinities)."""
    feeds = dict(feeds, far=_f([[[[np.nan, 0.0], [np.inf, 0.5]], [[0.2, -np.inf], [np.nan, np.nan]]]]))
    far = runtime.run(feeds)["far_out"]
    assert far.shape == (1, 2, 2, 2) and (far[:, :, 0, 1] == 0).all() and (far[:, :, 1, 0] == 0).all()


@pytest.mark.slow
def test_compiled_sampling_operators_match_onnxs_reference(tmp_path):
    """sampling_model compiled by LLVM and run with aotc_runtime."""
    model, feeds = sampling_model()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    shapes = {k: {"shape": list(v.shape)} for k, v in feeds.items()}
    package = aotc.compile(
        str(path), inputs=shapes, validate=False, output=tmp_path / "m.aotc", log=lambda _: None
    )
    runtime = aotc_runtime.load(str(package.path))
    assert_outputs_match(
        runtime.run(feeds), model, ReferenceEvaluator(model).run(None, feeds), rtol=RTOL, atol=ATOL
    )
    check_nonfinite_grid(runtime, feeds)


@pytest.mark.slow
@pytest.mark.skipif(
    opencl_device() is None, reason="no OpenCL platform (pip install pyopencl; pocl-opencl-icd)"
)
def test_gpu_sampling_operators_match_onnxs_reference(tmp_path):
    """sampling_model through the GPU code generator (untuned GPU schedules, every reduction-free stage
    inlined) as an OpenCL package, run on the OpenCL device."""
    model, feeds = sampling_model()
    graph = optimize(load_onnx(model.SerializeToString()))
    variants = [(graph, partition(graph))]
    tasks = merge_tasks([extract_tasks(groups) for _, groups in variants])
    target = parse_target("opencl")
    funcs = [
        lower(untuned_schedule(task.dag, target), kernel_symbol(i, task)) for i, task in enumerate(tasks)
    ]
    sources = [{"schedule": "default"} for _ in tasks]
    spec = package_spec("sampling", variants, tasks, funcs, target, sources, [{} for _ in tasks])
    write_package(spec, str(tmp_path / "m.aotc"))
    runtime = aotc_runtime.load(str(tmp_path / "m.aotc"))
    try:
        assert_outputs_match(
            runtime.run(feeds), model, ReferenceEvaluator(model).run(None, feeds), rtol=RTOL, atol=ATOL
        )
        check_nonfinite_grid(runtime, feeds)
    finally:
        runtime.close()
