"""Latency while another process keeps one core busy: packages against onnxruntime at 2 threads.

    python benchmarks/contention.py MODEL.onnx PACKAGE.aotc [PACKAGE.aotc ...] [--rounds 5]

A deployed model seldom has the machine to itself. The packages and onnxruntime take turns (each the
best of `--rounds` medians), first on an idle machine, then with a busy process pinned to the last
core (a single-threaded numpy matmul loop, started before and stopped after the measurement). Prints
each latency and ORT / package in both conditions (> 1: the package is faster); the packages should
be builds of MODEL.onnx.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aotc_runtime
from models import interleaved_ms, ort_runner, package_runner

from aotc.validate import random_inputs

BUSY_LOOP = """
import os, numpy as np
os.sched_setaffinity(0, {%d})
a = np.ones((256, 256), np.float32)
while True:
    a = (a @ a) * np.float32(1e-3)
"""


@contextmanager
def busy_core(cpu: int) -> Iterator[None]:
    """A child process that keeps `cpu` busy while the block runs."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    child = subprocess.Popen([sys.executable, "-c", BUSY_LOOP % cpu], env=env)
    try:
        time.sleep(0.5)
        if child.poll() is not None:
            raise RuntimeError(f"the busy process on cpu {cpu} exited with status {child.returncode}")
        yield
    finally:
        child.kill()
        child.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", type=Path, help="the ONNX model the packages were built from")
    ap.add_argument("packages", type=Path, nargs="+")
    ap.add_argument("--rounds", type=int, default=5, help="medians per runner and condition (default 5)")
    args = ap.parse_args(argv)
    for p in [args.model, *args.packages]:
        if not p.exists():
            ap.error(f"{p}: no such file")
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        ap.error("needs at least 2 cores")
    specs = aotc_runtime.load(str(args.packages[0])).inputs
    inputs = random_inputs({t.name: (tuple(t.shape), t.dtype) for t in specs}, seed=0)
    runners = {"onnxruntime": ort_runner(args.model, inputs)}
    runners.update({str(p): package_runner(p, inputs) for p in args.packages})
    idle = interleaved_ms(runners, args.rounds)
    with busy_core(cpus[-1]):
        busy = interleaved_ms(runners, args.rounds)
    width = max(len(k) for k in runners)
    print(f"{'':<{width}}  {'idle ms':>8}  {'busy ms':>8}  {'ORT/x idle':>10}  {'ORT/x busy':>10}")
    for name in runners:
        ratios = [t["onnxruntime"] / t[name] for t in (idle, busy)]
        print(f"{name:<{width}}  {idle[name]:8.3f}  {busy[name]:8.3f}  {ratios[0]:10.3f}  {ratios[1]:10.3f}")
    print(f"busy: a single-threaded matmul loop pinned to cpu {cpus[-1]}; all runners at 2 threads")
    return 0


if __name__ == "__main__":
    sys.exit(main())
