"""Sketch generation: derivation rules that turn a DAG into loop-structure sketches
(docs/search.md#sketch-rules).

A sketch is a State whose split lengths are still undefined (None). Rules are tried on (state, stage)
pairs from the last stage to the first; each rule says whether it applies and returns the successor
states with the stage to visit next.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum

import numpy as np

from aotc.ir.dot import DotForm, dot_forms
from aotc.schedule.default_gpu import CROSS_THREAD_WIDTH, bind_reduction_to_threads
from aotc.schedule.state import Annotation, ComputeAtKind, IterKind, SplitRel, State
from aotc.schedule.steps import RfactorStep, SplitStep, effective_consumers, replay
from aotc.schedule.tiling import (
    const_index_vector_axes,
    dot_tile,
    dot_tilings,
    follow_tiling,
    multi_level_tile,
    unroll_const_indices,
)
from aotc.search.params import SearchParams
from aotc.target import Target, as_target
from aotc.te.dag import ComputeDAG, OpAnalysis, read_tensors, reads_at_own_axes
from aotc.te.tensor import CONST_INDEX_AXES, ComputeOp


@dataclass
class SearchContext:
    """What every rule needs: the task's DAG, its target and the policy parameters."""

    dag: ComputeDAG
    target: Target
    params: SearchParams = field(default_factory=SearchParams)
    _analyses: dict = field(default_factory=dict, repr=False)
    dot_forms: tuple[DotForm, ...] = field(default=(), init=False, repr=False)

    def __post_init__(self) -> None:
        self.target = as_target(self.target)
        from aotc.search.lowering import bind_target  # lowering imports this module

        bind_target(self.dag, self.target)
        self.dot_forms = dot_forms(self.target) if self.params.dot_products else ()

    @property
    def structure(self) -> str:
        """The multi-level tiling structure for this target (S: spatial level, R: reduce level)."""
        return self.params.gpu_structure if self.target.is_gpu else self.params.structure

    @property
    def fusion_levels(self) -> tuple[int, ...]:
        return self.params.gpu_fusion_levels if self.target.is_gpu else self.params.fusion_levels

    @property
    def unroll_steps(self) -> tuple[int, ...]:
        return self.params.gpu_unroll_steps if self.target.is_gpu else self.params.unroll_steps

    def unroll_steps_for(self, state: State, stage_id: int) -> tuple[int, ...]:
        """The auto-unroll budgets a stage may take: fewer for a dot-product micro-kernel's stage."""
        if any(it.annotation == Annotation.TENSORIZE for it in state.stages[stage_id].iters):
            return self.params.dot_unroll_steps
        return self.unroll_steps

    @property
    def num_cores(self) -> int:
        return max(1, self.target.hw.num_cores)

    def lanes(self, dtype: str) -> int:
        """Elements of `dtype` in one vector register."""
        return max(1, self.target.hw.vector_bytes // np.dtype(dtype).itemsize)

    def analysis(self, state: State, stage_id: int) -> OpAnalysis:
        """Access analysis of a stage's op in the state's current DAG (cache_write/rfactor change it)."""
        op = state.stages[stage_id].op
        if op in self.dag.analysis:
            return self.dag.analysis[op]
        key = tuple(st.op for st in state.stages)
        dag = self._analyses.get(key)
        if dag is None:
            if len(self._analyses) > 256:
                self._analyses.clear()
            dag = self._analyses[key] = ComputeDAG(state.outputs)
        return dag.analysis[op]


class Condition(Enum):
    SKIP = 0
    APPLY = 1
    APPLY_AND_SKIP_REST = 2


# ---- predicates shared by the rules (search_policy/utils.h) ----------------------------------------


def has_reduce_iter(state: State, stage_id: int) -> bool:
    return any(it.kind != IterKind.SPATIAL for it in state.stages[stage_id].iters)


def is_tiled(state: State, stage_id: int) -> bool:
    return any(isinstance(r, SplitRel) for r in state.stages[stage_id].relations)


def needs_multi_level_tiling(ctx: SearchContext, state: State, stage_id: int) -> bool:
    st = state.stages[stage_id]
    return isinstance(st.op, ComputeOp) and ctx.analysis(state, stage_id).needs_multi_level_tiling


def has_cache_write_stage(state: State, stage_id: int) -> bool:
    """The stage is the `.local` cache of the stage after it."""
    nxt = stage_id + 1
    return nxt < len(state.stages) and state.stages[stage_id].name == state.stages[nxt].name + ".local"


def single_consumer(state: State, stage_id: int) -> int | None:
    consumers = effective_consumers(state, stage_id)
    return consumers[0] if len(consumers) == 1 else None


def elementwise_match(state: State, producer: int, consumer: int) -> bool:
    """The consumer reads the producer at its own axes, through a chain of inlined element-wise stages."""
    stages = state.stages
    target = stages[consumer].op
    cur = stages[producer].op
    while cur is not target:
        readers = _readers_of(state, cur)
        if len(readers) != 1:
            return False
        nxt = stages[readers[0]]
        if not isinstance(nxt.op, ComputeOp) or tuple(nxt.op.shape) != tuple(cur.shape):
            return False
        if not reads_at_own_axes(nxt.op, cur):
            return False
        if nxt.op is not target and nxt.compute_at != ComputeAtKind.INLINED:
            return False
        cur = nxt.op
    return True


def _readers_of(state: State, op) -> list[int]:
    return [
        i for i, st in enumerate(state.stages) if isinstance(st.op, ComputeOp) and op in read_tensors(st.op)
    ]


def single_elementwise_consumer(state: State, stage_id: int) -> int | None:
    """Ansor's HasSingleElementwiseMatchedConsumer: the consumer to fuse a tiled stage into."""
    cid = single_consumer(state, stage_id)
    if cid is None or not elementwise_match(state, stage_id, cid):
        return None
    if has_reduce_iter(state, stage_id) and has_reduce_iter(state, cid):
        return None
    if state.stages[cid].name.endswith(".shared"):
        return None
    return cid


def space_and_reduce_length(state: State, stage_id: int) -> tuple[int, int]:
    space = reduce = 1
    for it in state.stages[stage_id].iters:
        ext = it.extent or 1
        if it.kind == IterKind.SPATIAL:
            space *= ext
        else:
            reduce *= ext
    return space, reduce


def needs_rfactor(ctx: SearchContext, state: State, stage_id: int) -> bool:
    st = state.stages[stage_id]
    if not isinstance(st.op, ComputeOp) or not st.op.reduce_axes:
        return False
    space, reduce = space_and_reduce_length(state, stage_id)
    if needs_multi_level_tiling(ctx, state, stage_id):
        return space <= reduce and space <= ctx.params.parallel_per_core * ctx.num_cores
    return reduce > ctx.num_cores


# ---- the rules --------------------------------------------------------------------------------------


class SketchRule:
    """One derivation rule: `meets` decides, `apply` returns (state, next stage id) pairs."""

    name = "rule"

    def meets(self, ctx: SearchContext, state: State, stage_id: int) -> Condition:
        raise NotImplementedError

    def apply(self, ctx: SearchContext, state: State, stage_id: int) -> list[tuple[State, int]]:
        raise NotImplementedError


class SkipStage(SketchRule):
    name = "SkipStage"

    def meets(self, ctx, state, stage_id):
        return Condition.APPLY

    def apply(self, ctx, state, stage_id):
        return [(state, stage_id - 1)]


class AlwaysInline(SketchRule):
    name = "AlwaysInline"

    def meets(self, ctx, state, stage_id):
        st = state.stages[stage_id]
        if st.is_placeholder or st.op in state.outputs or has_reduce_iter(state, stage_id):
            return Condition.SKIP
        if st.compute_at == ComputeAtKind.INLINED:
            return Condition.SKIP
        inlineable = ctx.analysis(state, stage_id).is_strictly_inlineable
        return Condition.APPLY_AND_SKIP_REST if inlineable else Condition.SKIP

    def apply(self, ctx, state, stage_id):
        return [(state.compute_inline(stage_id), stage_id - 1)]


class SimplifyComputeWithConstTensor(SketchRule):
    """Unroll the axes a stage's constant coefficients depend on (Winograd transforms), with a vector
    axis innermost: the contiguously read one and the last free one, as two sketches when they differ."""

    name = "SimplifyComputeWithConstTensor"

    def meets(self, ctx, state, stage_id):
        st = state.stages[stage_id]
        if st.is_placeholder or not st.op.attrs.get(CONST_INDEX_AXES) or is_tiled(state, stage_id):
            return Condition.SKIP
        if st.compute_at == ComputeAtKind.INLINED or any(it.kind != IterKind.SPATIAL for it in st.iters):
            return Condition.SKIP
        return Condition.APPLY_AND_SKIP_REST

    def apply(self, ctx, state, stage_id):
        axes = const_index_vector_axes(state.stages[stage_id].op)
        return [(unroll_const_indices(state, stage_id, a)[0], stage_id - 1) for a in axes]


class AddRfactor(SketchRule):
    """Fuse the reduce iterators, split by a placeholder 1, rfactor the outer or the inner part."""

    name = "AddRfactor"

    def meets(self, ctx, state, stage_id):
        if needs_rfactor(ctx, state, stage_id) and not has_cache_write_stage(state, stage_id):
            return Condition.APPLY
        return Condition.SKIP

    def apply(self, ctx, state, stage_id):
        st = state.stages[stage_id]
        n_sp = sum(1 for it in st.iters if it.kind == IterKind.SPATIAL)
        red = [i for i, it in enumerate(st.iters) if it.kind == IterKind.REDUCE]
        if red != list(range(n_sp, len(st.iters))):
            return []
        base = state.fuse(stage_id, red) if len(red) > 1 else state
        base = base.split(stage_id, n_sp, [1])
        out = []
        for part in (n_sp, n_sp + 1):
            s = base.rfactor(stage_id, part, n_sp)
            if part == n_sp + 1:
                n_iters = len(s.stages[stage_id].iters)
                s = s.reorder(stage_id, [i for i in range(n_iters) if i != n_sp] + [n_sp])
            out.append((s, stage_id - 1))
        return out


class AddCacheWrite(SketchRule):
    name = "AddCacheWrite"

    def meets(self, ctx, state, stage_id):
        if (
            needs_multi_level_tiling(ctx, state, stage_id)
            and single_elementwise_consumer(state, stage_id) is None
        ):
            return Condition.APPLY
        return Condition.SKIP

    def apply(self, ctx, state, stage_id):
        return [(state.cache_write(stage_id, "local"), stage_id)]


# ---- dot-product micro-kernels (docs/int8.md#dot-product-micro-kernels) ------------------------------


def tilings(ctx: SearchContext, state: State, stage_id: int) -> list[tuple[State, list[int]]]:
    """The multi-level tilings of a stage: one for each dot-product form its body takes, with its vector
    and tensorized loops innermost (their lengths fixed), else the plain one. The plain tiling of a stage
    that takes a form never won: in 167 tunings of such stages its best took 1.4-250x (median 16x) the
    time of the best dot-product program, and it took 5-14% of a tuning's trials (docs/search.md#sketch-rules)."""
    op = state.stages[stage_id].op
    dots = [dot_tile(state, stage_id, ctx.structure, dot) for dot in dot_tilings(op, ctx.dot_forms)]
    return dots or [multi_level_tile(state, stage_id, ctx.structure)]


class MultiLevelTilingWithFusion(SketchRule):
    """Tile the stage and compute it at tiling level L of its single element-wise consumer."""

    name = "MultiLevelTilingWithFusion"

    def meets(self, ctx, state, stage_id):
        if not needs_multi_level_tiling(ctx, state, stage_id) or is_tiled(state, stage_id):
            return Condition.SKIP
        if single_elementwise_consumer(state, stage_id) is None:
            return Condition.SKIP
        if has_cache_write_stage(state, stage_id):
            return Condition.APPLY_AND_SKIP_REST
        return Condition.APPLY

    def apply(self, ctx, state, stage_id):
        cid = single_elementwise_consumer(state, stage_id)
        assert cid is not None
        out = []
        for base, spatial in tilings(ctx, state, stage_id):
            for level in ctx.fusion_levels:
                if ctx.structure[level - 1] != "S":
                    continue
                s, at = follow_tiling(base, cid, spatial, level)
                out.append((s.compute_at(stage_id, cid, at), stage_id - 1))
        return out


class MultiLevelTiling(SketchRule):
    name = "MultiLevelTiling"

    def meets(self, ctx, state, stage_id):
        if needs_multi_level_tiling(ctx, state, stage_id) and not is_tiled(state, stage_id):
            return Condition.APPLY_AND_SKIP_REST
        return Condition.SKIP

    def apply(self, ctx, state, stage_id):
        return [(s, stage_id - 1) for s, _ in tilings(ctx, state, stage_id)]


# ---- GPU rules (docs/search.md#gpu-sketches) -------------------------------------------------------


class AlwaysInlineGPU(SketchRule):
    """Greedy on GPU: every stage without a reduction that is neither an input nor an output is inlined
    (a separate kernel would round-trip its result through device memory)."""

    name = "AlwaysInline"

    def meets(self, ctx, state, stage_id):
        st = state.stages[stage_id]
        if st.is_placeholder or st.op in state.outputs or has_reduce_iter(state, stage_id):
            return Condition.SKIP
        if st.compute_at == ComputeAtKind.INLINED or st.op.attrs.get(CONST_INDEX_AXES):
            return Condition.SKIP  # a Winograd transform inlined is its whole sum again per use
        return Condition.APPLY_AND_SKIP_REST

    def apply(self, ctx, state, stage_id):
        return [(state.compute_inline(stage_id), stage_id - 1)]


def outermost_reduce_tile_end(state: State, stage_id: int) -> int:
    """The position of the last iterator of a tiled stage's outermost reduce tile (one part of each
    reduce axis: `k.0`, or `rc.0 ry.0 rx.0`; the next level may follow right after it)."""
    iters = state.stages[stage_id].iters
    pos = next(i for i, it in enumerate(iters) if it.kind == IterKind.REDUCE)
    seen = {iters[pos].name.rsplit(".", 1)[0]}
    while pos + 1 < len(iters) and iters[pos + 1].kind == IterKind.REDUCE:
        axis = iters[pos + 1].name.rsplit(".", 1)[0]
        if axis in seen:
            break
        seen.add(axis)
        pos += 1
    return pos


class AddCacheReadShared(SketchRule):
    """A direct producer of a tiled stage (with reduce loops) is staged through shared memory: the block's
    threads fetch one reduce tile of it together, computed at the consumer's outermost reduce tile."""

    name = "AddCacheRead"

    def meets(self, ctx, state, stage_id):
        st = state.stages[stage_id]
        if st.compute_at == ComputeAtKind.INLINED or st.name.endswith(".shared"):
            return Condition.SKIP
        consumers = effective_consumers(state, stage_id)
        if not consumers:
            return Condition.SKIP
        for c in consumers:
            if not (is_tiled(state, c) and has_reduce_iter(state, c)) or has_cross_thread_reduction(state, c):
                return Condition.SKIP
            if st.op not in read_tensors(state.stages[c].op):
                return Condition.SKIP  # read through an inlined stage: not a direct producer
        return Condition.APPLY_AND_SKIP_REST

    def apply(self, ctx, state, stage_id):
        for c_name in [state.stages[c].name for c in effective_consumers(state, stage_id)]:
            state = state.cache_read(stage_id, "shared", [state.stage_id(c_name)])
            consumer = state.stage_id(c_name)
            state = state.compute_at(stage_id + 1, consumer, outermost_reduce_tile_end(state, consumer))
        return [(state, stage_id)]


def cross_thread_width(ctx: SearchContext) -> int:
    """Threads that share one reduction: a warp (32 where the target promises no lock-step width)."""
    return max(ctx.target.hw.warp_size, CROSS_THREAD_WIDTH)


def has_cross_thread_reduction(state: State, stage_id: int) -> bool:
    """A reduce loop of the stage is bound to threads (its block reduces together)."""
    return any(
        it.kind == IterKind.REDUCE and it.annotation == Annotation.THREAD_X
        for it in state.stages[stage_id].iters
    )


def needs_cross_thread_reduction(ctx: SearchContext, state: State, stage_id: int) -> bool:
    """Ansor's NeedsCrossThreadReduction: too little spatial work to fill a block with threads of their
    own (a tiled op), or a reduction longer than a warp (any other)."""
    st = state.stages[stage_id]
    if not isinstance(st.op, ComputeOp) or not st.op.reduce_axes or is_tiled(state, stage_id):
        return False
    if any(it.annotation != Annotation.NONE for it in st.iters):
        return False
    space, reduce = space_and_reduce_length(state, stage_id)
    if needs_multi_level_tiling(ctx, state, stage_id):
        return space <= ctx.target.hw.max_threads_per_block and space < reduce
    return reduce > cross_thread_width(ctx)


class CrossThreadReduction(SketchRule):
    """Fuse the reduce loops, split them by a warp and bind the inner part to threadIdx.x: the threads
    of a block reduce together (the outer spatial loops become blocks in ThreadBind)."""

    name = "CrossThreadReduction"

    def meets(self, ctx, state, stage_id):
        if has_cache_write_stage(state, stage_id) or not needs_cross_thread_reduction(ctx, state, stage_id):
            return Condition.SKIP
        return Condition.APPLY

    def apply(self, ctx, state, stage_id):
        bound = bind_reduction_to_threads(state, stage_id, cross_thread_width(ctx))
        return [] if bound is state else [(bound, stage_id - 1)]


class AddCacheWriteGPU(AddCacheWrite):
    """On GPU a tiled stage always accumulates in registers: no variant without the cache."""

    def meets(self, ctx, state, stage_id):
        cond = super().meets(ctx, state, stage_id)
        return Condition.APPLY_AND_SKIP_REST if cond == Condition.APPLY else cond


class MultiLevelTilingWithFusionGPU(MultiLevelTilingWithFusion):
    def meets(self, ctx, state, stage_id):
        cond = super().meets(ctx, state, stage_id)
        return Condition.APPLY_AND_SKIP_REST if cond == Condition.APPLY else cond


CPU_RULES: tuple[SketchRule, ...] = (
    AlwaysInline(),
    SimplifyComputeWithConstTensor(),
    AddRfactor(),
    AddCacheWrite(),
    MultiLevelTilingWithFusion(),
    MultiLevelTiling(),
    SkipStage(),
)

GPU_RULES: tuple[SketchRule, ...] = (
    AddCacheReadShared(),
    AlwaysInlineGPU(),
    SimplifyComputeWithConstTensor(),
    CrossThreadReduction(),
    AddCacheWriteGPU(),
    MultiLevelTilingWithFusionGPU(),
    MultiLevelTiling(),
    SkipStage(),
)


# ---- derivation -------------------------------------------------------------------------------------


def derive_sketches(
    ctx: SearchContext, rules: tuple[SketchRule, ...] = CPU_RULES, max_sketches: int = 1000
) -> list[State]:
    """The rules applied breadth first, from the last stage to the first (docs/search.md#sketch-rules)."""
    frontier = [(State.initial(ctx.dag), len(ctx.dag.ops) - 1)]
    done: list[State] = []
    while frontier:
        nxt: list[tuple[State, int]] = []
        for state, sid in frontier:
            if sid < 0:
                done.append(state)
                continue
            for rule in rules:
                cond = rule.meets(ctx, state, sid)
                if cond == Condition.SKIP:
                    continue
                nxt.extend(rule.apply(ctx, state, sid))
                if cond == Condition.APPLY_AND_SKIP_REST:
                    break
        frontier = nxt
        if len(done) + len(frontier) > max_sketches:
            raise RuntimeError(f"more than {max_sketches} sketches for {ctx.dag}")
    return [reset_rfactor_splits(s) for s in done]


def is_complete(state: State) -> bool:
    """No split length is undefined, neither in the stages nor in the steps (rfactor sketches)."""
    return state.concrete and not any(isinstance(s, SplitStep) and None in s.lengths for s in state.steps)


def reset_rfactor_splits(state: State) -> State:
    """Make the placeholder length of every split step right before an rfactor undefined again."""
    steps = list(state.steps)
    for i in range(1, len(steps)):
        prev = steps[i - 1]
        if isinstance(steps[i], RfactorStep) and isinstance(prev, SplitStep):
            steps[i - 1] = replace(prev, lengths=(None,) * len(prev.lengths))
    return replace(state, steps=tuple(steps))


def stage_names_after_step(names: list[str], step) -> list[str]:
    """Stage names after a step that may insert a stage (cache_read/cache_write/rfactor)."""
    tag = step.tag
    if tag == "CHW":
        return (
            names[: step.stage_id] + [names[step.stage_id] + "." + step.scope_name] + names[step.stage_id :]
        )
    if tag == "RF":
        return names[: step.stage_id] + [names[step.stage_id] + ".rf"] + names[step.stage_id :]
    if tag == "CHR":
        at = step.stage_id + 1
        return names[:at] + [names[step.stage_id] + "." + step.scope_name] + names[at:]
    return names


def step_stage_names(dag: ComputeDAG, steps) -> list[str]:
    """The name of the stage each step touches (stable across stage insertions)."""
    names = [op.name for op in dag.ops]
    out = []
    for step in steps:
        out.append(names[step.stage_id])
        names = stage_names_after_step(names, step)
    return out


def period_split_ids(state: State) -> set[int]:
    """The indices of the steps that split a constant-coefficient axis by its period
    (`unroll_const_indices`: a Winograd output tile's rows and columns), which no mutation may change:
    another length makes the coefficients' index vary again, and a larger one unrolls the transform
    many times over (a 28-row output tile: 112 copies, 79 s of LLVM)."""
    names = step_stage_names(state.dag, state.steps)
    ops = {st.name: st.op for st in state.stages}
    touched: set[str] = set()
    out: set[int] = set()
    for i, (step, name) in enumerate(zip(state.steps, names)):
        op = ops.get(name)
        periods = dict(op.attrs.get(CONST_INDEX_AXES, ())) if op is not None else {}
        # the period splits are the stage's first steps, on its axes' own positions
        if name not in touched and isinstance(step, SplitStep) and periods.get(step.iter_id, 1) > 1:
            out.add(i)
            continue
        touched.add(name)
    return out


_SKETCH_CACHE: dict[tuple[str, str], tuple[ComputeDAG, list[State]]] = {}


def generate_sketches(
    dag: ComputeDAG, target: Target | str, params: SearchParams | None = None
) -> list[State]:
    """All sketches of `dag` for the target (CPU or GPU rules), cached per (workload key, target, the policy's sketch settings)."""
    ctx = SearchContext(dag, target, params or SearchParams())
    target = ctx.target
    sketch_policy = (ctx.structure, ctx.fusion_levels, ctx.params.parallel_per_core, ctx.params.dot_products)
    key = (dag.workload_key, f"{target}|{target.hw}|{sketch_policy}")
    hit = _SKETCH_CACHE.get(key)
    if hit is not None and hit[0] is dag:
        return list(hit[1])
    if hit is not None:
        sketches = [rebuild_sketch(dag, s.steps) for s in hit[1]]
    else:
        sketches = derive_sketches(ctx, GPU_RULES if target.is_gpu else CPU_RULES)
    _SKETCH_CACHE[key] = (dag, sketches)
    return list(sketches)


def rebuild_sketch(dag: ComputeDAG, steps) -> State:
    """Replay sketch steps on another DAG object of the same workload (placeholder lengths for rfactor)."""
    filled = list(steps)
    for i in range(1, len(filled)):
        prev = filled[i - 1]
        if isinstance(filled[i], RfactorStep) and isinstance(prev, SplitStep):
            filled[i - 1] = replace(prev, lengths=(1,) * len(prev.lengths))
    return reset_rfactor_splits(replay(dag, filled))


def sketch_signature(state: State) -> tuple:
    """The step records of a state with split lengths blanked: equal for states of one sketch prefix."""
    return tuple(_blank(s) for s in state.steps)


def _blank(step) -> tuple:
    rec = step.to_record()
    if rec[0] == "SP":
        rec[4] = len(rec[4])
    return tuple(tuple(v) if isinstance(v, list) else v for v in rec)
