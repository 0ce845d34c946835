"""Ansor's loop-structure state: stages of iterators, compute locations, and the steps that made them.

A `State` is an immutable value. Every transform returns a new state whose `steps` end with the step
applied, so `replay(dag, state.steps)` rebuilds it exactly. Iterators carry a per-stage `uid` so that
attach points survive splits, fuses and reorders; steps address stages and iterators by position,
as Ansor's records do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import IntEnum

from aotc.ir.expr import Expr
from aotc.te.dag import ComputeDAG
from aotc.te.tensor import ComputeOp, Operation, PlaceholderOp


class ScheduleError(ValueError):
    """A transform step that does not apply to the state it was given."""


class IterKind(IntEnum):
    SPATIAL = 0
    REDUCE = 1
    MIXED = 2
    SPECIAL = 3


class Annotation(IntEnum):
    NONE = 0
    UNROLL = 1
    VECTORIZE = 2
    PARALLEL = 3
    VTHREAD = 4
    BLOCK_X = 5
    THREAD_X = 6
    BLOCK_Y = 7
    THREAD_Y = 8
    BLOCK_Z = 9
    THREAD_Z = 10
    TENSORIZE = 11


THREAD_TAGS = {
    Annotation.VTHREAD: "vthread",
    Annotation.BLOCK_X: "blockIdx.x",
    Annotation.THREAD_X: "threadIdx.x",
    Annotation.BLOCK_Y: "blockIdx.y",
    Annotation.THREAD_Y: "threadIdx.y",
    Annotation.BLOCK_Z: "blockIdx.z",
    Annotation.THREAD_Z: "threadIdx.z",
}


class ComputeAtKind(IntEnum):
    ROOT = 0
    INLINED = 1
    ITER = 2


@dataclass(frozen=True, slots=True)
class Iterator:
    uid: int
    name: str
    extent: int | None
    kind: IterKind
    annotation: Annotation = Annotation.NONE


@dataclass(frozen=True, slots=True)
class SplitRel:
    """`parent` split into `children` (outer to inner) with the child extents of SplitStep."""

    parent: int
    children: tuple[int, ...]
    lengths: tuple[int | None, ...]
    inner_to_outer: bool


@dataclass(frozen=True, slots=True)
class FuseRel:
    parents: tuple[int, ...]
    child: int


@dataclass(frozen=True, slots=True)
class Stage:
    op: Operation
    iters: tuple[Iterator, ...]
    relations: tuple[SplitRel | FuseRel, ...] = ()
    compute_at: ComputeAtKind = ComputeAtKind.ROOT
    attach: tuple[int, int] | None = None  # (target stage index, target iterator uid)
    auto_unroll_max_step: int = 0
    storage_align: tuple[tuple[int, int, int], ...] = ()  # (axis, factor, offset)
    pragmas: tuple[str, ...] = ()
    next_uid: int = 0

    @property
    def name(self) -> str:
        return self.op.name

    @property
    def is_placeholder(self) -> bool:
        return isinstance(self.op, PlaceholderOp)

    @property
    def root_iters(self) -> tuple[tuple[int, str, int, IterKind], ...]:
        """(uid, name, extent, kind) of the op's own axes: uids 0..n-1."""
        if not isinstance(self.op, ComputeOp):
            return ()
        return tuple(
            (i, a.name, a.extent, IterKind.SPATIAL if a.kind == "spatial" else IterKind.REDUCE)
            for i, a in enumerate(self.op.all_axes)
        )

    def position(self, uid: int) -> int:
        for i, it in enumerate(self.iters):
            if it.uid == uid:
                return i
        raise KeyError(uid)


def initial_stage(op: Operation) -> Stage:
    if not isinstance(op, ComputeOp):
        return Stage(op, ())
    iters = tuple(
        Iterator(i, a.name, a.extent, IterKind.SPATIAL if a.kind == "spatial" else IterKind.REDUCE)
        for i, a in enumerate(op.all_axes)
    )
    return Stage(op, iters, next_uid=len(iters))


def split_extents(
    extent: int | None, lengths: tuple[int | None, ...], inner_to_outer: bool
) -> list[int | None]:
    """Extents of the children of a split (outer to inner).

    A length larger than what is left of the extent shrinks to it, and the free part rounds up,
    so the children always cover the extent without wholly empty iterations.
    """
    if extent is None or any(v is None for v in lengths):
        return [None, *lengths] if inner_to_outer else [*lengths, None]
    rem = extent
    fixed: list[int] = []
    for length in reversed(lengths) if inner_to_outer else lengths:
        e = min(length, rem)  # type: ignore[type-var]
        fixed.append(e)
        rem = -(-rem // e)
    if inner_to_outer:
        return [rem, *reversed(fixed)]
    return [*fixed, rem]


def propagate_extents(stage: Stage, root_extents: dict[int, int | None]) -> dict[int, int | None]:
    """Extent of every iterator uid, given the extents of the root iterators."""
    ext = dict(root_extents)
    for rel in stage.relations:
        if isinstance(rel, SplitRel):
            for uid, e in zip(
                rel.children, split_extents(ext.get(rel.parent), rel.lengths, rel.inner_to_outer)
            ):
                ext[uid] = e
        else:
            parts = [ext.get(p) for p in rel.parents]
            ext[rel.child] = None if any(p is None for p in parts) else math.prod(parts)  # type: ignore[arg-type]
    return ext


def iterator_values(
    stage: Stage, leaf_vars: dict[int, Expr], extents: dict[int, int | None]
) -> dict[int, Expr]:
    """Value of every iterator (leaf, intermediate and root) as an expression of the leaf variables."""
    values: dict[int, Expr] = dict(leaf_vars)
    for rel in reversed(stage.relations):
        if isinstance(rel, SplitRel):
            acc: Expr | None = None
            for uid in rel.children:
                v = values[uid]
                acc = v if acc is None else acc * _req(extents[uid]) + v
            values[rel.parent] = acc  # type: ignore[assignment]
        else:
            f = values[rel.child]
            stride = 1
            for p in reversed(rel.parents):
                e = _req(extents[p])
                values[p] = (f // stride) % e if p != rel.parents[0] else f // stride
                stride *= e
    return values


def root_expressions(
    stage: Stage, leaf_vars: dict[int, Expr], extents: dict[int, int | None]
) -> dict[int, Expr]:
    """Value of every root iterator as an expression of the leaf loop variables."""
    values = iterator_values(stage, leaf_vars, extents)
    return {uid: values[uid] for uid, *_ in stage.root_iters}


def innermost_positions(stage: Stage, n_axes: int) -> list[int]:
    """For each of the first `n_axes` root iterators, the loop position of its innermost leaf (-1 if none)."""
    roots: dict[int, set[int]] = {uid: {uid} for uid in range(len(stage.root_iters))}
    for rel in stage.relations:
        if isinstance(rel, SplitRel):
            for child in rel.children:
                roots[child] = roots[rel.parent]
        else:
            roots[rel.child] = set().union(*(roots[p] for p in rel.parents))
    deepest = [-1] * n_axes
    for pos, it in enumerate(stage.iters):
        for root in roots.get(it.uid, ()):
            if root < n_axes:
                deepest[root] = pos
    return deepest


def overflowing_splits(stage: Stage, extents: dict[int, int | None]) -> list[int]:
    """Uids of split parents whose children cover more than the parent's extent.

    Such a parent's value must be guarded: past its extent it would alias another index.
    """
    out = []
    for rel in stage.relations:
        if isinstance(rel, SplitRel):
            covered = math.prod(_req(extents[c]) for c in rel.children)
            if covered != _req(extents[rel.parent]):
                out.append(rel.parent)
    return out


def _req(e: int | None) -> int:
    if e is None:
        raise ScheduleError("an extent is still undefined (incomplete split lengths)")
    return e


@dataclass(frozen=True)
class State:
    dag: ComputeDAG
    stages: tuple[Stage, ...]
    outputs: tuple[Operation, ...]
    steps: tuple = field(default=())

    @staticmethod
    def initial(dag: ComputeDAG) -> State:
        return State(dag, tuple(initial_stage(op) for op in dag.ops), dag.outputs)

    @property
    def concrete(self) -> bool:
        return all(
            all(v is not None for v in rel.lengths)
            for st in self.stages
            for rel in st.relations
            if isinstance(rel, SplitRel)
        )

    def stage_id(self, ref: int | str | Operation) -> int:
        if isinstance(ref, int):
            if not 0 <= ref < len(self.stages):
                raise ScheduleError(f"stage {ref} out of range (state has {len(self.stages)} stages)")
            return ref
        for i, st in enumerate(self.stages):
            if st.op is ref or st.op.name == ref:
                return i
        raise ScheduleError(f"no stage named {ref if isinstance(ref, str) else ref.name!r}")

    def apply(self, step) -> State:
        """Apply one transform step; the result records it."""
        new = step.apply_to(self)
        return replace(new, steps=self.steps + (step,))

    def with_stage(self, stage_id: int, stage: Stage) -> State:
        stages = list(self.stages)
        stages[stage_id] = stage
        return replace(self, stages=tuple(stages))

    def __str__(self) -> str:
        from aotc.schedule.printer import state_str

        return state_str(self)

    # Convenience constructors, one per step kind (Ansor's State API).
    def split(self, stage, iter_id: int, lengths, inner_to_outer: bool = True) -> State:
        from aotc.schedule.steps import SplitStep

        sid = self.stage_id(stage)
        iters = self.stages[sid].iters
        extent = iters[iter_id].extent if 0 <= iter_id < len(iters) else None
        return self.apply(SplitStep(sid, iter_id, extent, tuple(lengths), inner_to_outer))

    def follow_split(self, stage, iter_id: int, src_step_id: int, n_split: int) -> State:
        from aotc.schedule.steps import FollowSplitStep

        return self.apply(FollowSplitStep(self.stage_id(stage), iter_id, src_step_id, n_split))

    def follow_fused_split(
        self, stage, iter_id: int, src_step_ids, level: int, factor_or_nparts: bool
    ) -> State:
        from aotc.schedule.steps import FollowFusedSplitStep

        return self.apply(
            FollowFusedSplitStep(self.stage_id(stage), iter_id, tuple(src_step_ids), level, factor_or_nparts)
        )

    def reorder(self, stage, order) -> State:
        from aotc.schedule.steps import ReorderStep

        return self.apply(ReorderStep(self.stage_id(stage), tuple(order)))

    def fuse(self, stage, iter_ids) -> State:
        from aotc.schedule.steps import FuseStep

        return self.apply(FuseStep(self.stage_id(stage), tuple(iter_ids)))

    def annotate(self, stage, iter_id: int, annotation: Annotation) -> State:
        from aotc.schedule.steps import AnnotationStep

        return self.apply(AnnotationStep(self.stage_id(stage), iter_id, Annotation(annotation)))

    def parallel(self, stage, iter_id: int) -> State:
        return self.annotate(stage, iter_id, Annotation.PARALLEL)

    def vectorize(self, stage, iter_id: int) -> State:
        return self.annotate(stage, iter_id, Annotation.VECTORIZE)

    def unroll(self, stage, iter_id: int) -> State:
        return self.annotate(stage, iter_id, Annotation.UNROLL)

    def tensorize(self, stage, iter_id: int) -> State:
        """A reduce iterator right inside the vectorized one, run as a dot-product instruction."""
        return self.annotate(stage, iter_id, Annotation.TENSORIZE)

    def bind(self, stage, iter_id: int, annotation: Annotation) -> State:
        return self.annotate(stage, iter_id, annotation)

    def pragma(self, stage, iter_id: int, pragma: str) -> State:
        from aotc.schedule.steps import PragmaStep

        return self.apply(PragmaStep(self.stage_id(stage), iter_id, pragma))

    def storage_align(self, stage, iter_id: int, factor: int, offset: int) -> State:
        from aotc.schedule.steps import StorageAlignStep

        return self.apply(StorageAlignStep(self.stage_id(stage), iter_id, factor, offset))

    def compute_at(self, stage, target_stage, target_iter_id: int) -> State:
        from aotc.schedule.steps import ComputeAtStep

        return self.apply(ComputeAtStep(self.stage_id(stage), self.stage_id(target_stage), target_iter_id))

    def compute_inline(self, stage) -> State:
        from aotc.schedule.steps import ComputeInlineStep

        return self.apply(ComputeInlineStep(self.stage_id(stage)))

    def compute_root(self, stage) -> State:
        from aotc.schedule.steps import ComputeRootStep

        return self.apply(ComputeRootStep(self.stage_id(stage)))

    def cache_read(self, stage, scope: str, reader_stages) -> State:
        from aotc.schedule.steps import CacheReadStep

        readers = tuple(self.stage_id(r) for r in reader_stages)
        return self.apply(CacheReadStep(self.stage_id(stage), scope, readers))

    def cache_write(self, stage, scope: str = "local") -> State:
        from aotc.schedule.steps import CacheWriteStep

        return self.apply(CacheWriteStep(self.stage_id(stage), scope))

    def rfactor(self, stage, iter_id: int, factor_iter_id: int) -> State:
        from aotc.schedule.steps import RfactorStep

        return self.apply(RfactorStep(self.stage_id(stage), iter_id, factor_iter_id))
