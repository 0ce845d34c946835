"""Latency when the cores are shared: packages against onnxruntime at 2 threads, in three conditions.

    python benchmarks/contention.py MODEL.onnx PACKAGE.aotc [PACKAGE.aotc ...] [--rounds 5] [--seconds 6]

A deployed model seldom has the machine to itself. Each runner (onnxruntime and every package, all at 2
threads) is timed
- idle: the runners take turns on an otherwise idle machine (each the best of `--rounds` medians);
- busy: the same with a single-threaded matmul loop pinned to the last core (the median of the medians);
- side by side: two processes of the same runner at once, each running for `--seconds` (the way a server
  runs two models, or a build measures while another job computes); the mean of the two processes'
  median latencies;
- both: side by side while the busy loop runs (more threads than cores, as on a loaded server).
Prints each latency, ORT / runner per condition (> 1: the runner is faster), and the CPU class. The
packages should be builds of MODEL.onnx.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import aotc_runtime
from models import THREADS, ort_runner, package_runner
from timing import busy_core, cpu_class, median_seconds

from aotc.validate import random_inputs

ORT = "onnxruntime"


def runners_for(model: Path, packages: list[Path]) -> dict[str, Callable[[], object]]:
    specs = aotc_runtime.load(str(packages[0])).inputs
    inputs = random_inputs({t.name: (tuple(t.shape), t.dtype) for t in specs}, seed=0)
    runners = {ORT: ort_runner(model, inputs)}
    runners.update({str(p): package_runner(p, inputs) for p in packages})
    return runners


def turns_ms(runners: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    """Per runner, `rounds` median latencies (ms), the runners taking turns."""
    out: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(rounds):
        for name, run in runners.items():
            out[name].append(median_seconds(run) * 1e3)
    return out


def serve(model: Path, packages: list[Path], name: str, seconds: float) -> None:
    """One side of a side-by-side run: load, say so, wait for the go, run for `seconds`, print latencies."""
    run = runners_for(model, packages)[name]
    run()
    print("ready", flush=True)
    sys.stdin.readline()
    samples, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        run()
        samples.append((time.perf_counter() - t) * 1e3)
    print(json.dumps(samples), flush=True)


def side_by_side_ms(model: Path, packages: list[Path], name: str, seconds: float) -> float:
    """Two processes of runner `name` at once: the mean of their median latencies (ms)."""
    cmd = [
        sys.executable,
        __file__,
        str(model),
        *map(str, packages),
        "--serve",
        name,
        "--seconds",
        str(seconds),
    ]
    procs = [
        subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(2)
    ]
    for p in procs:  # both have loaded their runner before either starts
        if p.stdout.readline().strip() != "ready":
            raise RuntimeError(f"side-by-side process for {name} exited with status {p.wait()}")
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    medians = []
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"side-by-side process for {name} exited with status {p.returncode}")
        medians.append(statistics.median(json.loads(out.splitlines()[-1])))
    return statistics.mean(medians)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", type=Path, help="the ONNX model the packages were built from")
    ap.add_argument("packages", type=Path, nargs="+")
    ap.add_argument("--rounds", type=int, default=5, help="medians per runner, idle and busy (default 5)")
    ap.add_argument("--seconds", type=float, default=6.0, help="length of a side-by-side run (default 6)")
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    for p in [args.model, *args.packages]:
        if not p.exists():
            ap.error(f"{p}: no such file")
    if args.serve:
        serve(args.model, args.packages, args.serve, args.seconds)
        return 0
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        ap.error("needs at least 2 cores")
    runners = runners_for(args.model, args.packages)
    idle = {name: min(ms) for name, ms in turns_ms(runners, args.rounds).items()}
    with busy_core(cpus[-1]):
        busy = {name: statistics.median(ms) for name, ms in turns_ms(runners, args.rounds).items()}
    del runners
    names = [ORT, *map(str, args.packages)]
    pair = {name: side_by_side_ms(args.model, args.packages, name, args.seconds) for name in names}
    with busy_core(cpus[-1]):
        crowded = {name: side_by_side_ms(args.model, args.packages, name, args.seconds) for name in names}
    width = max(len(k) for k in idle)
    conditions = {"idle": idle, "busy": busy, "side by side": pair, "both": crowded}
    head = "".join(f"  {c + ' ms':>15}" for c in conditions) + "".join(
        f"  {'ORT/x ' + c:>18}" for c in conditions
    )
    print(f"{'':<{width}}{head}")
    for name in idle:
        cells = "".join(f"  {t[name]:15.3f}" for t in conditions.values())
        cells += "".join(f"  {t[ORT] / t[name]:18.3f}" for t in conditions.values())
        print(f"{name:<{width}}{cells}")
    print(
        f"{cpu_class()}; all runners at {THREADS} threads; busy: a single-threaded matmul loop pinned to cpu "
        f"{cpus[-1]}; side by side: two processes of the same runner for {args.seconds:g} s; both: side by "
        "side with the busy loop"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
