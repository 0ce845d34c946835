"""Lowering a candidate for the search: the per-DAG lowering cache, codegen's legality check
(`loop_error`) and the state key (`state_key`: sha1 of the lowered loop text), which dedups candidates.

Two step histories that lower to the same loops are one candidate: sampling, evolution and the measured
set all compare states by `state_key`. The feature extractor reads its programs from the same cache.
"""

from __future__ import annotations

import hashlib
import weakref
from collections import OrderedDict
from collections.abc import Iterable

from aotc.ir.dot import dot_forms, match_dot, tensorized_dot
from aotc.ir.expr import free_vars
from aotc.ir.printer import func_str
from aotc.ir.stmt import (
    MAX_VECTOR_LANES,
    Allocate,
    For,
    ForKind,
    IfThenElse,
    LetStmt,
    PrimFunc,
    Seq,
    Stmt,
    walk_stmts,
)
from aotc.schedule.lower import lower
from aotc.schedule.state import ScheduleError, State
from aotc.search.sketch import is_complete
from aotc.target import Target
from aotc.te.dag import ComputeDAG

__all__ = [
    "DistinctStates",
    "bind_target",
    "bound_target",
    "is_valid",
    "knows_key",
    "loop_error",
    "lowered",
    "prune_invalid",
    "remember_key",
    "state_key",
]


def loop_error(func: PrimFunc, target: Target | None = None) -> str | None:
    """Why codegen would reject the loop program, or None: on a CPU nested parallel or bad vector loops;
    on a GPU (a program with thread bindings) what the GPU emitter refuses, past `target`'s limits too."""
    if any(isinstance(s, For) and s.kind == ForKind.THREAD_BINDING for s in walk_stmts(func.body)):
        if target is not None and not target.is_gpu:
            return f"thread bindings in a program for {target}"
        from aotc.codegen.gpu import GPUCodegenError, emit_gpu

        try:
            emit_gpu(func, target)
        except GPUCodegenError as err:
            return str(err)
        return None
    return _loop_error(func.body, None, False, target)


def _tensorize_error(s: For, vec: For | None, target: Target | None) -> str | None:
    if vec is None or vec.body is not s:
        return f"tensorized loop {s.var.name} is not the body of a vectorized loop"
    if target is None:  # the pattern only; the forms are the target's
        dot = match_dot(s, vec.var)
        return dot if isinstance(dot, str) else None
    found = tensorized_dot(s, vec.var, vec.max_extent, dot_forms(target))
    return found if isinstance(found, str) else None


def bind_target(dag: ComputeDAG, target: Target) -> None:
    """The target whose limits `lowered`, `state_key` and `is_valid` check `dag`'s programs against (a GPU's
    thread limits, a CPU's dot-product instructions)."""
    _cache_of(dag).target = target


def bound_target(dag: ComputeDAG) -> Target | None:
    """The target `bind_target` gave `dag` (None: none yet)."""
    return _cache_of(dag).target


def _loop_error(s: Stmt, vec: For | None, par: bool, target: Target | None) -> str | None:
    if isinstance(s, For):
        if s.kind == ForKind.THREAD_BINDING:
            return f"thread binding {s.thread_tag} on a CPU"
        if s.kind == ForKind.PARALLEL:
            if vec is not None:
                return f"parallel loop {s.var.name} inside vectorized loop {vec.var.name}"
            if par:
                return f"nested parallel loop {s.var.name}"
            return _loop_error(s.body, vec, True, target)
        if vec is not None and vec.var in free_vars(s.extent):
            return f"extent of {s.var.name} varies across the lanes of {vec.var.name}"
        if s.kind == ForKind.TENSORIZED:
            return _tensorize_error(s, vec, target)
        if s.kind == ForKind.VECTORIZED and s.max_extent > 1:
            if vec is not None:
                return f"vectorized loop {s.var.name} inside vectorized loop {vec.var.name}"
            if s.max_extent > MAX_VECTOR_LANES:
                return f"vectorized loop {s.var.name} has {s.max_extent} lanes"
            return _loop_error(s.body, s, par, target)
        return _loop_error(s.body, vec, par, target)
    if isinstance(s, Allocate):
        if vec is not None:
            return f"allocation of {s.buffer.name} inside vectorized loop {vec.var.name}"
        return _loop_error(s.body, vec, par, target)
    if isinstance(s, Seq):
        for c in s.stmts:
            err = _loop_error(c, vec, par, target)
            if err:
                return err
        return None
    if isinstance(s, IfThenElse):
        return _loop_error(s.then_case, vec, par, target) or (
            _loop_error(s.else_case, vec, par, target) if s.else_case is not None else None
        )
    if isinstance(s, LetStmt):
        return _loop_error(s.body, vec, par, target)
    return None


class _Cache:
    """Per-DAG caches keyed by a state's steps: dedup keys (bounded) and recent lowered functions."""

    def __init__(self, max_keys: int = 200_000, max_funcs: int = 2048):
        self.keys: dict = {}
        self.funcs: OrderedDict = OrderedDict()
        self.max_keys = max_keys
        self.max_funcs = max_funcs
        self.target: Target | None = None


_MISSING = object()
_CACHES: weakref.WeakKeyDictionary[ComputeDAG, _Cache] = weakref.WeakKeyDictionary()


def _cache(state: State) -> _Cache:
    return _cache_of(state.dag)


def _cache_of(dag: ComputeDAG) -> _Cache:
    c = _CACHES.get(dag)
    if c is None:
        c = _CACHES[dag] = _Cache()
    return c


def lowered(state: State) -> PrimFunc | None:
    """`lower(state)` if it is a valid program for codegen, else None; recent results are cached."""
    cache = _cache(state)
    steps = state.steps
    func = cache.funcs.get(steps)
    if func is not None:
        cache.funcs.move_to_end(steps)
        return func
    if cache.keys.get(steps, _MISSING) is None:
        return None
    func = _lower_valid(state, cache.target)
    _remember_key(cache, steps, None if func is None else _digest(func))
    if func is not None:
        cache.funcs[steps] = func
        if len(cache.funcs) > cache.max_funcs:
            cache.funcs.popitem(last=False)
    return func


def _lower_valid(state: State, target: Target | None) -> PrimFunc | None:
    if not is_complete(state):
        return None
    try:
        func = lower(state, "kernel")
    except ScheduleError:
        return None
    return None if loop_error(func, target) else func


def _digest(func: PrimFunc) -> str:
    return hashlib.sha1(func_str(func).encode()).hexdigest()


def _remember_key(cache: _Cache, steps, key: str | None) -> None:
    if len(cache.keys) >= cache.max_keys:
        cache.keys.clear()
    cache.keys[steps] = key


def state_key(state: State) -> str | None:
    """Dedup key: sha1 of the lowered loop text (`func_str(lower(state))`); None for an invalid state.

    Two step histories that lower to the same loops share a key. Cached per DAG by the steps.
    """
    cache = _cache(state)
    key = cache.keys.get(state.steps, _MISSING)
    if key is not _MISSING:
        return key  # type: ignore[return-value]
    func = lowered(state)
    return None if func is None else cache.keys[state.steps]


def knows_key(state: State) -> bool:
    """Whether `state_key(state)` is cached (it then lowers nothing)."""
    return state.steps in _cache(state).keys


def remember_key(state: State, key: str | None) -> None:
    """Cache `state_key(state)` computed elsewhere: a worker process that lowered the same steps."""
    _remember_key(_cache(state), state.steps, key)


def is_valid(state: State) -> bool:
    return state_key(state) is not None


def prune_invalid(states: list[State]) -> list[State]:
    """Drop sketches and states that fail to lower or that codegen would reject."""
    return [s for s in states if is_valid(s)]


class DistinctStates:
    """Valid states with distinct `state_key`s, in the order kept; keys in `exclude` count as seen."""

    def __init__(self, exclude: Iterable[str] = ()):
        self.states: list[State] = []
        self.keys: set[str] = set(exclude)

    def __len__(self) -> int:
        return len(self.states)

    def add(self, state: State | None) -> bool:
        """Keep `state` if it is a valid program not seen yet; True if it was kept."""
        if state is None:
            return False
        key = state_key(state)
        if key is None or key in self.keys:
            return False
        self.keys.add(key)
        self.states.append(state)
        return True
