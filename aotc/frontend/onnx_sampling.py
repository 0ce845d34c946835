"""ONNX frontend: Sampling operators (GridSample, AffineGrid, RoiAlign, DeformConv) and the Resize cases that
need tap tables (cubic, antialias, tf_crop_and_resize, a scaled length that is not whole).

Resize's coordinates depend only on shapes and attributes: its taps (indices and weights, per axis) are
computed here at compile time as ONNX's reference computes them, in float64, and the graph reads them as
constants. GridSample, RoiAlign and DeformConv compute coordinates from tensor values in their kernels
(aotc.topi.sampling), which clamp every coordinate and index (NaN included) before reading.
"""

from __future__ import annotations

import numpy as np

# This module extends the ONNX frontend: its converters use the converter API that onnx.py defines.
from aotc.frontend.onnx import OnnxConverter, OnnxNode, converts, onnx_axis
from aotc.graph.ir import Value

VERSIONS: dict[str, tuple[int, ...]] = {
    # Read against onnx.defs.get_all_schemas_with_history(); versions not noted only add element types
    # (bfloat16, refused as a type).
    "GridSample": (16, 20, 22),  # 16: 4-D only, modes bilinear/nearest/bicubic; 20: N-D, linear/cubic
    "AffineGrid": (20,),
    "RoiAlign": (10, 16, 22),  # 10: no coordinate_transformation_mode (output_half_pixel); 16: half_pixel
    "DeformConv": (19, 22),
}
"""ONNX operator -> the versions of it that this module converts (merged into aotc.frontend.onnx.VERSIONS)."""

_FLOATS = ("float16", "float32", "float64")
_TRANSFORMATIONS = (
    "half_pixel",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "half_pixel_symmetric",
    "tf_crop_and_resize",
)
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
_MAX_TAPS = 64
"""The most taps per output element on one axis a resize table may have (antialiasing by 1/64 and less
would unroll too long a sum)."""


# --- Resize by tap tables ---------------------------------------------------------------------------------


def _cubic(ratio: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic weights of the four taps around each point (ratio in (0, 1], past the second tap)."""
    r = ratio[:, None]
    t = np.concatenate([r + 1, r, 1 - r, 2 - r], axis=1)
    t2, t3 = t * t, t * t * t
    near = (a + 2) * t3 - (a + 3) * t2 + 1
    far = a * t3 - 5 * a * t2 + 8 * a * t - 4 * a
    return np.where(t <= 1, near, far)


def _antialias(ratio: np.ndarray, scale: float, mode: str, a: float) -> np.ndarray:
    """The weights of the widened (by 1/scale) linear or cubic filter, normalized to sum to 1."""
    scale = min(scale, 1.0)
    support = 1 if mode == "linear" else 2
    start = int(np.floor(-support / scale) + 1)
    args = np.abs(np.arange(start, 2 - start) - ratio[:, None]) * scale
    if mode == "linear":
        weights = np.clip(1 - args, 0, 1)
    else:
        a2, a3 = args * args, args * args * args
        weights = np.where(
            args <= 1,
            (a + 2) * a3 - (a + 3) * a2 + 1,
            np.where(args < 2, a * a3 - 5 * a * a2 + 8 * a * args - 4 * a, 0.0),
        )
    return weights / weights.sum(axis=1, keepdims=True)


def resize_taps(
    in_size: int,
    out_size: int,
    scale: float,
    mode: str,
    transformation: str,
    roi: tuple[float, float] = (0.0, 1.0),
    cubic_coeff_a: float = -0.75,
    antialias: bool = False,
    exclude_outside: bool = False,
    nearest_mode: str = "round_prefer_floor",
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """One axis of ONNX Resize as ONNX's reference computes it (onnx.reference's Resize): for each output
    index, the input indices it reads (int32 [out, taps], within the axis), their weights (float64, None
    for nearest: one tap) and whether tf_crop_and_resize places it outside the input (bool [out], None for
    other modes)."""
    length = scale * in_size  # length_resized, which the output's extent floors
    y = np.arange(out_size, dtype=np.float64)
    outside = None
    if transformation == "align_corners":
        x = np.zeros(out_size) if length == 1 else y * (in_size - 1) / (length - 1)
    elif transformation == "asymmetric":
        x = y / scale
    elif transformation == "tf_crop_and_resize":
        lo, hi = roi
        if length == 1:
            x = np.full(out_size, (hi - lo) * (in_size - 1) / 2)
        else:
            x = y * (hi - lo) * (in_size - 1) / (length - 1)
        x = x + lo * (in_size - 1)
        outside = (x < 0) | (x > in_size - 1)
    elif transformation == "pytorch_half_pixel":
        x = np.full(out_size, -0.5) if length == 1 else (y + 0.5) / scale - 0.5
    elif transformation == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif transformation == "half_pixel_symmetric":
        x = in_size / 2 * (1 - out_size / length) + (y + 0.5) / scale - 0.5
    else:
        raise ValueError(f"coordinate_transformation_mode {transformation!r}")
    base = np.floor(x)
    ratio = np.where(x == base, 1.0, x - base)  # in (0, 1]: an exact point reads the tap on its left
    if mode == "nearest":
        prefer = {
            "round_prefer_floor": ratio > 0.5,
            "round_prefer_ceil": ratio >= 0.5,
            "floor": np.zeros(out_size, bool),
            "ceil": np.ones(out_size, bool),
        }[nearest_mode]
        weights = np.stack([~prefer, prefer], axis=1).astype(np.float64)
        weights[ratio == 1.0] = (0.0, 1.0)
    elif antialias:
        weights = _antialias(ratio, scale, mode, cubic_coeff_a)
    elif mode == "cubic":
        weights = _cubic(ratio, cubic_coeff_a)
    else:
        weights = np.stack([1 - ratio, ratio], axis=1)
    taps = weights.shape[1]
    pad = int(np.ceil(taps / 2))
    padded = x + pad
    p = np.floor(padded)
    frac = padded - p
    if taps % 2 == 0:  # even kernels centre on half-integers; a tie goes to the smaller centre
        offset = np.where(frac == 0, -(taps // 2), -(taps // 2) + 1)
    else:
        offset = np.where(frac <= 0.5, -((taps - 1) // 2), -((taps - 1) // 2) + 1)
    index = (p + offset).astype(np.int64)[:, None] + np.arange(taps)[None, :] - pad
    if exclude_outside:
        weights = np.where((index < 0) | (index >= in_size), 0.0, weights)
        total = weights.sum(axis=1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    index = np.clip(index, 0, in_size - 1).astype(np.int32)  # the input's edge repeats beyond it
    if mode == "nearest":
        return index[np.arange(out_size), weights.argmax(axis=1)][:, None], None, outside
    return index, weights, outside


def resize_by_taps(cv: OnnxConverter, n: OnnxNode, x: Value, mode: str, transformation: str) -> Value:
    """Resize-11 and later where it needs tap tables: one `resize_axis` op per resized axis."""
    shape = x.type.shape
    rank = len(shape)
    antialias = bool(n.attr("antialias", 0))
    if antialias and mode == "nearest":
        raise cv.fail("antialias applies to the linear and cubic modes, not nearest")
    if mode != "nearest" and x.type.dtype not in _FLOATS:
        raise cv.fail(f"{mode} interpolation needs a float tensor, got {x.type.dtype}")
    if transformation not in _TRANSFORMATIONS or (
        transformation == "half_pixel_symmetric" and n.older_than(19)
    ):  # tf_half_pixel_for_nn (Resize-11 only) is not converted; half_pixel_symmetric is Resize-19's
        raise cv.fail_version(f"coordinate_transformation_mode {transformation!r} is not supported")
    nearest_mode = n.attr("nearest_mode", "round_prefer_floor")
    if nearest_mode not in _NEAREST_MODES:
        raise cv.fail(f"nearest_mode {nearest_mode!r} is not one of {', '.join(_NEAREST_MODES)}")
    axes = [onnx_axis(cv, int(a), rank) for a in n.attr("axes", range(rank))]
    if len(set(axes)) != len(axes):
        raise cv.fail(f"axes {n.attr('axes')} repeat an axis")
    scales, sizes = cv.const_input(n, 2, "scales"), cv.const_input(n, 3, "sizes")
    scale, size = [1.0] * rank, list(shape)
    if sizes is not None and sizes.size:
        if sizes.size != len(axes):
            raise cv.fail(f"{sizes.size} sizes for {len(axes)} axes")
        ratios = {a: int(s) / shape[a] for a, s in zip(axes, sizes)}
        policy = n.attr("keep_aspect_ratio_policy", "stretch")
        if policy not in ("stretch", "not_larger", "not_smaller"):
            raise cv.fail(
                f"keep_aspect_ratio_policy {policy!r} is not one of stretch, not_larger, not_smaller"
            )
        if policy != "stretch":
            common = min(ratios.values()) if policy == "not_larger" else max(ratios.values())
            ratios = {a: common for a in axes}
            sizes = [int(common * shape[a] + 0.5) for a in axes]
        for a, s in zip(axes, sizes):
            scale[a], size[a] = ratios[a], int(s)
    elif scales is not None and scales.size:
        if scales.size != len(axes):
            raise cv.fail(f"{scales.size} scales for {len(axes)} axes")
        for a, s in zip(axes, scales.astype(np.float32)):
            if not np.isfinite(s) or s <= 0:
                raise cv.fail(f"scale {float(s)} on axis {a} is not a positive number")
            scale[a], size[a] = float(s), int(float(s) * shape[a])
    else:
        raise cv.fail("needs scales or sizes")
    if min(size) < 1:
        raise cv.fail(f"the output shape {size} is empty")
    roi = [(0.0, 1.0)] * rank
    if transformation == "tf_crop_and_resize":
        given = cv.const_input(n, 1, "roi")
        if given is None or given.size != 2 * len(axes):
            raise cv.fail(
                f"tf_crop_and_resize needs a roi of {2 * len(axes)} values (start and end per axis)"
            )
        given = given.astype(np.float64).reshape(-1)
        for i, a in enumerate(axes):
            roi[a] = (float(given[i]), float(given[i + len(axes)]))
    value = float(n.attr("extrapolation_value", 0.0))
    dtype = x.type.dtype
    if transformation == "tf_crop_and_resize" and dtype not in _FLOATS:
        low, high = (0, 1) if dtype == "bool" else (np.iinfo(dtype).min, np.iinfo(dtype).max)
        if not (np.isfinite(value) and value.is_integer() and low <= value <= high):
            raise cv.fail(f"extrapolation_value {value} is not a value of {dtype}, the input's type")
    weight_dtype = "float64" if dtype == "float64" else "float32"
    # an axis of scale 1 and the whole input as its region is as it was
    resized = [a for a in axes if scale[a] != 1.0 or size[a] != shape[a] or roi[a] != (0.0, 1.0)]
    out = x
    for a in resized:
        index, weights, outside = resize_taps(
            shape[a],
            size[a],
            scale[a],
            mode,
            transformation,
            roi[a],
            float(n.attr("cubic_coeff_a", -0.75)),
            antialias,
            bool(n.attr("exclude_outside", 0)),
            nearest_mode,
        )
        if index.shape[1] > _MAX_TAPS:
            raise cv.fail(
                f"antialiasing by scale {scale[a]:g} on axis {a} reads {index.shape[1]} taps; aotc reads {_MAX_TAPS} at most"
            )
        inputs = [out, cv.constant(index, f"taps{a}")]
        if weights is not None:
            inputs.append(cv.constant(weights.astype(weight_dtype), f"weights{a}"))
        attrs = {"axis": a, "weighted": weights is not None}
        if outside is not None and outside.any():
            inputs.append(cv.constant(outside, f"outside{a}"))
            attrs["extrapolation_value"] = value
        out = cv.emit("resize_axis", inputs, attrs, n.outputs[0] if a == resized[-1] else None)
    return out


# --- GridSample, AffineGrid -------------------------------------------------------------------------------

_GRID_MODES = {
    16: {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"},
    20: {"linear": "linear", "nearest": "nearest", "cubic": "cubic"},
}
"""GridSample's mode names per version (20 renamed them when it went N-D) -> aotc's."""


@converts("GridSample")
def _grid_sample(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    x, grid = n.inputs[:2]
    rank = len(x.type.shape) - 2
    names = _GRID_MODES[16 if n.older_than(20) else 20]
    mode = n.attr("mode", "bilinear" if n.older_than(20) else "linear")
    if mode not in names:
        raise cv.fail_version(f"mode {mode!r} is not one of {', '.join(names)}")
    padding = n.attr("padding_mode", "zeros")
    if padding not in ("zeros", "border", "reflection"):
        raise cv.fail(f"padding_mode {padding!r} is not one of zeros, border, reflection")
    if rank < 1 or (n.older_than(20) and rank != 2):
        raise cv.fail_version(
            f"X {x.type} must be 4-D{'' if n.older_than(20) else ' or more'} (N, C, spatial...)"
        )
    if rank > 3:
        raise cv.fail(f"X {x.type}: aotc samples 1 to 3 spatial axes")
    if grid.type.dtype not in _FLOATS:
        raise cv.fail(f"grid must be a float tensor, got {grid.type.dtype}")
    if names[mode] != "nearest" and x.type.dtype not in _FLOATS:
        raise cv.fail(f"{mode} interpolation of X needs a float tensor, got {x.type.dtype}")
    shape = grid.type.shape
    if len(shape) != rank + 2 or shape[0] != x.type.shape[0] or shape[-1] != rank:
        raise cv.fail(f"grid {grid.type} does not fit X {x.type}: it must be [N, *output, {rank}]")
    if names[mode] == "cubic" and padding == "border":
        # ONNX's reference clamps a cubic point outside to the border before it takes its taps; onnxruntime
        # (as PyTorch) clamps only the taps: they disagree on every point outside
        raise cv.fail(
            "cubic interpolation with padding_mode border is not supported (implementations differ)"
        )
    align = bool(n.attr("align_corners", 0))
    if padding == "reflection" and align and min(x.type.shape[2:]) == 1:
        raise cv.fail(
            f"reflection with align_corners about a spatial axis of extent 1 of X {x.type} is undefined"
        )
    attrs = {"mode": names[mode], "padding_mode": padding, "align_corners": align}
    return [cv.emit("grid_sample", [x, grid], attrs, n.outputs[0])]


def affine_base(size: list[int], align_corners: bool) -> np.ndarray:
    """AffineGrid's homogeneous coordinates [*size, rank + 1]: (x, y[, z], 1) of each point, normalized to
    [-1, 1] (the corners' centres with align_corners, else the edges of the corner elements)."""
    axes = []
    for d in size:
        if align_corners:
            axes.append(np.linspace(-1.0, 1.0, d) if d > 1 else np.full(1, -1.0))
        else:
            axes.append(-1.0 + (2.0 * np.arange(d) + 1.0) / d)
    grids = np.meshgrid(*axes, indexing="ij")
    return np.stack([*reversed(grids), np.ones(size)], axis=-1)


@converts("AffineGrid")
def _affine_grid(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    theta = n.inputs[0]
    size = cv.const_input(n, 1, "size")
    if theta.type.dtype not in _FLOATS:
        raise cv.fail(f"theta must be a float tensor, got {theta.type.dtype}")
    if size is None or size.size not in (4, 5):
        raise cv.fail("size must be (N, C, H, W) or (N, C, D, H, W)")
    size = [int(s) for s in size.reshape(-1)]
    rank = len(size) - 2
    if theta.type.shape != (size[0], rank, rank + 1) or min(size) < 1:
        raise cv.fail(f"theta {theta.type} does not fit size {size}: it must be [N, {rank}, {rank + 1}]")
    dtype = "float64" if theta.type.dtype == "float64" else "float32"
    base = cv.constant(affine_base(size[2:], bool(n.attr("align_corners", 0))).astype(dtype), "base")
    return [cv.emit("affine_grid", [theta, base], {}, n.outputs[0])]


# --- RoiAlign, DeformConv ---------------------------------------------------------------------------------


@converts("RoiAlign")
def _roi_align(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    x, rois, indices = n.inputs[:3]
    if x.type.dtype not in _FLOATS or rois.type.dtype != x.type.dtype:
        raise cv.fail(
            f"X and rois must be float tensors of one type, got {x.type.dtype} and {rois.type.dtype}"
        )
    if len(x.type.shape) != 4 or len(rois.type.shape) != 2 or rois.type.shape[1] != 4:
        raise cv.fail(f"X {x.type} must be [N, C, H, W] and rois {rois.type} [R, 4]")
    if indices.type.shape != (rois.type.shape[0],) or indices.type.dtype not in ("int32", "int64"):
        raise cv.fail(f"batch_indices {indices.type} must be [{rois.type.shape[0]}] integers")
    mode = n.attr("mode", "avg")
    if mode not in ("avg", "max"):
        raise cv.fail(f"mode {mode!r} is not one of avg, max")
    # RoiAlign-10 shifts no coordinate (16 names it output_half_pixel; its default is half_pixel)
    ctm = "output_half_pixel" if n.older_than(16) else n.attr("coordinate_transformation_mode", "half_pixel")
    if ctm not in ("half_pixel", "output_half_pixel"):
        raise cv.fail(f"coordinate_transformation_mode {ctm!r} is not one of half_pixel, output_half_pixel")
    out = (int(n.attr("output_height", 1)), int(n.attr("output_width", 1)))
    ratio, scale = int(n.attr("sampling_ratio", 0)), float(n.attr("spatial_scale", 1.0))
    if min(out) < 1 or ratio < 0:
        raise cv.fail(f"output {out} must be positive and sampling_ratio {ratio} not negative")
    if ratio > 0:
        sampling = (ratio, ratio)
    else:
        # ceil(roi extent / output extent) samples per bin: one count for every region needs them constant
        boxes = cv.const_input(n, 1, "rois (with sampling_ratio 0, the samples per bin depend on them)")
        half = 0.5 if ctm == "half_pixel" else 0.0
        box = boxes.astype(np.float64) * scale - half
        extent = box[:, 2:] - box[:, :2]
        if ctm != "half_pixel":
            extent = np.maximum(extent, 1.0)
        counts = np.ceil(extent[:, ::-1] / np.array(out, np.float64)).astype(np.int64)
        if counts.size and not (counts == counts[0]).all():
            raise cv.fail(
                f"sampling_ratio 0 with regions of different sample counts per bin ({counts.tolist()}); "
                "aotc samples every region alike"
            )
        sampling = tuple(max(int(c), 1) for c in counts[0]) if counts.size else (1, 1)
        if counts.size and counts.min() < 1:
            raise cv.fail(f"sampling_ratio 0 with an empty region ({counts.tolist()} samples per bin)")
    attrs = {
        "output_size": out,
        "sampling": sampling,
        "spatial_scale": scale,
        "half_pixel": ctm == "half_pixel",
        "mode": mode,
    }
    return [cv.emit("roi_align", [x, rois, indices], attrs, n.outputs[0])]


@converts("DeformConv")
def _deform_conv(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    x, w, offset = n.inputs[:3]
    bias, mask = n.input(3), n.input(4)
    if len(x.type.shape) != 4 or len(w.type.shape) != 4 or len(offset.type.shape) != 4:
        raise cv.fail(f"X {x.type}, W {w.type}, offset {offset.type}: aotc converts 2-D DeformConv only")
    if x.type.dtype not in _FLOATS or any(
        v is not None and v.type.dtype != x.type.dtype for v in (w, offset, bias, mask)
    ):
        raise cv.fail("X, W, offset, B and mask must be float tensors of one type")
    kernel = list(n.attr("kernel_shape", w.type.shape[2:]))
    if kernel != list(w.type.shape[2:]):
        raise cv.fail(f"kernel_shape {kernel} differs from W's {list(w.type.shape[2:])}")
    strides = list(n.attr("strides", [1, 1]))
    dilations = list(n.attr("dilations", [1, 1]))
    pads = list(n.attr("pads", [0, 0, 0, 0]))
    group, offset_group = int(n.attr("group", 1)), int(n.attr("offset_group", 1))
    if len(strides) != 2 or len(dilations) != 2 or len(pads) != 4 or min(strides + dilations) < 1:
        raise cv.fail(f"strides {strides}, dilations {dilations}, pads {pads} do not fit a 2-D convolution")
    (nb, cin, h, wd), (cout, cin_g, kh, kw) = x.type.shape, w.type.shape
    if group < 1 or offset_group < 1 or cin != cin_g * group or cout % group or cin % offset_group:
        raise cv.fail(f"X {x.type} and W {w.type} do not fit group {group} and offset_group {offset_group}")
    oh = (h + pads[0] + pads[2] - ((kh - 1) * dilations[0] + 1)) // strides[0] + 1
    ow = (wd + pads[1] + pads[3] - ((kw - 1) * dilations[1] + 1)) // strides[1] + 1
    if offset.type.shape != (nb, offset_group * kh * kw * 2, oh, ow):
        raise cv.fail(f"offset {offset.type} must be [{nb}, {offset_group * kh * kw * 2}, {oh}, {ow}]")
    if mask is not None and mask.type.shape != (nb, offset_group * kh * kw, oh, ow):
        raise cv.fail(f"mask {mask.type} must be [{nb}, {offset_group * kh * kw}, {oh}, {ow}]")
    if bias is not None and bias.type.shape != (cout,):
        raise cv.fail(f"B {bias.type} must be [{cout}]")
    attrs = {
        "strides": tuple(strides),
        "pads": (pads[0], pads[1]),
        "dilations": tuple(dilations),
        "group": group,
        "offset_group": offset_group,
        "has_bias": bias is not None,
        "has_mask": mask is not None,
    }
    inputs = [v for v in (x, w, offset, bias, mask) if v is not None]
    return [cv.emit("deform_conv2d", inputs, attrs, n.outputs[0])]
