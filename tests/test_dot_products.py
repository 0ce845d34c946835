"""int8 dot-product micro-kernels (docs/int8.md): each form (vpdpbusd, vpmaddwd, the plain widening code)
bit-exact against the numpy reference evaluator on int8/uint8 convs and dense layers with per-tensor and
per-channel weights and nonzero zero points; the instruction in the assembly of the CPUs that have it
(compile-only where this machine lacks the CPU's features); the search space and its legality checks."""

from __future__ import annotations

import random
import re
from dataclasses import replace

import numpy as np
import pytest

import aotc.te.tensor as te
from aotc.codegen.irbuilder import CodegenError
from aotc.codegen.llvm import build_llvm_ir, compile_to_assembly
from aotc.codegen.module import build_module, load_library
from aotc.ir.dot import dot_forms
from aotc.ir.stmt import For, ForKind, walk_stmts
from aotc.schedule.default import default_schedule
from aotc.schedule.layout import apply_layouts, rewrite_layout
from aotc.schedule.lower import lower
from aotc.schedule.state import Annotation
from aotc.schedule.steps import SplitStep, replay
from aotc.search.annotation import sample_state
from aotc.search.lowering import loop_error, lowered
from aotc.search.params import SearchParams
from aotc.search.sketch import SearchContext, generate_sketches
from aotc.target import cpu_features, host_target, parse_target
from aotc.te.dag import ComputeDAG
from aotc.te.reference import evaluate
from aotc.te.tensor import LAYOUT_FREE, NARROW_WEIGHTS, placeholder
from aotc.topi.registry import get_op

ZNVER4 = "llvm -mcpu=znver4 -num-cores=1"
TARGETS = {
    "vnni": ZNVER4,  # vpdpbusd: 4 products per lane, 16 and 8 lanes
    "avx512bw": "llvm -mcpu=znver4 -mattr=-avx512vnni -num-cores=1",  # vpmaddwd on zmm and ymm
    "avx2": "llvm -mcpu=znver3 -num-cores=1",  # vpmaddwd on ymm
    "i8mm": "llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n2 -num-cores=1",  # usdot on 4 NEON lanes
}
INSTRUCTION = {"vnni": "vpdpbusd", "avx512bw": "vpmaddwd", "avx2": "vpmaddwd", "i8mm": "usdot"}
# LLVM may pick usdot's by-element twin: sudot (signed x unsigned) reading the broadcast bytes in place
MNEMONICS = {"i8mm": ("usdot", "sudot")}


def uses_instruction(asm: str, form: str) -> bool:
    return any(f"\t{m}\t" in asm for m in MNEMONICS.get(form, (INSTRUCTION[form],)))


DEPTH = {"vnni": 4, "avx512bw": 2, "avx2": 4, "i8mm": 4}
# AVX2's 4-deep vpmaddwd (maddwd4) reads broadcast input bytes in place; a depthwise conv's gathered taps
# are widened for the 2-deep one
DEPTHWISE_DEPTH = {"avx2": 2}
PLAIN = "llvm -mcpu=znver4 -num-cores=1"  # with SearchParams(dot_products=False): the widening code


def layer_attrs(op: str, w_shape: tuple, zx: int, per_channel: bool) -> dict:
    """The attributes of a test layer: per-channel or per-tensor weight scales, RELU6, int8 out; a conv's 3x3
    window padded by 1, a depthwise conv's rows of `w_shape[2]` taps padded to keep the size."""
    depthwise = op == "qnn.depthwise_conv2d_nhwc"
    out_c = w_shape[3] if depthwise else w_shape[0]
    attrs = {
        "input_scale": 0.02,
        "input_zero_point": zx,
        "output_scale": 0.1,
        "output_zero_point": -5,
        "weight_scales": tuple(0.001 * (1 + c % 7) for c in range(out_c)) if per_channel else (0.003,),
        "weight_zero_points": (0,),
        "activation": "RELU6",
        "out_dtype": "int8",
    }
    if op == "qnn.conv2d_nhwc":
        attrs |= {"strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1)}
    if depthwise:
        attrs |= {"strides": (1, 1), "pads": (1, 1, 1, w_shape[2] - 2), "dilations": (1, 1)}
    return attrs


def quantized_dag(
    op: str,
    x_shape: tuple,
    w_shape: tuple,
    x_dtype: str,
    zx: int,
    per_channel: bool,
    folded: bool = True,
    narrow: bool = False,
) -> ComputeDAG:
    """A qnn conv (3x3, pad 1), depthwise conv (3 rows of `w_shape[2]` taps, padded on the right as
    pad_depthwise_taps leaves a 3x3 window) or dense layer with a constant (layout-free) weight and bias,
    its input zero point folded into the bias as the graph pass leaves it (`folded`); `narrow`: marked as
    the graph marks weights within +-64 (NARROW_WEIGHTS)."""
    out_c = w_shape[3] if op == "qnn.depthwise_conv2d_nhwc" else w_shape[0]
    attrs = layer_attrs(op, w_shape, zx, per_channel) | {"input_zero_point_in_bias": folded}
    if narrow:
        attrs[NARROW_WEIGHTS] = True
    x = placeholder(x_shape, x_dtype, name="x")
    w = placeholder(w_shape, "int8", name="w", tag=LAYOUT_FREE)
    b = placeholder((out_c,), "int32", name="b", tag=LAYOUT_FREE)
    return ComputeDAG(get_op(op).compute([x, w, b], attrs))


CASES = {
    "conv_int8_per_channel": ("qnn.conv2d_nhwc", (1, 6, 5, 32), (32, 3, 3, 32), "int8", 3, True),
    "conv_uint8_per_tensor": ("qnn.conv2d_nhwc", (1, 5, 6, 16), (48, 3, 3, 16), "uint8", 100, False),
    "dense_int8": ("qnn.dense", (3, 64), (32, 64), "int8", -7, True),
    "depthwise_int8_taps": ("qnn.depthwise_conv2d_nhwc", (1, 6, 7, 32), (1, 3, 4, 32), "int8", 3, True),
}


def lane_extent(case: str) -> int:
    """The output channels: what the dot product's lanes split."""
    op, _, w_shape = CASES[case][:3]
    return w_shape[3] if op == "qnn.depthwise_conv2d_nhwc" else w_shape[0]


def feed_for(dag: ComputeDAG, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs; a NARROW_WEIGHTS layer's weight within +-64, a third of it at the bound and a third of
    its input at the type's extremes (the largest pair sums vpmaddubsw can meet)."""
    rng = np.random.default_rng(seed)
    narrow = any(op.attrs.get(NARROW_WEIGHTS) for op in dag.compute_ops)
    out = {}
    for p in dag.placeholders:
        if p.dtype == "int32":
            out[p.name] = rng.integers(-5000, 5000, p.shape).astype(np.int32)
            continue
        info = np.iinfo(p.dtype)
        low, high = (-64, 64) if narrow and p.name == "w" else (int(info.min), int(info.max))
        values = rng.integers(low, high + 1, p.shape)
        if narrow:
            extremes = rng.choice([low, high], p.shape)
            values = np.where(rng.random(p.shape) < 1 / 3, extremes, values)
        out[p.name] = values.astype(p.dtype)
    return out


def runs_here(target) -> bool:
    return set(cpu_features(target)) <= set(cpu_features(host_target()))


def tensorized(func) -> list[For]:
    return [s for s in walk_stmts(func.body) if isinstance(s, For) and s.kind == ForKind.TENSORIZED]


def sampled_states(dag: ComputeDAG, target, n: int, seed: int = 0, params: SearchParams | None = None):
    """`n` valid sampled programs with a tensorized loop (all valid ones without `params.dot_products`)."""
    params = params or SearchParams()
    ctx = SearchContext(dag, target, params)
    sketches = generate_sketches(dag, target, params)
    rng = random.Random(seed)
    out = []
    for _ in range(400):
        s = sample_state(ctx, sketches[rng.randrange(len(sketches))], rng)
        func = None if s is None else lowered(s)
        if func is not None and (bool(tensorized(func)) == params.dot_products):
            out.append(s)
            if len(out) == n:
                break
    assert len(out) == n, f"only {len(out)} of {n} samples"
    return out


def check_exact(dag: ComputeDAG, state, target, tmp_path, name: str) -> str:
    """Build `state` with its weights laid out; run and compare bit for bit where it runs here.
    Returns the kernel's assembly."""
    rewritten, layouts = rewrite_layout(state)
    func = lower(rewritten, name)
    asm = compile_to_assembly(build_llvm_ir([func], target), target)
    if not runs_here(target):
        return asm
    feed = feed_for(dag)
    (expected,) = evaluate(dag, feed)
    library = load_library(build_module([func], target, str(tmp_path / f"{name}.so")))
    got = np.zeros(expected.shape, expected.dtype)
    library.kernel(name)(*apply_layouts([feed[p.name] for p in dag.placeholders], layouts), got)
    np.testing.assert_array_equal(got, expected, err_msg=f"{name} on {target}")
    return asm


@pytest.mark.parametrize("form", sorted(TARGETS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_sampled_dot_product_programs_are_exact_and_use_the_instruction(form, case, tmp_path):
    target = parse_target(TARGETS[form])
    dag = quantized_dag(*CASES[case])
    for i, state in enumerate(sampled_states(dag, target, 3, seed=sorted(CASES).index(case))):
        asm = check_exact(dag, state, target, tmp_path, f"k{i}")
        assert uses_instruction(asm, form), f"{case} sample {i}: no {INSTRUCTION[form]} for {target}"


@pytest.mark.parametrize("form", sorted(TARGETS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_default_schedule_uses_the_widest_dot_product(form, case, tmp_path):
    target = parse_target(TARGETS[form])
    dag = quantized_dag(*CASES[case])
    state = default_schedule(dag, target)
    func = lower(state)
    (loop,) = tensorized(func)
    widest = max(f.lanes for f in dot_forms(target) if lane_extent(case) % f.lanes == 0)
    depthwise = CASES[case][0] == "qnn.depthwise_conv2d_nhwc"
    assert loop.max_extent == (DEPTHWISE_DEPTH.get(form, DEPTH[form]) if depthwise else DEPTH[form])
    vector = [s for s in walk_stmts(func.body) if isinstance(s, For) and s.body is loop]
    assert vector and vector[0].kind == ForKind.VECTORIZED and vector[0].max_extent == widest
    asm = check_exact(dag, state, target, tmp_path, "k")
    assert uses_instruction(asm, form)


@pytest.mark.parametrize("form", sorted(TARGETS))
def test_a_batch_one_dense_sums_into_several_vectors_and_copies_them_out_one_at_a_time(form, tmp_path):
    """A classifier at batch 1 has no pixels to block: its default block takes several vectors of outputs
    (independent sums; one vector waited on each dot product before), and its copy-out requantizes one
    vector of the micro-kernel's lanes at a time (5 vectors of 8 lanes as one 40-lane loop were spilled lane
    by lane). Bit for bit against the reference."""
    target = parse_target(TARGETS[form])
    dag = quantized_dag("qnn.dense", (1, 256), (40, 256), "int8", -7, True)
    func = lower(default_schedule(dag, target))
    (loop,) = tensorized(func)
    (vector,) = [s for s in walk_stmts(func.body) if isinstance(s, For) and s.body is loop]
    lanes = vector.max_extent
    blocks = [s for s in walk_stmts(func.body) if isinstance(s, For) and s.body is vector]
    # the loop right around the vector loop runs over vectors of outputs (ax1, the dense's output axis)
    assert blocks and blocks[0].var.name.startswith("ax1.") and blocks[0].max_extent > 1, blocks
    output = func.params[-1]
    copies = [
        s
        for s in walk_stmts(func.body)
        if isinstance(s, For) and s.kind == ForKind.VECTORIZED and getattr(s.body, "buffer", None) == output
    ]
    assert copies and all(s.max_extent == lanes for s in copies), [s.max_extent for s in copies]
    check_exact(dag, default_schedule(dag, target), target, tmp_path, "k")


@pytest.mark.parametrize("case", sorted(CASES))
def test_plain_widening_programs_stay_exact(case, tmp_path):
    """dot_products off: the search's programs widen each product (no dot-product instruction)."""
    target = parse_target(PLAIN)
    dag = quantized_dag(*CASES[case])
    for i, state in enumerate(sampled_states(dag, target, 2, params=SearchParams(dot_products=False))):
        asm = check_exact(dag, state, target, tmp_path, f"p{i}")
        assert "vpdpbusd" not in asm


def test_int8_input_at_zero_point_minus_128_needs_no_fold(tmp_path):
    """zx = -128: the multiply-accumulate reads x + 128 directly, nothing folded into the bias."""
    target = parse_target(PLAIN)
    dag = quantized_dag("qnn.conv2d_nhwc", (1, 4, 4, 16), (16, 3, 3, 16), "int8", -128, True, folded=False)
    state = default_schedule(dag, target)
    assert tensorized(lower(state))
    check_exact(dag, state, target, tmp_path, "z")


AVX2 = "llvm -mcpu=znver3 -num-cores=1"


@pytest.mark.parametrize("case", sorted(CASES))
def test_narrow_weights_run_on_maddubs_exactly(case, tmp_path):
    """Weights within +-64 (the graph's NARROW_WEIGHTS): AVX2 sums 4 products per lane with vpmaddubsw and
    vpmaddwd by ones, bit-exact at the largest pair sums (255 * 64 * 2), in the default schedule and in
    sampled ones."""
    target = parse_target(AVX2)
    dag = quantized_dag(*CASES[case], narrow=True)
    state = default_schedule(dag, target)
    (loop,) = tensorized(lower(state))
    assert loop.max_extent == 4 and loop.narrow
    states = [state, *sampled_states(dag, target, 2, seed=sorted(CASES).index(case))]
    for i, s in enumerate(states):
        asm = check_exact(dag, s, target, tmp_path, f"n{i}")
        assert "\tvpmaddubsw\t" in asm, f"{case} program {i}: no vpmaddubsw"


def test_maddubs_is_refused_without_narrow_weights(tmp_path):
    """A program of a narrow layer replayed on the same layer unmarked runs its 4 products per lane on
    vpmaddwd's halves (maddwd4), exactly at full-range weights, never on vpmaddubsw."""
    target = parse_target(AVX2)
    for name in ("conv_int8_per_channel", "depthwise_int8_taps"):
        case = CASES[name]
        narrow_state = default_schedule(quantized_dag(*case, narrow=True), target)
        plain = quantized_dag(*case)
        replayed = replay(plain, narrow_state.steps)
        assert loop_error(lower(replayed), target) is None
        asm = check_exact(plain, replayed, target, tmp_path, name)
        assert "\tvpmaddwd\t" in asm and "vpmaddubsw" not in asm


def test_maddwd4_sign_extends_signed_factors(tmp_path):
    """Two signed byte factors (no x + 128): maddwd4's even bytes shifted up and arithmetically back, exact
    at the int8 extremes (a matmul of an int8 activation and an int8 weight, 4 products a lane)."""
    target = parse_target(AVX2)
    x = placeholder((5, 64), "int8", name="x")
    w = placeholder((16, 64), "int8", name="w", tag=LAYOUT_FREE)
    k = te.reduce_axis(64, "k")
    out = te.compute(
        (5, 16), lambda i, j: te.sum(x[i, k.var].astype("int32") * w[j, k.var].astype("int32"), k), "mm"
    )
    dag = ComputeDAG([out])
    state = default_schedule(dag, target)
    (loop,) = tensorized(lower(state))
    assert loop.max_extent == 4
    asm = check_exact(dag, state, target, tmp_path, "s")
    assert "\tvpsraw\t" in asm and "\tvpmaddwd\t" in asm


def test_dot_forms_follow_the_cpu_features():
    def forms(text: str) -> set[tuple[str, int, int]]:
        return {(f.name, f.lanes, f.depth) for f in dot_forms(parse_target(text))}

    avx2 = {("maddwd4", 8, 4), ("maddwd", 8, 2)}  # where vnni's 8 lanes exist, they go first
    assert forms(ZNVER4) == {("vnni", 16, 4), ("vnni", 8, 4), ("maddwd", 16, 2), *avx2}
    assert forms("llvm -mcpu=znver3") == {("maddubs", 8, 4), *avx2}
    # vpmaddwd on zmm does as many products per instruction as vpmaddubsw on ymm: no narrow-only form
    assert forms("llvm -mcpu=skylake-avx512") == {("maddwd", 16, 2), *avx2}
    assert forms("llvm -mcpu=sierraforest") >= {("vnni", 8, 4)}  # AVX-VNNI without AVX-512
    assert forms("llvm -mtriple=aarch64-linux-gnu") == set()
    # usdot needs FEAT_I8MM; sdot/udot need FEAT_DotProd only (a Cortex-A76), tests/test_arm_dot.py
    assert forms("llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n2") == {
        ("usdot", 4, 4),
        ("sdot", 4, 4),
        ("udot", 4, 4),
    }
    assert forms("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a76") == {("sdot", 4, 4), ("udot", 4, 4)}
    assert forms("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72") == set()


def test_sketches_offer_a_dot_product_variant_only_where_it_fits():
    target = parse_target(ZNVER4)

    def n_dot(dag: ComputeDAG, params: SearchParams | None = None) -> int:
        sketches = generate_sketches(dag, target, params)
        return sum(
            any(it.annotation == Annotation.TENSORIZE for st in s.stages for it in st.iters) for s in sketches
        )

    conv = quantized_dag(*CASES["conv_int8_per_channel"])
    assert n_dot(conv) > 0
    # the conv's stage takes a form, so every sketch tiles it for one (the plain tiling never won)
    assert n_dot(conv) == len(generate_sketches(conv, target))
    assert n_dot(conv, SearchParams(dot_products=False)) == 0 < len(generate_sketches(conv, target))
    # 3 input channels do not split into groups of 4 (or 2), nor does a depthwise window row of 3 taps
    # (pad_depthwise_taps makes it 4)
    assert n_dot(quantized_dag("qnn.conv2d_nhwc", (1, 8, 8, 3), (16, 3, 3, 3), "int8", 3, True)) == 0
    assert n_dot(quantized_dag("qnn.conv2d_nhwc", (1, 8, 8, 16), (18, 3, 3, 16), "int8", 3, True)) == 0
    x = placeholder((1, 8, 8, 16), "int8", name="x")
    w = placeholder((1, 3, 3, 16), "int8", name="w", tag=LAYOUT_FREE)
    attrs = {"strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1), "input_scale": 0.02}
    attrs |= {"input_zero_point": 3, "weight_scales": (0.01,), "output_scale": 0.1, "output_zero_point": 0}
    depthwise = ComputeDAG(get_op("qnn.depthwise_conv2d_nhwc").compute([x, w], attrs))
    assert n_dot(depthwise) == 0
    assert n_dot(quantized_dag(*CASES["depthwise_int8_taps"])) > 0


def test_sampling_keeps_the_forms_lengths_and_a_broken_form_is_invalid():
    """fill_tile_sizes samples around the fixed vector and depth lengths; a program whose vector no longer
    matches a form (a mutated tile size) is rejected before it is ever built."""
    target = parse_target(ZNVER4)
    dag = quantized_dag(*CASES["conv_int8_per_channel"])
    for state in sampled_states(dag, target, 4, seed=3):
        func = lowered(state)
        (loop,) = tensorized(func)
        assert loop.max_extent == 4
        from aotc.schedule.steps import replay

        dot_stage = next(
            k
            for k, st in enumerate(state.stages)
            if any(it.annotation == Annotation.TENSORIZE for it in st.iters)
        )
        errors = []
        for i, split in enumerate(state.steps):  # one of them splits the lane axis: its vector now 4 lanes
            if isinstance(split, SplitStep) and split.stage_id == dot_stage and split.lengths[-1] in (8, 16):
                steps = list(state.steps)
                steps[i] = replace(split, lengths=(*split.lengths[:-1], 4))
                errors.append(loop_error(lower(replay(state.dag, steps)), target) or "")
        assert any("no dot-product instruction for 4 lanes" in err for err in errors), errors


def test_codegen_refuses_a_tensorized_loop_outside_a_vector_loop():
    target = parse_target(ZNVER4)
    dag = quantized_dag(*CASES["dense_int8"])
    func = lower(default_schedule(dag, target), "k")
    (loop,) = tensorized(func)
    broken = replace(func, body=_unvectorized(func.body, loop))
    assert "not the body of a vectorized loop" in loop_error(broken, target)
    with pytest.raises(CodegenError, match="not inside a vectorized loop"):
        build_llvm_ir([broken], target)


def _unvectorized(s, loop: For):
    """`s` with the vectorized loop around `loop` made serial."""
    if isinstance(s, For):
        kind = ForKind.SERIAL if s.body is loop else s.kind
        return replace(s, kind=kind, body=_unvectorized(s.body, loop))
    if hasattr(s, "stmts"):
        return replace(s, stmts=tuple(_unvectorized(c, loop) for c in s.stmts))
    for name in ("body", "then_case"):
        if getattr(s, name, None) is not None:
            s = replace(s, **{name: _unvectorized(getattr(s, name), loop)})
    return s


def test_ir_shows_one_dot_product_call_per_vector_of_products():
    target = parse_target(ZNVER4)
    dag = quantized_dag(*CASES["conv_int8_per_channel"])
    ir = build_llvm_ir([lower(rewrite_layout(default_schedule(dag, target))[0], "k")], target)
    calls = re.findall(r"call <(\d+) x i32> @llvm\.x86\.avx512\.vpdpbusd\.(\d+)", ir)
    assert calls and all(int(lanes) * 32 == int(bits) for lanes, bits in calls)


def test_dot_product_stages_take_small_unroll_budgets_only():
    """A dot-product stage's register block is unrolled already: sampling and mutation keep its
    auto_unroll_max_step within `dot_unroll_steps` (512 gave 3-5 MB of IR, 7-40 s compiles); a plain
    stage of the same task still draws from all of `unroll_steps`."""
    from aotc.schedule.steps import PragmaStep
    from aotc.search.evolution import mutate_auto_unroll

    dag = quantized_dag(*CASES["conv_int8_per_channel"])
    params = SearchParams()
    ctx = SearchContext(dag, parse_target(ZNVER4), params)
    rng = random.Random(0)

    def budgets(state) -> list[tuple[bool, int]]:
        out = []
        for step in state.steps:
            if isinstance(step, PragmaStep) and step.pragma.startswith("auto_unroll_max_step$"):
                dot = any(it.annotation == Annotation.TENSORIZE for it in state.stages[step.stage_id].iters)
                out.append((dot, int(step.pragma.split("$")[1])))
        return out

    seen = []
    for s in sampled_states(dag, parse_target(ZNVER4), 12, params=params):
        seen += budgets(s)
        for _ in range(8):
            m = mutate_auto_unroll(s, rng, ctx)
            seen += budgets(m) if m is not None else []
    assert any(dot for dot, _ in seen)
    assert all(n in params.dot_unroll_steps for dot, n in seen if dot)
    assert max(n for dot, n in seen if dot) < max(params.unroll_steps)


def test_a_weight_block_that_several_chunks_read_is_fetched_while_the_block_before_runs(tmp_path):
    """A 7x7 conv's parallel loop walks weight blocks outermost, 7 chunks (columns) a block: each packed
    weight load also prefetches the same bytes one block further on. A 28x28 conv, whose blocks are the
    inner tiles and stay in cache, gets none. Either way the outputs stay exact."""
    target = parse_target("llvm -mcpu=znver4 -num-cores=2")
    dag = quantized_dag("qnn.conv2d_nhwc", (1, 7, 7, 64), (128, 3, 3, 64), "uint8", 100, True)
    state = default_schedule(dag, target)
    rewritten, _ = rewrite_layout(state)
    (w,) = [b for b in lower(rewritten, "k").params if b.name == "w"]
    block = int(np.prod([int(d) for d in w.shape[1:]]))  # int8: one byte an element
    ir = build_llvm_ir([lower(rewritten, "k")], target)
    ahead = re.findall(r"getelementptr i8, ptr %\S+, i64 (\d+)\n\s*call void @llvm\.prefetch\.p0", ir)
    assert ahead and {int(a) for a in ahead} == {block}
    check_exact(dag, state, target, tmp_path, "conv7x7")

    wide = quantized_dag("qnn.conv2d_nhwc", (1, 28, 28, 32), (64, 3, 3, 32), "uint8", 100, True)
    assert "llvm.prefetch" not in build_llvm_ir(
        [lower(rewrite_layout(default_schedule(wide, target))[0], "k")], target
    )


@pytest.mark.parametrize(("channels", "fetched"), [(128, True), (256, False)])
def test_a_float_weight_block_is_fetched_ahead_while_two_blocks_fit_in_l2(channels, fetched):
    """Float convs' weight vectors take the same prefetch, one per cache line they cover, where a block is
    at most PREFETCH_MAX_BLOCK_BYTES: a 7x7 conv's 32 output channels over 128 input channels (147 KB) yes,
    over 256 (295 KB) no, since the block fetched ahead would evict the one its chunks still read."""
    from aotc.codegen.exprgen import PREFETCH_MAX_BLOCK_BYTES
    from aotc.topi.nhwc import conv2d_nhwc

    target = parse_target("llvm -mcpu=znver4 -num-cores=2")
    data = placeholder((1, 7, 7, channels), "float32", name="data")
    weight = placeholder((channels, 3, 3, channels), "float32", name="weight", tag=LAYOUT_FREE)
    dag = ComputeDAG([conv2d_nhwc(data, weight, ((1, 1), (1, 1, 1, 1), (1, 1)))])
    func = lower(rewrite_layout(default_schedule(dag, target))[0], "k")
    (w,) = [b for b in func.params if b.name == "weight"]
    block = 4 * int(np.prod([int(d) for d in w.shape[1:]]))
    assert (block <= PREFETCH_MAX_BLOCK_BYTES) == fetched
    ahead = re.findall(
        r"getelementptr i8, ptr %\S+, i64 (\d+)\n\s*call void @llvm\.prefetch\.p0",
        build_llvm_ir([func], target),
    )
    assert {int(a) for a in ahead} == ({block, block + 64} if fetched else set())
