"""ONNX frontend: Reductions, normalizations, pooling and signal operators (ReduceProd, LRN, LpPool, DFT, ...).

Each operator is built from existing graph ops (the product reduction and cumulative product of
nn.cumulative and nn.reduce included), following the operator's ONNX function body or, where it has none,
ONNX's reference implementation (onnx/reference/ops). What only depends on attributes and on inputs known at
build time (window functions, MelWeightMatrix, EyeLike, the DFT matrix) is computed here with numpy, in
float64, and becomes a constant.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from aotc.frontend.onnx import OnnxConverter, OnnxNode, converts, onnx_axis
from aotc.graph.ir import Value
from aotc.ir.expr import DTYPES

VERSIONS: dict[str, tuple[int, ...]] = {
    # Reductions: before 18 the axes are an attribute, from 18 an optional input (with
    # noop_with_empty_axes); 11 allows negative axes, 13 adds bfloat16 (a type aotc refuses).
    "ReduceProd": (1, 11, 13, 18),
    "ReduceLogSum": (1, 11, 13, 18, 28),  # 28: float types only (aotc computes it on floats only anyway)
    "CumProd": (26,),
    "MeanVarianceNormalization": (9, 13),  # 13: bfloat16
    "LRN": (1, 13),  # 13: bfloat16
    # 18 is deprecated (scale and bias per group), refused as such; 21: per channel, and stash_type
    "GroupNormalization": (21,),
    # 2: p an int (1's float p is older than opset 7); 11: reworded pads; 18: ceil_mode and dilations;
    # 22: bfloat16
    "LpPool": (2, 11, 18, 22),
    "EyeLike": (9, 22),  # 22: bfloat16
    "Tile": (6, 13),  # 6: repeats an input (1's tiles/axis inputs are older than opset 7)
    "HannWindow": (17,),
    "HammingWindow": (17,),
    "BlackmanWindow": (17,),
    "MelWeightMatrix": (17,),
    "DFT": (17, 20),  # 17: axis an attribute (default 1); 20: axis an input (default -2)
    "STFT": (17,),
}
"""ONNX operator -> the versions of it that this module converts (merged into aotc.frontend.onnx.VERSIONS)."""

_FLOATS = ("float16", "float32", "float64")


def _dtype_of(cv: OnnxConverter, code: int, what: str) -> str:
    """The aotc dtype of ONNX element type `code` (an attribute such as dtype or output_datatype)."""
    try:
        dtype = str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(code)))
    except (KeyError, TypeError, ValueError):
        dtype = None
    if dtype not in DTYPES:
        raise cv.fail(f"{what}={code} is not an element type aotc compiles (float16/32/64, integers, bool)")
    return dtype


def _scalar_input(cv: OnnxConverter, n: OnnxNode, i: int, what: str) -> int | float | None:
    """Optional input `i` as one number, needed at compile time."""
    value = cv.const_input(n, i, what)
    if value is None:
        return None
    if value.size != 1:
        raise cv.fail(f"input {i} ({what}) must be a scalar, got {value.size} values")
    return value.reshape(-1)[0].item()


# --- reductions and scans ---------------------------------------------------------------------------------


@converts("ReduceProd", "ReduceLogSum")
def _reduce(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """The product, or the log of the sum (ONNX's function body: ReduceSum, then Log), over the axes
    (all when none are given), the reduced axes kept with extent 1 unless keepdims=0."""
    x = n.inputs[0]
    dtype, ndim = x.type.dtype, len(x.type.shape)
    log_sum = n.op_type == "ReduceLogSum"
    if dtype == "bool" or (log_sum and dtype not in _FLOATS):
        raise cv.fail(
            f"{n.op_type} is computed on {'float' if log_sum else 'numeric'} tensors here, got {dtype}"
        )
    if n.older_than(18):
        raw = n.attr("axes")
    else:
        given = cv.const_input(n, 1, "axes")
        raw = None if given is None else given.reshape(-1).tolist()
    axes = sorted({onnx_axis(cv, int(a), ndim) for a in raw or ()})
    if not axes and (n.attr("noop_with_empty_axes", 0) or not ndim):
        # no reduction (the product or sum of a 0-d input's one element is itself): the input, or its log
        # for ReduceLogSum, whose function body's ReduceSum is then the identity
        return [cv.emit("log", [x], out=n.outputs[0]) if log_sum else x]
    attrs = {"axes": tuple(axes or range(ndim)), "keepdims": bool(n.attr("keepdims", 1))}
    if log_sum:
        return [cv.emit("log", [cv.emit("reduce_sum", [x], attrs)], out=n.outputs[0])]
    if dtype == "float16":  # products of float16 factors in float32, rounded once, as reduce_sum's sums
        wide = cv.emit("reduce_prod", [cv.emit("cast", [x], {"dtype": "float32"})], attrs)
        return [cv.emit("cast", [wide], {"dtype": "float16"}, n.outputs[0])]
    return [cv.emit("reduce_prod", [x], attrs, n.outputs[0])]


@converts("CumProd")
def _cumprod(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """Cumulative products along `axis` (input 1, a scalar needed at compile time), `exclusive` leaving out
    each element itself (a 1 in its place), `reverse` multiplying from the end."""
    x = n.inputs[0]
    if x.type.dtype == "bool" or not x.type.shape:
        raise cv.fail(f"CumProd needs a numeric tensor of rank 1 or more, got {x.type}")
    axis = _scalar_input(cv, n, 1, "axis")
    if axis is None:
        raise cv.fail("needs the axis input")
    attrs = {
        "axis": onnx_axis(cv, int(axis), len(x.type.shape)),
        "exclusive": bool(n.attr("exclusive", 0)),
        "reverse": bool(n.attr("reverse", 0)),
    }
    return [cv.emit("cumprod", [x], attrs, n.outputs[0])]


# --- normalizations ---------------------------------------------------------------------------------------


@converts("MeanVarianceNormalization")
def _mvn(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """(X - E[X]) / (sqrt(E[X^2] - E[X]^2) + 1e-9) over `axes` (default [0, 2, 3]), step by step as the
    operator's function body computes it."""
    x = n.inputs[0]
    if x.type.dtype not in _FLOATS:
        raise cv.fail(f"MeanVarianceNormalization is defined on float tensors, got {x.type.dtype}")
    ndim = len(x.type.shape)
    axes = tuple(sorted({onnx_axis(cv, int(a), ndim) for a in n.attr("axes", (0, 2, 3))}))
    if not axes:
        raise cv.fail("axes must name at least one axis")
    reduced = {"axes": axes, "keepdims": True}
    mean = cv.emit("reduce_mean", [x], reduced)
    mean_of_squares = cv.emit("reduce_mean", [cv.emit("multiply", [x, x])], reduced)
    variance = cv.emit("subtract", [mean_of_squares, cv.emit("multiply", [mean, mean])])
    std = cv.emit("add", [cv.emit("sqrt", [variance]), cv.constant(1e-9, "epsilon", x.type.dtype)])
    return [cv.emit("divide", [cv.emit("subtract", [x, mean]), std], out=n.outputs[0])]


@converts("LRN")
def _lrn(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """x / (bias + alpha / size * square_sum) ^ beta, square_sum over the channels c - floor((size-1)/2) to
    c + ceil((size-1)/2) (those that exist). The windowed sum is an average pool over the channel axis of
    the squares seen as [N, 1, C, D1*...*Dk], padded with zeros that count (sum / size). Float16 is
    computed in float32 and rounded once."""
    x = n.inputs[0]
    shape = x.type.shape
    if x.type.dtype not in _FLOATS or len(shape) < 2:
        raise cv.fail(f"LRN needs a float tensor [N, C, ...], got {x.type}")
    size = n.attr("size")
    if not isinstance(size, int) or size < 1:
        raise cv.fail(f"size must be a positive integer, got {size!r}")
    alpha, beta, bias = n.attr("alpha", 1e-4), n.attr("beta", 0.75), n.attr("bias", 1.0)
    dtype = "float32" if x.type.dtype == "float16" else x.type.dtype
    wide = cv.emit("cast", [x], {"dtype": dtype}) if dtype != x.type.dtype else x
    rows = cv.emit(
        "reshape",
        [cv.emit("multiply", [wide, wide])],
        {"shape": (shape[0], 1, shape[1], math.prod(shape[2:]))},
    )
    before, after = (size - 1) // 2, size // 2
    attrs = {
        "kernel": (size, 1),
        "strides": (1, 1),
        "dilations": (1, 1),
        "pads": (before, 0, after, 0),
        "ceil_mode": False,
        "count_include_pad": True,
    }
    mean = cv.emit("reshape", [cv.emit("avg_pool2d", [rows], attrs)], {"shape": shape})
    scaled = cv.emit("multiply", [mean, cv.constant(alpha, "alpha", dtype)])
    base = cv.emit("add", [scaled, cv.constant(bias, "bias", dtype)])
    y = cv.emit("divide", [wide, cv.emit("power", [base, cv.constant(beta, "beta", dtype)])])
    return [cv.emit("cast", [y], {"dtype": x.type.dtype}) if wide is not x else y]


@converts("GroupNormalization")
def _group_norm(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """GroupNormalization-21: each group of C / num_groups channels of each instance normalized to zero
    mean and unit variance (computed in float32 under stash_type 1, the default, as the function body
    casts X), cast back to X's type, then times scale and plus bias, one of each per channel."""
    x, scale, bias = n.inputs[:3]
    shape, dtype = x.type.shape, x.type.dtype
    if dtype not in _FLOATS or len(shape) < 2:
        raise cv.fail(f"GroupNormalization needs a float tensor [N, C, ...], got {x.type}")
    channels, groups = shape[1], n.attr("num_groups")
    if not isinstance(groups, int) or groups < 1 or channels % groups:
        raise cv.fail(f"num_groups={groups!r} must divide the {channels} channels")
    for v, what in ((scale, "scale"), (bias, "bias")):
        if v.type.shape != (channels,) or v.type.dtype != dtype:
            raise cv.fail(f"{what} must be one {dtype} per channel ({channels}), got {v.type}")
    stash = n.attr("stash_type", 1)
    if stash == onnx.TensorProto.FLOAT:
        wide_dtype = "float32"
    elif _dtype_of(cv, stash, "stash_type") == dtype:
        wide_dtype = dtype
    else:
        raise cv.fail(f"stash_type={stash} is not supported (1: float32, or the input's own type)")
    wide = cv.emit("cast", [x], {"dtype": wide_dtype}) if wide_dtype != dtype else x
    grouped = cv.emit("reshape", [wide], {"shape": (shape[0], groups, math.prod(shape[1:]) // groups)})
    ones = cv.constant(np.ones(groups), "ones", wide_dtype)
    zeros = cv.constant(np.zeros(groups), "zeros", wide_dtype)
    epsilon = n.attr("epsilon", 1e-5)
    normalized = cv.emit("instance_norm", [grouped, ones, zeros], {"epsilon": epsilon})
    if wide_dtype != dtype:
        normalized = cv.emit("cast", [normalized], {"dtype": dtype})
    y = cv.emit("reshape", [normalized], {"shape": shape})
    per_channel = {"shape": (channels,) + (1,) * (len(shape) - 2)}
    y = cv.emit("multiply", [y, cv.emit("reshape", [scale], per_channel)])
    return [cv.emit("add", [y, cv.emit("reshape", [bias], per_channel)], out=n.outputs[0])]


# --- pooling ------------------------------------------------------------------------------------------------


def _taps(out: int, size: int, k: int, s: int, d: int, begin: int, end: int) -> np.ndarray:
    """How many of each output's k window taps (step d) fall in the padded input [-begin, size + end)."""
    starts = np.arange(out)[:, None] * s - begin + np.arange(k)[None, :] * d
    return ((starts >= -begin) & (starts < size + end)).sum(axis=1)


def _pool_pads(cv: OnnxConverter, n: OnnxNode, sizes, kernel, strides, dilations) -> list[int]:
    """ONNX pads [begin..., end...] of a pooling window, auto_pad resolved (SAME_UPPER puts the odd one of
    a total at the end, SAME_LOWER at the beginning)."""
    rank = len(sizes)
    auto_pad = n.attr("auto_pad", "NOTSET")
    if auto_pad == "NOTSET":
        pads = [int(v) for v in n.attr("pads", [0] * 2 * rank)]
    elif auto_pad == "VALID":
        pads = [0] * 2 * rank
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        totals = [
            max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
            for size, k, s, d in zip(sizes, kernel, strides, dilations)
        ]
        begin = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in totals]
        pads = begin + [t - b for t, b in zip(totals, begin)]
    else:
        raise cv.fail(f"unknown auto_pad {auto_pad!r}")
    if len(pads) != 2 * rank or min(pads) < 0:
        raise cv.fail(f"pads {pads} must be two non-negative values per spatial axis ({rank})")
    return pads


@converts("LpPool")
def _lp_pool(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """(sum over the window of |x|^p)^(1/p), the padding adding zeros, over any number of spatial axes.
    A box window's sum is separable: one spatial axis at a time, an average pool of a [N, rest, axis, rest]
    view with a (k, 1) window whose padding counts, times the number of taps each window has in the padded
    input (the kernel extent; fewer only at windows that ceil_mode adds past the padding). Float16 is
    computed in float32 and rounded once."""
    x = n.inputs[0]
    dtype, shape = x.type.dtype, x.type.shape
    if dtype not in _FLOATS or len(shape) < 3:
        raise cv.fail(f"LpPool needs a float tensor [N, C, D1, ...], got {x.type}")
    rank = len(shape) - 2
    kernel = n.attr("kernel_shape")
    strides, dilations = n.attr("strides", [1] * rank), n.attr("dilations", [1] * rank)
    if kernel is None or not len(kernel) == len(strides) == len(dilations) == rank:
        raise cv.fail(
            f"kernel_shape {kernel}, strides {strides} and dilations {dilations} need {rank} values"
        )
    if min(*kernel, *strides, *dilations) < 1:
        raise cv.fail(f"kernel_shape {kernel}, strides {strides} and dilations {dilations} must be positive")
    p = n.attr("p", 2)
    if not isinstance(p, int) or p < 1:
        raise cv.fail(f"p must be a positive integer, got {p!r}")
    pads = _pool_pads(cv, n, shape[2:], kernel, strides, dilations)
    wide = "float32" if dtype == "float16" else dtype
    y = cv.emit("cast", [x], {"dtype": wide}) if wide != dtype else x
    y = cv.emit("abs", [y]) if p == 1 else cv.emit("multiply", [y, y]) if p == 2 else y
    if p > 2:
        y = cv.emit("power", [cv.emit("abs", [y]), cv.constant(p, "p", wide)])
    ceil_mode = bool(n.attr("ceil_mode", 0))
    for a, (k, s, d, begin, end) in enumerate(zip(kernel, strides, dilations, pads[:rank], pads[rank:])):
        if k == 1 and s == 1 and begin == end == 0:
            continue  # each window is the element itself
        now, axis = y.type.shape, 2 + a
        view = (now[0], math.prod(now[1:axis]), now[axis], math.prod(now[axis + 1 :]))
        attrs = {
            "kernel": (k, 1),
            "strides": (s, 1),
            "dilations": (d, 1),
            "pads": (begin, 0, end, 0),
            "ceil_mode": ceil_mode,
            "count_include_pad": True,
        }
        mean = cv.emit("avg_pool2d", [cv.emit("reshape", [y], {"shape": view})], attrs)
        out = mean.type.shape[2]
        taps = _taps(out, now[axis], k, s, d, begin, end)
        count = cv.constant(taps.reshape(out, 1) if (taps != k).any() else k, "taps", wide)
        y = cv.emit(
            "reshape", [cv.emit("multiply", [mean, count])], {"shape": (*now[:axis], out, *now[axis + 1 :])}
        )
    if p == 2:
        y = cv.emit("sqrt", [y])
    elif p > 2:
        y = cv.emit("power", [y, cv.constant(1.0 / p, "inverse_p", wide)])
    return [cv.emit("cast", [y], {"dtype": dtype}) if wide != dtype else y]


# --- tensors made from shapes and attributes ----------------------------------------------------------------


@converts("EyeLike")
def _eye_like(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """Ones on the k-th diagonal of a matrix of the input's shape, zeros elsewhere: a constant, since only
    the input's shape is read."""
    x = n.inputs[0]
    if len(x.type.shape) != 2:
        raise cv.fail(f"EyeLike needs a 2-D input, got {x.type}")
    dtype = _dtype_of(cv, n.attr("dtype"), "dtype") if n.attr("dtype") is not None else x.type.dtype
    rows, cols = x.type.shape
    return [cv.constant(np.eye(rows, cols, int(n.attr("k", 0)), dtype), "eye", out=n.outputs[0])]


@converts("Tile")
def _tile(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """The input repeated `repeats` times along each axis (input 1, needed at compile time): each repeated
    axis of extent s read as [r, s] by a broadcast over a new axis before it, then merged."""
    x = n.inputs[0]
    shape = x.type.shape
    repeats = cv.const_input(n, 1, "repeats")
    if repeats is None or repeats.ndim != 1 or repeats.size != len(shape):
        raise cv.fail(f"repeats must hold one count per axis of {x.type}")
    counts = [int(r) for r in repeats]
    if any(r < 1 for r in counts):
        raise cv.fail(f"repeats {counts} must be positive (aotc compiles tensors with at least one element)")
    if all(r == 1 for r in counts):
        return [x]
    spread = [d for s, r in zip(shape, counts) for d in ((1, s) if r > 1 else (s,))]
    wide = [d for s, r in zip(shape, counts) for d in ((r, s) if r > 1 else (s,))]
    y = cv.emit("broadcast_to", [cv.emit("reshape", [x], {"shape": tuple(spread)})], {"shape": tuple(wide)})
    return [cv.emit("reshape", [y], {"shape": tuple(s * r for s, r in zip(shape, counts))}, n.outputs[0])]


# --- signal processing --------------------------------------------------------------------------------------

_WINDOWS = {
    # w[n] for n in [0, size) over N = size (periodic, the default) or size - 1 (symmetric), as ONNX's
    # reference computes them (Hamming's alpha is 25/46, not 0.54)
    "HannWindow": lambda n, N: np.sin(np.pi * n / N) ** 2,
    "HammingWindow": lambda n, N: 25 / 46 - (1 - 25 / 46) * np.cos(2 * np.pi * n / N),
    "BlackmanWindow": lambda n, N: 0.42 - 0.5 * np.cos(2 * np.pi * n / N) + 0.08 * np.cos(4 * np.pi * n / N),
}


@converts(*_WINDOWS)
def _window(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """A window of `size` (input 0, needed at compile time) values: a constant, computed in float64 and
    cast to output_datatype (default float32)."""
    size = _scalar_input(cv, n, 0, "size")
    if size is None or int(size) != size or size < 1:
        raise cv.fail(f"size must be a positive integer, got {size!r}")
    size, periodic = int(size), n.attr("periodic", 1)
    if not periodic and size == 1:
        raise cv.fail("a symmetric window (periodic=0) of size 1 divides by size - 1 = 0")
    dtype = _dtype_of(cv, n.attr("output_datatype", onnx.TensorProto.FLOAT), "output_datatype")
    values = _WINDOWS[n.op_type](np.arange(size, dtype=np.float64), size if periodic else size - 1)
    return [cv.constant(values.astype(dtype), "window", out=n.outputs[0])]


@converts("MelWeightMatrix")
def _mel_weight_matrix(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """The [dft_length // 2 + 1, num_mel_bins] matrix of triangular mel filters: a constant from inputs
    needed at compile time, computed step by step as ONNX's reference does (its frequency bins are floored,
    so each numpy operation keeps the reference's operand types)."""
    names = ("num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz", "upper_edge_hertz")
    values = [cv.const_input(n, i, what) for i, what in enumerate(names)]
    if any(v is None or v.size != 1 for v in values):
        raise cv.fail(f"inputs {', '.join(names)} must be scalars")
    bins, dft_length, sample_rate, lower, upper = (v.reshape(()) for v in values)
    if bins < 1 or dft_length < 1 or sample_rate < 1 or not 0 <= lower < upper:
        raise cv.fail(
            f"num_mel_bins {bins}, dft_length {dft_length} and sample_rate {sample_rate} must be positive and "
            f"0 <= lower_edge_hertz {lower} < upper_edge_hertz {upper}"
        )
    spectrogram_bins = int(dft_length) // 2 + 1
    low_mel = 2595 * np.log1p(lower / 700) / np.log(10)
    high_mel = 2595 * np.log1p(upper / 700) / np.log(10)
    steps = np.arange(0, int(bins) + 2)
    mel_step = (high_mel - low_mel) / steps.shape[0]
    hertz = 700 * np.expm1((steps * mel_step + low_mel) / 2595 * np.log(10))
    edges = (((dft_length + 1) * hertz) // sample_rate).astype(int)
    if edges.min() < 0 or edges.max() >= spectrogram_bins:
        raise cv.fail(
            f"upper_edge_hertz {upper} lies above the {spectrogram_bins} spectrogram bins of dft_length "
            f"{dft_length} at sample_rate {sample_rate}"
        )
    out = np.zeros((spectrogram_bins, int(bins)))
    for i in range(int(bins)):
        left, center, right = edges[i : i + 3]
        if center == left:
            out[center, i] = 1
        else:
            out[left : center + 1, i] = (np.arange(left, center + 1) - left) / (center - left)
        if right > center:
            out[center:right, i] = (right - np.arange(center, right)) / (right - center)
    dtype = _dtype_of(cv, n.attr("output_datatype", onnx.TensorProto.FLOAT), "output_datatype")
    return [cv.constant(out.astype(dtype), "mel_weights", out=n.outputs[0])]


def _dft_matrix(used: int, components: int, length: int, inverse: bool, onesided: bool) -> np.ndarray:
    """The float64 matrix M with y = x M for x the first `used` samples along the axis, each `components`
    (1: real, 2: real and imaginary) numbers in a row, and y the interleaved real and imaginary parts of
    the DFT of `length` points (the samples past `used` are zeros): all `length` of them, or the first
    length // 2 + 1 when `onesided`. For an inverse `onesided` DFT (IRFFT) the `used` samples are the
    one-sided spectrum of a real signal, the other half their conjugates, and y the `length` real values."""
    n = np.arange(used)[:, None]
    if inverse and onesided:
        t = np.arange(length)[None, :]
        angle = 2 * np.pi * ((n * t) % length) / length
        # each bin k stands for k and length - k, except bin 0 and (for even lengths) bin length / 2
        twice = np.where((n == 0) | (2 * n == length), 1.0, 2.0) / length
        rows = [twice * np.cos(angle), -twice * np.sin(angle)]
        return np.stack(rows[:components], axis=1).reshape(used * components, length)
    k = np.arange(length // 2 + 1 if onesided else length)[None, :]
    # the angle reduced modulo the length first, so that large n * k lose no precision in the cosine
    angle = (1 if inverse else -1) * 2 * np.pi * ((n * k) % length) / length
    cos, sin = np.cos(angle), np.sin(angle)
    if inverse:
        cos, sin = cos / length, sin / length
    real_row = np.stack([cos, sin], axis=-1)  # a real sample a: a cos + i a sin
    imag_row = np.stack([-sin, cos], axis=-1)  # an imaginary one i b: -b sin + i b cos
    rows = [real_row, imag_row][:components]
    return np.stack(rows, axis=1).reshape(used * components, -1)


_DFT_MATRIX_LIMIT = 1 << 24
"""The most elements of a DFT's constant float64 matrix (a DFT of about 2048 complex points): larger
transforms would need an FFT, which aotc does not compute."""


def _dft(cv: OnnxConverter, x: Value, axis: int, length: int, inverse: bool, onesided: bool) -> Value:
    """The DFT of `length` points of x [..., c] (c: 1 real, 2 complex) along `axis`: a matrix product with a
    constant DFT matrix, in float64 (as numpy's FFT computes ONNX's reference values) and cast back."""
    shape, dtype = x.type.shape, x.type.dtype
    rank, components = len(shape), shape[-1]
    used = min(shape[axis], length // 2 + 1 if inverse and onesided else length)
    columns = length if inverse and onesided else 2 * (length // 2 + 1 if onesided else length)
    if used * components * columns > _DFT_MATRIX_LIMIT:
        raise cv.fail(
            f"a DFT of {length} points over {used} samples: aotc computes it as a product with a constant "
            f"{used * components}x{columns} matrix, which it limits to {_DFT_MATRIX_LIMIT} elements (128 MiB)"
        )
    if axis != rank - 2:  # the transformed axis next to the components, so that each row is one signal
        perm = [d for d in range(rank - 1) if d != axis] + [axis, rank - 1]
        x = cv.emit("transpose", [x], {"perm": tuple(perm)})
    moved = x.type.shape
    if used < moved[-2]:
        begin, end = [0] * rank, list(moved)
        end[-2] = used
        x = cv.emit("strided_slice", [x], {"begin": tuple(begin), "end": tuple(end), "strides": (1,) * rank})
    if dtype != "float64":
        x = cv.emit("cast", [x], {"dtype": "float64"})
    rows = cv.emit("reshape", [x], {"shape": (*moved[:-2], used * components)})
    matrix = _dft_matrix(used, components, length, inverse, onesided)
    y = cv.emit("matmul", [rows, cv.constant(matrix, "dft_matrix", "float64")])
    parts = 1 if inverse and onesided else 2
    y = cv.emit("reshape", [y], {"shape": (*moved[:-2], matrix.shape[1] // parts, parts)})
    if dtype != "float64":
        y = cv.emit("cast", [y], {"dtype": dtype})
    if axis != rank - 2:
        back = list(range(rank - 2))
        back.insert(axis, rank - 2)
        y = cv.emit("transpose", [y], {"perm": (*back, rank - 1)})
    return y


@converts("DFT")
def _dft_op(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """The DFT (inverse: the inverse DFT, scaled by 1 / length) along `axis` of a real ([..., 1]) or complex
    ([..., 2]) input, over dft_length points (input 1, needed at compile time: the signal cut or padded
    with zeros). onesided: the first length // 2 + 1 frequencies of a real signal (RFFT), or with inverse
    the real signal of such a one-sided complex spectrum (IRFFT)."""
    x = n.inputs[0]
    shape = x.type.shape
    if x.type.dtype not in _FLOATS or len(shape) < 2 or shape[-1] not in (1, 2):
        raise cv.fail(
            f"DFT needs a float tensor [..., 1] (real) or [..., 2] (complex) of rank 2 or more, got {x.type}"
        )
    rank = len(shape)
    raw = n.attr("axis", 1) if n.older_than(20) else _scalar_input(cv, n, 2, "axis")
    raw = -2 if raw is None else int(raw)
    if not (-rank <= raw <= -2 or 0 <= raw <= rank - 2):
        raise cv.fail(
            f"axis {raw} must be in [-{rank}, -2] or [0, {rank - 2}] (the last axis holds the components)"
        )
    axis = raw % rank
    inverse, onesided = bool(n.attr("inverse", 0)), bool(n.attr("onesided", 0))
    complex_input = shape[-1] == 2
    if onesided and complex_input != inverse:
        raise cv.fail(
            "onesided=1 takes a real input for the forward DFT (RFFT) and a complex one for the inverse (IRFFT), "
            f"got a {'complex' if complex_input else 'real'} input with inverse={int(inverse)}"
        )
    length = _scalar_input(cv, n, 1, "dft_length")
    if length is None:
        length = 2 * (shape[axis] - 1) if inverse and onesided else shape[axis]
    if int(length) != length or length < 1:
        raise cv.fail(f"dft_length must be a positive integer, got {length!r}")
    return [_dft(cv, x, axis, int(length), inverse, onesided)]


@converts("STFT")
def _stft(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """The DFTs of the frames of signal [batch, length, c], each frame_length samples frame_step apart and
    times the window (input 2, all ones when absent): [batch, frames, bins, 2], the first
    frame_length // 2 + 1 bins of each (real signals only) when onesided (the default)."""
    signal, window = n.inputs[0], n.input(2)
    shape = signal.type.shape
    if signal.type.dtype not in _FLOATS or len(shape) != 3 or shape[-1] not in (1, 2):
        raise cv.fail(f"STFT needs a float signal [batch, length, 1 or 2], got {signal.type}")
    step = _scalar_input(cv, n, 1, "frame_step")
    if step is None or int(step) != step or step < 1:
        raise cv.fail(f"frame_step must be a positive integer, got {step!r}")
    frame = _scalar_input(cv, n, 3, "frame_length")
    if window is not None:
        if len(window.type.shape) != 1 or window.type.dtype != signal.type.dtype:
            raise cv.fail(f"window must be 1-D of the signal's type, got {window.type}")
        if frame is not None and frame != window.type.shape[0]:
            raise cv.fail(f"frame_length {frame} differs from the window's length {window.type.shape[0]}")
        frame = window.type.shape[0]
    frame = shape[1] if frame is None else frame
    if int(frame) != frame or not 1 <= frame <= shape[1]:
        raise cv.fail(
            f"frame_length {frame!r} must be a positive integer no longer than the signal ({shape[1]})"
        )
    frame, step = int(frame), int(step)
    onesided = bool(n.attr("onesided", 1))
    if onesided and shape[-1] == 2:
        raise cv.fail("onesided=1 (the default) needs a real signal [batch, length, 1], got a complex one")
    frames = 1 + (shape[1] - frame) // step
    starts = np.arange(frames)[:, None] * step + np.arange(frame)[None, :]
    x = cv.emit("take", [signal, cv.constant(starts, "frame_indices", "int64")], {"axis": 1})
    if window is not None:
        x = cv.emit("multiply", [x, cv.emit("reshape", [window], {"shape": (frame, 1)})])
    return [_dft(cv, x, 2, frame, False, onesided)]
