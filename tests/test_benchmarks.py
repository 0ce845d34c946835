"""The benchmark scripts must keep running (smoke runs on small shapes; timings are not checked)."""

import json
import pathlib
import sys

import pytest

BENCH = pathlib.Path(__file__).parent.parent / "benchmarks"


def _import(name):
    sys.path.insert(0, str(BENCH))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(BENCH))


def test_kernel_benchmark_quick_run(capsys):
    assert _import("kernels").main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "gemm 128^3" in out and "compile time" in out


def test_thread_scaling_benchmark_quick_run(capsys):
    """Every kernel of the int8 small CNN timed at 1 and 2 threads, and built with two chunk counts (whose
    outputs must agree)."""
    assert _import("thread_scaling").main(["--quick", "--chunks", "8,2"]) == 0
    out = capsys.readouterr().out
    assert "fork and join" in out and "scaling" in out and "by chunks per thread: 8:" in out


def test_search_round_benchmark_quick_run(capsys):
    """One round alone and one with two workers: they must pick the same candidates (exit status 0)."""
    assert _import("search_round").main(["--quick", "--workers", "2"]) == 0
    assert "the same candidates" in capsys.readouterr().out


def test_e2e_benchmark_quick_run(capsys, tmp_path):
    assert _import("e2e").main(["--quick", "--models", "mlp", "--keep", str(tmp_path / "kept")]) == 0
    assert "mlp" in capsys.readouterr().out
    assert (tmp_path / "kept" / "mlp.aotc").is_file()  # --keep leaves the package to profile afterwards


def test_e2e_benchmark_tflite_models_run_next_to_litert(capsys):
    assert _import("e2e").main(["--quick", "--models", "tfl_small_cnn,tfl_small_cnn_int8"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert [(r[0], r[1], r[3]) for r in rows if r[0].startswith("tfl_")] == [
        ("tfl_small_cnn", "1", "litert"),
        ("tfl_small_cnn", "2", "litert"),
        ("tfl_small_cnn_int8", "1", "litert"),
        ("tfl_small_cnn_int8", "2", "litert"),
    ]


def test_models_benchmark_quick_run_tunes_then_builds_from_the_store(tmp_path, capsys):
    """The second build finds in the store every task the tuned build has a valid record for, with the
    same kernels. A quick run gives some tasks one or two rounds (2 trials per task), so candidates that all
    time out or crash under load leave such a task with nothing to store: the second build tunes it again,
    and only it (the tuned build's report, read here, says which)."""
    assert _import("models").main(["--quick", "--models", "mlp", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    report_path = tmp_path / "mlp" / "tuned" / "mlp.report" / "report.json"
    assert str(report_path) in out
    report = json.loads(report_path.read_text())
    assert 0 < report["tuning"]["new_trials"] <= 2 * len(report["tasks"])
    unmeasured = [t["id"] for t in report["tasks"] if t["best_latency_s"] is None]
    n = len(report["tasks"])
    assert f"{n - len(unmeasured)} of {n} tasks found in the store" in out, out
    assert "same kernels as the tuned build: yes" in out, out
    if not unmeasured:  # the usual case
        assert "build from the store: 0 trials" in out, out
    else:
        assert f"left task(s) {', '.join(map(str, unmeasured))} without a valid measurement" in out, out


@pytest.mark.slow
def test_tuning_benchmark_quick_run(capsys):
    assert _import("tuning").main(["--quick"]) == 0
    assert "gemm 128^3" in capsys.readouterr().out


def test_contention_benchmark_runs_packages_next_to_onnxruntime(tmp_path, capsys):
    from aotc.build import build
    from aotc.recipe import load_recipe
    from recipes.zoo import onnx_models as example_models

    bench = _import("models")
    model = example_models.save(example_models.mlp(), tmp_path / "mlp.onnx")
    with _import("timing").private_store(tmp_path / "home"):
        package = build(load_recipe(bench.write_recipe(tmp_path / "pkg", model, "{trials: 0}"))).package
    capsys.readouterr()
    assert _import("contention").main([str(model), str(package), "--rounds", "1", "--seconds", "0.2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:-1]}
    assert set(rows) == {"onnxruntime", str(package)}
    assert len(rows[str(package)]) == 8  # idle, busy, side by side, both: latency, then ORT / latency
    assert rows["onnxruntime"][4:] == ["1.000"] * 4
    assert "side by side" in lines[-1] and "cores)" in lines[-1]  # the CPU class


@pytest.mark.slow  # two tunings of the MLP, about a minute: CI's budget goes to the other quick runs
def test_transfer_benchmark_quick_run(tmp_path, capsys):
    args = ["--model", "mlp", "--trials", "6", "--per-round", "3", "--rounds", "1", "--out", str(tmp_path)]
    assert _import("transfer").main(args) == 0
    out = capsys.readouterr().out
    assert "measured on" in out and "cores)" in out
    # the shipped store's znver3 records are left out of the source: the tasks get znver4's as transfers
    assert "znver4" in out.split("trials to come within")[1]


def test_busy_tuning_benchmark_quick_run(tmp_path, capsys):
    recipe = pathlib.Path(__file__).parent.parent / "recipes" / "mlp.yaml"
    args = [str(recipe), "--deadline", "6s", "--rounds", "1", "--out", str(tmp_path / "out")]
    assert _import("busy_tuning").main(args) == 0
    out = capsys.readouterr().out
    assert "busy/idle measured latency" in out and "cores" in out


def test_gpu_benchmark_says_what_it_needs_without_a_gpu(capsys):
    """benchmarks/gpu.py runs only where torch finds an NVIDIA GPU; elsewhere it exits 2 saying so (the
    probe asks torch only, never the CUDA driver directly)."""
    gpu = _import("gpu")
    torch, _ = gpu.probe_gpu()
    if torch is not None:
        pytest.skip("this machine has a GPU: run benchmarks/gpu.py itself")
    assert gpu.main(["--minutes", "0", "--models", "gemm"]) == 2
    assert "needs an NVIDIA GPU" in capsys.readouterr().err


def test_footprint_benchmark_quick_run(capsys):
    assert _import("footprint").main(["--quick", "--models", "mlp"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("mlp ")]
    assert [r[1] for r in rows] == ["onnxruntime", "aotc", "aotc"]
    assert [r[2] for r in rows[1:]] == ["compact", "prepacked"]
    assert all(float(r[-1].rstrip("x")) > 0 for r in rows)


def test_qdq_benchmark_quantizes_builds_and_matches_onnxruntime(capsys):
    """benchmarks/qdq.py on e2e's small CNN: quant_pre_process and quantize_static (QDQ), an untuned
    package, the accuracy check against onnxruntime and one timing round at 1 and 2 threads."""
    assert _import("qdq").main(["--quick", "--models", "small_cnn", "--samples", "2"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("small_cnn ")]
    assert [(r[1], r[2]) for r in rows] == [("uint8", "1"), ("uint8", "2")]
    assert all(r[-1] == "2/2" and float(r[-2]) <= 1.0 for r in rows)  # argmax agreement, max diff in LSB
    assert "cores)" in out and "load average before" in out and "load average after" in out


def test_qdq_benchmark_model_is_qdq_with_batch_norms_folded(tmp_path):
    import onnx

    qdq = _import("qdq")
    path = qdq.quantized_model("small_cnn", qdq.QUICK["small_cnn"], tmp_path, "int8", calibration=2)
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "Conv"} <= ops and "BatchNormalization" not in ops


def test_quietness_probes_compute_what_they_say(tmp_path):
    """The probes are real work the optimizer cannot fold: checked against numpy on small counts."""
    import numpy as np

    lib = _import("quietness").build_probes(str(tmp_path))
    chains = [np.arange(c + 1, c + 9, dtype=np.uint32) for c in range(8)]
    for _ in range(5):
        chains = [(x * np.uint32(7)) ^ x for x in chains]
    expected = chains[0]
    for x in chains[1:]:
        expected = expected ^ x
    assert lib.probe_multiply(5, 7) == int(expected[0].astype(np.int32))
    data = np.random.default_rng(0).integers(0, 256, 32 * 10, dtype=np.uint8)
    sums = (data.reshape(10, 32).sum(axis=0, dtype=np.uint64) * 3 % 256).astype(np.uint8)
    assert lib.probe_loads(data.ctypes.data, 10, 3) == int(sums[:4].view(np.int32)[0])


def test_quietness_benchmark_quick_run(tmp_path, capsys):
    """The probes timed in turns with a package (the MLP, untuned) and onnxruntime running its model."""
    import aotc

    model = pathlib.Path(__file__).parent.parent / "recipes" / "models" / "mlp.onnx"
    package = aotc.compile(model, output=tmp_path / "mlp.aotc", validate=False)
    args = ["--quick", "--package", str(package.path), "--compare", str(model)]
    assert _import("quietness").main(args) == 0
    out = capsys.readouterr().out
    assert "slow rounds: the slowest 40% of mlp.aotc's" in out
    for name in ("multiply chains", "256 KB buffer", "128 MB streamed", "mlp.aotc", "onnxruntime"):
        assert name in out


def test_dot_peak_loop_computes_the_instruction(capsys):
    """The peak loop runs the host's widest int8 form on its factors (checked against numpy where that is
    vpdpbusd, whose accumulator is its own operand), and the script prints its rates and a model's bound."""
    import ctypes

    import numpy as np

    from aotc.ir.dot import dot_forms
    from aotc.target import host_target

    dot_peak = _import("dot_peak")
    forms = dot_forms(host_target())
    if not forms:
        pytest.skip("this host has no int8 dot-product form")
    assert dot_peak.main(["--macs", "1.85"]) == 0
    out = capsys.readouterr().out
    assert f"form {forms[0].name}" in out and "G multiply-adds/s" in out and "take at least" in out
    vnni = next((f for f in forms if f.name == "vnni"), None)
    if vnni is None:
        return
    engine, run = dot_peak.compiled_loop(dot_peak.loop_ir(vnni))
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, 4 * vnni.lanes, dtype=np.uint8)
    b = rng.integers(-128, 128, 4 * vnni.lanes, dtype=np.int8)
    ctypes.memmove(engine.get_global_value_address("a"), a.ctypes.data, a.nbytes)
    ctypes.memmove(engine.get_global_value_address("b"), b.ctypes.data, b.nbytes)
    lane0 = int(a[:4].astype(np.int64) @ b[:4].astype(np.int64))
    assert run(5) == dot_peak.CHAINS * 5 * lane0


def test_qdq_benchmark_tunes_a_package_per_thread_count(capsys, tmp_path, monkeypatch):
    """--per-thread-tuning: one package tuned for each thread count's cores (-num-cores=t), each row timed
    with its own."""
    monkeypatch.setenv("AOTC_HOME", str(tmp_path / "home"))
    qdq = _import("qdq")
    built = []
    build = qdq.build_package

    def recording(name, model_path, workdir, trials=0, validate=True, target=""):
        built.append((trials, target))
        return build(name, model_path, workdir, trials, validate, target)

    monkeypatch.setattr(qdq, "build_package", recording)
    args = ["--quick", "--models", "small_cnn", "--samples", "1", "--trials", "4", "--per-thread-tuning"]
    assert qdq.main(args) == 0
    out = capsys.readouterr().out
    assert built == [(4, "llvm -num-cores=1"), (4, "llvm -num-cores=2")]
    assert "each package tuned for the cores it runs on" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("small_cnn ")]
    assert [r[2] for r in rows] == ["1", "2"] and all(r[-1] == "1/1" for r in rows)


def test_differing_sections_names_a_nobits_section_of_another_size(tmp_path):
    """benchmarks/models.py says which sections of two kernel libraries differ; a .bss has no bytes in
    the file, so its size is what differs."""
    import struct

    from aotc_runtime.elf import read_elf

    from aotc.codegen.module import build_module
    from aotc.ir.expr import Buffer, Load, Var, const
    from aotc.ir.stmt import BufferStore, For, ForKind, PrimFunc
    from aotc.target import parse_target

    a, b, i = Buffer("a", "float32", (8,)), Buffer("b", "float32", (8,)), Var("i")
    body = For(i, const(8), 8, ForKind.SERIAL, BufferStore(b, Load(a, (i,)) + 1.0, (i,)))
    path = tmp_path / "k.so"
    build_module([PrimFunc("k", (a, b), body)], parse_target("llvm"), str(path))
    data = bytearray(path.read_bytes())
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    nobits = [k for k in range(shnum) if struct.unpack_from("<I", data, shoff + k * shentsize + 4)[0] == 8]
    assert nobits, "the library has no NOBITS section"
    size_at = shoff + nobits[0] * shentsize + 32
    struct.pack_into("<Q", data, size_at, struct.unpack_from("<Q", data, size_at)[0] + 64)
    models = _import("models")
    same = path.read_bytes()
    name = read_elf(same).sections[nobits[0]].name  # .tbss or .bss
    assert name.endswith("bss")
    assert models.differing_sections([same], [same]) == "none (headers or layout)"
    assert models.differing_sections([same], [bytes(data)]) == name
