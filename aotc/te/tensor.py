"""Tensor expressions: placeholders, element-wise computes and reductions over static shapes."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aotc.ir.expr import (
    DTYPES,
    INDEX,
    Expr,
    ExprLike,
    Reduce,
    TensorRead,
    Var,
    as_expr,
    logical_and,
)


class TEError(ValueError):
    pass


@dataclass(eq=False)
class IterVar:
    """An axis of a compute: a variable ranging over [0, extent)."""

    var: Var
    extent: int
    kind: str  # "spatial" | "reduce"

    @property
    def name(self) -> str:
        return self.var.name

    def __repr__(self) -> str:
        return f"IterVar({self.var.name}, {self.extent}, {self.kind})"


class Operation:
    """A tensor and the operation producing it (every operation has exactly one output)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    tag: str
    attrs: dict[str, Any]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, indices: ExprLike | tuple[ExprLike, ...]) -> Expr:
        if not isinstance(indices, tuple):
            indices = (indices,)
        if len(indices) != len(self.shape):
            raise TEError(f"{self.name} has {len(self.shape)} dimensions, indexed with {len(indices)}")
        idx = tuple(as_expr(i, INDEX) for i in indices)
        for i in idx:
            if i.dtype != INDEX:
                raise TEError(f"{self.name}: index {i} has dtype {i.dtype}, expected {INDEX}")
        return TensorRead(self, idx)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name}, {list(self.shape)}, {self.dtype})"


@dataclass(eq=False, repr=False)
class PlaceholderOp(Operation):
    name: str
    shape: tuple[int, ...]
    dtype: str
    tag: str = ""
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False, repr=False)
class ComputeOp(Operation):
    name: str
    axes: tuple[IterVar, ...]
    reduce_axes: tuple[IterVar, ...]
    body: Expr
    tag: str = ""
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, ...]:  # type: ignore[override]
        return tuple(a.extent for a in self.axes)

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.body.dtype

    @property
    def all_axes(self) -> tuple[IterVar, ...]:
        return self.axes + self.reduce_axes


LAYOUT_FREE = "layout_free"
"""Placeholder tag: a constant input (a weight) that the compiled kernel may take in any layout it chooses."""

CONST_INDEX_AXES = "const_index_axes"
"""Compute attr: ((axis position, period), ...) of the axes (taken modulo period when > 1) that a body's
constant coefficients depend on; unrolling them turns the coefficients into literals."""

NARROW_WEIGHTS = "narrow_weights"
"""Compute attr of an 8-bit sum of products: the graph found its constant int8 weights within +-64, so
AVX2's vpmaddubsw, whose int16 sums of two products saturate, is exact on it (aotc.ir.dot's `maddubs`)."""


def placeholder(
    shape: Sequence[int], dtype: str = "float32", name: str = "placeholder", tag: str = ""
) -> PlaceholderOp:
    shape = tuple(int(s) for s in shape)
    if any(s < 1 for s in shape):
        raise TEError(f"placeholder {name}: every extent must be >= 1, got {list(shape)}")
    if dtype not in DTYPES:
        raise TEError(f"placeholder {name}: unknown dtype {dtype!r}")
    return PlaceholderOp(name, shape, dtype, tag)


def reduce_axis(extent: int, name: str = "k") -> IterVar:
    if int(extent) < 1:
        raise TEError(f"reduce axis {name}: extent must be >= 1, got {extent}")
    return IterVar(Var(name), int(extent), "reduce")


def compute(
    shape: Sequence[int],
    fcompute: Callable[..., ExprLike],
    name: str = "compute",
    tag: str = "",
    attrs: dict[str, Any] | None = None,
) -> ComputeOp:
    """`fcompute(*axis_vars)` gives the value at one point; a reduction must be its outermost node."""
    shape = tuple(int(s) for s in shape)
    if any(s < 1 for s in shape):
        raise TEError(f"compute {name}: every extent must be >= 1, got {list(shape)}")
    names = _axis_names(fcompute, len(shape))
    axes = tuple(IterVar(Var(n), e, "spatial") for n, e in zip(names, shape))
    body = as_expr(fcompute(*[a.var for a in axes]))
    reduce_axes: tuple[IterVar, ...] = ()
    if isinstance(body, Reduce):
        reduce_axes = tuple(body.axes)
    _check_no_nested_reduce(body, name)
    return ComputeOp(name, axes, reduce_axes, body, tag, dict(attrs or {}))


def _axis_names(fcompute: Callable, n: int) -> list[str]:
    try:
        params = list(inspect.signature(fcompute).parameters.values())
    except (TypeError, ValueError):
        params = []
    if len(params) == n and all(p.kind == p.POSITIONAL_OR_KEYWORD for p in params):
        return [p.name for p in params]
    return [f"ax{i}" for i in range(n)]


def _check_no_nested_reduce(body: Expr, name: str) -> None:
    from aotc.ir.expr import walk

    root = body.source if isinstance(body, Reduce) else body
    for node in walk(root):
        if isinstance(node, Reduce):
            raise TEError(f"compute {name}: a reduction must be the outermost expression of the body")


def _reduce(combiner: str, expr: ExprLike, axis: IterVar | Sequence[IterVar], where: ExprLike | None) -> Expr:
    axes = (axis,) if isinstance(axis, IterVar) else tuple(axis)
    if not axes:
        raise TEError(f"{combiner}: needs at least one reduce axis")
    for a in axes:
        if a.kind != "reduce":
            raise TEError(f"{combiner}: axis {a.name} is not a reduce axis")
    cond = None if where is None else as_expr(where)
    return Reduce(combiner, as_expr(expr), axes, cond)


def sum(expr: ExprLike, axis: IterVar | Sequence[IterVar], where: ExprLike | None = None) -> Expr:  # noqa: A001
    return _reduce("sum", expr, axis, where)


def max(expr: ExprLike, axis: IterVar | Sequence[IterVar], where: ExprLike | None = None) -> Expr:  # noqa: A001
    return _reduce("max", expr, axis, where)


def min(expr: ExprLike, axis: IterVar | Sequence[IterVar], where: ExprLike | None = None) -> Expr:  # noqa: A001
    return _reduce("min", expr, axis, where)


def prod(expr: ExprLike, axis: IterVar | Sequence[IterVar], where: ExprLike | None = None) -> Expr:
    return _reduce("prod", expr, axis, where)


def all_of(*conds: ExprLike) -> Expr:
    return logical_and(*conds)
