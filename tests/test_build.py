"""Whole models: aotc build -> aotc_runtime -> same numbers as onnxruntime (rtol 1e-4, atol 1e-5)."""

import aotc_runtime
import numpy as np
import pytest

from aotc.api import with_overrides
from aotc.build import build
from aotc.recipe import load_recipe
from aotc.search.measure import MeasureOptions
from aotc.search.params import SearchParams
from aotc.validate import compare, random_inputs, reference_outputs
from recipes.zoo import onnx_models as models

RTOL, ATOL = 1e-4, 1e-5


@pytest.fixture(autouse=True)
def no_record_stores(tmp_path, monkeypatch):
    """Builds here see only their recipe's records and write tuned records to a private user store."""
    monkeypatch.setenv("AOTC_HOME", str(tmp_path / "aotc-home"))
    monkeypatch.setenv("AOTC_TOPHUB", "none")


def build_model(tmp_path, name, model, validate=False, extra=""):
    path = tmp_path / f"{name}.onnx"
    models.save(model, path)
    recipe = tmp_path / f"{name}.yaml"
    recipe.write_text(f"model: {path.name}\noutput: {name}.aotc\nvalidate: {str(validate).lower()}\n{extra}")
    return build(load_recipe(recipe), log=lambda _: None), path


def check_against_onnxruntime(result, model_path, seed=0):
    compiled = aotc_runtime.load(str(result.package))
    inputs = random_inputs({t.name: (tuple(t.shape), t.dtype) for t in compiled.inputs}, seed)
    report = compare(compiled.run(inputs), reference_outputs(model_path, inputs), RTOL, ATOL)
    assert all(r["ok"] for r in report), report
    return compiled


@pytest.mark.parametrize(
    "name, make",
    [
        ("mlp", lambda: models.mlp()),
        ("small_cnn", lambda: models.small_cnn()),
        ("transformer", lambda: models.transformer_encoder()),
        ("resnet18_thin", lambda: models.resnet18(width=16, size=64)),
        ("mobilenet_v2_thin", lambda: models.mobilenet_v2(width_mult=0.35, size=96)),
    ],
)
def test_model_matches_onnxruntime(tmp_path, name, make):
    result, path = build_model(tmp_path, name, make())
    check_against_onnxruntime(result, path)
    assert result.package.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize(
    "name, make",
    [
        ("resnet18", lambda: models.resnet18()),
        ("mobilenet_v2", lambda: models.mobilenet_v2()),
    ],
)
def test_full_size_224_models_match_onnxruntime(tmp_path, name, make):
    result, path = build_model(tmp_path, name, make())
    check_against_onnxruntime(result, path)


def test_build_with_validation_reports_every_output(tmp_path):
    result, _ = build_model(tmp_path, "mlp", models.mlp(), validate=True)
    assert result.validation and all(r["ok"] for r in result.validation)


def test_identical_subgraphs_share_one_task(tmp_path):
    result, _ = build_model(tmp_path, "resnet", models.resnet18(width=8, size=32))
    assert max(t.weight for t in result.tasks) > 1
    calls = len(aotc_runtime.load(str(result.package)).manifest["execution_plan"])
    assert calls == sum(t.weight for t in result.tasks)


def test_two_runs_reuse_no_state(tmp_path):
    result, path = build_model(tmp_path, "mlp", models.mlp())
    compiled = check_against_onnxruntime(result, path, seed=1)
    x = random_inputs({"input": ((1, 64), "float32")}, 5)
    first = compiled.run(x)["output"]
    np.testing.assert_array_equal(compiled.run(x)["output"], first)


def test_tuned_build_uses_records_and_a_second_build_tunes_nothing(tmp_path):
    extra = "tuning:\n  trials: 24\n  records: mlp.jsonl\n"
    logs: list[str] = []
    path = tmp_path / "mlp.onnx"
    models.save(models.mlp(), path)
    recipe = tmp_path / "mlp.yaml"
    recipe.write_text(f"model: mlp.onnx\noutput: mlp.aotc\nvalidate: true\n{extra}")
    fast = dict(
        measure=MeasureOptions(repeat=1, min_repeat_ms=1, n_build_workers=2),
        search=SearchParams(population=32),
    )
    first = build(with_overrides(load_recipe(recipe), **fast), log=logs.append)
    kernels = aotc_runtime.load(str(first.package)).manifest["kernels"]
    assert any(k["schedule"] == "record" for k in kernels)
    assert any(line.startswith("tuning ") for line in logs)
    records_after_first = (tmp_path / "mlp.jsonl").read_text().count("\n")
    assert records_after_first == 24

    logs.clear()
    second = build(with_overrides(load_recipe(recipe), **fast), log=logs.append)
    assert not any(line.startswith("tuning ") for line in logs)
    assert (tmp_path / "mlp.jsonl").read_text().count("\n") == records_after_first
    again = aotc_runtime.load(str(second.package)).manifest["kernels"]
    assert [k["schedule"] for k in again] == [k["schedule"] for k in kernels]
    check_against_onnxruntime(second, path)
