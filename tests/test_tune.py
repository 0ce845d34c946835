"""The tuning loop: rounds of search + measurement, records appended, resume never re-measures."""

import numpy as np

from aotc.search.common import RandomCostModel
from aotc.search.measure import MeasureOptions
from aotc.search.params import SearchParams
from aotc.search.records import apply_best, load_records
from aotc.search.task import SearchTask
from aotc.target import host_target
from aotc.topi.workloads import make_workload

FAST = MeasureOptions(repeat=1, min_repeat_ms=1, n_build_workers=2)


def test_tune_records_every_candidate_and_resumes_without_remeasuring(tmp_path):
    records = tmp_path / "matmul.jsonl"
    dag = make_workload("matmul", [32, 32, 32])
    task = SearchTask(dag, host_target())
    lines = []
    first = task.tune(
        16,
        records=records,
        model=RandomCostModel(0),
        measure_options=FAST,
        params=SearchParams(per_round=8, population=32),
        log=lines.append,
    )
    assert first.trials == 16 and first.best_state is not None
    assert len(first.history) == 2 and "trials    16/16" in lines[-1]
    saved = load_records(records)
    assert len(saved) == 16 and all(r.workload_key == dag.workload_key for r in saved)
    best_state, best_record = apply_best(saved, dag, host_target())
    assert np.isclose(best_record.mean_cost, first.best_cost)

    again = task.tune(
        16,
        records=records,
        model=RandomCostModel(1),
        measure_options=FAST,
        params=SearchParams(per_round=8, population=32),
        log=lines.append,
    )
    keys = [tuple(map(str, r.steps)) for r in load_records(records)]
    assert len(keys) == 32 and len(set(keys)) == 32  # the second run measured only new candidates
    assert again.best_cost <= first.best_cost


def test_tune_with_the_learned_model_improves_on_the_first_round(tmp_path):
    dag = make_workload("matmul", [64, 64, 64])
    task = SearchTask(dag, host_target())
    result = task.tune(
        48, measure_options=FAST, params=SearchParams(per_round=16, population=48, seed=3), log=lambda _: None
    )
    assert result.best_state is not None
    costs = [h.best_cost for h in result.history]
    assert costs == sorted(costs, reverse=True)  # best-so-far never gets worse
    assert set(result.seconds) == {"search", "build", "run", "model"}
