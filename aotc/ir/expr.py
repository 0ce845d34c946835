"""Scalar expressions shared by tensor expressions and the loop IR.

Nodes are immutable; compound nodes compare structurally, `Var` and buffers by identity.
`==` is structural equality, so comparisons that build IR use `eq(a, b)` / `ne(a, b)`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, fields
from typing import Union

INDEX = "int64"
FLOAT_DTYPES = ("float16", "float32", "float64")
INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
DTYPES = FLOAT_DTYPES + INT_DTYPES + ("bool",)

BITWISE_OPS = ("bitand", "bitor", "bitxor")
"""Binary ops of integer operands only, on their two's complement bits (xor with all ones is `not`)."""
BINARY_OPS = ("add", "sub", "mul", "div", "floordiv", "floormod", "min", "max", "pow", *BITWISE_OPS)
COMPARE_OPS = ("lt", "le", "gt", "ge", "eq", "ne")
MATH_CALLS = ("exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "abs", "floor", "ceil", "round")
MATH_CALLS += ("sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh")
REDUCE_COMBINERS = ("sum", "max", "min", "prod")


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


def is_int(dtype: str) -> bool:
    return dtype in INT_DTYPES


@functools.cache  # a handful of dtype names, asked for every constant a code generator emits
def dtype_bits(dtype: str) -> int:
    if dtype == "bool":
        return 1
    return int("".join(ch for ch in dtype if ch.isdigit()))


ExprLike = Union["Expr", int, float, bool]


def _hash_once(cls):
    """Give a structurally compared node class a hash computed once per node: nodes nest deep, and hashing
    them again at every level was a tenth of a search round. The cached value never leaves the process
    (a pickled node takes None), because string hashes differ between processes."""
    compared = tuple(f.name for f in fields(cls) if f.compare)
    names = tuple(f.name for f in fields(cls))

    def __hash__(self) -> int:
        h = self._hash
        if h is None:
            h = hash(tuple(getattr(self, n) for n in compared))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> list:
        return [None if n == "_hash" else getattr(self, n) for n in names]

    cls.__hash__ = __hash__
    cls.__getstate__ = __getstate__
    return cls


class Expr:
    """Base of all scalar expressions; arithmetic operators build new nodes."""

    __slots__ = ()
    dtype: str

    def __add__(self, other: ExprLike) -> Expr:
        return binary("add", self, other)

    def __radd__(self, other: ExprLike) -> Expr:
        return binary("add", other, self)

    def __sub__(self, other: ExprLike) -> Expr:
        return binary("sub", self, other)

    def __rsub__(self, other: ExprLike) -> Expr:
        return binary("sub", other, self)

    def __mul__(self, other: ExprLike) -> Expr:
        return binary("mul", self, other)

    def __rmul__(self, other: ExprLike) -> Expr:
        return binary("mul", other, self)

    def __truediv__(self, other: ExprLike) -> Expr:
        return binary("div", self, other)

    def __rtruediv__(self, other: ExprLike) -> Expr:
        return binary("div", other, self)

    def __floordiv__(self, other: ExprLike) -> Expr:
        return binary("floordiv", self, other)

    def __rfloordiv__(self, other: ExprLike) -> Expr:
        return binary("floordiv", other, self)

    def __mod__(self, other: ExprLike) -> Expr:
        return binary("floormod", self, other)

    def __rmod__(self, other: ExprLike) -> Expr:
        return binary("floormod", other, self)

    def __pow__(self, other: ExprLike) -> Expr:
        return binary("pow", self, other)

    def __neg__(self) -> Expr:
        return binary("sub", const(0, self.dtype), self)

    def __lt__(self, other: ExprLike) -> Expr:
        return compare("lt", self, other)

    def __le__(self, other: ExprLike) -> Expr:
        return compare("le", self, other)

    def __gt__(self, other: ExprLike) -> Expr:
        return compare("gt", self, other)

    def __ge__(self, other: ExprLike) -> Expr:
        return compare("ge", self, other)

    def __bool__(self) -> bool:
        raise TypeError("an IR expression has no truth value; use select() or logical_and()")

    def astype(self, dtype: str) -> Expr:
        return cast(dtype, self)


@dataclass(frozen=True, eq=False, slots=True)
class Var(Expr):
    """A loop or index variable; compares by identity."""

    name: str
    dtype: str = INDEX

    def __repr__(self) -> str:
        return f"Var({self.name})"

    __hash__ = object.__hash__


@_hash_once
@dataclass(frozen=True, slots=True)
class Const(Expr):
    value: int | float | bool
    dtype: str
    _hash: int | None = field(default=None, init=False, repr=False, compare=False)


@_hash_once
@dataclass(frozen=True, slots=True)
class Binary(Expr):
    op: str
    a: Expr
    b: Expr
    _hash: int | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def dtype(self) -> str:
        return self.a.dtype


@_hash_once
@dataclass(frozen=True, slots=True)
class Compare(Expr):
    op: str
    a: Expr
    b: Expr
    dtype: str = field(default="bool", init=False)
    _hash: int | None = field(default=None, init=False, repr=False, compare=False)


@_hash_once
@dataclass(frozen=True, slots=True)
class Logical(Expr):
    """`and` / `or` of two booleans, or `not` of one (b is None)."""

    op: str
    a: Expr
    b: Expr | None = None
    dtype: str = field(default="bool", init=False)
    _hash: int | None = field(default=None, init=False, repr=False, compare=False)


@_hash_once
@dataclass(frozen=True, slots=True)
class Select(Expr):
    """`cond ? true_value : false_value`, lazy: loads in the arm not taken are never executed."""

    cond: Expr
    true_value: Expr
    false_value: Expr
    _hash: int | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def dtype(self) -> str:
        return self.true_value.dtype


@_hash_once
@dataclass(frozen=True, slots=True)
class Cast(Expr):
    dtype: str
    value: Expr
    _hash: int | None = field(default=None, init=False, repr=False, compare=False)


@_hash_once
@dataclass(frozen=True, slots=True)
class Reinterpret(Expr):
    """The bits of `value` read as `dtype`, a type of the same width (a bit cast, not a conversion)."""

    dtype: str
    value: Expr
    _hash: int | None = field(default=None, init=False, repr=False, compare=False)


@_hash_once
@dataclass(frozen=True, slots=True)
class Call(Expr):
    """A pure math function of the names in MATH_CALLS."""

    name: str
    args: tuple[Expr, ...]
    _hash: int | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def dtype(self) -> str:
        return self.args[0].dtype


@_hash_once
@dataclass(frozen=True, slots=True)
class TensorRead(Expr):
    """Read of a tensor-expression tensor (before lowering)."""

    tensor: object
    indices: tuple[Expr, ...]
    _hash: int | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def dtype(self) -> str:
        return self.tensor.dtype  # type: ignore[attr-defined]


@dataclass(frozen=True, eq=False, slots=True)
class Buffer:
    """A region of memory in the loop IR: row-major with optional explicit strides (in elements)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    scope: str = "global"
    strides: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.strides is None:
            strides, acc = [], 1
            for extent in reversed(self.shape):
                strides.append(acc)
                acc *= extent
            object.__setattr__(self, "strides", tuple(reversed(strides)))

    @property
    def num_elements(self) -> int:
        """Elements to allocate (covers the largest strided offset)."""
        if not self.shape:
            return 1
        return 1 + sum((e - 1) * s for e, s in zip(self.shape, self.strides))

    def flat_index(self, indices: tuple[Expr, ...]) -> Expr:
        offset: Expr = const(0, INDEX)
        for idx, stride in zip(indices, self.strides):
            offset = offset + idx * stride if stride != 1 else offset + idx
        return offset

    def __repr__(self) -> str:
        return f"Buffer({self.name}, {self.dtype}, {self.shape}, {self.scope})"

    __hash__ = object.__hash__


@_hash_once
@dataclass(frozen=True, slots=True)
class Load(Expr):
    buffer: Buffer
    indices: tuple[Expr, ...]
    _hash: int | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def dtype(self) -> str:
        return self.buffer.dtype


@_hash_once
@dataclass(frozen=True, slots=True)
class Reduce(Expr):
    """A commutative reduction of `source` over `axes` (IterVars), where `condition` holds."""

    combiner: str
    source: Expr
    axes: tuple
    condition: Expr | None = None
    _hash: int | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def dtype(self) -> str:
        return self.source.dtype


def dtype_min(dtype: str) -> int | float:
    if is_float(dtype):
        return -math.inf
    if dtype.startswith("uint"):
        return 0
    return -(2 ** (dtype_bits(dtype) - 1))


def dtype_max(dtype: str) -> int | float:
    if is_float(dtype):
        return math.inf
    if dtype.startswith("uint"):
        return 2 ** dtype_bits(dtype) - 1
    return 2 ** (dtype_bits(dtype) - 1) - 1


def reduce_identity(combiner: str, dtype: str) -> Const:
    if combiner == "sum":
        return const(0, dtype)
    if combiner == "max":
        return const(dtype_min(dtype), dtype)
    if combiner == "min":
        return const(dtype_max(dtype), dtype)
    if combiner == "prod":
        return const(1, dtype)
    raise ValueError(f"unknown reduce combiner {combiner!r}")


def const(value: int | float | bool, dtype: str | None = None) -> Const:
    if dtype is None:
        if isinstance(value, bool):
            dtype = "bool"
        elif isinstance(value, int):
            dtype = INDEX
        else:
            dtype = "float32"
    if dtype == "bool":
        value = bool(value)
    elif is_int(dtype):
        value = int(value)
    else:
        value = float(value)
    return Const(value, dtype)


def as_expr(value: ExprLike, like: str | None = None) -> Expr:
    """Wrap a Python number; `like` is the dtype of the other operand, if any."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, bool):
        return const(value, "bool")
    if isinstance(value, int):
        return const(value, like if like is not None and like != "bool" else INDEX)
    if isinstance(value, float):
        return const(value, like if like is not None and is_float(like) else "float32")
    raise TypeError(f"cannot use {type(value).__name__} {value!r} as an IR expression")


def _operands(a: ExprLike, b: ExprLike) -> tuple[Expr, Expr]:
    ea = a if isinstance(a, Expr) else None
    eb = b if isinstance(b, Expr) else None
    if ea is None and eb is None:
        return as_expr(a), as_expr(b)
    if ea is None:
        return as_expr(a, eb.dtype), eb
    if eb is None:
        return ea, as_expr(b, ea.dtype)
    return ea, eb


def binary(op: str, a: ExprLike, b: ExprLike) -> Expr:
    if op not in BINARY_OPS:
        raise ValueError(f"unknown binary op {op!r}")
    ea, eb = _operands(a, b)
    if ea.dtype != eb.dtype:
        raise TypeError(f"{op}: operand dtypes differ ({ea.dtype} vs {eb.dtype}); cast one")
    if op == "div" and is_int(ea.dtype):
        raise TypeError("'/' on integers is ambiguous; use '//' (floordiv) or '%' (floormod)")
    if op in BITWISE_OPS and not is_int(ea.dtype):
        raise TypeError(f"{op} needs integer operands, got {ea.dtype}")
    return Binary(op, ea, eb)


def compare(op: str, a: ExprLike, b: ExprLike) -> Expr:
    if op not in COMPARE_OPS:
        raise ValueError(f"unknown comparison {op!r}")
    ea, eb = _operands(a, b)
    if ea.dtype != eb.dtype:
        raise TypeError(f"{op}: operand dtypes differ ({ea.dtype} vs {eb.dtype}); cast one")
    return Compare(op, ea, eb)


def eq(a: ExprLike, b: ExprLike) -> Expr:
    return compare("eq", a, b)


def ne(a: ExprLike, b: ExprLike) -> Expr:
    return compare("ne", a, b)


def logical_and(*conds: ExprLike) -> Expr:
    exprs = [as_expr(c) for c in conds]
    out = exprs[0]
    for c in exprs[1:]:
        out = Logical("and", out, c)
    return out


def logical_or(*conds: ExprLike) -> Expr:
    exprs = [as_expr(c) for c in conds]
    out = exprs[0]
    for c in exprs[1:]:
        out = Logical("or", out, c)
    return out


def logical_not(cond: ExprLike) -> Expr:
    return Logical("not", as_expr(cond))


def select(cond: ExprLike, true_value: ExprLike, false_value: ExprLike) -> Expr:
    t, f = _operands(true_value, false_value)
    if t.dtype != f.dtype:
        raise TypeError(f"select: branch dtypes differ ({t.dtype} vs {f.dtype})")
    c = as_expr(cond)
    if c.dtype != "bool":
        raise TypeError(f"select: condition must be bool, got {c.dtype}")
    return Select(c, t, f)


def cast(dtype: str, value: ExprLike) -> Expr:
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}")
    v = as_expr(value)
    if v.dtype == dtype:
        return v
    return Cast(dtype, v)


def reinterpret(dtype: str, value: ExprLike) -> Expr:
    """`value`'s bits as `dtype`: numeric types of the same width only (bool has no defined bits)."""
    v = as_expr(value)
    if dtype not in DTYPES or "bool" in (dtype, v.dtype) or dtype_bits(dtype) != dtype_bits(v.dtype):
        raise TypeError(f"reinterpret: cannot read the bits of {v.dtype} as {dtype}")
    return v if v.dtype == dtype else Reinterpret(dtype, v)


def call(name: str, *args: ExprLike) -> Expr:
    if name not in MATH_CALLS:
        raise ValueError(f"unknown math call {name!r}; known: {', '.join(MATH_CALLS)}")
    exprs = tuple(as_expr(a) for a in args)
    if name not in ("abs",) and not is_float(exprs[0].dtype):
        raise TypeError(f"{name} needs a float argument, got {exprs[0].dtype}")
    return Call(name, exprs)


def minimum(a: ExprLike, b: ExprLike) -> Expr:
    return binary("min", a, b)


def maximum(a: ExprLike, b: ExprLike) -> Expr:
    return binary("max", a, b)


def exp(x: ExprLike) -> Expr:
    return call("exp", x)


def log(x: ExprLike) -> Expr:
    return call("log", x)


def sqrt(x: ExprLike) -> Expr:
    return call("sqrt", x)


def rsqrt(x: ExprLike) -> Expr:
    return call("rsqrt", x)


def tanh(x: ExprLike) -> Expr:
    return call("tanh", x)


def erf(x: ExprLike) -> Expr:
    return call("erf", x)


def sigmoid(x: ExprLike) -> Expr:
    return call("sigmoid", x)


def abs_(x: ExprLike) -> Expr:
    return call("abs", x)


def floor(x: ExprLike) -> Expr:
    return call("floor", x)


def ceil(x: ExprLike) -> Expr:
    return call("ceil", x)


def round_(x: ExprLike) -> Expr:
    """Round half to even (numpy's and ONNX's rounding)."""
    return call("round", x)


def power(a: ExprLike, b: ExprLike) -> Expr:
    return binary("pow", a, b)


def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, (Binary, Compare)):
        return (e.a, e.b)
    if isinstance(e, Logical):
        return (e.a,) if e.b is None else (e.a, e.b)
    if isinstance(e, Select):
        return (e.cond, e.true_value, e.false_value)
    if isinstance(e, (Cast, Reinterpret)):
        return (e.value,)
    if isinstance(e, Call):
        return e.args
    if isinstance(e, (TensorRead, Load)):
        return e.indices
    if isinstance(e, Reduce):
        return (e.source,) if e.condition is None else (e.source, e.condition)
    return ()


def rebuild(e: Expr, new_children: tuple[Expr, ...]) -> Expr:
    """`e` with its children replaced (same order as `children`)."""
    if isinstance(e, Binary):
        return Binary(e.op, *new_children)
    if isinstance(e, Compare):
        return Compare(e.op, *new_children)
    if isinstance(e, Logical):
        return Logical(e.op, new_children[0], new_children[1] if len(new_children) > 1 else None)
    if isinstance(e, Select):
        return Select(*new_children)
    if isinstance(e, Cast):
        return Cast(e.dtype, new_children[0])
    if isinstance(e, Reinterpret):
        return Reinterpret(e.dtype, new_children[0])
    if isinstance(e, Call):
        return Call(e.name, tuple(new_children))
    if isinstance(e, TensorRead):
        return TensorRead(e.tensor, tuple(new_children))
    if isinstance(e, Load):
        return Load(e.buffer, tuple(new_children))
    if isinstance(e, Reduce):
        return Reduce(e.combiner, new_children[0], e.axes, new_children[1] if len(new_children) > 1 else None)
    return e


def transform(e: Expr, fn) -> Expr:
    """Bottom-up rewrite: `fn(node_with_rewritten_children)` returns a replacement or None to keep (`fn`
    is pure: a sub-expression shared in `e` is rewritten once and stays shared)."""
    memo: dict[int, Expr] = {}

    def visit(node: Expr) -> Expr:
        got = memo.get(id(node))
        if got is not None:
            return got
        kids = children(node)
        new = node
        if kids:
            new_kids = tuple(visit(k) for k in kids)
            if any(n is not k for n, k in zip(new_kids, kids)):
                new = rebuild(node, new_kids)
        out = fn(new)
        memo[id(node)] = result = new if out is None else out
        return result

    return visit(e)


def substitute(e: Expr, mapping: dict[Var, Expr]) -> Expr:
    """`e` with variables replaced; a shared sub-expression is rewritten once and stays shared."""
    if not mapping:
        return e
    memo: dict[int, Expr] = {}

    def visit(node: Expr) -> Expr:
        if isinstance(node, Var):
            return mapping.get(node, node)
        kids = children(node)
        if not kids:
            return node
        got = memo.get(id(node))
        if got is not None:
            return got
        new_kids = tuple(visit(k) for k in kids)
        out = node if all(n is k for n, k in zip(new_kids, kids)) else rebuild(node, new_kids)
        memo[id(node)] = out
        return out

    return visit(e)


def walk(e: Expr):
    """Pre-order iteration over `e` and all its sub-expressions."""
    stack = [e]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(children(node)))


def walk_distinct(e: Expr):
    """Pre-order iteration over the distinct nodes of `e`: a sub-expression that occurs several times as
    the same object (shared) is visited once."""
    seen: set[int] = set()
    stack = [e]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        stack.extend(reversed(children(node)))


def free_vars(e: Expr) -> set[Var]:
    return {n for n in walk_distinct(e) if isinstance(n, Var)}


def unique_name(base: str, taken: set[str], sep: str = "_") -> str:
    """`base`, or `base{sep}N` for the first N that is free; the result is added to `taken`."""
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}{sep}{n}"
    taken.add(name)
    return name
