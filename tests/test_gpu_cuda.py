"""On a real NVIDIA GPU (issue 16, marked `gpu`; each test skips with the reason where no CUDA GPU answers):
sampled GPU programs of every search workload run through the CUDA driver and match numpy in float64;
a ResNet-style CNN and a transformer encoder built for the device's arch match onnxruntime; a `cuda`
build tunes on the GPU; the GPU measurer catches a wrong kernel. The driver is first asked in a child
process, because without a GPU it can fail or hang.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import aotc_runtime
import numpy as np
import onnx
import pytest

import aotc
from aotc.codegen.gpu import GPUModule, compile_cuda, emit_gpu, gpu_source
from aotc.schedule.lower import lower
from aotc.search.model_tuning import TuningOptions
from aotc.target import parse_target
from aotc.te.reference import evaluate
from recipes.zoo.onnx_models import mlp, resnet18, save, transformer_encoder
from tests.onnx_util import run_onnxruntime
from tests.test_gpu_build import check_measurer_times_right_kernels_and_catches_wrong_ones
from tests.test_gpu_search import WORKLOADS, sampled_states

pytestmark = pytest.mark.gpu

# float32 kernels against a float64 reference (sums of up to 288 terms, exp, division); whole models
# against onnxruntime's float32 (a 20-conv network, two attention layers)
KERNEL_RTOL = 2e-5
MODEL_RTOL = 1e-4

_PROBE = (
    "from aotc_runtime.gpu import open_device\nd = open_device('cuda')\nprint('arch', d.arch)\nd.close()\n"
)


@functools.cache
def cuda_arch() -> tuple[str | None, str]:
    """(the GPU's arch as sm_XX, "") where a CUDA GPU answers, else (None, why not)."""
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return None, "the CUDA driver probe hung"
    words = proc.stdout.split()
    if proc.returncode == 0 and words[:1] == ["arch"]:
        return words[1], ""
    return None, (proc.stderr.strip().splitlines() or ["the probe printed nothing"])[-1]


@pytest.fixture(scope="module")
def arch() -> str:
    found, why = cuda_arch()
    if found is None:
        pytest.skip(f"no CUDA GPU: {why}")
    return found


@pytest.fixture(scope="module")
def device(arch):
    from aotc_runtime.gpu import open_device

    dev = open_device("cuda")
    yield dev
    dev.close()


def run_module(device, program, module: GPUModule, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Run `module`'s kernels from the loaded `program` on `inputs`; the outputs, each first poisoned
    with NaN so that an element no kernel writes fails the comparison."""
    n_in = len(inputs)
    arrays = [np.ascontiguousarray(a, dtype=b.dtype) for a, b in zip(inputs, module.params)]
    arrays += [np.full(b.shape, np.nan, b.dtype) for b in module.params[n_in:]]
    buffers = {}
    for b, a in zip(module.params, arrays):
        buffers[id(b)] = device.alloc(max(1, a.nbytes))
        device.upload(buffers[id(b)], a)
    for b in module.workspace:
        buffers[id(b)] = device.alloc(max(1, b.num_elements * np.dtype(b.dtype).itemsize))
    try:
        for k in module.kernels:
            args = [(buffers[id(b)], 0) for b in k.params]
            device.launch(program, k.name, k.launch.grid, k.launch.block, args)
        outs = arrays[n_in:]
        for b, out in zip(module.params[n_in:], outs):
            device.download(buffers[id(b)], out)
        return outs
    finally:
        for buf in buffers.values():
            device.free(buf)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_sampled_gpu_programs_match_numpy_on_cuda(name, arch, device):
    target = parse_target(f"cuda -arch={arch}")
    dag = WORKLOADS[name]()
    states = sampled_states(dag, target, 4, seed=7)
    assert len(states) > 4, f"{name}: only {len(states) - 1} programs sampled"
    modules = [emit_gpu(lower(s, f"{name}_{i}"), target) for i, s in enumerate(states)]
    program = device.load_program(compile_cuda(gpu_source(modules, "cuda"), arch))
    rng = np.random.default_rng(16)
    inputs = {p.name: rng.uniform(-1, 1, p.shape).astype(p.dtype) for p in dag.placeholders}
    refs = evaluate(dag, inputs, float_dtype="float64")
    try:
        for state, module in zip(states, modules):
            outs = run_module(device, program, module, [inputs[p.name] for p in dag.placeholders])
            for out, ref in zip(outs, refs):
                scale = float(np.max(np.abs(ref))) or 1.0
                np.testing.assert_allclose(
                    out, ref, rtol=KERNEL_RTOL, atol=KERNEL_RTOL * scale, err_msg=str(state)
                )
    finally:
        device.unload_program(program)


def _check_against_onnxruntime(package, model_path, name: str, shape: tuple[int, ...]) -> None:
    """Three runs on fresh inputs: kernels launched one by one, then recorded as a CUDA graph, then the
    graph replayed; each matches onnxruntime."""
    model = aotc_runtime.load(str(package.path))
    rng = np.random.default_rng(0)
    try:
        for _ in range(3):
            inputs = {name: rng.standard_normal(shape).astype(np.float32)}
            got = model.run(inputs)
            refs = run_onnxruntime(onnx.load(str(model_path)), inputs)
            for (out_name, out), ref in zip(got.items(), refs):
                scale = float(np.max(np.abs(ref))) or 1.0
                np.testing.assert_allclose(
                    out, ref, rtol=MODEL_RTOL, atol=MODEL_RTOL * scale, err_msg=out_name
                )
    finally:
        model.close()


def test_resnet_style_cnn_on_cuda_matches_onnxruntime(arch, tmp_path):
    path = save(resnet18(size=32, width=8, classes=10), tmp_path / "resnet.onnx")
    package = aotc.compile(path, f"cuda -arch={arch}", output=tmp_path / "resnet.aotc")
    assert package.result.validation and all(row["ok"] for row in package.result.validation)
    _check_against_onnxruntime(package, path, "input", (1, 3, 32, 32))


def test_transformer_encoder_on_cuda_matches_onnxruntime(arch, tmp_path):
    path = save(transformer_encoder(batch=2), tmp_path / "encoder.onnx")
    package = aotc.compile(path, f"cuda -arch={arch}", output=tmp_path / "encoder.aotc")
    _check_against_onnxruntime(package, path, "x", (2, 16, 64))


def test_cuda_build_tunes_on_the_gpu(arch, tmp_path):
    path = save(mlp(), tmp_path / "mlp.onnx")
    records = tmp_path / "mlp.records.jsonl"
    tuning = TuningOptions(trials=24, records=records, tophub=[str(tmp_path / "store")])
    target = f"cuda -arch={arch}"
    package = aotc.compile(path, target, tuning=tuning, output=tmp_path / "mlp.aotc")
    assert package.result.tuning.trials >= 24
    measured = [json.loads(line) for line in records.read_text().splitlines()]
    assert {r["target"] for r in measured} == {target}
    ok = [r for r in measured if r["error"] == 0]
    assert ok and all(min(r["costs"]) > 0 for r in ok)
    assert all(row["ok"] for row in package.result.validation)
    info = aotc_runtime.read_manifest(str(package.path))["kernels"]
    assert any(k.get("schedule") == "record" for k in info)


def test_gpu_measurer_on_cuda_times_right_kernels_and_catches_wrong_ones(arch):
    check_measurer_times_right_kernels_and_catches_wrong_ones(f"cuda -arch={arch}")


def test_run_dlpack_replays_its_graph_on_new_input_values(arch, tmp_path):
    """The same input and output tensors, refilled between calls: launched, recorded, replayed; each call
    computes on the values the input holds then."""
    torch = pytest.importorskip("torch", reason="torch (a DLPack producer on the GPU) is not installed")
    path = save(mlp(batch=4), tmp_path / "mlp.onnx")
    package = aotc.compile(path, f"cuda -arch={arch}", output=tmp_path / "mlp.aotc")
    model = aotc_runtime.load(str(package.path))
    x = torch.empty((4, 64), device="cuda")
    y = torch.empty((4, 10), device="cuda")
    rng = np.random.default_rng(5)
    try:
        for _ in range(4):
            host = rng.standard_normal((4, 64)).astype(np.float32)
            x.copy_(torch.from_numpy(host))
            assert model.run_dlpack({"input": x}, outputs={"output": y})["output"] is y
            (ref,) = run_onnxruntime(onnx.load(str(path)), {"input": host})
            np.testing.assert_allclose(y.cpu().numpy(), ref, rtol=MODEL_RTOL, atol=MODEL_RTOL)
    finally:
        model.close()
