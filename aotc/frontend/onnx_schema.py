"""ONNX frontend: element types checked against the operator's schema (issue 19, item 5).

ONNX defines each operator on some element types only (its schema's type constraints: Neg on signed
numbers, MatMul on no 8-bit integer); onnxruntime and ONNX's checker reject a node given another, while a
converter might compute something for it. `type_problem` checks a node's inputs and outputs, where their
types are known, against the schema of the version the model imports, before the node is converted.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx

__all__ = ["declared_types", "tensor_type", "type_problem"]


@dataclass(frozen=True)
class Formal:
    """One formal input or output of a schema: its name, type (a constraint's name, or a type itself), the
    types it allows (tensor types only, "tensor(float)"; None when it allows no tensor, which aotc's values
    all are), and whether it is variadic and, if so, whether its arguments share one type."""

    name: str
    type_str: str
    allowed: frozenset[str] | None
    variadic: bool
    homogeneous: bool


@dataclass(frozen=True)
class Signature:
    """A schema's formal inputs and outputs, as `type_problem` reads them."""

    operator: str
    inputs: tuple[Formal, ...]
    outputs: tuple[Formal, ...]


@functools.cache
def signature(op_type: str, domain: str, version: int) -> Signature | None:
    """The schema of `op_type` in `domain` that opset `version` of that domain imports, or None where onnx
    knows none (onnxruntime's com.microsoft operators, a model-local function): cached, for a model
    converts the same few operators many times."""
    try:
        schema = onnx.defs.get_schema(op_type, version, domain)
    except onnx.defs.SchemaError:
        return None
    constraints = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}

    def formal(p: onnx.defs.OpSchema.FormalParameter) -> Formal:
        allowed = frozenset(t for t in constraints.get(p.type_str, [p.type_str]) if t.startswith("tensor("))
        variadic = p.option == onnx.defs.OpSchema.FormalParameterOption.Variadic
        return Formal(p.name, p.type_str, allowed or None, variadic, p.is_homogeneous)

    operator = f"{domain + '.' if domain else ''}{op_type}-{schema.since_version}"
    return Signature(operator, tuple(map(formal, schema.inputs)), tuple(map(formal, schema.outputs)))


@functools.cache
def tensor_type(dtype: str) -> str | None:
    """The ONNX type string ("tensor(float)") of a value of numpy dtype or low-precision format `dtype`
    (ml_dtypes' name: "bfloat16", "float8_e4m3fn"), None if ONNX has no such element type."""
    try:
        np_dtype = np.dtype(getattr(ml_dtypes, dtype, None) or dtype)
        elem_type = onnx.helper.np_dtype_to_tensor_dtype(np_dtype)
    except (TypeError, KeyError, ValueError):
        return None
    return _elem_type_str(elem_type)


def _elem_type_str(elem_type: int) -> str | None:
    """ONNX's type string of a TensorProto element type (ONNX spells them lower-case), None if undefined."""
    if elem_type == onnx.TensorProto.UNDEFINED:
        return None
    try:
        return f"tensor({onnx.TensorProto.DataType.Name(elem_type).lower()})"
    except ValueError:
        return None


def declared_types(graph: onnx.GraphProto) -> dict[str, str]:
    """Value name -> type string of the graph's outputs and value_info that declare a tensor element type:
    what the model says a node's output is, checked with its inputs against the node's schema."""
    out = {}
    for vi in [*graph.value_info, *graph.output]:
        if vi.type.WhichOneof("value") == "tensor_type":
            t = _elem_type_str(vi.type.tensor_type.elem_type)
            if t is not None:
                out[vi.name] = t
    return out


def _arguments(formals: Sequence[Formal], names: Sequence[str]) -> list[tuple[int, Formal, str]]:
    """(position, formal, value name) of each argument given (an empty name is an omitted optional one);
    arguments past the last formal belong to it when it is variadic, else to none (checked elsewhere)."""
    out = []
    for i, name in enumerate(names):
        formal = formals[min(i, len(formals) - 1)] if formals else None
        if formal is None or (i >= len(formals) and not formal.variadic) or not name:
            continue
        out.append((i, formal, name))
    return out


def type_problem(
    proto: onnx.NodeProto,
    version: int | None,
    input_types: Mapping[str, str | None],
    output_types: Mapping[str, str],
) -> str | None:
    """Why node `proto`'s element types break its operator's schema (opset `version` of its domain), or
    None: each input and output whose type is known (`input_types`, `output_types`: value name -> type
    string) must be one its formal parameter allows, and the inputs of one type constraint must be one
    type (except a heterogeneous variadic's, each free, as Loop's carried values)."""
    domain = "" if proto.domain == "ai.onnx" else proto.domain
    sig = signature(proto.op_type, domain, version) if version is not None else None
    if sig is None:
        return None
    at = f"{sig.operator} (opset {version})"
    bound: dict[str, tuple[str, str]] = {}  # type constraint -> (its type, the argument that fixed it)
    for kind, formals, names, types in (
        ("input", sig.inputs, proto.input, input_types),
        ("output", sig.outputs, proto.output, output_types),
    ):
        for i, formal, name in _arguments(formals, names):
            t = types.get(name)
            if t is None or formal.allowed is None:
                continue
            what = f"{kind} {i} ({formal.name}, value {name})"
            if t not in formal.allowed:
                allowed = ", ".join(sorted(formal.allowed))
                fixed = formal.type_str.startswith("tensor(")  # a type itself, not a constraint's name
                by = at if fixed else f"type constraint {formal.type_str} of {at}"
                return f"{what} is {t}, which {by} does not allow (it allows {allowed})"
            # a declared output is not bound to the inputs' types: `input_shapes` may give an input another
            # dtype than the model's (float32 for float16), which the outputs follow, their declarations not
            if kind == "output" or (formal.variadic and not formal.homogeneous):
                continue
            first = bound.setdefault(formal.type_str, (t, what))
            if first[0] != t:
                return (
                    f"{what} is {t} but {first[1]} is {first[0]}: {at} takes one type for both "
                    f"(type constraint {formal.type_str})"
                )
    return None
