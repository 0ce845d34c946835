"""Whole-model tuning in `aotc build`: deadline, resume, Ctrl-C, the build report, kernel provenance."""

import json
import time
import zipfile

import aotc_runtime
import numpy as np
import pytest

from aotc.api import with_overrides
from aotc.build import build
from aotc.recipe import load_recipe
from aotc.search.measure import MeasureOptions
from aotc.search.params import SearchParams
from aotc.search.records import load_records
from aotc.validate import compare, random_inputs, reference_outputs
from recipes.zoo import onnx_models as models

FAST = dict(
    measure=MeasureOptions(repeat=1, min_repeat_ms=1, n_build_workers=2),
    search=SearchParams(population=32, per_round=8),
)
TASK_FIELDS = {
    "name",
    "workload_key",
    "fingerprint",
    "weight",
    "flops",
    "trials",
    "best_latency_s",
    "default_latency_s",
    "source",
}


@pytest.fixture(autouse=True)
def own_store(tmp_path, monkeypatch):
    """Each test has its own user store, and neither shipped nor shared stores."""
    monkeypatch.setenv("AOTC_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("AOTC_TOPHUB", raising=False)
    monkeypatch.setenv("AOTC_SHIPPED_TOPHUB", "none")


def kernel_library(package):
    with zipfile.ZipFile(package) as z:
        names = [n for n in z.namelist() if n.endswith(".so")]
        return [z.read(n) for n in names]


def mlp_recipe(tmp_path, tuning: str, validate: bool = True):
    models.save(models.mlp(), tmp_path / "mlp.onnx")
    recipe = tmp_path / "mlp.yaml"
    recipe.write_text(
        f"model: mlp.onnx\noutput: build/mlp.aotc\nvalidate: {str(validate).lower()}\ntuning:\n{tuning}"
    )
    return load_recipe(recipe)


def matches_onnxruntime(package, model_path):
    compiled = aotc_runtime.load(str(package))
    inputs = random_inputs({t.name: (tuple(t.shape), t.dtype) for t in compiled.inputs}, 3)
    report = compare(compiled.run(inputs), reference_outputs(model_path, inputs), 1e-4, 1e-5)
    return all(r["ok"] for r in report)


def record_keys(path):
    return [(r.fingerprint, json.dumps(r.steps)) for r in load_records(path)]


def measured_once(path) -> bool:
    """Whether no schedule but a task's untuned one (measured again before a tuned one replaces it,
    docs/search.md) was measured twice."""
    tuned = [(r.fingerprint, json.dumps(r.steps)) for r in load_records(path) if not r.untuned]
    return len(set(tuned)) == len(tuned)


def retimings(records) -> int:
    """Records of a task's untuned schedule after its first: re-timings, which are not trials."""
    marked = [r.fingerprint for r in records if r.untuned]
    return len(marked) - len(set(marked))


def test_deadline_build_is_on_time_then_resume_measures_only_new_candidates(tmp_path):
    deadline = 20.0
    recipe = mlp_recipe(tmp_path, f"  deadline: {deadline:g}s\n")
    start = time.monotonic()
    logs = []
    result = build(with_overrides(recipe, **FAST), log=logs.append, explain_cache=True)
    wall = time.monotonic() - start
    assert wall < deadline + 2.0, f"the build took {wall:.1f} s for a {deadline:g} s deadline"
    assert result.tuning.stop_reason == "deadline" and result.tuning.trials > 0
    assert result.validation and all(r["ok"] for r in result.validation)
    assert matches_onnxruntime(result.package, tmp_path / "mlp.onnx")

    records = tmp_path / "build" / "mlp.records.jsonl"  # the build's default record log
    keys = record_keys(records)
    trials = result.tuning.trials
    assert len(keys) == trials + retimings(load_records(records)) and measured_once(records)

    report_dir = tmp_path / "build" / "mlp.report"
    report = json.loads((report_dir / "report.json").read_text())
    assert len(report["tasks"]) == len(result.tasks)
    assert all(set(t) >= TASK_FIELDS for t in report["tasks"])
    assert sum(t["trials"] for t in report["tasks"]) == len(keys)
    assert sum(t["new_trials"] for t in report["tasks"]) == trials
    # each task's untuned schedule was measured first and its record is marked (docs/records.md)
    marked = [r for r in load_records(records) if r.untuned]
    assert {r.fingerprint for r in marked} == {t["fingerprint"] for t in report["tasks"]}
    default_costs = {
        r.fingerprint: min(m.mean_cost for m in marked if m.fingerprint == r.fingerprint) for r in marked
    }
    assert all(t["default_latency_s"] == default_costs[t["fingerprint"]] for t in report["tasks"])
    # --explain-cache says, after tuning, which record each task took
    after = [line for line in logs if ", after tuning: hit" in line]
    assert len(after) == len(result.tasks), logs
    assert report["tuning"]["stop_reason"] == "deadline"
    assert sum(report["tuning"]["measured_by"].values()) == len(keys)  # one machine here: this one
    assert len(report["tuning"]["measured_by"]) == 1
    assert report["curve"] and all(len(p) == 3 for p in report["curve"])
    assert report["curve"][-1][0] == trials
    assert (report_dir / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| Task " in (report_dir / "report.md").read_text()  # a Markdown table (rich pads its cells)

    kernels = aotc_runtime.load(str(result.package)).manifest["kernels"]
    tuned = [k for k in kernels if k["schedule"] == "record"]
    assert tuned and all(k["fingerprint"] for k in kernels)
    assert all({"record_time", "record_cost_s", "record_source", "record_host"} <= set(k) for k in tuned)

    more = 8
    resumed = mlp_recipe(tmp_path, f"  trials: {trials + more}\n", validate=False)
    again = build(with_overrides(resumed, **FAST), log=lambda _: None, resume=True)
    after = record_keys(records)
    retimed = retimings(load_records(records)) - retimings(load_records(records)[: len(keys)])
    assert again.tuning.trials == more and len(after) == len(keys) + more + retimed
    assert measured_once(records)  # nothing measured twice
    assert after[: len(keys)] == keys
    assert matches_onnxruntime(again.package, tmp_path / "mlp.onnx")

    # every record went to the user store too: a build with a fresh record file tunes nothing
    elsewhere = mlp_recipe(tmp_path, "  trials: 50\n  records: fresh.jsonl\n", validate=False)
    cached = build(with_overrides(elsewhere, **FAST), log=lambda _: None)
    assert cached.tuning.trials == 0 and not (tmp_path / "fresh.jsonl").exists()
    assert kernel_library(cached.package) == kernel_library(again.package)
    sources = [k.get("record_source", "") for k in aotc_runtime.load(str(cached.package)).manifest["kernels"]]
    assert all(src.startswith("user:") for src in sources)


def test_ctrl_c_during_tuning_still_writes_a_valid_package(tmp_path):
    recipe = mlp_recipe(tmp_path, "  trials: 400\n", validate=False)
    rounds = []

    def interrupt(scheduler, report):
        rounds.append(report.round)
        raise KeyboardInterrupt

    result = build(with_overrides(recipe, **FAST), log=lambda _: None, callbacks=[interrupt])
    assert rounds == [1]
    # the first round measures the first task's default schedule (the baseline of the estimate)
    assert result.tuning.stop_reason == "interrupted" and result.tuning.trials == 1
    assert len(load_records(tmp_path / "build" / "mlp.records.jsonl")) == 1
    assert matches_onnxruntime(result.package, tmp_path / "mlp.onnx")
    kernels = aotc_runtime.load(str(result.package)).manifest["kernels"]
    assert [k["schedule"] for k in kernels].count("record") == 1
    report = json.loads((tmp_path / "build" / "mlp.report" / "report.json").read_text())
    assert report["tuning"]["stop_reason"] == "interrupted"


def test_untuned_build_writes_a_report_without_a_curve(tmp_path):
    models.save(models.mlp(), tmp_path / "mlp.onnx")
    (tmp_path / "mlp.yaml").write_text("model: mlp.onnx\noutput: out/mlp.aotc\nvalidate: false\n")
    result = build(load_recipe(tmp_path / "mlp.yaml"), log=lambda _: None)
    directory = tmp_path / "out" / "mlp.report"
    assert result.report == directory and result.tuning is None
    report = json.loads((directory / "report.json").read_text())
    assert report["tuning"]["enabled"] is False and report["curve"] == []
    assert [t["source"] for t in report["tasks"]] == ["default schedule"] * len(result.tasks)
    assert (directory / "report.md").exists() and not (directory / "curve.png").exists()
    assert not [p for p in directory.iterdir() if p.name.endswith(".tmp")]
    assert np.isfinite(report["seconds"])
