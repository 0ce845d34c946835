"""A deterministic rule-based schedule for any DAG: what an untuned build compiles.

Strictly inlineable stages are inlined. Stages that need multi-level tiling (conv, matmul, ...) get
SSRSRS tiles (8-bit sums of products with the target's dot-product instruction innermost, docs/int8.md)
with a register block of up to 16 vector accumulators (12 where the target has 16 vector
registers, as AVX2 has: 16 accumulators would spill their loads and broadcasts), fused into their single
element-wise consumer or else through a cache_write stage; their outer loops run in parallel and
their inner loops are vectorized and unrolled. Every other stage runs its outer loops in parallel
(if it is big enough to pay for waking the threads) and vectorizes its innermost axis.
"""

from __future__ import annotations

import math

import numpy as np

from aotc.ir.dot import dot_forms
from aotc.ir.expr import free_vars
from aotc.ir.stmt import MAX_VECTOR_LANES
from aotc.schedule.lower import infer_bound
from aotc.schedule.state import ComputeAtKind, IterKind, Stage, State
from aotc.schedule.steps import effective_consumers
from aotc.schedule.tiling import (
    DotTiling,
    const_index_vector_axes,
    contiguous_axis,
    dot_tile,
    dot_tilings,
    follow_tiling,
    multi_level_tile,
    reads_contiguously,
    unroll_const_indices,
)
from aotc.target import Target
from aotc.te.dag import ComputeDAG, read_tensors, reads_of
from aotc.te.tensor import CONST_INDEX_AXES, LAYOUT_FREE, ComputeOp, IterVar

MAX_ACCUMULATORS = 16  # a register block's vector accumulators, at most
SPARE_REGISTERS = 4  # registers a micro-kernel needs besides its accumulators (loads, broadcasts)
AUTO_UNROLL = 64
DOT_VECTORS = 4  # vectors of output channels in a dot-product register block, at most
DOT_SHORT_REDUCTION = 128  # input channels up to which a dot-product block takes DOT_VECTORS vectors
DOT_LONG_VECTORS = 2  # vectors of output channels in the block of a longer dot product, at most
# A dot product with no pixel axis to block (a matrix-vector product: a classifier at batch 1) reuses no
# weight vector and no broadcast register pair, so its block takes up to this many vectors of outputs
# (AVX2's halves forms too): independent sums, where with one each dot product waited for the one before.
# MobileNetV2's 1280 -> 1000 int8 classifier, 1 thread, alone: 0.031 -> 0.011 ms on Zen 5 (5 vectors of 8
# lanes, copied out one at a time), and 0.026 -> 0.021 ms for its znver3 code on the same machine.
DOT_VECTORS_ALONE = 8
# AVX2's maddwd4 splits each weight vector into two registers of 16-bit halves and each input broadcast
# into two: its blocks take at most 2 vectors and up to 14 accumulators (rows that reuse those splits; the
# registers they spill reload as memory operands). MobileNetV2 int8 on znver3, 1 thread: its 7x7 stage's
# 1x1 convs 15% faster (7 rows x 2 vectors, not 7 x 1), its kernels 8.5 -> 8.1 ms in sum.
HALVES_VECTORS = 2
HALVES_ACCUMULATORS = 14
DEPTHWISE_BLOCK = 8  # pixels in a float depthwise conv's register block, at most (one vector of channels)
MIN_PARALLEL_POINTS = 4096  # below this a stage costs less than waking the thread pool
# A tiled op (conv, matmul) with fewer vector multiply-adds than this (`vector_macs`) runs on one thread:
# about a microsecond of work, less than waking the pool and joining it costs. On Zen 5 at 2 threads the
# tiled kernels of small models with under 2304 took 1.0-1.8x their one-thread time, those with 2304-4608
# 0.85-1.42x, those with 6144 or more 0.73-1.03x (docs/loop-ir.md).
MIN_PARALLEL_VECTOR_MACS = 5000
# The most a parallel tile's own padded input may take: it stays on the thread's stack and in its L2.
MAX_TILE_SCRATCH_BYTES = 256 * 1024


def default_schedule(dag: ComputeDAG, target: Target) -> State:
    """The untuned schedule of `dag` for the CPU `target`; for GPUs (whose untuned schedule needs the GPU
    codegen's verdict) aotc.search.untuned.untuned_schedule."""
    if target.is_gpu:
        raise ValueError(f"{target}: the untuned GPU schedule is aotc.search.untuned.untuned_schedule")
    s = State.initial(dag)
    for op in reversed(dag.compute_ops):
        if dag.analysis[op].is_strictly_inlineable or _pad_into_copy(dag, op):
            s = s.compute_inline(op.name)
    done: set[str] = set()
    for op in reversed(dag.compute_ops):
        inlined = s.stages[s.stage_id(op.name)].compute_at == ComputeAtKind.INLINED
        if dag.analysis[op].needs_multi_level_tiling and op.name not in done and not inlined:
            s, names = _tile_anchor(s, dag, op, target)
            done |= names
    for op in reversed(dag.compute_ops):
        st = s.stages[s.stage_id(op.name)]
        if op.attrs.get(CONST_INDEX_AXES) and st.compute_at == ComputeAtKind.ROOT and op.name not in done:
            s = _unrolled_const_indices(s, op.name, target)
            done.add(op.name)
    for op in reversed(dag.compute_ops):
        pad = None if op.name in done else _pool_pad(s, dag, op)
        if pad is not None:
            s, names = _window_reduction_at_consumer(s, dag, op, pad, target)
            done |= names
    for name in [st.name for st in s.stages]:
        st = s.stages[s.stage_id(name)]
        if st.is_placeholder or st.compute_at != ComputeAtKind.ROOT or name in done:
            continue
        s = _parallel_vectorize(s, name, target)
    return s


def vector_macs(op: ComputeOp, target: Target) -> int:
    """`op`'s multiply-adds (one per point of its spatial and reduce axes) over the lanes of a vector of
    the narrowest type it reads: about how many vector instructions its work takes."""
    points = math.prod(a.extent for a in op.all_axes)
    narrowest = min((np.dtype(t.dtype).itemsize for t in read_tensors(op)), default=4)
    return points // max(1, target.hw.vector_bytes // narrowest)


def _pad_into_copy(dag: ComputeDAG, op: ComputeOp) -> bool:
    """A pad read by one stage that sums nothing (another pad, a transpose): inlined there, its select
    is evaluated once per element as it would be in a pass of its own, and that pass is saved (an int8
    stem's 3 -> 4 channel pad, `pad_conv_channels`, had been a pass of 4-byte vectors over the image:
    MobileNetV2's int8 stem 0.116 -> 0.054 ms on Zen 5 at 1 thread, 0.065 -> 0.031 at 2; QDQ ResNet-18's,
    padded as planes before its transpose, 0.41-0.43 -> 0.39 at 1). A Winograd conv's row transform too:
    float ResNet-18's layer-1 Winograd convs 10-12% faster. A conv's window columns (`window_columns`, a
    gather of contiguous runs) too: they are then gathered per tile into the conv's own window copy."""
    consumers = dag.consumers[op]
    return (
        op.tag in ("pad", "window_columns")
        and op not in dag.outputs
        and len(consumers) == 1
        and isinstance(consumers[0], ComputeOp)
        and not consumers[0].reduce_axes
    )


def _pool_pad(s: State, dag: ComputeDAG, op: ComputeOp) -> ComputeOp | None:
    """The pad stage of a pool (a reduction over a window of a padded input that needs no tiling, at the
    root, summing along its innermost axis contiguously: channels, in NHWC); None for any other op."""
    if not op.reduce_axes or not op.axes or dag.analysis[op].needs_multi_level_tiling:
        return None
    if s.stages[s.stage_id(op.name)].compute_at != ComputeAtKind.ROOT:
        return None
    window = _window_producer(s, dag, op)
    if window is None or window.tag != "pad" or not reads_contiguously(op, op.axes[-1].var):
        return None
    return window


def _window_reduction_at_consumer(
    s: State, dag: ComputeDAG, op: ComputeOp, pad: ComputeOp, target: Target
) -> tuple[State, set[str]]:
    """A pool's padded input inlined (a select per read instead of a padded copy of the whole input), and,
    where one element-wise stage consumes it, the pool computed per pixel inside that stage's parallel
    loop: one pass over memory instead of three (ResNet-18's int8 3x3 max pool: 10 instead of 36 us).
    Returns the state and the stages scheduled here."""
    s = s.compute_inline(pad.name)
    sid = s.stage_id(op.name)
    consumers = effective_consumers(s, sid)
    consumer = s.stages[consumers[0]] if len(consumers) == 1 else None
    if (
        consumer is None
        or consumer.compute_at != ComputeAtKind.ROOT
        or consumer.op.reduce_axes
        or not dag.elementwise_match(op, consumer.op)
    ):
        return s, set()  # the pool is scheduled on its own, as any other root stage
    s = _parallel_vectorize(s, consumer.name, target)
    n_sp = len(op.axes)
    n_all = len(s.stages[sid].iters)
    s = s.reorder(sid, [*range(n_sp - 1), *range(n_sp, n_all), n_sp - 1])  # the window, then channels
    s = s.compute_at(sid, s.stage_id(consumer.name), 0)
    return _vectorize_innermost(s, op.name, op.axes[-1].extent, target), {op.name, consumer.name}


def _unrolled_const_indices(s: State, name: str, target: Target) -> State:
    """Constant-indexed axes unrolled inside the others, the contiguously read axis vectorized innermost,
    the outer iterators fused and run in parallel; or, for a transform feeding another one (Winograd's
    row pass), computed inside that one's outer loop."""
    sid = s.stage_id(name)
    op = s.stages[sid].op
    consumers = effective_consumers(s, sid)
    inner = len(consumers) == 1 and bool(s.stages[consumers[0]].op.attrs.get(CONST_INDEX_AXES))
    axis = const_index_vector_axes(op)[0]
    extent = op.axes[axis].extent
    vec = _vector_tile(extent, _lanes(op.dtype, target)) if extent > 1 else 1
    s, n_outer = unroll_const_indices(s, sid, axis, vec)
    if inner:
        s = s.compute_at(sid, consumers[0], 0)
    else:
        points = int(np.prod([it.extent or 1 for it in s.stages[sid].iters]))
        if n_outer > 1:
            s = s.fuse(sid, list(range(n_outer)))
        if n_outer and points >= MIN_PARALLEL_POINTS:
            s = s.parallel(sid, 0)
    return s.vectorize(sid, len(s.stages[sid].iters) - 1) if vec > 1 else s


def _lanes(dtype: str, target: Target) -> int:
    return max(1, target.hw.vector_bytes // np.dtype(dtype).itemsize)


def _vector_tile(extent: int, lanes: int) -> int:
    """A vector length that divides the axis: a power of two from half a register to two registers,
    else the whole axis if it fits in four registers and the codegen's lane limit (a padded row of 58:
    one partial register, where splitting it by 16 leaves a masked tail in every row and runs 2.8x
    slower), else the largest divisor within one register."""
    lanes = min(lanes, 32)
    for c in (2 * lanes, lanes, lanes // 2):
        if c > 1 and extent % c == 0:
            return c
    if extent <= min(4 * lanes, MAX_VECTOR_LANES):
        return extent
    best = max(d for d in range(1, lanes + 1) if extent % d == 0)
    if best > lanes // 4:
        return best
    return extent if extent < lanes else lanes


def _block(extent: int, most: int) -> int:
    for c in range(min(most, extent), 0, -1):
        if extent % c == 0 and c >= min(most, extent) // 2:
            return c
    return min(most, extent)


def _divisor_block(extent: int, most: int) -> int:
    """The largest divisor of `extent` up to `most`."""
    return max(c for c in range(1, min(most, extent) + 1) if extent % c == 0)


def _pixel_blocks(axes: list[IterVar], room: int, block) -> dict[str, int]:
    """Register-block lengths of `axes` in turn (each `block(extent, most)`, at most 8) while `room`
    accumulators are left for at least two."""
    out: dict[str, int] = {}
    for a in axes:
        if room < 2:
            break
        out[a.name] = b = block(a.extent, min(8, room))
        room //= b
    return out


def _reduce_tile(extent: int) -> int:
    if extent <= 16:
        return extent
    return max(c for c in range(1, 17) if extent % c == 0)


def _vector_axis(op: ComputeOp) -> IterVar | None:
    """The axis to vectorize: one that indexes a layout-free weight and no other input (the weight is
    re-laid out to read it contiguously, the others are broadcast), else the last non-trivial axis."""
    spatial = [a for a in op.axes if a.extent > 1]
    reads = reads_of(op)
    for a in spatial:
        weight = [r for r in reads if r.tensor.tag == LAYOUT_FREE and a.var in r.indices]
        others = [
            r for r in reads if r.tensor.tag != LAYOUT_FREE and any(a.var in free_vars(i) for i in r.indices)
        ]
        if weight and not others:
            return a
    return spatial[-1] if spatial else None


def _tile_lengths(
    op: ComputeOp, target: Target, vec_axis: IterVar | None, dot: DotTiling | None = None
) -> tuple[dict[str, list[int]], int]:
    """Inner lengths per iterator name, and the vector tile of `vec_axis` (a dot product's lanes, which
    `dot_tile` splits off innermost, beside these lengths)."""
    lanes = _lanes(op.dtype, target)
    spatial = list(op.axes)
    lengths = {a.name: [1, 1, 1] for a in spatial}
    vec = 1
    vector_counts = [1]  # vectors of the vector axis per register block, the preferred first
    if dot is not None:
        # Several vectors of output channels per block: each input broadcast (and its x ^ 0x80) then
        # feeds several dot products. A long reduction takes two and a taller block of pixels, which
        # reuses each weight vector more (MobileNetV2's 1x1 convs on znver4, 1 thread: four vectors are
        # 1.2x faster than one with K <= 96; with K = 320..960 two are 1.15-1.2x faster than one, and four
        # leave so few pixels per block that the 320 x 1280 weights stream from L2 twice as often).
        vec = dot.form.lanes
        depth = op.all_axes[dot.depth].extent
        most = DOT_VECTORS if depth <= DOT_SHORT_REDUCTION else DOT_LONG_VECTORS
        if dot.form.halves:
            most = min(most, HALVES_VECTORS)
        if not any(a.extent > 1 for a in spatial if a is not vec_axis):
            most = DOT_VECTORS_ALONE
        per_vector = -(-vec // lanes)
        first = _block(vec_axis.extent // vec, most)
        vector_counts = [first, *(v for v in range(first - 1, 0, -1) if (vec_axis.extent // vec) % v == 0)]
    elif vec_axis is not None:
        vec = _vector_tile(vec_axis.extent, lanes)
        per_vector = -(-vec // lanes)
    else:
        per_vector = 1
    # Register-block first the axes that leave the weight's index alone: each weight vector loaded is
    # then reused across the whole block (a batch axis that picks another weight matrix reuses nothing).
    weight_vars = {
        v for r in reads_of(op) if r.tensor.tag == LAYOUT_FREE for i in r.indices for v in free_vars(i)
    }
    others = sorted(
        (a for a in spatial if a is not vec_axis and a.extent > 1),
        key=lambda a: (a.var in weight_vars, -a.extent),
    )
    accumulators = min(MAX_ACCUMULATORS, target.hw.vector_registers - SPARE_REGISTERS)
    if dot is not None and dot.form.halves:
        accumulators = HALVES_ACCUMULATORS
    vectors = vector_counts[0]
    blocks = _pixel_blocks(others, accumulators // (vectors * per_vector), _block)
    if any(a.extent % blocks.get(a.name, 1) for a in others):
        # A block that does not divide its axis leaves a partial tile whose loop has a variable extent:
        # it is not unrolled and its accumulators live in memory (AVX2's 12 accumulators on a 14x14 or
        # 7x7 ResNet stage of int8 dot products: 6 rows). Blocks that divide instead, with the vector
        # count (one that divides too) that fills the most accumulators, where they fill at least half
        # as many: a prime axis (a matmul of 197 rows) would leave one row of 2 accumulators.
        # A plain vector tile of two registers may also give way to one: a 7x7 stage of float convs on
        # AVX2 (12 accumulators) then takes 7 rows of one register, not 6 partial rows of two.
        def filled(v: int, pv: int) -> tuple[int, int, int, dict[str, int]]:
            b = _pixel_blocks(others, accumulators // (v * pv), _divisor_block)
            return v * pv * math.prod(b.values()), v, pv, b

        dividing = [v for v in vector_counts if vec_axis is None or (vec_axis.extent // vec) % v == 0]
        options = [(v, per_vector) for v in dividing or [1]]
        if dot is None and per_vector > 1 and vec % lanes == 0:
            options.append((1, 1))
        best = max((filled(v, pv) for v, pv in options), key=lambda f: f[0])
        partial = vectors * per_vector * math.prod(blocks.values())
        if 2 * best[0] >= partial:
            _, vectors, pv, blocks = best
            if pv != per_vector:
                vec, per_vector = lanes, pv
    if dot is not None:
        lengths[vec_axis.name] = [1, 1, vectors]
    elif vec_axis is not None:
        lengths[vec_axis.name] = [1, 1, vec]
    for name, b in blocks.items():
        lengths[name] = [1, 1, b]
    for k, a in enumerate(op.reduce_axes, start=len(op.axes)):
        depth = dot.form.depth if dot is not None and k == dot.depth else 1
        lengths[a.name] = [_reduce_tile(a.extent // depth)]
    return lengths, vec


def _tile_anchor(
    s: State,
    dag: ComputeDAG,
    op: ComputeOp,
    target: Target,
    pad_per_tile: bool = True,
    channel_tiles: bool = False,
) -> tuple[State, set[str]]:
    start = s
    sid = s.stage_id(op.name)
    consumers = effective_consumers(s, sid)
    fused = (
        len(consumers) == 1
        and not s.stages[consumers[0]].op.reduce_axes
        and _original(dag, s.stages[consumers[0]].name) is not None
        and dag.elementwise_match(op, _original(dag, s.stages[consumers[0]].name))
        and s.stages[consumers[0]].op.shape == op.shape
    )
    if fused:
        anchor, out = op.name, s.stages[consumers[0]].name
    else:
        s = s.cache_write(sid)
        anchor, out = s.stages[sid].name, op.name
    dots = dot_tilings(op, dot_forms(target))
    dot = dots[0] if dots else None  # the widest vectors
    vec_axis = op.axes[dot.lane] if dot is not None else _vector_axis(op)
    lengths, vec = _tile_lengths(op, target, vec_axis, dot)
    window = _window_producer(s, dag, op) if pad_per_tile else None
    # channels a tile of the vector axis holds: a dot product's length counts vectors of its lanes
    width = (vec if dot is not None else 1) * lengths[vec_axis.name][2] if vec_axis is not None else 1
    # a float depthwise conv pads per register block (below); others per parallel tile of rows
    depthwise = (
        _depthwise_window_axes(op, window, vec_axis)
        if window is not None and dot is None and np.dtype(op.dtype).kind == "f"
        else None
    )
    per_block = depthwise is not None
    if depthwise is not None:
        vec = _depthwise_block(*depthwise, vec_axis, lengths, vec, op.dtype, target)
    if (
        window is not None
        and not per_block
        and not _tile_by_window_rows(
            op, window, lengths, vec_axis, width, target.hw.num_cores, channel_tiles, dot is not None
        )
    ):
        window = None
    a_id = s.stage_id(anchor)
    if dot is not None:
        s, spatial = dot_tile(s, a_id, "SSRSRS", dot, lengths)
    else:
        s, spatial = multi_level_tile(s, a_id, "SSRSRS", lengths)
    if dot is None and vec_axis is not None and vec_axis is not op.axes[-1]:
        n, k = len(s.stages[a_id].iters), list(op.axes).index(vec_axis)
        inner = n - len(op.axes) + k
        s = s.reorder(a_id, [p for p in range(n) if p != inner] + [inner])
    o_id = s.stage_id(out)
    s, at = follow_tiling(s, o_id, spatial, 2)
    if window is None:
        s = _weight_blocks_outer(s, o_id, op, target.hw.num_cores)
    s = s.compute_at(a_id, o_id, at)
    n_axes = len(spatial)
    if window is not None:
        s = s.compute_at(window.name, o_id, at if per_block else n_axes - 1)
    if n_axes > 1:
        s = s.fuse(o_id, list(range(n_axes)))
    if (
        s.stages[o_id].iters[0].kind == IterKind.SPATIAL
        and vector_macs(op, target) >= MIN_PARALLEL_VECTOR_MACS
    ):
        s = s.parallel(o_id, 0)
    if vec > 1:
        last = len(s.stages[o_id].iters) - 1
        tile = s.stages[o_id].iters[last].extent or vec
        if dot is not None and tile > vec:
            # The copy-out (requantization) of a block of several vectors runs one vector of the
            # micro-kernel's lanes at a time, as the sums were made. One loop over the whole block made
            # LLVM scalarize a 40-lane block (5 x 8) lane by lane, and ran 48-lane ones (3 x 16) and the
            # 7x7x512 stage's 64-lane ones slower: untuned on Zen 5, 1 thread, in the model, MobileNetV2's
            # 16 -> 96 1x1 conv 0.091 -> 0.079 ms and QDQ ResNet-18's last convs 0.26-0.27 -> 0.23 ms.
            s = s.split(o_id, last, [vec]).unroll(o_id, last)
            last += 1
        s = s.vectorize(o_id, last)
        if dot is None:  # dot_tile vectorized it
            s = s.vectorize(a_id, len(s.stages[a_id].iters) - 1)
    s = s.pragma(a_id, 0, f"auto_unroll_max_step${AUTO_UNROLL}")
    if window is None:
        return s, {anchor, out}
    extents = [it.extent or 1 for it in infer_bound(s).stages[s.stage_id(window.name)].iters]
    if np.dtype(window.dtype).itemsize * int(np.prod(extents)) > MAX_TILE_SCRATCH_BYTES:
        # A depthwise conv's channels read channels of the window alone: tiles of one vector of channels
        # pad a slice that fits (MobileNetV2's 112x112x96 stride-2 one on AVX2: 2.4-2.6x slower as a
        # separate pass over the whole padded input)
        if not channel_tiles and vec_axis is not None and vec_axis.var in _window_vars(op, window):
            return _tile_anchor(start, dag, op, target, channel_tiles=True)
        return _tile_anchor(start, dag, op, target, pad_per_tile=False)
    return _vectorize_innermost(s, window.name, extents[-1], target), {anchor, out, window.name}


def _depthwise_window_axes(
    op: ComputeOp, window: ComputeOp, vec_axis: IterVar | None
) -> tuple[IterVar, IterVar] | None:
    """For a 2-D depthwise conv in NHWC (the vector axis, its channels, is the last index of every window
    read), the output axes that index the window's rows and columns; None for any other op."""
    reads = [r for r in reads_of(op) if r.tensor is window]
    if vec_axis is None or not reads:
        return None
    if any(len(r.indices) < 3 or r.indices[-1] is not vec_axis.var for r in reads):
        return None
    found = []
    for index in reads[0].indices[-3:-1]:
        axes = [a for a in op.axes if a.var in free_vars(index)]
        if len(axes) != 1:
            return None
        found.append(axes[0])
    return found[0], found[1]


def _depthwise_block(
    rows: IterVar,
    cols: IterVar,
    vec_axis: IterVar,
    lengths: dict[str, list[int]],
    vec: int,
    dtype: str,
    target: Target,
) -> int:
    """Tile lengths of a float depthwise conv that pads per register block, as MobileNetV2's tuned records
    do: up to DEPTHWISE_BLOCK pixels (rows x 1 or 2 columns, dividing both) of one vector of channels (or
    half of one; channels that neither divides keep their vector tile, and the block fewer pixels),
    each block padding the few rows and columns it reads (a row tile's pad had been a 146 KB copy of its
    input rows before any product); the parallel loop over blocks of rows, and of channels too where the
    rows give fewer than two blocks a core. Returns the vector tile. MobileNetV2 on Zen 5, untuned, in
    the model's sequence: its 17 depthwise convs 0.46-0.80x the time at 1 and 2 threads, its kernels
    0.913x / 0.910x in sum (znver3 code on the same machine: 0.958x / 0.961x)."""
    lanes = _lanes(dtype, target)
    v = next((n for n in (lanes, lanes // 2) if n > 1 and vec_axis.extent % n == 0), vec)
    pixels = max(1, DEPTHWISE_BLOCK // -(-v // lanes))  # a wider vector tile takes fewer pixels
    _, col_block, row_block = max(
        (r * c, c, r)
        for r in range(1, pixels + 1)
        if rows.extent % r == 0
        for c in (1, 2)
        if cols.extent % c == 0 and r * c <= pixels
    )
    lengths[rows.name] = [1, 1, row_block]
    lengths[cols.name] = [cols.extent // col_block, 1, col_block]
    few_rows = rows.extent // row_block < 2 * target.hw.num_cores
    lengths[vec_axis.name] = [1, 1, v] if few_rows else [vec_axis.extent // v, 1, v]
    return v


def _weight_blocks_outer(s: State, o_id: int, op: ComputeOp, cores: int) -> State:
    """On several cores, order the outer tiles weight blocks first where the weights outweigh the input:
    the parallel loop then hands each core its share of the weights, where with pixel blocks first every
    core read all of them (a 7x7x512 int8 conv's 2.4 MB, its 3x3 convs 1.13-1.2x faster at 2 threads on
    Zen 5; on one core the order did not pay)."""
    n = len(op.axes)
    reads = reads_of(op)
    weights = {r.tensor for r in reads if r.tensor.tag == LAYOUT_FREE}
    weight_bytes = sum(_bytes(t) for t in weights)
    input_bytes = sum(_bytes(t) for t in {r.tensor for r in reads} - weights)
    if cores < 2 or weight_bytes <= input_bytes:
        return s
    weight_vars = {v for r in reads if r.tensor in weights for i in r.indices for v in free_vars(i)}
    weight_axes = [k for k, a in enumerate(op.axes) if a.var in weight_vars]
    other_axes = [k for k in range(n) if k not in weight_axes]
    extents = [it.extent or 1 for it in infer_bound(s).stages[o_id].iters[:n]]
    weight_blocks = math.prod(extents[k] for k in weight_axes)
    pixel_blocks = math.prod(extents[k] for k in other_axes)
    # with weight blocks outermost every core reads the whole input once per weight block of its own
    if min(weight_blocks, pixel_blocks) <= 1 or weight_bytes * pixel_blocks <= input_bytes * weight_blocks:
        return s
    if weight_axes == list(range(len(weight_axes))):
        return s
    return s.reorder(o_id, weight_axes + other_axes + list(range(n, len(s.stages[o_id].iters))))


def _bytes(t) -> int:
    return int(np.prod([int(d) for d in t.shape])) * np.dtype(t.dtype).itemsize


def _window_producer(s: State, dag: ComputeDAG, op: ComputeOp) -> ComputeOp | None:
    """The padded input a windowed op (conv, pool) reads: a computed, non-inlined, reduction-free
    producer that only `op` reads (not a constant-indexed transform, which has its own layout)."""
    for r in reads_of(op):
        p = r.tensor
        if (
            isinstance(p, ComputeOp)
            and not p.reduce_axes
            and not p.attrs.get(CONST_INDEX_AXES)
            and dag.consumers[p] == [op]
            and s.stages[s.stage_id(p.name)].compute_at == ComputeAtKind.ROOT
        ):
            return p
    return None


def _window_vars(op: ComputeOp, window: ComputeOp) -> set:
    """The loop variables `op` indexes `window` with."""
    return set().union(*(free_vars(i) for r in reads_of(op) if r.tensor is window for i in r.indices))


def _tile_by_window_rows(
    op: ComputeOp,
    window: ComputeOp,
    lengths: dict[str, list[int]],
    vec_axis: IterVar | None,
    width: int,
    cores: int,
    channel_tiles: bool = False,
    vector_blocks: bool = False,
) -> bool:
    """Re-tile `op` so that its parallel outer tiles are blocks of one axis of the padded input (rows, or
    channels of a depthwise conv) and every other axis runs inside the tile; each tile then pads only
    the slice it reads, on the core that reads it, instead of a separate pass over the whole input
    (13% faster on a 64x56x56 3x3 conv at 2 threads). With `channel_tiles` the vector axis (a depthwise
    conv's channels) is tiled too, `width` channels a tile. With `vector_blocks` the vector axis's
    length counts vectors (a dot-product block), which a longer row of pixels may take the place of.
    False where no axis splits evenly over the cores.
    """
    reads_window = _window_vars(op, window)
    axes = [a for a in op.axes if a.extent > 1 and a is not vec_axis and a.var in reads_window]
    if not axes or cores < 1:
        return False
    axis = axes[0]
    inner = lengths[axis.name][2]
    block = next(
        (
            b
            for b in range(inner, max(1, inner // 2) - 1, -1)
            if axis.extent % b == 0 and (axis.extent // b) % cores == 0
        ),
        None,
    )
    if block is None:  # a depthwise conv may still split its channels (one vector a tile) over the cores
        if vec_axis is None or vec_axis.var not in reads_window:
            return False
        if (vec_axis.extent // width) % cores:
            return False
        block, channel_tiles = _divisor_block(axis.extent, inner), True
    outer = list(op.axes).index(axis)
    # The accumulators a smaller block of rows frees go to the next pixel axis left unblocked: a 3x3
    # stride-2 conv onto 28x28 on AVX2 keeps 2 rows x 2 columns, not 2 rows x 1 (1.4x faster).
    freed = inner // block
    for a in axes[1:]:
        if freed >= 2 and lengths[a.name][2] == 1:
            lengths[a.name] = [1, 1, _divisor_block(a.extent, freed)]
            break
    else:
        if freed >= 2 and vector_blocks and len(axes) > 1:
            _respend_on_pixels(lengths, axes[1], vec_axis, freed)
    for k, a in enumerate(op.axes):
        if a is axis:
            lengths[a.name] = [1, 1, block]
        elif channel_tiles and a is vec_axis:
            lengths[a.name] = [1, 1, lengths[a.name][2]]
        elif k > outer or a.var not in reads_window:
            s3 = lengths[a.name][2]
            lengths[a.name] = [-(-a.extent // s3), 1, s3]
    return True


def _respend_on_pixels(lengths: dict[str, list[int]], axis: IterVar, vec_axis: IterVar, freed: int) -> None:
    """Spend `freed` times a dot-product block's accumulators on its blocked pixel `axis`: a longer block
    where one divides the axis, else half the vectors for a block over twice as long. ResNet-18's 3x3
    stride-2 conv onto 14x14x256 (rows one a tile: two would leave an odd count of tiles for 2 cores) kept
    1 row x 2 columns x 4 vectors, 8 accumulators, where 14 has no divisor between 2 and 7, and takes 1 x 7
    x 2, 14: on Zen 5 0.161 -> 0.111 ms at 1 thread in QDQ ResNet-18, 0.082 -> 0.058 at 2."""
    cur, vectors = lengths[axis.name][2], lengths[vec_axis.name][2]
    grown = _divisor_block(axis.extent, cur * freed)
    if grown > cur:
        lengths[axis.name] = [1, 1, grown]
        return
    grown = _divisor_block(axis.extent, 2 * cur * freed)
    if vectors % 2 == 0 and grown > 2 * cur:
        lengths[vec_axis.name] = [1, 1, vectors // 2]
        lengths[axis.name] = [1, 1, grown]


def _vectorize_innermost(s: State, name: str, extent: int, target: Target) -> State:
    """Vectorize a stage's innermost loop of `extent` (split to a vector tile when it is longer than four
    registers)."""
    sid = s.stage_id(name)
    last = len(s.stages[sid].iters) - 1
    if extent <= 1:
        return s
    vec = _vector_tile(extent, _lanes(s.stages[sid].op.dtype, target))
    if vec < extent:
        s = s.split(sid, last, [vec])
        last += 1
    return s.vectorize(sid, last)


def _original(dag: ComputeDAG, name: str) -> ComputeOp | None:
    return next((op for op in dag.compute_ops if op.name == name), None)


def _parallel_vectorize(s: State, name: str, target: Target) -> State:
    """Parallel outer loops; the innermost spatial axis vectorized when the stage reads it contiguously
    (for a reduction, with the reduce loops moved outside the vector lanes)."""
    sid = s.stage_id(name)
    st = s.stages[sid]
    n_sp = sum(1 for it in st.iters if it.kind == IterKind.SPATIAL)
    n_red = len(st.iters) - n_sp
    lanes = _lanes(st.op.dtype, target)
    row = None if n_red else _row_axis_across_planes(st, n_sp, lanes)
    if row is not None:
        return _vectorize_contiguous_reads(s, sid, n_sp, lanes, row)
    last = st.iters[n_sp - 1] if n_sp else None
    vec_ok = last is not None and (last.extent or 1) > 1
    if vec_ok and n_red:
        vec_ok = reads_contiguously(st.op, st.op.axes[n_sp - 1].var)
    if vec_ok:
        vec = _vector_tile(last.extent, lanes)
        if vec < last.extent:
            s = s.split(sid, n_sp - 1, [vec])
            n_sp += 1
        if n_red:
            order = list(range(n_sp - 1)) + list(range(n_sp, n_sp + n_red)) + [n_sp - 1]
            s = s.reorder(sid, order)
    outer = n_sp - 1 if vec_ok else n_sp
    if outer > 1:
        s = s.fuse(sid, list(range(outer)))
        outer = 1
    # the work a thread gets includes the reduction it runs per point (softmax's row max: 512 x 128)
    points = int(np.prod([it.extent or 1 for it in st.iters]))
    if outer >= 1 and (s.stages[sid].iters[0].extent or 1) > 1 and points >= MIN_PARALLEL_POINTS:
        s = s.parallel(sid, 0)
    if vec_ok:
        s = s.vectorize(sid, len(s.stages[sid].iters) - 1)
    return s


def _row_axis_across_planes(st: Stage, n_sp: int, lanes: int) -> int | None:
    """For an element-wise stage whose last axis is a few channels that it reads across planes, as an
    image's NCHW -> NHWC transpose does (3 lanes a pixel, gathered): the axis its input rows run along,
    the one just outside those channels. Further out (a 7x7x512 NHWC -> NCHW transpose, whose last axis
    is a row of 7), the parallel loop over the axes around it had the threads write into the same cache
    lines (0.077 ms at 2 threads on Zen 5 instead of 0.005)."""
    if n_sp < 3 or len(st.iters) != len(st.op.axes) or (st.iters[-1].extent or 1) * 4 > lanes:
        return None
    k = contiguous_axis(st.op)
    return k if k == n_sp - 2 and st.op.axes[k].extent >= lanes // 4 else None


def _vectorize_contiguous_reads(s: State, sid: int, n_sp: int, lanes: int, k: int) -> State:
    """Vectorize axis `k`, which the inputs are read along contiguously (the width), with the short channel
    axis unrolled around it: contiguous loads and strided stores, instead of a loop iteration per pixel."""
    outer = [i for i in range(n_sp - 1) if i != k]
    s = s.reorder(sid, [*outer, k, n_sp - 1])  # ..., width, channels
    width = s.stages[sid].iters[n_sp - 2].extent or 1
    vec = _vector_tile(width, lanes)
    if vec < width:
        s = s.split(sid, n_sp - 2, [vec])  # ..., width.0, width.1, channels
        s = s.reorder(sid, [*range(n_sp - 2), n_sp - 2, n_sp, n_sp - 1])
    else:
        s = s.reorder(sid, [*range(n_sp - 2), n_sp - 1, n_sp - 2])
    n = len(s.stages[sid].iters)
    if len(outer) > 1:
        s = s.fuse(sid, list(range(len(outer))))
        n -= len(outer) - 1
    points = int(np.prod([it.extent or 1 for it in s.stages[sid].iters]))
    if (s.stages[sid].iters[0].extent or 1) > 1 and points >= MIN_PARALLEL_POINTS:
        s = s.parallel(sid, 0)
    return s.unroll(sid, n - 2).vectorize(sid, n - 1)
