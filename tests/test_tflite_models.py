"""Whole TFLite models through aotc: the numpy evaluator of the imported graph and a package built by
`aotc build` both against the LiteRT interpreter. Float: rtol 1e-4, atol 1e-5. int8: within 1 LSB on
>= 99.9% of outputs and never more than 2 LSB (the LSB histogram is in the failure message).
"""

from __future__ import annotations

from pathlib import Path

import aotc_runtime
import numpy as np
import pytest

from aotc.build import build
from aotc.cli import main
from aotc.frontend.options import REQUANTIZE_CHOICES
from aotc.frontend.tflite import load_tflite
from aotc.graph.interpret import evaluate_node, run_graph
from aotc.recipe import load_recipe
from aotc.validate import compare, format_report_row, random_inputs
from recipes.zoo.tflite_models import (
    ModelBuilder,
    int8_model,
    mobilenet_blocks,
    run_litert,
    small_cnn,
    transformer_block,
)

RTOL, ATOL = 1e-4, 1e-5

FLOAT_MODELS = {
    "mobilenet_blocks": lambda: mobilenet_blocks(),
    "small_cnn": lambda: small_cnn(),
    "transformer_block": lambda: transformer_block(),
}
INT8_MODELS = {
    "small_cnn_int8": lambda: int8_model(small_cnn()),
    "mobilenet_blocks_int8": lambda: int8_model(mobilenet_blocks(blocks=3)),
    "mobilenet_blocks_int8_per_tensor": lambda: int8_model(mobilenet_blocks(), per_channel=False),
}


def input_specs(mb: ModelBuilder) -> dict[str, tuple[tuple[int, ...], str]]:
    return {mb.tensors[t].name: (mb.tensors[t].shape, mb.tensors[t].dtype) for t in mb.inputs}


def assert_close(got: dict, ref: dict, what: str) -> list[dict]:
    """The validation report of `got` against `ref`; fails with every row when an output is off."""
    report = compare(got, ref, RTOL, ATOL)
    rows = "\n".join(format_report_row(r) for r in report)
    assert all(r["ok"] for r in report), f"{what} differs from LiteRT:\n{rows}"
    return report


def write_recipe(tmp_path, name: str, data: bytes, validate: bool = False) -> str:
    (tmp_path / f"{name}.tflite").write_bytes(data)
    recipe = tmp_path / f"{name}.yaml"
    recipe.write_text(f"model: {name}.tflite\noutput: {name}.aotc\nvalidate: {str(validate).lower()}\n")
    return str(recipe)


def build_package(tmp_path, name: str, data: bytes):
    result = build(load_recipe(write_recipe(tmp_path, name, data)), log=lambda _: None)
    return aotc_runtime.load(str(result.package))


def pooled(runs: list[dict]) -> dict:
    """Outputs of several runs as one array per output (the tolerance applies to all values together)."""
    return {name: np.concatenate([r[name].reshape(-1) for r in runs]) for name in runs[0]}


@pytest.mark.parametrize("name", sorted(FLOAT_MODELS))
def test_float_model_graph_and_package_match_litert(tmp_path, name):
    mb = FLOAT_MODELS[name]()
    data = mb.build()
    specs = input_specs(mb)
    inputs = random_inputs(specs, seed=1)
    assert_close(run_graph(load_tflite(data), inputs), run_litert(data, inputs), f"{name} (numpy evaluator)")
    compiled = build_package(tmp_path, name, data)
    inputs = random_inputs(specs, seed=2)
    assert_close(compiled.run(inputs), run_litert(data, inputs), f"{name} (package)")


@pytest.mark.parametrize("name", sorted(INT8_MODELS))
def test_int8_package_equals_graph_and_each_op_matches_litert(tmp_path, name):
    """The compiled package gives the numpy evaluator's int8 values bit for bit; and every node, fed the
    interpreter's own input tensors, is within the LSB rule of the interpreter's output tensor."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    mb = INT8_MODELS[name]()
    data = mb.build()
    graph = load_tflite(data)
    inputs = random_inputs(input_specs(mb), seed=3)
    expected = run_graph(graph, inputs)
    got = build_package(tmp_path, name, data).run(inputs)
    for out, value in expected.items():
        np.testing.assert_array_equal(got[out], value, err_msg=out)

    interp = Interpreter(
        model_content=data,
        experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
        experimental_preserve_all_tensors=True,
    )
    interp.allocate_tensors()
    for t in mb.inputs:
        interp.set_tensor(t, inputs[mb.tensors[t].name])
    interp.invoke()
    index = {t.name: i for i, t in enumerate(mb.tensors)}
    checked = 0
    for node in graph.nodes:
        if (
            not all(v.is_constant or v.name in index for v in node.inputs)
            or node.outputs[0].name not in index
        ):
            continue
        args = [v.data if v.is_constant else interp.get_tensor(index[v.name]) for v in node.inputs]
        (value,) = evaluate_node(node, args)
        out = node.outputs[0].name
        assert_close({out: value}, {out: interp.get_tensor(index[out])}, f"{name}: {node.op} {node.name}")
        checked += 1
    assert checked >= len(graph.nodes) - 2


@pytest.mark.parametrize("requantize", REQUANTIZE_CHOICES)
@pytest.mark.parametrize("name", sorted(INT8_MODELS))
def test_int8_model_matches_litert_end_to_end(name, requantize):
    """The imported graph against the interpreter on 8 seeded inputs, all outputs under one rule: with
    `requantize: float` against LiteRT's default XNNPACK kernels (which requantize in float32), with
    `fixed_point` against TFLite's builtin kernels, whose fixed-point arithmetic it reproduces. (The two
    LiteRT paths differ from each other by up to 4 LSB on the per-tensor model.)"""
    mb = INT8_MODELS[name]()
    data = mb.build()
    graph = load_tflite(data, requantize=requantize)
    seeds = [random_inputs(input_specs(mb), seed=s) for s in range(8)]
    got = pooled([run_graph(graph, x) for x in seeds])
    ref = pooled([run_litert(data, x, xnnpack=requantize == "float") for x in seeds])
    assert_close(got, ref, f"{name} (numpy evaluator, requantize: {requantize})")


@pytest.mark.parametrize("requantize", REQUANTIZE_CHOICES)
def test_build_validates_an_int8_model_in_lsb(tmp_path, requantize):
    data = int8_model(small_cnn()).build()
    recipe = Path(write_recipe(tmp_path, "cnn_int8", data, validate=True))
    recipe.write_text(recipe.read_text() + f"requantize: {requantize}\n")
    result = build(load_recipe(recipe), log=lambda _: None)
    convs = [n for n in result.graph.nodes if n.op.startswith("qnn.conv2d")]
    assert convs and all(n.attrs["requantize"] == requantize for n in convs)
    (row,) = result.validation
    assert row["ok"] and row["max_lsb"] <= 2 and sum(row["lsb_histogram"].values()) == 10
    assert "LSB" in format_report_row(row)


def test_cli_validate_against_litert(tmp_path, capsys):
    data = mobilenet_blocks(size=16).build()
    recipe = write_recipe(tmp_path, "mb", data)
    assert main(["build", recipe]) == 0
    assert main(["validate", str(tmp_path / "mb.aotc"), "--model", str(tmp_path / "mb.tflite")]) == 0
    assert "max rel" in capsys.readouterr().out


def test_cli_build_refuses_bad_tflite_files(tmp_path, capsys):
    good = small_cnn().build()
    cases = {
        "truncated": (good[: len(good) // 3], "truncated.tflite"),
        "two_graphs": (small_cnn().serialize(subgraphs=2), "2 subgraphs"),
    }
    mb = ModelBuilder()
    x = mb.input((1, 4))
    mb.output(mb.op("CUSTOM", [x], custom_code="TopSecretOp", outputs=[mb.tensor((1, 4))]))
    cases["unsupported"] = (mb.serialize(), "CUSTOM(TopSecretOp)")
    for name, (data, expected) in cases.items():
        recipe = write_recipe(tmp_path, name, data)
        assert main(["build", recipe]) == 1, name
        err = capsys.readouterr().err
        assert expected in err and f"{name}.tflite" in err, err
        assert not list(tmp_path.glob(f"{name}.aotc*")) and not list(tmp_path.glob(f".{name}*"))


def test_committed_recipe_models_load_and_match_litert():
    """The example models under recipes/models (written by recipes/make_tflite_models.py) stay importable."""
    models = Path(__file__).resolve().parent.parent / "recipes" / "models"
    assert (models / "mobilenet_block.tflite").read_bytes() == mobilenet_blocks(blocks=3).build()
    for name in ("mobilenet_block", "mobilenet_block_int8"):
        path = models / f"{name}.tflite"
        assert path.stat().st_size < 300_000
        graph = load_tflite(str(path))
        inputs = random_inputs({v.name: (v.type.shape, v.type.dtype) for v in graph.inputs}, seed=4)
        data = path.read_bytes()
        assert_close(run_graph(graph, inputs), run_litert(data, inputs, xnnpack=name.endswith("block")), name)
