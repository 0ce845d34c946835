"""Records across CPU classes in `aotc build`: records of the same workloads made for another CPU of this
ISA are measured here against the default schedule (also without a tuning budget), the faster one is
the kernel, and what was measured is stored as this CPU's records; `tuning.transfer: false` turns it off."""

import dataclasses
import json

import pytest

from aotc.api import with_overrides
from aotc.build import build, load_model
from aotc.graph.partition import extract_tasks, partition
from aotc.hub import open_sources
from aotc.hub.store import append_to_store
from aotc.recipe import load_recipe
from aotc.schedule.default import default_schedule
from aotc.search.common import ErrorCode, MeasureResult
from aotc.search.measure import MeasureOptions
from aotc.search.params import SearchParams
from aotc.search.records import Record, load_records
from aotc.target import parse_target
from recipes.zoo import onnx_models as models
from recipes.zoo import tflite_models

FAST = dict(
    measure=MeasureOptions(repeat=1, min_repeat_ms=1, n_build_workers=2),
    search=SearchParams(population=32, per_round=8),
)
# Another CPU of this host's ISA: records made for it are transferable, never an exact hit here.
OTHER = parse_target("llvm -mcpu=generic")
# what the other CPU measured: faster than these kernels run here (yet under the FLOP/s ceiling that
# records must respect), so never trusted
FOREIGN_COST = 1e-7


@pytest.fixture(autouse=True)
def own_store(tmp_path, monkeypatch):
    """A private user store (where the foreign records go) and no shipped or shared stores."""
    monkeypatch.setenv("AOTC_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("AOTC_TOPHUB", raising=False)
    monkeypatch.setenv("AOTC_SHIPPED_TOPHUB", "none")


def mlp_recipe(tmp_path, tuning: str = "  trials: 0\n"):
    models.save(models.mlp(), tmp_path / "mlp.onnx")
    recipe = tmp_path / "mlp.yaml"
    recipe.write_text(f"model: mlp.onnx\noutput: build/mlp.aotc\nvalidate: true\ntuning:\n{tuning}")
    return load_recipe(recipe)


def foreign_records(recipe, home) -> list:
    """Per task of the recipe's model, records made for OTHER: its default schedule for OTHER (other
    vector widths than this host's), and one whose steps do not replay."""
    tasks = extract_tasks(partition(load_model(recipe)))
    recs = []
    for task in tasks:
        state = default_schedule(task.dag, OTHER)
        ok = MeasureResult([FOREIGN_COST], ErrorCode.NO_ERROR, "")
        rec = Record.from_result(task.dag, OTHER, state, ok)
        broken = dataclasses.replace(rec, steps=[["SP", 99, 0, 16, [2], 1]], costs=[FOREIGN_COST / 2])
        recs += [rec, broken]
    append_to_store(home / "tophub", recs)
    return tasks


def test_transfer_seeds_an_untuned_build_and_the_next_build_is_an_exact_hit(tmp_path):
    recipe = mlp_recipe(tmp_path)
    tasks = foreign_records(recipe, tmp_path / "home")
    target = parse_target(recipe.target)
    logs: list[str] = []
    result = build(with_overrides(recipe, **FAST), log=logs.append, explain_cache=True)
    assert result.validation and all(r["ok"] for r in result.validation)
    text = "\n".join(logs)
    assert "stale: record for -mcpu=generic" in text  # the exact key still never matches
    assert text.count("transferred from generic: 1 candidate(s) to measure here") == len(tasks)
    assert "does not replay" in text  # the broken record: skipped with its reason, not a failed build
    assert any(line.startswith("measuring ") for line in logs)
    assert sum(f"task {i} {t.name}: transferred from generic: " in text for i, t in enumerate(tasks)) == len(
        tasks
    )

    # measured here, written as this CPU's records: the default and the transferred schedule per task
    here = load_records(tmp_path / "build" / "mlp.records.jsonl")
    assert {r.target for r in here} == {str(target)}
    assert all(r.mean_cost != FOREIGN_COST for r in here)
    report = json.loads((tmp_path / "build" / "mlp.report" / "report.json").read_text())
    for row in report["tasks"]:
        transfer = row["transfer"]
        assert transfer["from"] == "generic" and "does not replay" in transfer["skipped"][0]
        assert transfer["default_cost_s"] is not None
        (candidate,) = transfer["candidates"]
        assert candidate["foreign_cost_s"] == FOREIGN_COST
        assert candidate["cost_s"] is not None or candidate["same_as_default"]
        # the kernel is whichever measured faster here, with this host's cost, never the foreign one
        assert row["best_latency_s"] not in (None, FOREIGN_COST)
        winner = "transferred" if row["best_latency_s"] < transfer["default_cost_s"] else "default"
        assert transfer["kernel"] == winner
        if winner == "transferred":
            assert row["source"] == "transferred from generic (measured here)"
    assert (
        "Schedules transferred from other CPUs"
        in (tmp_path / "build" / "mlp.report" / "report.md").read_text()
    )

    logs.clear()
    build(with_overrides(recipe, **FAST), log=logs.append, explain_cache=True)
    assert not any(line.startswith("measuring ") for line in logs)
    assert sum(
        line.split(": ", 1)[1].startswith("hit: ") for line in logs if line.startswith("task ")
    ) == len(tasks)
    assert len(load_records(tmp_path / "build" / "mlp.records.jsonl")) == len(here)


def test_transfer_false_turns_it_off(tmp_path):
    recipe = mlp_recipe(tmp_path, "  trials: 0\n  transfer: false\n")
    foreign_records(recipe, tmp_path / "home")
    logs: list[str] = []
    build(with_overrides(recipe, **FAST), log=logs.append, explain_cache=True)
    assert not any("transferred" in line or line.startswith("measuring ") for line in logs)
    assert not (tmp_path / "build" / "mlp.records.jsonl").exists()
    report = json.loads((tmp_path / "build" / "mlp.report" / "report.json").read_text())
    assert all(row["transfer"] is None and row["source"] == "default schedule" for row in report["tasks"])


def test_transfer_seeds_the_first_round_of_a_tuned_build(tmp_path):
    recipe = mlp_recipe(tmp_path, "  trials: 12\n")
    tasks = foreign_records(recipe, tmp_path / "home")
    logs: list[str] = []
    result = build(with_overrides(recipe, **FAST), log=logs.append)
    assert any(line.startswith("tuning ") for line in logs) and result.tuning.trials == 12
    here = {json.dumps(r.steps) for r in load_records(tmp_path / "build" / "mlp.records.jsonl")}
    assert 2 * len(tasks) <= 12  # room for every task's default and transferred schedule
    sources = open_sources(None, None)
    for task in tasks:  # the baseline round measured each task's transferred schedule next to its default
        (rec,) = [
            r
            for r, _, _ in sources.records_across(parse_target(recipe.target))
            if r.costs == [FOREIGN_COST] and r.fingerprint == task.dag.fingerprint
        ]
        assert json.dumps(rec.steps) in here


def test_records_of_twin_workloads_are_measured_for_a_model_calibrated_otherwise(tmp_path):
    """Two calibrations of one int8 CNN: layers with other zero points and scales have other fingerprints
    but the same structure key. This CPU's records of the first model's layers are candidates for the
    second's, measured here next to their default schedules; layers whose constants agree are exact hits."""

    def int8_cnn(name: str, seed: int):
        path = tmp_path / f"{name}.tflite"
        path.write_bytes(tflite_models.int8_model(tflite_models.small_cnn(), seed=seed).build())
        recipe = tmp_path / f"{name}.yaml"
        recipe.write_text(
            f"model: {path.name}\noutput: build/{name}.aotc\nvalidate: true\ntuning:\n  trials: 0\n"
        )
        return load_recipe(recipe)

    first, second = int8_cnn("first", 100), int8_cnn("second", 5)
    target = parse_target(first.target)
    first_tasks = extract_tasks(partition(load_model(first)))
    costs = [max(FOREIGN_COST, t.dag.flop_count / 1e12) for t in first_tasks]  # under the FLOP/s ceiling
    records = [
        Record.from_result(
            t.dag, target, default_schedule(t.dag, OTHER), MeasureResult([c], ErrorCode.NO_ERROR, "")
        )
        for t, c in zip(first_tasks, costs)
    ]
    append_to_store(tmp_path / "home" / "tophub", records)
    fingerprints = {t.dag.fingerprint for t in first_tasks}
    structures = {t.dag.structure_key for t in first_tasks}
    tasks = extract_tasks(partition(load_model(second)))
    twins = [t for t in tasks if t.dag.fingerprint not in fingerprints and t.dag.structure_key in structures]
    assert twins and all(t.dag.structure_key in structures for t in tasks)

    logs: list[str] = []
    result = build(with_overrides(second, **FAST), log=logs.append, explain_cache=True)
    assert result.validation and all(r["ok"] for r in result.validation)
    assert any(line.startswith("measuring ") and "twin workloads" in line for line in logs)
    report = json.loads((tmp_path / "build" / "second.report" / "report.json").read_text())
    for task, row in zip(tasks, report["tasks"]):
        if task in twins:
            assert row["transfer"]["from"] == "this CPU, a twin workload"
            assert row["best_latency_s"] is not None and row["best_latency_s"] not in costs  # measured here
        else:
            assert row["transfer"] is None and row["lookup"].startswith("hit")
