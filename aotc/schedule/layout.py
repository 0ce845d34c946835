"""Weight layout rewrite: constant inputs re-laid out to follow the tile structure
(docs/loop-ir.md#weight-layout-rewrite).

A placeholder tagged `LAYOUT_FREE` (a constant weight) that one anchor stage reads is given a new
shape with one dimension per tile loop of that stage, in the stage's loop order, so the innermost
loops read it contiguously. Each new dimension is a mixed-radix digit `(index // stride) % extent`
of one original dimension; the original data is padded with zeros where the splits overshoot. The
rewritten state lowers to a kernel that takes the weight as `WeightLayout.apply(weight)` returns it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from aotc import te
from aotc.ir.expr import (
    Const,
    Expr,
    TensorRead,
    Var,
    const,
    logical_and,
    minimum,
    select,
    transform,
    walk,
)
from aotc.schedule.state import ComputeAtKind, FuseRel, SplitRel, Stage, State, propagate_extents
from aotc.schedule.steps import replay
from aotc.te.dag import ComputeDAG
from aotc.te.tensor import LAYOUT_FREE, ComputeOp, Operation, PlaceholderOp


@dataclass(frozen=True)
class WeightLayout:
    """How the kernel's argument `arg` (a placeholder's position) is laid out.

    `dims[k] = (d, stride, extent)`: new dimension k holds digit `(i_d // stride) % extent` of index
    `i_d` of original dimension d. The digits of one original dimension are mixed-radix, so the
    layout is a pad + reshape + transpose of the original array.
    """

    arg: int
    shape: tuple[int, ...]
    dims: tuple[tuple[int, int, int], ...]

    @property
    def new_shape(self) -> tuple[int, ...]:
        return tuple(e for _, _, e in self.dims)

    def apply(self, array: np.ndarray) -> np.ndarray:
        """The original array in this layout: entry `k` holds `array[i]` with `i_d = sum of digit * stride`
        over the new dimensions of d, and zero where that lies past the array (the tiles overshoot)."""
        if tuple(array.shape) != self.shape:
            raise ValueError(f"weight layout for shape {list(self.shape)} applied to {list(array.shape)}")
        ndim = len(self.dims)
        index = [np.zeros((1,) * ndim, np.int64) for _ in self.shape]
        for k, (d, stride, extent) in enumerate(self.dims):
            shape = [1] * ndim
            shape[k] = extent
            index[d] = index[d] + (np.arange(extent, dtype=np.int64) * stride).reshape(shape)
        inside = np.ones((1,) * ndim, bool)
        flat = np.zeros((1,) * ndim, np.int64)
        for d, size in enumerate(self.shape):
            inside = inside & (index[d] < size)
            flat = flat * size + index[d]
        flat = np.broadcast_to(np.where(inside, flat, 0), self.new_shape)
        out = array.reshape(-1)[flat]
        if not inside.all():
            out = np.where(np.broadcast_to(inside, self.new_shape), out, np.zeros((), array.dtype))
        return np.ascontiguousarray(out)

    def compute(self, source: Operation, name: str) -> Operation:
        """`apply` as a loop stage: `source` (of this layout's original shape) in this layout, zero past
        its end, for code that re-lays a weight out when a package loads."""
        if tuple(source.shape) != self.shape:
            raise ValueError(f"weight layout for shape {list(self.shape)} applied to {list(source.shape)}")
        # the largest index each original dimension reaches: past its size, the tiles overshoot
        reach = [0] * len(self.shape)
        for d, stride, extent in self.dims:
            reach[d] += stride * (extent - 1)

        def body(*new: Expr) -> Expr:
            index: list[Expr] = [const(0, new[0].dtype)] * len(self.shape)
            for v, (d, stride, _) in zip(new, self.dims):
                index[d] = index[d] + (v if stride == 1 else v * stride)
            over = [d for d, size in enumerate(self.shape) if reach[d] >= size]
            # a select evaluates both sides: the read stays inside the array even where it is discarded
            read = source[
                tuple(
                    minimum(i, size - 1) if d in over else i
                    for d, (i, size) in enumerate(zip(index, self.shape))
                )
            ]
            if not over:
                return read
            inside = logical_and(*(index[d] < self.shape[d] for d in over))
            return select(inside, read, const(0, source.dtype))

        return te.compute(self.new_shape, body, name, tag="weight_layout")

    def to_json(self) -> dict:
        return {"arg": self.arg, "shape": list(self.shape), "dims": [list(d) for d in self.dims]}

    @staticmethod
    def from_json(obj: dict) -> WeightLayout:
        return WeightLayout(
            int(obj["arg"]), tuple(obj["shape"]), tuple(tuple(int(v) for v in d) for d in obj["dims"])
        )


def rewrite_layout(state: State) -> tuple[State, tuple[WeightLayout, ...]]:
    """The state on a DAG whose layout-free weights follow their reader's tiles, and the layouts.

    Weights that cannot be rewritten (read by several stages, through an inlined stage, or by a
    stage whose loops fuse across a split) keep their layout; a state with none returns unchanged.
    """
    dag = state.dag
    plans: dict[PlaceholderOp, tuple[WeightLayout, _Digits]] = {}
    for arg, p in enumerate(dag.placeholders):
        if p.tag != LAYOUT_FREE:
            continue
        plan = _plan(state, arg, p)
        if plan is not None and plan[0].dims != _identity_dims(p.shape):
            plans[p] = plan
    if not plans:
        return state, ()
    new_dag = _with_layouts(
        dag,
        {p: digits for p, (_, digits) in plans.items()},
        {p: lay.new_shape for p, (lay, _) in plans.items()},
    )
    return replay(new_dag, state.steps), tuple(layout for layout, _ in plans.values())


def apply_layouts(arrays: Sequence[np.ndarray], layouts: Sequence[WeightLayout]) -> list[np.ndarray]:
    """Kernel arguments in the rewritten layouts (the others unchanged)."""
    out = list(arrays)
    for layout in layouts:
        out[layout.arg] = layout.apply(out[layout.arg])
    return out


def _identity_dims(shape: tuple[int, ...]) -> tuple[tuple[int, int, int], ...]:
    return tuple((d, 1, e) for d, e in enumerate(shape))


_Digits = tuple[tuple[int, "_Digit"], ...]  # (original dimension, digit) per new dimension


@dataclass(frozen=True)
class _Digit:
    """One loop's share of a root iterator: value = sum over digits of digit * stride.

    `path` holds, per split from the root down to this loop, (inner stride in the parent, extent,
    parent extent, extent covered by all the split's children)."""

    root: int
    stride: int
    extent: int
    path: tuple[tuple[int, int, int, int], ...]

    def of(self, value: Expr) -> Expr:
        """This digit of the root's value."""
        if self.extent == 1:
            return Const(0, value.dtype)
        if all(parent == covered for _, _, parent, covered in self.path[1:]):
            size = self.path[0][2] if self.path else self.extent
            return _div_mod(value, self.stride, self.extent, size)
        for inner, extent, parent, _ in self.path:
            value = _div_mod(value, inner, extent, parent)
        return value


def _div_mod(value: Expr, stride: int, extent: int, size: int) -> Expr:
    value = value if stride == 1 else value // stride
    return value if stride * extent >= size else value % extent


def _plan(state: State, arg: int, p: PlaceholderOp) -> tuple[WeightLayout, _Digits] | None:
    dag = state.dag
    readers = [op for op in dag.compute_ops if p in dag.producers[op]]
    if len(readers) != 1 or not readers[0].reduce_axes:
        return None
    reader = readers[0]
    reads = [r for r in walk(reader.body) if isinstance(r, TensorRead) and r.tensor is p]
    if len(reads) != 1:
        return None
    stages = [
        st
        for st in state.stages
        if isinstance(st.op, ComputeOp)
        and any(isinstance(r, TensorRead) and r.tensor is p for r in walk(st.op.body))
    ]
    if len(stages) != 1 or stages[0].compute_at == ComputeAtKind.INLINED:
        return None
    stage = stages[0]
    if stage.op.name not in (reader.name, f"{reader.name}.local", f"{reader.name}.global"):
        return None
    root_of = {a.var: k for k, a in enumerate(reader.all_axes)}
    dim_of_root: dict[int, int] = {}
    for d, idx in enumerate(reads[0].indices):
        if isinstance(idx, Var) and idx in root_of and root_of[idx] not in dim_of_root:
            dim_of_root[root_of[idx]] = d
    digits = _leaf_digits(stage)
    if digits is None:
        return None
    tiled = set(dim_of_root.values())
    chosen = [(d, _Digit(-1, 1, e, ())) for d, e in enumerate(p.shape) if d not in tiled and e > 1]
    for leaf_digits in digits:
        chosen.extend((dim_of_root[g.root], g) for g in leaf_digits if g.root in dim_of_root and g.extent > 1)
    for d in tiled:
        if not any(dd == d for dd, _ in chosen):
            chosen.append((d, _Digit(-1, 1, 1, ())))
    dims = tuple((d, g.stride, g.extent) for d, g in chosen)
    return WeightLayout(arg, p.shape, dims), tuple(chosen)


def _leaf_digits(stage: Stage) -> list[list[_Digit]] | None:
    """Per leaf iterator (loop order), the digits of root values it carries; None past a split of a fuse."""
    roots = {uid: ext for uid, _, ext, _ in stage.root_iters}
    extents = propagate_extents(stage, roots)
    digits: dict[int, list[_Digit]] = {uid: [_Digit(uid, 1, ext, ())] for uid, ext in roots.items()}
    for rel in stage.relations:
        if isinstance(rel, SplitRel):
            parent = digits[rel.parent]
            child_ext = [extents[c] for c in rel.children]
            if len(parent) != 1 or any(e is None for e in child_ext):
                return None
            covered = math.prod(child_ext)  # type: ignore[arg-type]
            inner = 1
            for c, e in zip(reversed(rel.children), reversed(child_ext)):
                step = (inner, e, parent[0].extent, covered)
                digits[c] = [_Digit(parent[0].root, parent[0].stride * inner, e, (*parent[0].path, step))]  # type: ignore[arg-type]
                inner *= e  # type: ignore[operator]
        elif isinstance(rel, FuseRel):
            digits[rel.child] = [d for parent in rel.parents for d in digits[parent]]
    return [digits[it.uid] for it in stage.iters]


def _with_layouts(
    dag: ComputeDAG, digits: dict[PlaceholderOp, _Digits], shapes: dict[PlaceholderOp, tuple[int, ...]]
) -> ComputeDAG:
    """A copy of the DAG whose reads of each rewritten placeholder index its digits."""
    new_ops: dict[Operation, Operation] = {}
    for op in dag.ops:
        if isinstance(op, PlaceholderOp):
            new_ops[op] = (
                op
                if op not in shapes
                else PlaceholderOp(op.name, shapes[op], op.dtype, op.tag, dict(op.attrs))
            )
            continue
        assert isinstance(op, ComputeOp)
        body = _rewrite_reads(op.body, new_ops, digits)
        new_ops[op] = ComputeOp(op.name, op.axes, op.reduce_axes, body, op.tag, dict(op.attrs))
    return ComputeDAG([new_ops[o] for o in dag.outputs])


def _rewrite_reads(
    e: Expr, new_ops: dict[Operation, Operation], digits: dict[PlaceholderOp, _Digits]
) -> Expr:
    """`e` reading the new ops (weights by their new digits); a shared read is rewritten once."""

    def reread(node: Expr) -> Expr | None:
        if not isinstance(node, TensorRead):
            return None
        idx = node.indices
        own = digits.get(node.tensor) if isinstance(node.tensor, PlaceholderOp) else None
        if own is not None:
            idx = tuple(g.of(idx[d]) for d, g in own)
        return TensorRead(new_ops[node.tensor], idx)

    return transform(e, reread)
