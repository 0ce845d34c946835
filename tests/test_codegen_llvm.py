"""LLVM CPU code generator: hand-built loop IR compiled to shared libraries and compared with numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from aotc_runtime.elf import read_elf

from aotc.codegen.llvm import CodegenError, build_llvm_ir, compile_to_object
from aotc.codegen.module import KernelError, build_module, load_library
from aotc.ir.expr import (
    Buffer,
    Call,
    Const,
    Load,
    Var,
    cast,
    const,
    eq,
    logical_and,
    logical_not,
    logical_or,
    maximum,
    minimum,
    ne,
    select,
)
from aotc.ir.stmt import Allocate, BufferStore, For, ForKind, IfThenElse, LetStmt, PrimFunc, seq
from aotc.target import parse_target
from tests.concurrency import failures_in_threads

S, V, U, P = ForKind.SERIAL, ForKind.VECTORIZED, ForKind.UNROLLED, ForKind.PARALLEL
HOST = parse_target("llvm")
RNG = np.random.default_rng(0)


def loop(var, extent, kind, body, max_extent=None):
    ext = const(extent) if isinstance(extent, int) else extent
    return For(var, ext, max_extent if max_extent is not None else extent, kind, body)


def build(tmp_path, *funcs, name="m"):
    path = str(tmp_path / f"{name}.so")
    build_module(list(funcs), HOST, path)
    return load_library(path)


def run1(tmp_path, func, *arrays):
    build(tmp_path, func).kernel(func.name)(*arrays)


def elementwise(name, n, lanes, in_dtypes, out_dtype, fn):
    """out[i] = fn(in_0[i], ...) over a vectorized loop split by `lanes` with a masked tail."""
    ins = tuple(Buffer(f"x{k}", d, (n,)) for k, d in enumerate(in_dtypes))
    out = Buffer("y", out_dtype, (n,))
    o, v = Var("o"), Var("v")
    idx = o * lanes + v
    ext = minimum(const(lanes), n - o * lanes)
    value = fn(*(Load(b, (idx,)) for b in ins))
    body = loop(o, -(-n // lanes), S, loop(v, ext, V, BufferStore(out, value, (idx,)), max_extent=lanes))
    return PrimFunc(name, (*ins, out), body)


def scalar_elementwise(name, n, in_dtypes, out_dtype, fn):
    ins = tuple(Buffer(f"x{k}", d, (n,)) for k, d in enumerate(in_dtypes))
    out = Buffer("y", out_dtype, (n,))
    i = Var("i")
    body = loop(i, n, S, BufferStore(out, fn(*(Load(b, (i,)) for b in ins)), (i,)))
    return PrimFunc(name, (*ins, out), body)


def pointwise(name, n, lanes, in_dtypes, out_dtype, fn):
    """A vectorized kernel with `lanes` lanes, or a scalar loop when `lanes` is 0."""
    if lanes:
        return elementwise(name, n, lanes, in_dtypes, out_dtype, fn)
    return scalar_elementwise(name, n, in_dtypes, out_dtype, fn)


# ----------------------------------------------------------------------------- elementwise


@pytest.mark.parametrize("n", [64, 37])
def test_vector_add(tmp_path, n):
    f = elementwise("add", n, 16, ["float32", "float32"], "float32", lambda a, b: a + b)
    a, b = RNG.random(n, dtype=np.float32), RNG.random(n, dtype=np.float32)
    y = np.full(n, -7.0, np.float32)
    run1(tmp_path, f, a, b, y)
    np.testing.assert_array_equal(y, a + b)


def test_vector_ir_is_explicit(tmp_path):
    f = elementwise("add", 37, 16, ["float32", "float32"], "float32", lambda a, b: a + b)
    ir = build_llvm_ir([f], HOST)
    assert "@llvm.masked.load.v16f32" in ir and "@llvm.masked.store.v16f32" in ir
    assert "fadd contract <16 x float>" in ir


# ----------------------------------------------------------------------------- matmul


def matmul(M, N, K, ti=4, tj=16):
    A, B, C = Buffer("A", "float32", (M, K)), Buffer("B", "float32", (K, N)), Buffer("C", "float32", (M, N))
    io, jo, k, ii, jv = (Var(n) for n in ("io", "jo", "k", "ii", "jv"))
    acc = Buffer("acc", "float32", (ti, tj), scope="local")
    row, col = io * ti + ii, jo * tj + jv

    def tile(st):
        return loop(ii, ti, U, loop(jv, tj, V, st))

    init = tile(BufferStore(acc, const(0.0), (ii, jv)))
    update = Load(acc, (ii, jv)) + Load(A, (row, k)) * Load(B, (k, col))
    body = seq(
        init,
        loop(k, K, S, tile(BufferStore(acc, update, (ii, jv)))),
        tile(BufferStore(C, Load(acc, (ii, jv)), (row, col))),
    )
    nest = loop(io, M // ti, P, loop(jo, N // tj, S, Allocate(acc, body)))
    return PrimFunc("matmul", (A, B, C), nest)


def test_matmul_threads(tmp_path):
    M, N, K = 64, 48, 40
    lib = build(tmp_path, matmul(M, N, K))
    a, b = RNG.random((M, K), dtype=np.float32), RNG.random((K, N), dtype=np.float32)
    results = []
    for threads in (1, 2):
        lib.set_num_threads(threads)
        assert lib.max_threads() == threads
        c = np.zeros((M, N), np.float32)
        lib.kernel("matmul")(a, b, c)
        results.append(c)
    np.testing.assert_allclose(results[0], a @ b, rtol=1e-5)
    np.testing.assert_array_equal(results[0], results[1])


def test_prepare_fast_caller(tmp_path):
    lib = build(tmp_path, matmul(8, 16, 8))
    a, b = np.ones((8, 8), np.float32), np.ones((8, 16), np.float32)
    c = np.zeros((8, 16), np.float32)
    run = lib.kernel("matmul").prepare(a, b, c)
    run()
    np.testing.assert_array_equal(c, np.full((8, 16), 8.0, np.float32))


def test_rebuild_at_same_path_reloads(tmp_path):
    path = str(tmp_path / "k.so")
    x, y = np.zeros(8, np.float32), np.zeros(8, np.float32)
    for c in (1.0, 2.0):
        build_module([elementwise("k", 8, 8, ["float32"], "float32", lambda a, c=c: a + c)], HOST, path)
        load_library(path).kernel("k")(x, y)
        np.testing.assert_array_equal(y, np.full(8, c, np.float32))


def test_kernel_argument_checks(tmp_path):
    kern = build(tmp_path, matmul(8, 16, 8)).kernel("matmul")
    a, b, c = np.ones((8, 8), np.float32), np.ones((8, 16), np.float32), np.zeros((8, 16), np.float32)
    with pytest.raises(TypeError):
        kern(a, b)
    with pytest.raises(TypeError):
        kern(a.astype(np.float64), b, c)
    with pytest.raises(ValueError):
        kern(np.ones((8, 9), np.float32), b, c)
    with pytest.raises(ValueError):
        kern(np.ones((8, 16), np.float32)[:, ::2], b, c)
    with pytest.raises(ValueError):
        kern(a, b, b)


# ----------------------------------------------------------------------------- integer division


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("divisor", [4, 7, -3, None])
@pytest.mark.parametrize("lanes", [0, 16])
def test_floordiv_floormod(tmp_path, dtype, divisor, lanes):
    n = 41
    x = RNG.integers(-100, 100, n).astype(dtype)
    d = RNG.integers(-9, 9, n).astype(dtype)
    d[:3] = [0, -1, 1]

    def rhs(b):
        return b if divisor is None else Const(divisor, dtype)

    fdiv = pointwise("fdiv", n, lanes, [dtype, dtype], dtype, lambda a, b: a // rhs(b))
    fmod = pointwise("fmod", n, lanes, [dtype, dtype], dtype, lambda a, b: a % rhs(b))
    lib = build(tmp_path, fdiv, fmod)
    q, r = np.zeros(n, dtype), np.zeros(n, dtype)
    lib.kernel("fdiv")(x, d, q)
    lib.kernel("fmod")(x, d, r)
    dd = d if divisor is None else np.full(n, divisor, dtype)
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(q, np.floor_divide(x, dd))
        np.testing.assert_array_equal(r, np.remainder(x, dd))


def test_unsigned_and_float_divmod(tmp_path):
    n = 37
    xu, du = RNG.integers(0, 250, n).astype(np.uint8), RNG.integers(0, 20, n).astype(np.uint8)
    xf = RNG.uniform(-10, 10, n).astype(np.float64)
    df = RNG.uniform(-3, 3, n).astype(np.float64)
    df[0], xf[1], df[1] = 0.0, 1.0, 0.1
    funcs = [
        elementwise("udiv", n, 16, ["uint8", "uint8"], "uint8", lambda a, b: a // b),
        elementwise("umod", n, 16, ["uint8", "uint8"], "uint8", lambda a, b: a % b),
        elementwise("ffdiv", n, 8, ["float64", "float64"], "float64", lambda a, b: a // b),
        elementwise("ffmod", n, 8, ["float64", "float64"], "float64", lambda a, b: a % b),
    ]
    lib = build(tmp_path, *funcs)
    with np.errstate(divide="ignore", invalid="ignore"):
        for name, x, d, ref in (
            ("udiv", xu, du, np.floor_divide),
            ("umod", xu, du, np.remainder),
            ("ffdiv", xf, df, np.floor_divide),
            ("ffmod", xf, df, np.remainder),
        ):
            out = np.zeros(n, x.dtype)
            lib.kernel(name)(x, d, out)
            np.testing.assert_array_equal(out, ref(x, d), err_msg=name)


# ----------------------------------------------------------------------------- casts

CASTS = [
    ("float32", "int32"),
    ("float64", "int64"),
    ("float32", "uint8"),
    ("int32", "float32"),
    ("uint32", "float64"),
    ("int8", "int64"),
    ("uint8", "int32"),
    ("int64", "int8"),
    ("int32", "uint16"),
    ("float64", "float32"),
    ("float32", "float64"),
    ("float32", "bool"),
    ("int16", "bool"),
    ("bool", "int32"),
    ("bool", "float32"),
    ("float32", "float16"),
]


def _cast_input(dtype, n):
    if dtype == "bool":
        return RNG.random(n) < 0.5
    if dtype.startswith("float"):
        x = RNG.uniform(0, 200, n).astype(dtype)
        x[:4] = [0.0, -0.0, 2.5, 0.999]
        return x
    info = np.iinfo(dtype)
    return RNG.integers(max(info.min, -1000), min(info.max, 1000), n).astype(dtype)


@pytest.mark.parametrize("lanes", [0, 16])
def test_casts(tmp_path, lanes):
    n = 37
    funcs, cases = [], []
    for k, (src, dst) in enumerate(CASTS):
        name = f"c{k}"
        funcs.append(pointwise(name, n, lanes, [src], dst, lambda a, d=dst: cast(d, a)))
        cases.append((name, _cast_input(src, n), dst))
    lib = build(tmp_path, *funcs)
    for name, x, dst in cases:
        out = np.zeros(n, dst)
        lib.kernel(name)(x, out)
        np.testing.assert_array_equal(out, x.astype(dst), err_msg=f"{x.dtype} -> {dst}")


# ----------------------------------------------------------------------------- math

MATH = {
    "exp": (np.exp, (-10, 10)),
    "log": (np.log, (0.01, 100)),
    "sqrt": (np.sqrt, (0, 100)),
    "rsqrt": (lambda x: 1 / np.sqrt(x), (0.01, 100)),
    "tanh": (np.tanh, (-5, 5)),
    "erf": (np.vectorize(math.erf), (-3, 3)),
    "sigmoid": (lambda x: 1 / (1 + np.exp(-x)), (-20, 20)),
    "abs": (np.abs, (-5, 5)),
    "floor": (np.floor, (-5, 5)),
    "ceil": (np.ceil, (-5, 5)),
    "round": (np.round, (-5, 5)),
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("lanes", [0, 16, 37])
def test_math_calls(tmp_path, dtype, lanes):
    n = 37
    funcs, cases = [], []
    for name, (ref, (lo, hi)) in MATH.items():
        funcs.append(pointwise(f"k_{name}", n, lanes, [dtype], dtype, lambda a, name=name: Call(name, (a,))))
        x = RNG.uniform(lo, hi, n).astype(dtype)
        if name == "round":
            x[:6] = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5]
        cases.append((name, x, ref(x.astype(np.float64)).astype(dtype)))
    lib = build(tmp_path, *funcs)
    for name, x, expected in cases:
        out = np.zeros(n, dtype)
        lib.kernel(f"k_{name}")(x, out)
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-7, err_msg=name)


def test_pow_min_max_int_abs(tmp_path):
    n = 37
    x = RNG.uniform(0.1, 3, n).astype(np.float32)
    y = RNG.uniform(-2, 2, n).astype(np.float32)
    x[0], y[1] = np.nan, np.nan
    i = RNG.integers(-50, 50, n).astype(np.int32)
    j = RNG.integers(-50, 50, n).astype(np.int32)
    funcs = [
        elementwise("pw", n, 16, ["float32", "float32"], "float32", lambda a, b: a**b),
        elementwise("mn", n, 16, ["float32", "float32"], "float32", minimum),
        elementwise("mx", n, 16, ["float32", "float32"], "float32", maximum),
        elementwise("imn", n, 16, ["int32", "int32"], "int32", minimum),
        elementwise("iabs", n, 16, ["int32"], "int32", lambda a: Call("abs", (a,))),
    ]
    lib = build(tmp_path, *funcs)
    out = np.zeros(n, np.float32)
    for name, ref in (("pw", np.power), ("mn", np.minimum), ("mx", np.maximum)):
        lib.kernel(name)(x, y, out)
        np.testing.assert_allclose(out, ref(x, y), rtol=1e-5, err_msg=name)
    iout = np.zeros(n, np.int32)
    lib.kernel("imn")(i, j, iout)
    np.testing.assert_array_equal(iout, np.minimum(i, j))
    lib.kernel("iabs")(i, iout)
    np.testing.assert_array_equal(iout, np.abs(i))


# ----------------------------------------------------------------------------- rounded clamps

# int(clamp(round(x * s) + zp, lo, hi)): every float requantization's copy-out (exprgen.RoundedClamp).
# Inputs: ties both ways, values next to every bound, beyond int16 and int32, and infinities.
CLAMP_X = np.array(
    [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, 127.5, -127.5, -128.5, -129.5, 254.5, 255.5, 0.49999997]
    + [1e4, -1e4, 40000.0, -40000.0, 3e9, -3e9, 1e30, -1e30, np.inf, -np.inf, 0.0, -0.0],
    np.float32,
)
CLAMPS = [  # (dtype, zero point, lo, hi)
    ("int8", -128, -128, 127),
    ("int8", 0, -128, 127),
    ("int8", 5, -100, 37),  # a ReLU6-like range with a positive zero point
    ("uint8", 128, 0, 255),
    ("uint8", 3, 3, 200),
    ("int16", -7, -32768, 32767),
]


def is_x86_host() -> bool:
    return HOST.isa == "x86_64"


def _clamp_input(n: int) -> np.ndarray:
    x = np.concatenate([CLAMP_X, RNG.uniform(-400, 400, n - len(CLAMP_X)).astype(np.float32)])
    return RNG.permutation(x)


@pytest.mark.parametrize(
    "mcpu, lanes",
    [("", 0), ("", 3), ("", 4), ("", 8), ("", 16), ("", 32), ("", 24), ("x86-64", 4), ("x86-64", 16)],
)
def test_rounded_clamp_matches_numpy_on_ties_bounds_and_overflow(tmp_path, mcpu, lanes):
    """Bit-exact with numpy on every path: x86's cvtps2dq with saturating packs (AVX's on 8, 16 and 32
    lanes, SSE2's on a plain x86-64), the portable lrint between float bounds (scalar, 3, 4 and 24
    lanes with AVX), for int8, uint8 and int16 outputs; NaN is left out (its conversion is undefined
    either way)."""
    if mcpu and not is_x86_host():
        pytest.skip("an x86 CPU runs on x86 hosts only")
    n = 96
    funcs, cases = [], []
    for k, (dtype, zp, lo, hi) in enumerate(CLAMPS):
        name = f"q{k}"
        fn = lambda a, d=dtype, z=zp, lo=lo, hi=hi: cast(  # noqa: E731
            d, minimum(maximum(Call("round", (a * 1.0,)) + float(z), float(lo)), float(hi))
        )
        funcs.append(pointwise(name, n, lanes, ["float32"], dtype, fn))
        x = _clamp_input(n)
        ref = np.clip(np.round(x.astype(np.float64)) + zp, lo, hi).astype(dtype)
        cases.append((name, x, ref))
    path = str(tmp_path / "q.so")
    build_module(funcs, parse_target(f"llvm -mcpu={mcpu}") if mcpu else HOST, path)
    lib = load_library(path)
    for name, x, ref in cases:
        out = np.zeros(n, ref.dtype)
        lib.kernel(name)(x, out)
        np.testing.assert_array_equal(out, ref, err_msg=f"{name} ({ref.dtype}), lanes {lanes} {mcpu}")


def test_rounded_clamp_takes_one_conversion_per_target():
    """znver3: cvtps2dq on ymm chunks and saturating int16 steps, no roundeven; aarch64 (no such
    conversion) rounds with lrint between float bounds."""
    f = elementwise(
        "q",
        64,
        16,
        ["float32"],
        "int8",
        lambda a: cast("int8", minimum(maximum(Call("round", (a,)) + -128.0, -128.0), 127.0)),
    )
    x86 = build_llvm_ir([f], parse_target("llvm -mcpu=znver3"))
    assert "@llvm.x86.avx.cvt.ps2dq.256" in x86 and "@llvm.sadd.sat.v16i16" in x86
    assert "roundeven" not in x86 and "llvm.maximum" not in x86
    arm = build_llvm_ir([f], parse_target("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a76"))
    assert "@llvm.lrint.v16i32.v16f32" in arm and "x86" not in arm and "roundeven" not in arm


def test_rounded_clamp_pattern():
    from aotc.codegen.exprgen import RoundedClamp, rounded_clamp

    x = Var("x", "float32")
    r = Call("round", (x,))
    assert rounded_clamp(cast("int8", minimum(maximum(r + 3.0, -50.0), 60.0))) == RoundedClamp(
        x, 3, -50, 60, "int8"
    )
    # bounds in either order and side, a subtracted zero point, bounds clipped to the type
    assert rounded_clamp(cast("uint8", maximum(0.0, minimum(300.0, r - 7.0)))) == RoundedClamp(
        x, -7, 0, 255, "uint8"
    )
    assert rounded_clamp(cast("int8", r)) == RoundedClamp(x, 0, -128, 127, "int8")
    # a min then a max with crossing constants is the constant
    assert rounded_clamp(cast("int8", maximum(minimum(r, 5.0), 9.0))) == RoundedClamp(x, 0, 9, 9, "int8")
    for other in (
        cast("int8", minimum(maximum(x + 3.0, -50.0), 60.0)),  # no round
        cast("int8", minimum(maximum(r + 0.5, -50.0), 60.0)),  # a fractional zero point
        cast("int16", r + float(1 << 24)),  # a zero point float arithmetic would round
        cast("int8", minimum(maximum(r, -50.5), 60.0)),  # a fractional bound
        cast("int8", minimum(r, x)),  # a bound that is not a constant
        cast("int32", r),  # no saturating type
        cast("float32", r),
    ):
        assert rounded_clamp(other) is None


# ----------------------------------------------------------------------------- select / logic


@pytest.mark.parametrize("lanes", [0, 16])
def test_select_compare_logical(tmp_path, lanes):
    n = 37

    def fn(a, b, c):
        cond = logical_or(logical_and(a > b, logical_not(c)), eq(a, 0.0))
        return select(cond, a * 2.0, b - a)

    f = pointwise("sel", n, lanes, ["float32", "float32", "bool"], "float32", fn)
    g = pointwise("cmp", n, lanes, ["float32", "float32"], "bool", lambda a, b: ne(a >= b, a < 0.5))
    lib = build(tmp_path, f, g)
    a, b = RNG.random(n, dtype=np.float32), RNG.random(n, dtype=np.float32)
    a[:3] = 0.0
    c = RNG.random(n) < 0.5
    out = np.zeros(n, np.float32)
    lib.kernel("sel")(a, b, c, out)
    np.testing.assert_array_equal(out, np.where(((a > b) & ~c) | (a == 0), a * 2, b - a))
    bout = np.zeros(n, bool)
    lib.kernel("cmp")(a, b, bout)
    np.testing.assert_array_equal(bout, (a >= b) != (a < 0.5))


def test_select_does_not_load_unselected_arm(tmp_path):
    """Padding: the load in the unselected arm would read out of bounds."""
    n, pad = 40, 3
    A, B = Buffer("A", "float32", (n,)), Buffer("B", "float32", (n + 2 * pad,))
    o, v = Var("o"), Var("v")
    idx = o * 16 + v
    src = idx - pad
    value = select(logical_and(src >= 0, src < n), Load(A, (src,)), const(0.0))
    ext = minimum(const(16), n + 2 * pad - o * 16)
    body = loop(o, 3, S, loop(v, ext, V, BufferStore(B, value, (idx,)), max_extent=16))
    scalar = loop(
        o,
        n + 2 * pad,
        S,
        BufferStore(B, select(logical_and(o >= pad, o < n + pad), Load(A, (o - pad,)), const(-1.0)), (o,)),
    )
    lib = build(tmp_path, PrimFunc("padv", (A, B), body), PrimFunc("pads", (A, B), scalar))
    a = RNG.random(n, dtype=np.float32)
    out = np.zeros(n + 2 * pad, np.float32)
    lib.kernel("padv")(a, out)
    np.testing.assert_array_equal(out, np.pad(a, pad))
    lib.kernel("pads")(a, out)
    np.testing.assert_array_equal(out, np.pad(a, pad, constant_values=-1.0))


# ----------------------------------------------------------------------------- gather / scatter / masks


@pytest.mark.parametrize(
    "stride, form", [(2, "shufflevector"), (3, "shufflevector"), (5, "llvm.masked.gather")]
)
def test_strided_load_deinterleaves_small_strides_and_gathers_large_ones(tmp_path, stride, form):
    n = 37
    A, B = Buffer("A", "float32", (stride * (n - 1) + 1,)), Buffer("B", "float32", (n,))
    o, v = Var("o"), Var("v")
    idx = o * 16 + v
    body = loop(
        o,
        3,
        S,
        loop(v, minimum(const(16), n - o * 16), V, BufferStore(B, Load(A, (idx * stride,)), (idx,)), 16),
    )
    f = PrimFunc("strided", (A, B), body)
    assert form in build_llvm_ir([f], HOST)
    a, b = RNG.random(A.shape[0], dtype=np.float32), np.zeros(n, np.float32)
    run1(tmp_path, f, a, b)
    np.testing.assert_array_equal(b, a[::stride])


def test_gather_indirect_and_scatter(tmp_path):
    n = 32
    A, I, B = Buffer("A", "float32", (n,)), Buffer("I", "int64", (n,)), Buffer("B", "float32", (5 * n,))
    v = Var("v")
    gather = PrimFunc("ind", (A, I, B), loop(v, n, V, BufferStore(B, Load(A, (Load(I, (v,)),)), (v,))))
    scatter = PrimFunc("sct", (A, I, B), loop(v, n, V, BufferStore(B, Load(A, (v,)), (v * 5 + 1,))))
    assert "llvm.masked.scatter" in build_llvm_ir([scatter], HOST)
    lib = build(tmp_path, gather, scatter)
    a, perm = RNG.random(n, dtype=np.float32), RNG.permutation(n).astype(np.int64)
    b = np.zeros(5 * n, np.float32)
    lib.kernel("ind")(a, perm, b)
    np.testing.assert_array_equal(b[:n], a[perm])
    b[:] = 0
    lib.kernel("sct")(a, perm, b)
    np.testing.assert_array_equal(b[1::5], a)
    np.testing.assert_array_equal(np.delete(b, np.s_[1::5]), 0)


@pytest.mark.parametrize("dtype", ["int8", "float32"])
@pytest.mark.parametrize("stride", [2, 3, 4])
def test_strided_store_spreads_its_lanes_under_a_mask_of_their_places(tmp_path, stride, dtype):
    """A store at a small constant stride (a transpose into NHWC: 3 channels apart) is one masked store of
    the span its lanes cover, not a scatter; it writes its lanes' places only, full vectors and the
    masked tail alike (the rest keeps its sentinel)."""
    n = 37
    A, B = Buffer("A", dtype, (n,)), Buffer("B", dtype, (stride * n,))
    o, v = Var("o"), Var("v")
    idx = o * 16 + v
    body = loop(
        o,
        3,
        S,
        loop(v, minimum(const(16), n - o * 16), V, BufferStore(B, Load(A, (idx,)), (idx * stride + 1,)), 16),
    )
    f = PrimFunc("spread", (A, B), body)
    ir = build_llvm_ir([f], HOST)
    assert "llvm.masked.store" in ir and "llvm.masked.scatter" not in ir
    a = np.arange(1, n + 1).astype(dtype)
    b = np.full(stride * n, -1, dtype)
    run1(tmp_path, f, a, b)
    np.testing.assert_array_equal(b[1::stride], a)
    np.testing.assert_array_equal(np.delete(b, np.s_[1::stride]), -1)


def test_masked_if_in_vector_loop(tmp_path):
    n = 37
    A, B, C = Buffer("A", "float32", (n,)), Buffer("B", "float32", (n,)), Buffer("C", "float32", (1,))
    o, v = Var("o"), Var("v")
    idx = o * 16 + v
    branch = IfThenElse(
        Load(A, (idx,)) > const(0.0),
        BufferStore(B, Load(A, (idx,)) * Load(C, (const(0),)), (idx,)),
        BufferStore(B, const(-1.0), (idx,)),
    )
    body = loop(o, 3, S, loop(v, minimum(const(16), n - o * 16), V, branch, 16))
    a = RNG.uniform(-1, 1, n).astype(np.float32)
    b = np.full(n, 9.0, np.float32)
    run1(tmp_path, PrimFunc("mif", (A, B, C), body), a, b, np.array([3.0], np.float32))
    np.testing.assert_array_equal(b, np.where(a > 0, a * 3, -1.0).astype(np.float32))


def test_invariant_if_and_outer_loop_vectorization(tmp_path):
    """A serial loop nested in a vectorized loop keeps the vector context (column sums)."""
    m, n = 9, 16
    A, B = Buffer("A", "float32", (m, n)), Buffer("B", "float32", (n,))
    v, r = Var("v"), Var("r")
    body = loop(
        v,
        n,
        V,
        seq(
            BufferStore(B, const(0.0), (v,)),
            loop(r, m, S, IfThenElse(r < 5, BufferStore(B, Load(B, (v,)) + Load(A, (r, v)), (v,)))),
        ),
    )
    a, b = RNG.random((m, n), dtype=np.float32), np.zeros(n, np.float32)
    run1(tmp_path, PrimFunc("colsum", (A, B), body), a, b)
    np.testing.assert_allclose(b, a[:5].sum(axis=0), rtol=1e-6)


def test_bool_buffers_vector(tmp_path):
    n = 37
    f = elementwise("bnot", n, 16, ["bool"], "bool", logical_not)
    x = RNG.random(n) < 0.5
    out = np.zeros(n, bool)
    run1(tmp_path, f, x, out)
    np.testing.assert_array_equal(out, ~x)


# ----------------------------------------------------------------------------- allocation / let


def test_local_allocate_in_parallel_loop(tmp_path):
    rows, n = 10, 24
    A, B = Buffer("A", "float32", (rows, n)), Buffer("B", "float32", (rows, n))
    tmpb = Buffer("tmp", "float32", (n,), scope="local")
    i, j = Var("i"), Var("j")
    body = Allocate(
        tmpb,
        seq(
            loop(j, n, S, BufferStore(tmpb, Load(A, (i, j)) * 2.0, (j,))),
            loop(j, n, S, BufferStore(B, Load(tmpb, (n - 1 - j,)), (i, j))),
        ),
    )
    f = PrimFunc("rev", (A, B), loop(i, rows, P, body))
    a, b = RNG.random((rows, n), dtype=np.float32), np.zeros((rows, n), np.float32)
    lib = build(tmp_path, f)
    lib.set_num_threads(2)
    lib.kernel("rev")(a, b)
    np.testing.assert_array_equal(b, a[:, ::-1] * 2)


def test_global_allocate_and_let(tmp_path):
    n = 100
    A, B = Buffer("A", "float64", (n,)), Buffer("B", "float64", (n,))
    big = Buffer("big", "float64", (n,), scope="global")
    huge_local = Buffer("hl", "float64", (40000,), scope="local")
    i, t = Var("i"), Var("t")
    body = Allocate(
        big,
        Allocate(
            huge_local,
            seq(
                loop(i, n, P, LetStmt(t, n - 1 - i, BufferStore(big, Load(A, (t,)) + 1.0, (i,)))),
                loop(i, n, S, BufferStore(huge_local, Load(big, (i,)), (i * 400,))),
                loop(i, n, S, BufferStore(B, Load(huge_local, (i * 400,)), (i,))),
            ),
        ),
    )
    f = PrimFunc("glob", (A, B), body)
    ir = build_llvm_ir([f], HOST)
    assert ir.count("@aligned_alloc(") == 3 and ir.count("@free(") >= 3
    a, b = RNG.random(n), np.zeros(n)
    run1(tmp_path, f, a, b)
    np.testing.assert_array_equal(b, a[::-1] + 1)


HEAP_N = 70000  # 560 KB of float64: above the stack limit, so the buffer goes on the heap


def heap_buffer_func() -> PrimFunc:
    """`cached(A, B)`: B = reversed(2 A) + 1 through a heap buffer."""
    n = HEAP_N
    A, B = Buffer("A", "float64", (n,)), Buffer("B", "float64", (n,))
    big = Buffer("big", "float64", (n,), scope="global")
    i = Var("i")
    body = Allocate(
        big,
        seq(
            loop(i, n, S, BufferStore(big, Load(A, (i,)) * 2.0, (i,))),
            loop(i, n, S, BufferStore(B, Load(big, (n - 1 - i,)) + 1.0, (i,))),
        ),
    )
    return PrimFunc("cached", (A, B), body)


def test_heap_buffers_are_cached_across_calls_and_threads(tmp_path):
    """A heap buffer goes back to its allocation site's one-entry cache: repeated and concurrent calls
    (two threads, one of which must allocate its own block) still compute from their own data."""
    n = HEAP_N
    f = heap_buffer_func()
    ir = build_llvm_ir([f], HOST)
    # two at the allocation site, one where the library's unload frees the cached block
    assert ir.count("atomicrmw xchg") == 3 and "internal global ptr null" in ir
    kernel = build(tmp_path, f).kernel("cached")

    def check(seed: int) -> bool:
        rng = np.random.default_rng(seed)
        for _ in range(40):
            a, b = rng.random(n), np.zeros(n)
            kernel(a, b)
            if not np.array_equal(b, a[::-1] * 2 + 1):
                return False
        return True

    assert failures_in_threads(check, 2) == []


def nested_heap_func(n: int) -> PrimFunc:
    """`nested(A, B)`: B = reversed(A + 1) * 3 through two nested heap buffers of n float64 each."""
    A, B = Buffer("A", "float64", (n,)), Buffer("B", "float64", (n,))
    outer, inner = Buffer("outer", "float64", (n,), "global"), Buffer("inner", "float64", (n,), "global")
    i = Var("i")
    body = Allocate(
        outer,
        seq(
            loop(i, n, S, BufferStore(outer, Load(A, (i,)) + 1.0, (i,))),
            Allocate(
                inner,
                seq(
                    loop(i, n, S, BufferStore(inner, Load(outer, (n - 1 - i,)), (i,))),
                    loop(i, n, S, BufferStore(B, Load(inner, (i,)) * 3.0, (i,))),
                ),
            ),
        ),
    )
    return PrimFunc("nested", (A, B), body)


def test_kernels_of_a_module_share_their_heap_temporaries(tmp_path):
    """A kernel's temporaries come from one cached block per nesting depth, shared by all the module's
    kernels: a kernel whose temporary outgrows the cached block frees it and caches a larger one, and a
    smaller temporary uses the larger block. Sequences of calls of both kernels, and both kernels in two
    threads at once, compute from their own data."""
    small, large = heap_buffer_func(), nested_heap_func(2 * HEAP_N)
    ir = build_llvm_ir([small, large], HOST)
    slots = [
        line.split(" =")[0]
        for line in ir.splitlines()
        if line.endswith("= internal global ptr null, align 8")
    ]
    assert sorted(s for s in slots if "pool" not in s) == ["@aotc.scratch.0", "@aotc.scratch.1"]
    lib = build(tmp_path, small, large)

    def check(seed: int) -> bool:
        rng = np.random.default_rng(seed)
        for k in range(30):
            n = HEAP_N if k % 3 else 2 * HEAP_N
            a, b = rng.random(n), np.zeros(n)
            if n == HEAP_N:
                lib.kernel("cached")(a, b)
                want = a[::-1] * 2 + 1
            else:
                lib.kernel("nested")(a, b)
                want = (a[::-1] + 1) * 3
            if not np.array_equal(b, want):
                return False
        return True

    assert check(0)
    assert failures_in_threads(check, 2) == []


def test_a_parallel_region_caches_its_heap_buffer_at_its_own_site():
    """A heap buffer inside a parallel loop (one a thread) keeps a cache of its allocation site, apart
    from the kernels' shared temporaries."""
    rows, n = 4, HEAP_N
    A, B = Buffer("A", "float64", (rows, n)), Buffer("B", "float64", (rows, n))
    t, i, j = Buffer("t", "float64", (n,), "global"), Var("i"), Var("j")
    body = Allocate(
        t,
        seq(
            loop(j, n, S, BufferStore(t, Load(A, (i, j)), (j,))),
            loop(j, n, S, BufferStore(B, Load(t, (n - 1 - j,)), (i, j))),
        ),
    )
    ir = build_llvm_ir([PrimFunc("rows", (A, B), loop(i, rows, P, body)), heap_buffer_func()], HOST)
    assert "@rows.t.cached = internal global" in ir and "@aotc.scratch.0 = internal global" in ir


def test_parallel_closure_captures_outer_values(tmp_path):
    """An outer serial loop var and float/bool let vars flow into the outlined parallel body."""
    rows, n = 3, 20
    A, B = Buffer("A", "float32", (rows, n)), Buffer("B", "float32", (rows, n))
    r, j = Var("r"), Var("j")
    scale, flip = Var("scale", "float32"), Var("flip", "bool")
    inner = loop(j, n, P, BufferStore(B, select(flip, -Load(A, (r, j)), Load(A, (r, j))) * scale, (r, j)))
    body = loop(r, rows, S, LetStmt(scale, cast("float32", r) + 0.5, LetStmt(flip, eq(r % 2, 1), inner)))
    a, b = RNG.random((rows, n), dtype=np.float32), np.zeros((rows, n), np.float32)
    run1(tmp_path, PrimFunc("clo", (A, B), body), a, b)
    sign = np.where(np.arange(rows) % 2 == 1, -1, 1)[:, None]
    np.testing.assert_allclose(b, a * sign * (np.arange(rows)[:, None] + 0.5), rtol=1e-6)


def test_int32_loop_var_and_index(tmp_path):
    n = 37
    A, B = Buffer("A", "int32", (n,)), Buffer("B", "int32", (n,))
    i = Var("i", "int32")
    f = PrimFunc(
        "i32", (A, B), loop(i, n, S, BufferStore(B, Load(A, (i,)) * i, (const(n - 1) - cast("int64", i),)))
    )
    a, b = RNG.integers(-5, 5, n).astype(np.int32), np.zeros(n, np.int32)
    run1(tmp_path, f, a, b)
    np.testing.assert_array_equal(b, (a * np.arange(n, dtype=np.int32))[::-1])


def test_masked_select_with_invariant_load(tmp_path):
    n = 37
    A, C, B = Buffer("A", "float32", (n,)), Buffer("C", "float32", (2,)), Buffer("B", "float32", (n,))
    o, v = Var("o"), Var("v")
    idx = o * 16 + v
    value = select(Load(A, (idx,)) > const(0.5), Load(C, (cast("int64", o > 1),)), Load(A, (idx,)))
    body = loop(o, 3, S, loop(v, minimum(const(16), n - o * 16), V, BufferStore(B, value, (idx,)), 16))
    a, c, b = RNG.random(n, dtype=np.float32), np.array([7.0, 9.0], np.float32), np.zeros(n, np.float32)
    run1(tmp_path, PrimFunc("msel", (A, C, B), body), a, c, b)
    np.testing.assert_array_equal(b, np.where(a > 0.5, np.where(np.arange(n) >= 32, 9.0, 7.0), a))


def test_allocation_failure_returns_error(tmp_path):
    A = Buffer("A", "int64", (1,))
    huge = Buffer("huge", "int64", (1 << 58,), scope="global")
    i = Var("i")

    def use(k):
        return Allocate(
            huge, seq(BufferStore(huge, k, (k,)), BufferStore(A, Load(huge, (Load(A, (k,)),)), (k,)))
        )

    lib = build(
        tmp_path, PrimFunc("oom", (A,), use(const(0))), PrimFunc("oom_par", (A,), loop(i, 1, P, use(i)))
    )
    for name in ("oom", "oom_par"):
        with pytest.raises(KernelError):
            lib.kernel(name)(np.zeros(1, np.int64))


def test_unrolled_loops(tmp_path):
    """Constant extent: full copies; runtime extent (here 2, at most 4): guarded copies."""
    n = 10
    A, B = Buffer("A", "int32", (n,)), Buffer("B", "int32", (n,))
    i, k = Var("i"), Var("k")
    runtime_extent = const(n) - cast("int64", Load(A, (const(0),)))
    body = seq(
        loop(i, 8, U, BufferStore(B, Load(A, (i,)) + 1, (i,))),
        loop(k, runtime_extent, U, BufferStore(B, Load(A, (8 + k,)) * 2, (8 + k,)), 4),
    )
    a = np.arange(n, dtype=np.int32)
    a[0] = 8
    b = np.zeros(n, np.int32)
    run1(tmp_path, PrimFunc("unr", (A, B), body), a, b)
    np.testing.assert_array_equal(b, np.concatenate([a[:8] + 1, a[8:] * 2]))


def test_index_values_are_computed_once_where_they_dominate(tmp_path):
    """The copies of an unrolled loop share their row index (one sdiv by 3, not one per load and store);
    a value first computed in a branch's arm or a loop's body is computed again after it, where the
    first one would not dominate (the LLVM verifier refuses such IR)."""
    rows, n = 6, 8
    A, B = Buffer("A", "int32", (rows, n)), Buffer("B", "int32", (rows, n))
    C, D = Buffer("C", "int32", (rows + 1,)), Buffer("D", "int32", (rows + 1,))
    i, j, k = Var("i"), Var("j"), Var("k")
    row, late, mid = i // 3, (i + 5) // 7, (i + 3) // 5
    body = loop(
        i,
        3 * rows,
        S,
        seq(
            loop(j, n, U, BufferStore(B, Load(A, (row, j)) + cast("int32", j), (row, j))),
            IfThenElse(eq(i % 2, 0), BufferStore(C, Load(A, (late, const(1))), (late,))),
            BufferStore(D, Load(A, (late, const(2))), (late,)),
            loop(k, 2, S, BufferStore(D, Load(D, (mid,)) + cast("int32", k), (mid,))),
            BufferStore(C, Load(C, (mid,)) + cast("int32", mid), (mid,)),
        ),
    )
    func = PrimFunc("reuse", (A, B, C, D), body)
    unrolled_only = PrimFunc(
        "rows", (A, B), loop(i, 3 * rows, S, loop(j, n, U, BufferStore(B, Load(A, (row, j)) + 1, (row, j))))
    )
    ir = build_llvm_ir([unrolled_only], HOST, thread_pool=False)
    assert ir.count("sdiv i64") == 1, ir
    a = RNG.integers(-100, 100, (rows, n)).astype(np.int32)
    b, c, d = np.zeros((rows, n), np.int32), np.zeros(rows + 1, np.int32), np.zeros(rows + 1, np.int32)
    run1(tmp_path, func, a, b, c, d)
    want_b, want_c, want_d = np.zeros_like(b), np.zeros_like(c), np.zeros_like(d)
    for iv in range(3 * rows):
        r, t, m = iv // 3, (iv + 5) // 7, (iv + 3) // 5
        want_b[r] = a[r] + np.arange(n)
        if iv % 2 == 0:
            want_c[t] = a[t, 1]
        want_d[t] = a[t, 2]
        want_d[m] += 1
        want_c[m] += m
    np.testing.assert_array_equal(b, want_b)
    np.testing.assert_array_equal(c, want_c)
    np.testing.assert_array_equal(d, want_d)


def test_loads_of_a_buffer_the_function_never_writes_are_emitted_once(tmp_path):
    """A padded read that the copies of an unrolled loop share is bounds-checked and loaded once; a
    buffer the function also stores to is loaded again at every read (a store between may change it)."""
    n = 8
    A, B, C = Buffer("A", "int32", (n,)), Buffer("B", "int32", (n, 4)), Buffer("C", "int32", (n,))
    i, j = Var("i"), Var("j")
    padded = select(i - 1 >= 0, Load(A, (i - 1,)), const(7, "int32"))
    copy = seq(
        BufferStore(B, padded * (cast("int32", j) + 1) + Load(C, (i,)), (i, j)),
        BufferStore(C, Load(C, (i,)) + 1, (i,)),
    )
    func = PrimFunc("padded", (A, B, C), loop(i, n, S, loop(j, 4, U, copy)))
    ir = build_llvm_ir([func], HOST, thread_pool=False)
    body = ir[ir.index('@"padded"') :]
    assert body.count("\nsel_t") == 1, body  # one bounds check, not one per copy
    assert body.count("= load i32") == 1 + 2 * 4, body  # A once; C twice in each of the 4 copies
    a = RNG.integers(-100, 100, n).astype(np.int32)
    c = RNG.integers(-100, 100, n).astype(np.int32)
    b, c_out = np.zeros((n, 4), np.int32), c.copy()
    run1(tmp_path, func, a, b, c_out)
    shifted = np.concatenate([[7], a[:-1]]).astype(np.int32)
    want_b = shifted[:, None] * np.arange(1, 5, dtype=np.int32) + c[:, None] + np.arange(4, dtype=np.int32)
    np.testing.assert_array_equal(b, want_b)
    np.testing.assert_array_equal(c_out, c + 4)


def test_a_region_of_more_memory_operations_than_the_schedulers_keep_apart_computes_the_same(tmp_path):
    """Beyond `SCHEDULER_REGION_MEMORY_OPS` loads and stores in one block LLVM's schedulers order the rest
    more conservatively (their dependence maps cut down): the unrolled block below has 4x that many, each
    store reading the one before it, and must still give numpy's prefix sums."""
    from aotc.codegen.llvm import SCHEDULER_REGION_MEMORY_OPS

    n = 2 * SCHEDULER_REGION_MEMORY_OPS
    A, B = Buffer("A", "int32", (n,)), Buffer("B", "int32", (n,))
    i = Var("i")
    body = seq(
        BufferStore(B, Load(A, (const(0),)), (const(0),)),
        loop(i, n - 1, U, BufferStore(B, Load(B, (i,)) + Load(A, (i + 1,)), (i + 1,))),
    )
    a = RNG.integers(-1000, 1000, n).astype(np.int32)
    b = np.zeros(n, np.int32)
    run1(tmp_path, PrimFunc("prefix", (A, B), body), a, b)
    np.testing.assert_array_equal(b, np.cumsum(a, dtype=np.int32))


# ----------------------------------------------------------------------------- object code


def _globals_module(prefix: str, n: int, kept: bool) -> str:
    """A function storing to `n` internal globals, all listed in `llvm.used` when `kept`."""
    lines = [f"@{prefix}{i} = internal global i64 0, align 8" for i in range(n)]
    if kept:
        used = ", ".join(f"ptr @{prefix}{i}" for i in range(n))
        lines.append(f'@llvm.used = appending global [{n} x ptr] [{used}], section "llvm.metadata"')
    lines.append(f"define void @{prefix}_store() {{")
    lines += [f"  store volatile i64 {i}, ptr @{prefix}{i}" for i in range(n)]
    lines += ["  ret void", "}"]
    return "\n".join(lines) + "\n"


def test_an_object_does_not_depend_on_the_modules_compiled_before_it():
    """LLVM's ELF lowering remembers the `llvm.used` globals of each module a target machine emitted by
    address; a machine kept across modules put a later module's globals at reused addresses in sections
    of their own (a package's entry module keeps its plan that way, and a rebuilt package's library
    differed now and then). With 300 globals, 200-270 of them moved every time."""
    plain = _globals_module("b", 300, kept=False)
    before = compile_to_object(plain, HOST)
    compile_to_object(_globals_module("a", 300, kept=True), HOST)
    after = compile_to_object(plain, HOST)
    assert [s.name for s in read_elf(after).sections if s.name.startswith(".bss.")] == []
    assert after == before


# ----------------------------------------------------------------------------- errors


def _err(func, match):
    with pytest.raises(CodegenError, match=match):
        build_llvm_ir([func], HOST)


def test_nested_parallel_error():
    A = Buffer("A", "float32", (4, 4))
    i, j = Var("i"), Var("j")
    _err(
        PrimFunc("np", (A,), loop(i, 4, P, loop(j, 4, P, BufferStore(A, const(0.0), (i, j))))),
        "nested parallel",
    )


def test_vectorized_reduction_store_error():
    A, B = Buffer("A", "float32", (16,)), Buffer("B", "float32", (1,))
    v = Var("v")
    body = loop(v, 16, V, BufferStore(B, Load(B, (const(0),)) + Load(A, (v,)), (const(0),)))
    _err(PrimFunc("red", (A, B), body), "reduction")


def test_thread_binding_error():
    A = Buffer("A", "float32", (4,))
    i = Var("i")
    f = PrimFunc(
        "tb",
        (A,),
        For(i, const(4), 4, ForKind.THREAD_BINDING, BufferStore(A, const(0.0), (i,)), "threadIdx.x"),
    )
    _err(f, "not supported on CPU")


def test_other_errors():
    A = Buffer("A", "float32", (64, 64))
    i, j = Var("i"), Var("j")
    _err(
        PrimFunc("nv", (A,), loop(i, 4, V, loop(j, 4, V, BufferStore(A, const(0.0), (i, j))))),
        "nested inside",
    )
    _err(PrimFunc("wide", (A,), loop(i, 128, V, BufferStore(A, const(0.0), (i, i)))), "lanes")
    loc = Buffer("l", "float32", (4,), scope="local")
    _err(PrimFunc("va", (A,), loop(i, 4, V, Allocate(loc, BufferStore(A, const(0.0), (i, i))))), "allocation")
    _err(PrimFunc("ub", (A,), BufferStore(A, Var("free"), (const(0), const(0)))), "not bound")
    other = Buffer("other", "float32", (4,))
    _err(PrimFunc("nb", (A,), BufferStore(other, const(0.0), (const(0),))), "neither a parameter")
    _err(PrimFunc("bad name", (A,), BufferStore(A, const(0.0), (const(0), const(0)))), "identifier")


# ----------------------------------------------------------------------------- cross targets


def test_aarch64_object_emission():
    target = parse_target("llvm -mtriple=aarch64-linux-gnu")
    f = elementwise("add", 37, 4, ["float32", "float32"], "float32", lambda a, b: a + b)
    g = matmul(16, 16, 16, ti=2, tj=4)
    obj = compile_to_object(build_llvm_ir([f, g], target), target)
    assert isinstance(obj, bytes) and obj[:4] == b"\x7fELF"
    assert obj[18] == 183  # e_machine == EM_AARCH64


def test_parallel_chunks_run_every_iteration_once(tmp_path):
    """Threads claim chunks of their own block and then of the others': no iteration is lost or repeated,
    whatever the team size (70 threads exceeds the counters of one frame: each runs its own block). Two
    parallel loops in one function share the counters, zeroed again before the second."""
    N, B, C = Buffer("N", "int64", (1,)), Buffer("B", "int32", (4096,)), Buffer("C", "int32", (4096,))
    i, j = Var("i"), Var("j")

    def count(var, buf):
        one = cast("int32", const(1))
        return loop(var, Load(N, (const(0),)), P, BufferStore(buf, Load(buf, (var,)) + one, (var,)), 4096)

    lib = build(tmp_path, PrimFunc("count", (N, B, C), seq(count(i, B), count(j, C))))
    for threads in (1, 2, 3, 5, 70):
        lib.set_num_threads(threads)
        for n in (0, 1, 2, 3, 7, 8, 17, 100, 1000, 4096):
            b, c = np.zeros(4096, np.int32), np.zeros(4096, np.int32)
            lib.kernel("count")(np.array([n], np.int64), b, c)
            expected = (np.arange(4096) < n).astype(np.int32)
            np.testing.assert_array_equal(b, expected, err_msg=f"{threads} threads, extent {n}")
            np.testing.assert_array_equal(c, expected, err_msg=f"second loop: {threads} threads, extent {n}")


def test_avx2_cpu_named_without_mattr_gets_avx2_vector_math():
    from aotc.codegen.vecmath import veclib_for

    lib = veclib_for(parse_target("llvm -mcpu=znver3"))
    if lib is None:
        pytest.skip("no libmvec on this host")
    assert lib.isas == ("d", "b")  # AVX2 variants, not AVX1's
    assert veclib_for(parse_target("llvm -mcpu=sandybridge -mattr=+avx")).isas == ("c", "b")


def test_cached_heap_blocks_are_freed_when_the_library_is_unloaded(tmp_path):
    """Open, run and close a library 60 times in one process: its cached 560 KB block is freed at each
    unload, so the process does not grow by 60 of them (34 MB)."""
    import subprocess
    import sys

    n = HEAP_N
    path = str(build(tmp_path, heap_buffer_func()).path)
    script = f"""
import ctypes, _ctypes
import numpy as np
a, b = np.ones({n}), np.zeros({n})
args = (ctypes.c_void_p * 2)(a.ctypes.data, b.ctypes.data)

def rss():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS:")) * 1024

def cycle():
    lib = ctypes.CDLL({path!r})
    assert lib.cached(args) == 0
    _ctypes.dlclose(lib._handle)

cycle()
before = rss()
for _ in range(60):
    cycle()
print(rss() - before)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) < 8 << 20, f"grew by {int(proc.stdout) >> 20} MB"


@pytest.mark.parametrize(
    "target", ["llvm -mcpu=znver3", "llvm -mcpu=znver4", "llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1"]
)
def test_kernels_and_their_parallel_regions_start_on_a_cache_line(target):
    """Every kernel and parallel region is aligned to 64 bytes (`.p2align 6`), so its loops fall across
    cache lines the same way wherever a package places it and in the candidate that tuning measured."""
    from aotc import te
    from aotc.codegen.llvm import compile_to_assembly
    from aotc.schedule.default import default_schedule
    from aotc.schedule.lower import lower
    from aotc.te.dag import ComputeDAG
    from aotc.te.tensor import placeholder

    x = placeholder((256, 256), "float32", name="x")
    dag = ComputeDAG([te.compute((256, 256), lambda i, j: x[i, j] * 2.0, "double")])
    t = parse_target(target)
    funcs = [lower(default_schedule(dag, t), name) for name in ("first", "second")]
    lines = compile_to_assembly(build_llvm_ir(funcs, t, thread_pool=False), t).splitlines()
    labels = [i for i, line in enumerate(lines) if line in ("first:", "first.par:", "second:", "second.par:")]
    assert len(labels) == 4, labels
    for i in labels:
        align = [line.split()[1].rstrip(",") for line in lines[max(0, i - 6) : i] if ".p2align" in line]
        assert align and align[-1] == "6", (lines[i], lines[max(0, i - 6) : i])
