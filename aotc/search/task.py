"""`SearchTask(dag, target).tune(...)`: Ansor's search loop for one task (ANSOR.md §3.6)."""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aotc.schedule.state import State
from aotc.search.annotation import state_key
from aotc.search.common import CostModel, MeasureResult
from aotc.search.evolution import search_round
from aotc.search.measure import MeasureOptions, Measurer
from aotc.search.records import append_results, load_records
from aotc.target import Target
from aotc.te.dag import ComputeDAG

SLOW_CUTOFF = 10.0  # a candidate this many times slower than the best gets one run, not repeats


@dataclass
class RoundInfo:
    """What one search round did; passed to callbacks and kept in the history."""

    round: int
    trials: int
    elapsed: float
    best_cost: float
    batch_best_cost: float
    errors: int


@dataclass
class TuneResult:
    best_state: State | None
    best_cost: float
    trials: int
    history: list[RoundInfo] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def gflops(self, flops: int) -> float:
        return flops / self.best_cost / 1e9 if self.best_state is not None else 0.0


class SearchTask:
    """One subgraph to tune for one target."""

    def __init__(self, dag: ComputeDAG, target: Target, name: str = ""):
        self.dag = dag
        self.target = target
        self.name = name or "_".join(op.name for op in dag.compute_ops)[:40]

    def tune(
        self,
        trials: int,
        records: str | Path | None = None,
        callbacks: Sequence[Callable[[SearchTask, RoundInfo], None]] = (),
        seed: int = 0,
        model: CostModel | None = None,
        measure_options: MeasureOptions | None = None,
        batch: int = 64,
        population: int = 256,
        early_stopping: int | None = None,
        initial_states: Sequence[State] = (),
        log: Callable[[str], None] | None = None,
    ) -> TuneResult:
        """Measure up to `trials` candidates; the best valid one wins. Records are appended to `records`.

        `initial_states` (e.g. the default schedule) are measured in the first round, so the result is
        never worse than them.
        """
        log = log or _default_log
        rng = random.Random(seed)
        model = model or _default_model()
        measured: dict[str, tuple[State, float]] = {}
        result = TuneResult(None, float("inf"), 0)
        if records is not None:
            self._resume(Path(records), model, measured, result)
        seconds = {"search": 0.0, "build": 0.0, "run": 0.0, "model": 0.0}
        start = time.perf_counter()
        last_improvement = result.trials
        with Measurer(self.dag, self.target, measure_options) as measurer:
            rounds, empty_retries = 0, 0
            while result.trials < trials:
                t0 = time.perf_counter()
                ranked = sorted(measured.values(), key=lambda sc: sc[1])
                states = search_round(
                    self.dag,
                    self.target,
                    model,
                    rng,
                    set(measured),
                    [s for s, _ in ranked],
                    n=min(batch, trials - result.trials),
                    population=population,
                )
                seconds["search"] += time.perf_counter() - t0
                if rounds == 0 and initial_states:
                    fresh = [st for st in initial_states if (state_key(st) or "") not in measured]
                    states = (fresh + states)[: min(batch, trials - result.trials)]
                if not states:
                    empty_retries += 1
                    if empty_retries > 1:
                        log(f"[{self.name}] every candidate the search finds has been measured; stopping")
                        break
                    continue
                cutoff = SLOW_CUTOFF * result.best_cost if result.best_cost < float("inf") else None
                results = measurer.measure(states, cutoff)
                seconds["build"] += measurer.last_batch.build_seconds
                seconds["run"] += measurer.last_batch.run_seconds
                t0 = time.perf_counter()
                model.update(self.dag, states, results)
                seconds["model"] += time.perf_counter() - t0
                if records is not None:
                    append_results(records, self.dag, self.target, states, results)
                batch_best = self._absorb(states, results, measured, result)
                if batch_best < float("inf") and batch_best <= result.best_cost:
                    last_improvement = result.trials
                rounds += 1
                info = RoundInfo(
                    rounds,
                    result.trials,
                    time.perf_counter() - start,
                    result.best_cost,
                    batch_best,
                    sum(not r.ok for r in results),
                )
                result.history.append(info)
                log(self._progress(info, trials))
                for cb in callbacks:
                    cb(self, info)
                if early_stopping is not None and result.trials - last_improvement >= early_stopping:
                    log(f"[{self.name}] no improvement in {early_stopping} trials; stopping early")
                    break
        result.seconds = seconds
        return result

    def _absorb(
        self, states: list[State], results: list[MeasureResult], measured: dict, result: TuneResult
    ) -> float:
        batch_best = float("inf")
        for state, res in zip(states, results):
            key = state_key(state) or repr(state.steps)
            cost = res.mean_cost if res.ok else float("inf")
            measured[key] = (state, cost)
            batch_best = min(batch_best, cost)
            if cost < result.best_cost:
                result.best_cost, result.best_state = cost, state
        result.trials += len(states)
        return batch_best

    def _resume(self, path: Path, model: CostModel, measured: dict, result: TuneResult) -> None:
        """Continue from earlier records of this task: never re-measure, start from their best."""
        if not path.exists():
            return
        mine = [
            r
            for r in load_records(path)
            if r.fingerprint == self.dag.fingerprint and r.target == str(self.target)
        ]
        states, results = [], []
        for rec in mine:
            try:
                state = rec.state(self.dag)
            except Exception:  # noqa: BLE001 - a record that no longer replays is skipped
                continue
            res = MeasureResult(list(rec.costs), rec.error, rec.error_msg)
            states.append(state)
            results.append(res)
        if states:
            model.update(self.dag, states, results)
            self._absorb(states, results, measured, result)
            result.trials = 0

    def _progress(self, info: RoundInfo, trials: int) -> str:
        flops = self.dag.flop_count
        best = (
            f"{flops / info.best_cost / 1e9:8.2f} GFLOP/s"
            if info.best_cost < float("inf")
            else "   (none valid)"
        )
        errors = f"  {info.errors} errors" if info.errors else ""
        bar = progress_bar(info.trials, trials) + " " if sys.stdout.isatty() else ""
        return (
            f"[{self.name}] {bar}round {info.round:3d}  trials {info.trials:5d}/{trials}  best {best}"
            f"  ({info.best_cost * 1e3:.4f} ms)  elapsed {info.elapsed:6.1f} s{errors}"
        )


def progress_bar(done: int, total: int, width: int = 24) -> str:
    """`[#########...............]` for a terminal."""
    filled = min(width, round(width * done / total)) if total else width
    return "[" + "#" * filled + "." * (width - filled) + "]"


def _default_model() -> CostModel:
    from aotc.search.cost_model import XGBCostModel

    return XGBCostModel()


def _default_log(line: str) -> None:
    print(line, file=sys.stdout, flush=True)


def tune_workload(
    name: str,
    shape: list[int] | None,
    target: Target,
    trials: int,
    records: str | Path | None = None,
    seed: int = 0,
    log: Callable[[str], None] | None = None,
) -> tuple[SearchTask, TuneResult]:
    """Tune one named operator (aotc.topi.workloads) and report its best GFLOP/s."""
    from aotc.topi.workloads import make_workload

    task = SearchTask(make_workload(name, shape), target, name)
    result = task.tune(trials, records=records, seed=seed, log=log)
    return task, result
