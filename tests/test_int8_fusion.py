"""int8 element-wise ops fuse into the conv, depthwise conv or dense layer that produces their input (one
kernel: the op is computed in the producer's copy-out), and the fused models match the reference.

TFLite int8 models against LiteRT: `requantize: float` against its default XNNPACK kernels, `fixed_point`
against the builtin kernels. ONNX QDQ models (onnxruntime's quantize_static) against onnxruntime. Quantized
outputs by the LSB rule: within 1 LSB on >= 99.9% of values, never more than 2 (aotc.validate.compare).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import aotc
from aotc.frontend.onnx import load_onnx
from aotc.frontend.options import REQUANTIZE_CHOICES
from aotc.frontend.tflite import load_tflite
from aotc.graph.interpret import run_graph
from aotc.graph.ir import Graph
from aotc.graph.partition import FusedGroup, group_dag, partition
from aotc.graph.passes import optimize
from aotc.ir.dot import dot_forms, integer_winograd_rule
from aotc.schedule.default import default_schedule
from aotc.schedule.state import ComputeAtKind
from aotc.target import host_target, parse_target
from aotc.validate import compare, format_report_row, random_inputs
from recipes.zoo import onnx_models as zoo
from recipes.zoo.tflite_models import (
    OPCODES,
    SAME,
    ModelBuilder,
    Quant,
    act_options,
    conv_options,
    depthwise_options,
    int8_model,
    run_litert,
)
from tests.onnx_util import Input, make_graph_model

SEEDS = range(4)
PRODUCERS = {"conv": "qnn.conv2d_nhwc", "depthwise": "qnn.depthwise_conv2d_nhwc", "dense": "qnn.dense"}
TFLITE_TAILS = {"add": {"qnn.add"}, "mul": {"qnn.mul"}, "hard_swish": {"qnn.hard_swish"}}
# a CONCATENATION's int8 inputs share its scale (LiteRT refuses others): a QUANTIZE before it requantizes
TFLITE_TAILS["concat"] = {"qnn.quantize"}
CHANNELS = 16


def ops_after_producer(groups: list[FusedGroup], producer: str) -> set[str]:
    """The ops that follow a `producer` node inside its own kernel, over all kernels."""
    ops: set[str] = set()
    for g in groups:
        names = [n.op for n in g.nodes]
        if producer in names:
            ops.update(names[names.index(producer) + 1 :])
    return ops


def copy_out(groups: list[FusedGroup], producer: str) -> dict[str, str]:
    """Where the untuned schedule (znver4) computes the stages of the kernel holding `producer`, from its
    accumulator on: the accumulator inside the output's tiles (ITER) and everything between them inlined
    is the element-wise op computed in the producer tile's copy-out, one pass, no intermediate buffer."""
    (group,) = [g for g in groups if producer in [n.op for n in g.nodes] and g.nodes[-1].op != producer]
    state = default_schedule(group_dag(group)[0], parse_target("llvm -mcpu=znver4"))
    stages = [st for st in state.stages if not st.is_placeholder]
    first = next(i for i, st in enumerate(stages) if st.name.endswith("_acc"))
    return {st.name: ComputeAtKind(st.compute_at).name for st in stages[first:]}


def assert_copy_out(stages: dict[str, str]) -> None:
    names = list(stages)
    expected = {names[0]: "ITER", **dict.fromkeys(names[1:-1], "INLINED"), names[-1]: "ROOT"}
    assert stages == expected


def assert_lsb_rule(got: list[dict], ref: list[dict], what: str) -> None:
    """Every output of the pooled runs by the LSB rule (the histogram is in the failure message)."""
    pooled_got = {k: np.concatenate([r[k].reshape(-1) for r in got]) for k in ref[0]}
    pooled_ref = {k: np.concatenate([r[k].reshape(-1) for r in ref]) for k in ref[0]}
    for row in compare(pooled_got, pooled_ref, 0.0, 0.0):
        assert row["ok"], f"{what}:\n{format_report_row(row)}"


# --- TFLite -----------------------------------------------------------------------------------------------


def producer(mb: ModelBuilder, rng: np.random.Generator, kind: str, x: int) -> int:
    """A 3x3 conv, a 3x3 depthwise conv or a fully connected layer, CHANNELS in and out, with a bias."""
    c = CHANNELS
    bias = mb.const((rng.standard_normal(c) * 0.1).astype(np.float32))
    if kind == "conv":
        w = mb.const((rng.standard_normal((c, 3, 3, c)) * np.sqrt(2 / (9 * c))).astype(np.float32))
        return mb.op("CONV_2D", [x, w, bias], conv_options(SAME))
    if kind == "depthwise":
        w = mb.const((rng.standard_normal((1, 3, 3, c)) * 0.4).astype(np.float32))
        return mb.op("DEPTHWISE_CONV_2D", [x, w, bias], depthwise_options(SAME))
    w = mb.const((rng.standard_normal((c, c)) * np.sqrt(2 / c)).astype(np.float32))
    return mb.op("FULLY_CONNECTED", [x, w, bias], act_options("FullyConnectedOptions", KeepNumDims=True))


def tflite_float_model(kind: str, tail: str) -> ModelBuilder:
    """input -> producer -> tail: ADD / MUL of the producer's output and the input (a residual), HARD_SWISH,
    or CONCATENATION with a second producer of the same input."""
    rng = np.random.default_rng(0)
    mb = ModelBuilder()
    x = mb.input((1, 8, 8, CHANNELS) if kind != "dense" else (1, 4, CHANNELS))
    y = producer(mb, rng, kind, x)
    if tail == "add":
        y = mb.op("ADD", [y, x], act_options("AddOptions"))
    elif tail == "mul":
        y = mb.op("MUL", [y, x], act_options("MulOptions"))
    elif tail == "hard_swish":
        y = mb.op("HARD_SWISH", [y])
    else:
        y = mb.op("CONCATENATION", [y, producer(mb, rng, kind, x)], ("ConcatenationOptions", {"Axis": -1}))
    mb.output(y)
    mb.build()
    return mb


def requantized_concat(mb: ModelBuilder, factor: float = 1.3, shift: int = 5) -> ModelBuilder:
    """The int8 model with its CONCATENATION's first input given its own scale and zero point, and a
    QUANTIZE (int8 -> int8) that requantizes it to the concatenation's, as TFLite's converter writes it."""
    concat = next(op for op in mb.ops if mb.opcodes[op.opcode][0] == OPCODES["CONCATENATION"])
    t = concat.inputs[0]
    q = mb.tensors[t].quant
    shared = mb.tensor(mb.tensors[t].shape, "int8", quant=Quant(list(q.scale), list(q.zero_point)))
    mb.tensors[t].quant = Quant([q.scale[0] * factor], [q.zero_point[0] + shift])
    mb.op("QUANTIZE", [t], outputs=[shared])
    mb.ops.insert(mb.ops.index(concat), mb.ops.pop())
    concat.inputs[0] = shared
    return mb


def tflite_model(kind: str, tail: str) -> tuple[ModelBuilder, bytes]:
    mb = int8_model(tflite_float_model(kind, tail))
    if tail == "concat":
        mb = requantized_concat(mb)
    return mb, mb.serialize()


def tflite_inputs(mb: ModelBuilder) -> list[dict[str, np.ndarray]]:
    specs = {mb.tensors[t].name: (mb.tensors[t].shape, mb.tensors[t].dtype) for t in mb.inputs}
    return [random_inputs(specs, seed=s) for s in SEEDS]


@pytest.mark.parametrize("requantize", REQUANTIZE_CHOICES)
@pytest.mark.parametrize("tail", sorted(TFLITE_TAILS))
@pytest.mark.parametrize("kind", sorted(PRODUCERS))
def test_tflite_int8_tail_fuses_into_its_producer_and_matches_litert(kind, tail, requantize):
    mb, data = tflite_model(kind, tail)
    graph = optimize(load_tflite(data, requantize=requantize))
    groups = partition(graph)
    fused = ops_after_producer(groups, PRODUCERS[kind])
    assert TFLITE_TAILS[tail] <= fused, [[n.op for n in g.nodes] for g in groups]
    feeds = tflite_inputs(mb)
    got = [run_graph(graph, f) for f in feeds]
    ref = [run_litert(data, f, xnnpack=requantize == "float") for f in feeds]
    assert_lsb_rule(got, ref, f"{kind} -> {tail}, requantize: {requantize}")


@pytest.mark.parametrize("kind, requantize", [(k, r) for k in sorted(PRODUCERS) for r in REQUANTIZE_CHOICES])
@pytest.mark.parametrize("tail", sorted(TFLITE_TAILS))
def test_tflite_int8_tail_is_computed_in_the_producers_copy_out(kind, tail, requantize):
    _, data = tflite_model(kind, tail)
    assert_copy_out(copy_out(partition(optimize(load_tflite(data, requantize=requantize))), PRODUCERS[kind]))


def int8_mul_model(sa: float, sb: float, so: float) -> tuple[bytes, dict[str, np.ndarray]]:
    """A lone int8 MUL of two [256, 256] inputs holding every pair of int8 values."""
    mb = ModelBuilder()
    a = mb.input((256, 256), "int8", quant=Quant([sa], [3]))
    b = mb.input((256, 256), "int8", quant=Quant([sb], [-7]))
    mb.output(mb.op("MUL", [a, b], act_options("MulOptions"), dtype="int8", quant=Quant([so], [-2])))
    values = np.arange(-128, 128, dtype=np.int8)
    feeds = {"input0": np.repeat(values[:, None], 256, 1), "input1": np.repeat(values[None, :], 256, 0)}
    return mb.build(), feeds


@pytest.mark.parametrize("requantize", REQUANTIZE_CHOICES)
def test_tflite_int8_mul_is_bit_exact_with_its_litert_path(requantize):
    """`float`: XNNPACK's float32 rescale of the int32 product, rounded half to even; `fixed_point`: the
    builtin kernel's multiplier and shift. Bit for bit on every pair of inputs (the other arithmetic is off
    by 1 LSB near rounding ties)."""
    for scales in ((0.05, 0.03, 0.07), (0.011, 0.2, 0.013)):
        data, feeds = int8_mul_model(*scales)
        (got,) = run_graph(load_tflite(data, requantize=requantize), feeds).values()
        (ref,) = run_litert(data, feeds, xnnpack=requantize == "float").values()
        np.testing.assert_array_equal(got, ref, err_msg=f"scales {scales}")


def int8_requantize_model(ratio: float) -> tuple[bytes, list[np.ndarray]]:
    """A lone int8 -> int8 QUANTIZE (input scale / output scale = `ratio`) of every int8 value."""
    mb = ModelBuilder()
    x = mb.input((1, 256), "int8", quant=Quant([0.02 * ratio], [10]))
    mb.output(mb.op("QUANTIZE", [x], dtype="int8", quant=Quant([0.02], [-10])))
    return mb.build(), [np.arange(-128, 128, dtype=np.int8).reshape(1, 256)]


@pytest.mark.parametrize("requantize", REQUANTIZE_CHOICES)
def test_tflite_int8_requantize_is_bit_exact_with_its_litert_path(requantize):
    """`float`: XNNPACK's convert (a multiplier with 8 fraction bits) for ratios in its range, the builtin
    kernel beyond it, where the delegate leaves the op; `fixed_point`: the builtin kernel, whose last shift
    rounds half up (off by 1 LSB on ~25% of values at ratios below 1/2 when it rounded half away)."""
    for ratio in (0.004, 0.2, 0.33, 0.49, 0.5, 0.61, 1.3, 2.5, 200.0):
        data, feeds = int8_requantize_model(ratio)
        (got,) = run_graph(load_tflite(data, requantize=requantize), {"input0": feeds[0]}).values()
        (ref,) = run_litert(data, feeds, xnnpack=requantize == "float").values()
        np.testing.assert_array_equal(got, ref, err_msg=f"ratio {ratio}")


HARD_SWISH_QUANT = [(0.05, 3, 0.03, -20), (0.1, -10, 0.05, -100), (0.001, 0, 0.002, -128), (2.0, 0, 1.5, -30)]
"""(input scale, zero point, output scale, zero point): relu-ish rescales shifting right and left."""


@pytest.mark.parametrize("requantize", REQUANTIZE_CHOICES)
def test_tflite_int8_hard_swish_is_bit_exact_with_litert(requantize):
    """TFLite's 16-bit fixed-point kernel, which LiteRT runs on both paths (XNNPACK does not take an
    int8 HARD_SWISH), on every int8 value."""
    x = np.arange(-128, 128, dtype=np.int8).reshape(1, 256)
    for si, zi, so, zo in HARD_SWISH_QUANT:
        mb = ModelBuilder()
        a = mb.input((1, 256), "int8", quant=Quant([si], [zi]))
        mb.output(mb.op("HARD_SWISH", [a], dtype="int8", quant=Quant([so], [zo])))
        data = mb.build()
        (got,) = run_graph(load_tflite(data, requantize=requantize), {"input0": x}).values()
        (ref,) = run_litert(data, [x], xnnpack=requantize == "float").values()
        np.testing.assert_array_equal(got, ref, err_msg=f"quantization {(si, zi, so, zo)}")


def test_tflite_package_runs_the_fused_kernels(tmp_path):
    """A built package has one kernel per conv (the ADD, the HARD_SWISH and the concatenation's requantize
    inside them; a 3x3 conv as integer Winograd where the host's rule takes it) and gives the numpy
    evaluator's values bit for bit."""
    rng = np.random.default_rng(1)
    mb = ModelBuilder()
    x = mb.input((1, 8, 8, CHANNELS))
    y = mb.op("ADD", [producer(mb, rng, "conv", x), x], act_options("AddOptions"))
    y = mb.op("HARD_SWISH", [producer(mb, rng, "depthwise", y)])
    y = mb.op("CONCATENATION", [producer(mb, rng, "conv", y), y], ("ConcatenationOptions", {"Axis": -1}))
    mb.output(y)
    mb.build()
    mb = requantized_concat(int8_model(mb))
    data = mb.serialize()
    (tmp_path / "fused.tflite").write_bytes(data)
    package = aotc.compile(str(tmp_path / "fused.tflite"), output=tmp_path / "fused.aotc", log=lambda _: None)
    kernels = sorted(tuple(n.op for n in g.nodes) for t in package.result.tasks for g in t.groups)
    # an 8x8 image is 4 tiles of F(4, 3): integer Winograd where the host's rule takes every size (no VNNI)
    rule = integer_winograd_rule(dot_forms(host_target()))
    conv = "qnn.conv2d_winograd_nhwc" if rule is not None and rule.min_tiles <= 4 else "qnn.conv2d_nhwc"
    assert kernels == [
        ("concat",),
        (conv, "qnn.add"),
        (conv, "qnn.quantize"),
        ("qnn.depthwise_conv2d_nhwc", "qnn.hard_swish"),
    ], kernels
    (row,) = package.validation
    assert row["ok"], format_report_row(row)
    model = package.load()
    feeds = tflite_inputs(mb)[0]
    (expected,) = run_graph(optimize(load_tflite(data)), feeds).values()
    (got,) = model.run(feeds).values()
    np.testing.assert_array_equal(got, expected)


# --- ONNX QDQ ---------------------------------------------------------------------------------------------

ONNX_TAILS = {
    "add": {"qnn.add"},
    "mul": {"qnn.mul"},
    "mul_scalar": {"qnn.mul"},
    "hard_swish": {"qnn.dequantize", "hard_swish", "qnn.quantize"},
    "sigmoid": {"qnn.dequantize", "sigmoid", "qnn.quantize"},
    "hard_sigmoid": {"qnn.dequantize", "qnn.quantize"},
    "leaky_relu": {"qnn.dequantize", "qnn.quantize"},
    "concat": {"qnn.dequantize", "qnn.quantize"},  # the requantization of an input whose scale differs
}
ONNX_OPS = {"hard_swish": "HardSwish", "sigmoid": "Sigmoid", "hard_sigmoid": "HardSigmoid"}


def onnx_float_model(tail: str, c: int = 8, size: int = 8) -> onnx.ModelProto:
    """input -> 3x3 Conv -> tail -> 1x1 Conv + Relu -> output; the tail is Add or Mul of the conv's output and
    the input, a unary op, or Concat with a second (1x1) Conv of the input."""
    rng = np.random.default_rng(0)
    consts: dict[str, np.ndarray] = {}

    def conv(x: str, cin: int, cout: int, k: int, name: str) -> helper.NodeProto:
        consts[f"{name}.w"] = (rng.standard_normal((cout, cin, k, k)) * np.sqrt(2 / (cin * k * k))).astype(
            np.float32
        )
        consts[f"{name}.b"] = rng.uniform(-0.1, 0.1, cout).astype(np.float32)
        pads = [k // 2] * 4
        return helper.make_node("Conv", [x, f"{name}.w", f"{name}.b"], [name], kernel_shape=[k, k], pads=pads)

    nodes = [conv("input", c, c, 3, "conv0")]
    channels = c
    if tail in ("add", "mul"):
        nodes.append(helper.make_node(tail.capitalize(), ["conv0", "input"], ["tail"]))
    elif tail == "mul_scalar":
        consts["factor"] = np.array(0.7, np.float32)
        nodes.append(helper.make_node("Mul", ["conv0", "factor"], ["tail"]))
    elif tail == "leaky_relu":
        nodes.append(helper.make_node("LeakyRelu", ["conv0"], ["tail"], alpha=0.1))
    elif tail == "concat":
        nodes += [
            conv("input", c, c, 1, "conv1"),
            helper.make_node("Concat", ["conv0", "conv1"], ["tail"], axis=1),
        ]
        channels = 2 * c
    else:
        nodes.append(helper.make_node(ONNX_OPS[tail], ["conv0"], ["tail"]))
    nodes += [conv("tail", channels, c, 1, "conv2"), helper.make_node("Relu", ["conv2"], ["output"])]
    return make_graph_model(nodes, {"input": Input((1, c, size, size))}, ["output"], consts, opset=17)


def qdq_model(tmp_path, tail: str, activations: str) -> tuple[str, str, float]:
    """The float model quantized (QDQ, per-channel weights) with its last QuantizeLinear's output made a
    graph output too; (path, that output's name, its scale)."""
    path = tmp_path / f"{tail}_{activations}.onnx"
    zoo.quantize(onnx_float_model(tail), path, per_channel=True, activations=activations)
    model = onnx.load(path)
    last_dq = next(n for n in model.graph.node if "output" in n.output)
    model.graph.output.append(helper.make_empty_tensor_value_info(last_dq.input[0]))
    onnx.save(model, path)
    scales = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return str(path), last_dq.input[0], float(scales[last_dq.input[1]])


def onnx_inputs() -> list[dict[str, np.ndarray]]:
    return [
        {"input": np.random.default_rng(100 + s).standard_normal((1, 8, 8, 8)).astype(np.float32)}
        for s in SEEDS
    ]


def onnxruntime_outputs(path: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def fused_groups(graph: Graph) -> list[list[str]]:
    return [[n.op for n in g.nodes] for g in partition(graph)]


@pytest.mark.parametrize("activations", ["uint8", "int8"])
@pytest.mark.parametrize("tail", sorted(ONNX_TAILS))
def test_qdq_tail_fuses_into_its_conv_and_matches_onnxruntime(tmp_path, tail, activations):
    path, quantized, scale = qdq_model(tmp_path, tail, activations)
    graph = optimize(load_onnx(path))
    fused = ops_after_producer(partition(graph), "qnn.conv2d_nhwc")
    assert ONNX_TAILS[tail] <= fused, fused_groups(graph)
    feeds = onnx_inputs()
    got = [run_graph(graph, f) for f in feeds]
    ref = [onnxruntime_outputs(path, f) for f in feeds]
    assert_lsb_rule([{quantized: g[quantized]} for g in got], [{quantized: r[quantized]} for r in ref], tail)
    err = max(np.abs(g["output"] - r["output"]).max() for g, r in zip(got, ref))
    assert err <= 2 * scale, f"{tail}: the float output is off by {err / scale:.2f} x its scale"


@pytest.mark.parametrize(
    "tail",
    [t for t in sorted(ONNX_TAILS) if t not in ("sigmoid", "leaky_relu")]
    + [
        pytest.param(
            t,
            marks=pytest.mark.xfail(
                strict=True,
                reason="an op with an expensive call (exp) or a select is not inlined by the DAG analysis: "
                "written to a buffer inside the kernel and quantized in a second loop nest",
            ),
        )
        for t in ("sigmoid", "leaky_relu")
    ],
)
def test_qdq_tail_is_computed_in_the_convs_copy_out(tmp_path, tail):
    path, _, _ = qdq_model(tmp_path, tail, "uint8")
    assert_copy_out(copy_out(partition(optimize(load_onnx(path))), "qnn.conv2d_nhwc"))
