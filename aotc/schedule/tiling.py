"""Multi-level tiling (Ansor's DoMultiLevelTiling / FollowTiling) as plain state transforms.

Lengths may be None (a sketch); the search fills them later.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from aotc.ir.dot import DotForm, dot_operands, form_error, usable_forms
from aotc.ir.expr import Reduce, TensorRead, Var, free_vars
from aotc.ir.simplify import linear_terms
from aotc.schedule.state import ComputeAtKind, IterKind, ScheduleError, State
from aotc.te.dag import reads_of
from aotc.te.tensor import CONST_INDEX_AXES, NARROW_WEIGHTS, ComputeOp


def multi_level_tile(
    state: State,
    stage_id: int,
    structure: str = "SSRSRS",
    lengths: Mapping[str, Sequence[int | None]] | None = None,
    innermost: Mapping[str, int] | None = None,
) -> tuple[State, list[int]]:
    """Split every iterator of a fresh stage into the levels of `structure` and reorder by it.

    `lengths[iterator name]` gives the inner lengths of that iterator's split (one fewer than its
    number of levels); missing ones are undefined. `innermost[iterator name]` splits one more part of
    that fixed length off the iterator and puts it after all levels (the spatial ones, then the reduce
    ones: a dot product's vector and reduce loops). Returns the new state and the ids of the spatial
    split steps (for `follow_tiling`).
    """
    lengths = lengths or {}
    innermost = innermost or {}
    tail: list[int] = []
    n_s, n_r = structure.count("S"), structure.count("R")
    stage = state.stages[stage_id]
    if stage.compute_at == ComputeAtKind.INLINED:
        raise ScheduleError(f"multi-level tiling: stage {stage.name} is inlined")
    names = [it.name for it in stage.iters]
    kinds = [it.kind for it in stage.iters]
    unknown = sorted(set(lengths) - set(names))
    if unknown:
        raise ScheduleError(f"multi-level tiling: stage {stage.name} has no iterator {', '.join(unknown)}")
    if any(k not in (IterKind.SPATIAL, IterKind.REDUCE) for k in kinds):
        raise ScheduleError(f"multi-level tiling: stage {stage.name} has fused iterators")
    parts: list[tuple[IterKind, list[int]]] = []
    spatial_steps: list[int] = []
    pos = 0
    for name, kind in zip(names, kinds):
        levels = n_s if kind == IterKind.SPATIAL else n_r
        given = list(lengths.get(name, [None] * (levels - 1)))
        if len(given) != levels - 1:
            raise ScheduleError(f"multi-level tiling: {name} needs {levels - 1} lengths, got {len(given)}")
        extra = [innermost[name]] if name in innermost else []
        if levels == 1 and not extra:
            parts.append((kind, [pos]))
            pos += 1
            continue
        if kind == IterKind.SPATIAL:
            spatial_steps.append(len(state.steps))
        state = state.split(stage_id, pos, given + extra)
        parts.append((kind, list(range(pos, pos + levels))))
        tail.extend(range(pos + levels, pos + levels + len(extra)))
        pos += levels + len(extra)
    order: list[int] = []
    seen = {IterKind.SPATIAL: 0, IterKind.REDUCE: 0}
    for ch in structure:
        kind = IterKind.SPATIAL if ch == "S" else IterKind.REDUCE
        level = seen[kind]
        seen[kind] += 1
        order.extend(p[level] for k, p in parts if k == kind)
    return state.reorder(stage_id, order + tail), spatial_steps


@dataclass(frozen=True)
class DotTiling:
    """An op's dot-product tiling: spatial axis `lane` vectorized by `form.lanes`, inside it reduce axis
    `depth` split by `form.depth` and tensorized (positions in the op's `all_axes`)."""

    lane: int
    depth: int
    form: DotForm


def dot_tilings(op, forms: Sequence[DotForm]) -> list[DotTiling]:
    """The dot-product tilings of an op that sums products of two 8-bit values, one per vector width
    among `forms` (the first form of each width that fits the operands; docs/int8.md).

    A conv or dense layer: the lane axis indexes the second factor (the weight) but not the first, whose
    bytes every lane shares (a broadcast); the depth axis is the first factor's last index and indexes the
    weight too, so both read contiguously once the weight is laid out by the tiles. A depthwise conv: the
    lane axis is the first factor's last index (each lane its own channel) and indexes the weight; the
    depth axis is a window axis of both (the taps of a row, padded to the form's depth by
    `pad_depthwise_taps`), the first factor's bytes then gathered per tap. Both extents must divide by
    the form's."""
    if not forms or not isinstance(op, ComputeOp) or not isinstance(op.body, Reduce):
        return []
    if op.body.combiner != "sum" or op.dtype != "int32" or op.body.condition is not None:
        return []
    operands = dot_operands(op.body.source)
    if operands is None:
        return []
    u, w = operands
    if not (isinstance(u.value, TensorRead) and isinstance(w.value, TensorRead)) or not u.value.indices:
        return []
    axes = op.all_axes
    last = u.value.indices[-1]
    w_vars = [i for i in w.value.indices if isinstance(i, Var)]
    u_vars = set().union(*(free_vars(i) for i in u.value.indices))
    depth = next((k for k, a in enumerate(axes) if a.var is last and a.kind != "spatial"), None)
    broadcast = depth is not None and last in w_vars
    if broadcast:
        lanes = [k for k, a in enumerate(op.axes) if a.var in w_vars and a.var not in u_vars]
    else:
        lanes = [k for k, a in enumerate(op.axes) if a.var is last and a.var in w_vars]
        shared = [
            k for k, a in enumerate(axes) if a.kind != "spatial" and a.var in w_vars and a.var in u_vars
        ]
        depth = shared[-1] if shared else None
    if not lanes or depth is None:
        return []
    lane = lanes[-1]
    out: dict[int, DotTiling] = {}
    for form in usable_forms(forms, bool(op.attrs.get(NARROW_WEIGHTS))):
        if form.lanes in out or form_error(u, w, form, form.lanes, form.depth, ""):
            continue
        if form.halves and not broadcast:
            # A depthwise conv's first factor is gathered tap by tap, so widening it is no extra shuffle,
            # while the halves' shifts are (MobileNetV2's depthwise convs on znver3: 1.1-1.2x slower).
            continue
        if axes[lane].extent % form.lanes or axes[depth].extent % form.depth:
            continue
        out[form.lanes] = DotTiling(lane, depth, form)
    return list(out.values())


def dot_tile(
    state: State,
    stage_id: int,
    structure: str,
    dot: DotTiling,
    lengths: Mapping[str, Sequence[int | None]] | None = None,
) -> tuple[State, list[int]]:
    """`multi_level_tile` with the dot product innermost: the lane axis's last part (`form.lanes`)
    vectorized and, inside it, the depth axis's last part (`form.depth`) tensorized."""
    iters = state.stages[stage_id].iters
    inner = {iters[dot.lane].name: dot.form.lanes, iters[dot.depth].name: dot.form.depth}
    s, spatial = multi_level_tile(state, stage_id, structure, lengths, innermost=inner)
    n = len(s.stages[stage_id].iters)
    return s.vectorize(stage_id, n - 2).tensorize(stage_id, n - 1), spatial


def follow_tiling(
    state: State, stage_id: int, split_step_ids: Sequence[int], n_split: int
) -> tuple[State, int]:
    """Split the spatial iterators of a consumer like its producer's first levels.

    Each axis gets `n_split` + 1 parts, ordered level-major; returns the state and the position
    of the last iterator of level `n_split - 1` (where the producer is computed at).
    """
    stage = state.stages[stage_id]
    n_axes = len(split_step_ids)
    if len(stage.iters) < n_axes or any(it.kind != IterKind.SPATIAL for it in stage.iters[:n_axes]):
        raise ScheduleError(f"follow tiling: stage {stage.name} lacks {n_axes} leading spatial iterators")
    pos = 0
    for sid in split_step_ids:
        state = state.follow_split(stage_id, pos, sid, n_split)
        pos += n_split + 1
    rest = list(range(pos, len(state.stages[stage_id].iters)))
    order = [a * (n_split + 1) + level for level in range(n_split + 1) for a in range(n_axes)] + rest
    state = state.reorder(stage_id, order)
    return state, n_split * n_axes - 1


def unroll_const_indices(
    state: State, stage_id: int, vector_axis: int | None = None, vector_length: int | None = None
) -> tuple[State, int]:
    """Ansor's SimplifyComputeWithConstTensor for a stage whose op names `const_index_axes`: ((axis
    position, period), ...) of the axes its coefficients depend on (a period q > 1: on axis % q).

    A periodic axis is split by its period; the axes of period 1 and the inner parts are unrolled and
    moved inside the other iterators. `vector_axis` (an original axis position; default the last free
    one) goes innermost, split by `vector_length` (None: left for the search to fill) with its outer
    part outside the unrolled loops. Returns the state and the number of iterators outside those.
    """
    stage = state.stages[stage_id]
    consts = dict(stage.op.attrs.get(CONST_INDEX_AXES, ()))
    if not consts or any(it.kind != IterKind.SPATIAL for it in stage.iters):
        raise ScheduleError(f"stage {stage.name} has no constant-indexed axes to unroll, or is already tiled")
    origin = list(range(len(stage.iters)))  # original axis position of each iterator
    is_const = [False] * len(stage.iters)
    for pos in sorted(consts, reverse=True):
        if consts[pos] > 1:
            state = state.split(stage_id, pos, [consts[pos]])
            origin[pos : pos + 1] = [pos, pos]
            is_const[pos : pos + 1] = [False, True]
        else:
            is_const[pos] = True
    free = [i for i, c in enumerate(is_const) if not c]
    inner = [i for i, c in enumerate(is_const) if c]
    periodic = {p for p, q in consts.items() if q > 1}
    candidates = [i for i in free if origin[i] == vector_axis and origin[i] not in periodic]
    vec = candidates[0] if candidates else free[-1]
    state = state.reorder(stage_id, [i for i in free if i != vec] + inner + [vec])
    n_outer, last = len(free) - 1, len(stage.iters) - 1 + len(periodic)
    if (state.stages[stage_id].iters[last].extent or 1) > (vector_length or 1):
        state = state.split(stage_id, last, [vector_length])
        state = state.reorder(stage_id, [*range(n_outer), last, *range(n_outer, last), last + 1])
        n_outer += 1
    for pos in range(n_outer, n_outer + len(inner)):
        state = state.unroll(stage_id, pos)
    return state, n_outer


def reads_contiguously(op: ComputeOp, var) -> bool:
    """Every read of `op` either ignores `var` or uses it with stride 1 in its last dimension."""
    for read in reads_of(op):
        for d, idx in enumerate(read.indices):
            if var not in free_vars(idx):
                continue
            terms, _ = linear_terms(idx)
            if d != len(read.indices) - 1 or terms.pop(var, 0) != 1:
                return False
            if any(var in free_vars(atom) for atom in terms):
                return False
    return True


def contiguous_axis(op: ComputeOp) -> int | None:
    """The last axis that some read indexes and every read reads with stride 1, if any."""
    for i in range(len(op.axes) - 1, -1, -1):
        var = op.axes[i].var
        used = any(var in free_vars(idx) for r in reads_of(op) for idx in r.indices)
        if used and op.axes[i].extent > 1 and reads_contiguously(op, var):
            return i
    return None


def const_index_vector_axes(op: ComputeOp) -> list[int]:
    """Vector axis candidates of a constant-indexed stage, best first: the contiguously read axis and the
    last axis the coefficients do not depend on."""
    consts = dict(op.attrs[CONST_INDEX_AXES])
    free = [i for i in range(len(op.axes)) if i not in consts]
    return list(dict.fromkeys(a for a in (contiguous_axis(op), free[-1]) if a in free))
