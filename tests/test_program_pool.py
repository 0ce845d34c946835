"""Lowering and featurizing candidates in worker processes (aotc.search.program_pool): the caches get what
this process computes, a search finds the same candidates, and a broken pool changes nothing."""

import random

import numpy as np

from aotc.schedule.steps import replay
from aotc.search import program_pool
from aotc.search.common import RandomCostModel
from aotc.search.evolution import search_round
from aotc.search.features import clear_feature_cache, knows_features, state_features
from aotc.search.lowering import knows_key, state_key
from aotc.search.params import SearchParams

from .test_annotation import TARGET, conv_bias_relu, population

SERIAL = SearchParams(population=48, generations=2, workers=0)


def unlowered(states):
    """The same programs on a fresh DAG, replayed only: nothing of them is lowered or cached yet."""
    dag = conv_bias_relu()
    return [replay(dag, s.steps) for s in states]


def test_prefetch_caches_the_keys_and_features_this_process_computes():
    here = population(conv_bias_relu(), 40)
    expected = [(state_key(s), state_features(s)) for s in here]
    there = unlowered(here)
    clear_feature_cache()  # keyed by workload and steps: `here` filled it for `there` too
    assert not any(knows_key(s) or knows_features(s) for s in there)
    program_pool.prefetch(there, workers=2)
    assert all(knows_key(s) and knows_features(s) for s in there)
    for s, (key, feats) in zip(there, expected):
        assert state_key(s) == key
        np.testing.assert_array_equal(state_features(s), feats)


def test_small_batches_and_single_workers_stay_in_this_process(monkeypatch):
    states = population(conv_bias_relu(), 40)
    monkeypatch.setattr(program_pool, "_start", lambda workers: (_ for _ in ()).throw(AssertionError("pool")))
    few, one_worker = unlowered(states[: program_pool.MIN_BATCH - 1]), unlowered(states)
    program_pool.prefetch(few, workers=2)  # too few to ship
    program_pool.prefetch(one_worker, workers=1)
    program_pool.prefetch(states, workers=2)  # all lowered already
    assert not any(knows_key(s) for s in few + one_worker)


def test_a_search_round_finds_the_same_candidates_with_workers():
    def run(workers):
        out = search_round(
            conv_bias_relu(),
            TARGET,
            RandomCostModel(3),
            random.Random(3),
            set(),
            n=16,
            params=SERIAL.replace(workers=workers),
        )
        return [s.steps for s in out]

    assert run(2) == run(0)


def test_a_broken_pool_leaves_the_work_to_this_process(monkeypatch):
    class Broken:
        def submit(self, *args):
            raise RuntimeError("A process in the process pool was terminated abruptly")

    states = population(conv_bias_relu(), 40)
    for start in (lambda workers: Broken(), lambda workers: (_ for _ in ()).throw(OSError("no processes"))):
        monkeypatch.setattr(program_pool, "_start", start)
        fresh = unlowered(states)
        program_pool.prefetch(fresh, workers=2)
        assert not any(knows_key(s) for s in fresh)
        assert [state_key(s) for s in fresh] == [state_key(s) for s in states]
