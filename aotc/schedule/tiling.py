"""Multi-level tiling (Ansor's DoMultiLevelTiling / FollowTiling) as plain state transforms.

Lengths may be None (a sketch); the search fills them later.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from aotc.schedule.state import ComputeAtKind, IterKind, ScheduleError, State


def multi_level_tile(
    state: State,
    stage_id: int,
    structure: str = "SSRSRS",
    lengths: Mapping[str, Sequence[int | None]] | None = None,
) -> tuple[State, list[int]]:
    """Split every iterator of a fresh stage into the levels of `structure` and reorder by it.

    `lengths[iterator name]` gives the inner lengths of that iterator's split (one fewer than its
    number of levels); missing ones are undefined. Returns the new state and the ids of the spatial
    split steps (for `follow_tiling`).
    """
    lengths = lengths or {}
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
        if levels == 1:
            parts.append((kind, [pos]))
            pos += 1
            continue
        if kind == IterKind.SPATIAL:
            spatial_steps.append(len(state.steps))
        state = state.split(stage_id, pos, given)
        parts.append((kind, list(range(pos, pos + levels))))
        pos += levels
    order: list[int] = []
    seen = {IterKind.SPATIAL: 0, IterKind.REDUCE: 0}
    for ch in structure:
        kind = IterKind.SPATIAL if ch == "S" else IterKind.REDUCE
        level = seen[kind]
        seen[kind] += 1
        order.extend(p[level] for k, p in parts if k == kind)
    return state.reorder(stage_id, order), spatial_steps


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
