"""Element-wise math operators (aotc.frontend.onnx_math): trigonometric and hyperbolic functions, Sign,
IsNaN/IsInf, the activations Selu, Celu, Mish, Shrink, Softsign, ThresholdedRelu, Swish, and the Bitwise
operators, built as the ONNX backend builds a model and compared with onnxruntime (numpy in float64 where
onnxruntime has no kernel); the libm/libmvec calls behind the trigonometric functions against numpy over
a wide range; their OpenCL and CUDA forms; and refusals.

Tolerances, and why:
- float32 trigonometric and hyperbolic functions: within 4 ulp of the exact result (numpy in float64,
  rounded): glibc's libmvec variants are documented within 4 ulp (its scalar libm within 1-2), and both
  reduce arguments exactly, so sin(1e30) is as close as sin(1).
- float64 ones: within 4 ulp too (the same libraries' double variants).
- against onnxruntime (float32): 2e-6 relative plus 1e-6 of the largest magnitude: onnxruntime's own
  approximations (Eigen, MLAS) are a few ulp off in other directions.
- activations (Selu, Celu, Mish, Softsign, Swish): float32 within 8 ulp of float64 numpy, or 4e-7 absolute
  where the result crosses 0 (an exp or log of a few ulp, times a constant); float16 is computed in float32
  and rounded once, so within 1 float16 ulp; float64 within 1e-14 relative.
- integers and bools (Sign, IsNaN, IsInf, Shrink on integers, Bitwise*): exact.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from aotc import te
from aotc.codegen import llvm as llvm_codegen
from aotc.codegen.gpu import compile_cuda, emit_gpu, nvcc_path, opencl_device, run_opencl
from aotc.codegen.llvm import build_llvm_ir
from aotc.codegen.module import build_module, load_library
from aotc.codegen.vecmath import veclib_for
from aotc.frontend.errors import ConversionError
from aotc.frontend.onnx import load_onnx
from aotc.ir.expr import Buffer, Load, Var, call, const, minimum
from aotc.ir.stmt import BufferStore, For, ForKind, PrimFunc
from aotc.onnx_backend import REFUSALS, AotcBackend
from aotc.schedule.lower import lower
from aotc.schedule.state import Annotation, State
from aotc.target import parse_target
from aotc.te.reference import evaluate
from aotc.topi import elemwise

TRIG = {
    "Sin": (np.sin, (-1e30, 1e30)),
    "Cos": (np.cos, (-1e30, 1e30)),
    "Tan": (np.tan, (-1e30, 1e30)),
    "Asin": (np.arcsin, (-1.0, 1.0)),
    "Acos": (np.arccos, (-1.0, 1.0)),
    "Atan": (np.arctan, (-1e30, 1e30)),
    "Sinh": (np.sinh, (-90.0, 90.0)),
    "Cosh": (np.cosh, (-90.0, 90.0)),
    "Asinh": (np.arcsinh, (-1e30, 1e30)),
    "Acosh": (np.arccosh, (1.0, 1e30)),
    "Atanh": (np.arctanh, (-1.0, 1.0)),
}
"""ONNX op -> (numpy function, the domain sampled)."""

SELU_ALPHA, SELU_GAMMA = 1.67326319217681884765625, 1.05070102214813232421875


def _mish(x):
    return x * np.tanh(np.log1p(np.exp(x)))


def _shrink(x, bias=0.0, lambd=0.5):
    return np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0))


ACTIVATIONS = {
    # op: (attributes, float64 reference)
    "Selu": ({}, lambda x: np.where(x > 0, x * SELU_GAMMA, np.expm1(x) * SELU_ALPHA * SELU_GAMMA)),
    "Celu": ({"alpha": 0.5}, lambda x: np.maximum(0, x) + np.minimum(0, 0.5 * np.expm1(x / 0.5))),
    "Mish": ({}, _mish),
    "Softsign": ({}, lambda x: x / (1 + np.abs(x))),
    "ThresholdedRelu": ({"alpha": 0.75}, lambda x: np.where(x > 0.75, x, 0)),
    "Shrink": ({"bias": 0.25, "lambd": 0.75}, lambda x: _shrink(x, 0.25, 0.75)),
    "Swish": ({"alpha": 1.5}, lambda x: x / (1 + np.exp(-1.5 * x))),
}
"""Float activations: ONNX op -> (attributes, numpy reference in float64)."""

HOST = parse_target("llvm")


class Backend(AotcBackend):
    """The backend these tests build with; its cache is pytest's."""


@pytest.fixture(autouse=True, scope="module")
def math_cache(request, tmp_path_factory):
    cache = getattr(request.config, "cache", None)
    Backend.cache_dir = cache.mkdir("aotc-onnx-math") if cache else tmp_path_factory.mktemp("onnx-math")


def model(
    nodes: list[tuple[str, list[str], dict]], inputs: dict[str, np.ndarray], opset: int
) -> onnx.ModelProto:
    """One node per (op, input names, attributes), node i writing output y{i}."""
    graph = helper.make_graph(
        [
            helper.make_node(op, ins, [f"y{i}"], name=f"{op.lower()}_{i}", **a)
            for i, (op, ins, a) in enumerate(nodes)
        ],
        "math",
        [
            helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
            for k, v in inputs.items()
        ],
        [helper.make_empty_tensor_value_info(f"y{i}") for i in range(len(nodes))],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def run_aotc(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    with np.errstate(all="ignore"):
        return list(Backend.prepare(m).run(dict(feeds)))


def run_onnxruntime(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray] | None:
    """onnxruntime's outputs, None where it has no kernel for the model."""
    try:
        session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as e:  # NOT_IMPLEMENTED (no kernel of a type or opset), INVALID_GRAPH
        if "NOT_IMPLEMENTED" in str(e) or "not implemented" in str(e).lower() or "opset" in str(e).lower():
            return None
        raise
    return session.run(None, feeds)


def ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in units of the last place of `want` (rounded to got's type); 0 where both are the
    same infinity or both NaN."""
    with np.errstate(all="ignore"):
        exact = want.astype(got.dtype)
        err = np.abs(got.astype(np.float64) - want) / np.spacing(np.abs(exact)).astype(np.float64)
    same = (got == exact) | (np.isnan(got) & np.isnan(exact))
    return np.where(same, 0.0, err)


def wide_samples(lo: float, hi: float, dtype: str, n: int, rng) -> np.ndarray:
    """n values of [lo, hi]: magnitudes spread over every binade in range (and uniform ones), the bounds,
    0, -0, tiny and subnormal values, NaN and both infinities."""
    finfo = np.finfo(dtype)
    top = min(max(abs(lo), abs(hi)), float(finfo.max))
    mags = np.exp(rng.uniform(np.log(float(finfo.tiny)), np.log(top), n // 2))
    signs = np.where(rng.random(n // 2) < 0.5, -1.0, 1.0)
    values = np.concatenate([mags * signs, rng.uniform(max(lo, -10), min(hi, 10), n - n // 2)])
    special = [
        lo,
        hi,
        0.0,
        -0.0,
        float(finfo.smallest_subnormal),
        1e-3,
        0.5,
        1.0,
        -1.0,
        np.nan,
        np.inf,
        -np.inf,
    ]
    values[: len(special)] = special
    return values.astype(dtype)


# --- trigonometric and hyperbolic functions -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_trigonometric_and_hyperbolic_functions_within_4_ulp_over_a_wide_range(dtype):
    """Arguments over every binade of each domain (out-of-domain ones clipped to it, but for the specials:
    NaN, infinities, which give NaN or infinities as numpy's), against numpy in float64 (exact to well
    under an ulp of float32; for float64 inputs the same float64 functions, glibc's, within 1 ulp)."""
    rng = np.random.default_rng(1)
    n = 1024
    feeds, nodes = {}, []
    for op, (_, (lo, hi)) in TRIG.items():
        x = wide_samples(lo, hi, dtype, n, rng)
        finite = np.isfinite(x)
        x[finite & (x < lo)], x[finite & (x > hi)] = lo, hi
        feeds[f"x_{op}"] = x
        nodes.append((op, [f"x_{op}"], {}))
    got = run_aotc(model(nodes, feeds, 22), feeds)
    for (op, (fn, _)), y in zip(TRIG.items(), got):
        x = feeds[f"x_{op}"]
        with np.errstate(all="ignore"):
            want = fn(x.astype(np.float64))
            nans = np.isnan(want.astype(dtype))
        assert y.dtype == np.dtype(dtype) and y.shape == x.shape, op
        np.testing.assert_array_equal(np.isnan(y), nans, err_msg=f"{op}: NaNs")
        worst = int(np.argmax(ulps(y, want)))
        assert ulps(y, want)[worst] <= 4, f"{op}({x[worst]!r}) = {y[worst]!r}, exactly {want[worst]!r}"


def test_trigonometric_functions_match_onnxruntime_and_round_float16_once():
    """float32 against onnxruntime over ordinary arguments; float16 against numpy's float16 functions
    (computed in float32, rounded once: aotc computes float16 math calls in float32 too) within 1 ulp."""
    rng = np.random.default_rng(2)
    feeds, nodes = {}, []
    for op, (_, (lo, hi)) in TRIG.items():
        feeds[f"x_{op}"] = rng.uniform(max(lo, -20.0), min(hi, 20.0), (3, 37)).astype(np.float32)
        nodes.append((op, [f"x_{op}"], {}))
    m = model(nodes, feeds, 22)
    got, ref = run_aotc(m, feeds), run_onnxruntime(m, feeds)
    assert ref is not None
    for op, y, r in zip(TRIG, got, ref):
        np.testing.assert_allclose(y, r, rtol=2e-6, atol=1e-6 * max(1.0, np.abs(r).max()), err_msg=op)
    half = {k: v.astype(np.float16) for k, v in feeds.items()}
    for op, y in zip(TRIG, run_aotc(model(nodes, half, 22), half)):
        assert y.dtype == np.float16
        with np.errstate(all="ignore"):
            want = TRIG[op][0](half[f"x_{op}"].astype(np.float64))
        assert ulps(y, want).max() <= 1, op


# --- predicates and Sign ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_isnan_isinf_and_sign_on_floats_match_onnxruntime(dtype):
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.5, -2.5, 1e-30, -6e4, 65504.0, 7.0, -np.nan], dtype)
    feeds = {"x": x.reshape(3, 4)}
    nodes = [("IsNaN", ["x"], {}), ("Sign", ["x"], {})]
    nodes += [
        ("IsInf", ["x"], {"detect_negative": neg, "detect_positive": pos}) for neg in (0, 1) for pos in (0, 1)
    ]
    m = model(nodes, feeds, 20)
    got, ref = run_aotc(m, feeds), run_onnxruntime(m, feeds)
    x = feeds["x"]
    if ref is None:  # onnxruntime has no kernel of this type for one of them: numpy's
        ref = [np.isnan(x), np.sign(x)]
        ref += [
            (np.isneginf(x) & bool(neg)) | (np.isposinf(x) & bool(pos)) for neg in (0, 1) for pos in (0, 1)
        ]
    # Sign of NaN: NaN, as numpy's sign, ONNX's reference and onnxruntime's float32 and float64 kernels
    # give (its float16 kernel gives 0)
    ref[1] = np.where(np.isnan(x), x, ref[1])
    for (op, _, attrs), y, r in zip(nodes, got, ref):
        assert y.dtype == r.dtype, op
        np.testing.assert_array_equal(y, r, err_msg=f"{op} {attrs}")


def test_sign_bitwise_and_integer_shrink_are_exact():
    """Sign, BitwiseAnd/Or/Xor (with broadcasting) and BitwiseNot over the whole range of integer types of
    every width and both signednesses, their extremes included, and Shrink with an integral bias (x + 3 below -2.5, x - 3 above 2.5, which
    cannot overflow), against numpy's integer arithmetic, and against onnxruntime where it has the kernel
    (its Shrink computes in float32, exact only for 8- and 16-bit types)."""
    rng = np.random.default_rng(3)
    feeds, nodes, want = {}, [], []
    for dtype in ("int8", "int16", "int32", "int64", "uint8", "uint64"):
        info = np.iinfo(dtype)
        a = rng.integers(info.min, int(info.max) + 1, (4, 3, 5), dtype=dtype)
        a.flat[:9] = [info.min, info.max, 0, 1, 2, 3, info.max - 1, info.min + 1, info.min + 2]
        b = rng.integers(info.min, int(info.max) + 1, (3, 1), dtype=dtype)
        ka, kb = f"a_{dtype}", f"b_{dtype}"
        feeds |= {ka: a, kb: b}
        nodes += [
            ("BitwiseAnd", [ka, kb], {}),
            ("BitwiseOr", [ka, kb], {}),
            ("BitwiseXor", [kb, ka], {}),
            ("BitwiseNot", [ka], {}),
            ("Sign", [ka], {}),
            ("Shrink", [ka], {"bias": 3.0, "lambd": 2.5}),
        ]
        three, zero = np.array(3, dtype), np.zeros_like(a)
        above = np.where(a > 2.5, a - three, zero)
        shrink = np.where(a < -2.5, a + three, above) if info.min < 0 else above
        want += [a & b, a | b, b ^ a, ~a, np.sign(a), shrink]
    got = run_aotc(model(nodes, feeds, 18), feeds)
    for (op, ins, attrs), y, w in zip(nodes, got, want):
        assert y.dtype == w.dtype, f"{op} on {w.dtype}"
        np.testing.assert_array_equal(y, w, err_msg=f"{op} on {w.dtype}")
        if op == "Shrink" and w.dtype.itemsize > 2:
            continue
        own = {k: feeds[k] for k in ins}
        ref = run_onnxruntime(model([(op, ins, attrs)], own, 18), own)
        if ref is not None:
            np.testing.assert_array_equal(y, ref[0], err_msg=f"{op} on {w.dtype} against onnxruntime")


# --- activations --------------------------------------------------------------------------------------------


def _activation_model(dtype: str, opset: int, ops: list[str]) -> tuple[onnx.ModelProto, dict]:
    rng = np.random.default_rng(4)
    x = rng.uniform(-20, 20, 200)
    x[:16] = [
        0.0,
        -0.0,
        1e-7,
        -1e-7,
        1e-4,
        -1e-4,
        0.75,
        -0.75,
        2.5,
        -2.5,
        12.0,
        -12.0,
        88.0,
        -88.0,
        1e30,
        -1e30,
    ]
    with np.errstate(over="ignore"):
        feeds = {"x": x.astype(dtype)}
    return model([(op, ["x"], ACTIVATIONS[op][0]) for op in ops], feeds, opset), feeds


def test_activations_match_onnxruntime_and_numpy_in_float32():
    """Each activation over [-20, 20] (both sides of its kinks, exp's cancellation near 0, Mish's and
    Swish's tails) and the specials: within 8 ulp (or 4e-7 absolute) of numpy in float64, and
    onnxruntime's within 2e-6 relative and 4e-7 absolute (Swish: 1e-6; onnxruntime's sigmoid there is
    some 5e-7 off in absolute terms: 0 for Swish(-12), which is -2e-7)."""
    ops = list(ACTIVATIONS)
    m, feeds = _activation_model("float32", 24, ops)
    x = feeds["x"]
    got, ref = run_aotc(m, feeds), run_onnxruntime(m, feeds)
    for i, (op, y) in enumerate(zip(ops, got)):
        with np.errstate(over="ignore"):
            want = ACTIVATIONS[op][1](x.astype(np.float64))
        close = (ulps(y, want) <= 8) | (np.abs(y - want) <= 4e-7)
        assert close.all(), f"{op}: {x[~close]} -> {y[~close]}, exactly {want[~close]}"
        if ref is not None:
            atol = 1e-6 if op == "Swish" else 4e-7
            np.testing.assert_allclose(y, ref[i], rtol=2e-6, atol=atol, err_msg=f"{op} against onnxruntime")


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_activations_in_float16_and_float64(dtype):
    """float16: computed in float32 and rounded once, so within 1 float16 ulp of the exact value;
    float64: within 1e-14 relative (a few ulp through exp or log), 1e-300 absolute at 0. (Opset 28: Celu
    on these types is Celu-28's.)"""
    ops = list(ACTIVATIONS)
    m, feeds = _activation_model(dtype, 28, ops)
    x = feeds["x"]
    for op, y in zip(ops, run_aotc(m, feeds)):
        with np.errstate(all="ignore"):
            want = ACTIVATIONS[op][1](x.astype(np.float64))
        assert y.dtype == np.dtype(dtype), op
        if dtype == "float16":
            assert (ulps(y, want) <= 1).all(), op
        else:
            finite = np.isfinite(want)
            np.testing.assert_allclose(y[finite], want[finite], rtol=1e-14, atol=1e-300, err_msg=op)


# --- the math calls and bit operations in the CPU and GPU code generators ----------------------------------


def _kernel(name: str, dtype: str, n: int, lanes: int) -> PrimFunc:
    """y[i] = name(x[i]): a loop vectorized by `lanes` with a masked tail, or a scalar loop (lanes 0)."""
    x, y = Buffer("x", dtype, (n,)), Buffer("y", dtype, (n,))
    if not lanes:
        i = Var("i")
        body = For(i, const(n), n, ForKind.SERIAL, BufferStore(y, call(name, Load(x, (i,))), (i,)))
        return PrimFunc(f"k_{name}_{lanes}", (x, y), body)
    o, v = Var("o"), Var("v")
    idx = o * lanes + v
    inner = For(
        v,
        minimum(const(lanes), n - o * lanes),
        lanes,
        ForKind.VECTORIZED,
        BufferStore(y, call(name, Load(x, (idx,))), (idx,)),
    )
    return PrimFunc(
        f"k_{name}_{lanes}", (x, y), For(o, const(-(-n // lanes)), -(-n // lanes), ForKind.SERIAL, inner)
    )


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_math_calls_vectorized_and_scalar_within_4_ulp(tmp_path, dtype):
    """Each call compiled directly (loop IR -> LLVM) as a vector loop of 16 lanes (libmvec's variants where
    the host has them), one of 7 (split and padded to a variant's width) and a scalar loop (libm), and the
    reference interpreter that folds constants, on every binade of its domain: within 4 ulp of numpy's
    float64; and the vector loop calls libmvec on this x86-64 glibc host."""
    rng = np.random.default_rng(6)
    n = 2053
    cases, funcs = {}, []
    for op, (fn, (lo, hi)) in TRIG.items():
        x = wide_samples(lo, hi, dtype, n, rng)
        finite = np.isfinite(x)
        x[finite & (x < lo)], x[finite & (x > hi)] = lo, hi
        with np.errstate(all="ignore"):
            cases[op.lower()] = (x, fn(x.astype(np.float64)))
        funcs += [_kernel(op.lower(), dtype, n, lanes) for lanes in (16, 7, 0)]
    path = str(tmp_path / "trig.so")
    build_module(funcs, HOST, path)
    lib = load_library(path)
    for name, (x, want) in cases.items():
        for lanes in (16, 7, 0):
            y = np.zeros_like(x)
            lib.kernel(f"k_{name}_{lanes}")(x, y)
            assert ulps(y, want).max() <= 4, f"{name}, {lanes} lanes: {x[np.argmax(ulps(y, want))]!r}"
        p = te.placeholder((n,), name="x", dtype=dtype)
        dag = te.ComputeDAG([te.compute((n,), lambda i, p=p, name=name: call(name, p[i]), name)])
        (folded,) = evaluate(dag, {"x": x})
        assert ulps(folded, want).max() <= 4, f"{name} folded"
    if veclib_for(HOST) is not None:
        assert "@_ZGV" in build_llvm_ir([_kernel("sin", dtype, n, 16)], HOST)


def test_vector_loops_call_libm_lane_by_lane_without_libmvec(tmp_path, monkeypatch):
    """Where a target has no libmvec (aarch64, say), a vector loop calls libm's scalar function for each
    lane: the same results as the scalar loop, bit for bit."""
    monkeypatch.setattr(llvm_codegen, "veclib_for", lambda target: None)
    rng = np.random.default_rng(8)
    n = 101
    funcs = [_kernel(op.lower(), "float32", n, lanes) for op in TRIG for lanes in (8, 0)]
    assert "@_ZGV" not in build_llvm_ir(funcs, HOST) and "@sinf(" in build_llvm_ir(funcs, HOST)
    path = str(tmp_path / "lanes.so")
    build_module(funcs, HOST, path)
    lib = load_library(path)
    for op, (_, (lo, hi)) in TRIG.items():
        x = rng.uniform(max(lo, -50.0), min(hi, 50.0), n).astype(np.float32)
        vector, scalar = np.zeros_like(x), np.zeros_like(x)
        lib.kernel(f"k_{op.lower()}_8")(x, vector)
        lib.kernel(f"k_{op.lower()}_0")(x, scalar)
        np.testing.assert_array_equal(vector, scalar, err_msg=op)


def _gpu_dag(dtype: str):
    """Each call of elemwise.TRIG on x, but acosh on a second input (its domain starts at 1)."""
    x, x1 = te.placeholder((64,), name="x", dtype=dtype), te.placeholder((64,), name="x1", dtype=dtype)
    outs = [
        te.compute((64,), lambda i, name=name: call(name, (x1 if name == "acosh" else x)[i]), name)
        for name in elemwise.TRIG
    ]
    return te.ComputeDAG(outs)


def _gpu_bits_dag(dtype: str):
    a, b = te.placeholder((64,), name="a", dtype=dtype), te.placeholder((64,), name="b", dtype=dtype)
    outs = [
        te.compute((64,), lambda i, f=f: elemwise.BINARY[f](a[i], b[i]), f)
        for f in ("bitwise_and", "bitwise_or", "bitwise_xor")
    ]
    outs.append(te.compute((64,), lambda i: elemwise.bitwise_not(a[i]), "bitwise_not"))
    return te.ComputeDAG(outs)


def _bind(dag):
    state = State.initial(dag)
    for op in dag.compute_ops:
        state = state.split(op.name, 0, [32]).bind(op.name, 0, Annotation.BLOCK_X)
        state = state.bind(op.name, 1, Annotation.THREAD_X)
    return state


@pytest.mark.slow  # ~12 s: PoCL compiles each kernel
def test_gpu_source_computes_math_calls_and_bit_operations():
    """The OpenCL form of every trigonometric and hyperbolic call (float32: OpenCL's sin etc., within 4 ulp)
    and of the bit operations (exact, BitwiseNot as `~` on uint64 too), run on the CPU's OpenCL."""
    device = opencl_device()
    if device is None:
        pytest.skip("no OpenCL platform (pip install pyopencl; apt-get install pocl-opencl-icd)")
    rng = np.random.default_rng(7)
    x = rng.uniform(-0.99, 0.99, 64).astype(np.float32)  # in the domain of all but acosh
    x1 = (1 + 10 * np.abs(x)).astype(np.float32)
    module = emit_gpu(lower(_bind(_gpu_dag("float32")), "trig"), parse_target("opencl"))
    outs = run_opencl(module, [x, x1], device)
    for name, y in zip(elemwise.TRIG, outs):
        fn = TRIG[name.capitalize()][0]
        want = fn((x1 if name == "acosh" else x).astype(np.float64))
        assert ulps(y, want).max() <= 4, name
    for dtype in ("uint64", "int8"):
        info = np.iinfo(dtype)
        a = rng.integers(info.min, int(info.max) + 1, 64, dtype=dtype)
        b = rng.integers(info.min, int(info.max) + 1, 64, dtype=dtype)
        module = emit_gpu(lower(_bind(_gpu_bits_dag(dtype)), f"bits_{dtype}"), parse_target("opencl"))
        got = run_opencl(module, [a, b], device)
        for y, w in zip(got, (a & b, a | b, a ^ b, ~a)):
            np.testing.assert_array_equal(y, w, err_msg=module.opencl_source)


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not on PATH (CUDA toolkit not installed)")
def test_gpu_math_and_bit_operations_compile_as_cuda():
    for dag, name in ((_gpu_dag("float64"), "trig"), (_gpu_bits_dag("uint64"), "bits")):
        module = emit_gpu(lower(_bind(dag), name), parse_target("cuda -arch=sm_90"))
        assert compile_cuda(module.cuda_source, "sm_90")[:4] == b"\x7fELF"


# --- refusals -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "op, dtype, opset, attrs, says",
    [
        # types the operator's schema does not allow: refused by the frontend's schema check
        ("Sin", "int32", 22, {}, "(input, value x) is tensor(int32), which type constraint T of Sin-22"),
        ("Celu", "float16", 22, {}, "(X, value x) is tensor(float16), which type constraint T of Celu-12"),
        ("IsInf", "float16", 19, {}, "(X, value x) is tensor(float16), which type constraint T1 of IsInf-10"),
        ("BitwiseNot", "float32", 18, {}, "is tensor(float), which type constraint T of BitwiseNot-18"),
        ("Shrink", "int32", 18, {"bias": 0.5}, "bias 0.5 and lambd 0.5 are not supported"),
        ("Swish", "float32", 23, {}, "Swish is not defined in opset 23"),
    ],
)
def test_unsupported_cases_are_refused_naming_node_op_and_type(op, dtype, opset, attrs, says):
    x = np.zeros((2, 3), dtype)
    m = model([(op, ["x"], attrs)], {"x": x}, opset)
    with pytest.raises(REFUSALS) as info:
        Backend.prepare(m)
    message = str(info.value)
    assert says in message, message
    if isinstance(info.value, ConversionError) and "not defined" not in says:
        assert f"{op.lower()}_0 ({op})" in message


def test_bitwise_operands_of_two_types_are_refused():
    m = model([("BitwiseAnd", ["a", "b"], {})], {"a": np.zeros(3, np.int32), "b": np.zeros(3, np.int64)}, 18)
    with pytest.raises(
        ConversionError, match=r"bitwiseand_0 \(BitwiseAnd\): input 1 \(B, value b\) is tensor\(int64\) but"
    ):
        load_onnx(m.SerializeToString())
