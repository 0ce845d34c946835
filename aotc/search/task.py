"""`SearchTask(dag, target).tune(...)`: Ansor's search loop for one task.

See docs/search.md#one-task-tuning-loop.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aotc.schedule.state import State
from aotc.search.common import CostModel, MeasureResult
from aotc.search.evolution import search_round
from aotc.search.lowering import state_key
from aotc.search.measure import BatchStats, MeasureError, MeasureOptions, Measurer
from aotc.search.params import SearchParams
from aotc.search.records import UNTUNED_PREFERENCE, Record, append_results, load_records
from aotc.target import Target, as_target
from aotc.te.dag import ComputeDAG

SLOW_CUTOFF = 10.0  # a candidate this many times slower than the best gets one run, not repeats
# How often at most a task's untuned schedule is measured: again, right after a round, while a tuned program
# measures UNTUNED_PREFERENCE faster than its best measurement (docs/search.md#ranking-against-the-untuned-schedule).
UNTUNED_MEASUREMENTS = 3


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

    def __init__(self, dag: ComputeDAG, target: Target | str, name: str = ""):
        self.dag = dag
        self.target = as_target(target)
        self.name = name or "_".join(op.name for op in dag.compute_ops)[:40]

    def tune(
        self,
        trials: int,
        records: str | Path | None = None,
        callbacks: Sequence[Callable[[SearchTask, RoundInfo], None]] = (),
        params: SearchParams | None = None,
        model: CostModel | None = None,
        measure_options: MeasureOptions | None = None,
        early_stopping: int | None = None,
        initial_states: Sequence[State] = (),
        log: Callable[[str], None] | None = None,
        open_measurer: Callable[..., Measurer] = Measurer,
    ) -> TuneResult:
        """Measure up to `trials` candidates, `params.per_round` a round; the best valid one wins.
        Records are appended to `records`; `early_stopping` stops after that many trials without
        improvement.

        `initial_states` (e.g. the default schedule) are measured in the first round, so the result is
        never worse than them. `open_measurer` opens the measurer (`Measurer`: this machine; a cluster's
        `Cluster.open_measurer`).
        """
        log = log or _default_log
        search = TaskSearch(self, model or _default_model(), records, params, initial_states)
        batch = search.params.per_round
        if records is not None:
            search.resume_from(Path(records))
        result = search.result
        last_improvement = result.trials
        with open_measurer(self.dag, self.target, measure_options) as measurer:
            while result.trials < trials:
                info = search.round(measurer, min(batch, trials - result.trials))
                if info is None:
                    log(f"[{self.name}] every candidate the search finds has been measured; stopping")
                    break
                if info.batch_best_cost < float("inf") and info.batch_best_cost <= result.best_cost:
                    last_improvement = result.trials
                log(search.progress(info, trials))
                for cb in callbacks:
                    cb(self, info)
                if early_stopping is not None and result.trials - last_improvement >= early_stopping:
                    log(f"[{self.name}] no improvement in {early_stopping} trials; stopping early")
                    break
        result.seconds = search.seconds
        return result


class TaskSearch:
    """One task's search, advanced one round at a time, so that a task scheduler can interleave tasks
    that share one cost model (docs/search.md#task-scheduler). The measurer is passed to each round,
    not owned."""

    def __init__(
        self,
        task: SearchTask,
        model: CostModel,
        records: str | Path | None = None,
        params: SearchParams | None = None,
        initial_states: Sequence[State] = (),
        untuned: State | None = None,
    ):
        """`initial_states` are measured in the first round, after `untuned`, the task's untuned
        schedule, whose record is marked as such (`Record.untuned`, which ranks it ahead of schedules
        measured only slightly faster). The untuned schedule is measured again, right after a round,
        while a tuned program measures that much faster than its best measurement, up to
        `UNTUNED_MEASUREMENTS` times in all: one timing of it is sometimes far off, and the tuned program
        it is compared with is the best of many."""
        self.task = task
        self.model = model
        self.records = None if records is None else Path(records)
        self.params = params or SearchParams()
        self.rng = random.Random(self.params.seed)
        self.measured: dict[str, tuple[State, float]] = {}
        self.result = TuneResult(None, float("inf"), 0)
        self.resumed = 0
        self.rounds = 0
        self.seconds = {"search": 0.0, "build": 0.0, "run": 0.0, "model": 0.0}
        self.start = time.perf_counter()
        self._untuned = untuned
        self._untuned_key = None if untuned is None else _measured_key(untuned)
        self._untuned_measurements = 0
        self.last_batch: BatchStats | None = None  # the last round's batch, re-timings aside
        # one of each schedule (the first): a transferred record may hold the default schedule's steps
        unique: dict[str, State] = {}
        for st in ([untuned] if untuned is not None else []) + list(initial_states):
            unique.setdefault(_measured_key(st), st)
        self._initial = list(unique.values())

    @property
    def trials(self) -> int:
        """Candidates measured by this search (records it resumed from not included)."""
        return self.result.trials

    def resume_from(self, path: Path) -> int:
        """Seed from the earlier records of this task in `path`; returns how many there were."""
        if not path.exists():
            return 0
        return self.resume(load_records(path))

    def resume(self, records: Iterable[Record], train: bool = True) -> int:
        """Seed the measured set, the best state and (if `train`) the cost model from earlier records of
        this task: nothing they hold is measured again. Returns how many trials they were (records, less
        the untuned schedule's re-timings)."""
        dag, target = self.task.dag, str(self.task.target)
        states, results = [], []
        for rec in records:
            if rec.fingerprint != dag.fingerprint or rec.target != target:
                continue
            try:
                state = rec.state(dag)
            except Exception:  # noqa: BLE001 - a record that no longer replays is skipped
                continue
            states.append(state)
            results.append(MeasureResult(list(rec.costs), rec.error, rec.error_msg))
        if states and train:
            self.model.update(dag, states, results)
        if not states:
            return 0
        timed_before = self._untuned_measurements
        trials = self.result.trials
        self._absorb(states, results)
        self.result.trials = trials
        timings = self._untuned_measurements - timed_before  # of the untuned schedule, in these records
        retimings = timings - 1 if timings and not timed_before else timings  # all but its first timing
        self.resumed += len(states) - retimings
        return len(states) - retimings

    def _fresh_initial(self) -> list[State]:
        """The initial states not measured yet (resumed records may hold some)."""
        return [st for st in self._initial if _measured_key(st) not in self.measured]

    def pending_initial(self) -> int:
        """How many initial states are not measured yet."""
        return len(self._fresh_initial())

    def cost_of(self, state: State) -> float | None:
        """The measured cost of `state` (inf if it failed), or None if it was never measured."""
        hit = self.measured.get(_measured_key(state))
        return None if hit is None else hit[1]

    def _untuned_again(self) -> list[State]:
        """[the untuned schedule] where the best tuned program measured `UNTUNED_PREFERENCE` faster than
        it did and it was measured fewer than `UNTUNED_MEASUREMENTS` times, else []."""
        if self._untuned is None or not 0 < self._untuned_measurements < UNTUNED_MEASUREMENTS:
            return []
        untuned_cost = self.measured[self._untuned_key][1]
        best = self.result
        if best.best_state is None or _measured_key(best.best_state) == self._untuned_key:
            return []
        if not best.best_cost < untuned_cost * (1.0 - UNTUNED_PREFERENCE) < float("inf"):
            return []
        return [self._untuned]

    def propose(self, n: int) -> list[State]:
        """Up to `n` unmeasured candidates from one search round (the initial states first); the round is
        retried once when it finds nothing new, and an empty list means the space looks exhausted."""
        fresh = self._fresh_initial()
        if fresh and n <= len(fresh):
            self._initial = fresh[n:]
            return fresh[:n]
        for _ in range(2):
            t0 = time.perf_counter()
            ranked = sorted(self.measured.values(), key=lambda sc: sc[1])
            states = search_round(
                self.task.dag,
                self.task.target,
                self.model,
                self.rng,
                set(self.measured),
                [s for s, _ in ranked],
                n=n,
                params=self.params,
            )
            self.seconds["search"] += time.perf_counter() - t0
            if self._initial:
                fresh = self._fresh_initial()
                states = (fresh + states)[:n]
                self._initial = []
            if states:
                return states
        return []

    def round(self, measurer: Measurer, n: int) -> RoundInfo | None:
        """Search, measure up to `n` new candidates, then update the cost model; None if none was found."""
        states = self.propose(n)
        if not states:
            return None
        return self.measure(measurer, states)

    def measure(self, measurer: Measurer, states: list[State]) -> RoundInfo:
        """Measure `states`, then the untuned schedule again while a tuned program measures clearly
        faster than it (`_untuned_again`). A re-timing is a record but not a trial: it spends no budget
        that the task scheduler gives a round, so every task still gets its first rounds."""
        result = self.result
        results = self._measure(measurer, states)
        self.last_batch = measurer.last_batch
        batch_best = self._absorb(states, results)
        while again := self._untuned_again():
            try:
                timed = self._measure(measurer, again)
            except MeasureError:  # the runner is gone: the batch's results stand, the next round says why
                break
            batch_best = min(batch_best, self._absorb(again, timed, trials=False))
        self.rounds += 1
        info = RoundInfo(
            self.rounds,
            result.trials,
            time.perf_counter() - self.start,
            result.best_cost,
            batch_best,
            sum(not r.ok for r in results),
        )
        result.history.append(info)
        return info

    def _measure(self, measurer: Measurer, states: list[State]) -> list[MeasureResult]:
        """Time `states`, train the cost model on them and append their records."""
        best = self.result.best_cost
        results = measurer.measure(states, SLOW_CUTOFF * best if best < float("inf") else None)
        self.seconds["build"] += measurer.last_batch.build_seconds
        self.seconds["run"] += measurer.last_batch.run_seconds
        t0 = time.perf_counter()
        self.model.update(self.task.dag, states, results)
        self.seconds["model"] += time.perf_counter() - t0
        if self.records is not None:
            untuned = [_measured_key(s) == self._untuned_key for s in states]
            append_results(self.records, self.task.dag, self.task.target, states, results, untuned=untuned)
        return results

    def _absorb(self, states: list[State], results: list[MeasureResult], trials: bool = True) -> float:
        result = self.result
        batch_best = float("inf")
        for state, res in zip(states, results):
            key = _measured_key(state)
            cost = res.mean_cost if res.ok else float("inf")
            if key == self._untuned_key:
                self._untuned_measurements += 1
            if key in self.measured:  # the untuned schedule measured again, or a state in two resumed logs
                cost = min(cost, self.measured[key][1])
            self.measured[key] = (state, cost)
            batch_best = min(batch_best, cost)
            if cost < result.best_cost:
                result.best_cost, result.best_state = cost, state
        if trials:
            result.trials += len(states)
        return batch_best

    def progress(self, info: RoundInfo, trials: int) -> str:
        flops = self.task.dag.flop_count
        best = (
            f"{flops / info.best_cost / 1e9:8.2f} GFLOP/s"
            if info.best_cost < float("inf")
            else "   (none valid)"
        )
        errors = f"  {info.errors} errors" if info.errors else ""
        bar = progress_bar(info.trials, trials) + " " if sys.stdout.isatty() else ""
        return (
            f"[{self.task.name}] {bar}round {info.round:3d}  trials {info.trials:5d}/{trials}  best {best}"
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
    target: Target | str,
    trials: int,
    records: str | Path | None = None,
    params: SearchParams | None = None,
    log: Callable[[str], None] | None = None,
) -> tuple[SearchTask, TuneResult]:
    """Tune one named operator (aotc.topi.workloads) and report its best GFLOP/s."""
    from aotc.topi.workloads import make_workload

    task = SearchTask(make_workload(name, shape), target, name)
    result = task.tune(trials, records=records, params=params, log=log)
    return task, result


def _measured_key(state: State) -> str:
    """What identifies a schedule among the measured ones: its lowered loops, else its steps."""
    return state_key(state) or repr(state.steps)
