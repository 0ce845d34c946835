"""Whole models built for GPU targets through `aotc.compile` (issue 16): a ResNet-style CNN and a
transformer encoder built for `opencl` run on PoCL and match onnxruntime; an `opencl` build tunes on PoCL
(its timings say nothing about a GPU); a `cuda` build with a tuning budget on a machine without a GPU
warns and writes the untuned package; the GPU measurer catches a wrong kernel.
"""

from __future__ import annotations

import json
import logging

import aotc_runtime
import numpy as np
import onnx
import pytest

import aotc
from aotc import te
from aotc.codegen.gpu import cuda_compiler_name, opencl_device
from aotc.schedule.lower import lower
from aotc.schedule.state import Annotation, State
from aotc.search.common import ErrorCode
from aotc.search.measure import MeasureOptions, Measurer, device_unavailable
from aotc.search.model_tuning import TuningOptions
from aotc.target import parse_target
from aotc.topi import nn
from recipes.zoo.onnx_models import mlp, resnet18, save, transformer_encoder
from tests.onnx_util import run_onnxruntime

# float32 kernels against onnxruntime: a 20-conv network and two attention layers with erf and softmax
RTOL = 1e-4

needs_opencl = pytest.mark.skipif(
    opencl_device() is None,
    reason="no OpenCL platform (pip install pyopencl; apt-get install pocl-opencl-icd)",
)


def _check_against_onnxruntime(package, model_path, inputs) -> None:
    model = aotc_runtime.load(str(package.path))
    got = model.run(inputs)
    refs = run_onnxruntime(onnx.load(str(model_path)), inputs)
    for (name, out), ref in zip(got.items(), refs):
        scale = float(np.max(np.abs(ref))) or 1.0
        np.testing.assert_allclose(out, ref, rtol=RTOL, atol=RTOL * scale, err_msg=name)


@needs_opencl
def test_resnet_style_cnn_on_opencl_matches_onnxruntime(tmp_path):
    path = save(resnet18(size=32, width=8, classes=10), tmp_path / "resnet.onnx")
    package = aotc.compile(path, "opencl", output=tmp_path / "resnet.aotc")
    assert all(row["ok"] for row in package.result.validation)
    manifest = aotc_runtime.read_manifest(str(package.path))
    assert manifest["target"] == "opencl"
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    _check_against_onnxruntime(package, path, {"input": x})


@needs_opencl
def test_transformer_encoder_on_opencl_matches_onnxruntime(tmp_path):
    path = save(transformer_encoder(), tmp_path / "encoder.onnx")
    package = aotc.compile(path, "opencl", output=tmp_path / "encoder.aotc")
    x = np.random.default_rng(1).standard_normal((1, 16, 64)).astype(np.float32)
    _check_against_onnxruntime(package, path, {"x": x})


@needs_opencl
def test_opencl_build_tunes_on_pocl(tmp_path):
    path = save(mlp(), tmp_path / "mlp.onnx")
    records = tmp_path / "mlp.records.jsonl"
    # a few trials: each candidate is a PoCL compile (seconds), and this checks the path, not the search
    tuning = TuningOptions(trials=4, records=records, tophub=[str(tmp_path / "store")])
    package = aotc.compile(path, "opencl", tuning=tuning, output=tmp_path / "mlp.aotc")
    assert package.result.tuning.trials >= 4
    measured = [json.loads(line) for line in records.read_text().splitlines()]
    assert {r["target"] for r in measured} == {"opencl"}
    ok = [r for r in measured if r["error"] == 0]
    assert ok and all(min(r["costs"]) > 0 for r in ok)
    assert all(row["ok"] for row in package.result.validation)
    info = aotc_runtime.read_manifest(str(package.path))["kernels"]
    assert any(k.get("schedule") == "record" for k in info)


@pytest.mark.skipif(cuda_compiler_name() is None, reason="neither NVRTC (aotc[cuda]) nor nvcc is available")
def test_cuda_build_without_a_gpu_is_untuned_and_says_why(tmp_path, caplog):
    target = parse_target("cuda -arch=sm_90")
    if device_unavailable(target) is None:
        pytest.skip("this machine has an NVIDIA GPU: the build would tune on it")
    path = save(mlp(), tmp_path / "mlp.onnx")
    tuning = TuningOptions(trials=8, tophub=[str(tmp_path / "store")])
    with caplog.at_level(logging.WARNING, logger="aotc.build"):
        package = aotc.compile(path, str(target), tuning=tuning, output=tmp_path / "mlp.aotc")
    assert "measures candidates on the device, and this machine has none" in caplog.text
    assert "validation skipped: this machine has no cuda device" in caplog.text
    assert package.result.validation is None
    assert package.result.tuning is None
    manifest = aotc_runtime.read_manifest(str(package.path))
    assert manifest["target"] == "cuda -arch=sm_90"
    assert {k["schedule"] for k in manifest["kernels"]} == {"default"}
    assert "skipped" in json.loads((package.result.report / "report.json").read_text())["measured_latency"]


def check_measurer_times_right_kernels_and_catches_wrong_ones(target: str) -> None:
    """A relu kernel measured on `target`'s device gets three costs; one that doubles instead is
    WRONG_ANSWER."""
    x = te.placeholder((300,), name="x")
    dag = te.ComputeDAG([nn.relu(x)])

    def bound(state: State, stage: str) -> State:
        state = state.split(stage, 0, [64])
        return state.bind(stage, 0, Annotation.BLOCK_X).bind(stage, 1, Annotation.THREAD_X)

    right = lower(bound(State.initial(dag), "relu"), "k")
    y = te.placeholder((300,), name="x")
    wrong_dag = te.ComputeDAG([te.compute((300,), lambda i: y[i] * 2.0, "double")])
    wrong = lower(bound(State.initial(wrong_dag), "double"), "k")
    with Measurer(dag, target, MeasureOptions(n_build_workers=1, min_repeat_ms=1)) as measurer:
        ok, bad = measurer.measure_funcs([right, wrong])
    assert ok.error == ErrorCode.NO_ERROR and len(ok.costs) == 3 and min(ok.costs) > 0
    assert bad.error == ErrorCode.WRONG_ANSWER, bad.error_msg


@needs_opencl
def test_gpu_measurer_times_right_kernels_and_catches_wrong_ones():
    check_measurer_times_right_kernels_and_catches_wrong_ones("opencl")


@needs_opencl
def test_each_loaded_program_runs_its_own_kernels():
    """The GPU runner loads a program per candidate; kernels once cached by id(program) ran a freed
    program's code in the next one allocated at its address (wrong answers, then heap corruption)."""
    import gc

    from aotc_runtime.gpu import open_device

    device = open_device("opencl")
    buf = device.alloc(4)
    out = np.zeros(1, np.float32)
    for i in range(4):  # each a PoCL compile; a freed program's address came back within two or three
        source = f"__kernel void k(__global float* y, long off) {{ y[off] = {i}.0f; }}"
        program = device.load_program(source)
        device.launch(program, "k", (1, 1, 1), (1, 1, 1), [(buf, 0)])
        device.download(buf, out)
        assert out[0] == i
        device.unload_program(program)
        del program
        gc.collect()
    device.close()
