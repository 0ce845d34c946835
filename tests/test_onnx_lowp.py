"""Low-precision and sub-byte element types (bfloat16, float8, float4, float8e8m0, int4/uint4, int2/uint2):
the conversions of aotc.topi.lowp against ml_dtypes and ONNX's reference, bit-exact (every conversion is
exact or rounds once, as ONNX's Cast), and compiled packages that take and return ml_dtypes arrays."""

from __future__ import annotations

import aotc_runtime
import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import aotc
from aotc.frontend.errors import ConversionError
from aotc.frontend.onnx import load_onnx
from aotc.graph.interpret import evaluate_node
from aotc.graph.ir import Node, TensorType, Value
from aotc.topi.lowp import FORMATS

FLOAT8 = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")


def _samples() -> np.ndarray:
    """Specials, boundaries, ties and random values over float32's exponent range."""
    special = [0, -0.0, np.nan, -np.nan, np.inf, -np.inf, 1e6, -1e6, 470, 464, 448, 240, 57344, 61440]
    special += [0.25, 0.75, 1.25, 2.5, 5, 9, 1e-7, 1e-40, -3.5, 3.4e38, 2.0**-127, 2.0**-133, 2.0**-134]
    rng = np.random.default_rng(0)
    mags = np.float32(10) ** rng.integers(-40, 38, 3000).astype(np.float32)
    return np.concatenate(
        [np.array(special, np.float32), rng.standard_normal(3000).astype(np.float32) * mags]
    )


def _run(op: str, data: np.ndarray, attrs: dict) -> np.ndarray:
    """A graph op evaluated by the tensor-expression reference (what constants fold with, and what the
    compiled kernels are checked against)."""
    v = Value("x", TensorType(data.shape, str(data.dtype)), data=data)
    return evaluate_node(Node(op, [v], [], attrs), [data])[0]


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint16 if a.dtype.itemsize == 2 else np.uint8)


@pytest.mark.parametrize("name", [n for n, f in FORMATS.items() if f.kind == "float" and f.special != "e8m0"])
@pytest.mark.parametrize("source", ["float32", "float64"])
def test_float_encode_is_ml_dtypes_cast_bit_exact(name, source):
    """Round to nearest even; saturate as onnx.numpy_helper.saturate_cast (float8 only), else ml_dtypes'
    overflow (infinity or NaN per format), NaN signs as ml_dtypes gives them."""
    x, dtype = _samples().astype(source), np.dtype(getattr(ml_dtypes, name))
    for saturate in (True, False):
        got = _run("lowp_encode", x, {"format": name, "saturate": saturate and name in FLOAT8})
        want = numpy_helper.saturate_cast(x, dtype) if saturate and name in FLOAT8 else x.astype(dtype)
        np.testing.assert_array_equal(got, _bits(want), err_msg=f"{name} saturate={saturate}")


def test_the_runtime_stores_each_format_as_the_compiler_does():
    """aotc_runtime cannot import aotc: its table of the element types a package may carry must name the
    same formats, each in the storage type the compiler's FORMATS gives it."""
    from aotc_runtime.plan import ELEMENTS

    assert {name: fmt.storage for name, fmt in FORMATS.items()} == ELEMENTS


@pytest.mark.parametrize("name", list(FORMATS))
def test_decode_every_code_is_ml_dtypes_bit_exact(name):
    fmt = FORMATS[name]
    codes = np.arange(1 << fmt.bits, dtype=fmt.storage)
    want = codes.view(getattr(ml_dtypes, name))
    got = _run("lowp_decode", codes, {"format": name})
    if fmt.kind == "float":
        np.testing.assert_array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32))
    else:
        np.testing.assert_array_equal(got, want.astype(got.dtype))


def test_e8m0_encode_is_onnx_reference_for_each_round_mode():
    x = _samples()
    for saturate in (True, False):
        for mode in ("up", "down", "nearest"):
            got = _run(
                "lowp_encode", x, {"format": "float8_e8m0fnu", "saturate": saturate, "round_mode": mode}
            )
            want = numpy_helper.to_float8e8m0(x, saturate, mode)
            np.testing.assert_array_equal(got, _bits(want), err_msg=f"saturate={saturate} {mode}")


@pytest.mark.parametrize("name", ["int4", "uint4", "int2", "uint2"])
def test_int_encode_truncates_and_wraps_as_ml_dtypes(name):
    for x in (np.arange(-20, 20).astype(np.float32) + np.float32(0.5), np.arange(-20, 20).astype(np.int32)):
        got = _run("lowp_encode", x, {"format": name})
        np.testing.assert_array_equal(got, _bits(x.astype(getattr(ml_dtypes, name))))


def _model(nodes, inputs, outputs, initializers=(), opset: int = 25) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "lowp", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _compile_and_run(tmp_path, model: onnx.ModelProto, feeds: dict) -> dict:
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    package = aotc.compile(str(path), validate=False, output=tmp_path / "m.aotc", log=lambda _: None)
    return aotc_runtime.load(str(package.path)).run(feeds)


def test_compiled_casts_take_and_return_ml_dtypes_arrays_bit_exact(tmp_path):
    """One package: float32 -> each format (and back), bfloat16 and int4 inputs, saturate=0, a BitCast and
    data movement of bfloat16 and float8; outputs as ONNX's reference gives them, bit for bit, of ml_dtypes'
    types."""
    shape = [len(_samples()[:64])]
    casts = {
        "bfloat16": TensorProto.BFLOAT16,
        "float8_e4m3fn": TensorProto.FLOAT8E4M3FN,
        "float8_e5m2fnuz": TensorProto.FLOAT8E5M2FNUZ,
        "float4_e2m1fn": TensorProto.FLOAT4E2M1,
        "float8_e8m0fnu": TensorProto.FLOAT8E8M0,
        "uint4": TensorProto.UINT4,
    }
    nodes, outputs = [], []
    for name, code in casts.items():
        nodes.append(helper.make_node("Cast", ["x"], [f"to_{name}"], to=code))
        nodes.append(helper.make_node("Cast", [f"to_{name}"], [f"back_{name}"], to=TensorProto.FLOAT))
        outputs += [helper.make_tensor_value_info(f"to_{name}", code, shape)]
        outputs += [helper.make_tensor_value_info(f"back_{name}", TensorProto.FLOAT, shape)]
    nodes.append(helper.make_node("Cast", ["x"], ["e5m2_nosat"], to=TensorProto.FLOAT8E5M2, saturate=0))
    nodes.append(helper.make_node("Cast", ["b"], ["b_half"], to=TensorProto.FLOAT16))
    nodes.append(helper.make_node("Cast", ["i"], ["i_int8"], to=TensorProto.INT8))
    nodes.append(helper.make_node("Reshape", ["i", "flat"], ["i_flat"]))
    nodes.append(helper.make_node("BitCast", ["x"], ["x_bits"], to=TensorProto.INT32))
    # data movement passes the bits on: a selection (OneHot's values), a gather, a transpose
    nodes.append(helper.make_node("OneHot", ["hot_at", "depth", "b_pair"], ["hot"], axis=1))
    nodes.append(helper.make_node("Gather", ["b", "rows"], ["b_rows"], axis=0))
    nodes.append(helper.make_node("Reshape", ["to_float8_e4m3fn", "square"], ["f8_square"]))
    nodes.append(helper.make_node("Transpose", ["f8_square"], ["f8_part"]))
    outputs += [
        helper.make_tensor_value_info("e5m2_nosat", TensorProto.FLOAT8E5M2, shape),
        helper.make_tensor_value_info("b_half", TensorProto.FLOAT16, [2, 3]),
        helper.make_tensor_value_info("i_int8", TensorProto.INT8, [2, 3]),
        helper.make_tensor_value_info("i_flat", TensorProto.INT4, [6]),
        helper.make_tensor_value_info("x_bits", TensorProto.INT32, shape),
        helper.make_tensor_value_info("hot", TensorProto.BFLOAT16, [3, 4]),
        helper.make_tensor_value_info("b_rows", TensorProto.BFLOAT16, [2, 3]),
        helper.make_tensor_value_info("f8_part", TensorProto.FLOAT8E4M3FN, [8, 8]),
    ]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, shape),
        helper.make_tensor_value_info("b", TensorProto.BFLOAT16, [2, 3]),
        helper.make_tensor_value_info("i", TensorProto.INT4, [2, 3]),
    ]
    consts = {"flat": [6], "hot_at": [0, 3, -1], "rows": [1, 0], "square": [8, 8]}
    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in consts.items()]
    inits.append(numpy_helper.from_array(np.array(4, np.float32), "depth"))
    inits.append(numpy_helper.from_array(np.array([0.5, 2.5], ml_dtypes.bfloat16), "b_pair"))
    model = _model(nodes, inputs, outputs, inits, opset=28)  # OneHot-28 takes bfloat16 values
    feeds = {
        "x": _samples()[:64],
        "b": np.array([[1.5, -2.25, np.inf], [0, -0.0, 3e38]], ml_dtypes.bfloat16),
        "i": np.array([[-8, -1, 0], [1, 5, 7]], ml_dtypes.int4),
    }
    got = _compile_and_run(tmp_path, model, feeds)
    want = dict(zip([o.name for o in outputs], ReferenceEvaluator(model).run(None, feeds)))
    for name, ref in want.items():
        assert got[name].dtype == ref.dtype, name
        np.testing.assert_array_equal(
            _bits(got[name]) if ref.dtype.itemsize < 4 else got[name],
            _bits(ref) if ref.dtype.itemsize < 4 else ref,
            err_msg=name,
        )


def test_compiled_quantize_dequantize_int4_float8_blocked_and_int16(tmp_path):
    """QuantizeLinear to int4 (per axis), float8e4m3fn and int16, blocked uint8, and DequantizeLinear of
    them (a float16 scale for the float8 one) against ONNX's reference: bit-exact."""
    x = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32) * np.float32(4)
    inits = [
        numpy_helper.from_array(np.array([0.5, 0.25, 1.0, 0.75], np.float32), "s_axis"),
        numpy_helper.from_array(np.array([1, -2, 0, 3], ml_dtypes.int4), "z_int4"),
        numpy_helper.from_array(np.array(0.125, np.float32), "s"),
        numpy_helper.from_array(np.array(0, ml_dtypes.float8_e4m3fn), "z_f8"),
        numpy_helper.from_array(np.array(0.125, np.float16), "s_half"),
        numpy_helper.from_array(np.array(-300, np.int16), "z_i16"),
        numpy_helper.from_array(
            np.full((4, 3), 0.05, np.float32) * np.arange(1, 4, dtype=np.float32), "s_blk"
        ),
        numpy_helper.from_array(np.full((4, 3), 128, np.uint8), "z_blk"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s_axis", "z_int4"], ["q4"], axis=0),
        helper.make_node("DequantizeLinear", ["q4", "s_axis", "z_int4"], ["d4"], axis=0),
        helper.make_node("QuantizeLinear", ["x", "s", "z_f8"], ["q8"]),
        helper.make_node("DequantizeLinear", ["q8", "s_half"], ["d8"]),
        helper.make_node("QuantizeLinear", ["x", "s", "z_i16"], ["q16"]),
        helper.make_node("DequantizeLinear", ["q16", "s", "z_i16"], ["d16"]),
        helper.make_node("QuantizeLinear", ["x", "s_blk", "z_blk"], ["qb"], axis=1, block_size=2),
        helper.make_node("DequantizeLinear", ["qb", "s_blk", "z_blk"], ["db"], axis=1, block_size=2),
    ]
    types = {"q4": TensorProto.INT4, "q8": TensorProto.FLOAT8E4M3FN, "d8": TensorProto.FLOAT16}
    types |= {"q16": TensorProto.INT16, "qb": TensorProto.UINT8}
    names = ["q4", "d4", "q8", "d8", "q16", "d16", "qb", "db"]
    outputs = [helper.make_tensor_value_info(n, types.get(n, TensorProto.FLOAT), [4, 6]) for n in names]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])], outputs, inits)
    got = _compile_and_run(tmp_path, model, {"x": x})
    for name, ref in zip(names, ReferenceEvaluator(model).run(None, {"x": x})):
        assert got[name].dtype == ref.dtype, name
        np.testing.assert_array_equal(got[name].view(np.uint8), ref.view(np.uint8), err_msg=name)


def test_arithmetic_on_a_low_precision_tensor_is_refused_naming_node_and_type():
    """aotc computes on bfloat16 (and float8, int4...) only through Cast, the quantizers and, bfloat16,
    BFLOAT16_IN_FLOAT32's operators: a Gemm of bfloat16 inputs (whose reference rounds alpha * A @ B before
    adding beta * C) is refused by its node, not compiled on their bits as if they were integers."""
    bf16 = [helper.make_tensor_value_info(n, TensorProto.BFLOAT16, [3, 3]) for n in ("a", "b", "c")]
    model = _model(
        [helper.make_node("Gemm", ["a", "b", "c"], ["y"], name="gemm0", alpha=0.5)],
        bf16,
        [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [3, 3])],
    )
    with pytest.raises(
        ConversionError, match=r"node gemm0 \(Gemm\): input 0 \(a\) has element type bfloat16"
    ):
        load_onnx(model.SerializeToString())


def test_package_refuses_an_input_of_the_storage_dtype(tmp_path):
    """The boundary is typed: a float8 input is an ml_dtypes float8 array, not its uint8 bits. (The build
    validates against ONNX's reference evaluator: onnxruntime's Python API takes no float8 arrays.)"""
    model = _model(
        [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT8E4M3FN, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    package = aotc.compile(str(path), output=tmp_path / "m.aotc", log=lambda _: None)
    assert package.validation and all(row["ok"] for row in package.validation)
    loaded = aotc_runtime.load(str(package.path))
    assert loaded.inputs[0].dtype == np.dtype(ml_dtypes.float8_e4m3fn)
    with pytest.raises(ValueError, match="expected dtype float8_e4m3fn"):
        loaded.run({"x": np.zeros(4, np.uint8)})


def test_qlinearmatmul_float16_scales_and_batched_b_as_onnx_reference(tmp_path):
    """QLinearMatMul-21 with float16 scales and a 3-D b (a batch of matrices): the multiplier rounded in
    float16 as the reference computes it, the product exact in float64; bit-exact."""
    rng = np.random.default_rng(2)
    inits = [
        numpy_helper.from_array(np.array(0.0066, np.float16), "a_s"),
        numpy_helper.from_array(np.array(113, np.uint8), "a_z"),
        numpy_helper.from_array(rng.integers(0, 256, (2, 4, 3)).astype(np.uint8), "b"),
        numpy_helper.from_array(np.array(0.00705, np.float16), "b_s"),
        numpy_helper.from_array(np.array(114, np.uint8), "b_z"),
        numpy_helper.from_array(np.array(0.0107, np.float16), "y_s"),
        numpy_helper.from_array(np.array(118, np.uint8), "y_z"),
    ]
    node = helper.make_node("QLinearMatMul", ["a", "a_s", "a_z", "b", "b_s", "b_z", "y_s", "y_z"], ["y"])
    model = _model(
        [node],
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [2, 2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [2, 2, 3])],
        inits,
        opset=21,
    )
    feeds = {"a": rng.integers(0, 256, (2, 2, 4)).astype(np.uint8)}
    got = _compile_and_run(tmp_path, model, feeds)
    np.testing.assert_array_equal(got["y"], ReferenceEvaluator(model).run(None, feeds)[0])


def test_scalars_and_a_bfloat16_range_fold_as_onnx_reference():
    """0-d low-precision constants fold (Cast of a bfloat16 scalar), and Range reads bfloat16 constants as
    numbers (computed in float32, stash_type 1), its result a bfloat16 tensor."""
    inits = [
        numpy_helper.from_array(np.array(v, ml_dtypes.bfloat16), k)
        for k, v in {"start": 1.0, "limit": 9.5, "delta": 2.5}.items()
    ]
    nodes = [
        helper.make_node("Range", ["start", "limit", "delta"], ["r"]),
        helper.make_node("Cast", ["delta"], ["delta_f"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["delta_f"], ["delta_f8"], to=TensorProto.FLOAT8E5M2),
    ]
    outputs = [
        helper.make_tensor_value_info("r", TensorProto.BFLOAT16, [4]),
        helper.make_tensor_value_info("delta_f", TensorProto.FLOAT, []),
        helper.make_tensor_value_info("delta_f8", TensorProto.FLOAT8E5M2, []),
    ]
    model = _model(nodes, [], outputs, inits, opset=27)
    graph = load_onnx(model.SerializeToString())
    assert graph.elements == {"r": "bfloat16", "delta_f8": "float8_e5m2"}
    got = {v.name: v.data for v in graph.outputs}
    for name, ref in zip(["r", "delta_f", "delta_f8"], ReferenceEvaluator(model).run(None, {})):
        np.testing.assert_array_equal(got[name], _bits(ref) if ref.dtype.itemsize < 4 else ref, err_msg=name)


def _gpu_module(target: str):
    """lowp_encode (float8, bfloat16, float8e8m0), lowp_decode and a bit cast as one GPU module."""
    from aotc import te
    from aotc.codegen.gpu import emit_gpu
    from aotc.ir.expr import reinterpret
    from aotc.schedule.lower import lower
    from aotc.schedule.state import Annotation, State
    from aotc.target import parse_target
    from aotc.topi.lowp import decode, encode

    x = te.placeholder((256,), name="x", dtype="float32")
    b = te.placeholder((256,), name="b", dtype="uint8")
    outs = [
        te.compute((256,), lambda i: encode(x[i], FORMATS["float8_e4m3fn"], True), "e4m3"),
        te.compute((256,), lambda i: encode(x[i], FORMATS["bfloat16"], False), "bf16"),
        te.compute((256,), lambda i: encode(x[i], FORMATS["float8_e8m0fnu"], True, "nearest"), "e8m0"),
        te.compute((256,), lambda i: decode(b[i], FORMATS["float8_e5m2"]), "dec"),
        te.compute((256,), lambda i: reinterpret("int32", x[i]), "bits"),
    ]
    state = State.initial(te.ComputeDAG(outs))
    for op in outs:
        state = state.split(op.name, 0, [64]).bind(op.name, 0, Annotation.BLOCK_X)
        state = state.bind(op.name, 1, Annotation.THREAD_X)
    return emit_gpu(lower(state, "lowp"), parse_target(target))


def test_gpu_kernels_convert_bit_exact_on_opencl_and_compile_as_cuda():
    """The conversions' GPU form (OpenCL's as_<type>, CUDA's __float_as_int family): bit-exact on an
    OpenCL device (PoCL's CPU one in CI); the CUDA source compiles where a CUDA compiler is installed."""
    from aotc.codegen.gpu import compile_cuda, cuda_compiler_name, opencl_device, run_opencl

    device = opencl_device()
    if device is None and cuda_compiler_name() is None:
        pytest.skip("neither an OpenCL device nor a CUDA compiler")
    if cuda_compiler_name() is not None:
        assert compile_cuda(_gpu_module("cuda -arch=sm_90").cuda_source, "sm_90")[:4] == b"\x7fELF"
    if device is None:
        return
    x, codes = _samples()[:256], np.arange(256, dtype=np.uint8)
    e4m3, bf16, e8m0, dec, bits = run_opencl(_gpu_module("opencl"), [x, codes], device)
    np.testing.assert_array_equal(e4m3, _bits(numpy_helper.saturate_cast(x, ml_dtypes.float8_e4m3fn)))
    np.testing.assert_array_equal(bf16, _bits(x.astype(ml_dtypes.bfloat16)))
    np.testing.assert_array_equal(e8m0, _bits(numpy_helper.to_float8e8m0(x, True, "nearest")))
    want = codes.view(ml_dtypes.float8_e5m2).astype(np.float32)
    np.testing.assert_array_equal(dec.view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(bits, x.view(np.int32))


def _same_bits_or_nan(got: np.ndarray, ref: np.ndarray, name: str) -> None:
    """Bit-exact, except that any NaN matches any NaN (its sign and payload are not ONNX's to fix)."""
    g, r = np.asarray(got).astype(np.float32), np.asarray(ref).astype(np.float32)
    both_nan = np.isnan(g) & np.isnan(r)
    np.testing.assert_array_equal(
        np.where(both_nan, 0, g.view(np.uint32)), np.where(both_nan, 0, r.view(np.uint32)), err_msg=name
    )


def test_compiled_bfloat16_elementwise_comparison_and_reduction_round_once_as_onnx_reference(tmp_path):
    """Nodes of BFLOAT16_IN_FLOAT32 on bfloat16 inputs: computed in float32, each bfloat16 output rounded
    once, which is what ONNX's reference (numpy on ml_dtypes' bfloat16) gives: bit-exact; a comparison's
    bool output and Pow's float32 output (a float32 base) stay as they are."""
    shape = [4, 16]
    nodes = [
        helper.make_node("Add", ["a", "b"], ["add"]),
        helper.make_node("Mul", ["add", "b"], ["mul"]),
        helper.make_node("Div", ["a", "b"], ["div"]),
        helper.make_node("Exp", ["a"], ["exp"]),
        helper.make_node("Sqrt", ["a"], ["sqrt"]),
        helper.make_node("Pow", ["f", "e"], ["pow"]),
        helper.make_node("Less", ["a", "b"], ["less"]),
        helper.make_node("Where", ["less", "a", "mul"], ["where"]),
        helper.make_node("Clip", ["a", "lo", "hi"], ["clip"]),
        helper.make_node("ReduceMax", ["mul", "axes"], ["rmax"], keepdims=0),
        helper.make_node("MatMul", ["a", "w"], ["mm"]),
    ]
    bf = TensorProto.BFLOAT16
    outputs = [helper.make_tensor_value_info(n, bf, shape) for n in ("add", "mul", "div", "exp", "sqrt")]
    outputs += [
        helper.make_tensor_value_info("pow", TensorProto.FLOAT, shape),
        helper.make_tensor_value_info("less", TensorProto.BOOL, shape),
        helper.make_tensor_value_info("where", bf, shape),
        helper.make_tensor_value_info("clip", bf, shape),
        helper.make_tensor_value_info("rmax", bf, [4]),
        helper.make_tensor_value_info("mm", bf, [4, 8]),
    ]
    inputs = [helper.make_tensor_value_info(n, bf, shape) for n in ("a", "b", "e")]
    inputs.append(helper.make_tensor_value_info("f", TensorProto.FLOAT, shape))
    inits = [
        numpy_helper.from_array(np.array(-0.75, ml_dtypes.bfloat16), "lo"),
        numpy_helper.from_array(np.array(1.5, ml_dtypes.bfloat16), "hi"),
        numpy_helper.from_array(np.array([1], np.int64), "axes"),
        numpy_helper.from_array(
            np.random.default_rng(4).standard_normal((16, 8)).astype(ml_dtypes.bfloat16), "w"
        ),
    ]
    model = _model(nodes, inputs, outputs, inits)
    rng = np.random.default_rng(3)
    feeds = {n: (rng.standard_normal(shape) * 3).astype(ml_dtypes.bfloat16) for n in ("a", "b", "e")}
    feeds["a"].reshape(-1)[:4] = np.array([np.inf, -np.inf, np.nan, -0.0], ml_dtypes.bfloat16)
    feeds["f"] = np.abs(rng.standard_normal(shape)).astype(np.float32)
    got = _compile_and_run(tmp_path, model, feeds)
    for out, ref in zip(outputs, ReferenceEvaluator(model).run(None, feeds)):
        assert got[out.name].dtype == ref.dtype, out.name
        if ref.dtype == np.float32:  # pow: float32 math, aotc's and numpy's within an ulp
            np.testing.assert_allclose(got[out.name], ref, rtol=1e-6, err_msg=out.name)
        else:
            _same_bits_or_nan(got[out.name], ref, out.name)


def test_bfloat16_through_a_node_whose_reference_rounds_intermediates_is_refused():
    """Softmax's reference rounds its exponentials, their sum and the quotient to bfloat16 one by one, and
    Sum of three adds pairwise, rounding each partial sum: one rounding in float32 would differ, so they are
    refused by their node rather than computed differently."""
    bf16 = [helper.make_tensor_value_info(n, TensorProto.BFLOAT16, [3]) for n in ("a", "b", "c")]
    out = [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [3])]
    model = _model([helper.make_node("Softmax", ["a"], ["y"], name="sm")], bf16[:1], out)
    with pytest.raises(
        ConversionError, match=r"node sm \(Softmax\): input 0 \(a\) has element type bfloat16"
    ):
        load_onnx(model.SerializeToString())
    model = _model([helper.make_node("Sum", ["a", "b", "c"], ["y"], name="sum3")], bf16, out)
    with pytest.raises(ConversionError, match=r"node sum3 \(Sum\): input 0 \(a\) has element type bfloat16"):
        load_onnx(model.SerializeToString())
