"""Types every part of the search shares: measurement results and the cost-model interface."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Protocol

import numpy as np

from aotc.schedule.state import State
from aotc.te.dag import ComputeDAG


class ErrorCode(IntEnum):
    """Ansor's error codes (docs/search.md#error-codes), plus WRONG_ANSWER: the kernel ran but its output
    differs from the naive schedule's."""

    NO_ERROR = 0
    INSTANTIATION_ERROR = 1  # the steps do not apply / lowering failed
    COMPILE_HOST = 2  # codegen or linking failed
    COMPILE_DEVICE = 3
    RUNTIME_DEVICE = 4  # the kernel crashed or returned nonzero
    WRONG_ANSWER = 5
    BUILD_TIMEOUT = 6
    RUN_TIMEOUT = 7
    UNKNOWN_ERROR = 8


@dataclass(frozen=True)
class Noise:
    """How disturbed a timing was: `interference` is the share of the machine's CPU time other processes
    took (or, where the kernel reports CPU pressure, the share of time some task waited for a CPU) while
    the kept repeats ran, `spread` is (max - min) / min of the repeats, `retries` how many disturbed
    attempts were measured again."""

    interference: float = 0.0
    spread: float = 0.0
    retries: int = 0


@dataclass
class MeasureResult:
    """One measured candidate: seconds per run (`costs`, one per repeat) or an error."""

    costs: list[float]
    error: ErrorCode = ErrorCode.NO_ERROR
    error_msg: str = ""
    build_seconds: float = 0.0
    run_seconds: float = 0.0
    timestamp: float = field(default_factory=time.time)
    noise: Noise | None = None  # None: not timed, or timed before noise was measured
    host: dict | None = None  # the machine that measured, where it is not this one (a cluster's device)

    @property
    def ok(self) -> bool:
        return self.error == ErrorCode.NO_ERROR and bool(self.costs)

    @property
    def mean_cost(self) -> float:
        """Mean seconds per run; 1e10 for a failed candidate (Ansor's convention)."""
        return float(np.mean(self.costs)) if self.ok else 1e10


class CostModel(Protocol):
    """Scores candidate states of a task; higher means expected faster. Shared by all tasks of a build."""

    def predict(self, dag: ComputeDAG, states: list[State]) -> np.ndarray: ...

    def update(self, dag: ComputeDAG, states: list[State], results: list[MeasureResult]) -> None: ...


class RandomCostModel:
    """Uniform random scores (Ansor's RandomModel): the search before anything is measured."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def predict(self, dag: ComputeDAG, states: list[State]) -> np.ndarray:
        return self.rng.random(len(states))

    def update(self, dag: ComputeDAG, states: list[State], results: list[MeasureResult]) -> None:
        return None
