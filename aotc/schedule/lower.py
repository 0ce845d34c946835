"""Lower a State to the loop IR: bound inference, loop nests, guards for non-dividing splits.

Splits need not divide their extent: every root axis gets a guard unless the simplifier proves
it, and a guard that is affine in one loop variable becomes a clamp of that loop's extent (a
vectorized loop with a clamped extent runs masked lanes).

GPU states bind iterators to blockIdx/threadIdx/vthread: those become THREAD_BINDING loops. A stage
computed inside a kernel is "shared" when the threads of a block compute it together (its own
iterators are bound to threadIdx, or it sits outside every threadIdx loop): its region then covers
what all threads of the block read, and barriers fence its writes. Otherwise it is per-thread "local".
A reduction whose reduce iterator is bound to threadIdx becomes a cross-thread reduction: per-thread
partials in a register, combined by the block in a shared-memory tree (`_emit_cross_thread`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from aotc.ir.expr import (
    Binary,
    Buffer,
    Const,
    Expr,
    Load,
    Reduce,
    TensorRead,
    Var,
    binary,
    children,
    const,
    eq,
    free_vars,
    is_float,
    logical_and,
    rebuild,
    reduce_identity,
    substitute,
    transform,
    unique_name,
    walk_distinct,
)
from aotc.ir.simplify import bounds, from_terms, linear_terms, simplify, simplify_node
from aotc.ir.stmt import (
    Allocate,
    Barrier,
    BufferStore,
    For,
    ForKind,
    IfThenElse,
    LetStmt,
    PrimFunc,
    Seq,
    Stmt,
    seq,
)
from aotc.schedule.state import (
    THREAD_TAGS,
    Annotation,
    ComputeAtKind,
    IterKind,
    ScheduleError,
    Stage,
    State,
    innermost_positions,
    iterator_values,
    overflowing_splits,
    propagate_extents,
)
from aotc.te.tensor import NARROW_WEIGHTS, ComputeOp, PlaceholderOp

_FOR_KIND = {
    Annotation.NONE: ForKind.SERIAL,
    Annotation.PARALLEL: ForKind.PARALLEL,
    Annotation.VECTORIZE: ForKind.VECTORIZED,
    Annotation.UNROLL: ForKind.UNROLLED,
    Annotation.TENSORIZE: ForKind.TENSORIZED,
}


@dataclass
class _StageInfo:
    index: int
    stage: Stage
    leaf_vars: list[Var] = field(default_factory=list)
    extents: dict[int, int] = field(default_factory=dict)
    prefix: list[Var] = field(default_factory=list)
    region_min: list[Expr] = field(default_factory=list)
    region_ext: list[int] = field(default_factory=list)
    local: dict[int, Expr] = field(default_factory=dict)
    absolute: dict[int, Expr] = field(default_factory=dict)
    buffer: Buffer | None = None
    inner_guards: list = field(default_factory=list)
    scope: str = "local"  # of a stage computed at a loop: "local" or "shared"

    @property
    def path(self) -> list[Var]:
        return self.prefix + self.leaf_vars


@dataclass(frozen=True)
class _Guard:
    """`expr < upper` (upper not None) or `expr >= 0`."""

    expr: Expr
    upper: int | None

    def cond(self) -> Expr:
        return self.expr < self.upper if self.upper is not None else self.expr >= 0


class _Lowering:
    def __init__(self, state: State):
        if not state.concrete:
            raise ScheduleError("cannot lower a state with undefined split lengths (a sketch)")
        self.state = state
        self.stages = state.stages
        self.op_stage = {st.op: i for i, st in enumerate(self.stages)}
        self.ranges: dict[Var, tuple[int, int]] = {}
        self.bodies: dict[int, Expr] = {}
        self.infos: dict[int, _StageInfo] = {}
        self.attached: dict[tuple[int, int], list[int]] = {}
        self.names: set[str] = set()
        self.thread_tag: dict[Var, str] = {}  # loop variables bound to GPU indices
        for i, st in enumerate(self.stages):
            if st.compute_at == ComputeAtKind.ITER:
                assert st.attach is not None
                self.attached.setdefault(st.attach, []).append(i)
        for i, st in enumerate(self.stages):
            if isinstance(st.op, ComputeOp):
                self.bodies[i] = self._expand_inlined(st.op.body)
        self.starts: dict[int, Expr] = {}  # integer sums that start from a bias instead of 0
        for i in self.bodies:
            self._start_sum_from_bias(i)
        # each body's reads, found once: stages computed at a loop look for their consumers' reads, and
        # GPU shared stages for what their readers read
        self.reads = {
            j: [n for n in walk_distinct(body) if isinstance(n, TensorRead)]
            for j, body in self.bodies.items()
        }
        for i in reversed(range(len(self.stages))):
            st = self.stages[i]
            if st.is_placeholder or st.compute_at == ComputeAtKind.INLINED:
                continue
            self.infos[i] = self._infer(i)

    def _expand_inlined(self, body: Expr) -> Expr:
        def inline(node: Expr) -> Expr | None:
            if not isinstance(node, TensorRead):
                return None
            sid = self.op_stage.get(node.tensor)
            if sid is None:
                raise ScheduleError(f"tensor {node.tensor.name} is read but has no stage")
            st = self.stages[sid]
            if st.compute_at != ComputeAtKind.INLINED:
                return None
            op = st.op
            assert isinstance(op, ComputeOp)
            return substitute(self.bodies[sid], {a.var: i for a, i in zip(op.axes, node.indices)})

        return transform(body, inline)  # a shared sub-expression stays shared

    def _start_sum_from_bias(self, sid: int) -> None:
        """An integer sum whose one reader adds a per-element constant to it, `acc[..., c, ...] + bias[c]`,
        starts from `bias[c]` instead (docs/loop-ir.md#lowering): XNNPACK's bias in the accumulators'
        first value, one load and add less per output in every int8 layer's copy-out. Integer sums wrap,
        so the order does not change the result; float sums keep the add where the graph put it."""
        st = self.stages[sid]
        body = self.bodies[sid]
        if not (isinstance(body, Reduce) and body.combiner == "sum" and body.condition is None):
            return
        if is_float(body.dtype) or self._thread_reduce_position(st) is not None:
            return
        op = st.op
        readers = [
            j
            for j, b in self.bodies.items()
            if j != sid
            and self.stages[j].compute_at != ComputeAtKind.INLINED
            and any(isinstance(n, TensorRead) and n.tensor is op for n in walk_distinct(b))
        ]
        if len(readers) != 1 or op in self.state.outputs:
            return
        reader = readers[0]
        nodes = list(walk_distinct(self.bodies[reader]))
        reads = [n for n in nodes if isinstance(n, TensorRead) and n.tensor is op]
        sums = [(n, found) for n in nodes if (found := _bias_of(n, op)) is not None]
        if len(reads) != 1 or len(sums) != 1:
            return
        add, (read, bias, axis) = sums[0]
        parents = [n for n in nodes if any(k is read for k in children(n))]
        if read is not reads[0] or parents != [add]:
            return  # the sum is read once, only by that add
        self.starts[sid] = TensorRead(bias, (op.axes[axis].var,))
        self.bodies[reader] = transform(self.bodies[reader], lambda n: read if n is add else None)

    def _consumers(self, sid: int) -> list[int]:
        op = self.stages[sid].op
        out = []
        for j, reads in self.reads.items():
            st = self.stages[j]
            if st.compute_at == ComputeAtKind.INLINED or j == sid:
                continue
            if any(n.tensor is op for n in reads):
                out.append(j)
        return out

    def _infer(self, sid: int) -> _StageInfo:
        st = self.stages[sid]
        op = st.op
        assert isinstance(op, ComputeOp)
        info = _StageInfo(sid, st)
        n_sp = len(op.axes)
        if st.compute_at == ComputeAtKind.ROOT:
            info.region_min = [const(0)] * n_sp
            info.region_ext = list(op.shape)
        else:
            assert st.attach is not None
            tid, uid = st.attach
            target = self.infos.get(tid)
            if target is None:
                raise ScheduleError(
                    f"stage {st.name} is computed at {self.stages[tid].name}, which is not lowered"
                )
            pos = target.stage.position(uid)
            info.prefix = target.prefix + target.leaf_vars[: pos + 1]
            threads = {v for v in info.prefix if self.thread_tag.get(v, "").startswith("threadIdx")}
            in_kernel = any(v in self.thread_tag for v in info.prefix)
            cooperative = any(THREAD_TAGS.get(it.annotation, "").startswith("threadIdx") for it in st.iters)
            fixed = set(info.prefix)
            if in_kernel and (cooperative or not threads):
                # one copy per block: it holds what every thread of the block reads
                info.scope = "shared"
                fixed -= threads
            info.region_min, info.region_ext = self._region(sid, info.prefix, fixed)
            info.region_min = [simplify(m, self.ranges) for m in info.region_min]
        roots = {k: e for k, e in enumerate(info.region_ext)}
        for k, a in enumerate(op.reduce_axes, start=n_sp):
            roots[k] = a.extent
        ext = propagate_extents(st, roots)
        info.extents = {uid: e for uid, e in ext.items() if e is not None}
        leaf_map: dict[int, Expr] = {}
        for it in st.iters:
            v = Var(it.name)
            info.leaf_vars.append(v)
            if it.annotation in THREAD_TAGS:
                self.thread_tag[v] = THREAD_TAGS[it.annotation]
            self.ranges[v] = (0, info.extents[it.uid] - 1)
            leaf_map[it.uid] = v if info.extents[it.uid] > 1 else const(0)
        values = iterator_values(st, leaf_map, info.extents)
        info.local = {uid: simplify(values[uid], self.ranges) for uid, *_ in st.root_iters}
        info.inner_guards = [
            _Guard(simplify(values[uid], self.ranges), info.extents[uid])
            for uid in overflowing_splits(st, info.extents)
            if uid not in info.local
        ]
        info.absolute = {  # both terms are simplified: simplifying the sum's node is enough
            k: simplify_node(info.region_min[k] + e, self.ranges) if k < n_sp else e
            for k, e in info.local.items()
        }
        info.buffer = self._buffer(sid, info)
        return info

    def _buffer(self, sid: int, info: _StageInfo) -> Buffer:
        st = self.stages[sid]
        op = st.op
        name = unique_name(op.name, self.names)
        if st.compute_at == ComputeAtKind.ROOT and op in self.state.outputs:
            return Buffer(name, op.dtype, tuple(op.shape), "param")
        scope = "global" if st.compute_at == ComputeAtKind.ROOT else info.scope
        shape = tuple(info.region_ext)
        strides = _aligned_strides(shape, st.storage_align)
        if strides is None and scope == "local":
            strides = _loop_order_strides(shape, innermost_positions(st, len(op.axes)))
        return Buffer(name, op.dtype, shape, scope, strides)

    def _region(self, sid: int, prefix: list[Var], fixed: set[Var]) -> tuple[list[Expr], list[int]]:
        """Region of stage `sid` that its consumers read within one iteration of its attach loop.

        Loop variables of `prefix` outside `fixed` (a block's thread indices) range over their extent.
        """
        st = self.stages[sid]
        op = st.op
        lows: list[list[tuple[dict, int]]] = [[] for _ in op.shape]
        highs: list[list[int]] = [[] for _ in op.shape]
        full = [False] * len(op.shape)
        consumers = self._consumers(sid)
        if not consumers:
            raise ScheduleError(f"stage {st.name} is computed at a loop but nothing reads it")
        for cid in consumers:
            cinfo = self.infos.get(cid)
            if cinfo is None:
                raise ScheduleError(f"consumer {self.stages[cid].name} of {st.name} is not lowered before it")
            if cinfo.path[: len(prefix)] != prefix:
                raise ScheduleError(
                    f"stage {st.name} is computed inside a loop that its consumer "
                    f"{self.stages[cid].name} is not in"
                )
            cop = self.stages[cid].op
            assert isinstance(cop, ComputeOp)
            vmap = {a.var: cinfo.absolute[k] for k, a in enumerate(cop.all_axes)}
            for node in self.reads[cid]:
                if node.tensor is not op:
                    continue
                for d, idx in enumerate(node.indices):
                    if full[d]:
                        continue
                    e = substitute(idx, vmap)
                    sym = self._split_fixed(e, fixed)
                    if sym is None:
                        full[d] = True
                        continue
                    terms, lo, hi = sym
                    lows[d].append((terms, lo))
                    highs[d].append(hi)
        mins: list[Expr] = []
        exts: list[int] = []
        for d, extent in enumerate(op.shape):
            if full[d] or not lows[d] or any(t != lows[d][0][0] for t, _ in lows[d]):
                mins.append(const(0))
                exts.append(extent)
                continue
            terms = lows[d][0][0]
            lo = min(v for _, v in lows[d])
            hi = max(highs[d])
            width = int(hi - lo + 1)
            if width >= extent and not terms:
                mins.append(const(0))
                exts.append(extent)
                continue
            mins.append(simplify(from_terms(terms, int(lo)), self.ranges))
            exts.append(min(width, extent) if not terms else width)
        return mins, exts

    def _split_fixed(self, e: Expr, fixed: set[Var]) -> tuple[dict, float, float] | None:
        """e = (symbolic part over `fixed`) + v with v in [lo, hi]; None if not separable."""
        terms, c = linear_terms(e)
        sym: dict = {}
        lo = hi = c
        for atom, coef in terms.items():
            vs = free_vars(atom)
            if vs <= fixed:
                sym[atom] = coef
                continue
            if vs & fixed:
                return None
            alo, ahi = bounds(atom, self.ranges)
            if math.isinf(alo) or math.isinf(ahi):
                return None
            a, b = alo * coef, ahi * coef
            lo += min(a, b)
            hi += max(a, b)
        return sym, lo, hi

    # ---- emission -------------------------------------------------------------------------

    def lower(self, name: str) -> PrimFunc:
        params = []
        for op in self.state.dag.placeholders:
            sid = self.op_stage.get(op)
            if sid is None:
                continue
            params.append(Buffer(unique_name(op.name, self.names), op.dtype, tuple(op.shape), "param"))
        self.placeholder_buffers = {op: b for op, b in zip(self.state.dag.placeholders, params)}
        out_buffers = [self.infos[self.op_stage[o]].buffer for o in self.state.outputs]
        body_parts = []
        for i, st in enumerate(self.stages):
            if i in self.infos and st.compute_at == ComputeAtKind.ROOT:
                body_parts.append(self._emit_stage(i))
        body = seq(*body_parts)
        for _, info in sorted(self.infos.items(), reverse=True):
            if info.stage.compute_at == ComputeAtKind.ROOT and info.buffer.scope == "global":
                body = Allocate(info.buffer, body)
        return PrimFunc(name, tuple(params) + tuple(out_buffers), body)  # type: ignore[arg-type]

    def _load(self, node: TensorRead) -> Expr:
        op = node.tensor
        if isinstance(op, PlaceholderOp):
            return Load(self.placeholder_buffers[op], node.indices)
        info = self.infos[self.op_stage[op]]
        idx = [
            i if isinstance(m, Const) and m.value == 0 else simplify_node(i - m, self.ranges)
            for i, m in zip(node.indices, info.region_min)
        ]
        return Load(info.buffer, tuple(idx))

    def _value(self, e: Expr, vmap: dict[Var, Expr]) -> Expr:
        """`e` over the stage's loop variables, reads turned into loads.

        A Select is lazy in codegen, so a load in its untaken arm may be out of bounds (padding).
        A sub-expression that occurs more than once in `e` (a Winograd transform's reads, shared by its
        rows) is converted once.
        """
        memo: dict[int, Expr] = {}

        def value(e: Expr) -> Expr:
            if isinstance(e, Var):
                return vmap.get(e, e)
            got = memo.get(id(e))
            if got is not None:
                return got
            if isinstance(e, TensorRead):
                out = self._load(TensorRead(e.tensor, tuple(value(i) for i in e.indices)))
            else:
                kids = children(e)
                out = simplify_node(rebuild(e, tuple(value(k) for k in kids)), self.ranges) if kids else e
            memo[id(e)] = out
            return out

        return value(e)

    def _guards(self, info: _StageInfo) -> list[_Guard]:
        op = info.stage.op
        assert isinstance(op, ComputeOp)
        out: list[_Guard] = []
        # a guard's expression is simplified already, so its comparison node is all there is to simplify
        for g in info.inner_guards:
            proven = simplify_node(g.cond(), self.ranges)
            if not (isinstance(proven, Const) and proven.value):
                out.append(g)
        for k, a in enumerate(op.all_axes):
            local = info.local[k]
            is_spatial = k < len(op.axes)
            limit = info.region_ext[k] if is_spatial else a.extent
            cands = [_Guard(local, limit)]
            if is_spatial and info.stage.compute_at == ComputeAtKind.ITER:
                cands += [_Guard(info.absolute[k], a.extent), _Guard(info.absolute[k], None)]
            for g in cands:
                proven = simplify_node(g.cond(), self.ranges)
                if isinstance(proven, Const) and proven.value:
                    continue
                out.append(g)
        return out

    def _emit_stage(self, sid: int) -> Stmt:
        info = self.infos[sid]
        st = info.stage
        op = st.op
        assert isinstance(op, ComputeOp) and info.buffer is not None
        vmap = {a.var: info.absolute[k] for k, a in enumerate(op.all_axes)}
        store_idx = tuple(info.local[k] for k in range(len(op.axes)))
        body = self.bodies[sid]
        guards = self._guards(info)
        iters = list(st.iters)
        first_red = next((p for p, it in enumerate(iters) if it.kind != IterKind.SPATIAL), None)
        if isinstance(body, Reduce):
            across = self._thread_reduce_position(st)
            if across is not None:
                return self._finish(st, self._emit_cross_thread(info, body, across))
        if not isinstance(body, Reduce):
            store = BufferStore(info.buffer, self._value(body, vmap), store_idx)
            nest = self._nest(info, list(range(len(iters))), guards, store)
        else:
            cur = Load(info.buffer, store_idx)
            src = self._value(body.source, vmap)
            update: Stmt = BufferStore(info.buffer, simplify(_combine(body.combiner, cur, src)), store_idx)
            if body.condition is not None:
                update = IfThenElse(self._value(body.condition, vmap), update)
            start = self.starts.get(sid)
            first = reduce_identity(body.combiner, op.dtype) if start is None else self._value(start, vmap)
            init = BufferStore(info.buffer, first, store_idx)
            if any(it.kind == IterKind.MIXED for it in iters):
                # No loop separates the spatial and reduce parts: initialize on the first visit of each
                # element, which is the iteration where every reduce index is 0.
                first = logical_and(*[eq(info.absolute[k], 0) for k in range(len(op.axes), len(op.all_axes))])
                combined = seq(IfThenElse(simplify(first, self.ranges), init), update)
                return self._finish(st, self._nest(info, list(range(len(iters))), guards, combined))
            if first_red is None:
                first_red = len(iters)
            inner = list(range(first_red, len(iters)))
            outer_vars = set(info.prefix) | {info.leaf_vars[p] for p in range(first_red)}
            spatial_vars = {info.leaf_vars[p] for p, it in enumerate(iters) if it.kind == IterKind.SPATIAL}
            inner_guards = [g for g in guards if not free_vars(g.expr) <= outer_vars]
            outer_guards = [g for g in guards if free_vars(g.expr) <= outer_vars]
            init_positions = [p for p in inner if iters[p].kind == IterKind.SPATIAL]
            init_guards = [g for g in inner_guards if free_vars(g.expr) <= spatial_vars | outer_vars]
            init_nest = self._nest(info, init_positions, init_guards, init, attach=False)
            update_nest = self._nest(info, inner, inner_guards, update)
            nest = self._nest(info, list(range(first_red)), outer_guards, seq(init_nest, update_nest))
        return self._finish(st, nest)

    # ---- cross-thread reductions (GPU) ------------------------------------------------------

    def _thread_reduce_position(self, st: Stage) -> int | None:
        """Position of the reduce iterator bound to threadIdx (the block's threads reduce together)."""
        found = [
            p
            for p, it in enumerate(st.iters)
            if it.kind == IterKind.REDUCE and THREAD_TAGS.get(it.annotation, "").startswith("threadIdx")
        ]
        if len(found) > 1:
            names = ", ".join(st.iters[p].name for p in found)
            raise ScheduleError(
                f"stage {st.name}: reduce iterators {names} are all bound to threads; a cross-thread "
                "reduction binds one (fuse the reduce iterators first)"
            )
        return found[0] if found else None

    def _emit_cross_thread(self, info: _StageInfo, body: Reduce, p_thr: int) -> Stmt:
        """A reduction whose reduce iterator at `p_thr` is bound to threadIdx: an all-reduce of the block.

        Each thread folds its share into a register (from the combiner's identity; a thread past the
        extent or the split keeps it) in the stage's own loop order, so a stage computed at an outer
        reduce loop (a shared cache read) stays outside the thread loop. Then every thread of the block
        writes its partial to one slot of a shared buffer, the slots are combined in a tree, halving the
        active threads per step, with a barrier after every step that all threads reach (none sits under
        a condition), and thread 0 stores the result.
        """
        st = info.stage
        op = st.op
        assert isinstance(op, ComputeOp) and info.buffer is not None
        iters = st.iters
        first_red = next(p for p, it in enumerate(iters) if it.kind != IterKind.SPATIAL)
        for p in range(first_red, len(iters)):
            it = iters[p]
            if it.kind != IterKind.REDUCE:
                raise ScheduleError(
                    f"stage {st.name}: iterator {it.name} ({it.kind.name.lower()}) is among the reduce "
                    "loops; a cross-thread reduction needs every spatial iterator outside them"
                )
            if THREAD_TAGS.get(it.annotation, "").startswith("blockIdx"):
                raise ScheduleError(
                    f"stage {st.name}: reduce iterator {it.name} is bound to {THREAD_TAGS[it.annotation]}; "
                    "a reduction across blocks is not supported"
                )
        tag = THREAD_TAGS[iters[p_thr].annotation]
        own = info.extents[iters[p_thr].uid]
        # every thread the kernel launches along the tag takes part in the tree (a wider consumer loop
        # launches more than the split): the extra ones hold the identity
        n = max(own, self._launch_extent(info.index, tag))
        outer_vars = set(info.prefix) | {info.leaf_vars[p] for p in range(first_red)}
        lanes = []  # the block's other thread indices: each set of them reduces apart
        for v in outer_vars:
            other = self.thread_tag.get(v, "")
            if other == tag:
                raise ScheduleError(
                    f"stage {st.name}: {tag} is bound both outside its reduction and to its reduce iterator"
                )
            if other.startswith("threadIdx"):
                lanes.append(v)
        lanes.sort(key=lambda v: self.thread_tag[v])

        guards = self._guards(info)
        # a point past a spatial edge adds nothing; its guard goes on the update, never around the loops
        # that may hold barriers (a cache read at an outer reduce loop)
        edge = [g.cond() for g in guards if free_vars(g.expr) <= outer_vars]
        inner = [g for g in guards if not free_vars(g.expr) <= outer_vars]
        vmap = {a.var: info.absolute[k] for k, a in enumerate(op.all_axes)}
        acc = Buffer(unique_name(f"{op.name}.acc", self.names), op.dtype, (1,), "local")
        slots = (*(self.ranges[v][1] + 1 for v in lanes), n)
        red = Buffer(unique_name(f"{op.name}.red", self.names), op.dtype, slots, "shared")
        zero = (const(0),)
        update: Stmt = BufferStore(
            acc, simplify(_combine(body.combiner, Load(acc, zero), self._value(body.source, vmap))), zero
        )
        conds = [self._value(body.condition, vmap)] if body.condition is not None else []
        if conds or edge:
            update = IfThenElse(logical_and(*conds, *edge), update)
        accumulate = self._nest(info, list(range(first_red, len(iters))), inner, update)
        if own == 1 and n > 1:  # no loop binds the index: only thread 0 may add
            t0 = self._thread_var(iters[p_thr].name, tag, n)
            accumulate = For(t0, const(n), n, ForKind.THREAD_BINDING, IfThenElse(eq(t0, 0), accumulate), tag)

        # the tree runs in a thread loop of its own over all n threads: no guard around its barriers
        tvar = self._thread_var(iters[p_thr].name, tag, n)
        t: Expr = tvar if n > 1 else const(0)

        def slot(i: Expr) -> tuple[Expr, ...]:
            return (*lanes, i)

        tree: list[Stmt] = [BufferStore(red, Load(acc, zero), slot(t)), Barrier()]
        width = n
        while width > 1:
            half = 1 << ((width - 1).bit_length() - 1)  # the largest power of two below width
            fold = BufferStore(
                red, _combine(body.combiner, Load(red, slot(t)), Load(red, slot(t + half))), slot(t)
            )
            tree += [IfThenElse(t < width - half, fold), Barrier()]
            width = half
        store_idx = tuple(info.local[k] for k in range(len(op.axes)))
        result: Stmt = BufferStore(info.buffer, Load(red, slot(const(0))), store_idx)
        writer = [eq(t, 0)] if n > 1 else []
        if writer or edge:
            result = IfThenElse(simplify(logical_and(*writer, *edge), self.ranges), result)
        tree.append(result)
        combine: Stmt = seq(*tree)
        if n > 1:
            combine = For(tvar, const(n), n, ForKind.THREAD_BINDING, combine, tag)
        init = BufferStore(acc, reduce_identity(body.combiner, op.dtype), zero)
        # acc is per thread wherever it is declared (every statement of a kernel runs in each thread)
        nest = Allocate(red, Allocate(acc, seq(init, accumulate, combine)))
        return self._nest(info, list(range(first_red)), [], nest)

    def _thread_var(self, name: str, tag: str, extent: int) -> Var:
        v = Var(name)
        self.thread_tag[v] = tag
        self.ranges[v] = (0, extent - 1)
        return v

    def _launch_extent(self, sid: int, tag: str) -> int:
        """The threads along `tag` of the kernel that stage `sid` is part of (its root stage's kernel)."""

        def root(i: int) -> int:
            while self.stages[i].compute_at == ComputeAtKind.ITER:
                i = self.stages[i].attach[0]  # type: ignore[index]
            return i

        kernel = root(sid)
        best = 1
        for j, info in self.infos.items():
            if root(j) != kernel:
                continue
            for it in info.stage.iters:
                if THREAD_TAGS.get(it.annotation) == tag:
                    best = max(best, info.extents[it.uid])
        return best

    def _finish(self, st: Stage, nest: Stmt) -> Stmt:
        if st.auto_unroll_max_step > 0:
            nest, _ = _auto_unroll(nest, st.auto_unroll_max_step)
        return nest

    def _nest(
        self, info: _StageInfo, positions: list[int], guards: list[_Guard], body: Stmt, attach: bool = True
    ) -> Stmt:
        """Loops over `positions` of the stage's iterators around `body`, guards at the outermost legal level."""
        level_of: dict[Var, int] = {info.leaf_vars[p]: n for n, p in enumerate(positions)}
        placed: dict[int, list[_Guard]] = {}
        for g in guards:
            lv = [level_of[v] for v in free_vars(g.expr) if v in level_of]
            placed.setdefault(max(lv) if lv else -1, []).append(g)
        st = info.stage
        for n in reversed(range(len(positions))):
            p = positions[n]
            it = st.iters[p]
            var = info.leaf_vars[p]
            extent = info.extents[it.uid]
            kind, tag = self._kind(it.annotation)
            ext_expr: Expr = const(extent)
            conds: list[Expr] = []
            for g in placed.get(n, []):
                clamp = self._clamp_extent(g, var) if kind != ForKind.UNROLLED else None
                if clamp is None:
                    conds.append(g.cond())
                else:
                    ext_expr = simplify(binary("min", ext_expr, clamp), self.ranges)
            if conds:
                body = IfThenElse(logical_and(*conds), body)
            if attach:
                body = self._with_attached(info.index, it.uid, body)
            if extent > 1:
                narrow = kind == ForKind.TENSORIZED and bool(st.op.attrs.get(NARROW_WEIGHTS))
                body = For(var, ext_expr, extent, kind, body, tag, narrow)
        top = [g.cond() for g in placed.get(-1, [])]
        if top:
            body = IfThenElse(logical_and(*top), body)
        return body

    def _kind(self, ann: Annotation) -> tuple[ForKind, str]:
        if ann in THREAD_TAGS:
            return ForKind.THREAD_BINDING, THREAD_TAGS[ann]
        if ann not in _FOR_KIND:
            raise ScheduleError(f"annotation {ann.name} cannot be lowered")
        return _FOR_KIND[ann], ""

    def _clamp_extent(self, g: _Guard, var: Var) -> Expr | None:
        """For `c*var + rest < upper` with c > 0, the loop bound `ceil((upper - rest) / c)`."""
        if g.upper is None:
            return None
        terms, c0 = linear_terms(g.expr)
        coef = terms.pop(var, 0)
        if coef <= 0 or any(var in free_vars(a) for a in terms):
            return None
        rest = from_terms(terms, c0)
        return simplify((const(g.upper) - rest + (coef - 1)) // coef, self.ranges)

    def _with_attached(self, tid: int, uid: int, body: Stmt) -> Stmt:
        sids = self.attached.get((tid, uid), [])
        if not sids:
            return body
        # Shared stages are fenced by barriers: one before the first (the block's threads are done
        # reading the previous iteration's values), one before anything reads what they wrote.
        parts: list[Stmt] = []
        fresh: set = set()  # ops of shared stages written since the last barrier
        for s in sids:
            if s not in self.infos:
                continue
            shared = self.infos[s].scope == "shared"
            reads = {n.tensor for n in self.reads[s]}
            if (shared and not any(isinstance(p, Barrier) for p in parts)) or reads & fresh:
                parts.append(Barrier())
                fresh.clear()
            parts.append(self._emit_stage(s))
            if shared:
                fresh.add(self.stages[s].op)
        if fresh:
            parts.append(Barrier())
        out = seq(*parts, body)
        for s in reversed(sids):
            if s in self.infos:
                out = Allocate(self.infos[s].buffer, out)  # type: ignore[arg-type]
        return out


def _aligned_strides(shape: tuple[int, ...], aligns) -> tuple[int, ...] | None:
    """Row-major strides where stride[axis] % factor == offset for each (axis, factor, offset)."""
    if not aligns:
        return None
    wanted = {axis: (factor, offset) for axis, factor, offset in aligns}
    strides = [1] * len(shape)
    acc = 1
    for d in reversed(range(len(shape))):
        if d in wanted and d != len(shape) - 1:
            factor, offset = wanted[d]
            acc += (offset - acc) % factor
        strides[d] = acc
        acc *= shape[d]
    return tuple(strides)


def _loop_order_strides(shape: tuple[int, ...], positions: list[int]) -> tuple[int, ...] | None:
    """Dense strides that make the axis whose innermost loop is deepest the contiguous one.

    A local buffer is written by its own stage's loops, so laying it out in their order keeps a
    vectorized loop over any axis (not only the last) on unit-stride accesses.
    """
    order = sorted(range(len(shape)), key=lambda d: (positions[d], d))
    if order == list(range(len(shape))):
        return None
    strides = [1] * len(shape)
    acc = 1
    for d in reversed(order):
        strides[d] = acc
        acc *= shape[d]
    return tuple(strides)


def _bias_of(e: Expr, op: ComputeOp) -> tuple[TensorRead, PlaceholderOp, int] | None:
    """`e` as `op[i] + bias[i[axis]]` (either order): (the read of op, bias, axis), where bias is a 1-D
    placeholder of op's dtype as long as that axis."""
    if not (isinstance(e, Binary) and e.op == "add"):
        return None
    for read, other in ((e.a, e.b), (e.b, e.a)):
        if not (isinstance(read, TensorRead) and read.tensor is op and isinstance(other, TensorRead)):
            continue
        bias = other.tensor
        if not isinstance(bias, PlaceholderOp) or bias.dtype != op.dtype or len(other.indices) != 1:
            continue
        for axis, index in enumerate(read.indices):
            if index == other.indices[0] and tuple(bias.shape) == (op.shape[axis],):
                return read, bias, axis
    return None


def _combine(combiner: str, cur: Expr, value: Expr) -> Expr:
    if combiner == "sum":
        return cur + value
    if combiner == "prod":
        return cur * value
    return Binary("max" if combiner == "max" else "min", cur, value)


def _auto_unroll(s: Stmt, max_step: int) -> tuple[Stmt, float]:
    """Unroll constant serial loops whose unrolled size stays within `max_step` statements."""
    if isinstance(s, BufferStore):
        return s, 1
    if isinstance(s, Seq):
        parts, total = [], 0.0
        for c in s.stmts:
            c2, n = _auto_unroll(c, max_step)
            parts.append(c2)
            total += n
        return Seq(tuple(parts)), total
    if isinstance(s, IfThenElse):
        t, nt = _auto_unroll(s.then_case, max_step)
        e, ne = (None, 0.0) if s.else_case is None else _auto_unroll(s.else_case, max_step)
        return IfThenElse(s.cond, t, e), nt + ne
    if isinstance(s, (Allocate, LetStmt)):
        b, n = _auto_unroll(s.body, max_step)
        return replace(s, body=b), n
    if isinstance(s, For):
        b, n = _auto_unroll(s.body, max_step)
        constant = isinstance(s.extent, Const)
        if s.kind == ForKind.VECTORIZED:
            return replace(s, body=b), n
        if s.kind == ForKind.TENSORIZED:  # one instruction, unrolled by nature
            return replace(s, body=b), n
        if s.kind in (ForKind.SERIAL, ForKind.UNROLLED) and constant and s.max_extent * n <= max_step:
            return replace(s, body=b, kind=ForKind.UNROLLED), s.max_extent * n
        return replace(s, body=b), math.inf
    return s, 1


def lower(state: State, name: str = "kernel") -> PrimFunc:
    """The loop program of `state`; its params are the DAG's placeholders, then its outputs."""
    return _Lowering(state).lower(name)


def infer_bound(state: State) -> State:
    """`state` with the extents of every iterator filled in (compute_at stages included)."""
    low = _Lowering(state)
    stages = list(state.stages)
    for i, info in low.infos.items():
        st = stages[i]
        stages[i] = replace(st, iters=tuple(replace(it, extent=info.extents.get(it.uid)) for it in st.iters))
    return replace(state, stages=tuple(stages))
