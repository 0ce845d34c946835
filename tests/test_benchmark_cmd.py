"""`aotc benchmark` and aotc_runtime.bench: budgets, streams, percentiles, inputs from files, --compare, and
the measured latency in the build report."""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from pathlib import Path

import aotc_runtime
import numpy as np
import pytest
from aotc_runtime.bench import Budget, benchmark, measure, model_calls

import aotc
from aotc.cli import main

ROOT = Path(__file__).resolve().parent.parent
MLP = ROOT / "recipes" / "models" / "mlp.onnx"
RESULT_KEYS = {
    "latency_ms",
    "throughput_per_s",
    "runs",
    "warmup_runs",
    "seconds",
    "streams",
    "threads",
    "concurrent_runs",
}
LATENCY_KEYS = {"p50_ms", "p90_ms", "p99_ms", "min", "max", "mean", "std"}


@pytest.fixture(scope="module")
def mlp_package(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bench") / "mlp.aotc"
    aotc.compile(MLP, output=out, validate=False, log=lambda _: None)
    return out


@pytest.fixture(scope="module")
def mlp_model(mlp_package):
    return aotc_runtime.load(str(mlp_package))


# ----------------------------------------------------------------------------- budgets and measure


def test_budget_needs_a_limit_and_checks_its_numbers():
    with pytest.raises(ValueError, match="seconds or runs"):
        Budget()
    with pytest.raises(ValueError, match="seconds"):
        Budget(seconds=float("inf"))
    with pytest.raises(ValueError, match="runs"):
        Budget(runs=-1)
    assert [b.runs for b in Budget(runs=7).split(3)] == [3, 2, 2]
    assert Budget(seconds=1.0).split(4)[0].seconds == 0.25


def test_runs_budget_counts_runs_of_all_streams_together():
    counts = [0, 0, 0]

    def call_for(i):
        def call():
            counts[i] += 1

        return call

    result = measure([call_for(i) for i in range(3)], Budget(runs=30), warmup=Budget(runs=6), threads=2)
    assert result.runs == 30 and sum(counts) == 36 and result.warmup_runs == 6
    assert (result.streams, result.threads, result.concurrent_runs) == (3, 2, 3)


def test_streams_run_concurrently_in_their_own_threads():
    seen: set[int] = set()
    inside = threading.Barrier(2, timeout=5)  # passes only when both streams are in a call at once

    def call():
        seen.add(threading.get_ident())
        inside.wait()

    measure([call, call], Budget(runs=4), warmup=Budget(runs=0))
    assert len(seen) == 2


def test_seconds_budget_stops_and_every_stream_runs_at_least_once():
    result = measure([lambda: time.sleep(0.002)] * 2, Budget(seconds=0.05), warmup=Budget(seconds=0.0))
    assert result.runs >= 2 and result.warmup_runs == 0
    assert result.runs < 200  # 0.05 s of 2 ms calls on two streams, not an endless loop


def test_percentiles_are_monotone_and_statistics_consistent():
    rng = np.random.default_rng(0)
    delays = iter(rng.exponential(0.0005, 200).tolist())
    result = measure([lambda: time.sleep(next(delays))], Budget(runs=150), warmup=Budget(runs=0))
    lat = result.to_dict()["latency_ms"]
    assert lat["min"] <= lat["p50_ms"] <= lat["p90_ms"] <= lat["p99_ms"] <= lat["max"]
    assert lat["min"] <= lat["mean"] <= lat["max"]
    qs = [result.percentile(q) for q in range(0, 101, 5)]
    assert qs == sorted(qs)
    assert result.throughput == pytest.approx(result.runs / result.seconds)


def test_an_error_in_a_stream_reaches_the_caller():
    def broken():
        raise RuntimeError("kernel failed")

    with pytest.raises(RuntimeError, match="kernel failed"):
        measure([lambda: None, broken], Budget(seconds=30), warmup=Budget(runs=0))


# ----------------------------------------------------------------------------- a loaded model


def test_benchmark_of_a_model_gives_each_stream_its_own_outputs(mlp_model):
    calls = model_calls(mlp_model, None, 2)
    assert len(calls) == 2
    result = benchmark(mlp_model, budget=Budget(runs=20), warmup=Budget(runs=2), streams=2, num_threads=1)
    data = result.to_dict()
    assert set(data) == RESULT_KEYS and set(data["latency_ms"]) == LATENCY_KEYS
    assert (data["runs"], data["streams"], data["threads"]) == (20, 2, 1)
    assert 1 <= data["concurrent_runs"] <= 2


def test_result_says_how_many_calls_the_model_ran_at_once(mlp_package):
    budget, none = Budget(runs=6), Budget(runs=0)
    serial = aotc_runtime.load(str(mlp_package), max_concurrency=1)
    assert benchmark(serial, budget=budget, warmup=none, streams=2).concurrent_runs == 1
    two = aotc_runtime.load(str(mlp_package), max_concurrency=2)
    assert benchmark(two, budget=budget, warmup=none, streams=3).concurrent_runs == 2
    assert benchmark(two, budget=budget, warmup=none, streams=1).concurrent_runs == 1


def test_benchmark_checks_inputs_before_timing(mlp_model):
    with pytest.raises(ValueError, match="input 'input'"):
        benchmark(mlp_model, {"input": np.zeros((2, 64), np.float32)}, budget=Budget(runs=1))
    with pytest.raises(ValueError, match="streams"):
        benchmark(mlp_model, budget=Budget(runs=1), streams=0)


def test_compiled_model_benchmark_keeps_its_keys_and_adds_percentiles(mlp_model):
    stats = mlp_model.benchmark(repeat=4, number=3, warmup=1)
    assert (stats["repeat"], stats["number"], stats["runs"]) == (4, 3, 12)
    assert stats["min_ms"] <= stats["median_ms"] <= stats["max_ms"]
    assert stats["latency_ms"]["p50_ms"] <= stats["latency_ms"]["p99_ms"]


# ----------------------------------------------------------------------------- the command


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["benchmark", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_json_schema(mlp_package, capsys):
    code, out, _ = run_cli(
        capsys, mlp_package, "--runs", "40", "--warmup", "3", "--streams", "2", "--threads", "1", "--json"
    )
    assert code == 0
    report = json.loads(out)
    assert {"package", "cpu", "threads", "streams", "inputs", "results"} <= set(report)
    assert report["inputs"] == {"input": "random (seed 0)"}
    result = report["results"]["aotc"]
    assert set(result) == RESULT_KEYS and set(result["latency_ms"]) == LATENCY_KEYS
    assert (result["runs"], result["warmup_runs"], result["streams"], result["threads"]) == (40, 3, 2, 1)


def test_cli_text_output(mlp_package, capsys):
    code, out, _ = run_cli(capsys, mlp_package, "--duration", "50ms", "--warmup", "0")
    assert code == 0
    assert "p50 ms" in out and "p99 ms" in out and "inf/s" in out and "\naotc " in out


def test_inputs_from_npz_npy_and_raw_files(mlp_package, tmp_path, capsys):
    x = np.random.default_rng(3).standard_normal((1, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.savez(tmp_path / "x.npz", input=x)
    x.tofile(tmp_path / "x.bin")
    for args, source in (
        (["--input", f"input={tmp_path / 'x.npy'}"], str(tmp_path / "x.npy")),
        (["--input", f"input={tmp_path / 'x.bin'}"], str(tmp_path / "x.bin")),
        (["--inputs", tmp_path / "x.npz"], f"{tmp_path / 'x.npz'}[input]"),
    ):
        code, out, err = run_cli(capsys, mlp_package, *args, "--runs", "5", "--warmup", "0", "--json")
        assert code == 0, err
        assert json.loads(out)["inputs"] == {"input": source}


def test_input_file_errors_name_the_input(mlp_package, tmp_path, capsys):
    np.zeros(63, np.float32).tofile(tmp_path / "short.bin")
    np.save(tmp_path / "wrong.npy", np.zeros((1, 64), np.float64))
    np.savez(tmp_path / "other.npz", pixels=np.zeros((1, 64), np.float32))
    cases = (
        (["--input", f"input={tmp_path / 'short.bin'}"], "input 'input'.*252 bytes, expected 256"),
        (
            ["--input", f"input={tmp_path / 'wrong.npy'}"],
            "input 'input'.*expected float32\\[1, 64\\], got float64",
        ),
        (["--inputs", tmp_path / "other.npz"], "unknown input 'pixels'"),
        (["--input", f"nope={tmp_path / 'short.bin'}"], "unknown input 'nope'"),
        (["--input", f"input={tmp_path / 'missing.npy'}"], "cannot read .*missing.npy"),
        (["--input", "input"], "expected NAME=FILE"),
    )
    for args, message in cases:
        code, _, err = run_cli(capsys, mlp_package, *args, "--runs", "1")
        assert code == 2, (args, err)
        assert re.search(message, err), (message, err)


def test_bad_durations_are_usage_errors(mlp_package, capsys):
    for args in (["--duration", "0s"], ["--duration", "soon"], ["--warmup", "-1"], ["--streams", "0"]):
        with pytest.raises(SystemExit) as exit_:
            main(["benchmark", str(mlp_package), *args])
        assert exit_.value.code == 2
    capsys.readouterr()


def test_compare_with_onnxruntime_on_the_same_inputs(mlp_package, capsys):
    code, out, err = run_cli(
        capsys, mlp_package, "--compare", MLP, "--runs", "50", "--warmup", "2", "--threads", "1", "--json"
    )
    assert code == 0, err
    report = json.loads(out)
    names = list(report["results"])
    assert names[0] == "aotc" and names[1].startswith("onnxruntime ")
    assert all(r["runs"] == 50 and r["threads"] == 1 for r in report["results"].values())
    c = report["compare"]
    assert c["model"] == str(MLP) and c["runtime"] == names[1]
    p50 = {n: r["latency_ms"]["p50_ms"] for n, r in report["results"].items()}
    assert c["p50_ratio"] == pytest.approx(p50[names[1]] / p50["aotc"])
    code, out, _ = run_cli(capsys, mlp_package, "--compare", MLP, "--runs", "10", "--warmup", "0")
    assert code == 0 and "/ aotc: p50 latency" in out and "alternating blocks" in out


def test_compare_refuses_a_model_with_other_inputs(mlp_package, tmp_path, capsys):
    import onnx

    other = tmp_path / "other.onnx"
    m = onnx.load(str(MLP))
    m.graph.input[0].name = "renamed"
    for node in m.graph.node:
        node.input[:] = ["renamed" if i == "input" else i for i in node.input]
    onnx.save(m, str(other))
    code, _, err = run_cli(capsys, mlp_package, "--compare", other, "--runs", "1")
    assert code == 2 and "renamed" in err and "package's" in err


# ----------------------------------------------------------------------------- the build report


def test_build_report_has_the_measured_latency_next_to_the_estimate(mlp_package):
    directory = mlp_package.parent / "mlp.report"
    report = json.loads((directory / "report.json").read_text())
    measured = report["measured_latency"]
    assert set(measured) == RESULT_KEYS and measured["runs"] >= 1
    assert measured["threads"] == len(os.sched_getaffinity(0))  # the host target: every core it may use
    lat = measured["latency_ms"]
    assert 0 < lat["min"] <= lat["p50_ms"] <= lat["p99_ms"]
    md = (directory / "report.md").read_text()
    estimate = md.index("- estimated end-to-end latency:")
    assert md.index(f"- measured end-to-end latency: p50 {lat['p50_ms']:.4f} ms") > estimate


def test_measure_package_at_the_target_threads_or_says_why_not(mlp_package, monkeypatch):
    from aotc.report import format_markdown, measure_package
    from aotc.target import parse_target

    measured = measure_package(mlp_package, parse_target("llvm -num-cores=1"))
    assert measured["threads"] == 1 and measured["runs"] >= 1
    monkeypatch.setenv("AOTC_REQUIRE_SIGNATURE", "1")  # an unsigned package does not load under this policy
    skipped = measure_package(mlp_package, parse_target("llvm"))
    assert set(skipped) == {"skipped"} and "signature" in skipped["skipped"]
    report = {"package": "p.aotc", "model": "m.onnx", "target": "llvm", "seconds": 1.0, "tasks": []}
    assert "measured end-to-end latency: not measured on this host (" in format_markdown(
        {**report, "measured_latency": skipped}
    )


def test_compare_names_the_missing_reference_runtime(mlp_package, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if not installed
    code, _, err = run_cli(capsys, mlp_package, "--compare", MLP, "--runs", "1")
    assert code == 1 and "needs onnxruntime" in err and "aotc[validate]" in err
