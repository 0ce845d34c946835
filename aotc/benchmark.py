"""`aotc benchmark`: time a package (warm-up, duration or run count, threads, concurrent streams) on inputs
from files or seeded random ones, and with `--compare` the source model under onnxruntime (LiteRT for
.tflite) in the same process, on the same inputs and threads, in alternating blocks.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from aotc_runtime.bench import (
    DEFAULT_DURATION,
    DEFAULT_WARMUP,
    BenchmarkResult,
    Budget,
    combine,
    concurrent_runs,
    measure,
    model_calls,
)

MAX_STREAMS = 256
MAX_RUNS = 10**9
COMPARE_BLOCKS = 5
"""Blocks per runtime with --compare: a slow drift of the machine (another process, the clock) falls on
both runtimes alike."""

_SECONDS = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m)")


# ----------------------------------------------------------------------------- argument types


def parse_seconds(text: str) -> float:
    """An argparse type: a positive duration, `10s`, `500ms`, `2m` or a plain number of seconds."""
    m = _SECONDS.fullmatch(text.strip())
    try:
        value = float(text) if m is None else float(m[1]) * {"ms": 1e-3, "s": 1.0, "m": 60.0}[m[2]]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a duration like 10s, 500ms or 2m, got {text!r}") from None
    if not (math.isfinite(value) and 0 < value <= 86400):
        raise argparse.ArgumentTypeError(f"expected a duration from 1ms to 24h, got {text!r}")
    return value


def parse_warmup(text: str) -> Budget:
    """An argparse type: a warm-up of N runs (`20`, `0` for none) or of a duration (`2s`, `500ms`)."""
    if text.strip().isdigit():
        runs = int(text)
        if runs > MAX_RUNS:
            raise argparse.ArgumentTypeError(f"expected at most {MAX_RUNS} warm-up runs, got {runs}")
        return Budget(runs=runs)
    return Budget(seconds=parse_seconds(text))


def add_benchmark_parser(subparsers) -> None:
    """Register `aotc benchmark` on the `aotc` command's subparsers."""
    from aotc.cli import MAX_SEED, MAX_THREADS, add_trust_arguments, bounded_int

    p = subparsers.add_parser(
        "benchmark",
        help="time a package: latency percentiles and throughput, optionally next to onnxruntime/LiteRT",
        description="Warm up, then run the package for a duration or a number of runs from concurrent "
        "streams; print latency p50/p90/p99/min/max/mean and throughput.",
    )
    p.add_argument("package", type=Path)
    p.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME=FILE",
        help="an input from FILE.npy, or from a raw file read as the input's dtype and shape (its size "
        "checked); repeatable. Inputs given nowhere get seeded random values",
    )
    p.add_argument("--inputs", type=Path, metavar="FILE.npz", help="inputs by name from an .npz file")
    p.add_argument(
        "--warmup",
        type=parse_warmup,
        default=DEFAULT_WARMUP,
        metavar="N|DURATION",
        help=f"warm-up runs (20) or time (2s, 500ms) before timing (default {DEFAULT_WARMUP})",
    )
    p.add_argument(
        "--duration",
        type=parse_seconds,
        metavar="DURATION",
        help=f"timed wall time, e.g. 10s (default {DEFAULT_DURATION} when --runs is not given either)",
    )
    p.add_argument(
        "--runs", type=bounded_int(1, MAX_RUNS), metavar="N", help="timed runs, all streams together"
    )
    p.add_argument(
        "--threads",
        type=bounded_int(1, MAX_THREADS),
        metavar="N",
        help="threads per call (default: the cores this process may run on)",
    )
    p.add_argument(
        "--streams",
        type=bounded_int(1, MAX_STREAMS),
        default=1,
        metavar="N",
        help="concurrent callers, each with its own outputs (default 1)",
    )
    p.add_argument(
        "--seed", type=bounded_int(0, MAX_SEED), default=0, help="seed of random inputs (default 0)"
    )
    p.add_argument(
        "--compare",
        type=Path,
        metavar="MODEL",
        help="also time this .onnx (onnxruntime) or .tflite (LiteRT) model on the same inputs and threads, "
        f"in {COMPARE_BLOCKS} alternating blocks each",
    )
    p.add_argument("--json", action="store_true", help="print the results as one JSON document")
    add_trust_arguments(p)


def cmd_benchmark(args: argparse.Namespace) -> int:
    """Run `aotc benchmark` and print its table (or JSON)."""
    from aotc.cli import load_package
    from aotc.target import cpu_class

    budget = (
        DEFAULT_DURATION if args.duration is None and args.runs is None else Budget(args.duration, args.runs)
    )
    model = load_package(args)
    threads = model.num_threads if args.threads is None else args.threads
    inputs, sources = load_inputs(model.inputs, args.input, args.inputs, args.seed)
    calls = model_calls(model, inputs, args.streams, threads)
    results: dict[str, BenchmarkResult] = {}
    if args.compare is None:
        results["aotc"] = measure(calls, budget, args.warmup, threads, concurrent_runs(model))
    else:
        name, peer = peer_calls(args.compare, inputs, args.streams, threads)
        aotc_result, peer_result = interleaved(
            [(calls, concurrent_runs(model)), (peer, args.streams)], budget, args.warmup, threads
        )
        results = {"aotc": aotc_result, name: peer_result}
    where = cpu_class()
    device = getattr(model, "device", None)
    if device is not None:  # a GPU package: its kernels ran there, the peer on this CPU
        where = f"{model.kind} device {device.name} (peer on {where})"
    report = benchmark_report(str(args.package), where, sources, results, args.compare)
    print(json.dumps(report, indent=1) if args.json else format_report(report))
    return 0


# ----------------------------------------------------------------------------- inputs


def load_inputs(
    specs: Sequence, items: Sequence[str], npz: Path | None, seed: int
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Every input of `specs` (TensorInfo) by name, and where each came from: `--input NAME=FILE`
    items (.npy, else raw bytes), the `npz` archive, else seeded random values."""
    by_name = {t.name: t for t in specs}
    inputs: dict[str, np.ndarray] = {}
    sources: dict[str, str] = {}

    def take(name: str, value: np.ndarray, source: str) -> None:
        if name not in by_name:
            raise ValueError(f"{source}: unknown input {name!r}; the package's inputs: {', '.join(by_name)}")
        if name in inputs:
            raise ValueError(f"input {name!r} is given twice ({sources[name]} and {source})")
        t = by_name[name]
        if value.dtype != t.dtype or value.shape != tuple(t.shape):
            raise ValueError(
                f"input {name!r} from {source}: expected {t.dtype}{list(t.shape)}, got {value.dtype}{list(value.shape)}"
            )
        inputs[name] = np.ascontiguousarray(value)
        sources[name] = source

    for item in items:
        name, sep, file = item.partition("=")
        if not sep or not name or not file:
            raise ValueError(f"--input {item!r}: expected NAME=FILE.npy or NAME=FILE (raw bytes)")
        if name not in by_name:
            raise ValueError(
                f"--input {item!r}: unknown input {name!r}; the package's inputs: {', '.join(by_name)}"
            )
        take(name, read_input_file(Path(file), by_name[name]), file)
    if npz is not None:
        with _opened(npz, lambda: np.load(npz, allow_pickle=False)) as archive:
            if not isinstance(archive, np.lib.npyio.NpzFile):
                raise ValueError(f"--inputs {npz}: not an .npz archive")
            for name in archive.files:
                take(name, _read(npz, lambda n=name: archive[n]), f"{npz}[{name}]")
    rng = np.random.default_rng(seed)
    for t in specs:
        if t.name not in inputs:
            inputs[t.name] = _random_array(rng, t)
            sources[t.name] = f"random (seed {seed})"
    return {t.name: inputs[t.name] for t in specs}, {t.name: sources[t.name] for t in specs}


def read_input_file(path: Path, t) -> np.ndarray:
    """An input's value from `path`: a .npy array, or else the raw bytes of exactly one `t` tensor."""
    if path.suffix.lower() == ".npy":
        return _read(path, lambda: np.load(path, allow_pickle=False))
    data = _read(path, path.read_bytes)
    expected = int(np.prod(t.shape, dtype=np.int64)) * np.dtype(t.dtype).itemsize
    if len(data) != expected:
        raise ValueError(
            f"input {t.name!r}: {path} has {len(data)} bytes, expected {expected} "
            f"({np.dtype(t.dtype)}{list(t.shape)}, raw)"
        )
    return np.frombuffer(data, t.dtype).reshape(t.shape).copy()


def _read(path: Path, read: Callable):
    try:
        return read()
    except (OSError, ValueError, EOFError) as err:
        raise ValueError(f"cannot read {path}: {err}") from None


class _opened:
    """`with` over a value read from `path` that has `close` (an NpzFile), errors naming `path`."""

    def __init__(self, path: Path, read: Callable) -> None:
        self.value = _read(path, read)

    def __enter__(self):
        return self.value

    def __exit__(self, *exc) -> None:
        close = getattr(self.value, "close", None)
        if close is not None:
            close()


def _random_array(rng: np.random.Generator, t) -> np.ndarray:
    """Seeded values like `validate`'s: uniform floats in [-1, 1), small non-negative integers, booleans."""
    dtype = np.dtype(t.dtype)
    if dtype.kind == "f":
        return rng.uniform(-1.0, 1.0, t.shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, t.shape).astype(bool)
    return rng.integers(0, 4, t.shape).astype(dtype)


# ----------------------------------------------------------------------------- the peer runtime


def peer_calls(
    model: Path, inputs: dict[str, np.ndarray], streams: int, threads: int
) -> tuple[str, list[Callable[[], object]]]:
    """The reference runtime's name and one callable per stream running `model` on `inputs` with `threads`
    intra-op threads: one shared onnxruntime session (its `run` is thread-safe), or a LiteRT interpreter
    per stream (with its default delegates, as users get it)."""
    import importlib.util

    from aotc.validate import REFERENCE_MODULES, VALIDATE_EXTRA, ReferenceUnavailable

    suffix = model.suffix.lower()
    if not model.is_file():
        raise FileNotFoundError(f"--compare {model}: no such file")
    module = REFERENCE_MODULES.get(suffix)
    if module is not None and importlib.util.find_spec(module) is None:
        raise ReferenceUnavailable(
            f"--compare {model} needs {module}, which is not installed: {VALIDATE_EXTRA}"
        )
    if suffix == ".onnx":
        return _onnxruntime_calls(model, inputs, streams, threads)
    if suffix == ".tflite":
        return _litert_calls(model, inputs, streams, threads)
    raise ValueError(f"--compare {model}: expected an .onnx or .tflite model")


def _onnxruntime_calls(model: Path, inputs: dict[str, np.ndarray], streams: int, threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    if sorted(names) != sorted(inputs):
        raise ValueError(f"--compare {model}: its inputs {names} are not the package's {list(inputs)}")
    try:
        sess.run(None, inputs)
    except Exception as err:  # noqa: BLE001 - onnxruntime's own exception types; one clear line instead
        raise ValueError(
            f"--compare {model}: onnxruntime cannot run it on the package's inputs: {err}"
        ) from None
    return f"onnxruntime {ort.__version__}", [lambda: sess.run(None, inputs)] * streams


def _litert_calls(model: Path, inputs: dict[str, np.ndarray], streams: int, threads: int):
    from ai_edge_litert.interpreter import Interpreter

    def stream_call() -> Callable[[], object]:
        interp = Interpreter(model_path=str(model), num_threads=threads)
        ins = interp.get_input_details()
        names = [d["name"] for d in ins]
        if sorted(names) != sorted(inputs):
            raise ValueError(f"--compare {model}: its inputs {names} are not the package's {list(inputs)}")
        for d in ins:
            if tuple(d["shape"]) != inputs[d["name"]].shape:
                interp.resize_tensor_input(d["index"], inputs[d["name"]].shape)
        interp.allocate_tensors()
        feeds = [(d["index"], inputs[d["name"]]) for d in ins]
        outs = [d["index"] for d in interp.get_output_details()]

        def call() -> list[np.ndarray]:
            for index, value in feeds:
                interp.set_tensor(index, value)
            interp.invoke()
            return [interp.get_tensor(i) for i in outs]

        return call

    import ai_edge_litert

    version = getattr(ai_edge_litert, "__version__", "")
    return f"LiteRT {version}".strip(), [stream_call() for _ in range(streams)]


def interleaved(
    runners: Sequence[tuple[Sequence[Callable[[], object]], int]],
    budget: Budget,
    warmup: Budget,
    threads: int,
) -> list[BenchmarkResult]:
    """Each runner's (stream calls, concurrent runs) warmed up, then timed in `COMPARE_BLOCKS` alternating
    blocks that together make `budget` for each; one combined result per runner."""
    blocks = COMPARE_BLOCKS if budget.runs is None else max(1, min(COMPARE_BLOCKS, budget.runs))
    parts = budget.split(blocks)
    done: list[list[BenchmarkResult]] = [[] for _ in runners]
    for i, part in enumerate(parts):
        for (calls, concurrent), results in zip(runners, done):
            results.append(measure(calls, part, warmup if i == 0 else Budget(runs=0), threads, concurrent))
    return [combine(r) for r in done]


# ----------------------------------------------------------------------------- output


def benchmark_report(
    package: str, cpu: str, sources: dict[str, str], results: dict[str, BenchmarkResult], compare: Path | None
) -> dict:
    """The JSON document of `aotc benchmark --json`: the package, CPU class, inputs, each runtime's
    result and, with a peer, the ratios (peer p50 / aotc p50; aotc throughput / peer's: above 1, aotc is faster)."""
    names = list(results)
    first = results[names[0]]
    report = {
        "package": package,
        "cpu": cpu,
        "threads": first.threads,
        "streams": first.streams,
        "inputs": sources,
        "results": {name: r.to_dict() for name, r in results.items()},
    }
    if compare is not None:
        peer = results[names[1]]
        report["compare"] = {
            "model": str(compare),
            "runtime": names[1],
            "blocks": COMPARE_BLOCKS,
            "p50_ratio": peer.percentile(50) / first.percentile(50),
            "throughput_ratio": first.throughput / peer.throughput if peer.throughput else math.inf,
        }
    return report


def format_report(report: dict) -> str:
    """The report as a short text table."""
    streams, threads = report["streams"], report["threads"]
    inputs = ", ".join(
        f"{n} {s}" if s.startswith("random") else f"{n} from {s}" for n, s in report["inputs"].items()
    )
    lines = [
        f"{report['package']} on {report['cpu']}",
        f"{threads} thread{'s' * (threads != 1)} per call, {streams} stream{'s' * (streams != 1)}; inputs: {inputs}",
    ]
    width = max(len(n) for n in report["results"])
    head = f"{'':<{width}}  {'runs':>8}  {'p50 ms':>9}  {'p90 ms':>9}  {'p99 ms':>9}  {'min ms':>9}  {'max ms':>9}  {'mean ms':>9}  {'inf/s':>10}"
    lines += ["", head]
    for name, r in report["results"].items():
        lat = r["latency_ms"]
        cells = "  ".join(f"{lat[k]:9.4f}" for k in ("p50_ms", "p90_ms", "p99_ms", "min", "max", "mean"))
        lines.append(f"{name:<{width}}  {r['runs']:>8}  {cells}  {r['throughput_per_s']:10.1f}")
    first = next(iter(report["results"].values()))
    if first["concurrent_runs"] < streams:
        lines.append(
            f"(the package ran {first['concurrent_runs']} call at a time: latency includes waiting for it)"
        )
    if "compare" in report:
        c = report["compare"]
        lines.append(
            f"{c['runtime']} / aotc: p50 latency {c['p50_ratio']:.2f}x, aotc / {c['runtime'].split()[0]} "
            f"throughput {c['throughput_ratio']:.2f}x (above 1: aotc is faster); "
            f"{c['blocks']} alternating blocks each"
        )
    return "\n".join(lines)
