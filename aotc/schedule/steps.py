"""The transform steps (docs/loop-ir.md#transform-steps): apply-to-state and their JSON record form."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar

from aotc.ir.expr import (
    Expr,
    Reduce,
    TensorRead,
    Var,
    logical_and,
    substitute,
    transform,
)
from aotc.schedule.state import (
    Annotation,
    ComputeAtKind,
    FuseRel,
    Iterator,
    IterKind,
    ScheduleError,
    SplitRel,
    Stage,
    State,
    initial_stage,
    iterator_values,
    overflowing_splits,
    propagate_extents,
    split_extents,
)
from aotc.te.dag import read_tensors
from aotc.te.tensor import ComputeOp, IterVar, Operation


class Step:
    tag: ClassVar[str]
    stage_id: int

    def apply_to(self, state: State) -> State:
        raise NotImplementedError

    def to_record(self) -> list:
        raise NotImplementedError

    def describe(self) -> str:
        return f"{self.tag}{tuple(self.to_record()[1:])}"


def _stage(state: State, step: Step) -> Stage:
    if not 0 <= step.stage_id < len(state.stages):
        raise ScheduleError(
            f"{step.describe()}: stage {step.stage_id} out of range ({len(state.stages)} stages)"
        )
    st = state.stages[step.stage_id]
    if st.is_placeholder:
        raise ScheduleError(f"{step.describe()}: stage {step.stage_id} ({st.name}) is a placeholder")
    return st


def _iter(stage: Stage, iter_id: int, step: Step) -> Iterator:
    if not 0 <= iter_id < len(stage.iters):
        raise ScheduleError(
            f"{step.describe()}: iterator {iter_id} out of range (stage {stage.name} has {len(stage.iters)})"
        )
    return stage.iters[iter_id]


def _move_attachments(state: State, stage_id: int, old_uids: set[int], new_uid: int) -> State:
    stages = list(state.stages)
    for i, st in enumerate(stages):
        if st.attach is not None and st.attach[0] == stage_id and st.attach[1] in old_uids:
            stages[i] = replace(st, attach=(stage_id, new_uid))
    return replace(state, stages=tuple(stages))


@dataclass(frozen=True)
class AnnotationStep(Step):
    tag: ClassVar[str] = "AN"
    stage_id: int
    iter_id: int
    annotation: Annotation

    def apply_to(self, state: State) -> State:
        st = _stage(state, self)
        it = _iter(st, self.iter_id, self)
        ann = Annotation(self.annotation)
        if ann in (Annotation.PARALLEL, Annotation.VECTORIZE) and it.kind != IterKind.SPATIAL:
            raise ScheduleError(
                f"{self.describe()}: cannot {ann.name.lower()} {it.kind.name.lower()} iterator {it.name}"
            )
        if it.annotation != Annotation.NONE and ann != Annotation.NONE:
            raise ScheduleError(
                f"{self.describe()}: iterator {it.name} is already annotated {it.annotation.name}"
            )
        iters = list(st.iters)
        iters[self.iter_id] = replace(it, annotation=ann)
        return state.with_stage(self.stage_id, replace(st, iters=tuple(iters)))

    def to_record(self) -> list:
        return [self.tag, self.stage_id, self.iter_id, int(self.annotation)]


@dataclass(frozen=True)
class FuseStep(Step):
    tag: ClassVar[str] = "FU"
    stage_id: int
    fused_ids: tuple[int, ...]

    def apply_to(self, state: State) -> State:
        st = _stage(state, self)
        ids = list(self.fused_ids)
        if not ids:
            raise ScheduleError(f"{self.describe()}: nothing to fuse")
        for i in ids:
            _iter(st, i, self)
        if ids != list(range(ids[0], ids[0] + len(ids))):
            raise ScheduleError(f"{self.describe()}: only consecutive iterators can be fused")
        parts = [st.iters[i] for i in ids]
        if any(p.annotation != Annotation.NONE for p in parts):
            raise ScheduleError(f"{self.describe()}: cannot fuse annotated iterators")
        kinds = {p.kind for p in parts}
        kind = kinds.pop() if len(kinds) == 1 else IterKind.MIXED
        extents = [p.extent for p in parts]
        extent = None if any(e is None for e in extents) else math.prod(extents)  # type: ignore[arg-type]
        uid = st.next_uid
        fused = Iterator(uid, "@".join(p.name for p in parts), extent, kind)
        if len(parts) == 1:
            return state
        iters = st.iters[: ids[0]] + (fused,) + st.iters[ids[-1] + 1 :]
        rel = FuseRel(tuple(p.uid for p in parts), uid)
        new = state.with_stage(
            self.stage_id, replace(st, iters=iters, relations=st.relations + (rel,), next_uid=uid + 1)
        )
        return _move_attachments(new, self.stage_id, {p.uid for p in parts}, uid)

    def to_record(self) -> list:
        return [self.tag, self.stage_id, list(self.fused_ids)]


@dataclass(frozen=True)
class PragmaStep(Step):
    tag: ClassVar[str] = "PR"
    stage_id: int
    iter_id: int
    pragma: str

    def apply_to(self, state: State) -> State:
        st = _stage(state, self)
        _iter(st, self.iter_id, self)
        if self.pragma.startswith("auto_unroll_max_step"):
            _, _, value = self.pragma.partition("$")
            if not value.isdigit():
                raise ScheduleError(f"{self.describe()}: expected auto_unroll_max_step$N")
            return state.with_stage(self.stage_id, replace(st, auto_unroll_max_step=int(value)))
        return state.with_stage(self.stage_id, replace(st, pragmas=st.pragmas + (self.pragma,)))

    def to_record(self) -> list:
        return [self.tag, self.stage_id, self.iter_id, self.pragma]


@dataclass(frozen=True)
class ReorderStep(Step):
    tag: ClassVar[str] = "RE"
    stage_id: int
    after_ids: tuple[int, ...]

    def apply_to(self, state: State) -> State:
        st = _stage(state, self)
        if sorted(self.after_ids) != list(range(len(st.iters))):
            raise ScheduleError(
                f"{self.describe()}: order must be a permutation of 0..{len(st.iters) - 1} (stage {st.name})"
            )
        return state.with_stage(self.stage_id, replace(st, iters=tuple(st.iters[i] for i in self.after_ids)))

    def to_record(self) -> list:
        return [self.tag, self.stage_id, list(self.after_ids)]


def _apply_split(
    state: State, step: Step, iter_id: int, lengths: tuple[int | None, ...], inner_to_outer: bool
) -> State:
    st = _stage(state, step)
    it = _iter(st, iter_id, step)
    if not lengths:
        raise ScheduleError(f"{step.describe()}: a split needs at least one length")
    for v in lengths:
        if v is not None and (not isinstance(v, int) or v < 1):
            raise ScheduleError(f"{step.describe()}: split lengths must be positive integers, got {v!r}")
    if it.annotation != Annotation.NONE:
        raise ScheduleError(f"{step.describe()}: cannot split annotated iterator {it.name}")
    extents = split_extents(it.extent, lengths, inner_to_outer)
    uid0 = st.next_uid
    children = tuple(Iterator(uid0 + k, f"{it.name}.{k}", e, it.kind) for k, e in enumerate(extents))
    iters = st.iters[:iter_id] + children + st.iters[iter_id + 1 :]
    rel = SplitRel(it.uid, tuple(c.uid for c in children), tuple(lengths), inner_to_outer)
    new = state.with_stage(
        step.stage_id,
        replace(st, iters=iters, relations=st.relations + (rel,), next_uid=uid0 + len(children)),
    )
    return _move_attachments(new, step.stage_id, {it.uid}, children[-1].uid)


@dataclass(frozen=True)
class SplitStep(Step):
    tag: ClassVar[str] = "SP"
    stage_id: int
    iter_id: int
    extent: int | None
    lengths: tuple[int | None, ...]
    inner_to_outer: bool = True

    def apply_to(self, state: State) -> State:
        return _apply_split(state, self, self.iter_id, tuple(self.lengths), self.inner_to_outer)

    def to_record(self) -> list:
        return [
            self.tag,
            self.stage_id,
            self.iter_id,
            0 if self.extent is None else self.extent,
            list(self.lengths),
            int(self.inner_to_outer),
        ]


def _split_step_at(state: State, step: Step, src_step_id: int) -> SplitStep:
    if not 0 <= src_step_id < len(state.steps) or not isinstance(state.steps[src_step_id], SplitStep):
        raise ScheduleError(f"{step.describe()}: step {src_step_id} is not a split step")
    return state.steps[src_step_id]


@dataclass(frozen=True)
class FollowSplitStep(Step):
    tag: ClassVar[str] = "FSP"
    stage_id: int
    iter_id: int
    src_step_id: int
    n_split: int

    def lengths(self, state: State) -> tuple[int | None, ...]:
        src = _split_step_at(state, self, self.src_step_id)
        if not 1 <= self.n_split <= len(src.lengths) + 1:
            raise ScheduleError(
                f"{self.describe()}: n_split {self.n_split} does not fit step {self.src_step_id}"
            )
        head = list(src.lengths[: self.n_split - 1])
        rest = src.lengths[self.n_split - 1 :]
        head.append(None if any(v is None for v in rest) else math.prod(rest))  # type: ignore[arg-type]
        return tuple(head)

    def apply_to(self, state: State) -> State:
        return _apply_split(state, self, self.iter_id, self.lengths(state), True)

    def to_record(self) -> list:
        return [self.tag, self.stage_id, self.iter_id, self.src_step_id, self.n_split]


@dataclass(frozen=True)
class FollowFusedSplitStep(Step):
    tag: ClassVar[str] = "FFSP"
    stage_id: int
    iter_id: int
    src_step_ids: tuple[int, ...]
    level: int
    factor_or_nparts: bool

    def length(self, state: State) -> int | None:
        total = 1
        for sid in self.src_step_ids:
            src = _split_step_at(state, self, sid)
            if not 0 <= self.level < len(src.lengths):
                raise ScheduleError(f"{self.describe()}: level {self.level} out of range for step {sid}")
            v = src.lengths[self.level]
            if v is None:
                return None
            total *= v
        return total

    def apply_to(self, state: State) -> State:
        return _apply_split(state, self, self.iter_id, (self.length(state),), self.factor_or_nparts)

    def to_record(self) -> list:
        return [
            self.tag,
            self.stage_id,
            self.iter_id,
            list(self.src_step_ids),
            self.level,
            int(self.factor_or_nparts),
        ]


@dataclass(frozen=True)
class StorageAlignStep(Step):
    tag: ClassVar[str] = "SA"
    stage_id: int
    iter_id: int
    factor: int
    offset: int

    def apply_to(self, state: State) -> State:
        st = _stage(state, self)
        it = _iter(st, self.iter_id, self)
        n_axes = len(st.op.axes)  # type: ignore[attr-defined]
        if it.uid >= n_axes:
            raise ScheduleError(
                f"{self.describe()}: storage_align needs an untransformed spatial axis of {st.name}"
            )
        if self.factor < 1 or not 0 <= self.offset < self.factor:
            raise ScheduleError(f"{self.describe()}: need factor >= 1 and 0 <= offset < factor")
        align = st.storage_align + ((it.uid, self.factor, self.offset),)
        return state.with_stage(self.stage_id, replace(st, storage_align=align))

    def to_record(self) -> list:
        return [self.tag, self.stage_id, self.iter_id, self.factor, self.offset]


def effective_consumers(state: State, stage_id: int) -> list[int]:
    """Stages that read stage `stage_id`, looking through inlined stages."""
    op = state.stages[stage_id].op
    readers = _readers(state)
    out: list[int] = []
    stack = list(readers.get(op, []))
    while stack:
        sid = stack.pop(0)
        st = state.stages[sid]
        if st.compute_at == ComputeAtKind.INLINED:
            stack.extend(readers.get(st.op, []))
        elif sid not in out:
            out.append(sid)
    return out


def _readers(state: State) -> dict[Operation, list[int]]:
    readers: dict[Operation, list[int]] = {}
    for i, st in enumerate(state.stages):
        if isinstance(st.op, ComputeOp):
            for tensor in read_tensors(st.op):
                readers.setdefault(tensor, []).append(i)
    return readers


@dataclass(frozen=True)
class ComputeAtStep(Step):
    tag: ClassVar[str] = "CA"
    stage_id: int
    target_stage_id: int
    target_iter_id: int

    def apply_to(self, state: State) -> State:
        st = _stage(state, self)
        if not 0 <= self.target_stage_id < len(state.stages):
            raise ScheduleError(f"{self.describe()}: target stage {self.target_stage_id} out of range")
        target = state.stages[self.target_stage_id]
        it = _iter(target, self.target_iter_id, self)
        if st.op in state.outputs:
            raise ScheduleError(f"{self.describe()}: output stage {st.name} must stay at root")
        consumers = effective_consumers(state, self.stage_id)
        if self.target_stage_id not in consumers and not (
            consumers
            and all(_runs_inside(state, c, self.target_stage_id, self.target_iter_id) for c in consumers)
        ):
            raise ScheduleError(
                f"{self.describe()}: {target.name} is not a consumer of {st.name}, nor do its consumers "
                f"run inside that loop"
            )
        if target.compute_at == ComputeAtKind.INLINED:
            raise ScheduleError(f"{self.describe()}: target {target.name} is inlined")
        iters = tuple(replace(i, extent=None) for i in st.iters)
        new = replace(st, iters=iters, compute_at=ComputeAtKind.ITER, attach=(self.target_stage_id, it.uid))
        return state.with_stage(self.stage_id, new)

    def to_record(self) -> list:
        return [self.tag, self.stage_id, self.target_stage_id, self.target_iter_id]


def _runs_inside(state: State, stage_id: int, target_id: int, target_pos: int) -> bool:
    """Stage `stage_id` is computed inside loop `target_pos` of `target_id`, directly or through the
    stages it is computed at (a conv's padded input computed per outer tile of the stage that holds the
    conv's cache_write)."""
    st = state.stages[stage_id]
    while st.compute_at == ComputeAtKind.ITER and st.attach is not None:
        tid, uid = st.attach
        if tid == target_id:
            return state.stages[tid].position(uid) >= target_pos
        st = state.stages[tid]
    return False


def _check_nothing_attached(state: State, stage_id: int, step: Step) -> None:
    for st in state.stages:
        if st.attach is not None and st.attach[0] == stage_id:
            raise ScheduleError(
                f"{step.describe()}: stage {st.name} is computed at {state.stages[stage_id].name}"
            )


@dataclass(frozen=True)
class ComputeInlineStep(Step):
    tag: ClassVar[str] = "CI"
    stage_id: int

    def apply_to(self, state: State) -> State:
        st = _stage(state, self)
        if st.op in state.outputs:
            raise ScheduleError(f"{self.describe()}: cannot inline output stage {st.name}")
        if st.op.reduce_axes:  # type: ignore[attr-defined]
            raise ScheduleError(f"{self.describe()}: cannot inline reduction stage {st.name}")
        _check_nothing_attached(state, self.stage_id, self)
        return state.with_stage(self.stage_id, replace(st, compute_at=ComputeAtKind.INLINED, attach=None))

    def to_record(self) -> list:
        return [self.tag, self.stage_id]


@dataclass(frozen=True)
class ComputeRootStep(Step):
    tag: ClassVar[str] = "CR"
    stage_id: int

    def apply_to(self, state: State) -> State:
        st = _stage(state, self)
        roots = {uid: ext for uid, _, ext, _ in st.root_iters}
        ext = propagate_extents(st, roots)
        iters = tuple(replace(i, extent=ext.get(i.uid)) for i in st.iters)
        return state.with_stage(
            self.stage_id, replace(st, iters=iters, compute_at=ComputeAtKind.ROOT, attach=None)
        )

    def to_record(self) -> list:
        return [self.tag, self.stage_id]


def _insert_stage(state: State, at: int, stage: Stage) -> State:
    """Insert `stage` at index `at`, shifting attach targets at or after it."""
    stages = []
    for st in state.stages:
        if st.attach is not None and st.attach[0] >= at:
            st = replace(st, attach=(st.attach[0] + 1, st.attach[1]))
        stages.append(st)
    stages.insert(at, stage)
    return replace(state, stages=tuple(stages))


def _rewrite_reads(op: ComputeOp, mapping: dict[Operation, Operation]) -> ComputeOp:
    def visit(node: Expr):
        if isinstance(node, TensorRead) and node.tensor in mapping:
            return TensorRead(mapping[node.tensor], node.indices)
        return None

    return replace(op, body=transform(op.body, visit))


def _replace_dataflow(state: State, mapping: dict[Operation, Operation]) -> State:
    """Make every stage read the replacement ops; rewritten readers cascade to their own readers."""
    mapping = dict(mapping)
    replaced = set(mapping.values())
    stages = list(state.stages)
    for i, st in enumerate(stages):
        if not isinstance(st.op, ComputeOp) or st.op in replaced:
            continue
        if not any(t in mapping for t in read_tensors(st.op)):
            continue
        new_op = _rewrite_reads(st.op, mapping)
        mapping[st.op] = new_op
        stages[i] = replace(st, op=new_op)
    outputs = tuple(mapping.get(o, o) for o in state.outputs)
    return replace(state, stages=tuple(stages), outputs=outputs)


def _copy_compute(op: ComputeOp, name: str, body_map=None) -> ComputeOp:
    """A fresh op with new axis variables computing the same values as `op`."""
    new_axes = tuple(IterVar(Var(a.name), a.extent, a.kind) for a in op.axes)
    new_red = tuple(IterVar(Var(a.name), a.extent, a.kind) for a in op.reduce_axes)
    vmap = {a.var: b.var for a, b in zip(op.all_axes, new_axes + new_red)}
    body = substitute(op.body, vmap)
    if isinstance(body, Reduce):
        body = Reduce(body.combiner, body.source, new_red, body.condition)
    return ComputeOp(name, new_axes, new_red, body, op.tag, dict(op.attrs))


def _identity_compute(src: Operation, name: str, tag: str = "") -> ComputeOp:
    axes = tuple(IterVar(Var(f"ax{i}"), e, "spatial") for i, e in enumerate(src.shape))
    return ComputeOp(name, axes, (), src[tuple(a.var for a in axes)], tag)


@dataclass(frozen=True)
class CacheReadStep(Step):
    tag: ClassVar[str] = "CHR"
    stage_id: int
    scope_name: str
    reader_stage_ids: tuple[int, ...]

    def apply_to(self, state: State) -> State:
        if not 0 <= self.stage_id < len(state.stages):
            raise ScheduleError(f"{self.describe()}: stage {self.stage_id} out of range")
        src = state.stages[self.stage_id].op
        readers = _readers(state).get(src, [])
        for r in self.reader_stage_ids:
            if r not in readers:
                raise ScheduleError(f"{self.describe()}: stage {r} does not read {src.name}")
        cache = _identity_compute(src, f"{src.name}.{self.scope_name}", "cache_read")
        at = self.stage_id + 1
        new = _insert_stage(state, at, initial_stage(cache))
        mapping: dict[Operation, Operation] = {}
        stages = list(new.stages)
        for r in self.reader_stage_ids:
            rid = r + 1 if r >= at else r
            reader = stages[rid]
            new_op = _rewrite_reads(reader.op, {src: cache})
            mapping[reader.op] = new_op
            stages[rid] = replace(reader, op=new_op)
        return _replace_dataflow(replace(new, stages=tuple(stages)), mapping)

    def to_record(self) -> list:
        return [self.tag, self.stage_id, self.scope_name, list(self.reader_stage_ids)]


@dataclass(frozen=True)
class CacheWriteStep(Step):
    tag: ClassVar[str] = "CHW"
    stage_id: int
    scope_name: str

    def apply_to(self, state: State) -> State:
        st = _stage(state, self)
        _check_nothing_attached(state, self.stage_id, self)
        op = st.op
        assert isinstance(op, ComputeOp)
        cache = _copy_compute(op, f"{op.name}.{self.scope_name}")
        copy = _identity_compute(cache, op.name, op.tag)
        copy = replace(copy, attrs=dict(op.attrs))
        new = _insert_stage(state, self.stage_id, initial_stage(cache))
        new = new.with_stage(
            self.stage_id + 1, replace(initial_stage(copy), compute_at=st.compute_at, attach=st.attach)
        )
        new = _replace_dataflow(new, {op: copy})
        return new

    def to_record(self) -> list:
        return [self.tag, self.stage_id, self.scope_name]


@dataclass(frozen=True)
class RfactorStep(Step):
    tag: ClassVar[str] = "RF"
    stage_id: int
    iter_id: int
    factor_iter_id: int

    def apply_to(self, state: State) -> State:
        st = _stage(state, self)
        op = st.op
        assert isinstance(op, ComputeOp)
        it = _iter(st, self.iter_id, self)
        if not isinstance(op.body, Reduce) or it.kind != IterKind.REDUCE:
            raise ScheduleError(f"{self.describe()}: {it.name} is not a reduction iterator of {st.name}")
        _check_nothing_attached(state, self.stage_id, self)
        n_sp = len(op.axes)
        for i in st.iters:
            if i.kind == IterKind.SPATIAL and i.uid >= n_sp:
                raise ScheduleError(f"{self.describe()}: rfactor needs untransformed spatial iterators")
        if not 0 <= self.factor_iter_id <= n_sp:
            raise ScheduleError(f"{self.describe()}: factor_iter_id must be in 0..{n_sp}")
        roots = {uid: ext for uid, _, ext, _ in st.root_iters}
        ext = propagate_extents(st, roots)
        reduce_leaves = [i for i in st.iters if i.kind == IterKind.REDUCE]
        if any(i.kind == IterKind.MIXED for i in st.iters):
            raise ScheduleError(
                f"{self.describe()}: cannot rfactor a stage with fused spatial+reduce iterators"
            )
        factor_iv = IterVar(Var(it.name.replace(".", "_") + "_rf"), _known(ext[it.uid], self), "spatial")
        other = [
            IterVar(Var(i.name.replace(".", "_")), _known(ext[i.uid], self), "reduce")
            for i in reduce_leaves
            if i is not it
        ]
        leaf_vars: dict[int, Expr] = {it.uid: factor_iv.var}
        for i, iv in zip([i for i in reduce_leaves if i is not it], other):
            leaf_vars[i.uid] = iv.var
        spatial_axes = tuple(IterVar(Var(a.name), a.extent, "spatial") for a in op.axes)
        for k, a in enumerate(spatial_axes):
            leaf_vars[k] = a.var
        values = iterator_values(st, leaf_vars, ext)
        vmap = {a.var: values[k] for k, a in enumerate(op.all_axes)}
        red = op.body
        conds = [] if red.condition is None else [substitute(red.condition, vmap)]
        conds += [values[uid] < ext[uid] for uid in overflowing_splits(st, ext)]
        source = substitute(red.source, vmap)
        rf_axes = spatial_axes[: self.factor_iter_id] + (factor_iv,) + spatial_axes[self.factor_iter_id :]
        cond = logical_and(*conds) if conds else None
        if other:
            rf_body: Expr = Reduce(red.combiner, source, tuple(other), cond)
        else:
            from aotc.ir.expr import reduce_identity, select

            rf_body = (
                source if cond is None else select(cond, source, reduce_identity(red.combiner, source.dtype))
            )
        rf_op = ComputeOp(f"{op.name}.rf", rf_axes, tuple(other), rf_body, op.tag, dict(op.attrs))
        final_axes = tuple(IterVar(Var(a.name), a.extent, "spatial") for a in op.axes)
        r = IterVar(Var(factor_iv.name), factor_iv.extent, "reduce")
        idx = [a.var for a in final_axes]
        idx.insert(self.factor_iter_id, r.var)
        final = ComputeOp(
            op.name, final_axes, (r,), Reduce(red.combiner, rf_op[tuple(idx)], (r,)), op.tag, dict(op.attrs)
        )
        new = _insert_stage(state, self.stage_id, initial_stage(rf_op))
        new = new.with_stage(
            self.stage_id + 1, replace(initial_stage(final), compute_at=st.compute_at, attach=st.attach)
        )
        return _replace_dataflow(new, {op: final})

    def to_record(self) -> list:
        return [self.tag, self.stage_id, self.iter_id, self.factor_iter_id]


def _known(extent: int | None, step: Step) -> int:
    if extent is None:
        raise ScheduleError(f"{step.describe()}: iterator extents must be defined")
    return extent


STEP_TYPES: dict[str, type[Step]] = {
    cls.tag: cls
    for cls in (
        AnnotationStep,
        FuseStep,
        PragmaStep,
        ReorderStep,
        SplitStep,
        FollowSplitStep,
        FollowFusedSplitStep,
        StorageAlignStep,
        ComputeAtStep,
        ComputeInlineStep,
        ComputeRootStep,
        CacheReadStep,
        CacheWriteStep,
        RfactorStep,
    )
}


def step_from_record(rec: list) -> Step:
    """Inverse of `Step.to_record`; raises ScheduleError on malformed input."""
    if not isinstance(rec, list) or not rec or rec[0] not in STEP_TYPES:
        raise ScheduleError(f"not a step record: {rec!r}")
    tag, args = rec[0], rec[1:]
    try:
        if tag == "AN":
            return AnnotationStep(int(args[0]), int(args[1]), Annotation(int(args[2])))
        if tag == "FU":
            return FuseStep(int(args[0]), tuple(int(v) for v in args[1]))
        if tag == "PR":
            return PragmaStep(int(args[0]), int(args[1]), str(args[2]))
        if tag == "RE":
            return ReorderStep(int(args[0]), tuple(int(v) for v in args[1]))
        if tag == "SP":
            lengths = tuple(None if v is None else int(v) for v in args[3])
            extent = int(args[2]) or None
            return SplitStep(int(args[0]), int(args[1]), extent, lengths, bool(args[4]))
        if tag == "FSP":
            return FollowSplitStep(int(args[0]), int(args[1]), int(args[2]), int(args[3]))
        if tag == "FFSP":
            return FollowFusedSplitStep(
                int(args[0]), int(args[1]), tuple(int(v) for v in args[2]), int(args[3]), bool(args[4])
            )
        if tag == "SA":
            return StorageAlignStep(int(args[0]), int(args[1]), int(args[2]), int(args[3]))
        if tag == "CA":
            return ComputeAtStep(int(args[0]), int(args[1]), int(args[2]))
        if tag == "CI":
            return ComputeInlineStep(int(args[0]))
        if tag == "CR":
            return ComputeRootStep(int(args[0]))
        if tag == "CHR":
            return CacheReadStep(int(args[0]), str(args[1]), tuple(int(v) for v in args[2]))
        if tag == "CHW":
            return CacheWriteStep(int(args[0]), str(args[1]))
        return RfactorStep(int(args[0]), int(args[1]), int(args[2]))
    except (IndexError, TypeError, ValueError) as err:
        raise ScheduleError(f"malformed {tag} step record {rec!r}: {err}") from None


def replay(dag, steps) -> State:
    """Rebuild a state by applying `steps` to the DAG's initial state."""
    state = State.initial(dag)
    for step in steps:
        state = state.apply(step)
    return state


def steps_to_json(steps) -> list:
    return [s.to_record() for s in steps]


def steps_from_json(records: list) -> list[Step]:
    if not isinstance(records, list):
        raise ScheduleError(f"expected a list of step records, got {type(records).__name__}")
    return [step_from_record(r) for r in records]
