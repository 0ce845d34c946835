"""What both frontends do to the nodes they emit: fold constant subgraphs and drop dead nodes."""

from __future__ import annotations

import math

import numpy as np

from aotc.graph.interpret import evaluate_node, infer_types, node_compute
from aotc.graph.ir import Node, TensorType, Value
from aotc.te.dag import ComputeDAG

FOLD_LIMIT = 1 << 25
"""Index-grid points above which an all-constant node is left in the graph rather than evaluated here
(the reference interpreter materializes the grid, reduce axes included)."""


def foldable(node: Node) -> bool:
    """All inputs are constants and evaluating the node here is cheap enough."""
    if not all(v.is_constant for v in node.inputs):
        return False
    _, outs = node_compute(node)
    points = sum(math.prod(a.extent for a in op.all_axes) for op in ComputeDAG(outs).compute_ops)
    return points <= FOLD_LIMIT


def typed_node(
    op: str, inputs: list[Value], attrs: dict | None
) -> tuple[Node, TensorType, np.ndarray | None]:
    """A node of graph op `op`, its output type, and its value where it folds to a constant.

    Raises ValueError naming the op and its input types when the op rejects them.
    """
    node = Node(op, list(inputs), [], dict(attrs or {}))
    try:
        (ttype,) = infer_types(node)
        data = evaluate_node(node, [v.data for v in inputs]) if foldable(node) else None
    except (ValueError, TypeError, KeyError, IndexError) as e:
        raise ValueError(f"cannot build graph op {op} on {[str(v.type) for v in inputs]}: {e}") from e
    return node, ttype, None if data is None else data[0]


def live_nodes(nodes: list[Node], outputs: list[Value]) -> list[Node]:
    """The nodes that some graph output depends on, in their order."""
    live = set(outputs)
    keep = []
    for node in reversed(nodes):
        if any(v in live for v in node.outputs):
            keep.append(node)
            live.update(node.inputs)
    return keep[::-1]
