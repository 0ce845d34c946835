"""Run a Graph node by node with the numpy reference of each operator's tensor expression.

Slow but exact: it is the oracle for frontends and passes, and the evaluator of constant folding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from aotc.graph.ir import Graph, GraphError, Node, TensorType, Value
from aotc.te.dag import ComputeDAG
from aotc.te.reference import evaluate
from aotc.te.tensor import Operation, placeholder
from aotc.topi.registry import get_op


def node_compute(
    node: Node, types: Sequence[TensorType] | None = None
) -> tuple[list[Operation], list[Operation]]:
    """Placeholders for the node's inputs and the TE ops of its outputs."""
    types = types or [v.type for v in node.inputs]
    inputs = [placeholder(t.shape, t.dtype, name=f"in{i}") for i, t in enumerate(types)]
    outs = get_op(node.op).compute(inputs, node.attrs)
    if node.outputs and len(outs) != len(node.outputs):
        raise GraphError(
            f"node {node.name or node.op}: operator {node.op} gave {len(outs)} outputs, expected {len(node.outputs)}"
        )
    return inputs, outs


def infer_types(node: Node) -> list[TensorType]:
    """Output types of `node` from its input types, by building its tensor expression."""
    _, outs = node_compute(node)
    return [TensorType(tuple(o.shape), o.dtype) for o in outs]


def evaluate_node(node: Node, values: Sequence[np.ndarray]) -> list[np.ndarray]:
    placeholders, outs = node_compute(node, [TensorType(tuple(v.shape), str(v.dtype)) for v in values])
    dag = ComputeDAG(outs)
    feed = {p.name: v for p, v in zip(placeholders, values) if p in dag.ops}
    results = evaluate(dag, feed)
    by_op = dict(zip(dag.outputs, results))
    return [by_op[o] for o in outs]


def run_graph(graph: Graph, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    env: dict[Value, np.ndarray] = {}
    for v in graph.inputs:
        if v.name not in inputs:
            raise KeyError(f"missing input {v.name!r}")
        env[v] = np.asarray(inputs[v.name], dtype=v.type.dtype).reshape(v.type.shape)
    for node in graph.nodes:
        args = [v.data if v.is_constant else env[v] for v in node.inputs]
        for v, out in zip(node.outputs, evaluate_node(node, args)):
            env[v] = out
    return {v.name: (v.data if v.is_constant else env[v]) for v in graph.outputs}
