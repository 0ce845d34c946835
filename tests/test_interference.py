"""Interference: disturbed timings are measured again (a bounded number of times) and kept with their
noise, never dropped. The sampler is injected, so nothing here depends on how busy the machine is."""

import math
import os
import subprocess
import sys

import pytest

from aotc.search.common import Noise
from aotc.search.interference import (
    CpuSample,
    Quietness,
    interference,
    measure_quietly,
    noise_score,
    sample_cpu,
)
from aotc.search.measure import MeasureOptions, Measurer
from aotc.search.timing import time_flushed, time_kernel
from aotc.target import host_target

from .test_measure import matmul_relu, tiled_state


class FakeMachine:
    """A sampler: each call advances the clock by `step` s; other processes take `shares[k]` of both
    CPUs during the k-th measured interval (two samples per interval)."""

    def __init__(self, shares: list[float], step: float = 0.1):
        self.shares, self.step = shares, step
        self.calls = 0
        self.wall = self.machine = 0.0

    def __call__(self) -> CpuSample:
        interval = self.calls // 2
        if self.calls % 2:  # the end of an interval
            share = self.shares[min(interval, len(self.shares) - 1)]
            self.wall += self.step
            self.machine += share * 2 * self.step
        self.calls += 1
        return CpuSample(self.wall, 0.0, self.machine, math.nan, 2)

    @property
    def intervals(self) -> int:
        return self.calls // 2


def test_interference_is_the_larger_of_other_cpu_time_and_cpu_pressure():
    a = CpuSample(10.0, 1.0, 100.0, 5.0, 2)
    # 1 s: 1.2 CPU-s busy of which 0.9 ours: others took 0.3 of 2 CPU-s; tasks waited 0.4 s
    b = CpuSample(11.0, 1.9, 101.2, 5.4, 2)
    assert interference(a, b) == pytest.approx(0.4)
    assert interference(a, CpuSample(11.0, 1.9, 101.2, math.nan, 2)) == pytest.approx(0.15)
    assert interference(a, CpuSample(11.0, 1.9, math.nan, math.nan, 2)) == 0.0
    assert interference(a, a) == 0.0
    assert interference(a, CpuSample(11.0, 1.0, 103.0, 9.0, 2)) == 1.0  # clamped
    s = sample_cpu()
    assert s.cpus >= 1 and s.own_cpu >= 0 and s.wall > 0


def test_a_disturbed_set_is_measured_again_until_quiet():
    machine = FakeMachine([0.5, 0.45, 0.0])
    sets = iter([[3.0, 2.0, 2.5], [2.2, 2.1, 2.3], [1.0, 1.01, 1.0]])
    costs, noise = measure_quietly(lambda: next(sets), 0.2, 0.1, retries=5, sampler=machine)
    assert machine.intervals == 3 and costs == [1.0, 1.01, 1.0]
    assert (
        noise.retries == 2
        and noise.interference == pytest.approx(0.0)
        and noise.spread == pytest.approx(0.01)
    )


def test_retries_are_bounded_and_the_quietest_set_is_kept_with_its_noise():
    machine = FakeMachine([0.6, 0.3, 0.9])
    sets = iter([[5.0, 5.0], [2.0, 2.0], [1.0, 1.0]])
    costs, noise = measure_quietly(lambda: next(sets), 0.2, 0.1, retries=2, sampler=machine)
    assert machine.intervals == 3  # 1 + 2 retries, then it gives up
    assert costs == [2.0, 2.0] and noise.interference == pytest.approx(0.3) and noise.retries == 2
    assert noise_score(noise, 0.2, 0.1) > 1  # still disturbed: recorded as such, not dropped


def test_spread_alone_makes_a_set_disturbed():
    machine = FakeMachine([0.0])
    sets = iter([[1.0, 1.5, 1.0], [1.0, 1.02, 1.01]])
    costs, noise = measure_quietly(lambda: next(sets), 0.2, 0.1, retries=2, sampler=machine)
    assert costs == [1.0, 1.02, 1.01] and noise.retries == 1


def test_quietness_stops_retrying_under_persistent_interference():
    q = Quietness(window=4)
    assert q.retries(2) == 2
    for _ in range(4):
        q.note(Noise(0.5, 0.0, 0), 0.2, 0.1)
    assert q.retries(2) == 0  # a busy core for minutes: retrying costs time and finds nothing quieter
    q.note(Noise(0.0, 0.0, 0), 0.2, 0.1)
    assert q.retries(2) == 2


def test_time_kernel_and_time_flushed_use_the_sampler():
    calls = []
    opts = MeasureOptions(
        number=3, repeat=2, min_repeat_ms=0.0, max_spread=1e9
    )  # no-op timings spread widely
    machine = FakeMachine([0.9])
    costs, noise = time_kernel(lambda: calls.append(1), opts, 1e-6, sampler=machine, retries=1)
    assert (
        len(costs) == 2
        and machine.intervals == 2
        and noise.retries == 1
        and noise.interference == pytest.approx(0.9)
    )
    machine = FakeMachine([0.0])
    flushes = []
    costs, noise = time_flushed(lambda: None, lambda: flushes.append(1), opts, sampler=machine, retries=3)
    assert len(costs) == 2 and len(flushes) == 6 and machine.intervals == 1 and noise.retries == 0


def test_measurer_retries_and_records_noise():
    """Limits no real timing meets (repeats never agree to 1e-12): every candidate is measured
    1 + max_retries times and still comes back timed, with its noise figure."""
    dag = matmul_relu()
    opts = MeasureOptions(min_repeat_ms=2.0, repeat=3, n_build_workers=1, max_spread=1e-12, max_retries=2)
    with Measurer(dag, host_target(), opts) as m:
        (r,) = m.measure([tiled_state(dag)])
    assert r.ok and len(r.costs) == 3 and r.noise is not None and r.noise.retries == 2 and r.noise.spread > 0


HOG = "import os, time\nos.sched_setaffinity(0, {%d})\nend = time.time() + %f\nwhile time.time() < end:\n    pass\n"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_a_busy_core_shows_as_interference():
    """A busy loop pinned to one core (it stops by itself after a few seconds) is seen by the runner."""
    dag = matmul_relu()
    opts = MeasureOptions(min_repeat_ms=50.0, repeat=3, n_build_workers=1, max_retries=0)
    cpu = sorted(os.sched_getaffinity(0))[-1]
    with Measurer(dag, host_target(), opts) as m:
        hog = subprocess.Popen([sys.executable, "-c", HOG % (cpu, 20.0)])
        try:
            (r,) = m.measure([tiled_state(dag)])
        finally:
            hog.kill()
            hog.wait()
    assert r.ok and r.noise is not None and r.noise.retries == 0
    assert r.noise.interference > 0.2  # the loop alone takes half of two CPUs' time
