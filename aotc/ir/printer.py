"""Readable text for expressions and loop nests (users, tests and dedup read it)."""

from __future__ import annotations

from aotc.ir.expr import (
    Binary,
    Call,
    Cast,
    Compare,
    Const,
    Expr,
    Load,
    Logical,
    Reduce,
    Reinterpret,
    Select,
    TensorRead,
    Var,
)
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
)

_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "floormod": "%"}
_INFIX |= {"bitand": "&", "bitor": "|", "bitxor": "^"}
_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def expr_str(e: Expr) -> str:
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Const):
        if e.dtype == "bool":
            return "True" if e.value else "False"
        if e.dtype in ("int64",):
            return str(e.value)
        if e.dtype == "float32":
            return repr(float(e.value)) + "f"
        return f"{e.dtype}({e.value!r})"
    if isinstance(e, Binary):
        if e.op in _INFIX:
            return f"({expr_str(e.a)} {_INFIX[e.op]} {expr_str(e.b)})"
        return f"{e.op}({expr_str(e.a)}, {expr_str(e.b)})"
    if isinstance(e, Compare):
        return f"({expr_str(e.a)} {_CMP[e.op]} {expr_str(e.b)})"
    if isinstance(e, Logical):
        if e.op == "not":
            return f"!{expr_str(e.a)}"
        return f"({expr_str(e.a)} {'&&' if e.op == 'and' else '||'} {expr_str(e.b)})"
    if isinstance(e, Select):
        return f"select({expr_str(e.cond)}, {expr_str(e.true_value)}, {expr_str(e.false_value)})"
    if isinstance(e, Cast):
        return f"{e.dtype}({expr_str(e.value)})"
    if isinstance(e, Reinterpret):
        return f"reinterpret<{e.dtype}>({expr_str(e.value)})"
    if isinstance(e, Call):
        return f"{e.name}({', '.join(expr_str(a) for a in e.args)})"
    if isinstance(e, TensorRead):
        return f"{e.tensor.name}[{', '.join(expr_str(i) for i in e.indices)}]"
    if isinstance(e, Load):
        return f"{e.buffer.name}[{', '.join(expr_str(i) for i in e.indices)}]"
    if isinstance(e, Reduce):
        axes = ", ".join(f"{a.var.name}:{a.extent}" for a in e.axes)
        cond = "" if e.condition is None else f", where={expr_str(e.condition)}"
        return f"{e.combiner}({expr_str(e.source)}, axis=[{axes}]{cond})"
    return repr(e)


def stmt_str(s: Stmt, indent: int = 0) -> str:
    lines: list[str] = []
    _emit(s, indent, lines)
    return "\n".join(lines)


def _emit(s: Stmt, depth: int, out: list[str]) -> None:
    pad = "  " * depth
    if isinstance(s, For):
        kind = "" if s.kind == ForKind.SERIAL else f" {s.kind.value}"
        tag = f" {s.thread_tag}" if s.thread_tag else ""
        tag += " narrow" if s.narrow else ""  # weights within +-64: vpmaddubsw may run it (ir/dot.py)
        extent = expr_str(s.extent)
        out.append(f"{pad}for {s.var.name} in 0..{extent}{kind}{tag}:")
        _emit(s.body, depth + 1, out)
    elif isinstance(s, Seq):
        for child in s.stmts:
            _emit(child, depth, out)
    elif isinstance(s, IfThenElse):
        out.append(f"{pad}if {expr_str(s.cond)}:")
        _emit(s.then_case, depth + 1, out)
        if s.else_case is not None:
            out.append(f"{pad}else:")
            _emit(s.else_case, depth + 1, out)
    elif isinstance(s, BufferStore):
        idx = ", ".join(expr_str(i) for i in s.indices)
        out.append(f"{pad}{s.buffer.name}[{idx}] = {expr_str(s.value)}")
    elif isinstance(s, Allocate):
        b = s.buffer
        out.append(f"{pad}alloc {b.name}: {b.dtype}{list(b.shape)} {b.scope}")
        _emit(s.body, depth, out)
    elif isinstance(s, LetStmt):
        out.append(f"{pad}let {s.var.name} = {expr_str(s.value)}")
        _emit(s.body, depth, out)
    elif isinstance(s, Barrier):
        out.append(f"{pad}barrier")
    else:
        raise TypeError(f"cannot print {type(s).__name__}")


def func_str(f: PrimFunc) -> str:
    params = ", ".join(f"{b.name}: {b.dtype}{list(b.shape)}" for b in f.params)
    return f"def {f.name}({params}):\n{stmt_str(f.body, 1)}"
