"""The untuned GPU schedule of stages with data reuse: Ansor's GPU sketch, tile sizes by a heuristic.

A stage that needs multi-level tiling (matmul, dense, batch matmul, conv2d: an input that some spatial
axis does not index is reused along it) gets the structure the GPU sketch rules derive
(docs/search.md#gpu-sketches), step for step: its single element-wise consumer fused at tile level 3 (or
a `.local` cache write), SSSRRSRS tiles, every direct producer staged through shared memory at the
outermost reduce tile, the other stages inlined; then what InitThreadBind does to a tiled stage
(level 0 -> blockIdx.x, 1 -> vthread, 2 -> threadIdx.x, the shared stages fetched by the block's threads
together) and an auto-unroll pragma. Only the split lengths differ from a random sample: `gpu_tiles`
chooses them (exact divisors only: a padded split would guard the thread loops and the barriers in them).

This module sits below `aotc.search` (the one-way flow): the search's sketch rules and ThreadBind share
`bind_tiled`, `cooperative_fetch` and `divisors` from here, and `tests/test_gpu_default.py` checks that the
untuned state is one of `generate_sketches`' sketches with its lengths filled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from itertools import product

import numpy as np

from aotc.ir.expr import Expr, Var
from aotc.ir.simplify import bounds, linear_terms
from aotc.schedule.state import Annotation, ComputeAtKind, IterKind, State
from aotc.schedule.steps import effective_consumers
from aotc.schedule.tiling import follow_tiling, multi_level_tile
from aotc.target import HardwareParams, Target
from aotc.te.dag import ComputeDAG, reads_of
from aotc.te.tensor import CONST_INDEX_AXES, ComputeOp

STRUCTURE = "SSSRRSRS"  # Ansor's GPU multi-level tiling: block, vthread, thread, regs / reduce levels
FUSION_LEVEL = 3  # the consumer computes the tiled stage inside its thread level
AUTO_UNROLL = 512  # unrolls a register tile of up to 8x8 with its reduce step
CROSS_THREAD_WIDTH = 32  # a reduction this long with fewer outputs is reduced across threads instead
MAX_STAGED_REDUCTION = 40  # a few input channels of a 3x3 window (4 x 9) staged at once
MAX_WHOLE_WINDOW = 64  # reduce axes besides the longest one are staged whole up to this product
BLOCKS_PER_CORE = 2  # blocks per SM (CUDA) the grid should at least have
MIN_GRID = 16  # the floor of that where the target does not say how many cores it has (OpenCL)
WARP = 32  # threads that run in lock step on most GPUs: a block of a multiple of it wastes no lanes
CANDIDATES = 3  # tilings tried, best first, before the untiled schedule


@dataclass(frozen=True)
class TilePreferences:
    """What the tiling heuristic aims for; the defaults make the untuned schedule (benchmarks/gpu_tiles.py
    times other choices on a GPU)."""

    min_threads: int = 128  # threads per block it aims for, at least ...
    max_threads: int = 256  # ... and at most
    # outputs per thread it aims for (8x4) ...: on an H200 (benchmarks/gpu_tiles.py), 128 threads of 32
    # outputs beat 256 threads of 16 (the earlier aim) in every matmul timed: GEMM 4096^3 3.69 vs 4.64 ms,
    # BERT-base's dense layers at batch 16 0.77 vs 1.36 ms (FF) and 0.20 vs 0.35 ms (projections), at
    # batch 1 0.099 vs 0.106 ms; a ResNet 3x3 conv at batch 16 ran 0.24 ms with 64, 0.25-0.30 with 16
    register_tile: int = 32
    max_axis_registers: int = 8  # ... at most this many along one axis ...
    max_register_tile: int = 64  # ... and this many in all (8x8)
    block_outputs: int = 64 * 64  # outputs per block beyond which more reuse is not worth fewer blocks
    staged_reduction: int = 16  # reduce length staged in shared memory per barrier: a matmul's k tile


DEFAULT_PREFERENCES = TilePreferences()


@lru_cache(maxsize=4096)
def divisors(n: int) -> tuple[int, ...]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return tuple(sorted(set(small + [n // d for d in small])))


# ---- which stages -----------------------------------------------------------------------------------


def reduces_across_threads(space: int, reduce: int, max_threads: int) -> bool:
    """Few outputs with a long reduction each: a block's threads reduce each output together (Ansor's
    NeedsCrossThreadReduction for a tiled op, and the untuned schedule's rule for any reduction)."""
    return (reduce > CROSS_THREAD_WIDTH and space < reduce) or (space <= max_threads and space < reduce)


def wants_tiles(dag: ComputeDAG, op: ComputeOp, target: Target) -> bool:
    """A reduction with data reuse and enough outputs to give threads their own."""
    if not op.reduce_axes or not dag.analysis[op].needs_multi_level_tiling or op.attrs.get(CONST_INDEX_AXES):
        return False
    space = math.prod(a.extent for a in op.axes)
    reduce = math.prod(a.extent for a in op.reduce_axes)
    return not reduces_across_threads(space, reduce, target.hw.max_threads_per_block)


# ---- the heuristic ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GPUTiles:
    """Inner split lengths of one tiled stage and what they give per block."""

    spatial: tuple[tuple[int, int, int, int], ...]  # per spatial axis: vthread, threads, 1, registers
    reduce: tuple[tuple[int, int], ...]  # per reduce axis: the staged tile, 1
    threads: int  # per block
    registers: int  # outputs per thread
    blocks: int
    shared_bytes: int  # of the shared-memory stages (estimated from the read regions)
    score: float

    def lengths(self, names: list[str]) -> dict[str, list[int]]:
        """Per iterator name (the spatial ones, then the reduce ones), its inner lengths."""
        return dict(zip(names, [list(t) for t in self.spatial + self.reduce]))

    @property
    def block_tile(self) -> tuple[int, ...]:
        return tuple(math.prod(t) for t in self.spatial)


@dataclass(frozen=True)
class _Read:
    """One input read: per index, (axis position in all_axes, |coefficient|) pairs if it is affine in
    the axes, else the index itself (its span then comes from interval bounds), and the dimension."""

    dims: tuple[tuple[tuple[tuple[int, int], ...] | Expr, int], ...]
    axes: tuple[Var, ...]
    itemsize: int

    def region(self, tile: list[int]) -> int:
        """Elements of the tensor a tile of the axes (per position in all_axes) reads, at most."""
        out = 1
        for terms, extent in self.dims:
            if isinstance(terms, tuple):
                span = 1 + sum(c * (tile[k] - 1) for k, c in terms)
            else:
                lo, hi = bounds(terms, {v: (0, t - 1) for v, t in zip(self.axes, tile)})
                span = hi - lo + 1
            out *= int(min(span, extent))
        return out


def _reads(op: ComputeOp) -> list[_Read]:
    axes = tuple(a.var for a in op.all_axes)
    pos = {v: k for k, v in enumerate(axes)}
    out, seen = [], set()
    for r in reads_of(op):
        key = (r.tensor, tuple(map(str, r.indices)))
        if key in seen:
            continue
        seen.add(key)
        dims: list = []
        for idx, extent in zip(r.indices, r.tensor.shape):
            terms, _ = linear_terms(idx)
            if all(isinstance(v, Var) and v in pos for v in terms):
                dims.append((tuple((pos[v], abs(c)) for v, c in terms.items()), int(extent)))
            else:
                dims.append((idx, int(extent)))
        out.append(_Read(tuple(dims), axes, np.dtype(r.tensor.dtype).itemsize))
    return out


def _reduce_tiles(op: ComputeOp, staged: int) -> list[int]:
    """Staged length per reduce axis: the short ones (a conv's window) whole, the longest (k, input
    channels) split so that the stage holds about `staged`..MAX_STAGED_REDUCTION terms."""
    ext = [a.extent for a in op.reduce_axes]
    main = max(range(len(ext)), key=lambda k: (ext[k], -k))
    tiles = [1] * len(ext)
    whole = 1
    for k in reversed(range(len(ext))):
        if k != main and whole * ext[k] <= MAX_WHOLE_WINDOW:
            tiles[k] = ext[k]
            whole *= ext[k]
    most = staged if whole == 1 else max(MAX_STAGED_REDUCTION, whole)
    tiles[main] = max(d for d in divisors(ext[main]) if d <= staged and d * whole <= most)
    return tiles


def _register_axes(op: ComputeOp, reads: list[_Read]) -> list[int]:
    """The (up to) two spatial axes of a thread's register tile: the innermost non-trivial one, and the one
    that with it reuses most loaded values (conv NCHW: output channel x width; matmul: i x j)."""
    n = len(op.axes)
    live = [k for k in range(n) if op.axes[k].extent > 1]
    if not live:
        return []
    first = live[-1]

    def reuse(k: int) -> float:
        tile = [1] * len(op.all_axes)
        for p in (first, k):
            tile[p] = max(d for d in divisors(op.axes[p].extent) if d <= 4)
        return math.prod(tile) / sum(r.region(tile) for r in reads)

    others = live[:-1]
    return [first] if not others else [first, max(reversed(others), key=reuse)]


def _thread_splits(extents: list[int], most: int):
    """Every tuple of per-axis divisors whose product is at most `most`."""
    if not extents:
        yield ()
        return
    for t in divisors(extents[0]):
        if t > most:
            break
        for rest in _thread_splits(extents[1:], most // t):
            yield (t, *rest)


def gpu_tiles(
    op: ComputeOp, hw: HardwareParams, prefs: TilePreferences = DEFAULT_PREFERENCES
) -> list[GPUTiles]:
    """Tilings of a stage for a GPU, best first (at most CANDIDATES).

    With the default `prefs` a thread computes a register tile of about 32 outputs (at most 8 per axis,
    8x8 in all) on the two axes with most reuse; a block has 128-256 threads where the extents allow, and at
    most 64x64 outputs; reduction tiles of about 16 terms are staged in shared memory. Among the exact
    factorizations within the target's thread and shared-memory limits, the score weighs the reuse of a
    block (multiply-adds per element staged) and of a thread (per shared load) against too few blocks for
    the GPU's cores, idle lanes of a partial warp, threads outside the aimed range, and register tiles far
    from the aimed size. The regions staged are estimated from the affine read indices (a non-affine
    index counts its whole dimension)."""
    axes = list(op.axes)
    n = len(axes)
    ext = [a.extent for a in axes]
    space = math.prod(ext)
    reads = _reads(op)
    staged = _reduce_tiles(op, prefs.staged_reduction)
    k_tile = math.prod(staged)
    reg_axes = _register_axes(op, reads)
    if not reg_axes:
        return []
    max_threads = hw.max_threads_per_block
    least_threads = min(max(hw.warp_size, 32), max_threads) if space > 2 * hw.warp_size else 1
    min_blocks = BLOCKS_PER_CORE * hw.num_cores if hw.warp_size > 1 else MIN_GRID
    warp = max(hw.warp_size, WARP)
    found: list[GPUTiles] = []
    options = [[d for d in divisors(ext[k]) if d <= prefs.max_axis_registers] for k in reg_axes]
    for regs in product(*options):
        r = [1] * n
        for k, v in zip(reg_axes, regs):
            r[k] = v
        n_regs = math.prod(r)
        if n_regs > prefs.max_register_tile:
            continue
        thread_tile = r + [1] * len(staged)
        thread_loads = sum(rd.region(thread_tile) for rd in reads)
        for t in _thread_splits([e // v for e, v in zip(ext, r)], max_threads):
            n_threads = math.prod(t)
            if n_threads < least_threads:
                continue
            block = [a * b for a, b in zip(t, r)]
            shared = [rd.region(block + staged) for rd in reads]
            shared_bytes = sum(s * rd.itemsize for s, rd in zip(shared, reads))
            if shared_bytes > hw.max_shared_memory_per_block:
                continue
            if hw.registers_per_block and n_threads * (n_regs + sum(regs) + 24) > hw.registers_per_block:
                continue
            outputs = n_threads * n_regs
            blocks = space // outputs
            score = (
                math.log2(outputs * k_tile / sum(shared))
                + math.log2(n_regs / thread_loads)
                - 1.5 * max(0.0, math.log2(min_blocks / BLOCKS_PER_CORE / blocks))
                - 0.5 * max(0.0, math.log2(min_blocks / blocks))
                + 3 * math.log2(n_threads / (-(-n_threads // warp) * warp))
                - max(0.0, math.log2(prefs.min_threads / n_threads))
                - max(0.0, math.log2(n_threads / prefs.max_threads))
                - max(0.0, math.log2(outputs / prefs.block_outputs))
                - 0.5 * abs(math.log2(n_regs / prefs.register_tile))
            )  # fmt: skip
            found.append(
                GPUTiles(
                    spatial=tuple((1, t[k], 1, r[k]) for k in range(n)),
                    reduce=tuple((s, 1) for s in staged),
                    threads=n_threads,
                    registers=n_regs,
                    blocks=blocks,
                    shared_bytes=shared_bytes,
                    score=score,
                )
            )
    # best score; ties: more threads, then threads on inner axes (coalesced writes)
    found.sort(key=lambda c: (-c.score, -c.threads, tuple(-v[1] for v in reversed(c.spatial))))
    return found[:CANDIDATES]


@lru_cache(maxsize=256)
def _cached_tiles(
    key: tuple, op: ComputeOp, hw: HardwareParams, prefs: TilePreferences
) -> tuple[GPUTiles, ...]:
    return tuple(gpu_tiles(op, hw, prefs))


def tiles_for(
    dag: ComputeDAG, op: ComputeOp, target: Target, prefs: TilePreferences = DEFAULT_PREFERENCES
) -> tuple[GPUTiles, ...]:
    """`gpu_tiles`, remembered per workload (a build asks for a task's default more than once)."""
    return _cached_tiles((dag.workload_key, op.name, str(target), target.hw), op, target.hw, prefs)


# ---- the state --------------------------------------------------------------------------------------


def tiled_gpu_schedule(
    dag: ComputeDAG, target: Target, rank: int = 0, prefs: TilePreferences = DEFAULT_PREFERENCES
) -> State | None:
    """The GPU sketch of `dag` with every stage that `wants_tiles` tiled by its `rank`-th best tiling and
    bound to blocks and threads; its other root stages are left unbound. None if no stage wants tiles
    (or has that many tilings)."""
    chosen: dict[str, GPUTiles] = {}
    for op in dag.compute_ops:
        if wants_tiles(dag, op, target):
            tiles = tiles_for(dag, op, target, prefs)
            if len(tiles) <= rank:
                return None
            chosen[op.name] = tiles[rank]
    if not chosen:
        return None
    s = State.initial(dag)
    tiled: dict[str, tuple[str, list[int]]] = {}  # tiled stage -> (its root stage, spatial split steps)
    sid = len(s.stages) - 1
    while sid >= 0:
        s = _stage_through_shared(s, sid, tiled)
        st = s.stages[sid]
        if (
            not st.is_placeholder
            and st.op not in s.outputs
            and st.compute_at != ComputeAtKind.INLINED
            and all(it.kind == IterKind.SPATIAL for it in st.iters)
            and not st.op.attrs.get(CONST_INDEX_AXES)
        ):
            s = s.compute_inline(sid)  # AlwaysInline (greedy on GPU)
        elif st.name in chosen:
            tiles = chosen[st.name]
            cid = _fusable_consumer(dag, s, sid)
            if cid is None:  # AddCacheWrite: accumulate in registers, write the result once
                s = s.cache_write(sid, "local")
                cid = sid + 1
            names = [it.name for it in s.stages[sid].iters]  # a `.local` copy names its axes anew
            s, spatial = multi_level_tile(s, sid, STRUCTURE, tiles.lengths(names))
            s, at = follow_tiling(s, cid, spatial, FUSION_LEVEL)
            s = s.compute_at(sid, cid, at)
            tiled[s.stages[sid].name] = (s.stages[cid].name, spatial)
        sid -= 1
    roots = {root for root, _ in tiled.values()}
    for root in [st.name for st in s.stages if st.name in roots]:
        bound = bind_tiled(s, s.stage_id(root), target.hw)
        if bound is None:
            return None
        s = bound
    for name in [st.name for st in s.stages if st.name.endswith(".shared")]:
        shared = s.stage_id(name)
        consumer = s.stages[s.stages[shared].attach[0]].name  # type: ignore[index]
        s = cooperative_fetch(s, shared, tiled[consumer][1])
    for name in [st.name for st in s.stages if st.name in tiled]:
        s = s.pragma(s.stage_id(name), 0, f"auto_unroll_max_step${AUTO_UNROLL}")
    return s


def _fusable_consumer(dag: ComputeDAG, s: State, sid: int) -> int | None:
    """The single consumer a tiled stage is computed in (Ansor's HasSingleElementwiseMatchedConsumer)."""
    consumers = effective_consumers(s, sid)
    if len(consumers) != 1:
        return None
    op, consumer = s.stages[sid].op, s.stages[consumers[0]].op
    if not isinstance(consumer, ComputeOp) or consumer.reduce_axes or consumer not in dag.ops:
        return None
    if tuple(consumer.shape) != tuple(op.shape) or not dag.elementwise_match(op, consumer):
        return None
    return consumers[0]


def _stage_through_shared(s: State, sid: int, tiled: dict[str, tuple[str, list[int]]]) -> State:
    """AddCacheRead: a direct producer of tiled stages only is read through a shared-memory copy of one
    reduce tile, computed at each consumer's outermost reduce tile."""
    st = s.stages[sid]
    if st.compute_at == ComputeAtKind.INLINED or st.name.endswith(".shared"):
        return s
    consumers = [s.stages[c] for c in effective_consumers(s, sid)]
    if not consumers or any(c.name not in tiled for c in consumers):
        return s
    if not all(any(r.tensor is st.op for r in reads_of(c.op)) for c in consumers):
        return s
    for c in consumers:
        s = s.cache_read(sid, "shared", [c.name])
        at = (
            STRUCTURE.index("R") * len(c.op.axes) + len(c.op.reduce_axes) - 1
        )  # the last `.0` reduce iterator
        s = s.compute_at(sid + 1, c.name, at)
    return s


# ---- thread binding (shared with the search's InitThreadBind) ----------------------------------------


def level_run(iters, start: int, suffix: str) -> int:
    """How many spatial iterators from `start` on are parts of one tile level (`ax.1`, `ay.1`, ...)."""
    n = 0
    while start + n < len(iters):
        it = iters[start + n]
        if it.kind != IterKind.SPATIAL or it.annotation != Annotation.NONE or not it.name.endswith(suffix):
            break
        n += 1
    return n


def _fuse_and_bind(state: State, sid: int, pos: int, n: int, annotation: Annotation) -> State:
    if n > 1:
        state = state.fuse(sid, list(range(pos, pos + n)))
    return state.bind(sid, pos, annotation)


def bind_tiled(state: State, sid: int, hw: HardwareParams) -> State | None:
    """A multi-level tiled root stage's levels 0, 1, 2 fused and bound to blockIdx.x, vthread and
    threadIdx.x; None past the target's vthread or thread limits, or with fewer threads than a warp
    where the work has enough."""
    iters = state.stages[sid].iters
    n_block = level_run(iters, 0, ".0")
    state = _fuse_and_bind(state, sid, 0, n_block, Annotation.BLOCK_X)
    n_vthread = level_run(state.stages[sid].iters, 1, ".1")
    state = _fuse_and_bind(state, sid, 1, n_vthread, Annotation.VTHREAD)
    if (state.stages[sid].iters[1].extent or 1) > hw.max_vthread_extent:
        return None
    n_thread = level_run(state.stages[sid].iters, 2, ".2")
    if n_thread == 0:
        return None
    state = _fuse_and_bind(state, sid, 2, n_thread, Annotation.THREAD_X)
    threads = state.stages[sid].iters[2].extent or 1
    space = math.prod(it.extent or 1 for it in state.stages[sid].iters if it.kind == IterKind.SPATIAL)
    if threads > hw.max_threads_per_block or (threads < hw.warp_size and space > 2 * hw.warp_size):
        return None  # past the block limit, or too few threads for a warp where the work has enough
    return state


def cooperative_fetch(state: State, sid: int, spatial_split_ids: list[int]) -> State:
    """Fuse a shared stage's loops, split off a (vector) part of 1 for mutation to grow, and split the
    rest by its consumer's thread count (level 2 of the consumer's spatial splits): the block's threads
    fetch the tile together."""
    n = len(state.stages[sid].iters)
    if n > 1:
        state = state.fuse(sid, list(range(n)))
    state = state.split(sid, 0, [1]).vectorize(sid, 1)
    state = state.follow_fused_split(sid, 0, spatial_split_ids, 1, True)
    return state.bind(sid, 1, Annotation.THREAD_X)
