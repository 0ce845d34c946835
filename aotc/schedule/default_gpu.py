"""The untuned GPU schedule of any DAG: what a GPU build compiles where no record exists.

Every stage without a reduction is inlined (Ansor's AlwaysInline is greedy on GPU), but Winograd's
constant-indexed transforms; every stage left at the root
becomes one kernel in which each thread computes one output element: its spatial loops fused, split by
the block size and bound to blockIdx.x / threadIdx.x, its reduction (if any) a serial loop per thread;
but a stage with fewer outputs than its reduction is long (softmax rows, a global pool) reduces each
output across the 32 threads of a block.
Correct for every DAG and every GPU; fast only for element-wise stages: tuning finds the tiled ones.
"""

from __future__ import annotations

import math

from aotc.schedule.state import Annotation, ComputeAtKind, IterKind, State
from aotc.target import Target
from aotc.te.dag import ComputeDAG
from aotc.te.tensor import CONST_INDEX_AXES

THREADS_PER_BLOCK = 128  # four warps: enough to hide latency, within every OpenCL device's 256
CROSS_THREAD_WIDTH = 32  # threads that reduce one long row together (a warp)


def gpu_default_schedule(dag: ComputeDAG, target: Target) -> State:
    s = State.initial(dag)
    for op in reversed(dag.compute_ops):
        sid = s.stage_id(op.name)
        if op.attrs.get(CONST_INDEX_AXES):
            continue  # a Winograd transform inlined would be its whole sum again at every use
        if op not in s.outputs and all(it.kind == IterKind.SPATIAL for it in s.stages[sid].iters):
            s = s.compute_inline(sid)
    for name in [st.name for st in s.stages]:
        st = s.stages[s.stage_id(name)]
        if st.is_placeholder or st.compute_at != ComputeAtKind.ROOT:
            continue
        space = math.prod(it.extent or 1 for it in st.iters if it.kind == IterKind.SPATIAL)
        reduce = math.prod(it.extent or 1 for it in st.iters if it.kind == IterKind.REDUCE)
        if reduce > CROSS_THREAD_WIDTH and space < reduce:  # few long rows: a block per row
            s = reduce_across_threads(s, name, CROSS_THREAD_WIDTH)
        else:
            s = bind_one_thread_per_point(s, name, min(THREADS_PER_BLOCK, target.hw.max_threads_per_block))
    return s


def reduce_across_threads(s: State, name: str, threads: int) -> State:
    """A root stage's reduce loops fused, split by `threads` bound to threadIdx.x (the block reduces
    together), its spatial loops fused into blockIdx.x."""
    sid = s.stage_id(name)
    iters = s.stages[sid].iters
    red = [i for i, it in enumerate(iters) if it.kind == IterKind.REDUCE]
    if len(red) > 1:
        s = s.fuse(sid, red)
    s = s.split(sid, red[0], [threads]).bind(sid, red[0] + 1, Annotation.THREAD_X)
    if red[0] > 1:
        s = s.fuse(sid, list(range(red[0])))
    return s.bind(sid, 0, Annotation.BLOCK_X) if red[0] else s


def bind_one_thread_per_point(s: State, name: str, threads: int) -> State:
    """Fuse a root stage's spatial iterators and bind them to blocks of `threads` threads."""
    sid = s.stage_id(name)
    iters = s.stages[sid].iters
    n_spatial = 0
    while n_spatial < len(iters) and iters[n_spatial].kind == IterKind.SPATIAL:
        n_spatial += 1
    if n_spatial == 0:  # a full reduction to a scalar: one thread
        return s
    if n_spatial > 1:
        s = s.fuse(sid, list(range(n_spatial)))
    extent = s.stages[sid].iters[0].extent or 1
    if extent <= threads:
        return s.bind(sid, 0, Annotation.THREAD_X)
    s = s.split(sid, 0, [threads])
    return s.bind(sid, 0, Annotation.BLOCK_X).bind(sid, 1, Annotation.THREAD_X)
