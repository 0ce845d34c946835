"""Timing shared by the benchmarks: the median over batches long enough to swamp timer noise."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def median_seconds(fn: Callable[[], object], min_seconds: float = 0.5, repeat: int = 7) -> float:
    """Median seconds per call over `repeat` batches that together take about `min_seconds`."""
    fn()
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-7)
    number = max(1, int(min_seconds / repeat / once))
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - start) / number)
    return statistics.median(samples)


def cpu_class() -> str:
    """The CPU class every figure is measured on: LLVM's name for the host CPU, its widest vector ISA,
    the model name and the cores this process may use (e.g. `znver4 (AVX-512, AMD EPYC, 2 cores)`)."""
    import llvmlite.binding as llvm

    feats = llvm.get_host_cpu_features()
    isa = "AVX-512" if feats.get("avx512f") else "AVX2" if feats.get("avx2") else "SSE/NEON"
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(
                (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model
            )
    except OSError:
        pass
    return f"{llvm.get_host_cpu_name()} ({isa}, {model}, {len(os.sched_getaffinity(0))} cores)"


BUSY_LOOP = """
import os, time, numpy as np
os.sched_setaffinity(0, {%d})
a, end = np.ones((256, 256), np.float32), time.monotonic() + %f
while time.monotonic() < end:
    a = (a @ a) * np.float32(1e-3)
"""


@contextmanager
def busy_core(cpu: int | None, seconds: float = 3600.0) -> Iterator[None]:
    """A single-threaded matmul loop pinned to `cpu` while the block runs (None: nothing); it also stops
    by itself after `seconds`."""
    if cpu is None:
        yield
        return
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    child = subprocess.Popen([sys.executable, "-c", BUSY_LOOP % (cpu, seconds)], env=env)
    try:
        time.sleep(0.5)
        if child.poll() is not None:
            raise RuntimeError(f"the busy process on cpu {cpu} exited with status {child.returncode}")
        yield
    finally:
        child.kill()
        child.wait()
