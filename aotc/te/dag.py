"""ComputeDAG: the ops of a subgraph in topological order, their access analysis and fingerprint."""

from __future__ import annotations

import hashlib
import json
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

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
    children,
    free_vars,
    is_float,
    unique_name,
    walk,
    walk_distinct,
)
from aotc.ir.simplify import affine
from aotc.te.tensor import CONST_INDEX_AXES, ComputeOp, Operation, PlaceholderOp, TEError

EXPENSIVE_CALLS = frozenset({"exp", "log", "tanh", "erf", "sigmoid"})
EXPENSIVE_CALLS |= {"sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh"}


def reads_at_own_axes(reader: ComputeOp, tensor: Operation) -> bool:
    """Every read of `tensor` in `reader` is at `reader`'s own axes: element-wise. An axis of extent 1 may
    also be read at constant 0, as broadcasting computes write it (a residual add's batch axis)."""
    for r in reads_of(reader):
        if r.tensor is not tensor:
            continue
        if len(r.indices) != len(reader.axes):
            return False
        for index, axis in zip(r.indices, reader.axes):
            at_axis = isinstance(index, Var) and index is axis.var
            at_zero = axis.extent == 1 and isinstance(index, Const) and index.value == 0
            if not (at_axis or at_zero):
                return False
    return True


def reads_of(op: Operation) -> list[TensorRead]:
    """Every tensor read in the body of `op`, in pre-order."""
    if not isinstance(op, ComputeOp):
        return []
    return [n for n in walk(op.body) if isinstance(n, TensorRead)]


_READ_TENSORS: weakref.WeakKeyDictionary[ComputeOp, tuple[Operation, ...]] = weakref.WeakKeyDictionary()


def read_tensors(op: ComputeOp) -> tuple[Operation, ...]:
    """The tensors `op`'s body reads, each once, in first-read order (cached per op: a search asks this
    of the same ops for every step it replays)."""
    got = _READ_TENSORS.get(op)
    if got is None:
        seen: dict[Operation, None] = {}
        for node in walk_distinct(op.body):
            if isinstance(node, TensorRead):
                seen.setdefault(node.tensor, None)
        got = _READ_TENSORS[op] = tuple(seen)
    return got


@dataclass(frozen=True)
class OpAnalysis:
    is_simple_access: bool
    is_strictly_inlineable: bool
    needs_multi_level_tiling: bool
    is_output: bool
    has_branch: bool
    has_expensive_op: bool


class ComputeDAG:
    """The ops reachable from `outputs`, producers before consumers."""

    def __init__(self, outputs: Sequence[Operation]):
        if not outputs:
            raise TEError("a ComputeDAG needs at least one output")
        self.outputs: tuple[Operation, ...] = tuple(outputs)
        self.ops: tuple[Operation, ...] = tuple(_topo_order(self.outputs))
        _make_names_unique(self.ops)
        self.index = {op: i for i, op in enumerate(self.ops)}
        self.producers: dict[Operation, list[Operation]] = {}
        self.consumers: dict[Operation, list[Operation]] = {op: [] for op in self.ops}
        for op in self.ops:
            prods: list[Operation] = []
            for r in reads_of(op):
                if r.tensor not in prods:
                    prods.append(r.tensor)
            self.producers[op] = prods
            for p in prods:
                self.consumers[p].append(op)
        self.analysis = {op: self._analyze(op) for op in self.ops}

    @property
    def placeholders(self) -> list[PlaceholderOp]:
        return [op for op in self.ops if isinstance(op, PlaceholderOp)]

    @property
    def compute_ops(self) -> list[ComputeOp]:
        return [op for op in self.ops if isinstance(op, ComputeOp)]

    @property
    def tensors(self) -> list[Operation]:
        """The kernel's arguments: placeholders, then outputs."""
        return [*self.placeholders, *self.outputs]

    @cached_property
    def flop_count(self) -> int:
        total = 0
        for op in self.compute_ops:
            points = 1
            for a in op.all_axes:
                points *= a.extent
            per_point = _count_flops(op.body.source if isinstance(op.body, Reduce) else op.body)
            if isinstance(op.body, Reduce):
                per_point += 1
            total += points * per_point
        return total

    def _analyze(self, op: Operation) -> OpAnalysis:
        is_output = not self.consumers[op] or op in self.outputs
        if not isinstance(op, ComputeOp):
            return OpAnalysis(True, False, False, is_output, False, False)
        reads = reads_of(op)
        axis_vars = [a.var for a in op.axes]
        simple = all(_is_simple_index(r, set(axis_vars)) for r in reads)
        has_branch = any(isinstance(n, Select) for n in walk(op.body))
        expensive = any(isinstance(n, Call) and n.name in EXPENSIVE_CALLS for n in walk(op.body))
        in_order = all(_is_in_order(r, axis_vars) for r in reads)
        # A compute with no reads but branches is a constant table: computed once into a buffer, never
        # re-evaluated per element of its consumer.
        inlineable = (
            not op.reduce_axes and not has_branch and (not reads or (simple and in_order and not expensive))
        )
        return OpAnalysis(
            is_simple_access=simple,
            is_strictly_inlineable=inlineable and not is_output,
            needs_multi_level_tiling=_needs_multi_level_tiling(op, reads),
            is_output=is_output,
            has_branch=has_branch,
            has_expensive_op=expensive,
        )

    def elementwise_match(self, op: Operation, target: Operation) -> bool:
        """True if `target` is reached from `op` through single consumers reading it element-wise."""
        cur = op
        while cur is not target:
            cons = self.consumers[cur]
            if len(cons) != 1:
                return False
            nxt = cons[0]
            if not isinstance(nxt, ComputeOp) or nxt.shape != cur.shape:
                return False
            if not reads_at_own_axes(nxt, cur):
                return False
            cur = nxt
        return True

    @cached_property
    def fingerprint(self) -> str:
        """sha256 of structure + shapes + dtypes; independent of tensor and axis names."""
        return hashlib.sha256(self.canonical_text().encode()).hexdigest()

    @property
    def workload_key(self) -> str:
        return self.fingerprint[:32]

    @cached_property
    def structure_key(self) -> str:
        """The first 32 hex digits of the sha256 of the DAG with its value constants left out: the same
        for workloads that differ only in the numbers they compute with (an int8 layer's zero points, clamp
        bounds and per-tensor scales; a float layer's epsilon), whose schedules replay on each other. A
        constant in an index, a bound or a condition on the loop variables stays in: it shapes the loops."""
        return hashlib.sha256(self.canonical_text(values=False).encode()).hexdigest()[:32]

    def canonical_text(self, values: bool = True) -> str:
        """The DAG as canonical JSON text; without `values`, value constants are written as their dtype."""
        entries = []
        for op in self.ops:
            if isinstance(op, PlaceholderOp):
                entries.append(["placeholder", list(op.shape), op.dtype, op.tag])
                continue
            var_ids = {a.var: f"v{i}" for i, a in enumerate(op.all_axes)}
            entries.append(
                [
                    "compute",
                    [a.extent for a in op.axes],
                    [a.extent for a in op.reduce_axes],
                    op.tag,
                    _canonical_expr(op.body, var_ids, self.index, None if values else True),
                    sorted((k, str(v)) for k, v in op.attrs.items()),
                ]
            )
        outputs = [self.index[o] for o in self.outputs]
        return json.dumps({"ops": entries, "outputs": outputs}, separators=(",", ":"))

    def __repr__(self) -> str:
        return f"ComputeDAG({', '.join(op.name for op in self.ops)})"


def _make_names_unique(ops: Sequence[Operation]) -> None:
    """Rename ops in place so names are distinct (stages are looked up by name; fingerprints ignore names)."""
    taken: set[str] = set()
    for op in ops:
        if op.name in taken:
            op.name = unique_name(op.name, taken)
        else:
            taken.add(op.name)


def _topo_order(outputs: Sequence[Operation]) -> list[Operation]:
    order: list[Operation] = []
    state: dict[Operation, int] = {}
    for out in outputs:
        stack: list[tuple[Operation, bool]] = [(out, False)]
        while stack:
            op, expanded = stack.pop()
            if expanded:
                if state.get(op) != 2:
                    state[op] = 2
                    order.append(op)
                continue
            if state.get(op) == 2:
                continue
            state[op] = 1
            stack.append((op, True))
            producers: list[Operation] = []
            for r in reads_of(op):
                if r.tensor not in producers:
                    producers.append(r.tensor)
            for p in reversed(producers):
                if state.get(p) == 1:
                    raise TEError(f"cycle through {p.name}")
                if state.get(p) != 2:
                    stack.append((p, False))
    return order


def _is_simple_index(r: TensorRead, axis_vars: set[Var]) -> bool:
    for idx in r.indices:
        if isinstance(idx, Const):
            continue
        form = affine(idx)
        if form is None:
            return False
        coeffs, _ = form
        if len(coeffs) != 1:
            return False
        ((var, coef),) = coeffs.items()
        if coef != 1 or var not in axis_vars:
            return False
    return True


def _is_in_order(r: TensorRead, axis_vars: list[Var]) -> bool:
    """Each index uses at most one axis, no axis twice, and axes appear in the op's order."""
    seen: list[int] = []
    for idx in r.indices:
        vs = free_vars(idx)
        if len(vs) > 1:
            return False
        for v in vs:
            if v not in axis_vars:
                return False
            seen.append(axis_vars.index(v))
    return seen == sorted(set(seen))


def _needs_multi_level_tiling(op: ComputeOp, reads: list[TensorRead]) -> bool:
    if op.attrs.get("no_multi_level_tiling") or op.attrs.get(CONST_INDEX_AXES):
        return False
    by_tensor: dict[Operation, set[Var]] = {}
    for r in reads:
        vs = by_tensor.setdefault(r.tensor, set())
        for idx in r.indices:
            vs |= free_vars(idx)
    axis_vars = {a.var for a in op.axes if a.extent > 1}
    n_missing = 0
    for vs in by_tensor.values():
        if not any(a.extent > 1 and a.var not in vs for a in op.axes):
            continue
        # An element-wise stage that broadcasts vectors (a bias, per-channel scales) along the other axes
        # reuses nothing worth tiling for: only operands indexed by two or more of its axes count.
        if op.reduce_axes or len(vs & axis_vars) >= 2:
            n_missing += 1
        if n_missing >= 2 or (n_missing >= 1 and op.reduce_axes):
            return True
    return False


def _count_flops(e: Expr) -> int:
    """Arithmetic on values (not on indices) at one point of the iteration space."""
    if isinstance(e, TensorRead):
        return 0
    own = 0
    if (
        isinstance(e, (Binary, Call, Compare))
        and (is_float(e.dtype) or isinstance(e, Call))
        or isinstance(e, Binary)
        and e.dtype != "int64"
    ):
        own = 1
    return own + sum(_count_flops(c) for c in children(e))


def _canonical_expr(
    e: Expr, var_ids: dict[Var, str], op_index: dict[Operation, int], value: bool | None = None
):
    """`e` as canonical JSON. `value` None writes every constant; True (a value is being computed) writes
    a constant as its dtype alone, unless the expression around it involves the loop variables outside
    tensor reads (an index, a bound, a condition), where `value` turns False for good."""

    def sub(c: Expr, v: bool | None = value):
        return _canonical_expr(c, var_ids, op_index, v)

    if isinstance(e, Var):
        return var_ids.get(e, "free")
    if isinstance(e, Const):
        return ["c", e.dtype] if value else ["c", e.dtype, e.value]
    index = None if value is None else False
    if isinstance(e, TensorRead):
        return ["read", op_index[e.tensor], [sub(i, index) for i in e.indices]]
    if isinstance(e, Reduce):
        return [
            "reduce",
            e.combiner,
            [var_ids[a.var] for a in e.axes],
            sub(e.source),
            None if e.condition is None else sub(e.condition, index),
        ]
    head: list = [type(e).__name__]
    if isinstance(e, (Binary, Compare, Logical)):
        head.append(e.op)
    elif isinstance(e, Call):
        head.append(e.name)
    elif isinstance(e, (Cast, Reinterpret)):
        head.append(e.dtype)
    if isinstance(e, Select):  # the condition is about the loops; the arms are values
        return head + [sub(e.cond, index), sub(e.true_value), sub(e.false_value)]
    if value and _uses_loop_vars(e):
        value = False
    return head + [sub(c, value) for c in children(e)]


def _uses_loop_vars(e: Expr) -> bool:
    """Whether a variable occurs in `e` outside the indices of its tensor reads."""
    if isinstance(e, Var):
        return True
    if isinstance(e, TensorRead):
        return False
    if isinstance(e, Reduce):
        return _uses_loop_vars(e.source)
    return any(_uses_loop_vars(c) for c in children(e))
