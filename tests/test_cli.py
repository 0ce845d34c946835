"""The aotc command: exit codes and clear errors for bad input; nothing half-written."""

import aotc_runtime
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from aotc.cli import main
from recipes.zoo import onnx_models as models


@pytest.fixture(autouse=True)
def no_record_stores(tmp_path, monkeypatch):
    """Builds here see only their recipe's records and write tuned records to a private user store."""
    monkeypatch.setenv("AOTC_HOME", str(tmp_path / "aotc-home"))
    monkeypatch.setenv("AOTC_TOPHUB", "none")


@pytest.fixture
def mlp_recipe(tmp_path):
    models.save(models.mlp(), tmp_path / "mlp.onnx")
    recipe = tmp_path / "mlp.yaml"
    recipe.write_text("model: mlp.onnx\noutput: out/mlp.aotc\n")
    return recipe


def test_build_inspect_run_validate(tmp_path, mlp_recipe, capsys):
    assert main(["build", str(mlp_recipe)]) == 0
    pkg = tmp_path / "out" / "mlp.aotc"
    assert pkg.exists()
    assert main(["inspect", str(pkg)]) == 0
    assert "input" in capsys.readouterr().out
    x = np.random.default_rng(0).uniform(-1, 1, (1, 64)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    assert (
        main(["run", str(pkg), "--input", f"input={tmp_path / 'x.npy'}", "--output", str(tmp_path / "o")])
        == 0
    )
    out = np.load(tmp_path / "o" / "output.npy")
    assert out.shape == (1, 10) and abs(float(out.sum()) - 1.0) < 1e-5
    assert main(["validate", str(pkg), "--model", str(tmp_path / "mlp.onnx")]) == 0
    capsys.readouterr()
    assert main(["profile", str(pkg), "--repeat", "2", "--threads", "1"]) == 0
    table = capsys.readouterr().out
    plan = aotc_runtime.read_manifest(str(pkg))["execution_plan"]
    assert all(call["kernel"] in table for call in plan)
    assert f"{len(plan)} kernel calls at 1 threads" in table and "alone ms" not in table
    assert main(["profile", str(pkg), "--repeat", "2", "--alone"]) == 0
    table = capsys.readouterr().out
    assert "alone ms" in table and "lost to running in sequence" in table
    with pytest.raises(SystemExit) as exit_info:  # refused by argparse, before the package is loaded
        main(["profile", str(pkg), "--repeat", "0"])
    assert exit_info.value.code == 2


def test_print_config(mlp_recipe, capsys):
    assert main(["build", str(mlp_recipe), "--print-config"]) == 0
    assert "model:" in capsys.readouterr().out


def test_build_flags_override_the_recipe_and_explain_the_cache(tmp_path, mlp_recipe, capsys):
    assert main(["build", str(mlp_recipe), "--print-config", "--trials", "5", "--deadline", "30m"]) == 0
    out = capsys.readouterr().out
    assert "trials: 5" in out and "deadline: 1800.0" in out
    assert main(["build", str(mlp_recipe), "--trials", "0", "--explain-cache"]) == 0
    out = capsys.readouterr().out
    assert out.count(": miss: ") == 4 and "report: " in out
    assert (tmp_path / "out" / "mlp.report" / "report.json").exists()
    with pytest.raises(SystemExit) as exit_info:
        main(["build", str(mlp_recipe), "--deadline", "soon"])
    assert exit_info.value.code == 2
    assert "--deadline: 'soon'" in capsys.readouterr().err


def test_recipe_typo_exits_2(tmp_path, mlp_recipe, capsys):
    mlp_recipe.write_text("model: mlp.onnx\ntunning: {trials: 1}\n")
    assert main(["build", str(mlp_recipe)]) == 2
    assert "did you mean 'tuning'" in capsys.readouterr().err


def test_truncated_model_exits_1_and_leaves_nothing(tmp_path, capsys):
    data = models.mlp().SerializeToString()
    (tmp_path / "bad.onnx").write_bytes(data[: len(data) // 2])
    (tmp_path / "bad.yaml").write_text("model: bad.onnx\noutput: bad.aotc\n")
    assert main(["build", str(tmp_path / "bad.yaml")]) == 1
    assert "bad.onnx" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.aotc*")) and not list(tmp_path.glob(".bad*"))


def _model_with(nodes, inputs, outputs, tmp_path, name):
    graph = helper.make_graph(nodes, name, inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / f"{name}.onnx")
    (tmp_path / f"{name}.yaml").write_text(f"model: {name}.onnx\noutput: {name}.aotc\n")
    return tmp_path / f"{name}.yaml"


def test_unsupported_operator_exits_1_naming_it(tmp_path, capsys):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    recipe = _model_with([helper.make_node("Hardmax", ["x"], ["y"], name="hm")], [x], [y], tmp_path, "unsup")
    assert main(["build", str(recipe)]) == 1
    err = capsys.readouterr().err
    assert "Hardmax" in err and "hm" in err
    assert not list(tmp_path.glob("*.aotc"))


def test_dynamic_dimension_without_shape_exits_2(tmp_path, capsys):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    recipe = _model_with([helper.make_node("Relu", ["x"], ["y"])], [x], [y], tmp_path, "dyn")
    assert main(["build", str(recipe)]) == 2
    assert "x" in capsys.readouterr().err
    recipe.write_text("model: dyn.onnx\noutput: dyn.aotc\ninputs:\n  x: {shape: [3, 4]}\n")
    assert main(["build", str(recipe)]) == 0


def test_flipped_byte_and_wrong_shape_are_refused(tmp_path, mlp_recipe, capsys):
    assert main(["build", str(mlp_recipe)]) == 0
    pkg = tmp_path / "out" / "mlp.aotc"
    np.save(tmp_path / "bad.npy", np.zeros((2, 64), "float32"))
    assert main(["run", str(pkg), "--input", f"input={tmp_path / 'bad.npy'}"]) == 2
    assert "input" in capsys.readouterr().err
    data = bytearray(pkg.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad = tmp_path / "flipped.aotc"
    bad.write_bytes(bytes(data))
    assert main(["inspect", str(bad)]) == 1
    assert "flipped.aotc" in capsys.readouterr().err


def test_hub_subcommand_is_wired(tmp_path, capsys):
    assert main(["hub", "ls"]) == 0
    bad = tmp_path / "bad.tophub"
    bad.write_bytes(b"not a bundle")
    assert main(["hub", "verify", str(bad)]) == 1
    captured = capsys.readouterr()
    assert "bad.tophub" in captured.out and "corrupt" in captured.err


def test_python_m_aotc_cli_reaches_every_command(tmp_path):
    """`python -m aotc.cli` dispatches like the `aotc` script (the hub command included)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "AOTC_HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "aotc.cli", "hub", "ls"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
