"""Lowering and featurizing a search's candidates in worker processes.

A search round lowers every candidate it breeds or samples (its `state_key` decides validity and
duplicates) and extracts the features of the valid ones for the cost model: on a Winograd conv about 1200
programs and 45 s a round, all in the tuner's process while its builders wait. `prefetch` hands a batch of
states to `workers` processes, which replay their steps, lower them and extract their features, and stores
the keys and features in the caches that `state_key` and `state_features` read. The search then runs as
it would without workers and gives the same candidates; a state a worker could not do (an error, or a
pool that died) is simply done again here, where any error is raised as before.

Workers start with the "spawn" method (like the builders), once per process, die with it (however it
ends), and keep the last few DAGs they were sent. A DAG goes to them pickled, as multiprocessing sends
any argument: between this process and its own children only, never to a file.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from aotc.schedule.state import State
from aotc.schedule.steps import replay, steps_from_json, steps_to_json
from aotc.search.features import remember_features, state_features
from aotc.search.lowering import bind_target, bound_target, knows_key, remember_key, state_key
from aotc.search.workers import die_with_parent
from aotc.te.dag import ComputeDAG

__all__ = ["MIN_BATCH", "prefetch", "shutdown"]

MIN_BATCH = 16  # fewer states than this are lowered here: shipping them costs about what it saves
CHUNKS_PER_WORKER = 4  # a batch's chunks per worker, so that a slow chunk does not hold up the others
KEPT_DAGS = 8

_pool: ProcessPoolExecutor | None = None
_pool_workers = 0
_payloads: weakref.WeakKeyDictionary[ComputeDAG, tuple[str, bytes]] = weakref.WeakKeyDictionary()
_dags: OrderedDict[str, ComputeDAG] = OrderedDict()  # in a worker: the DAGs it was sent, by key


def prefetch(states: Sequence[State | None], workers: int) -> None:
    """Lower the states not lowered yet, and extract the features of the valid ones, in `workers`
    processes (nothing with fewer than two, or fewer than `MIN_BATCH` such states)."""
    if workers < 2:
        return
    todo: dict[tuple, State] = {}
    for s in states:
        if s is not None and s.steps not in todo and not knows_key(s):
            todo[s.steps] = s
    batch = list(todo.values())
    if len(batch) < MIN_BATCH or any(s.dag is not batch[0].dag for s in batch):
        return
    key, payload = _payload(batch[0].dag)
    n = min(len(batch), workers * CHUNKS_PER_WORKER)
    chunks = [batch[i::n] for i in range(n)]
    try:
        pool = _start(workers)
        futures = [pool.submit(_evaluate, key, payload, [steps_to_json(s.steps) for s in c]) for c in chunks]
        answers = [f.result() for f in futures]
    except Exception:  # noqa: BLE001 - no pool, or a dead one: this process lowers them, as without one
        shutdown()
        return
    for chunk, answer in zip(chunks, answers):
        for state, result in zip(chunk, answer):
            if result is None:
                continue
            state_key_, feats = result
            remember_key(state, state_key_)
            if feats is not None:
                remember_features(state, feats)


def shutdown() -> None:
    """Stop the worker processes (the next `prefetch` starts new ones)."""
    global _pool, _pool_workers
    if _pool is not None:
        _pool.shutdown(wait=False, cancel_futures=True)
    _pool, _pool_workers = None, 0


def _start(workers: int) -> ProcessPoolExecutor:
    global _pool, _pool_workers
    if _pool is None or _pool_workers != workers:
        shutdown()
        # a parent that ends without exit handlers (killed, os._exit) would leave the workers waiting
        _pool = ProcessPoolExecutor(
            max_workers=workers, mp_context=mp.get_context("spawn"), initializer=die_with_parent
        )
        _pool_workers = workers
    return _pool


def _payload(dag: ComputeDAG) -> tuple[str, bytes]:
    """The DAG and its bound target as the workers receive them, made once per DAG."""
    target = bound_target(dag)
    key = f"{dag.fingerprint}/{target}/{id(dag)}"
    got = _payloads.get(dag)
    if got is None or got[0] != key:
        got = _payloads[dag] = (key, pickle.dumps((dag, target)))
    return got


# ---- in the worker processes -----------------------------------------------------------------------


def _evaluate(
    key: str, payload: bytes, steps_list: list
) -> list[tuple[str | None, np.ndarray | None] | None]:
    """Each program's state key and, where it is valid, its features; None where anything went wrong."""
    dag = _dags.get(key)
    if dag is None:
        dag, target = pickle.loads(payload)
        if target is not None:
            bind_target(dag, target)
        _dags[key] = dag
        if len(_dags) > KEPT_DAGS:
            _dags.popitem(last=False)
    out: list[tuple[str | None, np.ndarray | None] | None] = []
    for steps in steps_list:
        try:
            state = replay(dag, steps_from_json(steps))
            found = state_key(state)
            out.append((found, None if found is None else state_features(state)))
        except Exception:  # noqa: BLE001 - the tuner's process lowers it again and raises what it must
            out.append(None)
    return out
