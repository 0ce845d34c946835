"""Ansor's per-store program features (docs/search.md#features): 164 values for every BufferStore of a kernel.

Each row describes one store in the context of its loop nest:

    [0, 57)    computation: float and int op counts in 7 categories (× outer loop product), bool and
               select ops; vectorize / unroll / parallel count, extent product, innermost extent and
               the 8-way position one-hot of the innermost such loop; GPU bindings (zeros on CPU)
    [57, 147)  the top-5 buffers by (lines, bytes), 18 values each
    [147, 157) arithmetic-intensity curve
    [157, 161) allocation of the stored buffer
    [161, 164) outer product, number of loops, auto-unroll max step

Unlike TVM v0.14 the annotation position is computed: a loop is spatial for a store when its
variable indexes the stored element or the loop encloses the stored buffer's allocation, reduce
when it does not, and mixed when it reaches the store index only through a floordiv or only a
floormod (a fused spatial·reduce loop); inner/middle/outer is its rank among the loops of its
class in the nest. Every store gets its own row (TVM keeps one per buffer), float `mad` counts
add/sub nodes with a mul operand, and guards (if-conditions) add their ops at their loop level.
Counts are log-scaled with `log2p(x) = sign(x)·log2(1+|x|)`; one-hots and the curve are not.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from aotc.ir.expr import (
    Binary,
    Buffer,
    Call,
    Cast,
    Compare,
    Const,
    Expr,
    Load,
    Logical,
    Reinterpret,
    Select,
    Var,
    children,
    dtype_bits,
    free_vars,
    is_float,
)
from aotc.ir.simplify import bounds
from aotc.ir.stmt import Allocate, BufferStore, For, ForKind, IfThenElse, LetStmt, PrimFunc, Seq, Stmt
from aotc.schedule.state import State

MAX_N_BUFS = 5
CURVE_SAMPLES = 10
CACHE_LINE_BYTES = 64
BUFFER_FEATURES = 18

POSITIONS = (
    "none",
    "inner_spatial",
    "middle_spatial",
    "outer_spatial",
    "inner_reduce",
    "middle_reduce",
    "outer_reduce",
    "mixed",
)
POS_NONE, POS_INNER_SPATIAL, POS_MIDDLE_SPATIAL, POS_OUTER_SPATIAL = 0, 1, 2, 3
POS_INNER_REDUCE, POS_MIDDLE_REDUCE, POS_OUTER_REDUCE, POS_MIXED = 4, 5, 6, 7

OP_CATEGORIES = ("mad", "addsub", "mul", "divmod", "cmp", "math_func", "other_func")
GPU_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z", "vthread")
ACCESS_TYPES = ("read", "write", "read_write")
REUSE_TYPES = ("loop_multiple_read", "serial_multiple_read_write", "no_reuse")
ACC_READ, ACC_WRITE, ACC_RW = 0, 1, 2
REUSE_LOOP, REUSE_SERIAL, REUSE_NONE = 0, 1, 2


def _feature_names() -> list[str]:
    names = [f"float_{c}" for c in OP_CATEGORIES] + [f"int_{c}" for c in OP_CATEGORIES]
    names += ["bool_op", "select_op"]
    for kind in ("vec", "unroll", "parallel"):
        names += [f"{kind}_num", f"{kind}_prod", f"{kind}_len"] + [f"{kind}_type.{p}" for p in POSITIONS]
    names += ["is_gpu"] + [f"{t.replace('.', '_')}_len" for t in GPU_TAGS]
    for b in range(MAX_N_BUFS):
        names += [f"B{b}.acc_type.{a}" for a in ACCESS_TYPES]
        names += [f"B{b}.{f}" for f in ("bytes", "unique_bytes", "lines", "unique_lines")]
        names += [f"B{b}.reuse_type.{r}" for r in REUSE_TYPES]
        names += [f"B{b}.{f}" for f in ("reuse_dis_iter", "reuse_dis_bytes", "reuse_ct")]
        names += [f"B{b}.{f}_d_reuse_ct" for f in ("bytes", "unique_bytes", "lines", "unique_lines")]
        names.append(f"B{b}.stride")
    names += [f"arith_intensity_curve_{i}" for i in range(CURVE_SAMPLES)]
    names += ["alloc_size", "alloc_prod", "alloc_outer_prod", "alloc_inner_prod"]
    names += ["outer_prod", "num_loops", "auto_unroll_max_step"]
    return names


FEATURE_NAMES: list[str] = _feature_names()
N_FEATURES = len(FEATURE_NAMES)
assert N_FEATURES == 164

OFF_FLOAT_OPS = 0
OFF_INT_OPS = 7
OFF_BOOL = 14
OFF_SELECT = 15
OFF_VEC = 16
OFF_UNROLL = 27
OFF_PARALLEL = 38
OFF_GPU = 49
OFF_BUFFERS = 57
OFF_CURVE = OFF_BUFFERS + MAX_N_BUFS * BUFFER_FEATURES
OFF_ALLOC = OFF_CURVE + CURVE_SAMPLES
OFF_OUTER = OFF_ALLOC + 4

_UNSCALED = [
    i
    for i, n in enumerate(FEATURE_NAMES)
    if "_type." in n or n.startswith("arith_intensity_curve") or n == "is_gpu"
]
LOG_SCALED = np.ones(N_FEATURES, dtype=bool)
LOG_SCALED[_UNSCALED] = False

_ANNOTATED = {ForKind.VECTORIZED: OFF_VEC, ForKind.UNROLLED: OFF_UNROLL, ForKind.PARALLEL: OFF_PARALLEL}
_BINARY_CATEGORY = {
    "add": 1,
    "sub": 1,
    "mul": 2,
    "div": 3,
    "floordiv": 3,
    "floormod": 3,
    "min": 4,
    "max": 4,
    "pow": 5,
    "bitand": 1,  # one instruction, as add
    "bitor": 1,
    "bitxor": 1,
}
_BIG = 1e18


def log2p(x: np.ndarray | float) -> np.ndarray:
    """sign(x)·log2(1+|x|)."""
    x = np.asarray(x, dtype=np.float64)
    return np.sign(x) * np.log2(1.0 + np.abs(x))


# ---- IR walk ----------------------------------------------------------------------------------


@dataclass(slots=True)
class _Loop:
    var: Var
    extent: int
    kind: ForKind
    tag: str


@dataclass(slots=True)
class _StoreCtx:
    store: BufferStore
    loops: tuple[int, ...]
    conds: tuple[tuple[Expr, int], ...]
    alloc_depth: int
    alloc_outer_prod: float


@dataclass
class _Collector:
    loops: list[_Loop] = field(default_factory=list)
    stores: list[_StoreCtx] = field(default_factory=list)
    allocs: dict[Buffer, tuple[int, float]] = field(default_factory=dict)

    def visit(self, s: Stmt, stack: tuple[int, ...], conds: tuple, prod: float) -> None:
        if isinstance(s, For):
            self.loops.append(_Loop(s.var, max(1, s.max_extent), s.kind, s.thread_tag))
            self.visit(s.body, (*stack, len(self.loops) - 1), conds, prod * max(1, s.max_extent))
        elif isinstance(s, Seq):
            for c in s.stmts:
                self.visit(c, stack, conds, prod)
        elif isinstance(s, IfThenElse):
            inner = (*conds, (s.cond, len(stack)))
            self.visit(s.then_case, stack, inner, prod)
            if s.else_case is not None:
                self.visit(s.else_case, stack, inner, prod)
        elif isinstance(s, Allocate):
            self.allocs[s.buffer] = (len(stack), prod)
            self.visit(s.body, stack, conds, prod)
        elif isinstance(s, LetStmt):
            self.visit(s.body, stack, conds, prod)
        elif isinstance(s, BufferStore):
            depth, outer = self.allocs.get(s.buffer, (0, 1.0))
            self.stores.append(_StoreCtx(s, stack, conds, depth, outer))


# ---- expressions: op counts, affine decomposition -----------------------------------------


def _count_ops(e: Expr, counts: np.ndarray) -> None:
    """Adds the ops of `e` to counts[0:16] (float categories, int categories, bool, select)."""
    stack = [e]
    while stack:
        node = stack.pop()
        if isinstance(node, Binary):
            base = OFF_FLOAT_OPS if is_float(node.a.dtype) else OFF_INT_OPS
            counts[base + _BINARY_CATEGORY[node.op]] += 1
            if node.op in ("add", "sub") and (_is_mul(node.a) or _is_mul(node.b)):
                counts[base] += 1
            stack.append(node.a)
            stack.append(node.b)
        elif isinstance(node, Compare):
            counts[(OFF_FLOAT_OPS if is_float(node.a.dtype) else OFF_INT_OPS) + 4] += 1
            stack.append(node.a)
            stack.append(node.b)
        elif isinstance(node, Call):
            counts[(OFF_FLOAT_OPS if is_float(node.dtype) else OFF_INT_OPS) + 5] += 1
            stack.extend(node.args)
        elif isinstance(node, Logical):
            counts[OFF_BOOL] += 1
            stack.extend(children(node))
        elif isinstance(node, Select):
            counts[OFF_SELECT] += 1
            stack.extend(children(node))
        elif isinstance(node, (Cast, Reinterpret, Load)):
            stack.extend(children(node))


def _is_mul(e: Expr) -> bool:
    return isinstance(e, Binary) and e.op == "mul"


@dataclass(slots=True)
class _Affine:
    """sum(coef·var) + sum(coef·atom) + const; atoms are non-linear integer sub-expressions."""

    coefs: dict[Var, int]
    atoms: list[tuple[Expr, int]]
    const: int


def _decompose(e: Expr) -> _Affine:
    """The linear form of an index as lowered (already simplified): unlike `aotc.ir.simplify.linear_terms`
    it does not simplify again, which matters on this hot path."""
    out = _Affine({}, [], 0)
    _accumulate(e, 1, out)
    return out


def _accumulate(e: Expr, scale: int, out: _Affine) -> None:
    if isinstance(e, Var):
        out.coefs[e] = out.coefs.get(e, 0) + scale
    elif isinstance(e, Const):
        out.const += int(e.value) * scale
    elif isinstance(e, Binary) and e.op in ("add", "sub"):
        _accumulate(e.a, scale, out)
        _accumulate(e.b, scale if e.op == "add" else -scale, out)
    elif isinstance(e, Binary) and e.op == "mul" and isinstance(e.b, Const):
        _accumulate(e.a, scale * int(e.b.value), out)
    elif isinstance(e, Binary) and e.op == "mul" and isinstance(e.a, Const):
        _accumulate(e.b, scale * int(e.a.value), out)
    else:
        out.atoms.append((e, scale))


def _derivative(e: Expr, v: Var) -> float:
    """Approximate change of `e` per unit step of `v` (exact for affine expressions)."""
    aff = _decompose(e)
    d = float(aff.coefs.get(v, 0))
    for atom, coef in aff.atoms:
        if v in free_vars(atom):
            d += coef * _atom_derivative(atom, v)
    return d


def _atom_derivative(atom: Expr, v: Var) -> float:
    if isinstance(atom, Binary) and isinstance(atom.b, Const) and atom.b.value:
        if atom.op == "floordiv":
            return _derivative(atom.a, v) / float(atom.b.value)
        if atom.op == "floormod":
            return _derivative(atom.a, v)
    if isinstance(atom, Binary) and atom.op in ("min", "max"):
        return max(abs(_derivative(atom.a, v)), abs(_derivative(atom.b, v)))
    if isinstance(atom, Select):
        return max(abs(_derivative(atom.true_value, v)), abs(_derivative(atom.false_value, v)))
    return 1.0


def _is_injective_in(affs: list[_Affine], v: Var) -> bool:
    """False when `v` reaches the indices only through floordivs or only floormods (a fused
    spatial·reduce loop, whose distinct iterations revisit the same element)."""
    if any(aff.coefs.get(v, 0) for aff in affs):
        return True
    ops = {a.op for aff in affs for a, _ in aff.atoms if isinstance(a, Binary) and v in free_vars(a)}
    return not ops or ("floordiv" in ops and "floormod" in ops) or bool(ops - {"floordiv", "floormod"})


# ---- per-function extraction ----------------------------------------------------------------


@dataclass(slots=True)
class _Access:
    buffer: Buffer
    acc_type: int
    index_lists: list[tuple[Expr, ...]]


@dataclass(slots=True)
class _StoreData:
    """What one store touches, per level i (loops i.. of its nest varying, outer ones at 0)."""

    accesses: list[_Access]
    touched: np.ndarray  # [n_bufs, L] elements
    ele_bytes: np.ndarray  # [n_bufs]
    uses: np.ndarray  # [n_bufs, L] bool: loop var appears in the buffer's indices
    strides: np.ndarray  # [n_bufs, L] min |flat stride| in elements (0: not used)
    contiguous: np.ndarray  # [n_bufs] contiguous elements of the outermost region


class _Extractor:
    def __init__(self, func: PrimFunc, auto_unroll: Mapping[str, int] | None):
        col = _Collector()
        col.visit(func.body, (), (), 1.0)
        self.loops = col.loops
        self.stores = col.stores
        self.auto_unroll = auto_unroll
        self.is_gpu = any(lp.kind == ForKind.THREAD_BINDING for lp in self.loops)
        self.affine_cache: dict[int, _Affine] = {}
        self.atom_vars: dict[int, set[Var]] = {}
        self.keep: list[Expr] = []

    def affine(self, e: Expr) -> _Affine:
        key = id(e)
        got = self.affine_cache.get(key)
        if got is None:
            got = self.affine_cache[key] = _decompose(e)
            self.keep.append(e)
        return got

    def vars_of(self, e: Expr) -> set[Var]:
        key = id(e)
        got = self.atom_vars.get(key)
        if got is None:
            got = self.atom_vars[key] = free_vars(e)
            self.keep.append(e)
        return got

    def run(self) -> np.ndarray:
        datas = [self.store_data(ctx) for ctx in self.stores]
        n_loops = len(self.loops)
        loop_bytes = np.zeros(n_loops)
        loop_ele_bytes = np.zeros(n_loops)
        loop_buf: dict[tuple[int, Buffer], list[float]] = {}
        for ctx, d in zip(self.stores, datas):
            if not ctx.loops:
                continue
            idx = np.asarray(ctx.loops)
            np.add.at(loop_bytes, idx, (d.touched * d.ele_bytes[:, None]).sum(axis=0))
            np.add.at(loop_ele_bytes, idx, float(d.ele_bytes.sum()))
            for b, acc in enumerate(d.accesses):
                for i, lid in enumerate(ctx.loops):
                    loop_buf.setdefault((lid, acc.buffer), []).append(float(d.touched[b, i]))
        self.loop_bytes, self.loop_ele_bytes, self.loop_buf = loop_bytes, loop_ele_bytes, loop_buf
        rows = np.zeros((len(self.stores), N_FEATURES))
        for r, (ctx, d) in enumerate(zip(self.stores, datas)):
            self.fill_row(rows[r], ctx, d)
        out = np.where(LOG_SCALED, log2p(rows), rows)
        return out.astype(np.float32)

    # -- access analysis --

    def accesses(self, store: BufferStore) -> list[_Access]:
        found: dict[Buffer, _Access] = {store.buffer: _Access(store.buffer, ACC_WRITE, [store.indices])}
        stack: list[Expr] = [store.value]
        while stack:
            node = stack.pop()
            if isinstance(node, Load):
                acc = found.get(node.buffer)
                if acc is None:
                    found[node.buffer] = _Access(node.buffer, ACC_READ, [node.indices])
                else:
                    if acc.acc_type == ACC_WRITE:
                        acc.acc_type = ACC_RW
                    if not any(_same_indices(node.indices, il) for il in acc.index_lists):
                        acc.index_lists.append(node.indices)
                stack.extend(node.indices)
            elif not isinstance(node, (Var, Const)):
                stack.extend(children(node))
        return list(found.values())

    def store_data(self, ctx: _StoreCtx) -> _StoreData:
        loops = [self.loops[i] for i in ctx.loops]
        n = len(loops)
        pos = {lp.var: j for j, lp in enumerate(loops)}
        ext = np.array([lp.extent for lp in loops], dtype=np.float64)
        accs = self.accesses(ctx.store)
        nb = len(accs)
        touched = np.ones((nb, n))
        uses = np.zeros((nb, n), dtype=bool)
        strides = np.zeros((nb, n))
        contiguous = np.ones(nb)
        ele = np.array([max(1, dtype_bits(a.buffer.dtype) // 8) for a in accs], dtype=np.float64)
        for b, acc in enumerate(accs):
            self.analyze_buffer(acc, pos, ext, b, touched, uses, strides, contiguous)
        return _StoreData(accs, touched, ele, uses, strides, contiguous)

    def analyze_buffer(self, acc, pos, ext, b, touched, uses, strides, contiguous) -> None:
        buf = acc.buffer
        n = len(ext)
        ndim = len(buf.shape)
        if ndim == 0:
            return
        nl = len(acc.index_lists)
        coef = np.zeros((nl, ndim, n))
        deriv = np.zeros((nl, ndim, n))
        lo = np.zeros((nl, ndim, n))
        hi = np.zeros((nl, ndim, n))
        used = np.zeros((nl, ndim, n), dtype=bool)
        for k, il in enumerate(acc.index_lists):
            for d, idx in enumerate(il):
                aff = self.affine(idx)
                lo[k, d] += aff.const
                hi[k, d] += aff.const
                for v, c in aff.coefs.items():
                    j = pos.get(v)
                    if j is None:
                        lo[k, d] -= _BIG
                        hi[k, d] += _BIG
                        continue
                    coef[k, d, j] += c
                for atom, c in aff.atoms:
                    self.add_atom(atom, c, pos, ext, lo[k, d], hi[k, d], deriv[k, d], used[k, d])
        deriv += coef
        used |= coef != 0
        span = coef * (ext - 1.0)
        hi += _rev_cumsum(np.maximum(span, 0.0))
        lo += _rev_cumsum(np.minimum(span, 0.0))
        shape = np.array(buf.shape, dtype=np.float64)
        region = np.clip(hi.max(axis=0) - lo.min(axis=0) + 1.0, 1.0, shape[:, None])
        touched[b] = region.prod(axis=0)
        uses[b] = used.any(axis=(0, 1))
        flat = np.abs(np.einsum("kdn,d->kn", deriv, np.array(buf.strides, dtype=np.float64)))
        flat[flat == 0] = np.inf
        s = flat.min(axis=0)
        s[np.isinf(s)] = 0.0
        strides[b] = s
        contiguous[b] = _contiguous(region[:, 0] if n else np.ones(ndim), shape)

    def add_atom(self, atom, c, pos, ext, lo, hi, deriv, used) -> None:
        """Adds c·atom's bounds per level to lo/hi and its derivative per loop to `deriv`."""
        vs = self.vars_of(atom)
        js = sorted(pos[v] for v in vs if v in pos)
        unknown = len(js) < len(vs)
        n = len(ext)
        loops_vars = list(pos)  # loop variables by position, outermost first
        prev = 0
        for m in range(len(js) + 1):
            end = js[m] + 1 if m < len(js) else n
            if end <= prev:
                continue
            varying = js[m:]
            ranges = {loops_vars[j]: (0, int(ext[j]) - 1) for j in varying}
            for j in js[:m]:
                ranges[loops_vars[j]] = (0, 0)
            alo, ahi = bounds(atom, ranges)
            if unknown:
                alo, ahi = -math.inf, math.inf
            a, bb = _scaled(alo, c), _scaled(ahi, c)
            lo[prev:end] += min(a, bb)
            hi[prev:end] += max(a, bb)
            prev = end
        for j in js:
            deriv[j] += c * _atom_derivative(atom, loops_vars[j])
            used[j] = True

    # -- one row --

    def fill_row(self, row: np.ndarray, ctx: _StoreCtx, d: _StoreData) -> None:
        loops = [self.loops[i] for i in ctx.loops]
        ext = np.array([lp.extent for lp in loops], dtype=np.float64)
        outer_prod = float(ext.prod()) if len(ext) else 1.0
        ops = self.op_counts(ctx, ext)
        row[:OFF_VEC] = ops * outer_prod
        self.fill_annotations(row, ctx, loops)
        self.fill_gpu(row, loops)
        self.fill_buffers(row, ctx, d, ext, outer_prod)
        float_ops = float(ops[OFF_FLOAT_OPS : OFF_FLOAT_OPS + 7].sum())
        mem = (d.touched * d.ele_bytes[:, None]).sum(axis=0)
        row[OFF_CURVE : OFF_CURVE + CURVE_SAMPLES] = _intensity_curve(float_ops, ext, mem)
        buf = ctx.store.buffer
        size = float(np.prod(buf.shape)) if buf.shape else 1.0
        row[OFF_ALLOC] = size * max(1, dtype_bits(buf.dtype) // 8)
        row[OFF_ALLOC + 1] = size * ctx.alloc_outer_prod
        row[OFF_ALLOC + 2] = ctx.alloc_outer_prod
        row[OFF_ALLOC + 3] = outer_prod / ctx.alloc_outer_prod
        row[OFF_OUTER] = outer_prod
        row[OFF_OUTER + 1] = len(loops)
        row[OFF_OUTER + 2] = self.unroll_step(ctx, loops)

    def op_counts(self, ctx: _StoreCtx, ext: np.ndarray) -> np.ndarray:
        """Ops per innermost iteration (if-conditions scaled down to their loop level)."""
        counts = np.zeros(OFF_VEC)
        _count_ops(ctx.store.value, counts)
        for idx in ctx.store.indices:
            _count_ops(idx, counts)
        for cond, depth in ctx.conds:
            c = np.zeros(OFF_VEC)
            _count_ops(cond, c)
            inner = float(ext[depth:].prod()) if depth < len(ext) else 1.0
            counts += c / inner
        return counts

    def unroll_step(self, ctx: _StoreCtx, loops: list[_Loop]) -> float:
        if self.auto_unroll is not None:
            return float(self.auto_unroll.get(ctx.store.buffer.name, 0))
        unrolled = [lp.extent for lp in loops if lp.kind == ForKind.UNROLLED]
        return float(np.prod(unrolled)) if unrolled else 0.0

    def fill_annotations(self, row: np.ndarray, ctx: _StoreCtx, loops: list[_Loop]) -> None:
        classes: list[int] | None = None
        for kind, off in _ANNOTATED.items():
            js = [j for j, lp in enumerate(loops) if lp.kind == kind]
            if not js:
                row[off + 3 + POS_NONE] = 1.0
                continue
            if classes is None:
                classes = self.loop_classes(ctx, loops)
            row[off] = len(js)
            row[off + 1] = float(np.prod([loops[j].extent for j in js]))
            row[off + 2] = loops[js[-1]].extent
            row[off + 3 + _position(classes, js[-1])] = 1.0

    def loop_classes(self, ctx: _StoreCtx, loops: list[_Loop]) -> list[int]:
        """Per loop: 0 spatial (indexes the stored element or encloses its allocation), 1 reduce, 2 mixed."""
        out = []
        for j, lp in enumerate(loops):
            if j < ctx.alloc_depth:
                out.append(0)
                continue
            feeding = [a for a in self.store_affines(ctx) if self.feeds(a, lp.var)]
            if not feeding:
                out.append(1)
            elif _is_injective_in(feeding, lp.var):
                out.append(0)
            else:
                out.append(2)
        return out

    def store_affines(self, ctx: _StoreCtx) -> list[_Affine]:
        return [self.affine(i) for i in ctx.store.indices]

    def feeds(self, aff: _Affine, v: Var) -> bool:
        return bool(aff.coefs.get(v, 0)) or any(v in self.vars_of(a) for a, _ in aff.atoms)

    def fill_gpu(self, row: np.ndarray, loops: list[_Loop]) -> None:
        if not self.is_gpu:
            return
        row[OFF_GPU] = 1.0
        for k, tag in enumerate(GPU_TAGS):
            lens = [lp.extent for lp in loops if lp.kind == ForKind.THREAD_BINDING and lp.tag == tag]
            row[OFF_GPU + 1 + k] = float(np.prod(lens)) if lens else 1.0

    def fill_buffers(
        self, row: np.ndarray, ctx: _StoreCtx, d: _StoreData, ext: np.ndarray, outer_prod: float
    ) -> None:
        feats = [self.buffer_feature(ctx, d, b, ext, outer_prod) for b in range(len(d.accesses))]
        feats.sort(key=lambda f: (-f[5], -f[3]))
        for slot, f in enumerate(feats[:MAX_N_BUFS]):
            off = OFF_BUFFERS + slot * BUFFER_FEATURES
            row[off : off + BUFFER_FEATURES] = f

    def buffer_feature(
        self, ctx: _StoreCtx, d: _StoreData, b: int, ext: np.ndarray, outer_prod: float
    ) -> np.ndarray:
        f = np.zeros(BUFFER_FEATURES)
        acc = d.accesses[b]
        ele = float(d.ele_bytes[b])
        n = len(ext)
        f[acc.acc_type] = 1.0
        bytes_ = outer_prod * ele
        if n == 0:
            unique_bytes, lines, unique_lines, stride = ele, 1.0, 1.0, 0.0
        else:
            unique_bytes = float(d.touched[b, 0]) * ele
            nz = np.flatnonzero(d.strides[b])
            if len(nz):
                i = int(nz[-1])
                s = float(d.strides[b, i])
                reduce_ratio = float(ext[i + 1 :].prod())
                lines = outer_prod / reduce_ratio * min(1.0, s * ele / CACHE_LINE_BYTES)
                stride = s if i == n - 1 else 0.0
            else:
                lines, stride = 1.0, 0.0
            lines = max(lines, 1.0)
            cont = float(d.contiguous[b]) * ele
            unique_lines = max(unique_bytes / min(cont, CACHE_LINE_BYTES), 1.0)
        reuse_type, dis_iter, dis_bytes, reuse_ct = self.reuse(ctx, d, b, ext)
        f[3:7] = bytes_, unique_bytes, lines, unique_lines
        f[7 + reuse_type] = 1.0
        f[10:13] = dis_iter, dis_bytes, reuse_ct
        div = 1.0 / reuse_ct if reuse_ct > 0.5 else 2.0
        f[13:17] = bytes_ * div, unique_bytes * div, lines * div, unique_lines * div
        f[17] = stride
        return f

    def reuse(
        self, ctx: _StoreCtx, d: _StoreData, b: int, ext: np.ndarray
    ) -> tuple[int, float, float, float]:
        buf = d.accesses[b].buffer
        dis_iter, dis_bytes = 1.0, -1.0
        for i in reversed(range(len(ext))):
            lid = ctx.loops[i]
            if d.uses[b, i]:
                dis_iter *= ext[i]
                dis_bytes = float(self.loop_bytes[lid])
            else:
                if dis_bytes < 0:
                    dis_bytes = float(self.loop_ele_bytes[lid])
                return REUSE_LOOP, dis_iter, dis_bytes, float(ext[i])
            sizes = self.loop_buf[(lid, buf)]
            if len(sizes) > 1:
                return (
                    REUSE_SERIAL,
                    min(sizes) / ext[i],
                    float(self.loop_bytes[lid]) / ext[i],
                    float(len(sizes) - 1),
                )
        return REUSE_NONE, 0.0, 0.0, 0.0


def _same_indices(a: tuple[Expr, ...], b: tuple[Expr, ...]) -> bool:
    return a is b or (len(a) == len(b) and all(x is y for x, y in zip(a, b)))


def _scaled(x: float, c: int) -> float:
    if x == 0 or c == 0:
        return 0.0
    return float(np.clip(x * c, -_BIG, _BIG))


def _rev_cumsum(a: np.ndarray) -> np.ndarray:
    return np.cumsum(a[..., ::-1], axis=-1)[..., ::-1]


def _contiguous(region: np.ndarray, shape: np.ndarray) -> float:
    """Elements of the region contiguous in memory: its innermost dims up to the first partial one."""
    n = 1.0
    for d in reversed(range(len(shape))):
        n *= region[d]
        if region[d] < shape[d]:
            break
    return n


def _position(classes: list[int], j: int) -> int:
    cls = classes[j]
    if cls == 2:
        return POS_MIXED
    same = [k for k, c in enumerate(classes) if c == cls]
    base = POS_INNER_SPATIAL if cls == 0 else POS_INNER_REDUCE
    if j == same[-1]:
        return base
    if j == same[0]:
        return base + 2
    return base + 1


def _intensity_curve(float_ops: float, ext: np.ndarray, mem_bytes: np.ndarray) -> np.ndarray:
    """FLOPs/bytes (both log2) per loop level, sampled at 10 evenly spaced FLOP fractions."""
    out = np.zeros(CURVE_SAMPLES)
    if float_ops <= 0 or len(ext) == 0:
        return out
    compute = np.log2(1.0 + float_ops * np.cumprod(ext[::-1]))
    mem = np.log2(1.0 + mem_bytes[::-1])
    ratio = compute / mem
    targets = compute[-1] * np.arange(1, CURVE_SAMPLES + 1) / CURVE_SAMPLES
    return np.interp(targets, compute, ratio, left=ratio[0])


# ---- public API ---------------------------------------------------------------------------


def extract_features(func: PrimFunc, auto_unroll: Mapping[str, int] | None = None) -> np.ndarray:
    """[n_stores, 164] float32, one row per BufferStore in program order.

    `auto_unroll` maps a stored buffer's name to its stage's auto_unroll_max_step; without it the
    product of the extents of the store's unrolled loops stands in.
    """
    return _Extractor(func, auto_unroll).run()


_CACHE: OrderedDict[str, np.ndarray] = OrderedDict()
CACHE_SIZE = 8192


def _feature_cache_key(state: State) -> str:
    """The feature cache's key: the workload and the steps (cheap, unlike the lowered-loop `state_key`)."""
    from aotc.schedule.steps import steps_to_json

    return state.dag.workload_key + json.dumps(steps_to_json(state.steps), separators=(",", ":"))


def state_features(state: State) -> np.ndarray:
    """Features of the state's lowered program (sharing the search's lowering cache; LRU-cached by
    workload key and steps); a state that is not a valid program gives an empty [0, 164] matrix."""
    key = _feature_cache_key(state)
    got = _CACHE.get(key)
    if got is not None:
        _CACHE.move_to_end(key)
        return got
    from aotc.search.lowering import lowered

    func = lowered(state)
    if func is None:
        feats = np.zeros((0, N_FEATURES), dtype=np.float32)
    else:
        steps = {st.op.name: st.auto_unroll_max_step for st in state.stages if not st.is_placeholder}
        feats = extract_features(func, steps)
    return _store(key, feats)


def knows_features(state: State) -> bool:
    """Whether `state_features(state)` is cached."""
    return _feature_cache_key(state) in _CACHE


def remember_features(state: State, feats: np.ndarray) -> None:
    """Cache `state_features(state)` computed elsewhere: a worker process with the same program."""
    _store(_feature_cache_key(state), feats)


def _store(key: str, feats: np.ndarray) -> np.ndarray:
    feats.setflags(write=False)
    _CACHE[key] = feats
    if len(_CACHE) > CACHE_SIZE:
        _CACHE.popitem(last=False)
    return feats


def clear_feature_cache() -> None:
    _CACHE.clear()
