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
    captured = capsys.readouterr()  # messages go to stderr, the result to stdout
    assert captured.err.count(": miss: ") == 4 and "report: " in captured.out
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
    node = helper.make_node("ImageDecoder", ["x"], ["y"], name="decoder")  # Sin is supported now
    recipe = _model_with([node], [x], [y], tmp_path, "unsup")
    assert main(["build", str(recipe)]) == 1
    err = capsys.readouterr().err
    assert "ImageDecoder" in err and "decoder" in err
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


# ----------------------------------------------------------------------------- conventions (issue 21)


def aotc_process(args, tmp_path, **kwargs):
    """`python -m aotc.cli ARGS` with private record stores, in `tmp_path`."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "AOTC_HOME": str(tmp_path / "aotc-home"), "AOTC_TOPHUB": "none"}
    return subprocess.Popen(
        [sys.executable, "-m", "aotc.cli", *args], cwd=tmp_path, env=env, text=True, **kwargs
    )


def test_version(capsys):
    import aotc

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"aotc {aotc.__version__}"


def test_every_option_has_help_and_shows_its_default():
    import argparse

    from aotc.cli import build_parser

    def parsers(parser):
        yield parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    yield from parsers(child)

    seen = 0
    for parser in parsers(build_parser()):
        for action in parser._actions:
            if action.option_strings and action.dest not in ("help", "version"):
                seen += 1
                assert action.help, f"{parser.prog} {action.option_strings[0]} has no help text"
        help_text = parser.format_help()
        assert "(default: None)" not in help_text and "(default: False)" not in help_text, parser.prog
    assert seen > 40
    tune_help = build_parser()._subparsers._group_actions[0].choices["tune-op"].format_help()
    assert "(default: 200)" in tune_help


def test_build_a_model_file_without_a_recipe(tmp_path, capsys, monkeypatch):
    models.save(models.mlp(), tmp_path / "mlp.onnx")
    monkeypatch.chdir(tmp_path)
    assert main(["build", "mlp.onnx", "--input", "input=1,64:float32"]) == 0
    assert (tmp_path / "mlp.aotc").exists()  # MODEL_STEM.aotc in the working directory
    captured = capsys.readouterr()
    assert "wrote" in captured.out and "validation" in captured.out
    out = tmp_path / "elsewhere" / "m.aotc"
    assert main(["build", str(tmp_path / "mlp.onnx"), "-o", str(out), "--target", "llvm", "-q"]) == 0
    assert out.exists() and aotc_runtime.read_manifest(str(out))["target"].startswith("llvm")
    assert capsys.readouterr().err == ""  # -q: nothing but warnings and errors
    (tmp_path / "notes.txt").write_text("hello")
    assert main(["build", "notes.txt"]) == 2
    assert "expected a model (.onnx, .tflite) or a recipe (.yaml, .yml)" in capsys.readouterr().err
    assert main(["build", "missing.onnx"]) == 2
    with pytest.raises(SystemExit) as exit_info:
        main(["build", "mlp.onnx", "--input", "input=1,x"])
    assert exit_info.value.code == 2


def test_a_command_line_deadline_lifts_a_recipe_trials_0(tmp_path, mlp_recipe, capsys):
    mlp_recipe.write_text("model: mlp.onnx\noutput: out/mlp.aotc\ntuning: {trials: 0}\n")
    assert main(["build", str(mlp_recipe), "--print-config", "--deadline", "30s"]) == 0
    assert "trials: null, deadline: 30.0" in capsys.readouterr().out
    assert main(["build", str(mlp_recipe), "--print-config", "--deadline", "30s", "--trials", "0"]) == 0
    assert "trials: 0, deadline: 30.0" in capsys.readouterr().out


def test_a_recipe_deadline_with_trials_0_is_not_silent(tmp_path, mlp_recipe, capsys):
    mlp_recipe.write_text("model: mlp.onnx\noutput: out/mlp.aotc\ntuning: {trials: 0, deadline: 30s}\n")
    assert main(["build", str(mlp_recipe)]) == 0
    assert (
        "warning: tuning.trials is 0, so the tuning.deadline of 30 s is not used" in capsys.readouterr().err
    )


def test_json_output_of_inspect_profile_and_hub(tmp_path, mlp_recipe, capsys):
    import json

    assert main(["build", str(mlp_recipe), "-q"]) == 0
    pkg = tmp_path / "out" / "mlp.aotc"
    capsys.readouterr()
    assert main(["inspect", str(pkg), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["integrity"] == "ok" and info["digest"].startswith("sha256:") and info["signature"] is None
    assert info["manifest"]["inputs"][0]["name"] == "input"
    assert main(["profile", str(pkg), "--repeat", "2", "--json"]) == 0
    profile = json.loads(capsys.readouterr().out)
    assert len(profile["calls"]) == 4 and all(c["median_ms"] > 0 for c in profile["calls"])
    records = tmp_path / "out" / "mlp.records.jsonl"
    assert main(["build", str(mlp_recipe), "-q", "--trials", "4"]) == 0
    capsys.readouterr()
    assert main(["hub", "ls", "--from", str(records), "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    (source,) = listing["sources"]
    assert sum(t["records"] for t in source["targets"]) == 4
    assert main(["hub", "explain", str(pkg), "--records", str(records), "--json"]) == 0
    explained = json.loads(capsys.readouterr().out)
    assert explained["counts"]["hit"] + explained["counts"]["miss"] == 4
    assert {t["status"] for t in explained["tasks"]} <= {"hit", "miss", "stale"}


def test_output_to_a_closed_pipe_exits_0_quietly(tmp_path, mlp_recipe):
    """`aotc build x.yaml --print-config | head -0`: the reader is gone before aotc writes; no
    traceback, no `Broken pipe`, exit code 0."""
    import os

    for args in (["--version"], ["build", str(mlp_recipe), "--print-config"]):
        read, write = os.pipe()
        os.close(read)
        proc = aotc_process(args, tmp_path, stdout=write, stderr=-1)
        os.close(write)
        _, err = proc.communicate(timeout=60)
        assert (proc.returncode, err) == (0, ""), args


def test_broken_pipe_in_process_exits_0(tmp_path, monkeypatch, capsys):
    import sys

    class Closed:
        def write(self, _):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stdout", Closed())
    assert main(["hub", "ls"]) == 0
    assert "Broken pipe" not in capsys.readouterr().err


def test_ctrl_c_while_tuning_writes_the_package_and_exits_130(tmp_path):
    import os
    import signal

    models.save(models.mlp(), tmp_path / "mlp.onnx")
    proc = aotc_process(
        ["build", "mlp.onnx", "--trials", "5000"], tmp_path, stdout=-1, stderr=-1, start_new_session=True
    )
    seen = ""
    while "round   2" not in seen:
        line = proc.stderr.readline()
        assert line, f"the build ended before tuning: {seen}"
        seen += line
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole process group
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, seen + err
    assert (tmp_path / "mlp.aotc").exists() and "wrote" in out
    assert "interrupted" in err


def test_one_line_per_round_when_not_a_terminal_and_a_small_budget_warns(tmp_path):
    import json

    models.save(models.mlp(), tmp_path / "mlp.onnx")
    proc = aotc_process(
        ["build", "mlp.onnx", "--trials", "8", "--no-validate"], tmp_path, stdout=-1, stderr=-1
    )
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    report = json.loads((tmp_path / "mlp.report" / "report.json").read_text())
    rounds = report["tuning"]["rounds"]
    assert rounds >= 4
    lines = err.splitlines()
    assert sum(line.startswith("round ") for line in lines) == rounds
    assert not any(line.startswith("|") or "Latency (ms)" in line for line in lines)
    assert len(lines) <= rounds + 6  # the rounds, plus a handful of messages: no table per round
    assert "warning: a budget of 8 trials for 4 tasks" in err and "Give at least 260 trials" in err
    markdown = (tmp_path / "mlp.report" / "report.md").read_text()
    assert "| Speedup |" in markdown and markdown.count(str(tmp_path)) == 2  # the model, the records once
    assert (tmp_path / "mlp.report" / "curve.png").exists()


def test_the_curve_is_titled_with_model_target_and_cpu():
    from aotc.report import curve_title

    report = {
        "model": "/data/resnet18.onnx",
        "target": "llvm -mcpu=znver4 -mattr=+avx2,+fma",
        "cpu": "znver4 (AVX2)",
    }
    assert curve_title(report) == "resnet18.onnx: llvm -mcpu=znver4 -mattr=<2 features> on znver4 (AVX2)"


def test_live_display_replaces_the_round_lines():
    import io

    from aotc.progress import LiveTuning
    from aotc.search.scheduler import TaskScheduler
    from tests.test_scheduler import FakeRounds, tasks

    stream, lines = io.StringIO(), []
    with LiveTuning(stream) as display:
        sched = TaskScheduler(
            tasks([1, 2]), FakeRounds([1e-3, 2e-3]), per_round=8, callbacks=[display], log=lines.append
        )
        sched.tune(40)
    assert not [line for line in lines if line.startswith("round ")]
    shown = stream.getvalue()
    assert "Latency (ms)" in shown and "trials 40/40" in shown


def test_files_are_written_with_the_users_umask(tmp_path):
    import os
    import stat

    from aotc.files import atomic_file

    old = os.umask(0o027)
    try:
        with atomic_file(tmp_path / "report.json") as f:
            f.write(b"{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "report.json").stat().st_mode) == 0o640


def test_hub_export_takes_a_cpu_with_only_its_core_count(tmp_path, capsys):
    from aotc.hub.cli import export_key
    from aotc.hub.store import TargetKey
    from aotc.target import parse_target

    class Rec:
        host = {"machine": "x86_64"}

        def __init__(self, target):
            self.target = target

    full = "llvm -mcpu=znver4 -mattr=+avx2,+fma -mtriple=x86_64-linux-gnu -num-cores=8"
    other = "llvm -mcpu=znver4 -mattr=+avx2,+fma -mtriple=x86_64-linux-gnu -num-cores=16"
    records = [Rec(full), Rec(other)]
    text = "llvm -mcpu=znver4 -mtriple=x86_64-linux-gnu -num-cores=8"
    assert export_key(parse_target(text), text, records) == TargetKey.of(parse_target(full))
