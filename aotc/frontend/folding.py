"""What both frontends do to the nodes they emit: fold constant subgraphs and drop dead nodes."""

from __future__ import annotations

import math

from aotc.graph.interpret import node_compute
from aotc.graph.ir import Node, Value
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


def live_nodes(nodes: list[Node], outputs: list[Value]) -> list[Node]:
    """The nodes that some graph output depends on, in their order."""
    live = set(outputs)
    keep = []
    for node in reversed(nodes):
        if any(v in live for v in node.outputs):
            keep.append(node)
            live.update(node.inputs)
    return keep[::-1]
