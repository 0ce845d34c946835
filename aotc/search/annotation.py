"""Random annotation of sketches into complete programs (docs/search.md#random-annotation).

Each init rule is `rule(ctx, state, rng) -> State | None` (None: the sample is invalid). A sample is a
sketch with every undefined split length filled, a compute location chosen for every untiled stage,
outer loops fused and parallel, an auto-unroll pragma on reduction stages and the innermost spatial
loops vectorized.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from functools import lru_cache

from aotc.ir.stmt import MAX_VECTOR_LANES
from aotc.schedule.default_gpu import bind_one_thread_per_point, bind_outer_to_blocks
from aotc.schedule.gpu_tiling import bind_tiled, cooperative_fetch, divisors, level_run
from aotc.schedule.lower import infer_bound
from aotc.schedule.state import Annotation, ComputeAtKind, IterKind, ScheduleError, State
from aotc.schedule.steps import SplitStep, Step, effective_consumers, replay
from aotc.search.lowering import DistinctStates
from aotc.search.params import SearchParams
from aotc.search.program_pool import prefetch
from aotc.search.sketch import (
    SearchContext,
    has_reduce_iter,
    is_tiled,
    step_stage_names,
)
from aotc.target import Target
from aotc.te.dag import ComputeDAG
from aotc.te.tensor import CONST_INDEX_AXES

# ---- FillTileSize -----------------------------------------------------------------------------------


@lru_cache(maxsize=4096)
def factorizations(extent: int, parts: int, max_innermost: int) -> tuple[tuple[int, ...], ...]:
    """Every ordered tuple of `parts` positive ints with product `extent`, the last ≤ max_innermost."""
    if parts == 1:
        return ((extent,),) if extent <= max_innermost else ()
    out = []
    for d in divisors(extent):
        out.extend((d, *rest) for rest in factorizations(extent // d, parts - 1, max_innermost))
    return tuple(out)


def _is_pow2(n: int) -> bool:
    return n & (n - 1) == 0


def vector_friendly(length: int, lanes: int) -> bool:
    """A vector length that compiles well: within one register, or a power of two."""
    return length <= lanes or _is_pow2(length)


def sample_split_lengths(
    extent: int, n_lengths: int, lanes: int, rng: random.Random, params: SearchParams
) -> tuple[int, ...]:
    """Inner lengths (outer to inner) of a split of `extent` into `n_lengths + 1` loops.

    Mostly an exact factorization of the extent; with probability `non_divisor_prob` one of the extent
    padded up to a multiple of a small power of two (the split then needs a tail guard).
    """
    total = extent
    if extent > 1 and rng.random() < params.non_divisor_prob:
        m = rng.choice((2, 4, 8, 16))
        total = -(-extent // m) * m
        if total == extent:
            total = extent + m
    choices = factorizations(total, n_lengths + 1, params.max_innermost_split_factor)
    if not choices:
        return (1,) * n_lengths
    pick = choices[rng.randrange(len(choices))]
    if not vector_friendly(pick[-1], lanes) and rng.random() < 0.8:
        good = [c for c in choices if vector_friendly(c[-1], lanes)]
        if good:
            pick = good[rng.randrange(len(good))]
    return tuple(pick[1:])


def fill_tile_sizes(ctx: SearchContext, state: State, rng: random.Random) -> State | None:
    """InitFillTileSize: sample every undefined split length, then replay the steps. On GPU only exact
    factorizations: a padded split guards the thread loops, and a barrier under a guard is invalid."""
    params = ctx.params.replace(non_divisor_prob=0.0) if ctx.target.is_gpu else ctx.params
    steps = list(state.steps)
    names = step_stage_names(state.dag, steps)
    dtypes = {st.name: st.op.dtype for st in state.stages if not st.is_placeholder}
    changed = False
    for i, step in enumerate(steps):
        if not isinstance(step, SplitStep) or all(v is not None for v in step.lengths):
            continue
        if step.extent is None:
            return None
        lanes = ctx.lanes(dtypes.get(names[i], "float32"))
        # lengths a sketch fixed (a dot product's vector and depth) stay; the others share what is left
        fixed = math.prod(v for v in step.lengths if v is not None)
        free = sum(v is None for v in step.lengths)
        sampled = iter(sample_split_lengths(-(-step.extent // fixed), free, lanes, rng, params))
        lengths = tuple(v if v is not None else next(sampled) for v in step.lengths)
        steps[i] = replace(step, lengths=lengths)
        changed = True
    if not changed:
        return state
    if ctx.target.is_gpu:
        steps = balance_thread_levels(ctx, state, steps, rng)
    try:
        return replay(state.dag, steps)
    except ScheduleError:
        return None


def order_innermost_tile(ctx: SearchContext, state: State, rng: random.Random) -> State | None:
    """Move a random spatial axis innermost in the last tile level of each tiled reduction stage.

    Ansor keeps the axis order in every tile level, so only the last axis is ever vectorized: an NCHW
    conv vectorizes along the image width. With its weights re-laid out (`schedule.layout`), the output
    channel can be the vector axis instead, broadcasting the input and reading the weights contiguously.
    """
    for sid, st in enumerate(state.stages):
        if st.compute_at != ComputeAtKind.ITER or not is_tiled(state, sid):
            continue  # only a local buffer is laid out in loop order; a root stage's stays row-major
        if not has_reduce_iter(state, sid) or rng.random() >= ctx.params.innermost_reorder_prob:
            continue
        attached = _attached_at(state, sid)
        start = len(st.iters)
        while start > 0:
            it = st.iters[start - 1]
            if it.kind != IterKind.SPATIAL or it.annotation != Annotation.NONE or it.uid in attached:
                break
            start -= 1
        choices = [p for p in range(start, len(st.iters) - 1) if (st.iters[p].extent or 1) > 1]
        if not choices:
            continue
        pick = choices[rng.randrange(len(choices))]
        order = [p for p in range(len(st.iters)) if p != pick] + [pick]
        state = state.reorder(sid, order)
    return state


# ---- ChangeComputeLocation --------------------------------------------------------------------------


def _attached_at(state: State, stage_id: int) -> dict[int, list[int]]:
    """Iterator uid of `stage_id` -> stages computed at it."""
    out: dict[int, list[int]] = {}
    for i, st in enumerate(state.stages):
        if st.compute_at == ComputeAtKind.ITER and st.attach is not None and st.attach[0] == stage_id:
            out.setdefault(st.attach[1], []).append(i)
    return out


def single_consumer_root(state: State, stage_id: int) -> int | None:
    """The single consumer, or the common stage all consumers are (computed at) under (GetSingleConsumerId)."""
    consumers = effective_consumers(state, stage_id)
    if not consumers:
        return None
    if len(consumers) == 1:
        return consumers[0]
    roots = set()
    for c in consumers:
        st = state.stages[c]
        roots.add(st.attach[0] if st.compute_at == ComputeAtKind.ITER and st.attach else c)
    return roots.pop() if len(roots) == 1 else None


def compute_location_candidates(state: State, stage_id: int) -> list[tuple[int, int]]:
    """(target stage, iterator position) pairs where the stage may be computed (utils.cc:68)."""
    tid = single_consumer_root(state, stage_id)
    if tid is None:
        return []
    target = state.stages[tid]
    attached = _attached_at(state, tid)
    target_attached = target.compute_at == ComputeAtKind.ITER and target.attach is not None
    tiled = is_tiled(state, tid)
    out: list[tuple[int, int]] = []
    seen_reduce = False
    for pos, it in enumerate(target.iters):
        if it.kind == IterKind.REDUCE:
            seen_reduce = True
            if not tiled:
                break
        elif it.kind == IterKind.SPATIAL and seen_reduce:
            break
        if it.annotation in (Annotation.UNROLL, Annotation.VECTORIZE):
            break
        if it.extent == 1:
            continue
        if target_attached and it.kind == IterKind.SPATIAL and it.name.endswith(".0"):
            continue
        out.append((tid, pos))
        if it.uid in attached:
            break
    if target_attached:
        ttid = target.attach[0]  # type: ignore[index]
        outer = state.stages[ttid]
        outer_attached = _attached_at(state, ttid)
        for pos, it in enumerate(outer.iters):
            if it.kind == IterKind.REDUCE or it.uid in outer_attached:
                break
            if it.annotation in (Annotation.UNROLL, Annotation.VECTORIZE):
                break
            if it.extent == 1:
                continue
            out.append((ttid, pos))
    return out


def location_is_tunable(ctx: SearchContext, state: State, stage_id: int) -> bool:
    """Compute stages whose location the search samples: not outputs, not tiled, needing no tiling,
    and not strictly inlineable (the AlwaysInline sketch rule decides those)."""
    st = state.stages[stage_id]
    if st.is_placeholder or st.op in state.outputs or is_tiled(state, stage_id):
        return False
    analysis = ctx.analysis(state, stage_id)
    return not analysis.needs_multi_level_tiling and not analysis.is_strictly_inlineable


def location_options(state: State, stage_id: int) -> list[Step]:
    """Every compute-location step for a stage: inline (if legal), root, or one candidate loop."""
    from aotc.schedule.steps import ComputeAtStep, ComputeInlineStep, ComputeRootStep

    opts: list[Step] = []
    nothing_attached = not any(st.attach is not None and st.attach[0] == stage_id for st in state.stages)
    # A constant-indexed transform inlined into its consumer would be re-evaluated, unrolled, per use.
    inlinable = not state.stages[stage_id].op.attrs.get(CONST_INDEX_AXES)
    if inlinable and not has_reduce_iter(state, stage_id) and nothing_attached:
        opts.append(ComputeInlineStep(stage_id))
    opts.append(ComputeRootStep(stage_id))
    opts.extend(
        ComputeAtStep(stage_id, tid, pos) for tid, pos in compute_location_candidates(state, stage_id)
    )
    return opts


def change_compute_location(ctx: SearchContext, state: State, rng: random.Random) -> State | None:
    """InitChangeComputeLocation: a random location for every stage whose location is tunable."""
    for sid in reversed(range(len(state.stages))):
        st = state.stages[sid]
        if st.compute_at == ComputeAtKind.INLINED or not location_is_tunable(ctx, state, sid):
            continue
        opts = location_options(state, sid)
        try:
            state = state.apply(opts[rng.randrange(len(opts))])
        except ScheduleError:
            return None
    return state


# ---- Parallel ---------------------------------------------------------------------------------------


def annotate_parallel(ctx: SearchContext, state: State, rng: random.Random) -> State | None:
    """InitParallel: fuse the outer spatial loops of every root stage and run them in parallel."""
    try:
        state = infer_bound(state)
    except ScheduleError:
        return None
    for sid, st in enumerate(state.stages):
        if st.is_placeholder or st.compute_at != ComputeAtKind.ROOT:
            continue
        state = _parallel_from(ctx, state, sid, 0)
    return state


def _parallel_from(ctx: SearchContext, state: State, sid: int, offset: int) -> State:
    st = state.stages[sid]
    attached = _attached_at(state, sid)
    limit = ctx.params.parallel_per_core * ctx.num_cores
    n, degree = 0, 1
    for it in st.iters[offset:]:
        if it.kind != IterKind.SPATIAL or it.annotation != Annotation.NONE:
            break
        n += 1
        degree *= it.extent or 1
        if degree > limit or it.uid in attached:
            break
    if n == 0:
        return state
    last = st.iters[offset + n - 1]
    if degree == 1:
        if last.uid not in attached:
            return state
        for child in attached[last.uid]:
            state = _parallel_from(ctx, state, child, 0)
        return _parallel_from(ctx, state, sid, offset + n)
    if n > 1:
        state = state.fuse(sid, list(range(offset, offset + n)))
    return state.parallel(sid, offset)


# ---- Unroll and vectorization -----------------------------------------------------------------------


def annotate_unroll(ctx: SearchContext, state: State, rng: random.Random) -> State | None:
    """InitUnroll: an auto_unroll_max_step pragma with a random step on every reduction stage."""
    for sid, st in enumerate(state.stages):
        if st.is_placeholder or st.compute_at == ComputeAtKind.INLINED or not st.iters:
            continue
        if has_reduce_iter(state, sid):
            steps = ctx.unroll_steps_for(state, sid)
            n = steps[rng.randrange(len(steps))]
            state = state.pragma(sid, 0, f"auto_unroll_max_step${n}")
    return state


def annotate_vectorize(ctx: SearchContext, state: State, rng: random.Random) -> State | None:
    """InitVectorization: fuse 1..k of the k innermost vectorizable loops (all k allowed) and vectorize.

    Vectorizable: spatial, unannotated, not an attach point, the fused length within two registers
    and compiling well (one register or a power of two); a tiled stage only offers its innermost loop.
    """
    for sid, st in enumerate(state.stages):
        if st.is_placeholder or st.compute_at == ComputeAtKind.INLINED:
            continue
        lanes = ctx.lanes(st.op.dtype)
        limit = min(MAX_VECTOR_LANES, 2 * lanes)
        attached = _attached_at(state, sid)
        tiled = is_tiled(state, sid)
        lengths: list[int] = []
        prod = 1
        for it in reversed(st.iters):
            if it.uid in attached or it.kind != IterKind.SPATIAL or it.annotation != Annotation.NONE:
                break
            if (tiled and lengths) or it.extent is None:
                break
            prod *= it.extent
            if prod > limit:
                break
            lengths.append(prod)
        counts = [k for k, p in enumerate(lengths, 1) if p > 1 and vector_friendly(p, lanes)]
        if not counts:
            continue
        k = counts[rng.randrange(len(counts))]
        last = len(st.iters) - 1
        if k > 1:
            state = state.fuse(sid, list(range(last - k + 1, last + 1)))
            last -= k - 1
        state = state.vectorize(sid, last)
    return state


# ---- ThreadBind (GPU) -------------------------------------------------------------------------------


def tiled_spatial_splits(state: State, steps: list) -> dict[str, list[int]]:
    """Per multi-level tiled stage, the ids of its spatial split steps (the first split of each axis)."""
    names = step_stage_names(state.dag, steps)
    out: dict[str, list[int]] = {}
    for st in state.stages:
        if st.is_placeholder:
            continue
        ids = [i for i, step in enumerate(steps) if isinstance(step, SplitStep) and names[i] == st.name]
        n_axes = len(st.op.axes)
        if len(ids) >= n_axes and all(len(steps[i].lengths) >= 2 for i in ids[:n_axes]):
            out[st.name] = ids[:n_axes]
    return out


def balance_thread_levels(ctx: SearchContext, state: State, steps: list, rng: random.Random) -> list:
    """Move prime factors of sampled tile sizes so that each tiled stage has at least a warp of threads
    (where its work allows) and at most the block limit, and no more virtual threads than allowed; most
    uniform samples give a small output tile too few threads, and ThreadBind would reject them."""
    hw = ctx.target.hw
    for ids in tiled_spatial_splits(state, steps).values():
        full = []  # per axis: [outer, level 1 (vthread), level 2 (threads), ...]
        for i in ids:
            step = steps[i]
            if step.extent is None or any(v is None for v in step.lengths):
                return steps
            full.append([step.extent // math.prod(step.lengths), *step.lengths])
        space = math.prod(step.extent for step in (steps[i] for i in ids))
        want = hw.warp_size if space > 2 * hw.warp_size else 1
        _move_factors(full, 2, want, hw.max_threads_per_block, rng)
        for level, most in ((2, hw.max_threads_per_block), (1, hw.max_vthread_extent)):
            while math.prod(a[level] for a in full) > most:
                axis = max(range(len(full)), key=lambda k: full[k][level])
                p = _smallest_prime(full[axis][level])
                full[axis][level] //= p
                full[axis][0] *= p
        for i, lengths in zip(ids, full):
            steps[i] = replace(steps[i], lengths=tuple(lengths[1:]))
    return steps


def _move_factors(full: list[list[int]], to: int, least: int, most: int, rng: random.Random) -> None:
    """Move random prime factors of the other levels into level `to` until its product across the
    axes reaches `least`, never past `most`."""
    while math.prod(a[to] for a in full) < least:
        sources = [(k, j) for k, a in enumerate(full) for j, v in enumerate(a) if j != to and v > 1]
        if not sources:
            return
        k, j = sources[rng.randrange(len(sources))]
        p = _smallest_prime(full[k][j])
        if math.prod(a[to] for a in full) * p > most:
            return
        full[k][j] //= p
        full[k][to] *= p


def _smallest_prime(n: int) -> int:
    return next(d for d in range(2, n + 1) if n % d == 0)


BLOCK_SIZES = (32, 64, 128, 256)  # threads per block an untiled stage may get


def bind_threads(ctx: SearchContext, state: State, rng: random.Random) -> State | None:
    """InitThreadBind: a multi-level tiled root stage binds its first three spatial levels to blockIdx.x,
    vthread and threadIdx.x; any other root stage one point per thread; a shared-memory stage is fetched
    by the block's threads together (cooperative fetching). None if a limit of the target is broken."""
    hw = ctx.target.hw
    for name in [st.name for st in state.stages]:
        sid = state.stage_id(name)
        st = state.stages[sid]
        if st.is_placeholder or st.compute_at != ComputeAtKind.ROOT:
            continue
        if level_run(st.iters, 0, ".0") and level_run(st.iters, level_run(st.iters, 0, ".0"), ".1"):
            state = bind_tiled(state, sid, hw)
        else:
            state = _bind_untiled(state, sid, hw, rng)
        if state is None:
            return None
    for name in [st.name for st in state.stages if st.name.endswith(".shared")]:
        state = _cooperative_fetch(ctx, state, state.stage_id(name))
        if state is None:
            return None
    return state


def _bind_untiled(state: State, sid: int, hw, rng: random.Random) -> State:
    if any(it.annotation == Annotation.THREAD_X for it in state.stages[sid].iters):
        return bind_outer_to_blocks(state, sid)  # a cross-thread reduction: its threads are taken
    sizes = [b for b in BLOCK_SIZES if b <= hw.max_threads_per_block]
    return bind_one_thread_per_point(state, sid, sizes[rng.randrange(len(sizes))])


def _cooperative_fetch(ctx: SearchContext, state: State, sid: int) -> State | None:
    """Fuse a shared stage's loops, split off a (vector) part of 1 for mutation to grow, and split the
    rest by the consumer's thread count: its threads fetch the tile together."""
    st = state.stages[sid]
    if st.compute_at != ComputeAtKind.ITER or st.attach is None:
        return None
    consumer = state.stages[st.attach[0]]
    names = step_stage_names(state.dag, state.steps)
    splits = [
        i for i, step in enumerate(state.steps) if isinstance(step, SplitStep) and names[i] == consumer.name
    ]
    spatial = splits[: len(consumer.op.axes)]
    if len(spatial) != len(consumer.op.axes):
        return None
    return cooperative_fetch(state, sid, spatial)


CPU_INIT_RULES = (
    fill_tile_sizes,
    order_innermost_tile,
    change_compute_location,
    annotate_parallel,
    annotate_unroll,
    annotate_vectorize,
)
GPU_INIT_RULES = (fill_tile_sizes, bind_threads, annotate_unroll)
GPU_SAMPLE_ATTEMPTS = 16


def sample_state(ctx: SearchContext, sketch: State, rng: random.Random, rules=None) -> State | None:
    """One random complete program from a sketch (the target's init rules by default), or None if a rule
    failed."""
    if rules is None and ctx.target.is_gpu:
        # most tile sizes give a tiled stage fewer threads than a warp: draw again rather than give up
        for _ in range(GPU_SAMPLE_ATTEMPTS):
            state = sample_state(ctx, sketch, rng, GPU_INIT_RULES)
            if state is not None:
                return state
        return None
    state: State | None = sketch
    for rule in rules or CPU_INIT_RULES:
        try:
            state = rule(ctx, state, rng)  # type: ignore[arg-type]
        except ScheduleError:
            return None
        if state is None:
            return None
    return state


def sample_initial_population(
    dag: ComputeDAG,
    sketches: list[State],
    n: int,
    rng: random.Random,
    target: Target | str,
    params: SearchParams | None = None,
) -> list[State]:
    """Up to `n` valid programs with distinct loop text, sampled from random sketches.

    Stops early when `max(50, n // 4)` samples in a row add nothing new (a small search space).
    """
    ctx = SearchContext(dag, target, params or SearchParams())
    out = DistinctStates()
    stall = 0
    stall_limit = max(50, n // 4)
    while len(out) < n and sketches and stall < stall_limit:
        # as many samples as could be added before the loop's tests next end it: drawn, lowered in the
        # workers, then added one by one exactly as drawing and adding them in turn would
        batch = [
            sample_state(ctx, sketches[rng.randrange(len(sketches))], rng)
            for _ in range(min(n - len(out), stall_limit - stall))
        ]
        prefetch(batch, ctx.params.workers)
        for state in batch:
            stall += 1
            if out.add(state):
                stall = 0
    return out.states
