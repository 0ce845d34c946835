"""The example model builders live in recipes/zoo, beside their users, not in the installed compiler."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_the_compiler_package_holds_no_model_builders():
    assert importlib.util.find_spec("aotc.models") is None
    assert importlib.util.find_spec("aotc.tflite_models") is None
    assert importlib.util.find_spec("recipes.zoo.onnx_models") is not None
    assert importlib.util.find_spec("recipes.zoo.tflite_models") is not None


@pytest.mark.parametrize(
    "script",
    ["benchmarks/e2e.py", "benchmarks/models.py", "benchmarks/transfer.py", "recipes/make_tflite_models.py"],
)
def test_scripts_find_the_zoo_when_run_from_elsewhere(tmp_path, script):
    """Run as `python path/x.py` only the script's folder is on sys.path; each must still import the zoo."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run(
        [sys.executable, str(REPO / script), "--help"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert "usage:" in run.stdout
