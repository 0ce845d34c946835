"""The Python API as the README shows it: aotc.compile / Package.save / aotc.load / aotc.tune."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import aotc

ROOT = Path(__file__).resolve().parent.parent
MLP = ROOT / "recipes" / "models" / "mlp.onnx"


def test_readme_first_example_runs_as_written(tmp_path, monkeypatch):
    """The README's first Python block, with its model swapped for the committed MLP and its budget cut."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```python\n(import aotc\n.*?)```", readme, re.S)
    assert block, "the README's first example is the Python API"
    code = block.group(1)
    for text in ('"resnet18.onnx"', "trials=2000", 'deadline="30m"', '"r18.jsonl"', '"resnet18.aotc"'):
        assert text in code, text
    code = (
        code.replace('"resnet18.onnx"', repr(str(MLP)))
        .replace("trials=2000", "trials=4")
        .replace('deadline="30m"', 'deadline="5m", search=aotc.SearchParams(per_round=2, population=8)')
        .replace('"r18.jsonl"', repr(str(tmp_path / "r18.jsonl")))
        .replace('"resnet18.aotc"', repr(str(tmp_path / "resnet18.aotc")))
        .replace('{"input": x}', '{"input": x}')
    )
    x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
    scope = {"x": x}
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - the README's own example
    want = ort.InferenceSession(str(MLP)).run(None, {"input": x})[0]
    got = next(iter(scope["y"].values()))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert (tmp_path / "resnet18.aotc").is_file() and (tmp_path / "r18.jsonl").is_file()


def test_tuning_at_a_scripts_top_level_fails_and_says_why(tmp_path, isolated_home):
    """The tuner's builders are spawned processes that import the main script again; a script that tunes at
    its top level (the README's example pasted as it is) then cannot start them. The build must stop with
    an error that names the fix, not write an untuned package and exit 0 as it did."""
    package = tmp_path / "mlp.aotc"
    script = tmp_path / "tune_mlp.py"
    script.write_text(
        "import aotc\n"
        f"aotc.compile({str(MLP)!r}, tuning=aotc.TuningOptions(trials=4), output={str(package)!r})\n"
    )
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=dict(os.environ)
    )
    assert proc.returncode != 0, proc.stdout[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("aotc.search.measure.BuildersCannotStart: a builder process died while starting")
    assert f'if {script} calls aotc.compile or aotc.tune, call it under `if __name__ == "__main__":`' in last
    assert not package.exists()


def test_compile_without_output_writes_a_temporary_package(tmp_path):
    pkg = aotc.compile(MLP, log=lambda _: None)
    assert pkg.path.is_file() and pkg.validation and all(r["ok"] for r in pkg.validation)
    saved = pkg.save(tmp_path / "mlp.aotc")
    x = np.ones((1, 64), np.float32)
    np.testing.assert_array_equal(
        aotc.load(str(saved)).run({"input": x})["output"], pkg.load().run({"input": x})["output"]
    )
    scratch = pkg.path.parent
    del pkg
    import gc

    gc.collect()
    assert not scratch.exists() and saved.is_file()


def test_recipe_is_one_way_to_say_the_same(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model: {MLP}\ntarget: llvm\noutput: {tmp_path / 'a.aotc'}\nvalidate: false\n")
    from_yaml = aotc.compile(aotc.Recipe.from_yaml(recipe), log=lambda _: None)
    in_python = aotc.compile(MLP, "llvm", output=tmp_path / "b.aotc", validate=False, log=lambda _: None)
    x = np.ones((1, 64), np.float32)
    a, b = (p.load().run({"input": x})["output"] for p in (from_yaml, in_python))
    np.testing.assert_array_equal(a, b)


def test_bad_arguments_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="unsupported model format"):
        aotc.compile(tmp_path / "model.pb")
    with pytest.raises(FileNotFoundError, match="model file not found"):
        aotc.compile(tmp_path / "missing.onnx")
    with pytest.raises(ValueError, match="is the model file"):
        aotc.compile(MLP, output=MLP)
    with pytest.raises(ValueError, match="TuningOptions.deadline"):
        aotc.TuningOptions(deadline="forever")
    with pytest.raises(ValueError, match="TuningOptions.trials"):
        aotc.TuningOptions(trials=-1)


def test_tune_one_operator_accepts_a_target_string(tmp_path):
    from aotc.topi.workloads import make_workload

    options = aotc.TuningOptions(
        trials=4, search=aotc.SearchParams(per_round=2, population=8), records=tmp_path / "op.jsonl"
    )
    result = aotc.tune(make_workload("matmul", [32, 32, 32]), "llvm", options, log=lambda _: None)
    assert result.trials == 4 and result.best_cost > 0 and (tmp_path / "op.jsonl").is_file()


def test_a_model_whose_reference_refuses_the_random_inputs_builds_with_validation_skipped(tmp_path, caplog):
    """Validation feeds integers 0 to 3; a Gather over an axis of 2 fed its indices at run time makes
    onnxruntime refuse them. The build says so and writes the package instead of failing with
    onnxruntime's own exception."""
    import logging

    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Gather", ["data", "indices"], ["y"], axis=0)],
        "gather",
        [
            helper.make_tensor_value_info("data", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("indices", TensorProto.INT64, [4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])],
    )
    path = tmp_path / "gather.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    with caplog.at_level(logging.WARNING, logger="aotc.build"):
        package = aotc.compile(path, output=tmp_path / "gather.aotc")
    assert package.result.validation is None
    assert "validation skipped: onnxruntime cannot run" in caplog.text and "validate: false" in caplog.text
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = package.load().run({"data": data, "indices": np.array([1, 0, 1, 1])})
    np.testing.assert_array_equal(got["y"], data[[1, 0, 1, 1]])
