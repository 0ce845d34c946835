"""Timing shared by the benchmarks: the median over batches long enough to swamp timer noise."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from aotc.target import cpu_class  # noqa: F401 - the benchmarks' CPU class lives where `aotc benchmark` uses it


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


@contextmanager
def private_store(home: Path, shipped: str | None = "none") -> Iterator[None]:
    """Builds inside see only the store under `home` and, as the shipped store, `shipped`: `AOTC_HOME`
    set, `AOTC_TOPHUB` unset and by default the shipped `aotc/tophub/` left out (so the first build tunes
    from scratch; `shipped=None` keeps it, as a fresh install has it)."""
    saved = {k: os.environ.get(k) for k in ("AOTC_HOME", "AOTC_TOPHUB", "AOTC_SHIPPED_TOPHUB")}
    os.environ["AOTC_HOME"] = str(home)
    os.environ.pop("AOTC_TOPHUB", None)
    if shipped is not None:
        os.environ["AOTC_SHIPPED_TOPHUB"] = shipped
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


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
