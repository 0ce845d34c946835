"""Index-arithmetic simplification: linear canonical forms, div/mod by constants, range proofs.

`ranges` maps loop variables to inclusive integer bounds `(lo, hi)`; variables not in it are
unbounded. Only integer arithmetic is rewritten; float expressions are constant-folded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from aotc.ir.expr import (
    Binary,
    Call,
    Cast,
    Compare,
    Const,
    Expr,
    Load,
    Logical,
    Select,
    Var,
    children,
    const,
    dtype_max,
    dtype_min,
    is_float,
    is_int,
    rebuild,
)

Ranges = Mapping[Var, tuple[float, float]]
INF = math.inf


def bounds(e: Expr, ranges: Ranges) -> tuple[float, float]:
    """Inclusive interval containing every value of integer expression `e` (may be infinite)."""
    if isinstance(e, Const):
        return (e.value, e.value) if not isinstance(e.value, bool) else (int(e.value), int(e.value))
    if isinstance(e, Var):
        return ranges.get(e, (-INF, INF))
    if isinstance(e, Binary):
        if e.op in ("add", "sub", "mul", "min", "max"):
            alo, ahi = bounds(e.a, ranges)
            blo, bhi = bounds(e.b, ranges)
            if e.op == "add":
                return alo + blo, ahi + bhi
            if e.op == "sub":
                return alo - bhi, ahi - blo
            if e.op == "min":
                return min(alo, blo), min(ahi, bhi)
            if e.op == "max":
                return max(alo, blo), max(ahi, bhi)
            prods = [_mul(x, y) for x in (alo, ahi) for y in (blo, bhi)]
            return min(prods), max(prods)
        if e.op in ("floordiv", "floormod") and isinstance(e.b, Const) and e.b.value > 0:
            c = e.b.value
            alo, ahi = bounds(e.a, ranges)
            if e.op == "floordiv":
                return _fdiv(alo, c), _fdiv(ahi, c)
            if alo >= 0 and ahi < c:
                return alo, ahi
            if _fdiv(alo, c) == _fdiv(ahi, c) and alo != -INF and ahi != INF:
                return alo - c * _fdiv(alo, c), ahi - c * _fdiv(alo, c)
            return 0, c - 1
    if isinstance(e, Select):
        tlo, thi = bounds(e.true_value, ranges)
        flo, fhi = bounds(e.false_value, ranges)
        return min(tlo, flo), max(thi, fhi)
    if isinstance(e, (Compare, Logical)):
        return 0, 1
    if isinstance(e, (Cast, Load)) and is_int(e.dtype):
        if isinstance(e, Cast) and is_int(e.value.dtype):
            lo, hi = bounds(e.value, ranges)
            return max(lo, dtype_min(e.dtype)), min(hi, dtype_max(e.dtype))
        return dtype_min(e.dtype), dtype_max(e.dtype)
    return -INF, INF


def _mul(x: float, y: float) -> float:
    if x == 0 or y == 0:
        return 0
    return x * y


def _fdiv(x: float, c: int) -> float:
    if x in (INF, -INF):
        return x
    return x // c


class _Linear:
    """sum(coef * atom) + const, atoms in first-seen order."""

    __slots__ = ("terms", "const")

    def __init__(self, terms: dict[Expr, int] | None = None, c: int = 0):
        self.terms = terms if terms is not None else {}
        self.const = c

    def add(self, other: _Linear, scale: int = 1) -> _Linear:
        terms = dict(self.terms)
        for atom, coef in other.terms.items():
            v = terms.get(atom, 0) + scale * coef
            if v:
                terms[atom] = v
            else:
                terms.pop(atom, None)
        return _Linear(terms, self.const + scale * other.const)

    def scale(self, k: int) -> _Linear:
        if k == 0:
            return _Linear()
        return _Linear({a: c * k for a, c in self.terms.items()}, self.const * k)


def _linear(e: Expr) -> _Linear:
    """Linear form of an already simplified integer expression."""
    if isinstance(e, Const):
        return _Linear(c=int(e.value))
    if isinstance(e, Binary):
        if e.op == "add":
            return _linear(e.a).add(_linear(e.b))
        if e.op == "sub":
            return _linear(e.a).add(_linear(e.b), -1)
        if e.op == "mul":
            if isinstance(e.b, Const):
                return _linear(e.a).scale(int(e.b.value))
            if isinstance(e.a, Const):
                return _linear(e.b).scale(int(e.a.value))
    return _Linear({e: 1})


def _merge_div_mod(lin: _Linear) -> _Linear:
    """`k*c*(x // c) + k*(x % c)` is `k*x`: an index split by a constant and flattened again (a row's
    pixels of C channels read as one run, `(i // C) * C + i % C`) is the index itself."""
    for atom, k in lin.terms.items():
        if isinstance(atom, Binary) and atom.op == "floormod" and isinstance(atom.b, Const):
            div = Binary("floordiv", atom.a, atom.b)
            if lin.terms.get(div) == k * int(atom.b.value):
                merged = _Linear({a: v for a, v in lin.terms.items() if a != atom and a != div}, lin.const)
                return _merge_div_mod(merged.add(_linear(atom.a), k))
    return lin


def _build(lin: _Linear, dtype: str) -> Expr:
    out: Expr | None = None
    for atom, coef in lin.terms.items():
        if out is None:
            if coef == 1:
                out = atom
            elif coef == -1:
                out = Binary("sub", Const(0, dtype), atom)
            else:
                out = Binary("mul", atom, Const(coef, dtype))
            continue
        mag = abs(coef)
        term = atom if mag == 1 else Binary("mul", atom, Const(mag, dtype))
        out = Binary("add" if coef > 0 else "sub", out, term)
    if out is None:
        return Const(lin.const, dtype)
    if lin.const > 0:
        out = Binary("add", out, Const(lin.const, dtype))
    elif lin.const < 0:
        out = Binary("sub", out, Const(-lin.const, dtype))
    return out


def _lin_bounds(lin: _Linear, ranges: Ranges) -> tuple[float, float]:
    lo = hi = lin.const
    for atom, coef in lin.terms.items():
        alo, ahi = bounds(atom, ranges)
        a, b = _mul(alo, coef), _mul(ahi, coef)
        lo += min(a, b)
        hi += max(a, b)
    return lo, hi


def _split_by(lin: _Linear, c: int) -> tuple[_Linear, _Linear]:
    """lin = c*q + r with q collecting the terms whose coefficient c divides."""
    q_terms: dict[Expr, int] = {}
    r_terms: dict[Expr, int] = {}
    for atom, coef in lin.terms.items():
        if coef % c == 0:
            q_terms[atom] = coef // c
        else:
            r_terms[atom] = coef
    return _Linear(q_terms, lin.const // c), _Linear(r_terms, lin.const % c)


def _fold_int(op: str, a: int, b: int) -> int | None:
    if op == "add":
        return a + b
    if op == "sub":
        return a - b
    if op == "mul":
        return a * b
    if op == "floordiv":
        return a // b if b != 0 else None
    if op == "floormod":
        return a % b if b != 0 else None
    if op == "min":
        return min(a, b)
    if op == "max":
        return max(a, b)
    return None


def _fold_compare(op: str, lo: float, hi: float) -> bool | None:
    """Decide `d op 0` for d in [lo, hi]."""
    if op == "lt":
        return True if hi < 0 else False if lo >= 0 else None
    if op == "le":
        return True if hi <= 0 else False if lo > 0 else None
    if op == "gt":
        return True if lo > 0 else False if hi <= 0 else None
    if op == "ge":
        return True if lo >= 0 else False if hi < 0 else None
    if op == "eq":
        return True if lo == hi == 0 else False if lo > 0 or hi < 0 else None
    if op == "ne":
        return False if lo == hi == 0 else True if lo > 0 or hi < 0 else None
    return None


def simplify(e: Expr, ranges: Ranges | None = None) -> Expr:
    return _simplify(e, ranges or {})


def simplify_node(e: Expr, ranges: Ranges | None = None) -> Expr:
    """`simplify` of a node whose children are already simplified (a bottom-up rebuild simplifies each
    node once this way instead of re-walking its subtree at every level)."""
    return _simplify_node(e, ranges or {})


def _simplify(e: Expr, ranges: Ranges) -> Expr:
    if isinstance(e, (Const, Var)):
        return e
    kids = children(e)
    new_kids = tuple(_simplify(k, ranges) for k in kids)
    if any(n is not k for n, k in zip(new_kids, kids)):
        e = rebuild(e, new_kids)
    return _simplify_node(e, ranges)


def _simplify_node(e: Expr, ranges: Ranges) -> Expr:
    if isinstance(e, Binary):
        return _simplify_binary(e, ranges)
    if isinstance(e, Compare):
        return _simplify_compare(e, ranges)
    if isinstance(e, Logical):
        return _simplify_logical(e)
    if isinstance(e, Select):
        if isinstance(e.cond, Const):
            return e.true_value if e.cond.value else e.false_value
        if e.true_value == e.false_value:
            return e.true_value
        return e
    if isinstance(e, Cast) and isinstance(e.value, Const):
        return const(e.value.value if e.dtype != "bool" else bool(e.value.value), e.dtype)
    if isinstance(e, Call) and all(isinstance(a, Const) for a in e.args):
        return e
    return e


def _simplify_binary(e: Binary, ranges: Ranges) -> Expr:
    a, b, op, dtype = e.a, e.b, e.op, e.dtype
    if is_float(dtype):
        if isinstance(a, Const) and isinstance(b, Const):
            fa, fb = float(a.value), float(b.value)
            folded = {
                "add": lambda: fa + fb,
                "sub": lambda: fa - fb,
                "mul": lambda: fa * fb,
                "min": lambda: min(fa, fb),
                "max": lambda: max(fa, fb),
            }.get(op)
            if folded is not None:
                return Const(folded(), dtype)
        return e
    if not is_int(dtype):
        return e
    if isinstance(a, Const) and isinstance(b, Const):
        folded = _fold_int(op, int(a.value), int(b.value))
        if folded is not None:
            return Const(folded, dtype)
    if op in ("add", "sub", "mul"):
        if op == "mul" and not isinstance(a, Const) and not isinstance(b, Const):
            return e
        return _build(_linear(e), dtype)
    if op in ("floordiv", "floormod") and isinstance(b, Const) and b.value > 0:
        c = int(b.value)
        if c == 1:
            return a if op == "floordiv" else Const(0, dtype)
        lin = _linear(a)
        q, r = _split_by(lin, c)
        rlo, rhi = _lin_bounds(r, ranges)
        if rlo != -INF and rhi != INF and rlo // c == rhi // c:
            k = int(rlo // c)
            if op == "floordiv":
                return _build(q.add(_Linear(c=k)), dtype)
            return _build(r.add(_Linear(c=-k * c)), dtype)
        if op == "floordiv":
            if not q.terms and q.const == 0:
                return Binary("floordiv", _build(r, dtype), b)
            return _build(q.add(_Linear({Binary("floordiv", _build(r, dtype), b): 1})), dtype)
        return Binary("floormod", _build(r, dtype), b)
    if op in ("min", "max"):
        alo, ahi = bounds(a, ranges)
        blo, bhi = bounds(b, ranges)
        if op == "min":
            if ahi <= blo:
                return a
            if bhi <= alo:
                return b
        else:
            if alo >= bhi:
                return a
            if blo >= ahi:
                return b
        diff = _lin_bounds(_linear(a).add(_linear(b), -1), ranges)
        if diff[1] <= 0:
            return a if op == "min" else b
        if diff[0] >= 0:
            return b if op == "min" else a
    return e


def _simplify_compare(e: Compare, ranges: Ranges) -> Expr:
    a, b = e.a, e.b
    if not is_int(a.dtype):
        if isinstance(a, Const) and isinstance(b, Const):
            return const(_cmp_values(e.op, a.value, b.value), "bool")
        return e
    diff = _linear(a).add(_linear(b), -1)
    lo, hi = _lin_bounds(diff, ranges)
    decided = _fold_compare(e.op, lo, hi)
    if decided is not None:
        return const(decided, "bool")
    return e


def _cmp_values(op: str, x, y) -> bool:
    return {
        "lt": x < y,
        "le": x <= y,
        "gt": x > y,
        "ge": x >= y,
        "eq": x == y,
        "ne": x != y,
    }[op]


def _simplify_logical(e: Logical) -> Expr:
    a, b = e.a, e.b
    if e.op == "not":
        if isinstance(a, Const):
            return const(not a.value, "bool")
        return e
    for x, y in ((a, b), (b, a)):
        if isinstance(x, Const):
            if e.op == "and":
                return y if x.value else const(False, "bool")
            return const(True, "bool") if x.value else y
    return e


def affine(e: Expr) -> tuple[dict[Var, int], int] | None:
    """`e` as {var: coef} + const if it is affine in variables, else None."""
    lin = _linear(simplify(e))
    out: dict[Var, int] = {}
    for atom, coef in lin.terms.items():
        if not isinstance(atom, Var):
            return None
        out[atom] = coef
    return out, lin.const


def linear_terms(e: Expr) -> tuple[dict[Expr, int], int]:
    """`e` simplified and split into {atom: coef} + const; atoms are non-linear sub-expressions."""
    return affine_parts(simplify(e))


def affine_parts(e: Expr) -> tuple[dict[Expr, int], int]:
    """An already simplified integer expression as {atom: coef} + const (`linear_terms` without
    simplifying first); atoms are non-linear sub-expressions, in first-seen order."""
    lin = _linear(e)
    return dict(lin.terms), lin.const


def flat_affine_parts(
    indices: Sequence[Expr], strides: Sequence[int], forms: dict[Expr, _Linear] | None = None
) -> tuple[dict[Expr, int], int]:
    """The flat offset `sum(index * stride)` of already simplified indices as `affine_parts` gives it,
    with `k*c*(x // c) + k*(x % c)` as `k*x`, without building the sum: each index's linear form once,
    kept in `forms` (the unrolled copies of a body share most of their indices). The merge is for a
    final offset only; an index that is divided again simplifies against its split form."""
    lin = _Linear()
    for index, stride in zip(indices, strides, strict=True):
        form = forms.get(index) if forms is not None else None
        if form is None:
            form = _linear(index)
            if forms is not None:
                forms[index] = form
        lin = lin.add(form, stride)
    lin = _merge_div_mod(lin)
    return dict(lin.terms), lin.const


def from_terms(terms: Mapping[Expr, int], c: int, dtype: str = "int64") -> Expr:
    return _build(_Linear(dict(terms), c), dtype)
