"""NHWC float operators (TFLite layouts): numpy reference evaluator and the default schedule compiled
through LLVM, both against float64 numpy references written here."""

from __future__ import annotations

import numpy as np
import pytest

from aotc.codegen.module import build_module, load_library
from aotc.graph.interpret import node_compute
from aotc.graph.ir import Node, TensorType
from aotc.schedule.default import default_schedule
from aotc.schedule.lower import lower
from aotc.target import host_target
from aotc.te.dag import ComputeDAG
from aotc.te.reference import evaluate

RTOL, ATOL = 1e-4, 1e-5


def compile_ops(cases: list[tuple[str, str, list[np.ndarray], dict]], tmp_path) -> dict[str, tuple]:
    """Build every (name, op, inputs, attrs) case with the default schedule into one library; returns
    name -> (reference evaluator output, compiled output)."""
    target = host_target()
    built = []
    for name, op, arrays, attrs in cases:
        types = [TensorType(a.shape, str(a.dtype)) for a in arrays]
        placeholders, outs = node_compute(Node(op, [], [], attrs), types)
        dag = ComputeDAG(outs)
        feed = {p.name: a for p, a in zip(placeholders, arrays) if p in dag.ops}
        built.append((name, dag, feed))
    funcs = [lower(default_schedule(dag, target), name) for name, dag, _ in built]
    library = load_library(build_module(funcs, target, str(tmp_path / "ops.so")))
    results = {}
    for name, dag, feed in built:
        (ref,) = evaluate(dag, feed)
        out = np.zeros(ref.shape, ref.dtype)
        library.kernel(name)(*(feed[p.name] for p in dag.placeholders), out)
        results[name] = (ref, out)
    return results


def pad_nhwc(x: np.ndarray, pads, value=0) -> np.ndarray:
    t, l, b, r = pads
    return np.pad(x, ((0, 0), (t, b), (l, r), (0, 0)), constant_values=value)


def conv_ref(x, w, strides, pads, dilations, groups=1, dtype=np.float64):
    """NHWC conv, OHWI weight, computed in `dtype` (float64, or int64 for exact integer sums)."""
    x, w = x.astype(dtype), w.astype(dtype)
    (sh, sw), (dh, dw) = strides, dilations
    xp = pad_nhwc(x, pads)
    n, hp, wp, c = xp.shape
    o, kh, kw, icg = w.shape
    oh = (hp - dh * (kh - 1) - 1) // sh + 1
    ow = (wp - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, oh, ow, o), dtype)
    ocg = o // groups
    for g in range(groups):
        for ky in range(kh):
            for kx in range(kw):
                patch = xp[
                    :, ky * dh : ky * dh + sh * (oh - 1) + 1 : sh, kx * dw : kx * dw + sw * (ow - 1) + 1 : sw
                ]
                patch = patch[..., g * icg : (g + 1) * icg]
                out[..., g * ocg : (g + 1) * ocg] += patch @ w[g * ocg : (g + 1) * ocg, ky, kx, :].T
    return out


def depthwise_ref(x, w, strides, pads, dilations, mult, dtype=np.float64):
    """Depthwise conv, weight [1, KH, KW, C*M], computed in `dtype`."""
    x, w = x.astype(dtype), w.astype(dtype)
    (sh, sw), (dh, dw) = strides, dilations
    xp = np.repeat(pad_nhwc(x, pads), mult, axis=3)
    _, kh, kw, _ = w.shape
    oh = (xp.shape[1] - dh * (kh - 1) - 1) // sh + 1
    ow = (xp.shape[2] - dw * (kw - 1) - 1) // sw + 1
    out = 0
    for ky in range(kh):
        for kx in range(kw):
            patch = xp[
                :, ky * dh : ky * dh + sh * (oh - 1) + 1 : sh, kx * dw : kx * dw + sw * (ow - 1) + 1 : sw
            ]
            out = out + patch * w[0, ky, kx]
    return out


def transpose_conv_ref(x, w, strides, pads, output_size):
    """Scatter form of TFLite TRANSPOSE_CONV, cropped to output_size at (pad_top, pad_left)."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    (sh, sw), (pt, pl) = strides, pads[:2]
    n, h, wd, _ = x.shape
    o, kh, kw, _ = w.shape
    oh, ow = output_size
    full = np.zeros((n, max((h - 1) * sh + kh, pt + oh), max((wd - 1) * sw + kw, pl + ow), o))
    for iy in range(h):
        for ix in range(wd):
            full[:, iy * sh : iy * sh + kh, ix * sw : ix * sw + kw] += np.einsum(
                "ni,oyxi->nyxo", x[:, iy, ix], w
            )
    return full[:, pt : pt + oh, pl : pl + ow]


def pool_ref(x, kind, kernel, strides, pads):
    """TFLite pooling: padded taps are skipped (max) and not counted (avg)."""
    (kh, kw), (sh, sw) = kernel, strides
    pt, pl, pb, pr = pads
    n, h, w, c = x.shape
    oh = (h + pt + pb - kh) // sh + 1
    ow = (w + pl + pr - kw) // sw + 1
    out = np.zeros((n, oh, ow, c), np.float64 if kind == "avg" else x.dtype)
    for y in range(oh):
        for xx in range(ow):
            y0, x0 = y * sh - pt, xx * sw - pl
            win = x[:, max(y0, 0) : min(y0 + kh, h), max(x0, 0) : min(x0 + kw, w)]
            out[:, y, xx] = (
                win.max(axis=(1, 2)) if kind == "max" else win.astype(np.float64).mean(axis=(1, 2))
            )
    return out


def _rand(rng, *shape):
    return rng.uniform(-1, 1, shape).astype(np.float32)


def float_cases(rng):
    """(name, op, inputs, attrs, float64 expected)."""
    cases = []
    conv = [
        ((1, 7, 8, 5), (6, 3, 3, 5), {"strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1)}),
        ((2, 9, 7, 4), (8, 3, 2, 4), {"strides": (2, 1), "pads": (0, 1, 1, 0), "dilations": (1, 2)}),
        ((1, 6, 6, 16), (32, 1, 1, 16), {"strides": (1, 1), "pads": (0, 0, 0, 0), "dilations": (1, 1)}),
        ((1, 8, 8, 6), (4, 3, 3, 3), {"strides": (2, 2), "pads": (0, 0, 1, 1), "dilations": (1, 1)}),
    ]
    for i, (xs, ws, attrs) in enumerate(conv):
        x, w, b = _rand(rng, *xs), _rand(rng, *ws), _rand(rng, ws[0])
        groups = xs[3] // ws[3]
        ref = conv_ref(x, w, attrs["strides"], attrs["pads"], attrs["dilations"], groups)
        inputs = [x, w, b] if i % 2 == 0 else [x, w]
        cases.append((f"conv_{i}", "conv2d_nhwc", inputs, attrs, ref + b if i % 2 == 0 else ref))
    depthwise = [
        ((1, 7, 8, 8), 1, {"strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1)}),
        ((2, 9, 9, 3), 2, {"strides": (2, 2), "pads": (0, 0, 1, 1), "dilations": (1, 1)}),
        ((1, 8, 7, 4), 1, {"strides": (1, 2), "pads": (2, 1, 2, 1), "dilations": (2, 1)}),
        # padded per register block (float, one channel per input channel): a batch of 2 at stride 2, and
        # a 7x7 stage whose few rows put blocks of channels in the parallel loop too
        ((2, 9, 10, 32), 1, {"strides": (2, 2), "pads": (1, 1, 1, 1), "dilations": (1, 1)}),
        ((1, 7, 7, 48), 1, {"strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1)}),
    ]
    for i, (xs, mult, attrs) in enumerate(depthwise):
        x, w, b = _rand(rng, *xs), _rand(rng, 1, 3, 3, xs[3] * mult), _rand(rng, xs[3] * mult)
        ref = depthwise_ref(x, w, attrs["strides"], attrs["pads"], attrs["dilations"], mult) + b
        cases.append(
            (f"depthwise_{i}", "depthwise_conv2d_nhwc", [x, w, b], {**attrs, "depth_multiplier": mult}, ref)
        )
    transpose = [
        ((1, 4, 5, 3), (6, 3, 3, 3), (2, 2), (1, 1, 0, 0), (8, 10)),
        ((2, 3, 3, 4), (2, 2, 2, 4), (2, 2), (0, 0, 0, 0), (6, 6)),
        ((1, 5, 4, 2), (3, 3, 3, 2), (1, 1), (1, 1, 1, 1), (5, 4)),
        ((1, 3, 4, 2), (4, 4, 3, 2), (3, 2), (1, 0, 1, 1), (9, 8)),
    ]
    for i, (xs, ws, strides, pads, size) in enumerate(transpose):
        x, w, b = _rand(rng, *xs), _rand(rng, *ws), _rand(rng, ws[0])
        attrs = {"strides": strides, "pads": pads, "output_size": size}
        ref = transpose_conv_ref(x, w, strides, pads, size) + b
        cases.append((f"transpose_{i}", "conv2d_transpose_nhwc", [x, w, b], attrs, ref))
    pools = [
        ("max", (3, 3), (2, 2), (1, 1, 1, 1)),
        ("avg", (3, 3), (2, 2), (0, 0, 1, 1)),
        ("avg", (2, 3), (1, 2), (1, 1, 0, 1)),
        ("avg", (2, 2), (2, 2), (0, 0, 0, 0)),
    ]
    x = _rand(rng, 2, 7, 8, 5)
    for i, (kind, kernel, strides, pads) in enumerate(pools):
        attrs = {"kind": kind, "kernel": kernel, "strides": strides, "pads": pads}
        cases.append((f"pool_{i}", "pool2d_nhwc", [x], attrs, pool_ref(x, kind, kernel, strides, pads)))
    return cases


def test_float_nhwc_ops_match_numpy(tmp_path):
    cases = float_cases(np.random.default_rng(0))
    results = compile_ops([c[:4] for c in cases], tmp_path)
    for name, _, _, _, expected in cases:
        ref, got = results[name]
        assert got.shape == expected.shape, name
        np.testing.assert_allclose(
            ref, expected, rtol=RTOL, atol=ATOL, err_msg=f"{name} (reference evaluator)"
        )
        np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL, err_msg=f"{name} (compiled)")


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_max_pool_on_integers(dtype, tmp_path):
    info = np.iinfo(dtype)
    x = np.random.default_rng(1).integers(info.min, info.max + 1, (1, 6, 7, 9), dtype=dtype)
    x[0, 0, 0, 0] = info.min
    attrs = {"kind": "max", "kernel": (3, 2), "strides": (2, 2), "pads": (1, 1, 1, 0)}
    ref, got = compile_ops([("pool", "pool2d_nhwc", [x], attrs)], tmp_path)["pool"]
    expected = pool_ref(x, "max", (3, 2), (2, 2), (1, 1, 1, 0))
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(ref, expected)
    np.testing.assert_array_equal(got, expected)


def test_bad_shapes_name_the_operator():
    from aotc.te import TEError

    with pytest.raises(TEError, match="conv2d_nhwc"):
        node_compute(
            Node("conv2d_nhwc", [], [], {}),
            [TensorType((1, 4, 4, 6), "float32"), TensorType((2, 3, 3, 4), "float32")],
        )
    with pytest.raises(TEError, match="depthwise"):
        node_compute(
            Node("depthwise_conv2d_nhwc", [], [], {"depth_multiplier": 2}),
            [TensorType((1, 4, 4, 3), "float32"), TensorType((1, 3, 3, 3), "float32")],
        )
