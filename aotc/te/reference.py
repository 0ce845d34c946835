"""Evaluate a ComputeDAG with numpy over whole index grids: the reference kernels are checked against."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from aotc.ir.expr import (
    Binary,
    Call,
    Cast,
    Compare,
    Const,
    Expr,
    Logical,
    Reduce,
    Reinterpret,
    Select,
    TensorRead,
    Var,
    reduce_identity,
)
from aotc.te.dag import ComputeDAG
from aotc.te.tensor import ComputeOp, Operation

_erf = np.frompyfunc(math.erf, 1, 1)
_BITWISE = {"bitand": np.bitwise_and, "bitor": np.bitwise_or, "bitxor": np.bitwise_xor}
_TRIG = {"sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan}
_TRIG |= {"sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh}


def evaluate(
    dag: ComputeDAG, inputs: Mapping[str, np.ndarray], float_dtype: str | None = None
) -> list[np.ndarray]:
    """Outputs of `dag` for placeholder values given by name.

    `float_dtype="float64"` evaluates float ops in double precision (a tighter reference).
    """
    values: dict[Operation, np.ndarray] = {}
    for op in dag.placeholders:
        if op.name not in inputs:
            raise KeyError(f"missing input {op.name!r}")
        arr = np.asarray(inputs[op.name])
        if arr.shape != op.shape:
            raise ValueError(f"input {op.name}: expected shape {op.shape}, got {arr.shape}")
        values[op] = arr.astype(_dt(op.dtype, float_dtype))
    for op in dag.compute_ops:
        values[op] = _evaluate_op(op, values, float_dtype)
    return [values[o].astype(o.dtype) for o in dag.outputs]


def _dt(dtype: str, float_dtype: str | None) -> np.dtype:
    if float_dtype and dtype.startswith("float"):
        return np.dtype(float_dtype)
    return np.dtype("bool" if dtype == "bool" else dtype)


def _evaluate_op(op: ComputeOp, values: dict[Operation, np.ndarray], fdt: str | None) -> np.ndarray:
    axes = list(op.all_axes)
    ndim = len(axes)
    grid: dict[Var, np.ndarray] = {}
    for d, a in enumerate(axes):
        shape = [1] * ndim
        shape[d] = a.extent
        grid[a.var] = np.arange(a.extent, dtype=np.int64).reshape(shape)
    full_shape = tuple(a.extent for a in axes)
    body = op.body
    if not isinstance(body, Reduce):
        out = np.broadcast_to(_eval(body, grid, values, fdt), full_shape)
        return np.array(out, dtype=_dt(op.dtype, fdt))
    src = np.broadcast_to(_eval(body.source, grid, values, fdt), full_shape)
    if body.condition is not None:
        cond = np.broadcast_to(_eval(body.condition, grid, values, fdt), full_shape)
        ident = reduce_identity(body.combiner, op.dtype).value
        src = np.where(cond, src, ident)
    red_dims = tuple(range(len(op.axes), ndim))
    fn = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}[body.combiner]
    return np.asarray(fn(src, axis=red_dims), dtype=_dt(op.dtype, fdt))


def _eval(e: Expr, grid, values, fdt):
    if isinstance(e, Var):
        return grid[e]
    if isinstance(e, Const):
        return np.array(e.value, dtype=_dt(e.dtype, fdt))
    if isinstance(e, TensorRead):
        arr = values[e.tensor]
        idx = tuple(np.clip(_eval(i, grid, values, fdt), 0, s - 1) for i, s in zip(e.indices, arr.shape))
        return arr[idx]
    if isinstance(e, Binary):
        a, b = _eval(e.a, grid, values, fdt), _eval(e.b, grid, values, fdt)
        with np.errstate(all="ignore"):
            if e.op == "add":
                return a + b
            if e.op == "sub":
                return a - b
            if e.op == "mul":
                return a * b
            if e.op == "div":
                return a / b
            if e.op == "floordiv":
                return np.floor_divide(a, b)
            if e.op == "floormod":
                return np.mod(a, b)
            if e.op == "min":
                return np.minimum(a, b)
            if e.op == "max":
                return np.maximum(a, b)
            if e.op in _BITWISE:
                return _BITWISE[e.op](a, b)
            return np.power(a, b)
    if isinstance(e, Compare):
        a, b = _eval(e.a, grid, values, fdt), _eval(e.b, grid, values, fdt)
        return {
            "lt": np.less,
            "le": np.less_equal,
            "gt": np.greater,
            "ge": np.greater_equal,
            "eq": np.equal,
            "ne": np.not_equal,
        }[e.op](a, b)
    if isinstance(e, Logical):
        a = _eval(e.a, grid, values, fdt)
        if e.op == "not":
            return np.logical_not(a)
        b = _eval(e.b, grid, values, fdt)
        return np.logical_and(a, b) if e.op == "and" else np.logical_or(a, b)
    if isinstance(e, Select):
        return np.where(
            _eval(e.cond, grid, values, fdt),
            _eval(e.true_value, grid, values, fdt),
            _eval(e.false_value, grid, values, fdt),
        )
    if isinstance(e, Cast):
        v = _eval(e.value, grid, values, fdt)
        with np.errstate(all="ignore"):
            return np.asarray(v).astype(_dt(e.dtype, fdt))
    if isinstance(e, Reinterpret):
        # the bits of the exact source type, whatever float type the evaluation computes in
        v = np.asarray(_eval(e.value, grid, values, fdt), dtype=e.value.dtype)  # 0-d stays 0-d
        return v.view(e.dtype).astype(_dt(e.dtype, fdt))
    if isinstance(e, Call):
        x = _eval(e.args[0], grid, values, fdt)
        with np.errstate(all="ignore"):
            if e.name == "erf":
                return _erf(x).astype(x.dtype)
            if e.name == "rsqrt":
                return 1 / np.sqrt(x)
            if e.name == "sigmoid":
                return 1 / (1 + np.exp(-x))
            if e.name in _TRIG:
                return _TRIG[e.name](x)
            return {
                "exp": np.exp,
                "log": np.log,
                "sqrt": np.sqrt,
                "tanh": np.tanh,
                "abs": np.abs,
                "floor": np.floor,
                "ceil": np.ceil,
                "round": np.round,
            }[e.name](x)
    raise TypeError(f"cannot evaluate {type(e).__name__}")
