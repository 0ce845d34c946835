"""The pieces of the untuned GPU schedule of any DAG (aotc.search.untuned puts them together: what a GPU
build compiles where no record exists).

A stage with data reuse (matmul, dense, batch matmul, conv2d) gets Ansor's GPU multi-level tiling with
tile sizes from a heuristic (`aotc.schedule.gpu_tiling`): register tiles per thread, blocks of threads,
its inputs staged through shared memory, its element-wise consumer fused. Every other stage without a
reduction is inlined (Ansor's AlwaysInline is greedy on GPU), but Winograd's constant-indexed transforms;
every stage left at the root becomes one kernel in which each thread computes one output element: its
spatial loops fused, split by the block size and bound to blockIdx.x / threadIdx.x, its reduction (if any)
a serial loop per thread; but a stage with fewer outputs than its reduction is long (softmax rows, a
global pool, a batch-1 dense layer with a long reduction) reduces each output across the 32 threads of a
block. Where the tiled program does not lower, or the GPU codegen rejects it against the target's
limits, the next best tiling is used, and at last the untiled schedule (correct for every DAG and GPU).
"""

from __future__ import annotations

import math

from aotc.schedule.gpu_tiling import CANDIDATES, CROSS_THREAD_WIDTH, tiled_gpu_schedule
from aotc.schedule.state import Annotation, ComputeAtKind, IterKind, State
from aotc.target import Target
from aotc.te.dag import ComputeDAG
from aotc.te.tensor import CONST_INDEX_AXES

THREADS_PER_BLOCK = 128  # four warps: enough to hide latency, within every OpenCL device's 256


def tiled_gpu_candidates(dag: ComputeDAG, target: Target) -> list[State]:
    """The heuristic's tilings of `dag`, best first, each with its other root stages bound as the untiled
    schedule binds them; none where no stage wants tiles. Whether the GPU codegen accepts one is the
    caller's question (aotc.search.untuned: the codegen comes after this stage)."""
    found = []
    for rank in range(CANDIDATES):
        tiled = tiled_gpu_schedule(dag, target, rank)
        if tiled is None:
            break
        found.append(bind_root_stages(tiled, target))
    return found


def untiled_gpu_schedule(dag: ComputeDAG, target: Target) -> State:
    """One thread per output point (or a block's threads per output of a long reduction), every
    reduction-free stage but the outputs inlined."""
    s = State.initial(dag)
    for op in reversed(dag.compute_ops):
        sid = s.stage_id(op.name)
        if op.attrs.get(CONST_INDEX_AXES):
            continue  # a Winograd transform inlined would be its whole sum again at every use
        if op not in s.outputs and all(it.kind == IterKind.SPATIAL for it in s.stages[sid].iters):
            s = s.compute_inline(sid)
    return bind_root_stages(s, target)


def bind_root_stages(s: State, target: Target) -> State:
    """Every root stage not bound yet: a block per output of a long reduction, else one point a thread."""
    for name in [st.name for st in s.stages]:
        st = s.stages[s.stage_id(name)]
        if st.is_placeholder or st.compute_at != ComputeAtKind.ROOT:
            continue
        if any(it.annotation != Annotation.NONE for it in st.iters):
            continue  # tiled and bound already
        space = math.prod(it.extent or 1 for it in st.iters if it.kind == IterKind.SPATIAL)
        reduce = math.prod(it.extent or 1 for it in st.iters if it.kind == IterKind.REDUCE)
        if reduce > CROSS_THREAD_WIDTH and space < reduce:  # few long rows: a block per row
            s = reduce_across_threads(s, name, CROSS_THREAD_WIDTH)
        else:
            threads = min(THREADS_PER_BLOCK, target.hw.max_threads_per_block)
            s = bind_one_thread_per_point(s, s.stage_id(name), threads)
    return s


def reduce_across_threads(s: State, name: str, threads: int) -> State:
    """A root stage's reduce loops on `threads` threads that reduce together, its outputs on blocks."""
    return bind_outer_to_blocks(bind_reduction_to_threads(s, s.stage_id(name), threads), s.stage_id(name))


def bind_reduction_to_threads(s: State, sid: int, threads: int) -> State:
    """Fuse a stage's reduce loops (they must be its innermost), split them by `threads` and bind the
    inner part to threadIdx.x: Ansor's cross-thread reduction. Unchanged if the reduce loops are not
    innermost."""
    iters = s.stages[sid].iters
    red = [i for i, it in enumerate(iters) if it.kind == IterKind.REDUCE]
    if not red or red != list(range(red[0], len(iters))):
        return s
    if len(red) > 1:
        s = s.fuse(sid, red)
    return s.split(sid, red[0], [threads]).bind(sid, red[0] + 1, Annotation.THREAD_X)


def _outer_spatial(s: State, sid: int) -> int:
    """How many outer loops of a stage are spatial and not annotated (the loops to spread over a grid)."""
    iters = s.stages[sid].iters
    n = 0
    while n < len(iters) and iters[n].kind == IterKind.SPATIAL and iters[n].annotation == Annotation.NONE:
        n += 1
    return n


def bind_outer_to_blocks(s: State, sid: int) -> State:
    """Fuse a stage's outer spatial loops into blockIdx.x (its threads already have other work)."""
    n = _outer_spatial(s, sid)
    if n > 1:
        s = s.fuse(sid, list(range(n)))
    return s.bind(sid, 0, Annotation.BLOCK_X) if n else s


def bind_one_thread_per_point(s: State, sid: int, threads: int) -> State:
    """Fuse a stage's outer spatial loops and spread them over blocks of `threads` threads, one point
    per thread (a stage with no spatial loop, a reduction to a scalar, runs in one thread)."""
    n = _outer_spatial(s, sid)
    if n == 0:
        return s
    if n > 1:
        s = s.fuse(sid, list(range(n)))
    if (s.stages[sid].iters[0].extent or 1) <= threads:
        return s.bind(sid, 0, Annotation.THREAD_X)
    s = s.split(sid, 0, [threads])
    return s.bind(sid, 0, Annotation.BLOCK_X).bind(sid, 1, Annotation.THREAD_X)
