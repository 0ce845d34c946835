"""Noticing other processes during a measurement, and measuring again when they disturbed it.

A timing is disturbed when other processes took a share of the machine's CPU time while it ran (they
share cores with the kernel's threads, and a parallel kernel waits at its join for a descheduled
thread), or when its repeats disagree. `sample_cpu` snapshots the machine's busy CPU time
(`/proc/stat`, all CPUs, in clock ticks), this process's CPU time (all its threads, exact) and, where
the kernel has pressure stall information, the time some task waited for a CPU (`/proc/pressure/cpu`,
microseconds). `interference` turns two snapshots into the larger of two shares: other processes' CPU
time over the CPU time the interval offered, and the time some task waited for a CPU over the interval.

`measure_quietly` times a repeat set, and while the set is disturbed (interference above
`max_interference` or spread above `max_spread`) times it again after a short backoff, at most
`retries` times; it keeps the quietest set and returns it with its `Noise`, so a disturbed timing is
recorded with the noise it was measured under, never dropped. Retrying only helps against bursts: a
caller that sees every recent first attempt disturbed (a process that keeps a core busy for minutes)
passes `retries=0` (`Quietness`) and relies on the slice statistic of the timing itself.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from aotc.search.common import Noise

__all__ = [
    "BACKOFF_SECONDS",
    "CpuSample",
    "Quietness",
    "interference",
    "measure_quietly",
    "noise_score",
    "sample_cpu",
]

BACKOFF_SECONDS = 0.02  # before the n-th retry, n times this: lets a burst of another process pass
_TICK = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


@dataclass(frozen=True)
class CpuSample:
    """A snapshot of how busy the machine is, in seconds; nan where the system does not say."""

    wall: float  # time.perf_counter()
    own_cpu: float  # CPU time of this process, all threads
    machine_cpu: float  # busy CPU time of all CPUs together
    stall: float  # time during which some task waited for a CPU
    cpus: int  # CPUs counted in machine_cpu


def _machine_cpu() -> tuple[float, int]:
    """(busy seconds of all CPUs, number of CPUs) from /proc/stat; steal counts as busy (another guest)."""
    try:
        with open("/proc/stat", "rb") as f:
            text = f.read().decode()
    except OSError:
        return math.nan, 1
    lines = text.splitlines()
    fields = [int(v) for v in lines[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    busy = sum(fields[:8]) - idle  # user .. steal; guest time is already inside user
    cpus = sum(1 for line in lines[1:] if line.startswith("cpu"))
    return busy * _TICK, max(cpus, 1)


def _cpu_stall() -> float:
    try:
        with open("/proc/pressure/cpu", "rb") as f:
            first = f.readline().decode()
    except OSError:
        return math.nan
    for part in first.split():
        if part.startswith("total="):
            return int(part[6:]) * 1e-6
    return math.nan


def sample_cpu() -> CpuSample:
    machine, cpus = _machine_cpu()
    return CpuSample(time.perf_counter(), time.process_time(), machine, _cpu_stall(), cpus)


def interference(before: CpuSample, after: CpuSample) -> float:
    """The share (0..1) of the interval that other processes disturbed (see the module docstring)."""
    wall = after.wall - before.wall
    if wall <= 0:
        return 0.0
    shares = [0.0]
    machine = after.machine_cpu - before.machine_cpu
    if math.isfinite(machine):
        others = machine - (after.own_cpu - before.own_cpu)
        shares.append(others / (wall * max(after.cpus, 1)))
    stall = after.stall - before.stall
    if math.isfinite(stall):
        shares.append(stall / wall)
    return min(1.0, max(shares))


def spread(costs: list[float]) -> float:
    """(max - min) / min of positive costs; 0 for fewer than two."""
    if len(costs) < 2 or min(costs) <= 0:
        return 0.0
    return (max(costs) - min(costs)) / min(costs)


def noise_score(noise: Noise, max_interference: float, max_spread: float) -> float:
    """How disturbed, relative to the limits: above 1 is disturbed."""
    return max(noise.interference / max(max_interference, 1e-9), noise.spread / max(max_spread, 1e-9))


def measure_quietly(
    repeats: Callable[[], list[float]],
    max_interference: float,
    max_spread: float,
    retries: int,
    sampler: Callable[[], CpuSample] | None = None,
) -> tuple[list[float], Noise]:
    """Time `repeats()` until a set is not disturbed, at most `retries` more times; the quietest set."""
    sampler = sampler or sample_cpu
    best: tuple[float, list[float], Noise] | None = None
    attempt = 0
    while True:
        before = sampler()
        costs = repeats()
        noise = Noise(interference(before, sampler()), spread(costs), attempt)
        score = noise_score(noise, max_interference, max_spread)
        if best is None or score < best[0]:
            best = (score, costs, noise)
        if score <= 1.0 or attempt >= retries:
            break
        attempt += 1
        time.sleep(BACKOFF_SECONDS * attempt)
    _, costs, noise = best
    return costs, replace(noise, retries=attempt)


class Quietness:
    """Whether the last `window` first attempts were all disturbed: then retrying is not worth its time."""

    def __init__(self, window: int = 8) -> None:
        self.recent: deque[bool] = deque(maxlen=window)

    def retries(self, max_retries: int) -> int:
        persistent = len(self.recent) == self.recent.maxlen and all(self.recent)
        return 0 if persistent else max_retries

    def note(self, noise: Noise, max_interference: float, max_spread: float) -> None:
        """Record whether the first attempt of a measurement was disturbed."""
        self.recent.append(noise.retries > 0 or noise_score(noise, max_interference, max_spread) > 1.0)
