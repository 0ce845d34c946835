"""Benchmark a loaded model: a warm-up, then timed runs from `streams` concurrent callers, summed up as
latency percentiles and throughput. Numpy only; `measure` times any callables (a peer runtime's too).

Each stream is one thread calling the model in a loop with its own output buffers. A phase ends when its
`Budget` is spent: `seconds` of wall time or `runs` calls in all streams together, whichever comes first;
a run once started is finished and counted. Latency is each call's wall time as its caller sees it,
so where the model serializes concurrent calls it includes the wait for the model (`concurrent_runs`
in the result says how many calls the model ran at once).
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "DEFAULT_DURATION",
    "DEFAULT_WARMUP",
    "BenchmarkResult",
    "Budget",
    "benchmark",
    "combine",
    "measure",
]

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Budget:
    """How long a phase runs: until `seconds` have passed or `runs` calls (all streams together) have
    been made, whichever comes first. None means no limit of that kind; at least one must be given,
    except for a warm-up of nothing (`Budget(runs=0)`)."""

    seconds: float | None = None
    runs: int | None = None

    def __post_init__(self) -> None:
        if self.seconds is None and self.runs is None:
            raise ValueError("a benchmark budget needs seconds or runs (or both)")
        if self.seconds is not None and not (
            isinstance(self.seconds, (int, float)) and math.isfinite(self.seconds) and self.seconds >= 0
        ):
            raise ValueError(f"budget seconds must be a finite number >= 0, got {self.seconds!r}")
        if self.runs is not None and (
            not isinstance(self.runs, int) or isinstance(self.runs, bool) or self.runs < 0
        ):
            raise ValueError(f"budget runs must be an int >= 0, got {self.runs!r}")

    @property
    def empty(self) -> bool:
        return self.runs == 0 or self.seconds == 0

    def split(self, parts: int) -> list[Budget]:
        """`parts` budgets that together make this one (runs spread as evenly as integers allow)."""
        seconds = None if self.seconds is None else self.seconds / parts
        if self.runs is None:
            return [Budget(seconds=seconds)] * parts
        base, extra = divmod(self.runs, parts)
        return [Budget(seconds=seconds, runs=base + (i < extra)) for i in range(parts)]

    def __str__(self) -> str:
        limits = [
            f"{self.seconds:g} s" if self.seconds is not None else "",
            f"{self.runs} runs" if self.runs is not None else "",
        ]
        return " or ".join(x for x in limits if x)


DEFAULT_WARMUP = Budget(seconds=0.5)
"""Warm-up: half a second (at least one run a stream) fills caches and wakes the thread pool."""
DEFAULT_DURATION = Budget(seconds=10.0)
"""Timed phase: ten seconds."""


@dataclass(frozen=True)
class BenchmarkResult:
    """The timed phase: every call's latency (ms), the phase's wall seconds, and how it was run."""

    latencies_ms: tuple[float, ...]
    seconds: float
    streams: int
    threads: int
    warmup_runs: int
    concurrent_runs: int

    @property
    def runs(self) -> int:
        return len(self.latencies_ms)

    @property
    def throughput(self) -> float:
        """Inferences per second over the timed phase's wall time, all streams together."""
        return self.runs / self.seconds if self.seconds > 0 else 0.0

    def percentile(self, q: float) -> float:
        """The q-th percentile of the latencies (ms), linear between ranks (monotone in q)."""
        return float(np.percentile(np.asarray(self.latencies_ms), q)) if self.latencies_ms else math.nan

    def to_dict(self) -> dict:
        """The result as JSON-ready data: latency statistics in ms, throughput in inferences/s, counts."""
        lat = np.asarray(self.latencies_ms)
        stats = {f"p{q}_ms": self.percentile(q) for q in PERCENTILES}
        return {
            "latency_ms": {
                **stats,
                "min": float(lat.min()) if lat.size else math.nan,
                "max": float(lat.max()) if lat.size else math.nan,
                "mean": float(lat.mean()) if lat.size else math.nan,
                "std": float(lat.std()) if lat.size else math.nan,
            },
            "throughput_per_s": self.throughput,
            "runs": self.runs,
            "warmup_runs": self.warmup_runs,
            "seconds": self.seconds,
            "streams": self.streams,
            "threads": self.threads,
            "concurrent_runs": self.concurrent_runs,
        }


def measure(
    calls: Sequence[Callable[[], object]],
    budget: Budget,
    warmup: Budget = DEFAULT_WARMUP,
    threads: int = 0,
    concurrent_runs: int | None = None,
) -> BenchmarkResult:
    """Time `calls`, one callable per stream (each run concurrently in its own thread when there are
    several): a warm-up under `warmup`, then the timed phase under `budget`. `threads` and
    `concurrent_runs` (default: the streams) are recorded as given."""
    if not calls:
        raise ValueError("a benchmark needs at least one stream")
    if budget.empty:
        raise ValueError(f"a timed phase of {budget} measures nothing")
    warm = _phase(calls, warmup)[0] if not warmup.empty else []
    latencies, seconds = _phase(calls, budget)
    return BenchmarkResult(
        tuple(latencies),
        seconds,
        len(calls),
        threads,
        len(warm),
        len(calls) if concurrent_runs is None else min(concurrent_runs, len(calls)),
    )


def combine(results: Sequence[BenchmarkResult]) -> BenchmarkResult:
    """Blocks of one benchmark (interleaved with another's) as one result: all latencies, summed wall time."""
    first = results[0]
    return BenchmarkResult(
        tuple(x for r in results for x in r.latencies_ms),
        sum(r.seconds for r in results),
        first.streams,
        first.threads,
        sum(r.warmup_runs for r in results),
        first.concurrent_runs,
    )


def benchmark(
    model,
    inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray] | None = None,
    budget: Budget = DEFAULT_DURATION,
    warmup: Budget = DEFAULT_WARMUP,
    streams: int = 1,
    num_threads: int | None = None,
    seed: int = 0,
) -> BenchmarkResult:
    """Benchmark a loaded `CompiledModel` on `inputs` (seeded random ones when None) from `streams`
    concurrent callers, each call with `num_threads` threads (default: the model's `num_threads`)."""
    return measure(
        model_calls(model, inputs, streams, num_threads, seed),
        budget,
        warmup,
        threads=model.num_threads if num_threads is None else num_threads,
        concurrent_runs=concurrent_runs(model),
    )


def model_calls(
    model,
    inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray] | None,
    streams: int,
    num_threads: int | None = None,
    seed: int = 0,
) -> list[Callable[[], object]]:
    """One callable per stream that runs `model` on the same inputs into that stream's own outputs."""
    if not isinstance(streams, int) or isinstance(streams, bool) or streams < 1:
        raise ValueError(f"streams must be an int >= 1, got {streams!r}")
    feeds = model.random_inputs(seed) if inputs is None else inputs
    model.run(feeds, num_threads=num_threads)  # checks inputs and thread count once, before any timing

    def call_for_stream() -> Callable[[], object]:
        outs = {t.name: np.empty(t.shape, t.dtype) for t in model.outputs}
        return lambda: model.run(feeds, outputs=outs, num_threads=num_threads)

    return [call_for_stream() for _ in range(streams)]


def concurrent_runs(model) -> int:
    """How many `run` calls the model executes at once: its `max_concurrency` (a workspace per call),
    else 1 (a model of one workspace serializes its calls)."""
    n = getattr(model, "max_concurrency", 1)
    return n if isinstance(n, int) and n >= 1 else 1


def _phase(calls: Sequence[Callable[[], object]], budget: Budget) -> tuple[list[float], float]:
    """Run every stream until the budget is spent; every call's latency (ms) and the wall seconds."""
    clock = time.perf_counter
    tickets = itertools.count() if budget.runs is not None else None  # next() is atomic under the GIL
    limit = budget.runs
    per_stream: list[list[float]] = [[] for _ in calls]
    errors: list[BaseException] = []
    start_gate = threading.Barrier(len(calls) + 1) if len(calls) > 1 else None
    times: dict[str, float] = {}

    def loop(call: Callable[[], object], spent: list[float], stop_at: float) -> None:
        append = spent.append
        while not errors:
            if tickets is not None and next(tickets) >= limit:
                break
            t0 = clock()
            if t0 >= stop_at and spent:  # a stream makes at least one run before a deadline ends it
                break
            call()
            append((clock() - t0) * 1e3)

    def stream(i: int) -> None:
        try:
            start_gate.wait()
            loop(calls[i], per_stream[i], times["stop_at"])
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(err)

    seconds = math.inf if budget.seconds is None else budget.seconds
    if start_gate is None:
        begin = clock()
        loop(calls[0], per_stream[0], begin + seconds)
        return per_stream[0], clock() - begin
    workers = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(len(calls))]
    for w in workers:
        w.start()
    begin = clock()
    times["stop_at"] = begin + seconds  # set before the gate opens: every stream reads it after
    start_gate.wait()
    for w in workers:
        w.join()
    wall = clock() - begin
    if errors:
        raise errors[0]
    return [x for spent in per_stream for x in spent], wall
