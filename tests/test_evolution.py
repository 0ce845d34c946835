"""Evolutionary search: mutations, crossover, the EA loop and ε-greedy picking
(docs/search.md#evolutionary-search)."""

import math
import random

import numpy as np
import pytest

from aotc import te
from aotc.ir.printer import func_str
from aotc.schedule.lower import lower
from aotc.schedule.state import Annotation
from aotc.schedule.steps import FuseStep, SplitStep, replay
from aotc.search import evolution
from aotc.search.common import RandomCostModel
from aotc.search.evolution import (
    crossover,
    evolutionary_search,
    mutate_auto_unroll,
    mutate_compute_location,
    mutate_parallel,
    mutate_tile_size,
    pick_states_eps_greedy,
    search_round,
    sketch_prefix_length,
)
from aotc.search.lowering import state_key
from aotc.search.params import SearchParams
from aotc.search.sketch import SearchContext, generate_sketches, period_split_ids, step_stage_names
from aotc.te.tensor import LAYOUT_FREE
from aotc.topi import winograd

from .test_annotation import TARGET, WORKLOADS, check_compiles, conv_bias_relu, matmul, population, softmax


def _mutants(fn, states, ctx, want, seed=0):
    rng = random.Random(seed)
    out = []
    for parent in states * 3:
        child = fn(parent, rng, ctx)
        if child is not None and state_key(child) is not None and state_key(child) != state_key(parent):
            out.append((parent, child))
        if len(out) >= want:
            break
    return out


@pytest.mark.parametrize(
    "fn,name",
    [
        (mutate_tile_size, "matmul"),
        (mutate_tile_size, "conv_bias_relu"),
        (mutate_auto_unroll, "softmax"),
        (mutate_compute_location, "conv_bias_relu"),
        (mutate_compute_location, "softmax"),
        (mutate_parallel, "reduction"),
        (mutate_parallel, "dense_rfactor"),
    ],
)
def test_mutants_are_valid_programs_that_compute_the_reference(fn, name, tmp_path):
    dag = WORKLOADS[name]()
    ctx = SearchContext(dag, TARGET)
    pairs = _mutants(fn, population(dag, 30), ctx, 10)
    assert len(pairs) >= 5
    for _, child in pairs:
        assert func_str(lower(replay(dag, child.steps))) == func_str(lower(child))
    check_compiles(dag, [c for _, c in pairs[:3]], tmp_path)


def test_tile_size_mutation_keeps_the_product_of_dividing_splits(monkeypatch):
    monkeypatch.setattr(evolution, "FREE_TILE_PROB", 0.0)
    dag = conv_bias_relu()
    ctx = SearchContext(dag, TARGET)
    for parent, child in _mutants(mutate_tile_size, population(dag, 30), ctx, 30):
        changed = [(a, b) for a, b in zip(parent.steps, child.steps) if a != b]
        assert len(changed) == 1
        a, b = changed[0]
        assert isinstance(a, SplitStep) and isinstance(b, SplitStep)
        if a.extent % math.prod(a.lengths) == 0:
            assert b.extent % math.prod(b.lengths) == 0
        assert b.lengths[-1] <= 64


def test_free_tile_mutation_reaches_non_dividing_lengths(monkeypatch):
    monkeypatch.setattr(evolution, "FREE_TILE_PROB", 1.0)
    dag = matmul(64, 64, 64)
    ctx = SearchContext(dag, TARGET)
    pairs = _mutants(mutate_tile_size, population(dag, 20), ctx, 40)
    splits = [s for _, c in pairs for s in c.steps if isinstance(s, SplitStep)]
    assert any(s.extent % math.prod(s.lengths) for s in splits)


def _parallel_fusion(state):
    """(stage, number of loops fused into its parallel loop) for every parallel annotation."""
    return [
        (s.stage_id, len(prev.fused_ids) if isinstance(prev, FuseStep) else 1)
        for prev, s in zip((None, *state.steps), state.steps)
        if s.tag == "AN" and s.annotation == Annotation.PARALLEL
    ]


def test_parallel_mutation_changes_the_fused_outer_loops():
    dag = WORKLOADS["conv_bias_relu"]()
    ctx = SearchContext(dag, TARGET)
    for parent, child in _mutants(mutate_parallel, population(dag, 20), ctx, 10):
        before, after = _parallel_fusion(parent), _parallel_fusion(child)
        assert [sid for sid, _ in before] == [sid for sid, _ in after]
        assert before != after


def test_compute_location_mutation_replaces_one_location_step():
    dag = softmax()
    ctx = SearchContext(dag, TARGET)
    for parent, child in _mutants(mutate_compute_location, population(dag, 20), ctx, 10):
        loc = [i for i, (a, b) in enumerate(zip(parent.steps, child.steps)) if a != b]
        assert loc and parent.steps[loc[0]].tag in ("CA", "CR", "CI")
        assert child.steps[loc[0]].stage_id == parent.steps[loc[0]].stage_id


def _crossovers(dag, n, seed=0):
    ctx = SearchContext(dag, TARGET)
    sketches = generate_sketches(dag, TARGET)
    states = population(dag, 40, seed)
    rng = random.Random(seed)
    out = []
    for _ in range(400):
        a, b = rng.sample(states, 2)
        k = sketch_prefix_length(a, sketches)
        if k is None or k != sketch_prefix_length(b, sketches):
            continue
        child = crossover(a, b, k, rng, ctx)
        if child is not None:
            out.append((a, b, child))
        if len(out) >= n:
            break
    return out


@pytest.mark.parametrize("name", ["conv_bias_relu", "softmax", "matmul"])
def test_crossover_children_replay_and_compute_the_reference(name, tmp_path):
    dag = WORKLOADS[name]()
    triples = _crossovers(dag, 8)
    assert len(triples) >= 4
    for a, b, child in triples:
        again = replay(dag, child.steps)
        assert func_str(lower(again)) == func_str(lower(child))
        assert state_key(child) not in (state_key(a), state_key(b))
        for step in child.steps:
            assert step in a.steps or step in b.steps
    check_compiles(dag, [c for _, _, c in triples[:3]], tmp_path)


def test_crossover_needs_parents_of_one_sketch():
    dag = conv_bias_relu()
    sketches = generate_sketches(dag, TARGET)
    states = population(dag, 40)
    ctx = SearchContext(dag, TARGET)
    by_sketch = {}
    for s in states:
        by_sketch.setdefault(sketch_prefix_length(s, sketches), []).append(s)
    assert len(by_sketch) == 2 and None not in by_sketch
    (k1, (a, *_)), (k2, (b, *_)) = sorted(by_sketch.items())
    assert crossover(a, b, k1, random.Random(0), ctx) is None
    assert crossover(b, a, k2, random.Random(0), ctx) is None


class StepCountModel:
    """Deterministic scores: more vectorized lanes is better (for checking the selection)."""

    def predict(self, dag, states):
        return np.array([_vector_lanes(s) for s in states], dtype=float)

    def update(self, dag, states, results):
        return None


def _vector_lanes(state):
    return sum(
        it.extent or 0 for st in state.stages for it in st.iters if it.annotation == Annotation.VECTORIZE
    )


def test_search_returns_unique_unmeasured_valid_states_best_first():
    dag = conv_bias_relu()
    init = population(dag, 64)
    measured = {state_key(s) for s in init[:16]}
    out = evolutionary_search(
        dag,
        init,
        StepCountModel(),
        32,
        random.Random(0),
        TARGET,
        measured,
        SearchParams(population=64, generations=2),
    )
    keys = [state_key(s) for s in out]
    assert len(out) == 32 and None not in keys and len(set(keys)) == 32
    assert not set(keys) & measured
    scores = [_vector_lanes(s) for s in out]
    assert scores == sorted(scores, reverse=True)
    assert scores[0] >= max(_vector_lanes(s) for s in init[16:])


def test_search_with_the_random_model_and_eps_greedy_pick():
    dag = matmul()
    init = population(dag, 64)
    measured = {state_key(s) for s in init[:8]}
    best = evolutionary_search(
        dag,
        init,
        RandomCostModel(0),
        70,
        random.Random(1),
        TARGET,
        measured,
        SearchParams(population=64, generations=2),
    )
    picked = pick_states_eps_greedy(best, init, n=64, eps=0.05, measured_keys=measured)
    keys = [state_key(s) for s in picked]
    assert len(picked) == 64 and len(set(keys)) == 64 and not set(keys) & measured
    assert keys[:61] == [state_key(s) for s in best[:61]]
    assert all(state_key(s) not in {state_key(b) for b in best[:61]} for s in picked[61:])


def test_eps_greedy_falls_back_on_the_other_list():
    dag = matmul()
    states = population(dag, 20)
    assert pick_states_eps_greedy(states[:5], states[5:], n=10, eps=0.05) == states[:10]
    assert pick_states_eps_greedy(states, [], n=10, eps=0.05) == states[:10]
    measured = {state_key(s) for s in states[:3]}
    assert pick_states_eps_greedy(states, [], n=4, eps=0.05, measured_keys=measured) == states[3:7]


def test_same_seed_same_search_round():
    dag = conv_bias_relu()

    def run(seed):
        out = search_round(
            dag,
            TARGET,
            RandomCostModel(seed),
            random.Random(seed),
            set(),
            n=16,
            params=SearchParams(population=48, generations=2),
        )
        return [state_key(s) for s in out]

    first = run(3)
    assert len(first) == 16 and len(set(first)) == 16
    assert run(3) == first
    assert run(4) != first


@pytest.mark.parametrize("free_prob", [0.0, 1.0])
def test_tile_size_mutation_keeps_a_winograd_output_tile(monkeypatch, free_prob):
    """The output transform's rows and columns are split by the tile m = 4 so that its coefficients are
    literals: a mutation that changed that split made them vary again, or unrolled the transform 112
    times over (28-row tiles: 79 s of LLVM for one candidate)."""
    monkeypatch.setattr(evolution, "FREE_TILE_PROB", free_prob)
    data = te.placeholder((1, 12, 12, 16), name="data")
    u = te.placeholder((6, 6, 16, 16), name="u", tag=LAYOUT_FREE)
    dag = te.ComputeDAG([winograd.conv2d_winograd(data, u, 4, layout="NHWC", name="wc")])
    states = population(dag, 12)
    for state in states:
        fixed = period_split_ids(state)
        names = step_stage_names(dag, state.steps)
        assert {names[i] for i in fixed} == {"wc"}, state.steps
        assert sorted(state.steps[i].lengths for i in fixed) == [(4,), (4,)]
    pairs = _mutants(mutate_tile_size, states, SearchContext(dag, TARGET), 30)
    assert len(pairs) >= 10
    for parent, child in pairs:
        assert all(child.steps[i] == parent.steps[i] for i in period_split_ids(parent))
