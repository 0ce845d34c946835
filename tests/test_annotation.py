"""Random annotation: sampled programs are complete, valid, distinct and correct
(docs/search.md#random-annotation)."""

import itertools
import math
import random
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from aotc import te
from aotc.codegen.module import build_module, load_library
from aotc.ir.printer import func_str
from aotc.schedule.lower import lower
from aotc.schedule.state import Annotation, ComputeAtKind, State
from aotc.schedule.steps import SplitStep, replay
from aotc.search.annotation import (
    annotate_parallel,
    factorizations,
    fill_tile_sizes,
    sample_initial_population,
    sample_split_lengths,
    vector_friendly,
)
from aotc.search.lowering import DistinctStates, loop_error, lowered, prune_invalid, state_key
from aotc.search.params import SearchParams
from aotc.search.sketch import SearchContext, generate_sketches
from aotc.target import host_target
from aotc.te.reference import evaluate
from aotc.topi import nn
from aotc.topi.workloads import make_workload

TARGET = replace(host_target(), num_cores=4, hw=None)


def matmul(m=19, k=33, n=23):
    return make_workload("matmul", [m, n, k])


def conv_bias_relu():
    return make_workload("conv2d_relu", [1, 3, 9, 9, 5, 3, 1, 1])


def softmax():
    return make_workload("softmax", [5, 137])


def reduction():
    return te.ComputeDAG([nn.reduce(te.placeholder((4, 11, 60), name="x"), "sum", [0, 2])])


def dense_bias_relu():
    x = te.placeholder((1, 512), name="x")
    w = te.placeholder((6, 512), name="w")
    b = te.placeholder((6,), name="b")
    return te.ComputeDAG([nn.relu(nn.bias_add(nn.dense(x, w), b))])


WORKLOADS = {
    "matmul": matmul,
    "conv_bias_relu": conv_bias_relu,
    "softmax": softmax,
    "reduction": reduction,
    "dense_rfactor": dense_bias_relu,
}


def population(dag, n, seed=0):
    return sample_initial_population(dag, generate_sketches(dag, TARGET), n, random.Random(seed), TARGET)


def check_compiles(dag, states, tmp_path):
    """Build every state and compare its outputs with the float64 numpy reference."""
    rng = np.random.default_rng(0)
    inputs = {p.name: rng.uniform(-1, 1, p.shape).astype(p.dtype) for p in dag.placeholders}
    refs = evaluate(dag, inputs, float_dtype="float64")
    for n, state in enumerate(states):
        func = lower(state, "kernel")
        path = build_module([func], host_target(), str(tmp_path / f"k{n}.so"))
        kernel = load_library(path).kernel("kernel")
        outs = [np.zeros(o.shape, o.dtype) for o in dag.outputs]
        kernel(*[inputs[p.name] for p in dag.placeholders], *outs)
        for out, ref in zip(outs, refs):
            scale = float(np.max(np.abs(ref))) or 1.0
            np.testing.assert_allclose(
                out, ref, rtol=1e-4, atol=1e-4 * scale, err_msg=f"{state}\n{func_str(func)}"
            )


def test_factorizations_are_exact_and_bound_the_innermost():
    got = factorizations(96, 4, 8)
    assert len(got) == len(set(got))
    assert all(math.prod(f) == 96 and f[-1] <= 8 for f in got)
    brute = {f for f in itertools.product(range(1, 97), repeat=3) if 96 % math.prod(f) == 0 and f[-1] <= 8}
    assert {f[1:] for f in got} == brute


def test_split_lengths_are_mostly_divisors_and_sometimes_not():
    rng = random.Random(0)
    params = SearchParams()
    samples = [sample_split_lengths(56, 3, 16, rng, params) for _ in range(2000)]
    dividing = sum(56 % math.prod(s) == 0 for s in samples) / len(samples)
    assert 0.7 < dividing < 0.9
    assert all(s[-1] <= params.max_innermost_split_factor for s in samples)
    assert sum(not vector_friendly(s[-1], 16) for s in samples) / len(samples) < 0.1


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_population_is_complete_valid_and_distinct(name):
    dag = WORKLOADS[name]()
    states = population(dag, 40)
    assert len(states) == 40
    keys = [state_key(s) for s in states]
    assert None not in keys and len(set(keys)) == len(keys)
    for s in states:
        assert s.concrete
        assert all(None not in st.lengths for st in s.steps if isinstance(st, SplitStep))
        assert loop_error(lower(s)) is None
        for sid, st in enumerate(s.stages):
            if not st.is_placeholder and st.compute_at != ComputeAtKind.INLINED and st.op.reduce_axes:
                assert any(p.tag == "PR" and p.stage_id == sid for p in s.steps)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_sampled_programs_compute_the_reference(name, tmp_path):
    dag = WORKLOADS[name]()
    check_compiles(dag, population(dag, 4, seed=7), tmp_path)


def test_every_rule_leaves_its_mark():
    dag = conv_bias_relu()
    states = population(dag, 120)
    counts = Counter()
    for s in states:
        pad = s.stages[s.stage_id("conv2d_pad")]
        counts[f"pad:{pad.compute_at.name}"] += 1
        anns = {it.annotation for st in s.stages for it in st.iters}
        counts.update(a.name for a in anns)
        splits = [st for st in s.steps if isinstance(st, SplitStep)]
        if any(st.extent % math.prod(st.lengths) for st in splits):
            counts["non-dividing"] += 1
        counts.update(p.pragma for p in s.steps if p.tag == "PR")
    for mark in ("pad:ROOT", "pad:INLINED", "pad:ITER", "PARALLEL", "VECTORIZE", "non-dividing"):
        assert counts[mark] > 5, (mark, counts)
    for n in (0, 16, 64, 512):
        assert counts[f"auto_unroll_max_step${n}"] > 5


def test_vectorization_may_fuse_all_candidate_loops():
    """Ansor's `1 + rand % (k-1)` never fuses all k candidates; here every count occurs."""
    x = te.placeholder((32, 2, 2, 2), name="x")
    dag = te.ComputeDAG([nn.relu(x)])
    one_core = replace(TARGET, num_cores=1, hw=None)
    states = sample_initial_population(dag, generate_sketches(dag, one_core), 10, random.Random(0), one_core)
    fused = set()
    for s in states:
        st = s.stages[1]
        assert st.iters[0].annotation == Annotation.PARALLEL and st.iters[0].extent == 32
        assert st.iters[-1].annotation == Annotation.VECTORIZE
        fused.add(st.iters[-1].extent)
    assert fused == {2, 4, 8}


def test_vector_lengths_stay_within_two_registers_and_compile_well():
    for dag in (matmul(64, 64, 64), conv_bias_relu()):
        for s in population(dag, 60):
            for st in s.stages:
                if st.is_placeholder:
                    continue
                lanes = TARGET.hw.vector_bytes // 4
                for it in st.iters:
                    if it.annotation == Annotation.VECTORIZE:
                        assert it.extent is None or (
                            it.extent <= 2 * lanes and vector_friendly(it.extent, lanes)
                        )


def test_parallel_recurses_into_stages_attached_at_unit_outer_loops():
    """The consumer's loops down to the attach point have extent 1: the attached stage gets a parallel
    loop of its own, and the consumer continues after the attach point (siblings, never nested)."""
    dag = matmul(1, 4096, 4)
    ctx = SearchContext(dag, TARGET)
    sketch = next(s for s in generate_sketches(dag, TARGET) if [t.tag for t in s.steps][:1] == ["CHW"])
    lengths = {0: (1, 1, 1), 4: (2, 1, 2), 8: (64,)}
    steps = [replace(s, lengths=lengths[s.iter_id]) if isinstance(s, SplitStep) else s for s in sketch.steps]
    state = annotate_parallel(ctx, replay(dag, steps), random.Random(0))
    local, out = state.stage_id("matmul.local"), state.stage_id("matmul")
    assert [s.to_record() for s in state.steps[len(steps) :]] == [
        ["FU", local, [0, 1, 2, 3]],
        ["AN", local, 0, int(Annotation.PARALLEL)],
        ["FU", out, [2, 3]],
        ["AN", out, 2, int(Annotation.PARALLEL)],
    ]
    assert loop_error(lower(state)) is None
    assert func_str(lower(state)).count("parallel") == 2


def test_fill_tile_sizes_replays_rfactor_sketches_with_real_factors():
    dag = matmul(1, 4096, 4)
    ctx = SearchContext(dag, TARGET)
    rf = generate_sketches(dag, TARGET)[0]
    filled = fill_tile_sizes(ctx, rf, random.Random(3))
    (split,) = [s for s in filled.steps if isinstance(s, SplitStep)]
    factor = split.lengths[0]
    assert filled.stages[filled.stage_id("matmul.rf")].op.shape[-1] == -(-4096 // factor)


def test_state_key_is_the_lowered_text_and_ignores_history():
    dag = matmul()
    s = population(dag, 1)[0]
    again = replay(dag, s.steps)
    assert state_key(again) == state_key(s)
    assert lowered(again) is not None and func_str(lowered(again)) == func_str(lower(s, "kernel"))
    noop = s.compute_root(s.stage_id("matmul"))
    assert noop.steps != s.steps and state_key(noop) == state_key(s)


def test_invalid_states_are_pruned():
    dag = matmul()
    s = State.initial(dag).cache_write(2)
    s = s.split(3, 0, [4]).compute_at(2, 3, 0).parallel(3, 0).parallel(2, 0)
    assert "nested parallel" in loop_error(lower(s))
    sketches = generate_sketches(dag, TARGET)
    good = population(dag, 3)
    assert prune_invalid([s, *sketches, *good]) == good
    assert state_key(s) is None


def test_distinct_states_keep_valid_new_programs_only():
    dag = matmul()
    a, b, c = population(dag, 3)
    kept = DistinctStates(exclude={state_key(c)})
    assert [kept.add(x) for x in (a, None, generate_sketches(dag, TARGET)[0], a, b, c)] == [
        True,
        False,
        False,
        False,
        True,
        False,
    ]
    assert kept.states == [a, b] and len(kept) == 2


def test_same_seed_same_population():
    dag = conv_bias_relu()
    first = [state_key(s) for s in population(dag, 30, seed=5)]
    assert [state_key(s) for s in population(dag, 30, seed=5)] == first
    assert [state_key(s) for s in population(dag, 30, seed=6)] != first
