"""Batch sizes and concurrent runs: a workspace per concurrent call, re-batching a model in the recipe."""

from __future__ import annotations

import threading

import aotc_runtime
import numpy as np
import pytest

from aotc.package import write_package
from tests.concurrency import failures_in_threads
from tests.test_package import SHAPE, tiny_reference, tiny_spec


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AOTC_RUNTIME_CACHE", str(tmp_path_factory.mktemp("runtime-cache")))
        yield


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    """y = relu(x + w) through a workspace buffer: calls sharing one workspace would mix their data."""
    path = str(tmp_path_factory.mktemp("batch") / "tiny.aotc")
    write_package(tiny_spec(), path)
    return path


def x_input(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(SHAPE).astype("float32")


class EntryProbe:
    """Wraps a model's entry function: counts calls inside it at once and the workspaces they use.
    With `meet`, callers wait for each other inside the entry, which only concurrent calls can do."""

    def __init__(self, fn, meet: int | None = None) -> None:
        self.fn = fn
        self.barrier = threading.Barrier(meet, timeout=60) if meet else None
        self.lock = threading.Lock()
        self.active = self.peak = 0
        self.workspaces: set[int] = set()

    def __call__(self, in_argv, out_argv, weights, workspace):
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
            self.workspaces.add(workspace.value)
        try:
            if self.barrier is not None:
                self.barrier.wait()
            return self.fn(in_argv, out_argv, weights, workspace)
        finally:
            with self.lock:
                self.active -= 1


# ----------------------------------------------------------------------------- concurrent runs


def test_many_threads_get_their_own_outputs(tiny_path):
    model = aotc_runtime.load(tiny_path, max_concurrency=4)

    def check(seed: int) -> bool:
        for k in range(50):
            x = x_input(seed * 1000 + k)
            y = model.run({"x": x}, num_threads=1 + (seed % 2))["y"]
            if not np.allclose(y, tiny_reference(x), rtol=1e-6):
                return False
        return True

    assert failures_in_threads(check, 8) == []
    assert model.call_slots.allocated <= 4


def test_two_streams_run_side_by_side_in_their_own_workspaces(tiny_path, monkeypatch):
    model = aotc_runtime.load(tiny_path, max_concurrency=2)
    probe = EntryProbe(model._fn, meet=2)  # a serializing run would leave the barrier waiting (broken)
    monkeypatch.setattr(model, "_fn", probe)

    def check(seed: int) -> bool:
        x = x_input(seed)
        return bool(np.allclose(model.run([x])["y"], tiny_reference(x), rtol=1e-6))

    assert failures_in_threads(check, 2) == []
    assert probe.peak == 2 and model.call_slots.peak_in_use == 2
    assert len(probe.workspaces) == 2


def test_callers_beyond_max_concurrency_wait(tiny_path, monkeypatch):
    model = aotc_runtime.load(tiny_path, max_concurrency=1)
    assert model.max_concurrency == 1
    probe = EntryProbe(model._fn)
    monkeypatch.setattr(model, "_fn", probe)

    def check(seed: int) -> bool:
        x = x_input(seed)
        return all(np.allclose(model.run([x])["y"], tiny_reference(x), rtol=1e-6) for _ in range(20))

    assert failures_in_threads(check, 4) == []
    assert probe.peak == 1 and len(probe.workspaces) == 1


def test_default_concurrency_is_the_available_cores(tiny_path):
    import os

    model = aotc_runtime.load(tiny_path)
    assert model.max_concurrency == len(os.sched_getaffinity(0))
    assert model.call_slots.allocated == 0  # workspaces are made when calls need them
    model.run([x_input(0)])
    assert model.call_slots.allocated == 1


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_max_concurrency_must_be_a_positive_int(tiny_path, bad):
    with pytest.raises(ValueError, match="max_concurrency must be an int of at least 1"):
        aotc_runtime.load(tiny_path, max_concurrency=bad)


def test_profile_uses_a_call_slot(tiny_path):
    model = aotc_runtime.load(tiny_path, max_concurrency=1)
    times = model.profile([x_input(0)], repeat=2, warmup=0)
    assert len(times) == len(model.manifest["execution_plan"])
    assert model.call_slots.in_use == 0
