"""Integer Winograd F(4, 3) and F(2, 3) for int8 3x3 convs (docs/int8.md#integer-winograd): the int16 weight
transform exact, the conv's int32 sums bit-exact against the direct conv's numpy reference (uint8 and int8 inputs,
per-tensor and per-channel weights, nonzero zero points, the extreme values that bound the int16 ranges,
odd sizes and pads) for the default schedule and sampled programs built for znver3, whose int16 products
run on vpmaddwd; the graph pass takes exactly the convs whose sums it can prove exact."""

from __future__ import annotations

import numpy as np
import pytest

from aotc.codegen.llvm import build_llvm_ir, compile_to_assembly
from aotc.codegen.module import build_module, load_library
from aotc.codegen.stmtgen import stmt_exprs
from aotc.graph.ir import Graph, Node, TensorType, Value
from aotc.graph.passes import integer_winograd_convolutions
from aotc.ir.dot import (
    VNNI_WINOGRAD_MIN_TILES,
    IntegerWinogradRule,
    Operand,
    dot_forms,
    form_error,
    integer_winograd_rule,
)
from aotc.ir.expr import Load, Var, walk
from aotc.ir.stmt import walk_stmts
from aotc.schedule.default import default_schedule
from aotc.schedule.layout import apply_layouts, rewrite_layout
from aotc.schedule.lower import lower
from aotc.target import parse_target
from aotc.te.dag import ComputeDAG
from aotc.te.reference import evaluate
from aotc.te.tensor import LAYOUT_FREE, placeholder
from aotc.topi import winograd
from aotc.topi.registry import get_op

from .test_dot_products import TARGETS, layer_attrs, runs_here, sampled_states

ZNVER3 = "llvm -mcpu=znver3 -num-cores=1"


def attrs_for(k: int, zx: int, per_channel: bool, pads: tuple, mac_zero_point: int | None) -> dict:
    attrs = layer_attrs("qnn.conv2d_nhwc", (k, 3, 3, 1), zx, per_channel) | {"pads": pads}
    attrs["input_zero_point_in_bias"] = True
    if mac_zero_point is not None:
        attrs["mac_zero_point"] = mac_zero_point
    return attrs


def conv_dags(x_shape: tuple, k: int, x_dtype: str, attrs: dict, tile: int) -> tuple[ComputeDAG, ComputeDAG]:
    """(direct qnn.conv2d_nhwc, qnn.conv2d_winograd_nhwc) on the same input, weight and bias."""
    c = x_shape[3]

    def dag(op: str, w_shape: tuple, w_dtype: str, extra: dict) -> ComputeDAG:
        x = placeholder(x_shape, x_dtype, name="x")
        w = placeholder(w_shape, w_dtype, name="w", tag=LAYOUT_FREE)
        b = placeholder((k,), "int32", name="b", tag=LAYOUT_FREE)
        return ComputeDAG(get_op(op).compute([x, w, b], attrs | extra))

    a = tile + 2
    return (
        dag("qnn.conv2d_nhwc", (k, 3, 3, c), "int8", {"strides": (1, 1), "dilations": (1, 1)}),
        dag("qnn.conv2d_winograd_nhwc", (a, a, c, k), "int16", {"tile": tile}),
    )


def extreme_inputs(x_shape: tuple, k: int, x_dtype: str, seed: int) -> tuple[np.ndarray, ...]:
    """Input, OHWI weight and bias with a third of the bytes at their type's bounds."""
    rng = np.random.default_rng(seed)
    info = np.iinfo(x_dtype)
    x = rng.integers(int(info.min), int(info.max) + 1, x_shape)
    x = np.where(rng.random(x_shape) < 1 / 3, rng.choice([int(info.min), int(info.max)], x_shape), x)
    w_shape = (k, 3, 3, x_shape[3])
    w = rng.integers(-128, 128, w_shape)
    w = np.where(rng.random(w_shape) < 1 / 3, rng.choice([-128, 127], w_shape), w)
    b = rng.integers(-5000, 5000, (k,))
    return x.astype(x_dtype), w.astype(np.int8), b.astype(np.int32)


@pytest.mark.parametrize(
    "tile, scales, factor, largest", [(2, (1, 2, 2, 1), 4, 9), (4, (4, 6, 6, 24, 24, 1), 576, 49)]
)
def test_integer_weight_transform_scales_each_row_of_g_and_fits_int16(tile, scales, factor, largest):
    rng = np.random.default_rng(0)
    w = rng.integers(-128, 128, (8, 5, 3, 3)).astype(np.int8)
    w[0] = -128  # the largest transformed magnitude: (sum of a row of |DG|)^2 * 128
    u = winograd.transform_weight(w, tile)
    assert u.dtype == np.int16 and u.shape == (tile + 2, tile + 2, 5, 8)
    assert (
        tuple(winograd.integer_row_scales(tile)) == scales and winograd.integer_output_factor(tile) == factor
    )
    d = np.array(scales, np.float64)
    exact = (
        winograd.transform_weight(w.astype(np.float64), tile)
        * d[:, None, None, None]
        * d[None, :, None, None]
    )
    np.testing.assert_array_equal(u, np.round(exact).astype(np.int64))
    assert np.abs(u).max() == largest * 128


def test_integer_sum_limit_is_where_the_output_factor_still_fits_int32():
    assert winograd.integer_sum_limit(2) == 1 << 29  # 4 * sum
    assert winograd.integer_sum_limit(4) == 1 << 25  # 576 = 64 * 9: 64 * sum after the inverse of 9


CASES = {
    # (input shape, output channels, input dtype, input zero point, per-channel, pads, mac zero point)
    "uint8_per_channel": ((1, 6, 6, 16), 16, "uint8", 3, True, (1, 1, 1, 1), None),
    "int8_per_tensor_odd": ((1, 7, 5, 16), 24, "int8", -7, False, (1, 1, 1, 1), None),
    "uint8_unpadded": ((1, 9, 6, 32), 16, "uint8", 128, True, (0, 0, 0, 0), None),
    "int8_uneven_pads": ((2, 5, 8, 16), 16, "int8", 5, True, (1, 0, 2, 1), None),
    "uint8_minus_128": ((1, 6, 7, 16), 16, "uint8", 200, True, (1, 1, 1, 1), 128),  # sdot's x - 128
}


@pytest.mark.parametrize("tile", winograd.INTEGER_TILES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_integer_winograd_conv_equals_the_direct_conv_bit_for_bit(case, tile, tmp_path):
    """Extreme bytes everywhere: the channel sums reach about a third of F(4, 3)'s exact range (16
    channels of 128 * 255 * 9 = 4.7M of 33.5M), and every int16 transform its bound."""
    x_shape, k, x_dtype, zx, per_channel, pads, mzp = CASES[case]
    attrs = attrs_for(k, zx, per_channel, pads, mzp)
    direct, wino = conv_dags(x_shape, k, x_dtype, attrs, tile)
    x, w, b = extreme_inputs(x_shape, k, x_dtype, seed=sorted(CASES).index(case))
    u = winograd.transform_weight(np.ascontiguousarray(w.transpose(0, 3, 1, 2)), tile)
    (expected,) = evaluate(direct, {"x": x, "w": w, "b": b})
    (reference,) = evaluate(wino, {"x": x, "w": u, "b": b})
    np.testing.assert_array_equal(reference, expected, err_msg="numpy evaluator")
    target = parse_target(ZNVER3)
    states = [default_schedule(wino, target), *sampled_states(wino, target, 2, seed=tile)]
    for i, state in enumerate(states):
        rewritten, layouts = rewrite_layout(state)
        func = lower(rewritten, f"k{i}")
        asm = compile_to_assembly(build_llvm_ir([func], target), target)
        assert "\tvpmaddwd\t" in asm and "\tvpmaddubsw\t" not in asm, f"program {i}"
        if not runs_here(target):
            continue
        library = load_library(build_module([func], target, str(tmp_path / f"k{i}.so")))
        got = np.zeros(expected.shape, expected.dtype)
        library.kernel(f"k{i}")(*apply_layouts([x, u, b], layouts), got)
        np.testing.assert_array_equal(got, expected, err_msg=f"{case}, F({tile}, 3): program {i}")


def test_int16_factors_take_only_vpmaddwd():
    word = Operand(Var("v", "int16"), False)
    for name, text in TARGETS.items():
        for form in dot_forms(parse_target(text)):
            error = form_error(word, word, form, form.lanes, form.depth, "")
            assert (error is None) == (form.name == "maddwd"), f"{name} {form.name}: {error}"


@pytest.mark.parametrize(
    "target, rule",
    [
        # AVX2: 16 products per multiply instruction either way, so every conv gains
        ("llvm -mcpu=znver3", IntegerWinogradRule((4, 2))),
        ("llvm -mcpu=znver4 -mattr=-avx512vnni", IntegerWinogradRule((4, 2))),  # AVX-512BW, no vpdpbusd
        # vpdpbusd does twice vpmaddwd's products: F(4, 3) on large images only
        ("llvm -mcpu=znver4", IntegerWinogradRule((4,), VNNI_WINOGRAD_MIN_TILES)),
        ("llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n2", None),  # no int16 dot form
    ],
)
def test_integer_winograd_rule_follows_the_products_per_instruction(target, rule):
    assert integer_winograd_rule(dot_forms(parse_target(target))) == rule
    if rule is not None:
        assert set(rule.tiles) <= set(winograd.INTEGER_TILES)


def conv_node(weight: np.ndarray, x_dtype: str = "uint8", size: int = 8, batch: int = 1, **attrs) -> Node:
    k, _, _, c = weight.shape
    x = Value("x", TensorType((batch, size, size, c), x_dtype))
    w = Value("w", TensorType(weight.shape, str(weight.dtype)), data=weight)
    b = Value("b", TensorType((k,), "int32"), data=np.zeros(k, np.int32))
    y = Value("y", TensorType((batch, size, size, k), x_dtype))
    base = {
        "strides": (1, 1),
        "dilations": (1, 1),
        "pads": (1, 1, 1, 1),
        "input_scale": 0.1,
        "input_zero_point": 0,
        "weight_scales": (0.01,),
        "weight_zero_points": (0,),
        "output_scale": 0.2,
        "output_zero_point": 0,
        "out_dtype": x_dtype,
        "input_zero_point_in_bias": True,
    }
    node = Node("qnn.conv2d_nhwc", [x, w, b], [y], base | attrs)
    y.producer = node
    return node


def test_graph_pass_takes_the_largest_tile_it_can_prove_exact():
    rng = np.random.default_rng(2)
    w = rng.integers(-128, 128, (16, 3, 3, 16)).astype(np.int8)
    # 255 * sum|w| of an output channel of -128s: F(4, 3) below 2^25 up to 114 channels, F(2, 3) below
    # 2^29 up to 1827
    full = np.full((16, 3, 3, 1832), -128, np.int8)
    nodes = {
        "fits": conv_node(w),
        "stride_2": conv_node(w, strides=(2, 2)),
        "weight_zero_point": conv_node(w, weight_zero_points=(3,)),
        "few_channels": conv_node(w[:, :, :, :8]),
        "f4_just_fits": conv_node(full[:, :, :, :114]),
        "f2_only": conv_node(full[:, :, :, :115]),
        "f2_just_fits": conv_node(full[:, :, :, :1827]),
        "sums_past_both": conv_node(full[:, :, :, :1828]),
    }
    graph = Graph([], [], list(nodes.values()))
    integer_winograd_convolutions(graph, IntegerWinogradRule((4, 2)))
    tiles = {
        name: node.attrs["tile"] for name, node in nodes.items() if node.op == "qnn.conv2d_winograd_nhwc"
    }
    assert tiles == {"fits": 4, "f4_just_fits": 4, "f2_only": 2, "f2_just_fits": 2}
    node = nodes["fits"]
    assert node.inputs[1].type == TensorType((6, 6, 16, 16), "int16") and "strides" not in node.attrs
    np.testing.assert_array_equal(node.inputs[1].data, winograd.transform_weight(w.transpose(0, 3, 1, 2), 4))


def test_on_vnni_only_large_images_take_f43():
    """With VNNI the rule has F(4, 3) alone on at least 49 tiles an image: 56x56, 28x28 and 25x25 (49
    tiles) run as Winograd; 24x24 (36 tiles), 14x14 (16) also in a batch of 4, and a conv whose sums only
    F(2, 3) holds stay direct."""
    rng = np.random.default_rng(3)
    w = rng.integers(-64, 64, (16, 3, 3, 16)).astype(np.int8)
    full = np.full((16, 3, 3, 115), -128, np.int8)
    nodes = {
        "56x56": conv_node(w, size=56),
        "28x28": conv_node(w, size=28),
        "25x25": conv_node(w, size=25),
        "24x24": conv_node(w, size=24),
        "14x14": conv_node(w, size=14),
        "4x14x14": conv_node(w, size=14, batch=4),
        "f2_only": conv_node(full, size=56),
    }
    graph = Graph([], [], list(nodes.values()))
    integer_winograd_convolutions(graph, integer_winograd_rule(dot_forms(parse_target("llvm -mcpu=znver4"))))
    tiles = {
        name: node.attrs["tile"] for name, node in nodes.items() if node.op == "qnn.conv2d_winograd_nhwc"
    }
    assert tiles == {"56x56": 4, "28x28": 4, "25x25": 4}


def test_lowering_converts_each_transform_read_once():
    """The transforms' rows share their reads (`winograd._transform`), and replaying, re-laying out and
    lowering keep them shared: each transform reads its a = 6 values through six Load nodes, however
    many rows of B^T or A^T use them. The first reads the input `x` itself: the default schedule inlines
    its pad there (`_pad_into_copy`), a select on each shared read."""
    _, wino = conv_dags((1, 6, 6, 4), 4, "uint8", attrs_for(4, 3, False, (1, 1, 1, 1), None), 4)
    rewritten, _ = rewrite_layout(default_schedule(wino, parse_target(ZNVER3)))
    func = lower(rewritten, "k")
    uses: dict[str, int] = {}
    nodes: dict[str, set[int]] = {}
    for s in walk_stmts(func.body):
        for root in stmt_exprs(s):
            for e in walk(root):
                if isinstance(e, Load) and (
                    e.buffer.name == "x" or e.buffer.name.endswith(("_rows", "_gemm", "_cols"))
                ):
                    uses[e.buffer.name] = uses.get(e.buffer.name, 0) + 1
                    nodes.setdefault(e.buffer.name, set()).add(id(e))
    assert len(nodes) == 4 and all(len(ids) == 6 for ids in nodes.values()), nodes
    assert all(n > 6 for n in uses.values()), uses
