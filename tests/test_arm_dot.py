"""AArch64 `sdot`/`udot` (FEAT_DotProd without FEAT_I8MM, docs/int8.md#forms): the forms a target gets, the
zero-point fold that keeps a product's factors of matching signedness there (and nowhere else), the
instructions in the assembly of int8 convs, depthwise convs and dense layers, and their results bit for
bit against the numpy reference evaluator of the unfolded layer, run under qemu-aarch64 -cpu cortex-a76
(which has dotprod and no i8mm) where qemu and the cross toolchain exist."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest

from aotc.codegen.llvm import build_llvm_ir, compile_to_assembly
from aotc.codegen.module import build_module
from aotc.graph.ir import Graph, Node, TensorType, Value
from aotc.graph.passes import fold_input_zero_point
from aotc.ir.dot import dot_forms, same_sign_only
from aotc.ir.stmt import For, ForKind, walk_stmts
from aotc.schedule.default import default_schedule
from aotc.schedule.layout import apply_layouts, rewrite_layout
from aotc.schedule.lower import lower
from aotc.schedule.tiling import dot_tilings
from aotc.search.annotation import sample_state
from aotc.search.lowering import lowered
from aotc.search.params import SearchParams
from aotc.search.sketch import SearchContext, generate_sketches
from aotc.target import parse_target
from aotc.te.dag import ComputeDAG
from aotc.te.reference import evaluate
from aotc.te.tensor import LAYOUT_FREE, placeholder
from aotc.topi.quantized import mac_zero_point
from aotc.topi.registry import get_op

from .test_aarch64 import build_driver, needs_cross, needs_qemu, run_under_qemu
from .test_dot_products import layer_attrs

A76 = "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a76 -num-cores=1"  # dotprod, no i8mm
N2 = "llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n2 -num-cores=1"  # dotprod and i8mm
A72 = "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72 -num-cores=1"  # neither
ZNVER4 = "llvm -mcpu=znver4 -num-cores=1"
# op, input shape, weight shape (a depthwise window's rows padded to 4 taps, as pad_depthwise_taps leaves
# them), input dtype, weight dtype, input zero point, per-channel weight scales
LAYERS = {
    "conv_s8_per_channel": ("qnn.conv2d_nhwc", (1, 5, 6, 16), (8, 3, 3, 16), "int8", "int8", 3, True),
    "conv_s8_per_tensor_zp_-128": (
        "qnn.conv2d_nhwc",
        (1, 5, 6, 16),
        (8, 3, 3, 16),
        "int8",
        "int8",
        -128,
        False,
    ),
    "depthwise_s8_per_channel": (
        "qnn.depthwise_conv2d_nhwc",
        (1, 6, 5, 8),
        (1, 3, 4, 8),
        "int8",
        "int8",
        -9,
        True,
    ),
    "dense_s8_per_tensor": ("qnn.dense", (3, 32), (8, 32), "int8", "int8", 11, False),
    "dense_u8_x_s8_per_channel": ("qnn.dense", (3, 32), (8, 32), "uint8", "int8", 120, True),
    "conv_u8_x_u8_per_tensor": ("qnn.conv2d_nhwc", (1, 4, 5, 8), (4, 3, 3, 8), "uint8", "uint8", 7, False),
}
# the instruction each layer's products run on (on a dotprod-only target)
INSTRUCTION = {name: "udot" if layer[4] == "uint8" else "sdot" for name, layer in LAYERS.items()}


def qnn_graph(name: str, seed: int = 0) -> tuple[Graph, Node]:
    """One quantized layer of LAYERS with a random constant weight and bias, as a frontend imports it."""
    op, x_shape, w_shape, x_dtype, w_dtype, zx, per_channel = LAYERS[name]
    rng = np.random.default_rng(seed)
    depthwise = op == "qnn.depthwise_conv2d_nhwc"
    out_c = w_shape[3] if depthwise else w_shape[0]
    info = np.iinfo(w_dtype)
    weight = rng.integers(info.min, info.max + 1, w_shape).astype(w_dtype)
    if depthwise:
        weight[:, :, 3, :] = 0  # the padded tap column holds the weight's zero point
    attrs = layer_attrs(op, w_shape, zx, per_channel)
    x = Value("x", TensorType(x_shape, x_dtype))
    w = Value("w", TensorType(w_shape, w_dtype), data=weight)
    b = Value("b", TensorType((out_c,), "int32"), data=rng.integers(-5000, 5000, out_c).astype(np.int32))
    # the conv's 3x3 window with pads 1 (the depthwise one's 3 rows of 4 taps with pads 1 + 2) keeps H, W
    y = Value("y", TensorType((*x_shape[:-1], out_c), "int8"))
    node = Node(op, [x, w, b], [y], attrs, name=name)
    y.producer = node
    return Graph([x], [y], [node]), node


def layer_dag(node: Node) -> ComputeDAG:
    """The node's compute with its weight and bias as layout-free placeholders."""
    x, w, b = node.inputs
    args = [
        placeholder(x.type.shape, x.type.dtype, name="x"),
        placeholder(w.type.shape, w.type.dtype, name="w", tag=LAYOUT_FREE),
        placeholder(b.type.shape, "int32", name="b", tag=LAYOUT_FREE),
    ]
    return ComputeDAG(get_op(node.op).compute(args, node.attrs))


def folded_layer(name: str, same_sign: bool = True) -> tuple[ComputeDAG, dict, np.ndarray, Node]:
    """(the folded layer's dag, its feed, the unfolded layer's result from the reference evaluator, the
    folded node)."""
    graph, node = qnn_graph(name)
    x = node.inputs[0]
    rng = np.random.default_rng(1)
    info = np.iinfo(x.type.dtype)
    data = rng.integers(info.min, info.max + 1, x.type.shape).astype(x.type.dtype)
    original = {"x": data, "w": node.inputs[1].data, "b": node.inputs[2].data}
    (expected,) = evaluate(layer_dag(node), original)
    fold_input_zero_point(graph, same_sign=same_sign)
    feed = {"x": data, "w": node.inputs[1].data, "b": node.inputs[2].data}
    return layer_dag(node), feed, expected, node


def tensorized(func) -> list[For]:
    return [s for s in walk_stmts(func.body) if isinstance(s, For) and s.kind == ForKind.TENSORIZED]


def mnemonics(asm: str) -> set[str]:
    """The dot-product instructions in `asm` (sudot: usdot's by-element twin)."""
    return set(re.findall(r"\t(sdot|udot|usdot|sudot)\t", asm))


def test_dotprod_targets_get_sdot_and_udot_and_the_same_sign_graph():
    def forms(text: str) -> list[str]:
        return [f.name for f in dot_forms(parse_target(text))]

    assert forms(A76) == ["sdot", "udot"]
    assert forms("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a55") == ["sdot", "udot"]
    assert forms(N2) == ["usdot", "sdot", "udot"]  # usdot first: it takes the products of mixed signs
    assert forms(A72) == []
    # only a target whose forms all read matching signs gives up the x + 128 graph; x86 keeps it
    assert same_sign_only(dot_forms(parse_target(A76)))
    for text in (N2, A72, ZNVER4, "llvm -mcpu=znver3"):
        assert not same_sign_only(dot_forms(parse_target(text))), text
    assert mac_zero_point("qnn.conv2d_nhwc", "int8") == -128  # the default (vpdpbusd, usdot)
    assert mac_zero_point("qnn.conv2d_nhwc", "int8", same_sign_as="int8") == 0
    assert mac_zero_point("qnn.dense", "uint8", same_sign_as="int8") == 128
    assert mac_zero_point("qnn.dense", "int8", same_sign_as="uint8") == -128
    assert mac_zero_point("qnn.dense", "uint8", same_sign_as="uint8") == 0


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_the_same_sign_fold_is_exact_and_the_default_fold_unchanged(name):
    """With same_sign the node records its mac_zero_point; without it the attrs are what x86 and i8mm
    builds always got (their workload keys and shipped records stay valid); both are bit-exact."""
    x_dtype, w_dtype, zx = LAYERS[name][3:6]
    for same_sign in (True, False):
        dag, feed, expected, node = folded_layer(name, same_sign)
        m = mac_zero_point(node.op, x_dtype, w_dtype if same_sign else None)
        assert node.attrs.get("input_zero_point_in_bias", False) == (zx != m), (name, same_sign)
        assert ("mac_zero_point" in node.attrs) == (same_sign and zx != m), (name, same_sign)
        (got,) = evaluate(dag, feed)
        np.testing.assert_array_equal(got, expected, err_msg=f"{name} same_sign={same_sign}")


def test_rule_where_both_exist_usdot_for_mixed_signs_sdot_udot_for_matching():
    """On an i8mm target the graph keeps x + 128 (uint8 x int8): usdot; a product whose factors already
    match (int8 x int8 at zero point 0, uint8 x uint8) takes sdot/udot there too; on a dotprod-only target
    the x + 128 graph has no form and the same-sign graph takes sdot/udot."""
    a76, n2 = dot_forms(parse_target(A76)), dot_forms(parse_target(N2))

    def chosen(name: str, forms, same_sign: bool) -> list[str]:
        dag = folded_layer(name, same_sign)[0]
        return [t.form.name for op in dag.compute_ops for t in dot_tilings(op, forms)]

    assert chosen("conv_s8_per_channel", n2, False) == ["usdot"]
    assert chosen("conv_s8_per_channel", a76, False) == []
    assert chosen("conv_s8_per_channel", a76, True) == ["sdot"]
    assert chosen("conv_s8_per_channel", n2, True) == ["sdot"]
    assert chosen("dense_u8_x_s8_per_channel", n2, False) == ["usdot"]
    assert chosen("dense_u8_x_s8_per_channel", a76, True) == ["sdot"]  # x - 128
    assert chosen("conv_u8_x_u8_per_tensor", a76, True) == ["udot"]


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_default_schedule_emits_sdot_or_udot_for_a_dotprod_target(name):
    target = parse_target(A76)
    dag = folded_layer(name)[0]
    func = lower(rewrite_layout(default_schedule(dag, target))[0], "k")
    (loop,) = tensorized(func)
    assert loop.max_extent == 4
    ir = build_llvm_ir([func], target)
    assert f"@llvm.aarch64.neon.{INSTRUCTION[name]}.v4i32.v16i8" in ir
    assert INSTRUCTION[name] in mnemonics(compile_to_assembly(ir, target)), name


def sampled(dag: ComputeDAG, target, n: int, seed: int) -> list:
    """`n` sampled programs with a tensorized loop."""
    params = SearchParams()
    ctx = SearchContext(dag, target, params)
    sketches = generate_sketches(dag, target, params)
    rng = random.Random(seed)
    out = []
    for _ in range(400):
        s = sample_state(ctx, sketches[rng.randrange(len(sketches))], rng)
        func = None if s is None else lowered(s)
        if func is not None and tensorized(func):
            out.append(s)
            if len(out) == n:
                break
    assert len(out) == n, f"only {len(out)} of {n} samples"
    return out


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    return build_driver(tmp_path_factory.mktemp("driver"))


def check_under_qemu(driver, tmp_path, name: str, n_sampled: int) -> None:
    target = parse_target(A76)
    dag, feed, expected, _ = folded_layer(name)
    states = [default_schedule(dag, target)]
    if n_sampled:
        states += sampled(dag, target, n_sampled, seed=len(name))
    for i, state in enumerate(states):
        rewritten, layouts = rewrite_layout(state)
        func = lower(rewritten, "k")
        assert tensorized(func), f"{name} program {i}"
        asm = compile_to_assembly(build_llvm_ir([func], target), target)
        assert INSTRUCTION[name] in mnemonics(asm), f"{name} program {i}"
        lib = build_module([func], target, str(tmp_path / f"k{i}.so"))
        args = apply_layouts([feed[p.name] for p in dag.placeholders], layouts)
        out = np.zeros(expected.shape, expected.dtype)
        got = run_under_qemu(driver, lib, "cortex-a76", [*args, out], tmp_path)[-1]
        np.testing.assert_array_equal(got, expected, err_msg=f"{name} program {i}")


@needs_cross
@needs_qemu
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_sdot_udot_kernels_are_bit_exact_under_qemu_cortex_a76(driver, tmp_path, name):
    """The default schedule of each layer on qemu's Cortex-A76 (dotprod, no i8mm: usdot would trap):
    int8 x int8 and uint8 - 128 x int8 on sdot, uint8 x uint8 on udot."""
    check_under_qemu(driver, tmp_path, name, 0)


@pytest.mark.slow
@needs_cross
@needs_qemu
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_sampled_sdot_udot_programs_are_bit_exact_under_qemu(driver, tmp_path, name):
    """Every layer: the default schedule and three sampled programs (`-m slow`)."""
    check_under_qemu(driver, tmp_path, name, 3)


def test_a_dotprod_build_of_an_int8_model_folds_to_sdot_and_computes_the_same():
    """The int8 MobileNet blocks recipe loaded for a Cortex-A76: every folded layer keeps int8 x int8
    (mac_zero_point 0), the graph gives the same outputs as the x86 graph (numpy reference of each node),
    and the default schedules' kernels call sdot where an i8mm build calls usdot."""
    import dataclasses
    from pathlib import Path

    from aotc.build import load_model
    from aotc.graph.interpret import run_graph
    from aotc.graph.partition import extract_tasks, partition
    from aotc.recipe import load_recipe

    recipe = load_recipe(Path(__file__).parent.parent / "recipes" / "mobilenet_block_int8.yaml")
    a76 = load_model(dataclasses.replace(recipe, target=A76))
    x86 = load_model(dataclasses.replace(recipe, target=ZNVER4))
    folded = [n for n in a76.nodes if n.attrs.get("input_zero_point_in_bias")]
    assert {n.op for n in folded} == {"qnn.conv2d_nhwc", "qnn.depthwise_conv2d_nhwc", "qnn.dense"}
    assert all(n.attrs["mac_zero_point"] == 0 for n in folded)
    assert not any("mac_zero_point" in n.attrs for n in x86.nodes)
    rng = np.random.default_rng(0)
    feed = {v.name: rng.integers(-128, 128, v.type.shape).astype(v.type.dtype) for v in a76.inputs}
    got, want = run_graph(a76, feed), run_graph(x86, feed)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    target = parse_target(A76)
    calls = set()
    for task in extract_tasks(partition(a76)):
        ir = build_llvm_ir([lower(rewrite_layout(default_schedule(task.dag, target))[0], "k")], target)
        calls |= set(re.findall(r"call <4 x i32> @llvm\.aarch64\.neon\.(\w+)\.v4i32", ir))
    assert calls == {"sdot"}
