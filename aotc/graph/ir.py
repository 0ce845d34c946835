"""The graph IR: nodes of registered operators over statically typed values; weights are numpy constants."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: str

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(map(str, self.shape))}]"

    @property
    def num_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return self.num_elements * np.dtype(self.dtype).itemsize


@dataclass(frozen=True, eq=False)
class Derivation:
    """How a constant was computed at build time from a smaller one, so that a package may store the
    source and compute the constant again when it loads (docs/package.md#derived-weights). `kind`
    "winograd": the transformed weights U = G g G^T of the OIHW 3x3 weights `source` for Winograd tile
    `tile` (aotc.topi.winograd.transform_weight; int8 weights give the int16 integer transform)."""

    kind: str
    source: np.ndarray
    tile: int


@dataclass(eq=False)
class Value:
    """A tensor in the graph: a graph input, a node output, or a constant (`data` set; `derivation`
    says how it was computed from a smaller constant, where it was)."""

    name: str
    type: TensorType
    producer: Node | None = None
    data: np.ndarray | None = None
    derivation: Derivation | None = None

    @property
    def is_constant(self) -> bool:
        return self.data is not None

    def __repr__(self) -> str:
        kind = "const " if self.is_constant else ""
        return f"Value({kind}{self.name}: {self.type})"


@dataclass(eq=False)
class Node:
    """One operator application; `op` names an entry of `aotc.topi.registry`."""

    op: str
    inputs: list[Value]
    outputs: list[Value]
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str = ""

    def __repr__(self) -> str:
        ins = ", ".join(v.name for v in self.inputs)
        outs = ", ".join(v.name for v in self.outputs)
        return f"{outs} = {self.op}({ins}) {self.attrs or ''}".rstrip()


class GraphError(ValueError):
    pass


@dataclass(eq=False)
class Graph:
    """Nodes in topological order; `inputs` are the runtime inputs, `outputs` what the model returns."""

    inputs: list[Value]
    outputs: list[Value]
    nodes: list[Node]
    name: str = "model"
    elements: dict[str, str] = field(default_factory=dict)
    """Inputs and outputs of a low-precision or sub-byte element type (their dtype is its storage bits) ->
    its ml_dtypes name (aotc.topi.lowp.FORMATS): the package declares it at its boundary."""

    def constants(self) -> list[Value]:
        seen: dict[int, Value] = {}
        for node in self.nodes:
            for v in node.inputs:
                if v.is_constant:
                    seen.setdefault(id(v), v)
        for v in self.outputs:
            if v.is_constant:
                seen.setdefault(id(v), v)
        return list(seen.values())

    def consumers(self) -> dict[Value, list[Node]]:
        out: dict[Value, list[Node]] = {}
        for node in self.nodes:
            for v in node.inputs:
                out.setdefault(v, []).append(node)
        return out

    def verify(self) -> None:
        """Every node input is defined before use; raises GraphError naming the first problem."""
        defined = set(self.inputs)
        for node in self.nodes:
            for v in node.inputs:
                if not v.is_constant and v not in defined:
                    raise GraphError(
                        f"node {node.name or node.op}: input {v.name} is used before it is defined"
                    )
            for v in node.outputs:
                if v.producer is not node:
                    raise GraphError(f"node {node.name or node.op}: output {v.name} has another producer")
                defined.add(v)
        for v in self.outputs:
            if not v.is_constant and v not in defined:
                raise GraphError(f"graph output {v.name} is never produced")

    def __str__(self) -> str:
        lines = [f"graph {self.name}(" + ", ".join(f"{v.name}: {v.type}" for v in self.inputs) + "):"]
        for node in self.nodes:
            lines.append(f"  {node!r}")
        lines.append("  return " + ", ".join(v.name for v in self.outputs))
        return "\n".join(lines)


def toposort(nodes: Iterable[Node], inputs: Iterable[Value]) -> list[Node]:
    """Nodes ordered so that producers come first (stable for already-ordered input)."""
    nodes = list(nodes)
    ready = set(inputs)
    pending = list(nodes)
    order: list[Node] = []
    while pending:
        progressed = False
        rest = []
        for node in pending:
            if all(v.is_constant or v in ready for v in node.inputs):
                order.append(node)
                ready.update(node.outputs)
                progressed = True
            else:
                rest.append(node)
        if not progressed:
            raise GraphError(f"graph has a cycle or an undefined input at node {rest[0].name or rest[0].op}")
        pending = rest
    return order
