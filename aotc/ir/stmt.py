"""Loop IR: the imperative program a State lowers to and codegen consumes."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from aotc.ir.expr import Buffer, Expr, Var

# the most lanes a VECTORIZED loop may have (a wider one is refused by the codegen)
MAX_VECTOR_LANES = 64


class ForKind(StrEnum):
    SERIAL = "serial"
    PARALLEL = "parallel"
    VECTORIZED = "vectorized"
    UNROLLED = "unrolled"
    TENSORIZED = "tensorized"  # a dot-product instruction (ir/dot.py), right inside a vectorized loop
    THREAD_BINDING = "thread_binding"


class Stmt:
    __slots__ = ()


@dataclass(frozen=True, slots=True)
class For(Stmt):
    """`for var in range(extent)`; `max_extent` is a constant upper bound of `extent`.

    `extent` is evaluated once, before the loop, and must not exceed `max_extent`. A vectorized loop
    has `max_extent` lanes; when `extent` is not that constant the lanes at or past `extent` are
    masked off. `thread_tag` names the binding of THREAD_BINDING loops. `narrow`: a TENSORIZED loop of an op
    whose signed factors the graph found within +-64 (ir/dot.py's `maddubs` form may run it).
    """

    var: Var
    extent: Expr
    max_extent: int
    kind: ForKind
    body: Stmt
    thread_tag: str = ""
    narrow: bool = False


@dataclass(frozen=True, slots=True)
class Seq(Stmt):
    stmts: tuple[Stmt, ...]


@dataclass(frozen=True, slots=True)
class IfThenElse(Stmt):
    cond: Expr
    then_case: Stmt
    else_case: Stmt | None = None


@dataclass(frozen=True, slots=True)
class BufferStore(Stmt):
    buffer: Buffer
    value: Expr
    indices: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Allocate(Stmt):
    """Memory for `buffer` live during `body`.

    Scopes: "global" (heap, or device memory on a GPU), "local" (per-thread scratch), "shared" (one
    copy per GPU thread block, written and read by all its threads between barriers).
    """

    buffer: Buffer
    body: Stmt


@dataclass(frozen=True, slots=True)
class LetStmt(Stmt):
    var: Var
    value: Expr
    body: Stmt


@dataclass(frozen=True, slots=True)
class Barrier(Stmt):
    """Every thread of a GPU block waits here until all reach it; their "shared" writes are then visible.

    All threads of a block must reach it: it may not sit under a condition that differs between them.
    """


@dataclass(frozen=True, slots=True)
class PrimFunc:
    """A kernel: `params` are the buffers passed in, in order, as raw pointers."""

    name: str
    params: tuple[Buffer, ...]
    body: Stmt


def seq(*stmts: Stmt | None) -> Stmt:
    flat: list[Stmt] = []
    for s in stmts:
        if s is None:
            continue
        if isinstance(s, Seq):
            flat.extend(s.stmts)
        else:
            flat.append(s)
    if len(flat) == 1:
        return flat[0]
    return Seq(tuple(flat))


def stmt_children(s: Stmt) -> tuple[Stmt, ...]:
    if isinstance(s, (For, Allocate, LetStmt)):
        return (s.body,)
    if isinstance(s, Seq):
        return s.stmts
    if isinstance(s, IfThenElse):
        return (s.then_case,) if s.else_case is None else (s.then_case, s.else_case)
    return ()


def walk_stmts(s: Stmt):
    """Pre-order iteration over `s` and its nested statements."""
    stack = [s]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(stmt_children(node)))


def substitute_stmt(s: Stmt, mapping: dict) -> Stmt:
    """`s` with variables replaced by expressions in every expression it holds."""
    from aotc.ir.expr import substitute

    def sub(e):
        return substitute(e, mapping)

    if isinstance(s, For):
        return For(
            s.var,
            sub(s.extent),
            s.max_extent,
            s.kind,
            substitute_stmt(s.body, mapping),
            s.thread_tag,
            s.narrow,
        )
    if isinstance(s, Seq):
        return Seq(tuple(substitute_stmt(c, mapping) for c in s.stmts))
    if isinstance(s, IfThenElse):
        other = None if s.else_case is None else substitute_stmt(s.else_case, mapping)
        return IfThenElse(sub(s.cond), substitute_stmt(s.then_case, mapping), other)
    if isinstance(s, BufferStore):
        return BufferStore(s.buffer, sub(s.value), tuple(sub(i) for i in s.indices))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, substitute_stmt(s.body, mapping))
    if isinstance(s, LetStmt):
        return LetStmt(s.var, sub(s.value), substitute_stmt(s.body, mapping))
    if isinstance(s, Barrier):
        return s
    raise TypeError(f"unknown statement {type(s).__name__}")
