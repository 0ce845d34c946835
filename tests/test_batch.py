"""Batch sizes and concurrent runs: a workspace per concurrent call, re-batching a model in the recipe."""

from __future__ import annotations

import threading

import aotc_runtime
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import aotc
from aotc.execution_plan import merge_tasks
from aotc.frontend.batch import rebatch_size, run_by_sample
from aotc.frontend.errors import ConversionError, InputShapeError
from aotc.frontend.onnx import load_onnx
from aotc.frontend.tflite import load_tflite
from aotc.graph.interpret import run_graph
from aotc.graph.partition import extract_tasks, partition
from aotc.package import write_package
from aotc.recipe import InputSpec, Recipe, RecipeError, format_recipe, load_recipe
from recipes.zoo.tflite_models import ModelBuilder, run_litert
from tests.concurrency import failures_in_threads
from tests.test_package import SHAPE, tiny_reference, tiny_spec


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AOTC_RUNTIME_CACHE", str(tmp_path_factory.mktemp("runtime-cache")))
        yield


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    """y = relu(x + w) through a workspace buffer: calls sharing one workspace would mix their data."""
    path = str(tmp_path_factory.mktemp("batch") / "tiny.aotc")
    write_package(tiny_spec(), path)
    return path


def x_input(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(SHAPE).astype("float32")


class EntryProbe:
    """Wraps a model's entry function: counts calls inside it at once and the workspaces they use.
    With `meet`, callers wait for each other inside the entry, which only concurrent calls can do."""

    def __init__(self, fn, meet: int | None = None) -> None:
        self.fn = fn
        self.barrier = threading.Barrier(meet, timeout=60) if meet else None
        self.lock = threading.Lock()
        self.active = self.peak = 0
        self.workspaces: set[int] = set()

    def __call__(self, in_argv, out_argv, weights, workspace):
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
            self.workspaces.add(workspace.value)
        try:
            if self.barrier is not None:
                self.barrier.wait()
            return self.fn(in_argv, out_argv, weights, workspace)
        finally:
            with self.lock:
                self.active -= 1


# ----------------------------------------------------------------------------- concurrent runs


def test_many_threads_get_their_own_outputs(tiny_path):
    model = aotc_runtime.load(tiny_path, max_concurrency=4)

    def check(seed: int) -> bool:
        for k in range(50):
            x = x_input(seed * 1000 + k)
            y = model.run({"x": x}, num_threads=1 + (seed % 2))["y"]
            if not np.allclose(y, tiny_reference(x), rtol=1e-6):
                return False
        return True

    assert failures_in_threads(check, 8) == []
    assert model.call_slots.allocated <= 4


def test_two_streams_run_side_by_side_in_their_own_workspaces(tiny_path, monkeypatch):
    model = aotc_runtime.load(tiny_path, max_concurrency=2)
    probe = EntryProbe(model.variants[0].entry, meet=2)  # a serializing run would leave the barrier waiting
    monkeypatch.setattr(model.variants[0], "entry", probe)

    def check(seed: int) -> bool:
        x = x_input(seed)
        return bool(np.allclose(model.run([x])["y"], tiny_reference(x), rtol=1e-6))

    assert failures_in_threads(check, 2) == []
    assert probe.peak == 2 and model.call_slots.peak_in_use == 2
    assert len(probe.workspaces) == 2


def test_callers_beyond_max_concurrency_wait(tiny_path, monkeypatch):
    model = aotc_runtime.load(tiny_path, max_concurrency=1)
    assert model.max_concurrency == 1
    probe = EntryProbe(model.variants[0].entry)
    monkeypatch.setattr(model.variants[0], "entry", probe)

    def check(seed: int) -> bool:
        x = x_input(seed)
        return all(np.allclose(model.run([x])["y"], tiny_reference(x), rtol=1e-6) for _ in range(20))

    assert failures_in_threads(check, 4) == []
    assert probe.peak == 1 and len(probe.workspaces) == 1


def test_default_concurrency_is_the_available_cores(tiny_path):
    import os

    model = aotc_runtime.load(tiny_path)
    assert model.max_concurrency == len(os.sched_getaffinity(0))
    assert model.call_slots.allocated == 0  # workspaces are made when calls need them
    model.run([x_input(0)])
    assert model.call_slots.allocated == 1


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_max_concurrency_must_be_a_positive_int(tiny_path, bad):
    with pytest.raises(ValueError, match="max_concurrency must be an int of at least 1"):
        aotc_runtime.load(tiny_path, max_concurrency=bad)


def test_profile_uses_a_call_slot(tiny_path):
    model = aotc_runtime.load(tiny_path, max_concurrency=1)
    times = model.profile([x_input(0)], repeat=2, warmup=0)
    assert len(times) == len(model.manifest["execution_plan"])
    assert model.call_slots.in_use == 0


# ----------------------------------------------------------------------------- re-batching


def dense_model(
    batch: int | str = 1, reshape_to: tuple[int, ...] = (1, -1), head: int = 4
) -> onnx.ModelProto:
    """x[batch, 64] -> relu(x @ w + b) -> Reshape(reshape_to) -> softmax over the last axis: a model exported
    with a fixed batch whose Reshape bakes that batch in (as exporters write a flatten)."""
    rng = np.random.default_rng(0)
    weights = {
        "w": rng.standard_normal((64, 32)).astype("float32"),
        "b": rng.standard_normal(32).astype("float32"),
        "s": np.array(reshape_to, np.int64),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="dense"),
        helper.make_node("Add", ["m", "b"], ["a"], name="bias"),
        helper.make_node("Relu", ["a"], ["r"], name="relu"),
        helper.make_node("Reshape", ["r", "s"], ["f"], name="flatten"),
        helper.make_node("Softmax", ["f"], ["y"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "dense",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def per_sample_onnxruntime(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.concatenate([sess.run(None, {"x": x[i : i + 1]})[0] for i in range(len(x))])


def test_rebatch_size_only_changes_a_leading_one():
    assert rebatch_size([1, 64], (4, 64)) == 4
    assert rebatch_size([1, "n"], (4, 7)) == 4
    assert rebatch_size([1, 64], (1, 64)) is None
    assert rebatch_size([2, 64], (4, 64)) is None
    assert rebatch_size([1, 64], (4, 32)) is None
    assert rebatch_size([1, 64], (4, 64, 1)) is None


def test_a_batch_one_onnx_model_compiles_at_batch_four():
    model = dense_model()
    graph = load_onnx(model.SerializeToString(), {"x": ((4, 64), None)})
    assert graph.inputs[0].type.shape == (4, 64) and graph.outputs[0].type.shape == (4, 32)
    x = np.random.default_rng(1).standard_normal((4, 64)).astype("float32")
    got = run_graph(graph, {"x": x})["y"]
    np.testing.assert_allclose(got, per_sample_onnxruntime(model, x), rtol=1e-5, atol=1e-6)


def test_a_dynamic_batch_is_given_in_the_recipe():
    model = dense_model(batch="N", reshape_to=(-1, 32))
    graph = load_onnx(model.SerializeToString(), {"x": ((3, 64), None)})
    x = np.random.default_rng(2).standard_normal((3, 64)).astype("float32")
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(run_graph(graph, {"x": x})["y"], want, rtol=1e-5, atol=1e-6)


def test_a_reshape_that_bakes_the_batch_elsewhere_is_refused_naming_its_node():
    model = dense_model(reshape_to=(8, 4))  # [1, 32] -> [8, 4]: the batch is not the leading 1
    with pytest.raises(ConversionError, match=r"node flatten \(Reshape\).*re-batched from batch 1 to 4"):
        load_onnx(model.SerializeToString(), {"x": ((4, 64), None)})


def test_only_a_leading_one_can_be_rebatched():
    with pytest.raises(InputShapeError, match=r"contradicts the model's \[2, 64\]; only a leading"):
        load_onnx(dense_model(batch=2, reshape_to=(2, -1)).SerializeToString(), {"x": ((4, 64), None)})
    with pytest.raises(InputShapeError, match="contradicts"):
        load_onnx(dense_model().SerializeToString(), {"x": ((4, 32), None)})


def test_inputs_rebatched_to_different_sizes_are_refused():
    model = helper.make_model(
        helper.make_graph(
            [helper.make_node("Add", ["a", "b"], ["y"])],
            "add",
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 8]) for n in "ab"],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    with pytest.raises(InputShapeError, match="re-batched to 3 but input a to 2"):
        load_onnx(model.SerializeToString(), {"a": ((2, 8), None), "b": ((3, 8), None)})


def test_a_batch_one_tflite_model_compiles_at_batch_three(tmp_path):
    mb = ModelBuilder()
    x = mb.input((1, 2, 6))
    y = mb.op("RESHAPE", [x, mb.const(np.array([1, -1], np.int32))])
    mb.output(mb.op("SOFTMAX", [y], ("SoftmaxOptions", {"Beta": 1.0})))
    data = mb.build()
    path = tmp_path / "m.tflite"
    path.write_bytes(data)
    graph = load_tflite(str(path), {"input0": ((3, 2, 6), None)})
    feed = np.random.default_rng(3).standard_normal((3, 2, 6)).astype("float32")
    got = next(iter(run_graph(graph, {graph.inputs[0].name: feed}).values()))
    want = np.concatenate([next(iter(run_litert(data, [feed[i : i + 1]]).values())) for i in range(3)])
    assert got.shape == (3, 12)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_run_by_sample_runs_the_reference_at_its_own_batch():
    calls = []

    def reference(feeds):
        calls.append({n: a.shape for n, a in feeds.items()})
        return {"y": feeds["x"] * 2 + feeds["bias"]}

    x, bias = np.arange(12.0).reshape(3, 4), np.ones((1, 4))
    got = run_by_sample(reference, {"x": x, "bias": bias}, {"x": [1, 4], "bias": [1, 4]})
    np.testing.assert_array_equal(got["y"], x * 2 + 1)
    assert calls == [{"x": (1, 4), "bias": (1, 4)}] * 3
    calls.clear()
    run_by_sample(reference, {"x": x, "bias": bias}, {"x": ["n", 4], "bias": [1, 4]})
    assert calls == [{"x": (3, 4), "bias": (1, 4)}]


def test_compile_rebatches_and_validates_against_onnxruntime(tmp_path):
    path = tmp_path / "dense.onnx"
    onnx.save(dense_model(), str(path))
    pkg = aotc.compile(path, inputs={"x": [4, 64]}, output=tmp_path / "dense4.aotc", log=lambda _: None)
    assert pkg.validation and all(r["ok"] for r in pkg.validation)
    model = pkg.load()
    assert model.inputs[0].shape == (4, 64)
    x = np.random.default_rng(4).standard_normal((4, 64)).astype("float32")
    np.testing.assert_allclose(
        model.run({"x": x})["y"], per_sample_onnxruntime(dense_model(), x), rtol=1e-4, atol=1e-5
    )


# ----------------------------------------------------------------------------- several batch sizes


def test_a_recipe_lists_batch_sizes_in_position_zero(tmp_path):
    (tmp_path / "m.onnx").write_bytes(dense_model().SerializeToString())
    (tmp_path / "r.yaml").write_text("model: m.onnx\ninputs:\n  x: {shape: [[1, 4, 3], 64]}\n")
    recipe = load_recipe(tmp_path / "r.yaml")
    assert recipe.inputs["x"] == InputSpec((1, 64), None, (1, 4, 3))
    assert [v["x"].shape for v in recipe.input_variants()] == [(1, 64), (4, 64), (3, 64)]
    assert recipe.to_dict()["inputs"]["x"]["shape"] == [[1, 4, 3], 64]
    (tmp_path / "again.yaml").write_text(format_recipe(recipe))
    assert load_recipe(tmp_path / "again.yaml").inputs == recipe.inputs  # the resolved recipe loads back
    assert Recipe(tmp_path / "m.onnx", inputs={"x": [[2, 8], 64]}).inputs["x"].batch_sizes == (2, 8)


@pytest.mark.parametrize(
    "shape, message",
    [
        ("[[1, 4, 4], 64]", r"inputs.x.shape\[0\]\[2\]: batch size 4 is listed twice"),
        ("[[], 64]", r"inputs.x.shape\[0\]: a list of batch sizes needs at least one"),
        ("[[1, 0], 64]", r"inputs.x.shape\[0\]\[1\]: a batch size must be a positive integer, got 0"),
        ("[64, [1, 2]]", r"inputs.x.shape\[1\]: expected a positive integer dimension"),
    ],
)
def test_bad_batch_size_lists_are_recipe_errors(tmp_path, shape, message):
    (tmp_path / "m.onnx").write_bytes(dense_model().SerializeToString())
    (tmp_path / "r.yaml").write_text(f"model: m.onnx\ninputs:\n  x: {{shape: {shape}}}\n")
    with pytest.raises(RecipeError, match=message):
        load_recipe(tmp_path / "r.yaml")


def test_inputs_listing_different_batch_sizes_are_refused(tmp_path):
    (tmp_path / "m.onnx").write_bytes(dense_model().SerializeToString())
    text = "model: m.onnx\ninputs:\n  a: {shape: [[1, 2], 8]}\n  b: {shape: [[1, 3], 8]}\n"
    (tmp_path / "r.yaml").write_text(text)
    with pytest.raises(
        RecipeError, match=r"inputs.b.shape\[0\]: batch sizes \[1, 3\] differ from a's \[1, 2\]"
    ):
        load_recipe(tmp_path / "r.yaml")
    with pytest.raises(ValueError, match=r"inputs a and b list different batch sizes"):
        Recipe(tmp_path / "m.onnx", inputs={"a": [[1, 2], 8], "b": [[1, 3], 8]})


def two_branch_model() -> onnx.ModelProto:
    """x[1, 8] -> softmax and z[1, 8] -> relu: re-batching x leaves z's branch the same workload."""
    graph = helper.make_graph(
        [
            helper.make_node("Softmax", ["x"], ["y"], name="softmax", axis=-1),
            helper.make_node("Relu", ["z"], ["r"], name="relu"),
        ],
        "two",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 8]) for n in "xz"],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "yr"],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_tasks_of_equal_workload_across_batch_sizes_are_one_task():
    data = two_branch_model().SerializeToString()
    per_size = [
        extract_tasks(partition(load_onnx(data, {"x": ((b, 8), None), "z": ((1, 8), None)}))) for b in (1, 4)
    ]
    merged = merge_tasks(per_size)
    assert len(merged) == 3  # softmax at 1 and at 4, one relu
    (relu,) = [t for t in merged if "relu" in t.name]
    assert relu.weight == 2 and len(relu.groups) == 2


def test_one_package_holds_every_batch_size_and_runs_the_one_its_inputs_have(tmp_path):
    path = tmp_path / "dense.onnx"
    onnx.save(dense_model(), str(path))
    pkg = aotc.compile(
        path, inputs={"x": {"shape": [[1, 4, 3], 64]}}, output=tmp_path / "dense.aotc", log=lambda _: None
    )
    assert [r["variant"] for r in pkg.validation] == ["x[1, 64]", "x[4, 64]", "x[3, 64]"]
    assert all(r["ok"] for r in pkg.validation)  # each size against onnxruntime, sample by sample
    model = pkg.load()
    assert [v.describe() for v in model.variants] == ["x[1, 64]", "x[4, 64]", "x[3, 64]"]
    assert model.inputs[0].shape == (1, 64)  # the first size's, for callers that read one signature
    for batch in (1, 4, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 64)).astype("float32")
        y = model.run({"x": x})["y"]
        np.testing.assert_allclose(y, per_sample_onnxruntime(dense_model(), x), rtol=1e-4, atol=1e-5)
    with pytest.raises(
        ValueError, match=r"x\[2, 64\]; it was compiled for x\[1, 64\]; x\[4, 64\]; x\[3, 64\]"
    ):
        model.run({"x": np.zeros((2, 64), "float32")})
    with pytest.raises(ValueError, match="expected dtype float32"):
        model.run({"x": np.zeros((4, 64), "float64")})
    manifest = model.manifest
    assert manifest["weights"]["nbytes"] == 64 * 32 * 4 + 32 * 4  # the weights are stored once
    assert [v["entry"] for v in manifest["variants"]] == ["aotc_run", "aotc_run_1", "aotc_run_2"]
    assert len(model.profile([np.ones((3, 64), "float32")], repeat=1, warmup=0)) == 2
