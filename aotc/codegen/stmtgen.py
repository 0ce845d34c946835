"""Statement code generation: loops (serial, unrolled, vectorized, parallel), allocation, control flow."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from aotc.codegen.exprgen import CACHE_LINE, BufInfo, ExprGen, Ramp, VecCtx
from aotc.codegen.irbuilder import (
    KERNEL_ALIGNMENT,
    CodegenError,
    FunctionBuilder,
    ModuleBuilder,
    Val,
    const_val,
    elem_bytes,
    mem_type,
    vector_const_text,
    vtype,
)
from aotc.codegen.threadpool import MAX_TEAM, PARALLEL, TEAM_SIZE
from aotc.codegen.vecmath import VecLib
from aotc.ir.dot import DotForm, Operand, affine_offset, tensorized_dot
from aotc.ir.expr import Buffer, Expr, Load, Var, walk
from aotc.ir.stmt import (
    MAX_VECTOR_LANES,
    Allocate,
    BufferStore,
    For,
    ForKind,
    IfThenElse,
    LetStmt,
    PrimFunc,
    Seq,
    Stmt,
    walk_stmts,
)

MAX_STACK_BYTES = 256 * 1024
# A cached heap block starts with a header holding its capacity (a size_t), so that one block can serve
# allocations of different sizes; the data follows at this offset, which keeps it 64-byte aligned.
HEAP_HEADER_BYTES = 64
MAX_UNROLL = 512
CHUNKS_PER_THREAD = 8
_MISSING = object()


def stmt_exprs(s: Stmt) -> tuple[Expr, ...]:
    if isinstance(s, For):
        return (s.extent,)
    if isinstance(s, IfThenElse):
        return (s.cond,)
    if isinstance(s, BufferStore):
        return (s.value, *s.indices)
    if isinstance(s, LetStmt):
        return (s.value,)
    return ()


def used_names(body: Stmt) -> tuple[list[Var], list[Buffer]]:
    """Variables and buffers referenced in `body`, in first-use order."""
    vars_: dict[Var, None] = {}
    bufs: dict[Buffer, None] = {}
    for s in walk_stmts(body):
        if isinstance(s, BufferStore):
            bufs[s.buffer] = None
        for e in stmt_exprs(s):
            for n in walk(e):
                if isinstance(n, Var):
                    vars_[n] = None
                elif isinstance(n, Load):
                    bufs[n.buffer] = None
    return list(vars_), list(bufs)


def stored_buffers(body: Stmt) -> frozenset[Buffer]:
    """The buffers `body` stores to."""
    return frozenset(s.buffer for s in walk_stmts(body) if isinstance(s, BufferStore))


def all_buffers(func: PrimFunc) -> list[Buffer]:
    bufs: dict[Buffer, None] = dict.fromkeys(func.params)
    for s in walk_stmts(func.body):
        if isinstance(s, Allocate):
            bufs[s.buffer] = None
    bufs.update(dict.fromkeys(used_names(func.body)[1]))
    return list(bufs)


def free_heap_block(fb: FunctionBuilder, data: str) -> None:
    """Free the block of a cached heap buffer whose data pointer is `data` (nothing where it is null: an
    empty slot). The caller's module declares `free`."""
    block = fb.op(f"getelementptr i8, ptr {data}, i64 -{HEAP_HEADER_BYTES}")
    empty = fb.op(f"icmp eq ptr {data}, null")
    fb.emit(f"call void @free(ptr {fb.op(f'select i1 {empty}, ptr null, ptr {block}')})")


def _on_heap(buf: Buffer) -> bool:
    return buf.scope != "local" or buf.num_elements * elem_bytes(buf.dtype) > MAX_STACK_BYTES


def _may_fail(body: Stmt) -> bool:
    return any(isinstance(s, Allocate) and _on_heap(s.buffer) for s in walk_stmts(body))


class StmtGen(ExprGen):
    """Emits one LLVM function (a kernel or an outlined parallel region) from a statement."""

    def __init__(
        self,
        mod: ModuleBuilder,
        fb: FunctionBuilder,
        veclib: VecLib | None,
        alias_md: dict[Buffer, str],
        func_name: str,
        exit_failure: Callable[[], None],
        parallel_var: Var | None = None,
        read_only: frozenset[Buffer] = frozenset(),
    ) -> None:
        super().__init__(mod, fb, veclib)
        self.read_only = read_only
        self.alias_md = alias_md
        self.func_name = func_name
        self.exit_failure = exit_failure
        self.parallel_var = parallel_var
        self.heap: list[str] = []
        self.counters: str | None = None  # the chunk counters every parallel loop of this function reuses

    @contextmanager
    def bind(self, var: Var, val: Val | Ramp) -> Iterator[None]:
        if ("int64" if isinstance(val, Ramp) else val.dtype) != var.dtype:
            val = self.cast_val(self.mat(val), var.dtype)
        old = self.env.get(var, _MISSING)
        self.env[var] = val
        try:
            yield
        finally:
            if old is _MISSING:
                del self.env[var]
            else:
                self.env[var] = old  # type: ignore[assignment]

    def bind_buffer(self, buf: Buffer, ptr: str) -> None:
        self.bufs[buf] = BufInfo(ptr, self.alias_md.get(buf, ""))

    def fail(self) -> None:
        """Free the live heap buffers of this function and leave it with an error status."""
        for p in reversed(self.heap):
            free_heap_block(self.fb, p)
        self.exit_failure()

    def stmt(self, s: Stmt) -> None:
        fn = _STMT.get(type(s))
        if fn is None:
            raise CodegenError(f"cannot generate code for statement {type(s).__name__}")
        fn(self, s)

    def _seq(self, s: Seq) -> None:
        for child in s.stmts:
            self.stmt(child)

    def _store(self, s: BufferStore) -> None:
        off = self.flat_offset(s.buffer, s.indices)
        self.store(s.buffer, off, self.value(s.value))

    def _let(self, s: LetStmt) -> None:
        if s.value.dtype != s.var.dtype:
            raise CodegenError(f"let {s.var.name}: value dtype {s.value.dtype} differs from {s.var.dtype}")
        with self.bind(s.var, self.expr(s.value)):
            self.stmt(s.body)

    # ------------------------------------------------------------- branches

    def _if(self, s: IfThenElse) -> None:
        c = self.bool_value(s.cond)
        if c.const is not None:
            branch = s.then_case if c.const else s.else_case
            if branch is not None:
                self.stmt(branch)
            return
        if c.lanes:
            self._vector_if(c, s)
            return
        fb = self.fb
        then_l, end_l = fb.label("then"), fb.label("endif")
        else_l = fb.label("else") if s.else_case is not None else end_l
        fb.cond_br(c.ref, then_l, else_l)
        fb.start_block(then_l)
        with self.scope():
            self.stmt(s.then_case)
        fb.br(end_l)
        if s.else_case is not None:
            fb.start_block(else_l)
            with self.scope():
                self.stmt(s.else_case)
            fb.br(end_l)
        fb.start_block(end_l)

    def _vector_if(self, c: Val, s: IfThenElse) -> None:
        """Per-lane condition: each branch runs under the narrowed mask, skipped if no lane is active."""
        assert self.vec is not None
        outer = self.vec.mask
        arms = [(c, s.then_case)]
        if s.else_case is not None:
            arms.append((self.lnot(c), s.else_case))
        for cond, body in arms:
            mask = self.logic("and", outer, cond) if outer is not None else cond
            self.guarded(self.any_active(mask), lambda m=mask, b=body: self._under_mask(m, b))

    def _under_mask(self, mask: Val, body: Stmt) -> None:
        assert self.vec is not None
        saved = (self.vec.mask, self.vec.nonempty)
        self.vec.mask, self.vec.nonempty = mask, True
        try:
            self.stmt(body)
        finally:
            self.vec.mask, self.vec.nonempty = saved

    def branch(self, cond: Val, then: Callable[[], None], otherwise: Callable[[], None]) -> None:
        """Two versions of the code, chosen at run time (full vectors take the unmasked one)."""
        fb = self.fb
        then_l, else_l, end_l = fb.label("full"), fb.label("partial"), fb.label("vers_end")
        fb.cond_br(cond.ref, then_l, else_l)
        fb.start_block(then_l)
        with self.scope():
            then()
        fb.br(end_l)
        fb.start_block(else_l)
        with self.scope():
            otherwise()
        fb.br(end_l)
        fb.start_block(end_l)

    def guarded(self, cond: Val, body: Callable[[], None]) -> None:
        fb = self.fb
        body_l, end_l = fb.label("guard"), fb.label("guard_end")
        fb.cond_br(cond.ref, body_l, end_l)
        fb.start_block(body_l)
        with self.scope():
            body()
        fb.br(end_l)
        fb.start_block(end_l)

    # ---------------------------------------------------------------- loops

    def _for(self, s: For) -> None:
        kind = ForKind(s.kind)
        if kind == ForKind.THREAD_BINDING:
            raise CodegenError(
                f"thread binding {s.thread_tag or s.var.name!r} is not supported on CPU target (llvm)"
            )
        if kind == ForKind.PARALLEL:
            self._parallel(s)
            return
        ext = self.value(s.extent)
        if ext.lanes:
            raise CodegenError(f"extent of loop {s.var.name!r} varies across the lanes of a vectorized loop")
        if ext.const is not None and ext.const <= 0:
            return
        if kind == ForKind.TENSORIZED:
            self._tensorized(s)
        elif kind == ForKind.VECTORIZED and s.max_extent > 1:
            self._vectorized(s, ext)
        elif kind == ForKind.UNROLLED:
            self._unrolled(s, ext)
        elif ext.const == 1:
            with self.bind(s.var, const_val(0, "int64")):
                self.stmt(s.body)
        else:
            self.loop(s.var, const_val(0, "int64"), ext, lambda: self.stmt(s.body))

    def loop(self, var: Var, begin: Val, end: Val, body: Callable[[], None]) -> None:
        fb = self.fb
        pre = fb.cur_label
        head, body_l, latch, exit_l = (fb.label(n) for n in ("loop", "body", "latch", "endloop"))
        i, nxt = fb.tmp(), fb.tmp()
        fb.br(head)
        fb.start_block(head)
        fb.emit(f"{i} = phi i64 [ {begin.ref}, %{pre} ], [ {nxt}, %{latch} ]")
        fb.cond_br(fb.op(f"icmp slt i64 {i}, {end.ref}"), body_l, exit_l)
        fb.start_block(body_l)
        with self.scope(), self.bind(var, Val(i, "int64")):
            body()
        fb.br(latch)
        fb.start_block(latch)
        fb.emit(f"{nxt} = add nuw nsw i64 {i}, 1")
        fb.br(head)
        fb.start_block(exit_l)

    def _unrolled(self, s: For, ext: Val) -> None:
        """Constant extent: one copy per iteration; otherwise `max_extent` copies guarded by `k < extent`."""
        if ext.const is not None and ext.const <= MAX_UNROLL:
            for k in range(int(ext.const)):
                with self.bind(s.var, const_val(k, "int64")):
                    self.stmt(s.body)
            return
        if ext.const is not None or s.max_extent > MAX_VECTOR_LANES:
            self.loop(s.var, const_val(0, "int64"), ext, lambda: self.stmt(s.body))
            return
        fb = self.fb
        end_l = fb.label("unroll_end")
        for k in range(s.max_extent):
            next_l = fb.label("unroll")
            fb.cond_br(fb.op(f"icmp sgt i64 {ext.ref}, {k}"), next_l, end_l)
            fb.start_block(next_l)
            with self.scope(), self.bind(s.var, const_val(k, "int64")):
                self.stmt(s.body)
        fb.br(end_l)
        fb.start_block(end_l)

    def _vectorized(self, s: For, ext: Val) -> None:
        lanes = s.max_extent
        if self.vec is not None:
            raise CodegenError(
                f"vectorized loop {s.var.name!r} nested inside vectorized loop {self.vec.var.name!r}"
            )
        if lanes > MAX_VECTOR_LANES:
            raise CodegenError(
                f"vectorized loop {s.var.name!r} has {lanes} lanes (at most {MAX_VECTOR_LANES})"
            )
        if ext.const is not None:
            if ext.const > lanes:
                raise CodegenError(f"vectorized loop {s.var.name!r}: extent {ext.const} > max_extent {lanes}")
            mask = None
            if ext.const < lanes:
                bits = [i < ext.const for i in range(lanes)]
                mask = Val(vector_const_text(bits, "bool"), "bool", lanes)
            self._vector_body(s, lanes, mask)
            return
        iota = Val(vector_const_text(list(range(lanes)), "int64"), "int64", lanes)
        positive = self.icmp("sgt", ext, const_val(0, "int64"))
        full = self.icmp("sge", ext, const_val(lanes, "int64"))
        self.branch(
            full,
            lambda: self._vector_body(s, lanes, None),
            lambda: self.guarded(positive, lambda: self._vector_body(s, lanes, self.icmp("slt", iota, ext))),
        )

    def _vector_body(self, s: For, lanes: int, mask: Val | None) -> None:
        self.vec = VecCtx(s.var, lanes, mask, True)
        try:
            with self.bind(s.var, Ramp(const_val(0, "int64"), 1, lanes)):
                self.stmt(s.body)
        finally:
            self.vec = None

    # ----------------------------------------------------------- dot products

    def _tensorized(self, s: For) -> None:
        """`acc += u * s` over the loop's `depth` products per lane as one dot-product instruction."""
        if self.vec is None:
            raise CodegenError(f"tensorized loop {s.var.name!r} is not inside a vectorized loop")
        lanes = self.vec.lanes
        found = tensorized_dot(s, self.vec.var, lanes, self.mod.dot_forms)
        if isinstance(found, str):
            raise CodegenError(found)
        dot, form = found
        off = self.flat_offset(dot.acc, dot.indices)
        if not isinstance(off, Ramp):
            raise CodegenError(f"tensorized loop {s.var.name!r}: {dot.acc.name} does not vary with the lanes")
        u = self._dot_operand(dot.u, s.var, form)
        w = self._dot_operand(dot.s, s.var, form)
        acc = self.load(dot.acc, off)
        vt = vtype("i32", lanes)
        ops = form.operand_type
        if form.pairs_by:  # int16 sums of pairs of products, then each lane's two pairs summed
            half = vtype("i16", 2 * lanes)
            fn = self.mod.intrinsic(form.intrinsic, half, [ops, ops])
            pairs = self.fb.op(f"call {half} {fn}({ops} {u}, {ops} {w})")
            by = self.mod.intrinsic(form.pairs_by, vt, [half, half])
            sums = self.fb.op(f"call {vt} {by}({half} {pairs}, {half} splat (i16 1))")
            total = self.fb.op(f"add {vt} {acc.ref}, {sums}")
        elif form.halves:  # 16-bit views of the even and of the odd bytes, each summed by pairs
            half = vtype("i16", 2 * lanes)
            fn = self.mod.intrinsic(form.intrinsic, vt, [half, half])
            ue, uo = self._byte_halves(u, dot.u.unsigned, lanes)
            we, wo = self._byte_halves(w, dot.s.unsigned, lanes)
            even = self.fb.op(f"call {vt} {fn}({half} {ue}, {half} {we})")
            odd = self.fb.op(f"call {vt} {fn}({half} {uo}, {half} {wo})")
            total = self.fb.op(f"add {vt} {acc.ref}, {self.fb.op(f'add {vt} {even}, {odd}')}")
        elif not form.widens:  # the instruction adds its sums to the accumulator itself
            fn = self.mod.intrinsic(form.intrinsic, vt, [vt, ops, ops])
            total = self.fb.op(f"call {vt} {fn}({acc.typed}, {ops} {u}, {ops} {w})")
        else:
            fn = self.mod.intrinsic(form.intrinsic, vt, [ops, ops])
            pairs = self.fb.op(f"call {vt} {fn}({ops} {u}, {ops} {w})")
            total = self.fb.op(f"add {vt} {acc.ref}, {pairs}")
        self.store(dot.acc, off, Val(total, "int32", lanes))

    def _dot_operand(self, op: Operand, r: Var, form: DotForm) -> str:
        """The operand as the instruction reads it: element `lane * depth + j` holds the factor of lane
        `lane` at `r = j`; bytes for vpdpbusd, usdot, sdot and udot (int8 + 128 or uint8 - 128 as x ^ 0x80),
        16-bit values for vpmaddwd (bytes widened, int16 factors as they are)."""
        n = form.lanes * form.depth
        if op.word:
            return self._dot_elements(op.value, r, form.lanes, form.depth, "i16")
        raw = self._dot_elements(op.value, r, form.lanes, form.depth, "i8")
        if op.offset:
            raw = self.fb.op(f"xor <{n} x i8> {raw}, splat (i8 -128)")
        if not form.widens:
            return raw
        widen = "zext" if op.unsigned else "sext"
        return self.fb.op(f"{widen} <{n} x i8> {raw} to <{n} x i16>")

    def _byte_halves(self, raw: str, unsigned: bool, lanes: int) -> tuple[str, str]:
        """The even and the odd bytes of `raw` (`<4 * lanes x i8>`) as 16-bit values where they lie: the
        low byte of each 16-bit word masked (or shifted up and arithmetically back), the high one shifted
        down; zero- or sign-extended as the factor reads."""
        half = vtype("i16", 2 * lanes)
        words = self.fb.op(f"bitcast <{4 * lanes} x i8> {raw} to {half}")
        if unsigned:
            even = self.fb.op(f"and {half} {words}, splat (i16 255)")
            return even, self.fb.op(f"lshr {half} {words}, splat (i16 8)")
        up = self.fb.op(f"shl {half} {words}, splat (i16 8)")
        even = self.fb.op(f"ashr {half} {up}, splat (i16 8)")
        return even, self.fb.op(f"ashr {half} {words}, splat (i16 8)")

    def _dot_elements(self, value: Expr, r: Var, lanes: int, depth: int, elem: str) -> str:
        """`<lanes * depth x elem>` of an 8-bit (i8) or int16 (i16) value: one load where it is a
        broadcast run of `depth` elements or a packed [lanes][depth] block (the weight layout the tiles
        give), else per-`j` values interleaved."""
        assert self.vec is not None
        n = lanes * depth
        if isinstance(value, Load) and self.vec.mask is None:
            coef = affine_offset(value.buffer, value.indices, self.vec.var, r)
            if coef in ((0, 1), (depth, 1)):
                with self.bind(r, const_val(0, "int64")):
                    off = self.flat_offset(value.buffer, value.indices)
                base = off.base if isinstance(off, Ramp) else off
                info = self.buffer(value.buffer)
                width = depth if coef == (0, 1) else n
                p = self._gep(info, elem, base)
                raw = self.fb.op(f"load <{width} x {elem}>, ptr {p}, align 1{info.md}")
                if width == n:
                    self.prefetch_next_block(value, base, n * elem_bytes(value.buffer.dtype))
                    return raw
                picks = ", ".join(f"i32 {j}" for _ in range(lanes) for j in range(depth))
                return self.fb.op(
                    f"shufflevector <{depth} x {elem}> {raw}, <{depth} x {elem}> poison, <{n} x i32> <{picks}>"
                )
        parts = []
        for j in range(depth):
            with self.bind(r, const_val(j, "int64")):
                parts.append(self.bcast(self.value(value), lanes).ref)
        width = lanes
        while len(parts) > 1:  # concatenate pairwise into [v0 v1 ... v(depth-1)]
            pairs = ", ".join(f"i32 {i}" for i in range(2 * width))
            parts = [
                self.fb.op(
                    f"shufflevector <{width} x {elem}> {a}, <{width} x {elem}> {b}, <{2 * width} x i32> <{pairs}>"
                )
                for a, b in zip(parts[::2], parts[1::2])
            ]
            width *= 2
        picks = ", ".join(f"i32 {j * lanes + lane}" for lane in range(lanes) for j in range(depth))
        return self.fb.op(
            f"shufflevector <{n} x {elem}> {parts[0]}, <{n} x {elem}> poison, <{n} x i32> <{picks}>"
        )

    # -------------------------------------------------------------- parallel

    def _parallel(self, s: For) -> None:
        if self.vec is not None:
            raise CodegenError(f"parallel loop {s.var.name!r} inside vectorized loop {self.vec.var.name!r}")
        if self.parallel_var is not None:
            raise CodegenError(f"nested parallel loop {s.var.name!r} (parallel inside parallel)")
        ext = self.value(s.extent)
        if ext.const is not None and ext.const <= 0:
            return
        vars_, bufs = used_names(s.body)
        vars_ = [v for v in vars_ if v in self.env and v is not s.var]
        bufs = [b for b in bufs if b in self.bufs]
        values: list[tuple[str, str]] = [("i64", ext.ref)]
        values += [("ptr", self.bufs[b].ptr) for b in bufs]
        values += [(self.env[v].ty, self.env[v].ref) for v in vars_]  # type: ignore[union-attr]
        may_fail = _may_fail(s.body)
        fb = self.fb
        status = fb.alloca("i32", 1, 4) if may_fail else None
        if status:
            values.append(("ptr", status))
            fb.emit(f"store i32 0, ptr {status}")
        if self.counters is None:
            self.counters = fb.alloca("i8", MAX_TEAM * CACHE_LINE, CACHE_LINE)
        counters = self.counters
        team = fb.op(f"call i32 {TEAM_SIZE}()")
        team = fb.op(f"call i32 @llvm.smin.i32(i32 {team}, i32 {MAX_TEAM})")
        self.mod.intrinsic("llvm.smin.i32", "i32", ["i32", "i32"])
        self.mod.intrinsic("llvm.memset.p0.i64", "void", ["ptr", "i8", "i64", "i1"])
        size = fb.op(f"mul nsw i64 {fb.op(f'sext i32 {team} to i64')}, {CACHE_LINE}")
        fb.emit(
            f"call void @llvm.memset.p0.i64(ptr align {CACHE_LINE} {counters}, i8 0, i64 {size}, i1 false)"
        )
        values.append(("ptr", counters))
        closure = fb.alloca("i64", len(values), 8)
        for k, (ty, ref) in enumerate(values):
            slot = fb.op(f"getelementptr i64, ptr {closure}, i64 {k}") if k else closure
            fb.emit(f"store {ty} {ref}, ptr {slot}")
        outlined = self._outline(s, vars_, bufs, [ty for ty, _ in values])
        fb.emit(f"call void {PARALLEL}(ptr @{outlined}, ptr {closure}, i32 {team})")
        if status:
            # several participants may fail at once: atomic, so the read sees one of their stores
            loaded = fb.op(f"load atomic i32, ptr {status} monotonic, align 4")
            failed = fb.op(f"icmp ne i32 {loaded}, 0")
            fail_l, ok_l = fb.label("par_fail"), fb.label("par_ok")
            fb.cond_br(failed, fail_l, ok_l)
            fb.start_block(fail_l)
            self.fail()
            fb.start_block(ok_l)

    def _outline(self, s: For, vars_: list[Var], bufs: list[Buffer], types: list[str]) -> str:
        name = self.mod.unique_name(f"{self.func_name}.par")
        fb = FunctionBuilder(
            f'define internal void @"{name}"(ptr %closure, i32 %participant, i32 %team) #0 align {KERNEL_ALIGNMENT}'
        )
        loaded = []
        for k, ty in enumerate(types):
            slot = fb.op(f"getelementptr i64, ptr %closure, i64 {k}") if k else "%closure"
            loaded.append(fb.op(f"load {ty}, ptr {slot}"))
        counters = loaded[-1]
        status = loaded[-2] if _may_fail(s.body) else None

        def exit_failure() -> None:
            if status is not None:
                fb.emit(f"store atomic i32 1, ptr {status} monotonic, align 4")
            fb.ret("void")

        gen = StmtGen(
            self.mod,
            fb,
            self.veclib,
            self.alias_md,
            self.func_name,
            exit_failure,
            parallel_var=s.var,
            read_only=frozenset(bufs) - stored_buffers(s.body),
        )
        for b, ref in zip(bufs, loaded[1:]):
            gen.bind_buffer(b, ref)
        for v, ref in zip(vars_, loaded[1 + len(bufs) :]):
            gen.env[v] = Val(ref, self.env[v].dtype)  # type: ignore[union-attr]
        gen._claim_chunks(s.var, Val(loaded[0], "int64"), counters, lambda: gen.stmt(s.body))
        fb.ret("void")
        self.mod.functions.append(fb.render())
        self.mod.regions.append(name)
        return f'"{name}"'

    def _claim_chunks(self, var: Var, ext: Val, counters: str, body: Callable[[], None]) -> None:
        """Run `body` over this thread's share of [0, ext), then over what is left of the others' shares.

        Each thread's block (as a static schedule gives it) is cut into `CHUNKS_PER_THREAD` chunks that
        threads claim through the block's counter (one cache line each in the caller's frame): its owner
        claims them in order, and a thread that ran out claims the rest. A quiet machine runs the static
        schedule; a core slowed down by another tenant no longer holds the whole region up.
        """
        fb = self.fb
        n = Val(fb.op("sext i32 %team to i64"), "int64")
        t = Val(fb.op("sext i32 %participant to i64"), "int64")
        shared = self.icmp("sle", n, const_val(MAX_TEAM, "int64"))
        own = fb.alloca("i64", 1, 8)
        fb.emit(f"store i64 0, ptr {own}")
        victims = Val(fb.op(f"select i1 {shared.ref}, i64 {n.ref}, i64 1"), "int64")
        q, r = self.inst("sdiv", ext, n), self.inst("srem", ext, n)
        rounds = Var("steal", "int64")

        def claim_from_victim() -> None:
            v = self.inst("srem", self.inst("add nsw", t, self.env[rounds]), n)
            begin = self.inst("add nsw", self.inst("mul nsw", v, q), self.intrinsic("smin", [v, r]))
            size = self.inst("add nsw", q, self.cast_val(self.icmp("slt", v, r), "int64"))
            end = self.inst("add nsw", begin, size)
            per_chunk = self.inst("add nsw", size, const_val(CHUNKS_PER_THREAD - 1, "int64"))
            per_chunk = self.inst("sdiv", per_chunk, const_val(CHUNKS_PER_THREAD, "int64"))
            chunk = self.intrinsic("smax", [per_chunk, const_val(1, "int64")])
            offset = self.inst("mul nsw", v, const_val(CACHE_LINE, "int64"))
            line = fb.op(f"getelementptr i8, ptr {counters}, i64 {offset.ref}")
            slot = fb.op(f"select i1 {shared.ref}, ptr {line}, ptr {own}")
            claim, run, done = fb.label("claim"), fb.label("chunk"), fb.label("claimed")
            fb.br(claim)
            fb.start_block(claim)
            k = Val(fb.op(f"atomicrmw add ptr {slot}, i64 1 monotonic, align 8"), "int64")
            lo = self.inst("add nsw", begin, self.inst("mul nsw", k, chunk))
            fb.cond_br(self.icmp("slt", lo, end).ref, run, done)
            fb.start_block(run)
            hi = self.intrinsic("smin", [self.inst("add nsw", lo, chunk), end])
            self.loop(var, lo, hi, body)
            fb.br(claim)
            fb.start_block(done)

        self.loop(rounds, const_val(0, "int64"), victims, claim_from_victim)

    # ------------------------------------------------------------ allocation

    def _allocate(self, s: Allocate) -> None:
        buf = s.buffer
        if self.vec is not None:
            raise CodegenError(f"allocation of {buf.name!r} inside vectorized loop {self.vec.var.name!r}")
        if buf.scope not in ("local", "global"):
            raise CodegenError(
                f"buffer {buf.name!r} has scope {buf.scope!r}; the CPU target has local/global"
            )
        old = self.bufs.get(buf)
        count = buf.num_elements
        if not _on_heap(buf):
            p = self.fb.alloca(mem_type(buf.dtype), count, 64)
            self.bind_buffer(buf, p)
            for marker in ("start", "end"):
                self.mod.intrinsic(f"llvm.lifetime.{marker}.p0", "void", ["ptr"])
            self.fb.emit(f"call void @llvm.lifetime.start.p0(ptr {p})")
            self.stmt(s.body)
            self.fb.emit(f"call void @llvm.lifetime.end.p0(ptr {p})")
        else:
            self._heap_allocate(buf, s.body)
        if old is None:
            del self.bufs[buf]
        else:
            self.bufs[buf] = old

    def _heap_allocate(self, buf: Buffer, body: Stmt) -> None:
        """A heap buffer that outlives the call in a one-entry cache: a call takes the cached block (or
        allocates one, or a larger one where the cached block is too small) and puts it back when done,
        freeing whatever another thread put back meanwhile. Steady-state calls neither allocate nor
        page-fault (glibc would otherwise hand a large block back to the kernel on free and fault it in
        afresh on every call).

        A kernel's own temporaries (outside its parallel regions) share one cache per nesting depth with
        every kernel of the module: the kernels of a model run one after another, so its Winograd
        transforms and other temporaries all write the same block, which the previous kernel left in
        cache, instead of each kernel's own block, which the model's other kernels had evicted (and which
        each cost the process its size). A parallel region's buffer, one per thread, keeps a cache of its
        allocation site."""
        fb, mod = self.fb, self.mod
        size = -(-buf.num_elements * elem_bytes(buf.dtype) // 64) * 64
        size_t = mod.size_type  # i32 on 32-bit Arm, where i64 arguments would go in register pairs
        if size + HEAP_HEADER_BYTES >= 1 << (31 if size_t == "i32" else 63):
            raise CodegenError(f"buffer {buf.name!r} of {size} bytes is too large to allocate")
        alloc = mod.declare(
            "aligned_alloc", f"declare noalias ptr @aligned_alloc({size_t}, {size_t}) nounwind"
        )
        free = mod.declare("free", "declare void @free(ptr) nounwind")
        if self.parallel_var is None:
            slot = mod.heap_slot(f"aotc.scratch.{len(self.heap)}")
        else:
            slot = mod.heap_slot(mod.unique_name(f"{self.func_name}.{buf.name}.cached"))
        cached = fb.op(f"atomicrmw xchg ptr {slot}, ptr null acq_rel")
        check_l, small_l, new_l = fb.label("alloc_check"), fb.label("alloc_small"), fb.label("alloc_new")
        ok_l, fail_l, got_l = fb.label("alloc_ok"), fb.label("alloc_fail"), fb.label("alloc_got")
        fb.cond_br(fb.op(f"icmp eq ptr {cached}, null"), new_l, check_l)
        fb.start_block(check_l)
        cached_block = fb.op(f"getelementptr i8, ptr {cached}, i64 -{HEAP_HEADER_BYTES}")
        capacity = fb.op(f"load {size_t}, ptr {cached_block}")
        fb.cond_br(fb.op(f"icmp uge {size_t} {capacity}, {size}"), ok_l, small_l)
        fb.start_block(small_l)
        fb.emit(f"call void {free}(ptr {cached_block})")
        fb.br(new_l)
        fb.start_block(new_l)
        block = fb.op(f"call ptr {alloc}({size_t} 64, {size_t} {size + HEAP_HEADER_BYTES})")
        fb.cond_br(fb.op(f"icmp ne ptr {block}, null"), got_l, fail_l)
        fb.start_block(fail_l)
        self.fail()
        fb.start_block(got_l)
        fb.emit(f"store {size_t} {size}, ptr {block}")
        fresh = fb.op(f"getelementptr i8, ptr {block}, i64 {HEAP_HEADER_BYTES}")
        fb.br(ok_l)
        fb.start_block(ok_l)
        p = fb.op(f"phi ptr [ {cached}, %{check_l} ], [ {fresh}, %{got_l} ]")
        self.bind_buffer(buf, p)
        self.heap.append(p)
        self.stmt(body)
        self.heap.pop()
        free_heap_block(fb, fb.op(f"atomicrmw xchg ptr {slot}, ptr {p} acq_rel"))


_STMT = {
    Seq: StmtGen._seq,
    BufferStore: StmtGen._store,
    LetStmt: StmtGen._let,
    IfThenElse: StmtGen._if,
    For: StmtGen._for,
    Allocate: StmtGen._allocate,
}
