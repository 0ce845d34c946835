"""aarch64 kernels built on this host (issue 22, first slice): linked by a cross linker against the cross
C library, and, where qemu-aarch64 and the cross compiler exist, run under qemu with the matching -cpu by
a small C driver and compared with numpy. qemu's timings mean nothing; no test takes any.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from importlib import resources

import numpy as np
import pytest

from aotc import te
from aotc.codegen import llvm as codegen_llvm
from aotc.codegen.llvm import CodegenError, build_llvm_ir, link_shared
from aotc.codegen.module import build_module
from aotc.schedule.default import default_schedule
from aotc.schedule.lower import lower
from aotc.target import parse_target
from aotc.te.reference import evaluate
from aotc.topi import nn
from tests.random_schedules import random_state

SYSROOT = "/usr/aarch64-linux-gnu"
DRIVER = str(resources.files("aotc.search") / "kernel_driver.c")
CPUS = ("cortex-a72", "neoverse-n1")
RTOL = 1e-4  # float32 kernels against a float64 reference; sums of up to 288 terms

has_linker = shutil.which("ld.lld") is not None or shutil.which("aarch64-linux-gnu-ld") is not None
needs_cross = pytest.mark.skipif(
    not (has_linker and os.path.exists(f"{SYSROOT}/lib/libc.so.6")),
    reason="no aarch64 linker or C library (apt-get install lld libc6-dev-arm64-cross)",
)
needs_qemu = pytest.mark.skipif(
    shutil.which("qemu-aarch64") is None or shutil.which("aarch64-linux-gnu-gcc") is None,
    reason="no qemu-aarch64 or aarch64 cross compiler (apt-get install qemu-user gcc-aarch64-linux-gnu)",
)


def _workloads():
    a, b = te.placeholder((24, 20), name="A"), te.placeholder((20, 36), name="B")
    x, w = te.placeholder((1, 4, 10, 10), name="x"), te.placeholder((8, 4, 3, 3), name="w")
    s = te.placeholder((5, 37), name="s")
    return {
        "matmul": te.ComputeDAG([nn.matmul(a, b)]),
        "conv_relu": te.ComputeDAG([nn.relu(nn.conv2d_nchw(x, w, 1, 1))]),
        "softmax": te.ComputeDAG([nn.softmax(s)]),
    }


def _elf_machine(path: str) -> int:
    with open(path, "rb") as f:
        head = f.read(20)
    assert head[:4] == b"\x7fELF"
    return int.from_bytes(head[18:20], "little")


@needs_cross
def test_aarch64_kernels_link_for_arm(tmp_path):
    target = parse_target("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72")
    dag = _workloads()["matmul"]
    path = build_module([lower(default_schedule(dag, target), "k")], target, str(tmp_path / "k.so"))
    assert _elf_machine(path) == 183  # EM_AARCH64
    needed = subprocess.run(["readelf", "-d", path], capture_output=True, text=True).stdout
    assert "libc.so.6" in needed and "libm.so.6" in needed


def test_missing_cross_linker_names_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(codegen_llvm.shutil, "which", lambda name: None)
    codegen_llvm._link_inputs.cache_clear()
    try:
        with pytest.raises(CodegenError, match="apt-get install lld"):
            link_shared([b""], str(tmp_path / "k.so"), "aarch64")
    finally:
        codegen_llvm._link_inputs.cache_clear()


def build_driver(directory) -> str:
    """aotc.search's kernel driver cross-built for AArch64 in `directory`: runs one kernel of a library."""
    out = str(directory / "kernel_driver")
    subprocess.run(["aarch64-linux-gnu-gcc", "-O1", "-o", out, DRIVER, "-ldl"], check=True)
    return out


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    return build_driver(tmp_path_factory.mktemp("driver"))


def run_under_qemu(driver: str, lib: str, cpu: str, arrays: list[np.ndarray], workdir) -> list[np.ndarray]:
    """Every argument of kernel `k` of `lib` after one call under qemu-aarch64 -cpu `cpu`."""
    files = []
    for i, a in enumerate(arrays):
        path = str(workdir / f"arg{i}.bin")
        np.ascontiguousarray(a).tofile(path)
        files.append(path)
    proc = subprocess.run(
        ["qemu-aarch64", "-L", SYSROOT, "-cpu", cpu, driver, lib, "k", "0", "0", *files],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return [np.fromfile(f, a.dtype).reshape(a.shape) for f, a in zip(files, arrays)]


@needs_cross
@needs_qemu
@pytest.mark.parametrize("cpu", CPUS)
@pytest.mark.parametrize("name", ["matmul", "conv_relu", "softmax"])
def test_random_schedules_run_under_qemu_and_match_numpy(driver, tmp_path, name, cpu):
    _check_schedules_under_qemu(driver, tmp_path, name, cpu, seeds=(1, 2), default=True)


@pytest.mark.slow
@needs_cross
@needs_qemu
@pytest.mark.parametrize("cpu", CPUS)
@pytest.mark.parametrize("name", ["matmul", "conv_relu", "softmax"])
def test_random_schedule_sweep_under_qemu(driver, tmp_path, name, cpu):
    """The sweep (`-m slow`): 40 random schedules a workload and CPU."""
    _check_schedules_under_qemu(driver, tmp_path, name, cpu, seeds=range(100, 140))


def _check_schedules_under_qemu(driver, tmp_path, name: str, cpu: str, seeds, default: bool = False) -> None:
    target = parse_target(f"llvm -mtriple=aarch64-linux-gnu -mcpu={cpu}")
    dag = _workloads()[name]
    rng = np.random.default_rng(22)
    inputs = {p.name: rng.uniform(-1, 1, p.shape).astype(p.dtype) for p in dag.placeholders}
    refs = evaluate(dag, inputs, float_dtype="float64")
    states = [default_schedule(dag, target)] if default else []
    states += [random_state(dag, seed) for seed in seeds]
    for i, state in enumerate(states):
        lib = build_module([lower(state, "k")], target, str(tmp_path / f"k{i}.so"))
        outs = [np.zeros(o.shape, np.float32) for o in dag.outputs]
        got = run_under_qemu(driver, lib, cpu, [*inputs.values(), *outs], tmp_path)[len(inputs) :]
        for out, ref in zip(got, refs):
            scale = float(np.max(np.abs(ref))) or 1.0
            np.testing.assert_allclose(out, ref, rtol=RTOL, atol=RTOL * scale, err_msg=str(state))


@needs_cross
@needs_qemu
@pytest.mark.parametrize("case", ["conv_int8_per_channel", "conv_uint8_per_tensor", "depthwise_int8_taps"])
def test_int8_dot_products_run_under_qemu_bit_for_bit(driver, tmp_path, case):
    """An int8 conv for a CPU with FEAT_I8MM sums its products with usdot (or its by-element twin sudot),
    run under qemu -cpu max (which has it): the default schedule and two sampled programs, bit for bit."""
    from aotc.schedule.layout import apply_layouts, rewrite_layout
    from tests.test_dot_products import CASES, feed_for, quantized_dag, sampled_states, uses_instruction

    target = parse_target("llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n2 -num-cores=1")
    dag = quantized_dag(*CASES[case])
    feed = feed_for(dag)
    (expected,) = evaluate(dag, feed)
    states = [default_schedule(dag, target), *sampled_states(dag, target, 2, seed=5)]
    for i, state in enumerate(states):
        rewritten, layouts = rewrite_layout(state)
        func = lower(rewritten, "k")
        assert uses_instruction(
            codegen_llvm.compile_to_assembly(build_llvm_ir([func], target), target), "i8mm"
        )
        lib = build_module([func], target, str(tmp_path / f"k{i}.so"))
        args = apply_layouts([feed[p.name] for p in dag.placeholders], layouts)
        out = np.zeros(expected.shape, expected.dtype)
        (got,) = run_under_qemu(driver, lib, "max", [*args, out], tmp_path)[len(args) :]
        np.testing.assert_array_equal(got, expected, err_msg=f"{case} program {i}")


@needs_cross
def test_aarch64_package_builds_here_and_skips_validation_saying_why(tmp_path, caplog, monkeypatch):
    """Without the emulated Python (no folder made, no mmdebstrap to make one) the build still writes the
    package and says why it was not validated."""
    import logging
    import zipfile

    import aotc
    from aotc import emulator
    from recipes.zoo.onnx_models import mlp, save

    which = shutil.which
    monkeypatch.setattr(emulator.shutil, "which", lambda name: None if name == "mmdebstrap" else which(name))
    monkeypatch.setenv("AOTC_SYSROOT_AARCH64", str(tmp_path / "no-sysroot"))
    path = save(mlp(), tmp_path / "mlp.onnx")
    with caplog.at_level(logging.WARNING, logger="aotc.build"):
        package = aotc.compile(
            path, "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72", output=tmp_path / "m.aotc"
        )
    assert package.result.validation is None
    assert "validation skipped: the package runs on aarch64" in caplog.text
    assert "apt-get install mmdebstrap" in caplog.text
    with zipfile.ZipFile(package.path) as zf:
        (library,) = [n for n in zf.namelist() if n.endswith(".so")]
        zf.extract(library, tmp_path)
    assert _elf_machine(str(tmp_path / library)) == 183


@needs_cross
@needs_qemu
def test_measurer_runs_aarch64_candidates_under_qemu_and_catches_wrong_ones():
    """The emulated runner: candidates built for cortex-a72 run under qemu, checked against the naive
    schedule compiled for this CPU; the timings are qemu's and mean nothing."""
    from aotc.search.common import ErrorCode
    from aotc.search.measure import MeasureOptions, Measurer

    target = parse_target("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72")
    dag = _workloads()["matmul"]
    a, b = te.placeholder((24, 20), name="A"), te.placeholder((20, 36), name="B")
    wrong_dag = te.ComputeDAG([te.compute((24, 36), lambda i, j: a[i, j % 20] * 2.0 + b[i % 20, j], "wrong")])
    wrong = lower(default_schedule(wrong_dag, target), "k")
    with Measurer(dag, target, MeasureOptions(n_build_workers=1, number=2, repeat=2)) as measurer:
        ok, other = measurer.measure([default_schedule(dag, target), random_state(dag, 4)])
        (bad,) = measurer.measure_funcs([wrong])
    assert ok.error == ErrorCode.NO_ERROR and len(ok.costs) == 2 and min(ok.costs) > 0
    assert other.error == ErrorCode.NO_ERROR, other.error_msg
    assert bad.error == ErrorCode.WRONG_ANSWER, bad.error_msg


@needs_cross
@needs_qemu
def test_aarch64_build_tunes_under_qemu(tmp_path):
    import json

    import aotc
    from aotc.search.model_tuning import TuningOptions
    from recipes.zoo.onnx_models import mlp, save

    path = save(mlp(), tmp_path / "mlp.onnx")
    records = tmp_path / "records.jsonl"
    # a few trials (each candidate runs under qemu): this checks the path, not the search
    tuning = TuningOptions(trials=4, records=records, tophub=[str(tmp_path / "store")])
    target = "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"
    package = aotc.compile(path, target, tuning=tuning, output=tmp_path / "m.aotc")
    assert package.result.tuning.trials >= 4
    measured = [json.loads(line) for line in records.read_text().splitlines()]
    assert measured and all(r["error"] == 0 for r in measured)
    assert {r["target"] for r in measured} == {target}
    # qemu's timings mean nothing: labelled, kept in the build's log, out of every store
    assert {r["host"]["emulated"] for r in measured} == {"qemu-aarch64 -cpu cortex-a72"}
    from aotc.hub.store import HubError, merge_into_store, store_files, user_store_dir
    from aotc.search.records import load_records, read_record_file

    stored = [r for path in store_files(user_store_dir()) for r in read_record_file(path).records]
    assert not [r for r in stored if r.target == target]
    with pytest.raises(HubError, match="measured under qemu-aarch64 -cpu cortex-a72"):
        merge_into_store(tmp_path / "shared", load_records(records))
