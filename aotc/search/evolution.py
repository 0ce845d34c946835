"""Evolutionary search: mutation rules, node-based crossover, the EA loop and ε-greedy picking
(docs/search.md#evolutionary-search).

Every genetic operator edits a state's step list and replays it; a child that does not replay, lower or
pass the codegen checks is dropped (None). States are compared by `state_key` (their loop text).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

import numpy as np

from aotc.schedule.state import Annotation, IterKind, ScheduleError, State
from aotc.schedule.steps import (
    AnnotationStep,
    ComputeAtStep,
    ComputeInlineStep,
    ComputeRootStep,
    FuseStep,
    PragmaStep,
    SplitStep,
    Step,
    replay,
)
from aotc.search.annotation import (
    divisors,
    location_is_tunable,
    location_options,
    sample_initial_population,
)
from aotc.search.common import CostModel
from aotc.search.lowering import DistinctStates, state_key
from aotc.search.params import SearchParams
from aotc.search.program_pool import prefetch
from aotc.search.sketch import (
    SearchContext,
    generate_sketches,
    period_split_ids,
    sketch_signature,
    step_stage_names,
)
from aotc.target import Target, as_target
from aotc.te.dag import ComputeDAG

Mutation = Callable[[State, random.Random, SearchContext], "State | None"]

FREE_TILE_PROB = 0.1


def _replay(dag: ComputeDAG, steps: Sequence[Step]) -> State | None:
    try:
        return replay(dag, steps)
    except ScheduleError:
        return None


# ---- mutation rules ---------------------------------------------------------------------------------


def mutate_tile_size(state: State, rng: random.Random, ctx: SearchContext) -> State | None:
    """Move a random divisor between two levels of a split (the product stays), or rarely set one
    inner length to any value (non-dividing splits are legal). A constant-coefficient axis's split by its
    period stays (`period_split_ids`)."""
    max_inner = ctx.params.max_innermost_split_factor
    fixed = period_split_ids(state)
    ids = [
        i
        for i, s in enumerate(state.steps)
        if isinstance(s, SplitStep)
        and i not in fixed
        and (s.extent or 0) > 1
        and None not in s.lengths
        and s.lengths[-1] <= max_inner
    ]
    if not ids:
        return None
    i = ids[rng.randrange(len(ids))]
    step: SplitStep = state.steps[i]  # type: ignore[assignment]
    extent = step.extent or 1
    if rng.random() < FREE_TILE_PROB:
        lengths = _free_lengths(step.lengths, extent, max_inner, rng)
    else:
        lengths = _moved_lengths(step.lengths, extent, max_inner, rng)
    if lengths is None or lengths == tuple(step.lengths):
        return None
    steps = list(state.steps)
    steps[i] = replace(step, lengths=lengths)
    return _replay(state.dag, steps)


def _moved_lengths(
    lengths: Sequence[int], extent: int, max_inner: int, rng: random.Random
) -> tuple[int, ...] | None:
    full = [-(-extent // max(1, int(np.prod(lengths)))), *lengths]
    perm = list(range(len(full)))
    rng.shuffle(perm)
    last = len(full) - 1
    for k, src in enumerate(perm):
        if full[src] <= 1:
            continue
        dst = perm[(k + 1) % len(perm)]
        factors = [f for f in divisors(full[src]) if f > 1]
        if dst == last:
            factors = [f for f in factors if f * full[dst] <= max_inner]
        if not factors:
            continue
        f = factors[rng.randrange(len(factors))]
        full[src] //= f
        full[dst] *= f
        return tuple(full[1:])
    return None


def _free_lengths(lengths: Sequence[int], extent: int, max_inner: int, rng: random.Random) -> tuple[int, ...]:
    pos = rng.randrange(len(lengths))
    limit = max_inner if pos == len(lengths) - 1 else extent
    pool = sorted(set(divisors(extent)) | {1 << b for b in range(extent.bit_length())})
    pool = [v for v in pool if v <= limit and v != lengths[pos]]
    if not pool:
        return tuple(lengths)
    out = list(lengths)
    out[pos] = pool[rng.randrange(len(pool))]
    return tuple(out)


def mutate_auto_unroll(state: State, rng: random.Random, ctx: SearchContext) -> State | None:
    """Resample the step of a random auto_unroll_max_step pragma."""
    ids = [
        i
        for i, s in enumerate(state.steps)
        if isinstance(s, PragmaStep) and s.pragma.startswith("auto_unroll_max_step$")
    ]
    if not ids:
        return None
    i = ids[rng.randrange(len(ids))]
    step: PragmaStep = state.steps[i]  # type: ignore[assignment]
    allowed = ctx.unroll_steps_for(state, step.stage_id)
    options = [n for n in allowed if step.pragma != f"auto_unroll_max_step${n}"]
    if not options:
        return None
    steps = list(state.steps)
    steps[i] = replace(step, pragma=f"auto_unroll_max_step${options[rng.randrange(len(options))]}")
    return _replay(state.dag, steps)


def mutate_compute_location(state: State, rng: random.Random, ctx: SearchContext) -> State | None:
    """Replace the location step (inline / root / compute_at) of a random untiled stage by another
    option, computed on the state just before that step; parallel annotations of a stage moved under
    another stage's loop are dropped (they would nest)."""
    ids = [i for i, s in enumerate(state.steps) if isinstance(s, _LOCATION_STEPS)]
    rng.shuffle(ids)
    for i in ids:
        before = _replay(state.dag, state.steps[:i])
        if before is None:
            return None
        sid = state.steps[i].stage_id
        if not location_is_tunable(ctx, before, sid):
            continue
        options = [o for o in location_options(before, sid) if o != state.steps[i]]
        if not options:
            continue
        new = options[rng.randrange(len(options))]
        rest = list(state.steps[i + 1 :])
        if isinstance(new, ComputeAtStep):
            rest = [s for s in rest if not _is_parallel_of(s, sid)]
        return _replay(state.dag, [*state.steps[:i], new, *rest])
    return None


_LOCATION_STEPS = (ComputeAtStep, ComputeRootStep, ComputeInlineStep)


def _is_parallel_of(step: Step, stage_id: int) -> bool:
    return (
        isinstance(step, AnnotationStep)
        and step.stage_id == stage_id
        and step.annotation == Annotation.PARALLEL
    )


def mutate_parallel(state: State, rng: random.Random, ctx: SearchContext) -> State | None:
    """Change how many outer loops of a stage are fused into its parallel loop (MutateParallel)."""
    spots = []
    for i, s in enumerate(state.steps):
        if _is_parallel_of(s, s.stage_id) and s.iter_id == 0:
            prev = state.steps[i - 1] if i else None
            fused = isinstance(prev, FuseStep) and prev.stage_id == s.stage_id and prev.fused_ids[0] == 0
            spots.append((i - 1, len(prev.fused_ids)) if fused else (i, 1))  # type: ignore[union-attr]
    if not spots:
        return None
    start, old = spots[rng.randrange(len(spots))]
    par_step = state.steps[start + (1 if old > 1 else 0)]
    sid = par_step.stage_id
    before = _replay(state.dag, state.steps[:start])
    if before is None:
        return None
    limit = _fusable_outer(before, sid)
    choices = [k for k in range(1, limit + 1) if k != old]
    if not choices:
        return None
    new = choices[rng.randrange(len(choices))]
    head = [FuseStep(sid, tuple(range(new)))] if new > 1 else []
    rest = _shift_iters(state.steps[start + (2 if old > 1 else 1) :], sid, old - new)
    if rest is None:
        return None
    return _replay(state.dag, [*state.steps[:start], *head, par_step, *rest])


def _fusable_outer(state: State, sid: int) -> int:
    st = state.stages[sid]
    attached = {s.attach[1] for s in state.stages if s.attach is not None and s.attach[0] == sid}
    n = 0
    for it in st.iters:
        if it.kind != IterKind.SPATIAL or it.annotation != Annotation.NONE:
            break
        n += 1
        if it.uid in attached:
            break
    return n


def _shift_iters(steps: Sequence[Step], sid: int, offset: int) -> list[Step] | None:
    """Later steps on stage `sid` with iterator positions after the parallel loop shifted by `offset`."""
    out: list[Step] = []
    for s in steps:
        if isinstance(s, ComputeAtStep) and s.target_stage_id == sid:
            return None
        if s.stage_id != sid:
            out.append(s)
            continue
        if isinstance(s, (AnnotationStep, PragmaStep)):
            new_id = s.iter_id + offset if s.iter_id > 0 else 0
            if new_id < 1 and s.iter_id > 0:
                return None
            out.append(replace(s, iter_id=new_id))
        elif isinstance(s, FuseStep):
            ids = tuple(v + offset for v in s.fused_ids)
            if ids[0] < 1:
                return None
            out.append(replace(s, fused_ids=ids))
        else:
            return None
    return out


MUTATIONS: tuple[tuple[Mutation, float], ...] = (
    (mutate_tile_size, 0.90),
    (mutate_auto_unroll, 0.04),
    (mutate_compute_location, 0.05),
    (mutate_parallel, 0.01),
)


# Ansor's GPU weights: a GPU program has no compute locations or parallel loops to change
GPU_MUTATIONS: tuple[tuple[Mutation, float], ...] = (
    (mutate_tile_size, 0.90),
    (mutate_auto_unroll, 0.10),
)


def mutate(state: State, rng: random.Random, ctx: SearchContext) -> State | None:
    """One mutation chosen by the target's weights (docs/search.md#mutations-and-crossover)."""
    fns, weights = zip(*(GPU_MUTATIONS if ctx.target.is_gpu else MUTATIONS))
    fn = rng.choices(fns, weights=weights)[0]
    return fn(state, rng, ctx)


# ---- crossover --------------------------------------------------------------------------------------

_PHASE_SKETCH, _PHASE_LOCATION, _PHASE_PARALLEL, _PHASE_UNROLL, _PHASE_VECTORIZE, _PHASE_OTHER = range(6)
# Parallel and vectorize steps of a stage address its loops by position: they are inherited together.
_GENE_KIND = {_PHASE_VECTORIZE: _PHASE_PARALLEL, _PHASE_OTHER: _PHASE_PARALLEL}


def sketch_prefix_length(state: State, sketches: Sequence[State]) -> int | None:
    """Number of leading steps that came from a sketch (the longest sketch the state extends)."""
    return _prefix_length(sketch_signature(state), [sketch_signature(s) for s in sketches])


def _prefix_length(sig: tuple, sketch_sigs: Sequence[tuple]) -> int | None:
    lengths = [len(s) for s in sketch_sigs if sig[: len(s)] == s]
    return max(lengths) if lengths else None


def _phase(steps: Sequence[Step], i: int) -> int:
    s = steps[i]
    if isinstance(s, _LOCATION_STEPS):
        return _PHASE_LOCATION
    if isinstance(s, PragmaStep):
        return _PHASE_UNROLL
    if isinstance(s, FuseStep) and i + 1 < len(steps):
        s = steps[i + 1]
    if isinstance(s, AnnotationStep):
        if s.annotation == Annotation.PARALLEL:
            return _PHASE_PARALLEL
        if s.annotation == Annotation.VECTORIZE:
            return _PHASE_VECTORIZE
    return _PHASE_OTHER


def crossover(a: State, b: State, n_sketch: int, rng: random.Random, ctx: SearchContext) -> State | None:
    """Node-based crossover: for every (stage, decision kind) the child takes that parent's steps.

    Decision kinds are the tile sizes (the sketch part, which both parents share up to split
    lengths), the compute location, the loop annotations (parallel and vectorize) and the unroll
    pragma; the child's steps keep the order of the init rules. Returns None when the parents
    differ in sketch, when the child equals a parent, or when it does not replay or lower.
    """
    if sketch_signature(a)[:n_sketch] != sketch_signature(b)[:n_sketch]:
        return None
    parents = (a, b)
    names = [step_stage_names(p.dag, p.steps) for p in parents]
    genes = [_genes(p.steps, n, n_sketch) for p, n in zip(parents, names)]
    by_gene: list[dict[tuple, list[Step]]] = [{}, {}]
    for p in (0, 1):
        for g, step in zip(genes[p], parents[p].steps):
            by_gene[p].setdefault(g, []).append(step)
    differing = sorted(g for g in set(by_gene[0]) | set(by_gene[1]) if by_gene[0].get(g) != by_gene[1].get(g))
    if len(differing) < 2:
        return None
    owner = {g: rng.randrange(2) for g in differing}
    if len(set(owner.values())) < 2:
        owner[differing[rng.randrange(len(differing))]] ^= 1
    steps = [parents[owner.get(genes[0][i], 0)].steps[i] for i in range(n_sketch)]
    tail = [
        (_phase(parents[p].steps, i), p, i, parents[p].steps[i])
        for p in (0, 1)
        for i, g in enumerate(genes[p])
        if i >= n_sketch and owner.get(g, 0) == p
    ]
    tail.sort(key=lambda t: t[:3])
    child = _replay(a.dag, steps + [t[3] for t in tail])
    if child is None:
        return None
    key = state_key(child)
    return None if key is None or key in (state_key(a), state_key(b)) else child


def _genes(steps: Sequence[Step], names: list[str], n_sketch: int) -> list[tuple]:
    """(decision kind, stage name) of every step."""
    out = []
    for i, name in enumerate(names):
        phase = _PHASE_SKETCH if i < n_sketch else _phase(steps, i)
        out.append((_GENE_KIND.get(phase, phase), name))
    return out


# ---- the evolutionary search ------------------------------------------------------------------------


def _roulette(scores: np.ndarray) -> list[float]:
    weights = np.maximum(np.nan_to_num(scores, nan=0.0, neginf=0.0), 0.0) + 1e-8
    return list(itertools.accumulate(weights.tolist()))


def _pick(cum: list[float], rng: random.Random) -> int:
    return min(bisect.bisect_right(cum, rng.random() * cum[-1]), len(cum) - 1)


def evolutionary_search(
    dag: ComputeDAG,
    init_population: Sequence[State],
    model: CostModel,
    n_out: int,
    rng: random.Random,
    target: Target | str,
    measured_keys: set[str],
    params: SearchParams | None = None,
) -> list[State]:
    """The best `n_out` states by predicted score that are not in `measured_keys`, best first.

    Each of `params.generations` generations scores the population, keeps a min-heap of the best
    distinct states, and breeds the next `params.population` by roulette selection on max(score, 0) + ε:
    a crossover of two parents of the same sketch with `crossover_prob`, else a mutation with
    `mutation_prob`, else a copy.
    """
    ctx = SearchContext(dag, target, params or SearchParams())
    generations = ctx.params.generations
    sketches = generate_sketches(dag, ctx.target, ctx.params)
    prefetch(init_population, ctx.params.workers)
    pop = _unique_valid(init_population)
    heap: list[tuple[float, int, str, State]] = []
    in_heap = set(measured_keys)
    counter = itertools.count()
    for gen in range(generations + 1):
        if not pop:
            break
        scores = np.asarray(model.predict(dag, pop), dtype=float)
        for state, score in zip(pop, scores.tolist()):
            key = state_key(state)
            if key is None or key in in_heap:
                continue
            if len(heap) < n_out:
                heapq.heappush(heap, (score, next(counter), key, state))
                in_heap.add(key)
            elif score > heap[0][0]:
                old = heapq.heapreplace(heap, (score, next(counter), key, state))
                in_heap.discard(old[2])
                in_heap.add(key)
        if gen == generations:
            break
        pop = _next_generation(ctx, pop, scores, sketches, rng)
    return [item[3] for item in sorted(heap, key=lambda t: (-t[0], t[1]))]


def _unique_valid(states: Iterable[State]) -> list[State]:
    out = DistinctStates()
    for s in states:
        out.add(s)
    return out.states


def _next_generation(
    ctx: SearchContext,
    pop: list[State],
    scores: np.ndarray,
    sketches: Sequence[State],
    rng: random.Random,
) -> list[State]:
    size = ctx.params.population
    mutation_prob, crossover_prob = ctx.params.mutation_prob, ctx.params.crossover_prob
    cum = _roulette(scores)
    sketch_sigs = [sketch_signature(s) for s in sketches]
    prefix = [_prefix_length(sketch_signature(s), sketch_sigs) for s in pop]
    groups: dict[int | None, list[int]] = {}
    for i, n in enumerate(prefix):
        groups.setdefault(n, []).append(i)
    out = DistinctStates()
    attempts = size * 3
    while attempts and len(out) < size:
        # as many children as could be kept before the population is full: bred, lowered in the
        # workers, then added one by one exactly as breeding and adding them in turn would
        batch = []
        for _ in range(min(size - len(out), attempts)):
            i = _pick(cum, rng)
            r = rng.random()
            if r < crossover_prob:
                batch.append(_crossover_with_mate(ctx, pop, cum, groups, prefix, i, rng))
            elif r < crossover_prob + (1 - crossover_prob) * mutation_prob:
                batch.append(mutate(pop[i], rng, ctx))
            else:
                batch.append(pop[i])
        attempts -= len(batch)
        prefetch(batch, ctx.params.workers)
        for child in batch:
            out.add(child)
    return out.states


def _crossover_with_mate(ctx, pop, cum, groups, prefix, i, rng) -> State | None:
    n = prefix[i]
    mates = [j for j in groups.get(n, []) if j != i]
    if n is None or not mates:
        return None
    j = mates[rng.randrange(len(mates))]
    if rng.random() < 0.5:
        for _ in range(4):
            k = _pick(cum, rng)
            if k != i and prefix[k] == n:
                j = k
                break
    return crossover(pop[i], pop[j], n, rng, ctx)


# ---- choosing what to measure -----------------------------------------------------------------------


def pick_states_eps_greedy(
    best: Sequence[State],
    random_pool: Sequence[State],
    n: int,
    eps: float,
    measured_keys: set[str] | frozenset[str] = frozenset(),
) -> list[State]:
    """`n - int(eps * n)` states from `best` in order, then random ones; each list backs up the other.

    States already measured or picked (by `state_key`) are skipped; `measured_keys` is not modified.
    """
    n_good = n - int(eps * n)
    picked = DistinctStates(exclude=measured_keys)

    def take(source: Sequence[State], limit: int) -> None:
        for s in source:
            if len(picked) >= limit:
                return
            picked.add(s)

    take(best, n_good)
    take(random_pool, n)
    take(best, n)
    return picked.states


def search_round(
    dag: ComputeDAG,
    target: Target | str,
    model: CostModel,
    rng: random.Random,
    measured_keys: set[str],
    measured_best: Sequence[State] = (),
    n: int | None = None,
    params: SearchParams | None = None,
) -> list[State]:
    """One round of SketchPolicy (docs/search.md#search-round): sample, add the best measured states,
    evolve, pick `n` (default `params.per_round`) candidates, `params.eps_greedy` of them at random.

    `measured_best` are measured states sorted by throughput; the top 20% of a population join it.
    """
    params = params or SearchParams()
    target = as_target(target)
    n = params.per_round if n is None else n
    population, eps = params.population, params.eps_greedy
    sketches = generate_sketches(dag, target, params)
    init = sample_initial_population(dag, sketches, population, rng, target, params)
    n_random = min(len(init), 3 * int(eps * n))
    random_pool = rng.sample(init, n_random)
    seeds = list(init) + list(measured_best[: int(0.2 * population)])
    best = evolutionary_search(dag, seeds, model, 2 * n, rng, target, measured_keys, params)
    return pick_states_eps_greedy(best, random_pool, n, eps, measured_keys)
