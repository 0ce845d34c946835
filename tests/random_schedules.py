"""Random valid schedules of a DAG, for property tests (seeded, so a failure replays)."""

from __future__ import annotations

import random

from aotc.schedule.lower import infer_bound
from aotc.schedule.state import Annotation, ComputeAtKind, IterKind, State
from aotc.schedule.steps import effective_consumers
from aotc.te.tensor import ComputeOp


def random_state(dag, seed: int) -> State:
    rng = random.Random(seed)
    s = State.initial(dag)
    if rng.random() < 0.3:
        s = _random_cache_read(s, rng)
    for sid in reversed(range(len(s.stages))):
        st = s.stages[sid]
        if not isinstance(st.op, ComputeOp) or not st.op.reduce_axes:
            continue
        r = rng.random()
        if r < 0.25:
            s = s.cache_write(sid)
        elif r < 0.5:
            s = _random_rfactor(s, sid, rng)
    for sid in reversed(range(len(s.stages))):
        st = s.stages[sid]
        if st.is_placeholder:
            continue
        s = _random_location(s, sid, rng)
        if s.stages[sid].compute_at == ComputeAtKind.INLINED:
            continue
        n_axes = len(s.stages[sid].op.axes)
        if n_axes > 1 and s.stages[sid].op not in s.outputs and rng.random() < 0.3:
            axis = rng.randrange(n_axes - 1)
            factor = rng.choice([2, 4, 16])
            s = s.storage_align(sid, axis, factor, rng.randrange(factor))
        s = _random_loops(s, sid, rng)
    return s


def _random_cache_read(s: State, rng: random.Random) -> State:
    readers = {i: effective_consumers(s, i) for i in range(len(s.stages))}
    readers = {i: r for i, r in readers.items() if r}
    if not readers:
        return s
    sid = rng.choice(sorted(readers))
    return s.cache_read(sid, "local", [rng.choice(readers[sid])])


def _random_rfactor(s: State, sid: int, rng: random.Random) -> State:
    st = s.stages[sid]
    red = [i for i, it in enumerate(st.iters) if it.kind == IterKind.REDUCE]
    if len(red) > 1:
        s = s.fuse(sid, red)
    pos = red[0]
    extent = s.stages[sid].iters[pos].extent
    s = s.split(sid, pos, [rng.randint(1, max(1, extent))])
    n_sp = len(st.op.axes)
    return s.rfactor(sid, pos + rng.randint(0, 1), rng.randint(0, n_sp))


def _attach_chain_has(s: State, sid: int, kinds: set[Annotation]) -> bool:
    """True if stage `sid` would run inside a loop annotated with one of `kinds`."""
    st = s.stages[sid]
    while st.attach is not None:
        tid, uid = st.attach
        target = s.stages[tid]
        pos = target.position(uid)
        if any(it.annotation in kinds for it in target.iters[: pos + 1]):
            return True
        st = target
    return False


def _random_location(s: State, sid: int, rng: random.Random) -> State:
    st = s.stages[sid]
    op = st.op
    if op in s.outputs:
        return s
    r = rng.random()
    if r < 0.3 and not op.reduce_axes and not any(x.attach and x.attach[0] == sid for x in s.stages):
        return s.compute_inline(sid)
    if r < 0.7:
        consumers = effective_consumers(s, sid)
        if len(consumers) == 1:
            cid = consumers[0]
            target = s.stages[cid]
            limit = len(target.iters)
            for p, it in enumerate(target.iters):
                if it.annotation == Annotation.VECTORIZE:
                    limit = p
                    break
            if limit and not _attach_chain_has(s, cid, {Annotation.VECTORIZE}):
                outer = target.attach if target.compute_at == ComputeAtKind.ITER else None
                if outer is not None and rng.random() < 0.5:
                    # an outer loop of the stage the consumer is computed at: the consumer runs inside it
                    tid, uid = outer
                    return s.compute_at(sid, tid, rng.randrange(s.stages[tid].position(uid) + 1))
                return s.compute_at(sid, cid, rng.randrange(limit))
    return s


def _random_loops(s: State, sid: int, rng: random.Random) -> State:
    op = s.stages[sid].op
    base_extents = [a.extent for a in op.all_axes]
    for _ in range(rng.randint(0, 3)):
        st = s.stages[sid]
        pos = rng.randrange(len(st.iters))
        it = st.iters[pos]
        guess = it.extent or base_extents[min(it.uid, len(base_extents) - 1)]
        n = rng.choice([1, 1, 2])
        lengths = [rng.randint(1, max(1, min(guess, 16))) for _ in range(n)]
        s = s.split(sid, pos, lengths, inner_to_outer=rng.random() < 0.8)
    st = s.stages[sid]
    if rng.random() < 0.5:
        order = list(range(len(st.iters)))
        rng.shuffle(order)
        s = s.reorder(sid, order)
    st = s.stages[sid]
    if len(st.iters) > 1 and rng.random() < 0.3:
        p = rng.randrange(len(st.iters) - 1)
        s = s.fuse(sid, [p, p + 1])
    st = s.stages[sid]
    is_root = st.compute_at == ComputeAtKind.ROOT
    if is_root and st.iters[0].kind == IterKind.SPATIAL and rng.random() < 0.5:
        s = s.parallel(sid, 0)
    st = infer_bound(s).stages[sid]
    last = st.iters[-1]
    inside_vector = _attach_chain_has(s, sid, {Annotation.VECTORIZE})
    nested_ok = not (len(st.iters) == 1 and last.annotation != Annotation.NONE)
    if (
        last.kind == IterKind.SPATIAL
        and s.stages[sid].iters[-1].annotation == Annotation.NONE
        and last.extent <= 64
        and not inside_vector
        and nested_ok
        and rng.random() < 0.5
    ):
        s = s.vectorize(sid, len(st.iters) - 1)
    st = s.stages[sid]
    free = [
        p for p, it in enumerate(st.iters) if it.annotation == Annotation.NONE and (it.extent or 99) <= 16
    ]
    if free and rng.random() < 0.3:
        s = s.unroll(sid, rng.choice(free))
    if rng.random() < 0.3:
        s = s.pragma(sid, 0, f"auto_unroll_max_step${rng.choice([0, 16, 64, 512])}")
    return s
