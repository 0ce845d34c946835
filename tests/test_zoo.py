"""The example model builders live in recipes/zoo, beside their users, not in the installed compiler."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from recipes.zoo import onnx_models, tflite_models

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


def onnx_weight_shapes(model) -> list[tuple[int, ...]]:
    """Weight shapes of the Conv and Gemm nodes, in graph order (OIHW; depthwise C1HW)."""
    shapes = {i.name: tuple(i.dims) for i in model.graph.initializer}
    return [shapes[n.input[1]] for n in model.graph.node if n.op_type in ("Conv", "Gemm")]


def tflite_weight_shapes(mb) -> list[tuple[int, ...]]:
    """The same of the CONV_2D (OHWI), DEPTHWISE_CONV_2D (1HWC) and FULLY_CONNECTED (OI) operators."""
    layouts = {
        "CONV_2D": lambda o, h, w, i: (o, i, h, w),
        "DEPTHWISE_CONV_2D": lambda _, h, w, c: (c, 1, h, w),
        "FULLY_CONNECTED": lambda o, i: (o, i),
    }
    shapes = []
    for op in mb.ops:
        name = tflite_models.BUILTIN_OPCODE2NAME[mb.opcodes[op.opcode][0]]
        if name in layouts:
            shapes.append(layouts[name](*mb.tensors[op.inputs[1]].shape))
    return shapes


@pytest.mark.parametrize("kwargs", [{}, {"size": 96, "width_mult": 0.35, "classes": 10}])
def test_tflite_mobilenet_v2_has_the_onnx_zoo_architecture(kwargs):
    """tflite_models.mobilenet_v2 has the ONNX zoo model's convolutions (one stage table, one channel
    rounding): stem, 17 inverted residual blocks (10 with a residual ADD), 1x1 conv to 1280, classifier."""
    mb = tflite_models.mobilenet_v2(**kwargs)
    assert tflite_weight_shapes(mb) == onnx_weight_shapes(onnx_models.mobilenet_v2(**kwargs))
    ops = [tflite_models.BUILTIN_OPCODE2NAME[mb.opcodes[op.opcode][0]] for op in mb.ops]
    assert ops.count("ADD") == 10 and ops[-4:] == ["CONV_2D", "MEAN", "FULLY_CONNECTED", "SOFTMAX"]
    size, classes = kwargs.get("size", 224), kwargs.get("classes", 1000)
    last = mb.tensors[mb.ops[-4].outputs[0]].shape
    assert last == (1, size // 32, size // 32, 1280) and mb.tensors[mb.outputs[0]].shape == (1, classes)


def test_tflite_mobilenet_v2_int8_runs_in_litert():
    small = tflite_models.int8_model(tflite_models.mobilenet_v2(size=96, classes=10, width_mult=0.35))
    image = np.random.default_rng(0).integers(-128, 128, (1, 96, 96, 3), dtype=np.int8)
    (probabilities,) = tflite_models.run_litert(small.build(), [image], xnnpack=False).values()
    assert probabilities.shape == (1, 10) and probabilities.dtype == np.int8
    assert abs((probabilities.astype(int) + 128).sum() / 256 - 1) < 0.05  # SOFTMAX: scale 1/256, zp -128
