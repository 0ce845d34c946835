"""Run-time values where the operator allows them (issue 19 item 3): values that set shapes (axes, pads,
Reshape shapes...) are given at build time with the recipe's `constants` or refused naming the input and
that key; values that do not (Clip bounds, Pad's constant_value) stay inputs of the kernels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

import aotc
from aotc.cli import main
from aotc.frontend.errors import InputShapeError
from aotc.frontend.onnx import RunTimeValueError, load_onnx, specialized_model
from aotc.graph.interpret import run_graph
from aotc.onnx_backend import AotcBackend
from aotc.recipe import Recipe, RecipeError, load_recipe

from .onnx_util import Input, check_model, make_graph_model, run_onnxruntime


def _reduce_model() -> onnx.ModelProto:
    """y = ReduceSum(clip(x, lo, hi), axes): axes sets the output's shape, lo and hi do not."""
    nodes = [
        helper.make_node("Clip", ["x", "lo", "hi"], ["c"], name="clip"),
        helper.make_node("ReduceSum", ["c", "axes"], ["y"], name="sum", keepdims=0),
    ]
    inputs = {
        "x": Input((2, 3, 4)),
        "lo": Input((), low=-1.0, high=-0.5),
        "hi": Input((), low=0.5, high=1.0),
        "axes": Input((1,), "int64"),
    }
    return make_graph_model(nodes, inputs, ["y"], opset=17)


@pytest.fixture
def model_file(tmp_path) -> Path:
    path = tmp_path / "reduce.onnx"
    onnx.save(_reduce_model(), path)
    return path


def _feeds(axes: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, (2, 3, 4)).astype(np.float32)
    return {
        "x": x,
        "lo": np.array(-0.75, np.float32),
        "hi": np.array(0.5, np.float32),
        "axes": np.array([axes]),
    }


# --- the frontend --------------------------------------------------------------------------------------------


def test_a_shape_setting_input_fed_at_run_time_is_refused_naming_it_and_the_recipe_key():
    with pytest.raises(RunTimeValueError) as e:
        load_onnx(_reduce_model().SerializeToString())
    message = str(e.value)
    assert "node sum (ReduceSum): input 1 (axes, value axes) must be a constant" in message
    assert "graph input axes, fed at run time" in message and "`constants`" in message
    assert e.value.inputs == ("axes",)


def test_a_value_computed_from_graph_inputs_names_those_inputs():
    nodes = [
        helper.make_node("Add", ["a", "b"], ["axes"], name="add"),
        helper.make_node("ReduceSum", ["x", "axes"], ["y"], name="sum"),
    ]
    model = make_graph_model(
        nodes, {"x": Input((2, 3)), "a": Input((1,), "int64"), "b": Input((1,), "int64")}, ["y"]
    )
    with pytest.raises(RunTimeValueError, match=r"computed at run time from graph inputs a, b; give them"):
        load_onnx(model.SerializeToString())


def test_constants_fix_shape_inputs_and_clip_bounds_stay_kernel_inputs():
    """axes given (a list, converted to the input's int64) is no graph input any more; Clip's bounds are
    inputs of max/min nodes. The graph matches onnxruntime within rtol 1e-4, atol 1e-5."""
    feeds = _feeds(axes=-1)
    graph = load_onnx(_reduce_model().SerializeToString(), constants={"axes": [-1]})
    assert [v.name for v in graph.inputs] == ["x", "lo", "hi"]
    assert {n.op for n in graph.nodes} >= {"maximum", "minimum"}
    (expected,) = run_onnxruntime(_reduce_model(), feeds)
    got = run_graph(graph, {k: v for k, v in feeds.items() if k != "axes"})["y"]
    assert got.shape == (2, 3)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "given, problem",
    [
        ({"bogus": [1]}, r"constants\.bogus: 'bogus' is not a graph input; the model's run-time inputs are x, lo, hi, axes"),
        ({"axes": np.array([1], np.int32)}, r"constants\.axes: an array of dtype int32; the input is int64"),
        ({"axes": [1.5]}, r"constants\.axes: \[1\.5\] is not exactly representable as int64"),
        ({"axes": [[1]]}, r"constants\.axes: a value of shape \[1, 1\] for input axes, whose shape in the model is \[1\]"),
        ({"axes": "one"}, r"constants\.axes: expected numbers"),
    ],
)  # fmt: skip
def test_constants_that_do_not_fit_the_model_are_errors_naming_the_key(given, problem):
    with pytest.raises(InputShapeError, match=problem):
        load_onnx(_reduce_model().SerializeToString(), constants=given)


def test_a_run_time_pad_value_is_a_kernel_input():
    nodes = [helper.make_node("Pad", ["x", "pads", "v"], ["y"], name="pad", mode="constant")]
    inits = {"pads": np.array([0, 1, -1, 2], np.int64)}  # negative: a crop
    model = make_graph_model(nodes, {"x": Input((2, 3)), "v": Input(())}, ["y"], inits, opset=18)
    graph = check_model(model)
    assert [v.name for v in graph.inputs] == ["x", "v"]


def test_specialized_model_turns_the_constants_into_initializers(model_file):
    special = onnx.load_model_from_string(specialized_model(str(model_file), {"axes": [1]}))
    assert [vi.name for vi in special.graph.input] == ["x", "lo", "hi"]
    feeds = _feeds(axes=1)
    (expected,) = run_onnxruntime(_reduce_model(), feeds)
    (got,) = run_onnxruntime(special, {k: v for k, v in feeds.items() if k != "axes"})
    np.testing.assert_array_equal(got, expected)


# --- the recipe, the API and the CLI ---------------------------------------------------------------------------


def test_recipe_constants_take_numbers_lists_and_npy_files(model_file, tmp_path):
    np.save(tmp_path / "axes.npy", np.array([2], np.int64))
    path = tmp_path / "r.yaml"
    path.write_text("model: reduce.onnx\nconstants:\n  axes: axes.npy\n  lo: -0.5\n")
    recipe = load_recipe(path)
    assert recipe.constants == {"axes": tmp_path / "axes.npy", "lo": -0.5}
    values = recipe.constant_values()
    np.testing.assert_array_equal(values["axes"], [2])
    assert recipe.to_dict()["constants"] == {"axes": str(tmp_path / "axes.npy"), "lo": -0.5}
    path.write_text("model: reduce.onnx\nconstants: {axes: [1]}\n")
    assert load_recipe(path).constants == {"axes": [1]}


@pytest.mark.parametrize(
    "text, problem",
    [
        ("constants:\n  axes: missing.npy\n", r"r\.yaml:3: constants\.axes: no such file: .*missing\.npy"),
        ("constants:\n  axes: one\n", r"r\.yaml:3: constants\.axes: expected a number, a list of numbers or a .npy"),
        ("constants:\n  axes: [1, {a: 2}]\n", r"r\.yaml:3: constants\.axes\[1\]: expected a number"),
        ("constants: [1]\n", r"r\.yaml:2: constants: expected a mapping"),
    ],
)  # fmt: skip
def test_recipe_constants_errors_name_file_line_and_key(model_file, tmp_path, text, problem):
    path = tmp_path / "r.yaml"
    path.write_text("model: reduce.onnx\n" + text)
    with pytest.raises(RecipeError, match=problem):
        load_recipe(path)


def test_recipe_constants_apply_to_onnx_models_only(tmp_path):
    (tmp_path / "m.tflite").write_bytes(b"")
    with pytest.raises(ValueError, match="constants: applies to ONNX models"):
        Recipe(model=tmp_path / "m.tflite", constants={"axes": [1]})


def test_cli_constant_overrides_the_recipe(model_file, tmp_path, capsys):
    path = tmp_path / "r.yaml"
    path.write_text("model: reduce.onnx\nconstants: {axes: [1]}\n")
    assert main(["build", str(path), "--print-config", "--constant", "axes=[2]", "--constant", "lo=-1"]) == 0
    assert "constants:\n  axes: [2]\n  lo: -1\n" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:  # argparse's usage error
        main(["build", str(path), "--constant", "axes"])
    assert e.value.code == 2


def test_compile_with_constants_builds_validates_and_runs(model_file):
    """Through the whole build: axes specialised, clip bounds kernel inputs, validated against onnxruntime
    running the model with axes fixed (rtol 1e-4, atol 1e-5, the build's validation)."""
    package = aotc.compile(model_file, constants={"axes": np.array([1])}, validate=True)
    assert all(row["ok"] for row in package.validation)
    model = package.load()
    assert [t.name for t in model.inputs] == ["x", "lo", "hi"]
    feeds = _feeds(axes=1)
    (expected,) = run_onnxruntime(_reduce_model(), feeds)
    got = model.run({k: v for k, v in feeds.items() if k != "axes"})["y"]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_the_onnx_backend_builds_per_value_of_a_shape_input(tmp_path, monkeypatch):
    """The backend builds a model that feeds axes at each run, with the run's axes as a constant, and
    caches the package by those values."""
    import aotc.api

    builds = []
    compile_ = aotc.api.compile
    monkeypatch.setattr(
        aotc.api, "compile", lambda *a, **kw: builds.append(kw["constants"]) or compile_(*a, **kw)
    )

    class Fresh(AotcBackend):
        cache_dir = tmp_path / "cache"

    rep = Fresh.prepare(_reduce_model())
    assert rep.fixed == ("axes",) and builds == [{}]  # the frontend refused the build without axes
    for axes in (1, 2, 1):
        feeds = _feeds(axes)
        (expected,) = run_onnxruntime(_reduce_model(), feeds)
        (got,) = rep.run(feeds)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    assert [b["axes"].tolist() for b in builds[1:]] == [[1], [2]]
