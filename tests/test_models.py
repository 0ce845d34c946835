"""The example model builders: valid ONNX, runnable in onnxruntime with O(1) finite outputs, deterministic."""

import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml

from recipes.zoo import onnx_models as models

RECIPES = Path(__file__).resolve().parent.parent / "recipes"

# (builder, expected input name, input shape, output shape)
CASES = {
    "mlp": (lambda: models.mlp(batch=2), "input", (2, 64), (2, 10)),
    "small_cnn": (lambda: models.small_cnn(), "input", (1, 3, 32, 32), (1, 10)),
    "resnet18": (lambda: models.resnet18(width=16, size=64), "input", (1, 3, 64, 64), (1, 1000)),
    "mobilenet_v2": (
        lambda: models.mobilenet_v2(width_mult=0.35, size=96),
        "input",
        (1, 3, 96, 96),
        (1, 1000),
    ),
    "transformer": (lambda: models.transformer_encoder(), "x", (1, 16, 64), (1, 16, 64)),
}


def _run(model: onnx.ModelProto, name: str, shape: tuple[int, ...]) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(123).standard_normal(shape).astype(np.float32)
    (out,) = session.run(["output"], {name: x})
    return out


@pytest.mark.parametrize("case", CASES)
def test_builder_is_valid_and_runs(case):
    build, name, in_shape, out_shape = CASES[case]
    model = build()
    onnx.checker.check_model(model, full_check=True)
    assert [i.name for i in model.graph.input] == [name]
    assert [o.name for o in model.graph.output] == ["output"]
    assert model.opset_import[0].version == models.OPSET
    out = _run(model, name, in_shape)
    assert out.shape == out_shape
    assert np.isfinite(out).all()
    assert 1e-3 < float(np.abs(out).max()) < 100


@pytest.mark.parametrize("case", CASES)
def test_builder_names_are_unique(case):
    graph = CASES[case][0]().graph
    nodes = Counter(n.name for n in graph.node)
    assert all(nodes.values()) and max(nodes.values()) == 1
    values = Counter([o for n in graph.node for o in n.output] + [i.name for i in graph.initializer])
    assert max(values.values()) == 1


@pytest.mark.parametrize("case", CASES)
def test_builder_is_deterministic(case):
    build = CASES[case][0]
    assert build().SerializeToString() == build().SerializeToString()


def test_seed_changes_weights():
    assert models.mlp(seed=0).SerializeToString() != models.mlp(seed=1).SerializeToString()


def test_mlp_is_a_softmax():
    out = _run(models.mlp(batch=3), "input", (3, 64))
    np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=1e-5)


def test_operators_used():
    ops = {name: {n.op_type for n in CASES[name][0]().graph.node} for name in CASES}
    assert ops["mlp"] == {"Gemm", "Relu", "Softmax"}
    assert {"Conv", "BatchNormalization", "MaxPool", "GlobalAveragePool", "Flatten", "Gemm"} <= ops[
        "small_cnn"
    ]
    assert {"Conv", "BatchNormalization", "Add", "MaxPool", "Relu"} <= ops["resnet18"]
    assert {"Conv", "BatchNormalization", "Clip", "Add"} <= ops["mobilenet_v2"]
    assert {"LayerNormalization", "Erf", "Softmax", "Transpose", "Reshape", "MatMul", "Div"} <= ops[
        "transformer"
    ]


def test_resnet18_structure():
    graph = models.resnet18(width=8, size=32, classes=7).graph
    convs = [n for n in graph.node if n.op_type == "Conv"]
    assert len(convs) == 1 + 16 + 3
    weights = {i.name: tuple(i.dims) for i in graph.initializer}
    assert weights[convs[0].input[1]] == (8, 3, 7, 7)
    assert weights[convs[-1].input[1]][0] == 64
    assert sum(n.op_type == "Add" for n in graph.node) == 8


def test_mobilenet_v2_structure():
    graph = models.mobilenet_v2(width_mult=1.0, size=32, classes=5).graph
    depthwise = [
        n
        for n in graph.node
        if n.op_type == "Conv" and any(a.name == "group" and a.i > 1 for a in n.attribute)
    ]
    assert len(depthwise) == 17
    assert sum(n.op_type == "Add" for n in graph.node) == 10
    gemm = next(n for n in graph.node if n.op_type == "Gemm")
    assert next(tuple(i.dims) for i in graph.initializer if i.name == gemm.input[1]) == (5, 1280)


def test_make_divisible():
    assert [models._make_divisible(c * 0.35) for c in (32, 16, 24, 96, 320)] == [16, 8, 8, 32, 112]
    assert models._make_divisible(32 * 1.0) == 32


def test_save_is_atomic_and_loads_back(tmp_path):
    model = models.small_cnn()
    path = models.save(model, tmp_path / "sub" / "m.onnx")
    assert path == tmp_path / "sub" / "m.onnx"
    assert onnx.load(path).SerializeToString() == model.SerializeToString()
    assert [p.name for p in path.parent.iterdir()] == ["m.onnx"]
    models.save(models.mlp(), path)
    assert onnx.load(path).graph.name == "mlp"


def test_committed_mlp_matches_its_builder():
    committed = RECIPES / "models" / "mlp.onnx"
    assert committed.stat().st_size < 1_000_000
    assert committed.read_bytes() == models.EXAMPLES["mlp"]().SerializeToString()


def test_example_recipes_match_their_models():
    """Each recipe's inputs are exactly the graph inputs of the model make_models.py writes for it."""
    for recipe in sorted(RECIPES.glob("*.yaml")):
        r = yaml.safe_load(recipe.read_text())
        if Path(r["model"]).suffix != ".onnx":
            continue  # TFLite recipes: recipes/make_tflite_models.py and tests/test_tflite_models.py
        stem = Path(r["model"]).stem
        assert stem == recipe.stem
        graph = models.EXAMPLES[stem]().graph
        shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input}
        assert shapes == {name: spec["shape"] for name, spec in r["inputs"].items()}


def test_make_models_script(tmp_path):
    script = RECIPES / "make_models.py"
    run = subprocess.run(
        [sys.executable, script, "--out", tmp_path, "mlp", "transformer"], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp.onnx", "transformer.onnx"]
    assert (tmp_path / "mlp.onnx").read_bytes() == (RECIPES / "models" / "mlp.onnx").read_bytes()
    bad = subprocess.run([sys.executable, script, "--out", tmp_path, "nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown model(s) nope" in bad.stderr


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_full_size_examples_run(name):
    out = _run(models.EXAMPLES[name](), "input", (1, 3, 224, 224))
    assert out.shape == (1, 1000) and np.isfinite(out).all()
