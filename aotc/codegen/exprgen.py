"""Expression code generation: scalars, explicit vectors of a vectorized loop, and memory access.

Inside a vectorized loop every value is a scalar (invariant in the vector variable), a
`<lanes x T>` vector, or a `Ramp` (an int64 affine function `base + stride * lane` of the vector
variable, kept symbolic so that loads and stores can pick contiguous, broadcast or gather forms).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from aotc.codegen.irbuilder import (
    CodegenError,
    FunctionBuilder,
    ModuleBuilder,
    Val,
    const_val,
    elem_bytes,
    is_signed,
    mem_type,
    scalar_type,
    splat_const_text,
    vector_const_text,
    vtype,
)
from aotc.codegen.vecmath import LIBM_ONLY, VecLib
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
    dtype_max,
    dtype_min,
    is_float,
    walk,
)
from aotc.ir.printer import expr_str
from aotc.ir.simplify import flat_affine_parts, from_terms

MAX_DEINTERLEAVE = 4
# A local buffer lives in registers once LLVM promotes it, so a strided read of it (a transposing
# copy-out of accumulators) is a wide load and a shuffle of up to this many bytes, never a gather.
MAX_LOCAL_SPAN_BYTES = 1024
CACHE_LINE = 64
# llvm.prefetch's locality for a weight block fetched ahead (1: prefetcht2 on x86, into the outer caches;
# the block is read from there once its turn comes; 3, into L1, timed the same on Zen 5)
PREFETCH_LOCALITY = 1
# The largest block fetched ahead: it and the block the chunks read must stay in L2 together (1 MB a core
# on Zen 4 and 5, 512 KB on Zen 3); a float 7x7x512 conv's 590 KB blocks, fetched ahead, evicted the
# block in use and ran 1.15x slower on Zen 5.
PREFETCH_MAX_BLOCK_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class Ramp:
    """The int64 vector `base + stride * <0, 1, ..., lanes-1>` with a scalar `base`."""

    base: Val
    stride: int
    lanes: int


@dataclass(slots=True)
class VecCtx:
    """State of the enclosing vectorized loop: its lanes and the mask of active lanes."""

    var: Var
    lanes: int
    mask: Val | None = None
    nonempty: bool = True


@dataclass(frozen=True, slots=True)
class BufInfo:
    ptr: str
    md: str


_FCMP = {"lt": "olt", "le": "ole", "gt": "ogt", "ge": "oge", "eq": "oeq", "ne": "une"}
_SCMP = {"lt": "slt", "le": "sle", "gt": "sgt", "ge": "sge", "eq": "eq", "ne": "ne"}
_UCMP = {"lt": "ult", "le": "ule", "gt": "ugt", "ge": "uge", "eq": "eq", "ne": "ne"}
_FARITH = {"add": "fadd contract", "sub": "fsub contract", "mul": "fmul contract", "div": "fdiv"}
_INT_FOLD = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "min": min,
    "max": max,
    "floordiv": lambda a, b: a // b if b else 0,
    "floormod": lambda a, b: a % b if b else 0,
    "bitand": lambda a, b: a & b,
    "bitor": lambda a, b: a | b,
    "bitxor": lambda a, b: a ^ b,
}
_CMP_FOLD = {
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
}


def _suffix(dtype: str, lanes: int) -> str:
    t = scalar_type(dtype)
    s = {"float": "f32", "double": "f64", "half": "f16"}.get(t, t)
    return f"v{lanes}{s}" if lanes else s


def _has_load(e: Expr) -> bool:
    return any(isinstance(n, Load) for n in walk(e))


class ExprGen:
    """Emits the LLVM instructions of expressions into the current function builder."""

    def __init__(self, mod: ModuleBuilder, fb: FunctionBuilder, veclib: VecLib | None) -> None:
        self.mod = mod
        self.fb = fb
        self.veclib = veclib
        self.env: dict[Var, Val | Ramp] = {}
        self.bufs: dict[Buffer, BufInfo] = {}
        self.vec: VecCtx | None = None
        # Values of load-free expressions already emitted where they dominate the insertion point, keyed
        # by the expression and its variables' values, so that an index that unrolled copies share is
        # computed once (LLVM would merge the copies, but its passes take time in proportion to the IR).
        self.reused: dict[tuple, Val | Ramp] = {}
        self.reuse_scopes: list[list[tuple]] = [[]]
        self.reuse_vars: dict[Expr, tuple[Var, ...] | None] = {}
        self.reads: dict[Expr, bool] = {}  # whether a reusable expression loads (its key holds the mask)
        # Buffers the function being emitted never stores to: their loads are reused like arithmetic
        # (a padded transform reads each input element under a bounds check in several unrolled rows).
        self.read_only: frozenset[Buffer] = frozenset()
        self.index_forms: dict = {}  # each buffer index's linear form (`flat_affine_parts`)
        # in an outlined parallel region: the loop whose chunks it claims
        self.parallel_var: Var | None = None

    # ----------------------------------------------------------------- helpers

    @contextmanager
    def scope(self) -> Iterator[None]:
        """Code that does not dominate what follows it (a branch's arm, a loop's body): the values it
        emits are reused only inside it."""
        self.reuse_scopes.append([])
        try:
            yield
        finally:
            for key in self.reuse_scopes.pop():
                del self.reused[key]

    def emit(self, text: str, dtype: str, lanes: int) -> Val:
        return Val(self.fb.op(text), dtype, lanes)

    def const(self, value: int | float | bool, dtype: str, lanes: int = 0) -> Val:
        c = const_val(value, dtype)
        if lanes:
            return Val(splat_const_text(c.const, dtype), dtype, lanes, c.const)
        return c

    def const_like(self, value: int | float | bool, like: Val) -> Val:
        return self.const(value, like.dtype, like.lanes)

    def bcast(self, v: Val, lanes: int) -> Val:
        if v.lanes == lanes:
            return v
        if v.lanes:
            raise CodegenError(f"vector width mismatch: {v.lanes} vs {lanes} lanes")
        if v.const is not None:
            return self.const(v.const, v.dtype, lanes)
        vt = vtype(scalar_type(v.dtype), lanes)
        ins = self.fb.op(f"insertelement {vt} poison, {v.typed}, i64 0")
        return self.emit(
            f"shufflevector {vt} {ins}, {vt} poison, <{lanes} x i32> zeroinitializer", v.dtype, lanes
        )

    def unify(self, *vals: Val) -> list[Val]:
        lanes = max(v.lanes for v in vals)
        return [self.bcast(v, lanes) for v in vals]

    def mat(self, v: Val | Ramp) -> Val:
        """Materialize a Ramp as an explicit vector."""
        if isinstance(v, Val):
            return v
        steps = vector_const_text([i * v.stride for i in range(v.lanes)], "int64")
        step_val = Val(steps, "int64", v.lanes)
        if v.base.const == 0:
            return step_val
        base = self.bcast(v.base, v.lanes)
        return self.emit(f"add nsw {base.ty} {base.ref}, {steps}", "int64", v.lanes)

    def value(self, e: Expr) -> Val:
        return self.mat(self.expr(e))

    def intrinsic(self, base: str, args: list[Val], reduce: bool = False) -> Val:
        """Call `llvm.<base>.<type of args[0]>`; `reduce` gives a scalar of the element type."""
        x = args[0]
        lanes = 0 if reduce else x.lanes
        name = f"llvm.{base}.{_suffix(x.dtype, x.lanes)}"
        ret_ty = vtype(scalar_type(x.dtype), lanes)
        self.mod.intrinsic(name, ret_ty, [a.ty for a in args])
        return self.emit(f"call {ret_ty} @{name}({', '.join(a.typed for a in args)})", x.dtype, lanes)

    def select_val(self, c: Val, a: Val, b: Val) -> Val:
        if c.const is not None:
            return a if c.const else b
        lanes = max(c.lanes, a.lanes, b.lanes)
        a, b = self.bcast(a, lanes), self.bcast(b, lanes)
        return self.emit(f"select {c.typed}, {a.typed}, {b.typed}", a.dtype, a.lanes)

    def icmp(self, pred: str, a: Val, b: Val) -> Val:
        a, b = self.unify(a, b)
        return self.emit(f"icmp {pred} {a.typed}, {b.ref}", "bool", a.lanes)

    def fcmp(self, pred: str, a: Val, b: Val) -> Val:
        a, b = self.unify(a, b)
        return self.emit(f"fcmp {pred} {a.typed}, {b.ref}", "bool", a.lanes)

    def inst(self, opcode: str, a: Val, b: Val) -> Val:
        a, b = self.unify(a, b)
        return self.emit(f"{opcode} {a.typed}, {b.ref}", a.dtype, a.lanes)

    def logic(self, op: str, a: Val, b: Val) -> Val:
        if a.const is not None or b.const is not None:
            k, other = (a, b) if a.const is not None else (b, a)
            if op == "and":
                return other if k.const else k
            return k if k.const else other
        return self.inst(op, a, b)

    def lnot(self, a: Val) -> Val:
        if a.const is not None:
            return self.const(not a.const, "bool")
        return self.emit(f"xor {a.typed}, {self.const_like(True, a).ref}", "bool", a.lanes)

    # ------------------------------------------------------------ expressions

    def expr(self, e: Expr) -> Val | Ramp:
        fn = _EXPR.get(type(e))
        if fn is None:
            raise CodegenError(
                f"cannot generate code for {type(e).__name__} expression {expr_str(e)} (lower it first)"
            )
        fv = self._reuse_vars(e) if type(e) in _REUSABLE else None
        if fv is None:
            return fn(self, e)
        key = (e, *(self.env.get(v) for v in fv))
        if self.reads.get(e) and self.vec is not None:  # a load under a mask reads only its lanes
            key += (self.vec.mask, self.vec.nonempty)
        v = self.reused.get(key)
        if v is None:
            v = self.reused[key] = fn(self, e)
            self.reuse_scopes[-1].append(key)
        return v

    def _reuse_vars(self, e: Expr) -> tuple[Var, ...] | None:
        """The variables `e`'s value depends on, or None where it reads memory that may change (a call,
        or a load of a buffer the function stores to)."""
        if e in self.reuse_vars:
            return self.reuse_vars[e]
        found: tuple[Var, ...] | None
        if isinstance(e, Var):
            found = (e,)
        elif isinstance(e, Call) or isinstance(e, Load) and e.buffer not in self.read_only:
            found = None
        else:
            subs = [self._reuse_vars(c) for c in children(e)]
            found = None if None in subs else tuple(dict.fromkeys(v for sub in subs for v in sub))
            self.reads[e] = isinstance(e, Load) or any(self.reads.get(c, False) for c in children(e))
        self.reuse_vars[e] = found
        return found

    def _var(self, e: Var) -> Val | Ramp:
        try:
            return self.env[e]
        except KeyError:
            raise CodegenError(f"variable {e.name!r} is used but not bound") from None

    def _const(self, e: Const) -> Val:
        scalar_type(e.dtype)
        return const_val(e.value, e.dtype)

    def _binary(self, e: Binary) -> Val | Ramp:
        a, b = self.expr(e.a), self.expr(e.b)
        if isinstance(a, Ramp) or isinstance(b, Ramp):
            r = self._ramp_binary(e.op, a, b)
            if r is not None:
                return r
        return self.binop(e.op, self.mat(a), self.mat(b))

    def _ramp_binary(self, op: str, a: Val | Ramp, b: Val | Ramp) -> Val | Ramp | None:
        if isinstance(a, Val) and a.lanes or isinstance(b, Val) and b.lanes:
            return None
        base_a, sa = (a.base, a.stride) if isinstance(a, Ramp) else (a, 0)
        base_b, sb = (b.base, b.stride) if isinstance(b, Ramp) else (b, 0)
        lanes = a.lanes if isinstance(a, Ramp) else b.lanes
        if op == "add":
            base, stride = self.binop("add", base_a, base_b), sa + sb
        elif op == "sub":
            base, stride = self.binop("sub", base_a, base_b), sa - sb
        elif op == "mul" and isinstance(b, Val) and b.const is not None:
            base, stride = self.binop("mul", base_a, b), sa * b.const
        elif op == "mul" and isinstance(a, Val) and a.const is not None:
            base, stride = self.binop("mul", a, base_b), sb * a.const
        else:
            return None
        return base if stride == 0 else Ramp(base, stride, lanes)

    def binop(self, op: str, a: Val, b: Val) -> Val:
        dtype = a.dtype
        if dtype == "bool":
            raise CodegenError(f"arithmetic '{op}' on bool operands")
        if not is_float(dtype):
            folded = self._fold_int(op, a, b)
            if folded is not None:
                return folded
        a, b = self.unify(a, b)
        if is_float(dtype):
            return self._float_binop(op, a, b)
        return self._int_binop(op, a, b)

    def _fold_int(self, op: str, a: Val, b: Val) -> Val | None:
        if a.const is not None and b.const is not None and op in _INT_FOLD:
            return self.const(_INT_FOLD[op](a.const, b.const), a.dtype)
        if op in ("add", "sub") and b.const == 0:
            return a
        if op == "add" and a.const == 0:
            return b
        if op == "mul" and (a.const == 1 or b.const == 1):
            return b if a.const == 1 else a
        if op == "mul" and (a.const == 0 or b.const == 0):
            return self.const(0, a.dtype)
        return None

    def _int_binop(self, op: str, a: Val, b: Val) -> Val:
        signed = is_signed(a.dtype)
        if op in ("add", "sub", "mul"):
            flags = " nsw" if a.dtype == "int64" else ""
            return self.inst(f"{op}{flags}", a, b)
        if op in ("min", "max"):
            return self.intrinsic(f"{'s' if signed else 'u'}{op}", [a, b])
        if op in ("floordiv", "floormod"):
            return self._int_divmod(op, a, b)
        if op in ("bitand", "bitor", "bitxor"):
            return self.inst(op[3:], a, b)
        raise CodegenError(f"binary op '{op}' is not defined on integer dtype {a.dtype}")

    def _int_divmod(self, op: str, a: Val, b: Val) -> Val:
        """Python floor semantics; a zero divisor gives 0 (like numpy) instead of trapping."""
        if not is_signed(a.dtype):
            return self._unsigned_divmod(op, a, b)
        k = b.const
        if k is not None and k > 0:
            if k & (k - 1) == 0:
                if op == "floordiv":
                    return self.inst("ashr", a, self.const_like(k.bit_length() - 1, a))
                return self.inst("and", a, self.const_like(k - 1, a))
            r = self.inst("srem", a, b)
            adj = self.icmp("slt", r, self.const_like(0, r))
            if op == "floordiv":
                q = self.inst("sdiv", a, b)
                return self.inst("add", q, self.emit(f"sext {adj.typed} to {q.ty}", q.dtype, q.lanes))
            return self.select_val(adj, self.inst("add", r, b), r)
        zero = self.const_like(0, b)
        is_zero = self.icmp("eq", b, zero)
        is_m1 = self.icmp("eq", b, self.const_like(-1, b))
        bs = self.select_val(self.inst("or", is_zero, is_m1), self.const_like(1, b), b)
        q, r = self.inst("sdiv", a, bs), self.inst("srem", a, bs)
        sign_differs = self.icmp("slt", self.inst("xor", r, bs), zero)
        adj = self.inst("and", self.icmp("ne", r, zero), sign_differs)
        if op == "floordiv":
            q = self.inst("add", q, self.emit(f"sext {adj.typed} to {q.ty}", q.dtype, q.lanes))
            q = self.select_val(is_m1, self.inst("sub", zero, a), q)
            return self.select_val(is_zero, zero, q)
        r = self.select_val(adj, self.inst("add", r, bs), r)
        return self.select_val(is_zero, zero, r)

    def _unsigned_divmod(self, op: str, a: Val, b: Val) -> Val:
        opcode = "udiv" if op == "floordiv" else "urem"
        if b.const is not None and b.const != 0:
            return self.inst(opcode, a, b)
        zero = self.const_like(0, b)
        is_zero = self.icmp("eq", b, zero)
        bs = self.select_val(is_zero, self.const_like(1, b), b)
        return self.select_val(is_zero, zero, self.inst(opcode, a, bs))

    def _float_binop(self, op: str, a: Val, b: Val) -> Val:
        if op in _FARITH:
            return self.inst(_FARITH[op], a, b)
        if op in ("min", "max"):
            return self.intrinsic(f"{op}imum", [a, b])
        if op == "pow":
            return self.libm("pow", [a, b])
        if op in ("floordiv", "floormod"):
            return self._float_divmod(op, a, b)
        raise CodegenError(f"binary op '{op}' is not defined on float dtype {a.dtype}")

    def _float_divmod(self, op: str, a: Val, b: Val) -> Val:
        """numpy's npy_divmod, so results match `np.floor_divide` / `np.remainder` exactly."""
        zero, one = self.const_like(0.0, a), self.const_like(1.0, a)
        mod = self.inst("frem", a, b)
        quotient = self.inst("fdiv", a, b)
        b_zero = self.fcmp("oeq", b, zero)
        adj = self.inst(
            "and",
            self.fcmp("une", mod, zero),
            self.inst("xor", self.fcmp("olt", b, zero), self.fcmp("olt", mod, zero)),
        )
        if op == "floormod":
            fixed = self.select_val(adj, self.inst("fadd", mod, b), mod)
            signed_zero = self.intrinsic("copysign", [zero, b])
            fixed = self.select_val(self.fcmp("une", mod, zero), fixed, signed_zero)
            return self.select_val(b_zero, mod, fixed)
        div = self.inst("fdiv", self.inst("fsub", a, mod), b)
        div = self.select_val(adj, self.inst("fsub", div, one), div)
        fl = self.intrinsic("floor", [div])
        snap = self.fcmp("ogt", self.inst("fsub", div, fl), self.const_like(0.5, a))
        fl = self.select_val(snap, self.inst("fadd", fl, one), fl)
        fl = self.select_val(self.fcmp("une", div, zero), fl, self.intrinsic("copysign", [zero, quotient]))
        return self.select_val(b_zero, quotient, fl)

    def _compare(self, e: Compare) -> Val:
        a, b = self.value(e.a), self.value(e.b)
        if a.dtype != b.dtype:
            raise CodegenError(f"comparison of {a.dtype} with {b.dtype}")
        if is_float(a.dtype):
            return self.fcmp(_FCMP[e.op], a, b)
        if a.const is not None and b.const is not None:
            return self.const(_CMP_FOLD[e.op](a.const, b.const), "bool")
        table = _SCMP if is_signed(a.dtype) else _UCMP
        return self.icmp(table[e.op], a, b)

    def _logical(self, e: Logical) -> Val:
        a = self.bool_value(e.a)
        if e.op == "not":
            return self.lnot(a)
        if e.op not in ("and", "or") or e.b is None:
            raise CodegenError(f"malformed logical op {e.op!r}")
        return self.logic(e.op, a, self.bool_value(e.b))

    def bool_value(self, e: Expr) -> Val:
        v = self.value(e)
        if v.dtype != "bool":
            raise CodegenError(f"condition {expr_str(e)} has dtype {v.dtype}, expected bool")
        return v

    def _select(self, e: Select) -> Val:
        c = self.bool_value(e.cond)
        if c.const is not None:
            return self.value(e.true_value if c.const else e.false_value)
        if _has_load(e.true_value) or _has_load(e.false_value):
            if c.lanes:
                return self._masked_select(c, e)
            return self._branch_select(c, e)
        return self.select_val(c, self.value(e.true_value), self.value(e.false_value))

    def _masked_select(self, c: Val, e: Select) -> Val:
        """Vector condition: each arm's loads only touch the lanes that select it."""
        vec = self.vec
        assert vec is not None
        saved = (vec.mask, vec.nonempty)
        outer = vec.mask
        try:
            vec.mask, vec.nonempty = (self.logic("and", outer, c) if outer else c), False
            t = self.value(e.true_value)
            nc = self.lnot(c)
            vec.mask = self.logic("and", outer, nc) if outer else nc
            f = self.value(e.false_value)
        finally:
            vec.mask, vec.nonempty = saved
        return self.select_val(c, t, f)

    def _branch_select(self, c: Val, e: Select) -> Val:
        """Scalar condition: only the chosen arm is evaluated (its loads may be out of bounds)."""
        fb = self.fb
        then_l, else_l, join_l = fb.label("sel_t"), fb.label("sel_f"), fb.label("sel_j")
        lanes = self.vec.lanes if self.vec else 0
        fb.cond_br(c.ref, then_l, else_l)
        arms = []
        for label, arm in ((then_l, e.true_value), (else_l, e.false_value)):
            fb.start_block(label)
            with self.scope():
                v = self.bcast(self.value(arm), lanes) if lanes else self.value(arm)
            arms.append((v, fb.cur_label))
            fb.br(join_l)
        fb.start_block(join_l)
        (tv, tl), (fv, fl) = arms
        if tv.lanes != fv.lanes:
            raise CodegenError("select arms of different widths")
        return self.emit(f"phi {tv.ty} [ {tv.ref}, %{tl} ], [ {fv.ref}, %{fl} ]", tv.dtype, tv.lanes)

    def _cast(self, e: Cast) -> Val:
        clamp = rounded_clamp(e)
        if clamp is not None:
            return self._rounded_clamp(clamp)
        return self.cast_val(self.value(e.value), e.dtype)

    def _rounded_clamp(self, c: RoundedClamp) -> Val:
        """`int(clamp(round(x) + zp, lo, hi))`, every float requantization's copy-out, in fewer
        instructions: x is clamped in float at hi - zp only, the float -> int32 conversion rounds it, and
        the zero point and the lower bound are applied with saturating integer steps
        (docs/int8.md#float-or-fixed-point-requantization).

        The conversion rounds in the current rounding mode: to nearest even, as `round` does, unless the
        process changed it (XNNPACK's requantization relies on the same).
        """
        x = self.value(c.x)
        lanes, to = x.lanes, c.dtype
        x = self._fmin(x, self.const_like(float(c.hi - c.zero_point), x))
        step = self.mod.convert_lanes
        chunks = lanes // step if step and lanes % step == 0 else 0
        packs = to in ("int8", "uint8") and x.dtype == "float32" and -(1 << 15) <= c.zero_point < 1 << 15
        if packs and chunks and chunks & (chunks - 1) == 0:
            # x86 cvtps2dq gives INT_MIN where x is below the int32 range: int16 saturation, the zero
            # point's saturating add and the final clamp (vpackssdw, vpaddsw, vpacksswb) still give lo
            r = self._convert_chunks(x, step)
            r = self._clamp_int(r, -(1 << 15), (1 << 15) - 1)
            half = self.cast_val(r, "int16")
            zp = self.const(c.zero_point, "int16", lanes)
            y = self.intrinsic("sadd.sat", [half, zp])
            # saturated to the type (a pack), then raised to lo; the float min already held it at hi
            out = self.cast_val(self._clamp_int(y, dtype_min(to), dtype_max(to)), to)
            if c.lo == dtype_min(to):
                return out
            raise_to = "umax" if to == "uint8" else "smax"
            return self.intrinsic(raise_to, [out, self.const(c.lo, to, lanes)])
        # elsewhere the conversion of a value outside int32 is undefined: clamp below too
        x = self._fmax(x, self.const_like(float(c.lo - c.zero_point), x))
        ity = vtype("i32", lanes)
        name = f"llvm.lrint.{_suffix('int32', lanes)}.{_suffix(x.dtype, lanes)}"
        self.mod.intrinsic(name, ity, [x.ty])
        r = self.emit(f"call {ity} @{name}({x.typed})", "int32", lanes)
        r = self.inst("add nsw", r, self.const(c.zero_point, "int32", lanes))
        return self.cast_val(self._clamp_int(r, c.lo, c.hi), to)

    def _convert_chunks(self, x: Val, step: int) -> Val:
        """x86 cvtps2dq on each `step` lanes of `x`, concatenated."""
        name = "llvm.x86.avx.cvt.ps2dq.256" if step == 8 else "llvm.x86.sse2.cvtps2dq"
        cty, ity = vtype("float", step), vtype("i32", step)
        self.mod.intrinsic(name, ity, [cty])
        parts = []
        for k in range(0, x.lanes, step):
            picks = ", ".join(f"i32 {k + i}" for i in range(step))
            chunk = self.fb.op(f"shufflevector {x.typed}, {x.ty} poison, <{step} x i32> <{picks}>")
            parts.append(self.fb.op(f"call {ity} @{name}({cty} {chunk})"))
        width = step
        while len(parts) > 1:  # concatenate pairwise
            picks = ", ".join(f"i32 {i}" for i in range(2 * width))
            wide = vtype("i32", width)
            parts = [
                self.fb.op(f"shufflevector {wide} {a}, {wide} {b}, <{2 * width} x i32> <{picks}>")
                for a, b in zip(parts[::2], parts[1::2])
            ]
            width *= 2
        return Val(parts[0], "int32", x.lanes)

    def _clamp_int(self, v: Val, lo: int, hi: int) -> Val:
        """smin(smax(v, lo), hi): LLVM turns it and a following truncation into saturating packs."""
        v = self.intrinsic("smax", [v, self.const(lo, v.dtype, v.lanes)])
        return self.intrinsic("smin", [v, self.const(hi, v.dtype, v.lanes)])

    def _fmin(self, a: Val, b: Val) -> Val:
        """a < b ? a : b, the target's own min (x86 minps: b where either is NaN)."""
        return self.select_val(self.fcmp("olt", a, b), a, b)

    def _fmax(self, a: Val, b: Val) -> Val:
        return self.select_val(self.fcmp("ogt", a, b), a, b)

    def cast_val(self, v: Val, to: str) -> Val:
        src = v.dtype
        if src == to:
            return v
        dst_ty = vtype(scalar_type(to), v.lanes)
        if v.const is not None and not is_float(src) and not is_float(to):
            return self.const(int(v.const) != 0 if to == "bool" else int(v.const), to, v.lanes)
        if to == "bool":
            if is_float(src):
                return self.fcmp("une", v, self.const_like(0.0, v))
            return self.icmp("ne", v, self.const_like(0, v))
        if src == "bool":
            opcode = "uitofp" if is_float(to) else "zext"
        elif is_float(src) and is_float(to):
            opcode = "fpext" if _FLOAT_RANK[to] > _FLOAT_RANK[src] else "fptrunc"
        elif is_float(src):
            raw = self.fb.op(f"{'fptosi' if is_signed(to) else 'fptoui'} {v.typed} to {dst_ty}")
            return self.emit(f"freeze {dst_ty} {raw}", to, v.lanes)
        elif is_float(to):
            opcode = "sitofp" if is_signed(src) else "uitofp"
        else:
            sb, db = int(scalar_type(src)[1:]), int(scalar_type(to)[1:])
            if sb == db:
                return Val(v.ref, to, v.lanes, v.const)
            opcode = "trunc" if db < sb else ("sext" if is_signed(src) else "zext")
        return self.emit(f"{opcode} {v.typed} to {dst_ty}", to, v.lanes)

    def _reinterpret(self, e: Reinterpret) -> Val:
        v = self.value(e.value)
        dst_ty = vtype(scalar_type(e.dtype), v.lanes)
        return self.emit(f"bitcast {v.typed} to {dst_ty}", e.dtype, v.lanes)

    def _call(self, e: Call) -> Val:
        args = [self.value(a) for a in e.args]
        if len(args) != 1:
            raise CodegenError(f"math call {e.name} takes one argument, got {len(args)}")
        return self.math(e.name, args[0])

    def math(self, name: str, x: Val) -> Val:
        if name == "abs":
            if is_float(x.dtype):
                return self.intrinsic("fabs", [x])
            if is_signed(x.dtype):
                return self.intrinsic("abs", [x, self.const(False, "bool")])
            return x
        if not is_float(x.dtype):
            raise CodegenError(f"math call {name} needs a float argument, got {x.dtype}")
        if x.dtype == "float16":
            return self.cast_val(self.math(name, self.cast_val(x, "float32")), "float16")
        if name in ("exp", "log", "tanh", "erf") or name in LIBM_ONLY:
            return self.libm(name, [x])
        if name in ("sqrt", "floor", "ceil"):
            return self.intrinsic(name, [x])
        if name == "round":
            return self.intrinsic("roundeven", [x])
        one = self.const_like(1.0, x)
        if name == "rsqrt":
            return self.inst("fdiv", one, self.intrinsic("sqrt", [x]))
        if name == "sigmoid":
            e = self.libm("exp", [self.emit(f"fneg {x.typed}", x.dtype, x.lanes)])
            return self.inst("fdiv", one, self.inst("fadd", one, e))
        raise CodegenError(f"unknown math call {name!r}")

    def libm(self, fn: str, args: list[Val]) -> Val:
        """exp/log/tanh/erf/pow and LIBM_ONLY: libmvec for vectors where available, else intrinsics or libm
        (erf and LIBM_ONLY, which have no LLVM intrinsic on every LLVM, are called in libm lane by lane)."""
        x = args[0]
        if x.dtype == "float16":
            outs = self.libm(fn, [self.cast_val(a, "float32") for a in args])
            return self.cast_val(outs, "float16")
        if x.lanes and self.veclib is not None and self.veclib.supports(fn, x.dtype):
            return self._libmvec(fn, args)
        if fn != "erf" and fn not in LIBM_ONLY:
            return self.intrinsic(fn, args)
        name = f"{fn}f" if x.dtype == "float32" else fn
        ty = scalar_type(x.dtype)
        self.mod.declare(name, f"declare {ty} @{name}({ty}) nounwind willreturn memory(none)")
        if not x.lanes:
            return self.emit(f"call {ty} @{name}({x.typed})", x.dtype, 0)
        out = "poison"
        for i in range(x.lanes):
            lane = self.fb.op(f"extractelement {x.typed}, i64 {i}")
            r = self.fb.op(f"call {ty} @{name}({ty} {lane})")
            out = self.fb.op(f"insertelement {x.ty} {out}, {ty} {r}, i64 {i}")
        return Val(out, x.dtype, x.lanes)

    def _libmvec(self, fn: str, args: list[Val]) -> Val:
        x = args[0]
        assert self.veclib is not None
        isa, width = self.veclib.plan(x.dtype, x.lanes)
        sym = self.veclib.symbol(fn, x.dtype, isa, width)
        wty = vtype(scalar_type(x.dtype), width)
        self.mod.declare(
            sym, f"declare {wty} @{sym}({', '.join([wty] * len(args))}) nounwind willreturn memory(none)"
        )
        chunks = []
        for start in range(0, x.lanes, width):
            parts = [
                self._shuffle(a, [start + i if start + i < x.lanes else None for i in range(width)])
                for a in args
            ]
            chunks.append(self.fb.op(f"call {wty} @{sym}({', '.join(f'{wty} {p}' for p in parts)})"))
        return self._concat(chunks, x.dtype, width, x.lanes)

    def _shuffle(self, v: Val, idx: list[int | None]) -> str:
        if idx == list(range(v.lanes)):
            return v.ref
        mask = f"<{len(idx)} x i32> <" + ", ".join(f"i32 {'poison' if i is None else i}" for i in idx) + ">"
        return self.fb.op(f"shufflevector {v.typed}, {v.ty} poison, {mask}")

    def _concat(self, chunks: list[str], dtype: str, width: int, lanes: int) -> Val:
        wide = [
            self._shuffle(
                Val(c, dtype, width),
                [i - k * width if 0 <= i - k * width < width else None for i in range(lanes)],
            )
            for k, c in enumerate(chunks)
        ]
        acc = wide[0]
        ty = vtype(scalar_type(dtype), lanes)
        for k in range(1, len(wide)):
            sel = [lanes + i if k * width <= i < (k + 1) * width else i for i in range(lanes)]
            mask = f"<{lanes} x i32> <" + ", ".join(f"i32 {i}" for i in sel) + ">"
            acc = self.fb.op(f"shufflevector {ty} {acc}, {ty} {wide[k]}, {mask}")
        return Val(acc, dtype, lanes)

    # ------------------------------------------------------------------ memory

    def buffer(self, buf: Buffer) -> BufInfo:
        try:
            return self.bufs[buf]
        except KeyError:
            raise CodegenError(f"buffer {buf.name!r} is neither a parameter nor allocated here") from None

    def flat_offset(self, buf: Buffer, indices: tuple[Expr, ...]) -> Val | Ramp:
        if len(indices) != len(buf.shape):
            raise CodegenError(f"buffer {buf.name!r} has {len(buf.shape)} dims, indexed with {len(indices)}")
        if not indices:
            return const_val(0, "int64")
        indices = tuple(_as_index(i, buf) for i in indices)
        # an index split by a constant and flattened again ((r // 3) * 3 + r % 3: a gather of window
        # columns) is one contiguous index
        terms, offset = flat_affine_parts(indices, buf.strides, self.index_forms)
        if any(self._reuse_vars(atom) is None for atom in terms):
            return self.expr(buf.flat_index(indices))
        # The terms that vary, summed alone, then the constant: the copies of an unrolled loop share the
        # sum (one value, see `expr`) and differ in the constant, which the address modes fold.
        varying: dict[Expr, int] = {}
        for atom, coef in terms.items():
            v = self.expr(atom)
            if isinstance(v, Val) and v.const is not None:
                offset += coef * int(v.const)
            else:
                varying[atom] = coef
        if not varying:
            return const_val(offset, "int64")
        base = self.expr(from_terms(varying, 0))
        step = const_val(offset, "int64")
        return (
            self._ramp_binary("add", base, step) if isinstance(base, Ramp) else self.binop("add", base, step)
        )

    def _load(self, e: Load) -> Val:
        off = self.flat_offset(e.buffer, e.indices)
        v = self.load(e.buffer, off)
        if isinstance(off, Ramp) and off.stride == 1 and self.vec is not None and self.vec.mask is None:
            self.prefetch_next_block(e, off.base, off.lanes * elem_bytes(e.buffer.dtype))
        return v

    def prefetch_next_block(self, read: Load, base: Val, nbytes: int) -> None:
        """Prefetch the `nbytes` at flat offset `base` of `read`'s buffer one outermost block further on,
        where the parallel loop walks that axis block after block, several chunks a block (the index is
        the loop's variable divided by a constant): a block's first chunk would wait for memory at every
        step, and its later ones find it in cache, unless it is fetched while the chunks of the block
        before run. A block read by one chunk only is a plain stream, which the hardware prefetchers
        follow."""
        index = read.indices[0]
        if not (
            self.parallel_var is not None
            and isinstance(index, Binary)
            and index.op == "floordiv"
            and index.a is self.parallel_var
            and isinstance(index.b, Const)
            and index.b.value > 1
        ):
            return
        buf = read.buffer
        block = elem_bytes(buf.dtype) * int(buf.strides[0])  # the outermost axis's stride, in bytes
        if block > PREFETCH_MAX_BLOCK_BYTES:
            return
        key = ("prefetch", read.buffer, base.ref)  # once per address: unrolled copies share the read
        if key in self.reused:
            return
        self.reused[key] = base
        self.reuse_scopes[-1].append(key)
        here = self._gep(self.buffer(buf), mem_type(buf.dtype), base)
        self.mod.intrinsic("llvm.prefetch.p0", "void", ["ptr", "i32", "i32", "i32"])
        for line in range(0, nbytes, CACHE_LINE):  # past the end of the buffer: prefetches never fault
            ahead = self.fb.op(f"getelementptr i8, ptr {here}, i64 {block + line}")
            self.fb.emit(f"call void @llvm.prefetch.p0(ptr {ahead}, i32 0, i32 {PREFETCH_LOCALITY}, i32 1)")

    def _gep(self, info: BufInfo, elem: str, off: Val, inbounds: bool = True) -> str:
        if off.const == 0:
            return info.ptr
        kw = "getelementptr inbounds" if inbounds else "getelementptr"
        return self.fb.op(f"{kw} {elem}, ptr {info.ptr}, {off.typed}")

    def _to_reg(self, raw: str, dtype: str, lanes: int) -> Val:
        if dtype != "bool":
            return Val(raw, dtype, lanes)
        zero = "zeroinitializer" if lanes else "0"
        return self.emit(f"icmp ne {vtype('i8', lanes)} {raw}, {zero}", "bool", lanes)

    def _to_mem(self, v: Val) -> str:
        if v.dtype != "bool":
            return v.typed
        if v.const is not None:
            return self.const(int(v.const), "int8", v.lanes).typed
        return f"{vtype('i8', v.lanes)} " + self.fb.op(f"zext {v.typed} to {vtype('i8', v.lanes)}")

    def load(self, buf: Buffer, off: Val | Ramp) -> Val:
        info, dtype = self.buffer(buf), buf.dtype
        elem, align = mem_type(dtype), elem_bytes(dtype)
        mask = self.vec.mask if self.vec else None
        if isinstance(off, Ramp) and off.stride == 1:
            vt = vtype(elem, off.lanes)
            if mask is None:
                p = self._gep(info, elem, off.base)
                raw = self.fb.op(f"load {vt}, ptr {p}, align {align}{info.md}")
            else:
                p = self._gep(info, elem, off.base, inbounds=False)
                name = f"llvm.masked.load.v{off.lanes}{_mem_suffix(dtype)}.p0"
                self.mod.intrinsic(name, vt, ["ptr", mask.ty, vt])
                raw = self.fb.op(
                    f"call {vt} @{name}(ptr align {align} {p}, {mask.typed}, {vt} zeroinitializer){info.md}"
                )
            return self._to_reg(raw, dtype, off.lanes)
        if isinstance(off, Ramp) and self._deinterleaves(buf, off):
            return self._to_reg(self._strided_load(info, dtype, off, mask), dtype, off.lanes)
        if isinstance(off, Ramp) or off.lanes:
            off = self.mat(off)
            vt = vtype(elem, off.lanes)
            ptrs = self.fb.op(f"getelementptr {elem}, ptr {info.ptr}, {off.typed}")
            m = mask if mask is not None else self.const(True, "bool", off.lanes)
            name = f"llvm.masked.gather.v{off.lanes}{_mem_suffix(dtype)}.v{off.lanes}p0"
            pt = f"<{off.lanes} x ptr>"
            self.mod.intrinsic(name, vt, [pt, m.ty, vt])
            raw = self.fb.op(
                f"call {vt} @{name}({pt} align {align} {ptrs}, {m.typed}, {vt} zeroinitializer){info.md}"
            )
            return self._to_reg(raw, dtype, off.lanes)
        if mask is not None and not self.vec.nonempty:
            return self._guarded_scalar_load(info, dtype, off, mask)
        p = self._gep(info, elem, off)
        return self._to_reg(self.fb.op(f"load {elem}, ptr {p}, align {align}{info.md}"), dtype, 0)

    @staticmethod
    def _deinterleaves(buf: Buffer, off: Ramp) -> bool:
        if off.stride < 2:
            return False
        span = ((off.lanes - 1) * off.stride + 1) * elem_bytes(buf.dtype)
        return off.stride <= MAX_DEINTERLEAVE or (buf.scope == "local" and span <= MAX_LOCAL_SPAN_BYTES)

    def _strided_load(self, info: BufInfo, dtype: str, off: Ramp, mask: Val | None) -> str:
        """Lanes at a constant stride: one contiguous load of exactly the span they cover, deinterleaved.

        Under a mask the span's elements are enabled only where an active lane reads them.
        """
        elem, align = mem_type(dtype), elem_bytes(dtype)
        span = (off.lanes - 1) * off.stride + 1
        wide = vtype(elem, span)
        if mask is None:
            p = self._gep(info, elem, off.base)
            raw = self.fb.op(f"load {wide}, ptr {p}, align {align}{info.md}")
        else:
            wide_mask = self._spread(mask.typed, mask.ty, off)
            p = self._gep(info, elem, off.base, inbounds=False)
            name = f"llvm.masked.load.v{span}{_mem_suffix(dtype)}.p0"
            self.mod.intrinsic(name, wide, ["ptr", f"<{span} x i1>", wide])
            raw = self.fb.op(
                f"call {wide} @{name}(ptr align {align} {p}, <{span} x i1> {wide_mask}, {wide} zeroinitializer)"
                f"{info.md}"
            )
        picks = ", ".join(f"i32 {i * off.stride}" for i in range(off.lanes))
        return self.fb.op(f"shufflevector {wide} {raw}, {wide} poison, <{off.lanes} x i32> <{picks}>")

    def _strided_store(self, info: BufInfo, dtype: str, off: Ramp, mv: str, mask: Val | None) -> None:
        """Lanes at a constant stride: the value spread over the span they cover and stored under a mask of
        its lanes' places (one byte-masked store on AVX-512; elsewhere LLVM stores the places one by one
        from one base address, where a scatter computed and extracted a vector of addresses)."""
        elem, align = mem_type(dtype), elem_bytes(dtype)
        span = (off.lanes - 1) * off.stride + 1
        wide = vtype(elem, span)
        value = self._spread(mv, vtype(elem, off.lanes), off)
        if mask is None:
            places = vector_const_text([j % off.stride == 0 for j in range(span)], "bool")
        else:
            places = self._spread(mask.typed, mask.ty, off)
        p = self._gep(info, elem, off.base, inbounds=False)
        name = f"llvm.masked.store.v{span}{_mem_suffix(dtype)}.p0"
        self.mod.intrinsic(name, "void", [wide, "ptr", f"<{span} x i1>"])
        self.fb.emit(
            f"call void @{name}({wide} {value}, ptr align {align} {p}, <{span} x i1> {places}){info.md}"
        )

    def _spread(self, typed: str, ty: str, off: Ramp) -> str:
        """A vector of one element a lane (`typed`, of type `ty`) over the span `off`'s lanes cover: lane k at
        k * stride, zero (false) between."""
        span = (off.lanes - 1) * off.stride + 1
        picks = ", ".join(
            f"i32 {j // off.stride}" if j % off.stride == 0 else f"i32 {off.lanes}" for j in range(span)
        )
        return self.fb.op(f"shufflevector {typed}, {ty} zeroinitializer, <{span} x i32> <{picks}>")

    def _guarded_scalar_load(self, info: BufInfo, dtype: str, off: Val, mask: Val) -> Val:
        """A load invariant in the vector variable, skipped when no lane is active."""
        fb = self.fb
        elem, align = mem_type(dtype), elem_bytes(dtype)
        active = self.any_active(mask)
        pre = fb.cur_label
        load_l, join_l = fb.label("ld"), fb.label("ld_j")
        fb.cond_br(active.ref, load_l, join_l)
        fb.start_block(load_l)
        p = self._gep(info, elem, off)
        raw = fb.op(f"load {elem}, ptr {p}, align {align}{info.md}")
        loaded_l = fb.cur_label
        fb.br(join_l)
        fb.start_block(join_l)
        raw = fb.op(f"phi {elem} [ {raw}, %{loaded_l} ], [ zeroinitializer, %{pre} ]")
        return self._to_reg(raw, dtype, 0)

    def any_active(self, mask: Val) -> Val:
        return self.intrinsic("vector.reduce.or", [mask], reduce=True)

    def store(self, buf: Buffer, off: Val | Ramp, v: Val) -> None:
        info, dtype = self.buffer(buf), buf.dtype
        if v.dtype != dtype:
            raise CodegenError(f"store of {v.dtype} value into {dtype} buffer {buf.name!r}")
        elem, align = mem_type(dtype), elem_bytes(dtype)
        mask = self.vec.mask if self.vec else None
        if isinstance(off, Val) and not off.lanes:
            if v.lanes:
                raise CodegenError(
                    f"store to {buf.name!r} at an index invariant in vectorized loop variable "
                    f"{self.vec.var.name!r} of a value that varies with it (a reduction over a vectorized axis)"
                )
            p = self._gep(info, elem, off)
            self.fb.emit(f"store {self._to_mem(v)}, ptr {p}, align {align}{info.md}")
            return
        lanes = off.lanes
        mv = self._to_mem(self.bcast(v, lanes))
        vt = vtype(elem, lanes)
        if isinstance(off, Ramp) and off.stride == 1:
            if mask is None:
                p = self._gep(info, elem, off.base)
                self.fb.emit(f"store {mv}, ptr {p}, align {align}{info.md}")
                return
            p = self._gep(info, elem, off.base, inbounds=False)
            name = f"llvm.masked.store.v{lanes}{_mem_suffix(dtype)}.p0"
            self.mod.intrinsic(name, "void", [vt, "ptr", mask.ty])
            self.fb.emit(f"call void @{name}({mv}, ptr align {align} {p}, {mask.typed}){info.md}")
            return
        if isinstance(off, Ramp) and 2 <= off.stride <= MAX_DEINTERLEAVE:
            self._strided_store(info, dtype, off, mv, mask)
            return
        offs = self.mat(off)
        ptrs = self.fb.op(f"getelementptr {elem}, ptr {info.ptr}, {offs.typed}")
        m = mask if mask is not None else self.const(True, "bool", lanes)
        pt = f"<{lanes} x ptr>"
        name = f"llvm.masked.scatter.v{lanes}{_mem_suffix(dtype)}.v{lanes}p0"
        self.mod.intrinsic(name, "void", [vt, pt, m.ty])
        self.fb.emit(f"call void @{name}({mv}, {pt} align {align} {ptrs}, {m.typed}){info.md}")


def _as_index(e: Expr, buf: Buffer) -> Expr:
    if e.dtype == "int64":
        return e
    if e.dtype == "bool" or is_float(e.dtype):
        raise CodegenError(f"index {expr_str(e)} of buffer {buf.name!r} has non-integer dtype {e.dtype}")
    return Cast("int64", e)


def _mem_suffix(dtype: str) -> str:
    return "i8" if dtype == "bool" else _suffix(dtype, 0)


_FLOAT_RANK = {"float16": 0, "float32": 1, "float64": 2}

_REUSABLE = (Binary, Compare, Logical, Select, Cast, Load)
_EXPR = {
    Var: ExprGen._var,
    Const: ExprGen._const,
    Binary: ExprGen._binary,
    Compare: ExprGen._compare,
    Logical: ExprGen._logical,
    Select: ExprGen._select,
    Cast: ExprGen._cast,
    Reinterpret: ExprGen._reinterpret,
    Call: ExprGen._call,
    Load: ExprGen._load,
}


SATURATING_DTYPES = ("int8", "uint8", "int16", "uint16")  # a RoundedClamp's results


@dataclass(frozen=True)
class RoundedClamp:
    """`dtype(clamp(round(x) + zero_point, lo, hi))`, with lo and hi within dtype's range."""

    x: Expr
    zero_point: int
    lo: int
    hi: int
    dtype: str


def rounded_clamp(e: Cast) -> RoundedClamp | None:
    """`e` as a RoundedClamp: a cast to an integer type of min/max with constants (in any nesting) of
    `round(x)` plus or minus an integer constant below 2^24 (float arithmetic on it is exact). Bounds beyond the integer type's range are moved into it: the cast of a value
    outside it is undefined."""
    if e.dtype not in SATURATING_DTYPES or e.value.dtype not in ("float32", "float64"):
        return None
    node, steps = e.value, []
    while isinstance(node, Binary) and node.op in ("min", "max"):
        if isinstance(node.b, Const):
            steps.append((node.op, node.b.value))
            node = node.a
        elif isinstance(node.a, Const):
            steps.append((node.op, node.a.value))
            node = node.b
        else:
            return None
    lo, hi = -math.inf, math.inf
    for op, bound in reversed(steps):  # innermost first: f = clamp(., lo, hi), then op(f, bound)
        lo, hi = (min(lo, bound), min(hi, bound)) if op == "min" else (max(lo, bound), max(hi, bound))
    zero_point = 0.0
    if isinstance(node, Binary) and node.op in ("add", "sub") and isinstance(node.b, Const):
        zero_point = node.b.value if node.op == "add" else -node.b.value
        node = node.a
    if not (isinstance(node, Call) and node.name == "round"):
        return None
    lo, hi = max(lo, dtype_min(e.dtype)), min(hi, dtype_max(e.dtype))
    if not (lo <= hi and all(float(v).is_integer() for v in (lo, hi, zero_point))):
        return None
    if abs(zero_point) >= 1 << 24:  # beyond that float32 arithmetic on it would round
        return None
    return RoundedClamp(node.args[0], int(zero_point), int(lo), int(hi), e.dtype)
