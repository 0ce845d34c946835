"""SearchParams: one object holds the search policy, each setting validated with its one default."""

import random

import pytest

from aotc.search.common import RandomCostModel
from aotc.search.evolution import search_round
from aotc.search.lowering import state_key
from aotc.search.measure import MeasureOptions
from aotc.search.params import SearchParams
from aotc.search.scheduler import TaskScheduler
from aotc.search.task import SearchTask, TaskSearch
from aotc.target import host_target
from aotc.topi.workloads import make_workload

FAST = MeasureOptions(repeat=1, min_repeat_ms=1, n_build_workers=2)


@pytest.mark.parametrize(
    "field, value",
    [
        ("population", 0),
        ("per_round", 2.5),
        ("generations", -1),
        ("mutation_prob", 1.5),
        ("eps_greedy", True),
        ("strategy", "greedy"),
        ("structure", "SSX"),
        ("unroll_steps", ()),
        ("seed", "0"),
    ],
)
def test_a_bad_setting_is_refused_naming_it(field, value):
    with pytest.raises(ValueError, match=rf"SearchParams\.{field}: expected"):
        SearchParams(**{field: value})


def test_the_task_scheduler_takes_its_defaults_from_search_params():
    sched = TaskScheduler([], lambda i, n: None, log=lambda _: None)
    defaults = SearchParams()
    assert (sched.strategy, sched.per_round) == (defaults.strategy, defaults.per_round)


def test_a_round_measures_per_round_candidates_from_the_params():
    dag = make_workload("matmul", [32, 32, 32])
    params = SearchParams(per_round=8, population=32, generations=1)
    out = search_round(dag, host_target(), RandomCostModel(0), random.Random(0), set(), params=params)
    assert len(out) == 8 and len({state_key(s) for s in out}) == 8


def test_a_task_search_seeds_its_randomness_from_the_params():
    task = SearchTask(make_workload("matmul", [32, 32, 32]), host_target())

    def proposed(seed):
        search = TaskSearch(
            task, RandomCostModel(0), params=SearchParams(population=32, generations=1, seed=seed)
        )
        return [state_key(s) for s in search.propose(8)]

    assert proposed(1) == proposed(1) != proposed(2)


def test_a_search_task_takes_a_target_string_and_tunes():
    task = SearchTask(make_workload("matmul", [16, 16, 16]), "llvm")
    assert task.target == host_target()
    result = task.tune(
        4,
        params=SearchParams(per_round=4, population=16, generations=1),
        model=RandomCostModel(0),
        measure_options=FAST,
        log=lambda _: None,
    )
    assert result.trials == 4 and result.best_state is not None


def test_a_search_task_refuses_what_is_not_a_target():
    with pytest.raises(TypeError, match="target: expected a Target or a target string"):
        SearchTask(make_workload("matmul", [16, 16, 16]), 42)
