"""Whole Arm packages under qemu (issue 22): the MLP, a MobileNet-style CNN, a narrow ResNet-18 (compact:
Winograd weights computed at load) and a transformer block (ONNX), and the TFLite float and int8 MobileNet
blocks, each built for cortex-a72 and for neoverse-n1 on this x86 host, then run under `qemu-aarch64 -cpu
<that CPU>` twice: by `aotc_runtime` in an aarch64 Python (the build's validation) and by the C runtime's
example program cross-built for AArch64 (runtime/c). Both are compared with onnxruntime / LiteRT on this
host with validation's usual tolerances (float: 1e-5 + 1e-4 |ref| + 1e-4 rms; int8: within 1 LSB). Each is
also built for 32-bit Arm (armv7a cortex-a7, hard float) and validated under qemu-arm in an armhf Python.
The emulated Pythons are made once per user with mmdebstrap (aotc/emulator.py). qemu's timings mean
nothing; no test takes any. The default run takes one CPU per model (DEFAULT_PAIRS), `-m slow` them all."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from aotc.cli import main as aotc_main
from aotc.emulator import EMULATORS, package_emulation_unavailable
from aotc.target import parse_target
from recipes.zoo import onnx_models

CPUS = ("cortex-a72", "neoverse-n1")  # AArch64, run by both runtimes
ARMV7 = "cortex-a7"  # 32-bit Arm (armhf), by the Python runtime: the C runtime runs 64-bit packages
RECIPES = Path(__file__).resolve().parents[1] / "recipes"
# name -> how to get the model file into a folder
MODELS = {
    "mlp": lambda d: onnx_models.save(onnx_models.mlp(), d / "mlp.onnx"),
    "mobilenet": lambda d: onnx_models.save(
        onnx_models.mobilenet_v2(size=32, classes=10, width_mult=0.35), d / "mobilenet.onnx"
    ),
    # Winograd convolutions in every stage: a compact package computes their weights when it loads
    "resnet_narrow": lambda d: onnx_models.save(
        onnx_models.resnet18(size=32, width=16, classes=10), d / "resnet.onnx"
    ),
    "transformer_block": lambda d: onnx_models.save(
        onnx_models.transformer_encoder(layers=1), d / "block.onnx"
    ),
    "tflite_float": lambda d: Path(shutil.copy(RECIPES / "models" / "mobilenet_block.tflite", d)),
    "tflite_int8": lambda d: Path(shutil.copy(RECIPES / "models" / "mobilenet_block_int8.tflite", d)),
}

# The default run builds each model for one CPU (every CPU at least once, the int8 blocks for the dotprod
# neoverse-n1 and the 32-bit cortex-a7); `-m slow` builds every model for every CPU.
DEFAULT_PAIRS = {
    ("mlp", "cortex-a72"),
    ("mlp", ARMV7),
    ("mobilenet", "cortex-a72"),
    ("resnet_narrow", "neoverse-n1"),
    ("transformer_block", "cortex-a72"),
    ("tflite_float", "neoverse-n1"),
    ("tflite_int8", "neoverse-n1"),
    ("tflite_int8", ARMV7),
}


def pairs(cpus: tuple[str, ...]) -> list:
    """(model, cpu) parameters over MODELS x `cpus`, those outside DEFAULT_PAIRS marked slow."""
    return [
        pytest.param(
            name, cpu, id=f"{name}-{cpu}", marks=() if (name, cpu) in DEFAULT_PAIRS else pytest.mark.slow
        )
        for name in MODELS
        for cpu in cpus
    ]


_why = package_emulation_unavailable(parse_target("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"))
pytestmark = pytest.mark.skipif(_why is not None, reason=f"no emulated aarch64 here: {_why}")


@pytest.fixture(scope="module", autouse=True)
def emulated_python():
    """The aarch64 Python, made here the first time; where Debian's archive cannot be reached, skip."""
    from aotc.emulator import EmulatorUnavailable, ensure_sysroot

    try:
        return ensure_sysroot("aarch64")
    except EmulatorUnavailable as e:
        pytest.skip(str(e))


def target(cpu: str) -> str:
    triple = "armv7a-linux-gnueabihf" if cpu == ARMV7 else "aarch64-linux-gnu"
    return f"llvm -mtriple={triple} -mcpu={cpu}"


def armv7_unavailable() -> str | None:
    """Why 32-bit Arm packages cannot be validated here (no cross tools or armhf Python), or None."""
    from aotc.emulator import EmulatorUnavailable, ensure_sysroot

    why = package_emulation_unavailable(parse_target(target(ARMV7)))
    if why is None:
        try:
            ensure_sysroot("arm")
        except EmulatorUnavailable as e:
            why = str(e)
    return why


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(model, cpu) -> (model file, package, the build's validation rows), each built once."""
    import aotc

    done: dict[tuple[str, str], tuple[Path, Path, list[dict]]] = {}

    def get(name: str, cpu: str) -> tuple[Path, Path, list[dict]]:
        if (name, cpu) not in done:
            folder = tmp_path_factory.mktemp(f"{name}-{cpu}")
            model = MODELS[name](folder)
            package = aotc.compile(model, target(cpu), output=folder / f"{name}.aotc")
            done[name, cpu] = (model, package.path, package.result.validation)
        return done[name, cpu]

    return get


@pytest.mark.parametrize(("name", "cpu"), pairs((*CPUS, ARMV7)))
def test_arm_package_matches_reference_under_qemu(built, name, cpu):
    if cpu == ARMV7 and (why := armv7_unavailable()) is not None:
        pytest.skip(f"no emulated 32-bit Arm here: {why}")
    _, _, validation = built(name, cpu)
    assert validation, "the build skipped validation"
    assert all(row["ok"] for row in validation), validation


@pytest.fixture(scope="module")
def c_runtime(tmp_path_factory) -> Path:
    """The C runtime and its example program cross-built for AArch64."""
    build = tmp_path_factory.mktemp("c-aarch64")
    proc = subprocess.run(
        ["make", "-C", str(RECIPES.parent / "runtime" / "c"), "-j2", "ARCH=aarch64", f"BUILD={build}"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return build / "run_model"


@pytest.mark.parametrize(("name", "cpu"), pairs(CPUS))
def test_aarch64_package_matches_reference_through_the_c_runtime(built, c_runtime, tmp_path, name, cpu):
    import aotc_runtime

    from aotc.validate import ATOL, RTOL, compare, random_inputs, reference_outputs

    model, package, _ = built(name, cpu)
    plan = aotc_runtime.verify_package(str(package)).plan
    inputs = random_inputs({t.name: (t.shape, t.dtype) for t in plan.inputs}, seed=1)
    files = []
    for i, t in enumerate(plan.inputs):
        files.append(str(tmp_path / f"input{i}.bin"))
        inputs[t.name].tofile(files[-1])
    emulator = EMULATORS["aarch64"]
    command = [emulator.qemu, "-L", emulator.libc_root, "-cpu", cpu, str(c_runtime), str(package)]
    proc = subprocess.run(
        [*command, *files, "-o", str(tmp_path / "out")], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    outputs = {
        t.name: np.fromfile(
            tmp_path / "out" / f"{re.sub(r'[^A-Za-z0-9._-]', '_', t.name)}.bin", t.dtype
        ).reshape(t.shape)
        for t in plan.outputs
    }
    report = compare(outputs, reference_outputs(model, inputs), RTOL, ATOL)
    assert report and all(row["ok"] for row in report), report


def test_emulated_run_and_validate_commands(built, tmp_path, capsys):
    """`aotc run --emulate` writes what the package computes under qemu; `aotc validate --emulate`
    compares it with onnxruntime."""
    model, package, _ = built("mlp", "cortex-a72")
    x = np.random.default_rng(3).standard_normal((1, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out"
    assert (
        aotc_main(
            ["run", str(package), "--emulate", "--input", f"input={tmp_path / 'x.npy'}", "--output", str(out)]
        )
        == 0
    )
    got = np.load(out / "output.npy")
    import onnxruntime as ort

    (ref,) = ort.InferenceSession(str(model)).run(None, {"input": x})
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-6)
    assert aotc_main(["validate", str(package), "--model", str(model), "--emulate"]) == 0
    assert "ok" in capsys.readouterr().out


def test_emulated_runtime_refuses_a_package_for_a_cpu_qemu_lacks(built, tmp_path):
    """A neoverse-n1 package needs LSE atomics; `-cpu cortex-a72` lacks them, and the emulated runtime
    refuses it by the CPU's hardware capabilities (not the host's /proc/cpuinfo) before running it."""
    from aotc.emulator import EmulatedModel, EmulationError

    _, package, _ = built("mlp", "neoverse-n1")
    model = EmulatedModel(package, parse_target(target("cortex-a72")))
    with pytest.raises(EmulationError, match="needs CPU features this host lacks: .*lse"):
        model.run({"input": np.zeros((1, 64), np.float32)})
