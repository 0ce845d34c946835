"""Random small ONNX graphs through aotc: each either matches onnxruntime or is refused cleanly (issue 19,
item 5: never an internal error).

`make_case(seed)` builds a graph of one to three nodes over the operators the ONNX frontend converts
(element-wise unary and binary ops with broadcasting, comparisons and Where, Cast, reductions, MatMul and
Gemm, Conv/ConvTranspose and the pools with random kernel, stride, padding, dilation and group,
normalizations, Softmax, Clip, Pad, Resize and the shape ops), with random shapes, element types, opsets
and attributes, some of them invalid or unsupported on purpose. Each graph is built the way the ONNX
backend builds a model (`aotc.onnx_backend`: `aotc.compile` for the host, untuned, cached), run with
`aotc_runtime` and compared with onnxruntime, or with ONNX's reference evaluator where onnxruntime has
no kernel for a valid model. The outcomes:

- match: the outputs have the reference's shapes, dtypes and values (integers and bools exactly; floats
  within TOLERANCES, NaN where the reference has NaN);
- refused: `prepare` raised one of `aotc.onnx_backend.REFUSALS` whose message names a node and its
  operator (a frontend error) or the model (a BuildError);
- unchecked: aotc built and ran a model that neither onnxruntime nor the reference evaluator runs (an
  invalid model aotc is lenient about, or a valid one neither implements; counted, not a failure: there is
  nothing to compare with). One whose element types break an operator's schema (onnxruntime's "Type
  Error": Neg on uint8, MatMul on int8) is no such model: the frontend refuses it (aotc.frontend.
  onnx_schema), and one it builds is an error;
- mismatch and error (any other exception, at build or run time): failures.

The default run takes DEFAULT_SEEDS (two graphs per operator family, 26 in all: ~2.5 s with an empty build
cache, ~1 s with pytest's warm one, on a 2-core machine); `-m slow` sweeps SWEEP_SEEDS (374 graphs, ~30 s).
Over seeds 0 to 399: 300 match, 86 refused (10 of them for element types), 14 unchecked (Resize-11 with no
roi, operators on types neither reference implements, inconsistent shapes). A SAME_* pool whose stride outruns
its window asks for negative padding, which ONNX leaves undefined: it is compared with the pool given explicit
pads that pad nothing there, as aotc does (`explicit_same_pads`).
`python -m tests.test_onnx_fuzz [--seeds 0:400]` prints each outcome's count and every failure.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from aotc.onnx_backend import REFUSALS, AotcBackend

IR_VERSION = 8
OPSETS = (11, 13, 15, 17, 18, 19, 21)

TOLERANCES = {
    # float32: each op is within a few ulp of onnxruntime's (vector exp/log/tanh/erf of libmvec or of
    # aotc's own polynomials, ~4 ulp), and sums (reductions, matmul, conv over at most ~200 terms of inputs
    # in [-2, 2]) run in another order, each partial sum rounding at 2^-24 of its magnitude: 1e-4 of the
    # output's scale covers both with room, while any wrong index, window or broadcast is off by O(1).
    "float32": (1e-4, 1e-4),
    # float16: a few ulp (2^-11 relative each) through up to three ops, sums in float32 either way
    "float16": (1e-2, 1e-2),
    "float64": (1e-9, 1e-9),
}
"""dtype -> (rtol, atol relative to max(1, the largest finite |reference value|))."""

FLOATS = ("float32", "float32", "float32", "float16", "float64")
INTS = ("int32", "int64", "int8", "uint8")
NUMERIC = FLOATS + INTS


@dataclass
class T:
    """A tensor of the graph being built: its name, shape and dtype (from ONNX's shape inference), and
    whether its values are exact (an input, or only ops that move or pick values: rounding ops and
    comparisons are applied only to those, so that a last-ulp difference upstream cannot flip them)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    exact: bool = True


@dataclass
class Case:
    seed: int
    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    ops: list[str] = field(default_factory=list)
    values: list[tuple[tuple[int, ...], str]] = field(default_factory=list)
    """Every value's (shape, dtype), as ONNX's shape inference gave them."""
    precision: str = "float64"
    """The narrowest float type a value of the graph has: its TOLERANCES hold for float outputs (a float16
    value cast to float32 carries float16's rounding)."""

    def describe(self) -> str:
        inputs = ", ".join(f"{k}{list(v.shape)}:{v.dtype}" for k, v in self.feeds.items())
        opset = self.model.opset_import[0].version
        return f"seed {self.seed} (opset {opset}; {' -> '.join(self.ops)}; inputs {inputs})"


class Invalid(Exception):
    """ONNX's shape inference rejects the graph built so far: it stays as it is (an invalid model)."""


class Builder:
    def __init__(self, rng: np.random.Generator, opset: int):
        self.rng = rng
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.feeds: dict[str, np.ndarray] = {}
        self.types: dict[str, T] = {}
        self.outputs: list[str] = []
        self.ops: list[str] = []
        self.count = 0

    # --- values
    def fresh(self, stem: str) -> str:
        self.count += 1
        return f"{stem}{self.count}"

    def values(self, shape, dtype: str, low: float = -2.0, high: float = 2.0, nonzero: bool = False):
        r, dt = self.rng, np.dtype(dtype)
        if dt == np.bool_:
            return r.random(shape) < 0.5
        if np.issubdtype(dt, np.integer):
            lo = max(int(low * 2.5), 0) if np.issubdtype(dt, np.unsignedinteger) else int(low * 2.5)
            a = r.integers(lo, int(high * 2.5) + 1, shape)
            if nonzero:
                a = np.where(a == 0, 1, a)
            return a.astype(dt)
        a = r.uniform(low, high, shape)
        if nonzero:
            a = np.where(np.abs(a) < 0.1, 0.5, a)
        return a.astype(dt)

    def input(self, shape, dtype: str, **kw) -> T:
        name = self.fresh("x")
        self.feeds[name] = np.asarray(self.values(tuple(shape), dtype, **kw))
        self.inputs.append(helper.make_tensor_value_info(name, _elem(dtype), list(shape)))
        t = self.types[name] = T(name, tuple(shape), dtype)
        return t

    def const(self, array, stem: str = "c") -> str:
        name = self.fresh(stem)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def operand(self, shape, dtype: str, **kw) -> str:
        """A second operand: a run-time input or a constant, at random."""
        if self.rng.random() < 0.5:
            return self.input(shape, dtype, **kw).name
        return self.const(self.values(tuple(shape), dtype, **kw))

    def ints(self, values) -> str:
        return self.const(np.asarray(values, np.int64))

    # --- nodes
    def node(self, op: str, inputs: list[str], n_out: int = 1, **attrs) -> list[T]:
        """Add a node, infer its outputs' types (Invalid if ONNX's inference rejects it)."""
        name = f"n{len(self.nodes)}_{op}"
        outs = [f"{name}_y{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=name, **attrs))
        self.ops.append(op + _attr_note(attrs))
        self.outputs = outs
        try:
            inferred = onnx.shape_inference.infer_shapes(self.model(), strict_mode=True)
        except Exception as e:  # InferenceError, or a ValidationError of a bad attribute
            raise Invalid(str(e)) from None
        found = {vi.name: vi for vi in inferred.graph.value_info} | {
            vi.name: vi for vi in inferred.graph.output
        }
        result = []
        for o in outs:
            tt = found[o].type.tensor_type if o in found else None
            if (
                tt is None
                or not tt.HasField("shape")
                or any(not d.HasField("dim_value") for d in tt.shape.dim)
            ):
                raise Invalid(f"{o}: no static shape inferred")
            t = T(o, tuple(d.dim_value for d in tt.shape.dim), _np_name(tt.elem_type))
            self.types[o] = t
            result.append(t)
        return result

    def value_info(self, name: str) -> onnx.ValueInfoProto:
        """A graph output: typed where inference gave its type (ONNX's full check wants one)."""
        t = self.types.get(name)
        if t is None or t.dtype.startswith("onnx"):
            return helper.make_empty_tensor_value_info(name)
        return helper.make_tensor_value_info(name, _elem(t.dtype), list(t.shape))

    def model(self) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes,
            "fuzz",
            self.inputs,
            [self.value_info(o) for o in self.outputs],
            self.inits,
        )
        return helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", self.opset)], ir_version=IR_VERSION
        )


def _elem(dtype: str) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _np_name(elem_type: int) -> str:
    try:
        return str(helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, ValueError):
        return f"onnx{elem_type}"


def _attr_note(attrs: dict) -> str:
    return "(" + ", ".join(f"{k}={v}" for k, v in attrs.items()) + ")" if attrs else ""


# ----------------------------------------------------------------------------- operator families
# Each takes the builder, the current tensor and the rng, adds one or a few nodes and returns the new
# current tensor. About one draw in eight picks something invalid or unsupported on purpose (a dtype
# outside the schema, an axis out of range, shapes that do not broadcast, a group that does not divide).

UNARY_FLOAT = ["Exp", "Log", "Sqrt", "Reciprocal", "Erf", "Tanh", "Sigmoid", "Softplus", "Softsign", "Sin"]
UNARY_ANY = ["Neg", "Abs", "Relu", "Sign", "Identity"]
ROUNDING = ["Floor", "Ceil", "Round"]
BINARY = ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "PRelu", "Mod"]
COMPARE = ["Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"]


def bad(rng) -> bool:
    return rng.random() < 0.12


def unary(b: Builder, x: T, rng) -> T:
    if x.dtype.startswith("float"):
        pool = UNARY_FLOAT + UNARY_ANY + (ROUNDING if x.exact else []) + ["LeakyRelu", "Elu", "HardSigmoid"]
        pool += ["HardSwish"] if b.opset >= 14 else []
    else:
        pool = UNARY_ANY + (["Exp", "Sqrt"] if bad(rng) else [])  # Exp on integers: invalid
    op = str(rng.choice(pool))
    attrs = {}
    if op in ("Log", "Sqrt") and x.dtype.startswith("float"):
        x = b.node("Abs", [x.name])[0]  # keep the reference's NaNs out of it: they are not the point
    if op == "LeakyRelu":
        attrs["alpha"] = float(rng.choice([0.01, 0.2, 1.5]))
    elif op == "Elu":
        attrs["alpha"] = float(rng.choice([1.0, 0.5]))
    elif op == "HardSigmoid":
        attrs = {"alpha": float(rng.choice([0.2, 0.5])), "beta": float(rng.choice([0.5, 0.1]))}
    (y,) = b.node(op, [x.name], **attrs)
    y.exact = x.exact and op in UNARY_ANY + ROUNDING
    return y


def broadcast_partner(b: Builder, x: T, rng) -> tuple[int, ...]:
    """A shape that broadcasts with x's (or, now and then, one that does not)."""
    shape = list(x.shape)
    if rng.random() < 0.3:
        shape = shape[int(rng.integers(0, len(shape) + 1)) :]
    shape = [1 if rng.random() < 0.3 else s for s in shape]
    if rng.random() < 0.15:
        shape = [1] * int(rng.integers(1, 3)) + shape  # more dimensions than x
    if bad(rng) and shape:
        i = int(rng.integers(0, len(shape)))
        shape[i] = x.shape[len(x.shape) - len(shape) + i] + 1 if i >= len(shape) - len(x.shape) else 3
    return tuple(shape)


def binary(b: Builder, x: T, rng) -> T:
    op = str(rng.choice(BINARY))
    dtype = x.dtype
    if bad(rng):
        dtype = str(rng.choice(NUMERIC + ("bool",)))  # a mismatched or invalid second type
    shape = broadcast_partner(b, x, rng)
    attrs = {}
    if op == "Pow":
        if dtype.startswith("float") and x.dtype.startswith("float"):
            x = b.node("Abs", [x.name])[0]
        other = b.operand(shape, dtype, low=0, high=1.2)
    elif op in ("Div", "Mod"):
        other = b.operand(shape, dtype, nonzero=True)
        if op == "Mod":
            attrs["fmod"] = int(x.dtype.startswith("float") or rng.random() < 0.5)
            if x.dtype.startswith("float") and (x.dtype == "float16" or not x.exact):
                attrs["fmod"] = int(rng.random() < 0.9)
    elif op == "PRelu":
        other = b.operand(shape, dtype)
    else:
        other = b.operand(shape, dtype)
    operands = [x.name, other]
    if op in ("Max", "Min", "Sum", "Mean") and rng.random() < 0.3:
        operands.append(b.operand(broadcast_partner(b, x, rng), dtype))
    if rng.random() < 0.3 and op not in ("PRelu", "Pow", "Div", "Mod"):
        operands.reverse()
    (y,) = b.node(op, operands, **attrs)
    y.exact = x.exact and op in ("Max", "Min")
    return y


def compare_where(b: Builder, x: T, rng) -> T:
    op = str(rng.choice(COMPARE))
    if not x.exact:
        x = b.node("Round" if x.dtype.startswith("float") and x.exact else "Identity", [x.name])[0]
    other = b.operand(broadcast_partner(b, x, rng), x.dtype)
    (cond,) = b.node(op, [x.name, other])
    cond.exact = True
    r = rng.random()
    if r < 0.5:
        y = b.node("Where", [cond.name, x.name, b.operand(broadcast_partner(b, x, rng), x.dtype)])[0]
        y.exact = x.exact
        return y
    if r < 0.7:
        other = b.input(cond.shape, "bool").name
        return b.node(str(rng.choice(["And", "Or", "Xor" if bad(rng) else "And"])), [cond.name, other])[0]
    if r < 0.85:
        return b.node("Not", [cond.name])[0]
    return b.node("Cast", [cond.name], to=_elem(str(rng.choice(NUMERIC))))[0]


def cast(b: Builder, x: T, rng) -> T:
    targets = list(NUMERIC + ("bool", "uint16", "int16", "uint32", "uint64"))
    to = str(rng.choice(targets))
    if bad(rng):
        elem = int(rng.choice([TensorProto.BFLOAT16, TensorProto.STRING, TensorProto.FLOAT8E4M3FN]))
        if elem == TensorProto.FLOAT8E4M3FN and b.opset < 19:
            elem = TensorProto.BFLOAT16
        return b.node("Cast", [x.name], to=elem)[0]
    if x.dtype.startswith("float") and not to.startswith("float"):
        if not x.exact:  # a value a last ulp away from an integer would truncate differently
            x = b.node("Round", [b.node("Mul", [x.name, b.const(np.asarray(4, x.dtype))])[0].name])[0]
        if to.startswith("uint") or to == "int8":
            x = b.node("Abs", [x.name])[0]  # an out-of-range float to integer conversion is undefined
    if x.dtype.startswith("int") and to.startswith("uint"):
        x = b.node("Abs", [x.name])[0]
    if x.dtype == "bool" and not to.startswith(("float", "int", "uint", "bool")):
        to = "float32"
    (y,) = b.node("Cast", [x.name], to=_elem(to))
    y.exact = True
    return y


def reduce(b: Builder, x: T, rng) -> T:
    op = str(rng.choice(["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"]))
    rank = len(x.shape)
    n = int(rng.integers(0, rank + 1))
    axes = [int(a) for a in rng.choice(rank, n, replace=False)] if rank else []
    axes = [a - rank if rng.random() < 0.3 else a for a in axes]
    if bad(rng):
        axes.append(rank + 1)  # out of range
    attrs = {"keepdims": int(rng.integers(0, 2))}
    as_input = b.opset >= (13 if op == "ReduceSum" else 18)
    if not axes and rng.random() < 0.3 and as_input:
        attrs["noop_with_empty_axes"] = 1
    inputs = [x.name]
    if axes:
        if as_input:
            inputs.append(b.ints(axes))
        else:
            attrs["axes"] = axes
    (y,) = b.node(op, inputs, **attrs)
    y.exact = x.exact and op in ("ReduceMax", "ReduceMin")
    return y


def matmul(b: Builder, x: T, rng) -> T:
    if not x.dtype.startswith("float") and not bad(rng):
        x = b.node("Cast", [x.name], to=TensorProto.FLOAT)[0]
    k = x.shape[-1] if x.shape else 1
    if bad(rng):
        k += 1
    n = int(rng.integers(1, 9))
    r = rng.random()
    if r < 0.6 or len(x.shape) != 2:
        if r < 0.15:
            shape = (k,)
        elif r < 0.35 and len(x.shape) >= 3:
            shape = (*x.shape[-3:-2], k, n)
        else:
            shape = (k, n)
        y = b.node("MatMul", [x.name, b.operand(shape, x.dtype)])[0]
    else:
        trans_a, trans_b = int(rng.integers(0, 2)), int(rng.integers(0, 2))
        if trans_a:
            x = b.node("Transpose", [x.name], perm=[1, 0])[0]
        m = x.shape[1] if trans_a else x.shape[0]
        w = b.operand((n, k) if trans_b else (k, n), x.dtype)
        inputs = [x.name, w]
        c_shape = [(n,), (1, n), (m, n), (m, 1), (), None][int(rng.integers(0, 6))]
        if c_shape is not None:
            inputs.append(b.operand(c_shape, x.dtype))
        attrs = {"transA": trans_a, "transB": trans_b}
        if rng.random() < 0.4:
            attrs["alpha"] = float(rng.choice([0.5, 2.0, -1.0]))
        if rng.random() < 0.4:
            attrs["beta"] = float(rng.choice([0.0, 0.5, 3.0]))
        y = b.node("Gemm", inputs, **attrs)[0]
    y.exact = False
    return y


def image(b: Builder, x: T, rng, spatial: int | None = None) -> T:
    """x as an [N, C, spatial...] float tensor (a new input when x does not fit)."""
    spatial = spatial or int(rng.choice([2, 2, 1]))
    if len(x.shape) == spatial + 2 and x.dtype.startswith("float") and max(x.shape[2:]) >= 3:
        return x
    dtype = x.dtype if x.dtype.startswith("float") else "float32"
    shape = (
        int(rng.integers(1, 3)),
        int(rng.integers(1, 7)),
        *(int(rng.integers(3, 11)) for _ in range(spatial)),
    )
    return b.input(shape, dtype)


def window_attrs(rng, spatial: int, sizes, pool: bool, opset: int) -> dict:
    kernel = [int(rng.integers(1, min(s, 5) + 1)) for s in sizes]
    attrs: dict = {"kernel_shape": kernel}
    if rng.random() < 0.6:
        attrs["strides"] = [int(rng.integers(1, 4)) for _ in range(spatial)]
    if rng.random() < 0.4 and (not pool or opset >= 19 or rng.random() < 0.5):
        attrs["dilations"] = [int(rng.integers(1, 3)) for _ in range(spatial)]
    r = rng.random()
    if r < 0.4:
        attrs["pads"] = [int(rng.integers(0, k)) for k in kernel] + [int(rng.integers(0, k)) for k in kernel]
    elif r < 0.6:
        attrs["auto_pad"] = str(rng.choice(["SAME_UPPER", "SAME_LOWER", "VALID"]))
    if bad(rng):
        attrs["kernel_shape"] = [s + 3 for s in sizes]  # larger than the input
    return attrs


def conv(b: Builder, x: T, rng) -> T:
    x = image(b, x, rng)
    spatial = len(x.shape) - 2
    c = x.shape[1]
    group = int(rng.choice([g for g in range(1, c + 1) if c % g == 0])) if rng.random() < 0.4 else 1
    if bad(rng):
        group = c + 1
    m = group * int(rng.integers(1, 4))
    attrs = window_attrs(rng, spatial, x.shape[2:], False, b.opset)
    kernel = attrs.pop("kernel_shape")
    transposed = rng.random() < 0.25
    if transposed:
        attrs.pop("auto_pad", None)
        attrs["pads"] = [min(p, k - 1) for p, k in zip(attrs.get("pads", [0] * 2 * spatial), kernel * 2)]
        if rng.random() < 0.3 and "strides" in attrs:
            attrs["output_padding"] = [int(rng.integers(0, s)) for s in attrs["strides"]]
        w_shape = (c, m // group, *kernel)
    else:
        w_shape = (m, c // group, *kernel)
    if rng.random() < 0.5:
        attrs["kernel_shape"] = kernel
    inputs = [x.name, b.const(b.values(w_shape, x.dtype, -1, 1))]
    if rng.random() < 0.5:
        inputs.append(b.const(b.values((m,), x.dtype)))
    y = b.node("ConvTranspose" if transposed else "Conv", inputs, group=group, **attrs)[0]
    y.exact = False
    return y


def pool(b: Builder, x: T, rng) -> T:
    x = image(b, x, rng)
    spatial = len(x.shape) - 2
    op = str(rng.choice(["MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"]))
    if op.startswith("Global"):
        y = b.node(op, [x.name])[0]
        y.exact = x.exact and op == "GlobalMaxPool"
        return y
    attrs = window_attrs(rng, spatial, x.shape[2:], True, b.opset)
    if rng.random() < 0.3:
        attrs["ceil_mode"] = 1
    if op == "AveragePool" and rng.random() < 0.5:
        attrs["count_include_pad"] = 1
    (y,) = b.node(op, [x.name], **attrs)
    y.exact = x.exact and op == "MaxPool"
    return y


def normalize(b: Builder, x: T, rng) -> T:
    if not x.dtype.startswith("float"):
        x = b.node("Cast", [x.name], to=TensorProto.FLOAT)[0]
    rank = len(x.shape)
    r = rng.random()
    if r < 0.4:
        op = str(rng.choice(["Softmax", "LogSoftmax"]))
        axis = int(rng.integers(-rank, rank)) if rank else 0
        if bad(rng):
            axis = rank + 1
        y = b.node(op, [x.name], **({"axis": axis} if rng.random() < 0.8 else {}))[0]
    elif r < 0.7 and b.opset >= 17 and rank >= 1:
        axis = int(rng.integers(-rank, rank))
        shape = x.shape[axis:]
        inputs = [x.name, b.const(b.values(shape, x.dtype, 0.5, 1.5))]
        if rng.random() < 0.5:
            inputs.append(b.const(b.values(shape, x.dtype)))
        y = b.node("LayerNormalization", inputs, axis=axis, epsilon=float(rng.choice([1e-5, 1e-3])))[0]
    else:
        x = image(b, x, rng)
        c = x.shape[1]
        scale, bias = b.const(b.values((c,), x.dtype, 0.5, 1.5)), b.const(b.values((c,), x.dtype))
        if rng.random() < 0.5:
            y = b.node("InstanceNormalization", [x.name, scale, bias], epsilon=1e-4)[0]
        else:
            mean, var = b.const(b.values((c,), x.dtype)), b.const(b.values((c,), x.dtype, 0.5, 2.0))
            y = b.node("BatchNormalization", [x.name, scale, bias, mean, var], epsilon=1e-3)[0]
    y.exact = False
    return y


def clip_pad(b: Builder, x: T, rng) -> T:
    rank = len(x.shape)
    if rng.random() < 0.5 or rank == 0:
        lo, hi = sorted(float(v) for v in rng.uniform(-1.5, 1.5, 2))
        if bad(rng):
            lo, hi = hi, lo
        if b.opset < 11:
            (y,) = b.node("Clip", [x.name], min=lo, max=hi)
        else:
            bounds = [b.const(np.asarray(v, x.dtype)) if rng.random() < 0.7 else "" for v in (lo, hi)]
            while bounds and bounds[-1] == "":
                bounds.pop()
            (y,) = b.node("Clip", [x.name, *bounds])
        y.exact = x.exact
        return y
    mode = str(rng.choice(["constant", "constant", "reflect", "edge"]))
    pads = []
    for _ in range(2):
        for s in x.shape:
            most = s - 1 if mode == "reflect" else 3
            pads.append(int(rng.integers(0, most + 1)) if rng.random() < 0.6 else 0)
    if bad(rng):
        pads[int(rng.integers(0, len(pads)))] = -1  # cropping
    inputs = [x.name, b.ints(pads)]
    if mode == "constant" and rng.random() < 0.5:
        inputs.append(b.const(np.asarray(1.5 if x.dtype.startswith("float") else 3, x.dtype)))
    (y,) = b.node("Pad", inputs, mode=mode)
    y.exact = x.exact
    return y


def resize(b: Builder, x: T, rng) -> T:
    if not x.dtype.startswith("float") or len(x.shape) != 4:
        x = image(b, x, rng, spatial=2)
    mode = str(rng.choice(["nearest", "linear", "cubic" if bad(rng) else "linear"]))
    ctm = str(rng.choice(["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"]))
    attrs = {"mode": mode, "coordinate_transformation_mode": ctm}
    if mode == "nearest":
        attrs["nearest_mode"] = str(rng.choice(["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]))
    factors = [1.0, 1.0, *(float(rng.choice([0.5, 2.0, 3.0, 1.5])) for _ in range(2))]
    # align_corners by scales whose scaled length is not whole: onnxruntime divides by the output's extent,
    # ONNX (its spec's length_resized = scale * length_original, and its reference) by the scaled length,
    # as aotc does; sizes leave no such difference to trip on
    if rng.random() < 0.5 and ctm != "align_corners":
        inputs = [x.name, "", b.const(np.asarray(factors, np.float32))]
    else:
        sizes = [max(1, int(s * f)) for s, f in zip(x.shape, factors)]
        inputs = [x.name, "", "", b.ints(sizes)]
    (y,) = b.node("Resize", inputs, **attrs)
    y.exact = x.exact and mode == "nearest"
    return y


def shape_op(b: Builder, x: T, rng) -> T:
    rank, shape = len(x.shape), x.shape
    op = str(rng.choice(["Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Expand"]))
    if op == "Transpose":
        perm = [int(p) for p in rng.permutation(rank)]
        (y,) = b.node(op, [x.name], **({"perm": perm} if rank and rng.random() < 0.8 else {}))
    elif op == "Reshape":
        size = int(np.prod(shape))
        dims, left = [], size
        while left > 1 and len(dims) < 4:
            d = int(rng.choice([f for f in range(1, left + 1) if left % f == 0]))
            dims.append(d)
            left //= d
        dims = [*dims, left] if left > 1 or not dims else dims
        if rng.random() < 0.4:
            dims[int(rng.integers(0, len(dims)))] = -1
        if bad(rng):
            dims = [size + 1]
        (y,) = b.node(op, [x.name, b.ints(dims)])
    elif op == "Flatten":
        (y,) = b.node(op, [x.name], axis=int(rng.integers(-rank, rank + 1)) if rank else 0)
    elif op == "Squeeze":
        ones = [d for d, s in enumerate(shape) if s == 1]
        axes = ones if not bad(rng) else [int(rng.integers(0, max(rank, 1)))]
        if b.opset >= 13:
            (y,) = b.node(op, [x.name, b.ints(axes)] if axes or rng.random() < 0.5 else [x.name])
        else:
            (y,) = b.node(op, [x.name], **({"axes": axes} if axes else {}))
    elif op == "Unsqueeze":
        out_rank = rank + int(rng.integers(1, 3))
        axes = [int(a) for a in rng.choice(out_rank, out_rank - rank, replace=False)]
        axes = [a - out_rank if rng.random() < 0.3 else a for a in axes]
        if b.opset >= 13:
            (y,) = b.node(op, [x.name, b.ints(axes)])
        else:
            (y,) = b.node(op, [x.name], axes=axes)
    elif op == "Slice" and rank:
        n = int(rng.integers(1, rank + 1))
        axes = [int(a) for a in rng.choice(rank, n, replace=False)]
        starts, ends, steps = [], [], []
        for a in axes:
            step = int(rng.choice([1, 1, 2, -1, -2]))
            lo, hi = sorted(int(v) for v in rng.integers(-shape[a] - 2, shape[a] + 3, 2))
            starts.append(hi if step < 0 else lo)
            ends.append(lo if step < 0 else hi)
            steps.append(step)
        if b.opset >= 10:
            inputs = [x.name, b.ints(starts), b.ints(ends), b.ints(axes)]
            (y,) = b.node(op, inputs + ([b.ints(steps)] if any(s != 1 for s in steps) else []))
        else:
            (y,) = b.node(op, [x.name], starts=starts, ends=ends, axes=axes)
    else:  # Expand
        target = list(broadcast_partner(b, x, rng))
        target = [
            s if s != 1 or d >= len(target) - rank else int(rng.integers(1, 4)) for d, s in enumerate(target)
        ]
        (y,) = b.node("Expand", [x.name, b.ints(target)])
    y.exact = x.exact
    return y


def concat_split_gather(b: Builder, x: T, rng) -> T:
    rank = len(x.shape)
    if rank == 0:
        x = b.node("Reshape", [x.name, b.ints([1])])[0]
        rank = 1
    axis = int(rng.integers(-rank, rank)) if rank else 0
    r = rng.random()
    if r < 0.35:
        shape = list(x.shape)
        shape[axis] = int(rng.integers(1, 4))
        if bad(rng) and rank > 1:
            shape[(axis + 1) % rank] += 1
        operands = [x.name, b.operand(shape, x.dtype)]
        if rng.random() < 0.3:
            operands.insert(0, b.operand(shape, x.dtype))
        (y,) = b.node("Concat", operands, axis=axis)
    elif r < 0.65:
        extent = x.shape[axis]
        parts = int(rng.integers(1, min(extent, 4) + 1))
        attrs, inputs = {"axis": axis}, [x.name]
        if rng.random() < 0.5:
            cuts = (
                sorted(int(c) for c in rng.choice(np.arange(1, extent), parts - 1, replace=False))
                if parts > 1
                else []
            )
            sizes = [e - s for s, e in zip([0, *cuts], [*cuts, extent])]
            if bad(rng):
                sizes[-1] += 1
            if b.opset >= 13:
                inputs.append(b.ints(sizes))
            else:
                attrs["split"] = sizes
        elif b.opset >= 18:
            attrs["num_outputs"] = parts
        outs = b.node("Split", inputs, n_out=parts, **attrs)
        b.outputs = [o.name for o in outs]  # every part is a graph output; the chain goes on with the first
        y = outs[0]
    else:
        extent = x.shape[axis]
        ishape = tuple(int(rng.integers(1, 4)) for _ in range(int(rng.integers(0, 3))))
        indices = rng.integers(-extent, extent, ishape)
        dtype = str(rng.choice(["int64", "int32"]))
        if rng.random() < 0.5:
            name = b.const(indices.astype(dtype))
        else:
            name = b.input(ishape, dtype).name
            b.feeds[name] = indices.astype(dtype)
        (y,) = b.node("Gather", [x.name, name], axis=axis)
    y.exact = x.exact
    return y


FAMILIES: dict[str, Callable[[Builder, T, np.random.Generator], T]] = {
    "unary": unary,
    "binary": binary,
    "compare_where": compare_where,
    "cast": cast,
    "reduce": reduce,
    "matmul_gemm": matmul,
    "conv": conv,
    "pool": pool,
    "normalize": normalize,
    "clip_pad": clip_pad,
    "resize": resize,
    "shape": shape_op,
    "concat_split_gather": concat_split_gather,
}


def make_case(seed: int) -> Case:
    """A random graph: a first input, then one to three ops, the first of family seed % len(FAMILIES)
    (so any len(FAMILIES) consecutive seeds cover every family), the others at random."""
    rng = np.random.default_rng(seed)
    names = list(FAMILIES)
    opset = int(rng.choice(OPSETS))
    b = Builder(rng, opset)
    rank = int(rng.choice([0, 1, 2, 2, 3, 3, 4, 4]))
    dtype = str(rng.choice(NUMERIC + ("bool",) if bad(rng) else NUMERIC))
    x = b.input(tuple(int(rng.integers(1, 6)) for _ in range(rank)), dtype)
    steps = [names[seed % len(names)]] + [str(rng.choice(names)) for _ in range(int(rng.integers(0, 3)))]
    try:
        for family in steps:
            x = FAMILIES[family](b, x, rng)
    except Invalid:
        pass  # the graph as built, invalid node included: aotc must refuse it cleanly
    floats = {t.dtype for t in b.types.values()} & set(TOLERANCES)
    values = [(t.shape, t.dtype) for t in b.types.values()]
    return Case(
        seed,
        b.model(),
        b.feeds,
        b.ops,
        values,
        min(floats, key=lambda d: np.finfo(d).bits, default="float64"),
    )


# ----------------------------------------------------------------------------- references and outcomes


REFERENCE_BUGS = {"GlobalMaxPool", "GlobalAveragePool"}
"""Operators that ONNX's reference evaluator (onnx 1.23) gets wrong: GlobalMaxPool of an [N, C, L] input
gives [N, C] instead of [N, C, 1]. Graphs with them are compared with onnxruntime only."""


SAME_POOLS = ("MaxPool", "AveragePool", "LpPool")


def explicit_same_pads(model: onnx.ModelProto, every: bool = False) -> onnx.ModelProto | None:
    """`model` with explicit pads for each pool whose auto_pad SAME_UPPER/SAME_LOWER asks for negative
    padding on an axis (a stride longer than the window, which then skips the input's last elements), or
    with `every` for each SAME_* pool; None where there is none.

    ONNX's text leaves negative padding undefined: onnxruntime refuses it ("padding values must be
    non-negative") and ONNX's reference evaluator (onnx 1.23) crops the input by it, at the beginning for
    both modes (its strided MaxPool also splits SAME_LOWER as SAME_UPPER and counts floor(n / s) windows,
    not ceil). aotc pads nothing there, as TensorFlow's SAME (which the operator's text cites) and both
    engines' Conv do with the same attribute; the expectation is thus the pool with the split of
    max(0, total) as explicit pads (the odd element at the end for SAME_UPPER, the beginning for SAME_LOWER,
    as onnxruntime splits)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    values = [*inferred.graph.input, *inferred.graph.value_info]
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in values}
    changed = onnx.ModelProto()
    changed.CopyFrom(model)
    found = False
    for node in changed.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        auto_pad = attrs.pop("auto_pad", b"NOTSET").decode()
        if node.op_type not in SAME_POOLS or auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
            continue
        sizes = shapes[node.input[0]][2:]
        ones = [1] * len(sizes)
        windows = zip(sizes, attrs["kernel_shape"], attrs.get("strides", ones), attrs.get("dilations", ones))
        totals = [(-(-n // s) - 1) * s + (k - 1) * d + 1 - n for n, k, s, d in windows]
        if min(totals) >= 0 and not every:
            continue
        totals = [max(t, 0) for t in totals]
        begin = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in totals]
        attrs["pads"] = begin + [t - b for t, b in zip(totals, begin)]
        del node.attribute[:]
        node.attribute.extend(helper.make_attribute(k, v) for k, v in attrs.items())
        found = True
    return changed if found else None


EXPLICIT_PADS = ", SAME_* pools' negative padding as none"
"""What the reference's source says when it ran `explicit_same_pads`'s model."""


def reference(model: onnx.ModelProto, feeds: dict) -> tuple[list[np.ndarray] | None, str]:
    """onnxruntime's outputs, else (a model it has no kernel for) ONNX's reference evaluator's, else
    None; and which one (or why none). A SAME_* pool with negative padding is run with explicit pads
    (`explicit_same_pads`), as is each SAME_* pool by the reference evaluator."""
    import onnxruntime

    note = ""
    if (explicit := explicit_same_pads(model)) is not None:
        model, note = explicit, EXPLICIT_PADS
    try:
        opts = onnxruntime.SessionOptions()
        opts.log_severity_level = 4
        session = onnxruntime.InferenceSession(
            model.SerializeToString(), opts, providers=["CPUExecutionProvider"]
        )
        return session.run(None, feeds), "onnxruntime" + note
    except Exception as e:
        why = f"onnxruntime: {type(e).__name__}: {str(e)[:200]}"
    try:
        wrong = sorted({n.op_type for n in model.graph.node} & REFERENCE_BUGS)
        if wrong:
            raise NotImplementedError(f"ONNX's reference evaluator is wrong about {', '.join(wrong)}")
        onnx.checker.check_model(model, full_check=True)
        from onnx.reference import ReferenceEvaluator

        if (explicit := explicit_same_pads(model, every=True)) is not None:
            model, note = explicit, EXPLICIT_PADS
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            return list(ReferenceEvaluator(model).run(None, feeds)), "onnx.reference" + note
    except Exception as e:
        return None, f"{why}; onnx: {type(e).__name__}: {str(e)[:200]}"


def compare(got: np.ndarray, ref: np.ndarray, name: str, precision: str) -> str | None:
    """Why `got` does not match `ref`, or None; float values within the tolerances of the narrower of
    their type and `precision`."""
    ref = np.asarray(ref)
    if got.shape != ref.shape or got.dtype != ref.dtype:
        return f"{name}: {got.dtype}{list(got.shape)}, the reference gives {ref.dtype}{list(ref.shape)}"
    if ref.dtype.kind in "fc":
        rtol, atol = max(TOLERANCES[str(ref.dtype)], TOLERANCES[precision])
        finite = np.abs(ref[np.isfinite(ref)].astype(np.float64))
        scale = max(1.0, float(finite.max())) if finite.size else 1.0
        ok = np.isclose(got, ref, rtol=rtol, atol=atol * scale, equal_nan=True)
    else:
        ok = got == ref
    if ok.all():
        return None
    i = np.unravel_index(int(np.argmin(ok)), ok.shape)
    return (
        f"{name}: {int((~ok).sum())} of {ok.size} values differ, at {list(map(int, i))}: {got[i]} vs {ref[i]}"
    )


def names_culprit(message: str, case: Case) -> bool:
    """Whether a refusal says where: a node of the graph and its operator, or a graph input."""
    if any(n.name in message and n.op_type in message for n in case.model.graph.node):
        return True
    return any(f"input {k}" in message or f"'{k}'" in message for k in case.feeds)


TYPE_ERRORS = ("Type Error: Type '", "Type Error: Type parameter")
"""How onnxruntime's messages begin for an operand whose element type its operator's schema does not allow,
and for operands of one type constraint bound to different types."""


def run_case(case: Case, backend: type[AotcBackend]) -> tuple[str, str]:
    """(outcome, detail): match, refused, unchecked, mismatch or error."""
    expected, source = reference(case.model, case.feeds)
    try:
        rep = backend.prepare(case.model)
    except REFUSALS as e:
        message = f"{type(e).__name__}: {e}"
        if type(e).__name__ != "BuildError" and not names_culprit(str(e), case):
            return "error", f"a refusal that names no node: {message}"
        return "refused", message
    except Exception as e:
        return "error", f"prepare: {type(e).__name__}: {e}"
    try:
        with np.errstate(all="ignore"):
            got = rep.run(dict(case.feeds))
    except Exception as e:
        return "error", f"run: {type(e).__name__}: {e}"
    if expected is None:
        if any(e in source for e in TYPE_ERRORS):
            return "error", f"built a model whose element types its operators' schemas reject: {source}"
        return "unchecked", source
    if len(got) != len(expected):
        return "mismatch", f"{len(got)} outputs, the reference gives {len(expected)}"
    # ONNX's reference evaluator computes some float64 functions in float32 (Erf): float32's tolerances
    by_onnx = source.startswith("onnx.reference")
    precision = "float32" if by_onnx and case.precision == "float64" else case.precision
    outputs = zip(got, expected, case.model.graph.output)
    problems = [p for g, r, o in outputs if (p := compare(g, r, o.name, precision))]
    return ("mismatch", f"against {source}: " + "; ".join(problems)) if problems else ("match", source)


# ----------------------------------------------------------------------------- the tests

DEFAULT_SEEDS = range(2 * len(FAMILIES))
SWEEP_SEEDS = range(2 * len(FAMILIES), 400)

KNOWN_BUGS: list[tuple[Callable[[Case], bool], str]] = [
    # none open: a 0-d bool input (runtime _random_array) and a >64-lane vector (the default schedule)
    # were fixed
]
"""Bugs outside the files this test may fix, each with the graphs that may meet it: such a graph that fails
is an xfail naming the bug (one that passes, having met it no more, passes)."""


class Backend(AotcBackend):
    """The backend the fuzz tests build with; its cache is pytest's (`fuzz_cache`)."""


@pytest.fixture(autouse=True, scope="module")
def fuzz_cache(request, tmp_path_factory):
    cache = getattr(request.config, "cache", None)
    Backend.cache_dir = cache.mkdir("aotc-onnx-fuzz") if cache else tmp_path_factory.mktemp("onnx-fuzz")


def check_seed(seed: int) -> None:
    case = make_case(seed)
    outcome, detail = run_case(case, Backend)
    if outcome in ("match", "refused", "unchecked"):
        return
    known = [why for met, why in KNOWN_BUGS if met(case)]
    if known:
        pytest.xfail(f"known bug: {known[0]} ({outcome}: {detail[:300]})")
    pytest.fail(f"{outcome}: {case.describe()}: {detail}")


@pytest.mark.parametrize("seed", DEFAULT_SEEDS, ids=lambda s: f"seed{s}")
def test_random_graph_matches_or_is_refused(seed):
    check_seed(seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SWEEP_SEEDS, ids=lambda s: f"seed{s}")
def test_random_graph_sweep(seed):
    check_seed(seed)


FORMER_MISMATCHES = (193, 327)
"""Sweep seeds that once mismatched, run by default: 193 (MaxPool SAME_LOWER whose stride outruns its 1x1
window: see `explicit_same_pads`), 327 (Slice stepping backwards from a start below -extent)."""


@pytest.mark.parametrize("seed", FORMER_MISMATCHES, ids=lambda s: f"seed{s}")
def test_former_mismatch_matches(seed):
    outcome, detail = run_case(make_case(seed), Backend)
    assert outcome == "match", detail


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
def test_same_pool_whose_stride_outruns_its_window_pads_nothing(op, auto_pad):
    """A 1x1 window with stride 2 over 8 rows: SAME_*'s formula asks for -1 rows of padding, which
    onnxruntime refuses and ONNX's reference evaluator crops at the beginning (rows 1, 3, 5, 7); aotc, as
    both engines' Conv, pads nothing: rows 0, 2, 4, 6, compared explicitly."""
    b = Builder(np.random.default_rng(0), 18)
    x = b.input((1, 2, 8, 6), "float32")
    b.node(op, [x.name], kernel_shape=[1, 1], strides=[2, 1], auto_pad=auto_pad)
    case = Case(0, b.model(), b.feeds, b.ops, precision="float32")
    expected, source = reference(case.model, case.feeds)
    assert source == "onnxruntime" + EXPLICIT_PADS
    np.testing.assert_array_equal(expected[0], case.feeds[x.name][:, :, ::2])
    assert run_case(case, Backend) == ("match", source)


def test_default_seeds_cover_every_family():
    """The default run's graphs start with each operator family (twice)."""
    firsts = {list(FAMILIES)[s % len(FAMILIES)] for s in DEFAULT_SEEDS}
    assert firsts == set(FAMILIES)


def main(argv: list[str] | None = None) -> int:
    import os
    import tempfile

    parser = argparse.ArgumentParser(description="run the fuzz graphs, print each outcome's count")
    parser.add_argument("--seeds", default=f"0:{SWEEP_SEEDS.stop}", help="START:STOP (default all)")
    parser.add_argument("-v", action="store_true", help="print every graph's outcome")
    args = parser.parse_args(argv)
    start, stop = (int(s) for s in args.seeds.split(":"))
    os.environ.setdefault("AOTC_HOME", tempfile.mkdtemp(prefix="aotc-fuzz-"))
    os.environ.setdefault("AOTC_TOPHUB", "none")
    Backend.cache_dir = Path(tempfile.mkdtemp(prefix="aotc-fuzz-cache-"))
    counts, began = collections.Counter(), time.perf_counter()
    for seed in range(start, stop):
        case = make_case(seed)
        outcome, detail = run_case(case, Backend)
        if outcome in ("mismatch", "error") and any(met(case) for met, _ in KNOWN_BUGS):
            outcome = f"known bug ({outcome})"
        counts[outcome] += 1
        if args.v or outcome in ("mismatch", "error"):
            print(f"{outcome}: {case.describe()}: {detail[:400]}", flush=True)
    print(dict(counts), f"{stop - start} graphs in {time.perf_counter() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
