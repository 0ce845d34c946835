"""Timing shared by the benchmarks: the median over batches long enough to swamp timer noise."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


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
