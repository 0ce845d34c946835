"""Fuse a graph into subgraphs the way Relay's FuseOps does, and make tasks of them
(docs/README.md#partitioning-into-tasks).

Rules, over the registry's op patterns:
- an anchor (OUT_ELEMWISE_FUSABLE: conv, matmul, pool) absorbs the element-wise/broadcast consumers
  that follow it; a reduction absorbs element-wise/broadcast consumers too;
- element-wise/broadcast/injective ops fuse along injective chains;
- element-wise/broadcast ops that read only an anchor's (or reduction's) output, through several paths
  that meet again (GELU's x * 0.5 * (1 + erf(x / sqrt 2))), fuse into it as its consumers, as Relay's
  post-dominator rule fuses them;
- a subgraph of element-wise/injective ops whose only consumer is an anchor fuses into it;
- a value read by two subgraphs, or returned by the model, is never internal to one;
- no subgraph holds two anchors or two reductions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from aotc.graph.ir import Graph, Node, Value
from aotc.ir.expr import const
from aotc.te.dag import ComputeDAG
from aotc.te.tensor import LAYOUT_FREE, Operation, compute, placeholder
from aotc.topi.registry import OpPattern, get_op

MAX_GROUP_NODES = 256


@dataclass(eq=False)
class FusedGroup:
    """Nodes (topologically ordered) that become one kernel."""

    nodes: list[Node]
    master: OpPattern
    inputs: list[Value] = field(default_factory=list)
    outputs: list[Value] = field(default_factory=list)

    @property
    def name(self) -> str:
        return "_".join(dict.fromkeys(n.op for n in self.nodes))[:60]


@dataclass(eq=False)
class Task:
    """One distinct fused subgraph of a model: its DAG, workload key, and how often the model runs it."""

    dag: ComputeDAG
    workload_key: str
    weight: int
    name: str
    groups: list[FusedGroup] = field(default_factory=list)


def _combined(a: OpPattern, b: OpPattern) -> OpPattern:
    return max(a, b)


def partition(graph: Graph) -> list[FusedGroup]:
    """The graph's nodes grouped into fused subgraphs, in execution order."""
    consumers = graph.consumers()
    outputs = set(graph.outputs)
    group_of: dict[Node, FusedGroup] = {}
    groups: list[FusedGroup] = []

    def single_use(v: Value) -> bool:
        return v not in outputs and len(consumers.get(v, [])) == 1

    def anchors(g: FusedGroup) -> int:
        return sum(get_op(n.op).pattern >= OpPattern.COMM_REDUCE for n in g.nodes)

    def diamond_source(g: FusedGroup) -> FusedGroup | None:
        return _diamond_source(g, group_of, consumers, outputs)

    for node in graph.nodes:
        pattern = get_op(node.op).pattern
        target: FusedGroup | None = None
        if pattern <= OpPattern.INJECTIVE:
            for v in node.inputs:
                if v.producer is None or not single_use(v):
                    continue
                g = group_of[v.producer]
                if len(g.nodes) >= MAX_GROUP_NODES:
                    continue
                if g.master >= OpPattern.COMM_REDUCE and pattern > OpPattern.BROADCAST:
                    continue
                if v.producer is not g.nodes[-1] and g.master >= OpPattern.COMM_REDUCE:
                    continue
                if _would_cycle([*g.nodes, node], consumers):
                    continue
                target = g
                break
        if target is None:
            target = FusedGroup([], pattern)
            groups.append(target)
        target.nodes.append(node)
        target.master = _combined(target.master, pattern)
        group_of[node] = target
        _merge_injective_producers(
            node, target, group_of, groups, single_use, anchors, diamond_source, consumers
        )
    _fuse_consumer_diamonds(groups, diamond_source, group_of)
    _fuse_producers_into_anchors(groups, group_of, single_use, anchors, consumers)
    for g in groups:
        _set_interface(g, consumers, outputs)
    return _order_groups(groups, group_of)


def _merge_injective_producers(
    node, target, group_of, groups, single_use, anchors, diamond_source, consumers
) -> None:
    """Other single-use producer groups of `node` join `target` while it keeps at most one anchor (and
    none that is rather the consumers of another anchor's output)."""
    for v in node.inputs:
        if v.producer is None or not single_use(v):
            continue
        g = group_of[v.producer]
        if g is target or g.master > OpPattern.INJECTIVE and target.master > OpPattern.INJECTIVE:
            continue
        if g.master > OpPattern.INJECTIVE and get_op(node.op).pattern > OpPattern.BROADCAST:
            continue
        if anchors(g) + anchors(target) > 1 or len(g.nodes) + len(target.nodes) > MAX_GROUP_NODES:
            continue
        if anchors(target) and diamond_source(g) is not None:
            continue
        if _would_cycle(g.nodes + target.nodes, consumers):
            continue
        _absorb(target, g, group_of, groups)


def _diamond_source(g: FusedGroup, group_of, consumers, outputs) -> FusedGroup | None:
    """The anchor or reduction group that element-wise/broadcast group `g` can join as its consumers:
    every outside input of `g` is that group's last value and read by nothing but `g`. The main pass
    fuses only single-use chains, so a value read twice (GELU reads x twice) starts a group of its own,
    which would otherwise fuse into the next anchor as a producer: an expensive op (erf) recomputed per
    tile of that anchor instead of once per element of this one's output."""
    if g.master > OpPattern.BROADCAST:
        return None
    members = set(g.nodes)
    outside = {v for n in g.nodes for v in n.inputs if v.producer is not None and v.producer not in members}
    sources = {group_of[v.producer] for v in outside}
    if len(sources) != 1:
        return None
    (anchor,) = sources
    if not OpPattern.COMM_REDUCE <= anchor.master <= OpPattern.OUT_ELEMWISE_FUSABLE:
        return None
    if any(v.producer is not anchor.nodes[-1] or v in outputs for v in outside):
        return None
    if any(c not in members for v in outside for c in consumers.get(v, [])):
        return None
    if len(anchor.nodes) + len(g.nodes) > MAX_GROUP_NODES or _would_cycle(anchor.nodes + g.nodes, consumers):
        return None
    return anchor


def _fuse_consumer_diamonds(groups, diamond_source, group_of) -> None:
    """Element-wise groups that an anchor's output feeds through several paths join that anchor."""
    for g in list(groups):
        anchor = diamond_source(g) if g in groups else None
        if anchor is not None:
            _absorb(anchor, g, group_of, groups)


def _fuse_producers_into_anchors(groups, group_of, single_use, anchors, consumers) -> None:
    """An injective-only group whose one output feeds only an anchor group moves into that group."""
    changed = True
    while changed:
        changed = False
        for g in list(groups):
            if g.master > OpPattern.INJECTIVE:
                continue
            produced = [v for n in g.nodes for v in n.outputs]
            leaving = [v for v in produced if not all(c in g.nodes for c in _readers(v, groups))]
            if len(leaving) != 1 or not single_use(leaving[0]):
                continue
            (reader,) = _readers(leaving[0], groups)
            cg = group_of[reader]
            if cg.master != OpPattern.OUT_ELEMWISE_FUSABLE or anchors(cg) != 1:
                continue
            if _would_cycle(g.nodes + cg.nodes, consumers):
                continue
            _absorb(cg, g, group_of, groups, before=True)
            changed = True


def _would_cycle(nodes: list[Node], consumers: dict[Value, list[Node]]) -> bool:
    """True if some path leaves `nodes` and comes back into them (fusing them would deadlock)."""
    inside = set(nodes)
    stack = [c for n in nodes for v in n.outputs for c in consumers.get(v, []) if c not in inside]
    seen: set[Node] = set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        for v in n.outputs:
            for c in consumers.get(v, []):
                if c in inside:
                    return True
                stack.append(c)
    return False


def _readers(v: Value, groups: list[FusedGroup]) -> list[Node]:
    return [n for g in groups for n in g.nodes if v in n.inputs]


def _order_groups(groups: list[FusedGroup], group_of: dict[Node, FusedGroup]) -> list[FusedGroup]:
    """Groups in an order where every group runs after the groups it reads from."""
    order: list[FusedGroup] = []
    done: set[FusedGroup] = set()

    def visit(g: FusedGroup) -> None:
        if g in done:
            return
        done.add(g)
        for v in g.inputs:
            if v.producer is not None:
                visit(group_of[v.producer])
        order.append(g)

    for g in groups:
        visit(g)
    return order


def _absorb(into: FusedGroup, other: FusedGroup, group_of, groups, before: bool = False) -> None:
    """Move `other`'s nodes into `into`, keeping a topological order."""
    nodes = other.nodes + into.nodes if before else into.nodes + other.nodes
    into.nodes = _topo(nodes)
    into.master = _combined(into.master, other.master)
    for n in other.nodes:
        group_of[n] = into
    groups.remove(other)


def _topo(nodes: list[Node]) -> list[Node]:
    inside = set(nodes)
    done: set[Node] = set()
    order: list[Node] = []

    def visit(n: Node) -> None:
        if n in done:
            return
        done.add(n)
        for v in n.inputs:
            if v.producer in inside:
                visit(v.producer)
        order.append(n)

    for n in nodes:
        visit(n)
    return order


def _set_interface(g: FusedGroup, consumers: dict[Value, list[Node]], outputs: set[Value]) -> None:
    inside = set(g.nodes)
    produced = {v for n in g.nodes for v in n.outputs}
    ins: list[Value] = []
    for n in g.nodes:
        for v in n.inputs:
            if v not in produced and v not in ins:
                ins.append(v)
    outs = [
        v
        for n in g.nodes
        for v in n.outputs
        if v in outputs or any(c not in inside for c in consumers.get(v, []))
    ]
    g.inputs, g.outputs = ins, outs


def group_dag(group: FusedGroup) -> tuple[ComputeDAG, list[Value], list[Value]]:
    """The group's tensor-expression DAG, with the values bound to its placeholders (in the DAG's order) and outputs.

    Constant inputs of one element become immediate values, not kernel arguments.
    """
    env: dict[Value, Operation] = {}
    args: list[Value] = []
    for i, v in enumerate(group.inputs):
        if v.is_constant and v.type.num_elements == 1:
            env[v] = _scalar_tensor(v, i)
            continue
        env[v] = placeholder(
            v.type.shape, v.type.dtype, name=f"p{i}", tag=LAYOUT_FREE if v.is_constant else ""
        )
        args.append(v)
    for node in group.nodes:
        outs = get_op(node.op).compute([env[v] for v in node.inputs], node.attrs)
        for v, op in zip(node.outputs, outs):
            env[v] = op
    dag = ComputeDAG([env[v] for v in group.outputs])
    by_op = {env[v]: v for v in args}
    return dag, [by_op[p] for p in dag.placeholders], list(group.outputs)


def _scalar_tensor(v: Value, i: int) -> Operation:
    value = np.asarray(v.data).reshape(-1)[0].item()
    return compute(v.type.shape, lambda *_: const(value, v.type.dtype), name=f"c{i}", tag="constant")


def extract_tasks(groups: list[FusedGroup]) -> list[Task]:
    """Distinct subgraphs by workload key, each weighted by how many groups share it."""
    by_key: dict[str, Task] = {}
    for g in groups:
        dag, _, _ = group_dag(g)
        key = dag.workload_key
        task = by_key.get(key)
        if task is None:
            by_key[key] = Task(dag, key, 1, g.name, [g])
        else:
            task.weight += 1
            task.groups.append(g)
    return list(by_key.values())


def describe_tasks(tasks: list[Task]) -> str:
    rows = [f"{'task':<40} {'weight':>6} {'GFLOP':>8}"]
    for t in tasks:
        rows.append(f"{t.name:<40} {t.weight:>6} {t.dag.flop_count / 1e9 * t.weight:>8.3f}")
    return "\n".join(rows)
