"""Sketch rules (docs/search.md#sketch-rules): each rule's condition, and the sketches the rules imply."""

from dataclasses import replace

from aotc import te
from aotc.schedule.state import State
from aotc.search.sketch import (
    CPU_RULES,
    AddCacheWrite,
    AddRfactor,
    AlwaysInline,
    Condition,
    MultiLevelTiling,
    MultiLevelTilingWithFusion,
    SearchContext,
    SkipStage,
    derive_sketches,
    generate_sketches,
    is_complete,
)
from aotc.target import host_target
from aotc.topi import nn
from aotc.topi.workloads import make_workload

TARGET = replace(host_target(), num_cores=4, hw=None)


def matmul(m, k, n):
    return make_workload("matmul", [m, n, k])


def conv_bias_relu():
    return make_workload("conv2d_relu", [1, 16, 14, 14, 32, 3, 1, 1])


def softmax():
    return make_workload("softmax", [8, 1000])


def reduction():
    return te.ComputeDAG([nn.reduce(te.placeholder((4, 110, 60), name="x"), "sum", [0, 2])])


def tags(state):
    return [s.tag for s in state.steps]


def records(state):
    return [s.to_record() for s in state.steps]


def names(state):
    return [st.name for st in state.stages]


def _is_multi_level_tiled(state, name, n_spatial, n_reduce):
    """SSRSRS: every spatial axis split in 4, every reduce axis in 2, then one reorder."""
    sid = state.stage_id(name)
    splits = [s for s in state.steps if s.tag == "SP" and s.stage_id == sid]
    assert [len(s.lengths) for s in splits] == [3] * n_spatial + [1] * n_reduce
    assert all(v is None for s in splits for v in s.lengths)
    kinds = [it.kind.name[0] for it in state.stages[sid].iters]
    per = "S" * n_spatial
    red = "R" * n_reduce
    assert "".join(kinds) == per + per + red + per + red + per
    return splits


def test_every_sketch_is_a_template():
    for dag in (matmul(64, 64, 64), conv_bias_relu(), softmax(), reduction()):
        for s in generate_sketches(dag, TARGET):
            splits = [st for st in s.steps if st.tag == "SP"]
            assert all(v is None for st in splits for v in st.lengths)
            assert not is_complete(s) or not splits


def test_large_matmul_gets_tiling_and_two_cache_write_fusion_sketches():
    sketches = generate_sketches(matmul(512, 512, 512), TARGET)
    assert [tags(s) for s in sketches] == [
        ["SP", "SP", "SP", "RE"],
        ["CHW", "SP", "SP", "SP", "RE", "FSP", "FSP", "RE", "CA"],
        ["CHW", "SP", "SP", "SP", "RE", "FSP", "FSP", "RE", "CA"],
    ]
    _is_multi_level_tiled(sketches[0], "matmul", 2, 1)
    for level, s in zip((1, 2), sketches[1:]):
        assert names(s) == ["A", "B", "matmul.local", "matmul"]
        _is_multi_level_tiled(s, "matmul.local", 2, 1)
        assert {f.n_split for f in s.steps if f.tag == "FSP"} == {level}
        local = s.stages[2]
        assert local.attach is not None and local.attach[0] == 3
        out = s.stages[3]
        assert out.iters[out.position(local.attach[1])].name == f"ax1.{level - 1}"


def test_small_spatial_large_reduce_matmul_adds_two_rfactor_sketches():
    sketches = generate_sketches(matmul(1, 4096, 4), TARGET)
    assert len(sketches) == 5
    outer, inner = sketches[:2]
    assert records(outer) == [["SP", 2, 2, 4096, [None], 1], ["RF", 2, 2, 2]]
    assert records(inner) == [["SP", 2, 2, 4096, [None], 1], ["RF", 2, 3, 2], ["RE", 2, [0, 1, 3, 2]]]
    for s in (outer, inner):
        assert names(s) == ["A", "B", "matmul.rf", "matmul"]
        assert not is_complete(s)
    assert inner.stages[2].iters[-1].kind.name == "SPATIAL"
    assert [tags(s)[0] for s in sketches[2:]] == ["SP", "CHW", "CHW"]


def test_conv_bias_relu_fuses_at_levels_one_and_two_or_stays_unfused():
    sketches = generate_sketches(conv_bias_relu(), TARGET)
    assert len(sketches) == 3
    for s in sketches:
        assert records(s)[0] == ["CI", 5]
        assert s.stages[s.stage_id("conv2d_pad")].relations == ()
        _is_multi_level_tiled(s, "conv2d", 4, 3)
    fused = sketches[:2]
    for level, s in zip((1, 2), fused):
        assert {f.n_split for f in s.steps if f.tag == "FSP"} == {level}
        conv = s.stages[s.stage_id("conv2d")]
        assert conv.attach[0] == s.stage_id("relu")
        relu = s.stages[s.stage_id("relu")]
        assert relu.iters[relu.position(conv.attach[1])].name == f"ax3.{level - 1}"
    assert "CA" not in tags(sketches[2]) and "FSP" not in tags(sketches[2])


def test_softmax_rfactors_each_reduction_and_never_inlines_exp():
    sketches = generate_sketches(softmax(), TARGET)
    assert len(sketches) == 9
    seen = set()
    for s in sketches:
        assert "CI" not in tags(s)
        rf = tuple(sorted(st.name for st in s.stages if st.name.endswith(".rf")))
        variants = tuple((r[1], r[2]) for r in records(s) if r[0] == "RF")
        seen.add(variants)
        assert len(rf) == len(variants)
    assert len(seen) == 9
    assert sketches[-1].steps == ()


def test_sum_over_large_axes_fuses_reduce_iterators_before_rfactor():
    sketches = generate_sketches(reduction(), TARGET)
    assert [records(s) for s in sketches] == [
        [["FU", 1, [1, 2]], ["SP", 1, 1, 240, [None], 1], ["RF", 1, 1, 1]],
        [["FU", 1, [1, 2]], ["SP", 1, 1, 240, [None], 1], ["RF", 1, 2, 1], ["RE", 1, [0, 2, 1]]],
        [],
    ]


def test_small_reduction_is_not_rfactored():
    dag = te.ComputeDAG([nn.reduce(te.placeholder((64, 3), name="x"), "sum", [1])])
    assert [s.steps for s in generate_sketches(dag, TARGET)] == [()]


def _ctx(dag):
    return SearchContext(dag, TARGET)


def test_rule_conditions():
    dag = conv_bias_relu()
    ctx, s = _ctx(dag), State.initial(dag)
    relu, bias, conv, pad, x = (s.stage_id(n) for n in ("relu", "bias_add", "conv2d", "conv2d_pad", "data"))
    assert AlwaysInline().meets(ctx, s, bias) == Condition.APPLY_AND_SKIP_REST
    assert AlwaysInline().meets(ctx, s, relu) == Condition.SKIP
    assert AlwaysInline().meets(ctx, s, pad) == Condition.SKIP
    assert AlwaysInline().meets(ctx, s, x) == Condition.SKIP
    s = s.compute_inline(bias)
    assert AddCacheWrite().meets(ctx, s, conv) == Condition.SKIP
    assert MultiLevelTilingWithFusion().meets(ctx, s, conv) == Condition.APPLY
    assert MultiLevelTiling().meets(ctx, s, conv) == Condition.APPLY_AND_SKIP_REST
    assert MultiLevelTiling().meets(ctx, s, pad) == Condition.SKIP
    assert AddRfactor().meets(ctx, s, conv) == Condition.SKIP
    assert SkipStage().meets(ctx, s, x) == Condition.APPLY
    assert [n for _, n in MultiLevelTilingWithFusion().apply(ctx, s, conv)] == [conv - 1, conv - 1]


def test_cache_write_keeps_the_stage_and_the_cache_then_fuses():
    dag = matmul(64, 64, 64)
    ctx, s = _ctx(dag), State.initial(dag)
    assert AddCacheWrite().meets(ctx, s, 2) == Condition.APPLY
    [(after, nxt)] = AddCacheWrite().apply(ctx, s, 2)
    assert nxt == 2 and names(after) == ["A", "B", "matmul.local", "matmul"]
    assert AddCacheWrite().meets(ctx, after, 2) == Condition.SKIP
    assert AddRfactor().meets(ctx, after, 2) == Condition.SKIP
    assert MultiLevelTilingWithFusion().meets(ctx, after, 2) == Condition.APPLY_AND_SKIP_REST


def test_rfactor_condition_uses_sixteen_times_the_cores():
    dag = matmul(8, 512, 8)
    s = State.initial(dag)
    assert AddRfactor().meets(SearchContext(dag, TARGET), s, 2) == Condition.APPLY
    few = replace(TARGET, num_cores=2, hw=None)
    assert AddRfactor().meets(SearchContext(dag, few), s, 2) == Condition.SKIP


def test_a_rule_list_is_pluggable():
    dag = matmul(1, 4096, 4)
    rules = tuple(r for r in CPU_RULES if not isinstance(r, (AddRfactor, AddCacheWrite)))
    assert [tags(s) for s in derive_sketches(_ctx(dag), rules)] == [["SP", "SP", "SP", "RE"]]


def test_sketches_are_cached_and_rebuilt_for_an_equal_dag():
    first = generate_sketches(matmul(1, 4096, 4), TARGET)
    assert [records(s) for s in generate_sketches(first[0].dag, TARGET)] == [records(s) for s in first]
    other = matmul(1, 4096, 4)
    again = generate_sketches(other, TARGET)
    assert all(s.dag is other for s in again)
    assert [records(s) for s in again] == [records(s) for s in first]
    assert [str(s) for s in again] == [str(s) for s in first]


def test_a_residual_add_that_reads_the_batch_at_zero_is_fused_like_an_elementwise_consumer():
    """Broadcasting computes read an extent-1 batch axis at constant 0: the conv before a residual add
    still gets the fused tiling (Ansor's single element-wise matched consumer), not only a cache_write."""
    from aotc.topi.elemwise import map_inputs

    data = te.placeholder((1, 16, 14, 14), "float32", "data")
    conv = nn.conv2d_nchw(data, te.placeholder((16, 16, 3, 3), "float32", "w"), (1, 1), (1, 1, 1, 1))
    add = map_inputs([conv, te.placeholder((1, 16, 14, 14), "float32", "res")], lambda a, b: a + b, "add")
    dag = te.ComputeDAG([add])
    ctx, s = _ctx(dag), State.initial(dag)
    assert MultiLevelTilingWithFusion().meets(ctx, s, s.stage_id(conv.name)) == Condition.APPLY
    assert AddCacheWrite().meets(ctx, s, s.stage_id(conv.name)) == Condition.SKIP
