"""Ansor's task scheduler spends one trial budget across a model's tasks (docs/search.md#task-scheduler).

After a warm-up round per task, each round goes to the task whose next round should lower the objective
most (the gradient strategy: chain x (alpha x backward + (1 - alpha) x forward), alpha=0.2, beta=2,
window 3), with an epsilon-greedy random pick now and then; or to the next live task (round-robin).
The objective is a sum over models of max(weighted latency, latency target), so one mechanism covers the
weighted total latency, latency targets and several models at once. Tasks of the same similarity group
(same anchor op tag, loop structure and size class) tell a task what it could reach. A task is dead
once its search finds nothing new or it has not improved for `task_early_stopping` rounds.

Tuning one round of one task is a callable `(task index, trials) -> RoundOutcome`; `SearchRounds` is the
real one (one TaskSearch per task, one shared cost model, at most two open measurers). Tests inject
their own.
"""

from __future__ import annotations

import math
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from aotc.schedule.state import State
from aotc.search.common import CostModel
from aotc.search.measure import BuildersCannotStart, MeasureError, MeasureOptions, Measurer
from aotc.search.params import STRATEGIES, SearchParams
from aotc.search.task import SearchTask, TaskSearch
from aotc.target import Target, as_target
from aotc.te.dag import ComputeDAG

INVALID = 1e10  # the cost of a task with no valid measurement (Ansor's convention)
MIN_ROUND_TRIALS = 4  # under a deadline, a round that would have to shrink below this is not started
ROUND_HISTORY = 3  # rounds whose timings estimate the next round's duration
# A round's seconds per trial vary by more than its last rounds show: load from other processes comes and
# goes, and a task's first search round compiles slower candidates than its default schedule. Under a
# deadline a round is sized for this many times the estimate (a 90 s build overran by 23 s without it).
DEADLINE_MARGIN = 1.5


class SchedTask(Protocol):
    """What the scheduler needs of a task (aotc.graph.partition.Task has it)."""

    dag: ComputeDAG
    name: str
    weight: int


@dataclass
class RoundOutcome:
    """What one round of one task measured: seconds per candidate (inf for a failed one).

    No costs means the search found nothing new (or `error` says why the task cannot be tuned).
    `fixed_seconds` is the part of the round's time that does not grow with its number of trials.
    """

    costs: list[float]
    fixed_seconds: float = 0.0
    error: str = ""
    devices: tuple = ()  # a cluster's devices after the round (aotc.cluster.DeviceRow as dicts)
    queue_depth: int = 0  # the most candidates that waited for a device in the round


RoundFn = Callable[[int, int], RoundOutcome]


@dataclass
class Objective:
    """f(g) = sum over models m of max(sum_i W[m, i] g_i, L[m]) (docs/search.md#task-scheduler).

    `weights[m][i]` is how often model m runs task i; `targets[m]` its latency target in seconds (0: none).
    """

    weights: np.ndarray
    targets: np.ndarray

    @staticmethod
    def total_latency(weights: Sequence[float], target: float | None = None) -> Objective:
        """One model: its weighted total latency, optionally with a latency target."""
        return Objective(np.asarray([weights], dtype=np.float64), np.asarray([target or 0.0]))

    @staticmethod
    def several_models(
        tasks: Sequence[SchedTask], models: Sequence[dict[str, float]], targets: Sequence[float | None] = ()
    ) -> Objective:
        """Several models sharing `tasks`: `models[m]` maps a task's workload key to model m's weight."""
        keys = [t.dag.workload_key for t in tasks]
        weights = np.asarray([[m.get(k, 0.0) for k in keys] for m in models], dtype=np.float64)
        tgt = [(targets[m] if m < len(targets) else None) or 0.0 for m in range(len(models))]
        return Objective(weights, np.asarray(tgt, dtype=np.float64))

    def latencies(self, costs: np.ndarray) -> np.ndarray:
        return self.weights @ costs

    def __call__(self, costs: np.ndarray) -> float:
        return float(np.maximum(self.latencies(costs), self.targets).sum())

    def met(self, costs: np.ndarray) -> bool:
        """Every model has a latency target and meets it."""
        return bool((self.targets > 0).all() and (self.latencies(costs) <= self.targets).all())


def merge_models(models: Sequence[Sequence[SchedTask]]) -> tuple[list[SchedTask], list[dict[str, float]]]:
    """The distinct tasks of several models (by workload key) and each model's weights, for
    `Objective.several_models`."""
    tasks: dict[str, SchedTask] = {}
    weights: list[dict[str, float]] = []
    for model in models:
        w: dict[str, float] = {}
        for t in model:
            key = t.dag.workload_key
            tasks.setdefault(key, t)
            w[key] = w.get(key, 0.0) + t.weight
        weights.append(w)
    return list(tasks.values()), weights


def similarity_tag(dag: ComputeDAG) -> str:
    """Tasks with equal tags are similar: the anchor op's tag (the first reduction, else the output),
    its numbers of spatial and reduce axes, and int(log_1.618(flops + 1)) as Ansor adds."""
    anchor = next((op for op in dag.compute_ops if op.reduce_axes), dag.outputs[0])
    kind = getattr(anchor, "tag", "") or anchor.name
    axes = len(getattr(anchor, "axes", ()))
    reduce_axes = len(getattr(anchor, "reduce_axes", ()))
    return f"{kind}/{axes}s{reduce_axes}r/{int(math.log(dag.flop_count + 1, 1.618))}"


@dataclass
class TaskProgress:
    trials: int = 0
    rounds: int = 0
    best_cost: float = INVALID
    best_round: int = 0
    history: list[float] = field(default_factory=list)
    dead: str = ""


@dataclass
class RoundReport:
    """One scheduler round, passed to callbacks."""

    round: int
    task: int
    how: str  # baseline, warm-up, gradient, random, round-robin
    trials: int
    total_trials: int
    seconds: float
    latency: float  # estimated end-to-end latency (inf while a task has no valid cost)
    improved: bool


@dataclass
class TuneSummary:
    trials: int
    rounds: int
    seconds: float
    stop_reason: str


class TaskScheduler:
    """Spends a trial budget across tasks, one search round at a time (docs/search.md#task-scheduler).

    `baseline_trials` > 0 starts with a round of that many trials per task (the round function's initial
    states: the default schedule, and schedules transferred from other CPUs), so the end-to-end estimate
    exists before any search has run; a sequence gives each task its own count (0: no baseline round).
    """

    def __init__(
        self,
        tasks: Sequence[SchedTask],
        rounds: RoundFn,
        objective: Objective | None = None,
        strategy: str = SearchParams.strategy,
        *,
        per_round: int = SearchParams.per_round,
        alpha: float = 0.2,
        beta: float = 2.0,
        backward_window: int = 3,
        eps: float = 0.05,
        task_early_stopping: int | None = 10,
        early_stopping: int | None = None,
        seed: int = SearchParams.seed,
        callbacks: Sequence[Callable[[TaskScheduler, RoundReport], None]] = (),
        log: Callable[[str], None] | None = None,
        table: bool = False,
        baseline_trials: int | Sequence[int] = 0,
    ):
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown task scheduler strategy {strategy!r} ({' or '.join(STRATEGIES)})")
        self.tasks = list(tasks)
        self.rounds = rounds
        self.objective = objective or Objective.total_latency([t.weight for t in self.tasks])
        if self.objective.weights.shape[1] != len(self.tasks):
            raise ValueError(
                f"the objective weighs {self.objective.weights.shape[1]} tasks, not {len(tasks)}"
            )
        self.strategy = strategy
        self.per_round = per_round
        self.alpha, self.beta, self.window, self.eps = alpha, beta, backward_window, eps
        self.task_early_stopping = task_early_stopping
        self.early_stopping = early_stopping
        self.rng = random.Random(seed)
        self.callbacks = list(callbacks)
        self.log = log or (lambda line: print(line, flush=True))
        self.table = table
        if isinstance(baseline_trials, int):
            baseline_trials = [baseline_trials] * len(self.tasks)
        if len(baseline_trials) != len(self.tasks):
            raise ValueError(f"{len(baseline_trials)} baseline trial counts for {len(self.tasks)} tasks")
        self.baseline_trials = list(baseline_trials)
        self.flops = np.asarray([max(t.dag.flop_count, 0) for t in self.tasks], dtype=np.float64)
        self.progress = [TaskProgress() for _ in self.tasks]
        self.group_of: dict[int, list[int]] = {}
        groups: dict[str, list[int]] = {}
        for i, t in enumerate(self.tasks):
            if self.flops[i] > 0:
                groups.setdefault(similarity_tag(t.dag), []).append(i)
        for members in groups.values():
            for i in members:
                self.group_of[i] = members
        self.curve: list[tuple[int, float, float]] = []
        self.history: list[RoundReport] = []
        self.devices: tuple = ()  # a cluster's devices after the latest round (DeviceRow dicts)
        self.queue_depth = 0  # the most candidates that waited for a device in that round
        self.total_trials = 0
        self.round_count = 0
        # (task, fixed seconds, seconds per trial) per round
        self._timings: list[tuple[int, float, float]] = []
        self._rr = 0
        self._start = time.monotonic()
        self._budget: int | None = None
        self._deadline: float | None = None
        self._tuned_from = 0
        # a callback that draws every round itself (aotc.progress.LiveTuning) replaces the per-round line
        self._draws_rounds = any(getattr(cb, "shows_rounds", False) for cb in self.callbacks)

    # ---- state ----

    def restore(self, i: int, trials: int, best_cost: float, dead: str = "") -> None:
        """Start task i from earlier work (resumed records, or a cached kernel when `dead` says so)."""
        p = self.progress[i]
        p.trials = trials
        p.best_cost = best_cost if math.isfinite(best_cost) and best_cost < INVALID else INVALID
        p.rounds = max(1, math.ceil(trials / self.per_round)) if trials else (1 if dead else 0)
        p.best_round = p.rounds
        p.history = [p.best_cost] * p.rounds
        p.dead = dead
        self.total_trials += trials

    @property
    def best_costs(self) -> np.ndarray:
        return np.asarray([p.best_cost for p in self.progress])

    def estimated_latency(self) -> float:
        """Sum over tasks of weight x best latency (inf while some task has no valid cost)."""
        costs = self.best_costs
        if (costs >= INVALID).any():
            return math.inf
        return float(self.objective.latencies(costs).sum())

    def live(self) -> list[int]:
        return [i for i, p in enumerate(self.progress) if not p.dead]

    @property
    def budget(self) -> int | None:
        """The trial budget of the run in progress (restored trials included), None when unlimited."""
        return self._budget

    @property
    def deadline(self) -> float | None:
        """The time.monotonic() the run in progress must end by, if any."""
        return self._deadline

    @property
    def started(self) -> float:
        """The time.monotonic() the run in progress started."""
        return self._start

    @property
    def trials_at_start(self) -> int:
        """Trials already counted (restored) when the run in progress started."""
        return self._tuned_from

    # ---- the loop ----

    def tune(self, trials: int | None, deadline: float | None = None) -> TuneSummary:
        """Run rounds until `trials` (counting restored ones) are spent, `deadline` (a time.monotonic()
        value) would be passed, every task is dead, or the latency targets are met. Ctrl-C ends tuning
        cleanly: the round in flight is dropped and the summary says "interrupted"."""
        self._start = time.monotonic()
        self._budget, self._deadline = trials, deadline
        tuned_from = self._tuned_from = self.total_trials
        n_live = max(1, len(self.live()))
        if trials is not None:
            self.per_round = max(1, min(self.per_round, (trials - self.total_trials) // n_live))
        reason = ""
        try:
            fresh = [i for i in self.live() if self.progress[i].rounds == 0]
            if any(self.baseline_trials[i] for i in fresh):
                for i in fresh:
                    if self.baseline_trials[i]:
                        reason = reason or self._step(i, "baseline", self.baseline_trials[i])
                fresh.reverse()  # the measurers of the last tasks are still open
            # a task whose baseline measured nothing valid (a timeout, a crash under load) warms up first:
            # a small budget spent on the others would leave it with no valid schedule at all (its kernel
            # then the unmeasured default, and nothing of it in the store)
            fresh.sort(key=lambda i: self.progress[i].best_cost < INVALID)
            for i in fresh:
                if not reason and not self.progress[i].dead:
                    reason = self._step(i, "warm-up")
            while not reason:
                reason = self._stop_reason()
                if reason:
                    break
                i, how = self._pick()
                reason = self._step(i, how)
        except KeyboardInterrupt:
            reason = "interrupted"
            self.log("interrupted: tuning stops here; the package is built from the best schedules so far")
        finally:
            close = getattr(self.rounds, "close", None)
            if close is not None:
                close()
        seconds = time.monotonic() - self._start
        self.log(
            f"tuning done: {self.total_trials - tuned_from} trials in {self.round_count} rounds, "
            f"{seconds:.1f} s ({reason}){time_split(self.rounds)}"
        )
        return TuneSummary(self.total_trials - tuned_from, self.round_count, seconds, reason)

    def _stop_reason(self) -> str:
        if self._budget is not None and self.total_trials >= self._budget:
            return "trial budget spent"
        if not self.live():
            return "every task is done"
        if self.objective.met(self.best_costs):
            return "latency target met"
        if self.early_stopping is not None and self.history:
            best = min(range(len(self.history)), key=lambda r: self.history[r].latency)
            since = self.total_trials - self.history[best].total_trials
            if since >= self.early_stopping and math.isfinite(self.estimated_latency()):
                return f"no improvement in {since} trials"
        return ""

    def _step(self, i: int, how: str, trials: int | None = None) -> str:
        """One round of task i; returns a stop reason, or "" to go on."""
        n = trials or self.per_round
        if self._budget is not None:
            n = min(n, self._budget - self.total_trials)
            if n <= 0:
                return "trial budget spent"
        n = self._fits(i, n)
        if n <= 0:
            return "deadline"
        t0 = time.monotonic()
        outcome = self.rounds(i, n)
        wall = time.monotonic() - t0
        p = self.progress[i]
        improved = False
        if outcome.devices:
            self.devices, self.queue_depth = outcome.devices, outcome.queue_depth
        if not outcome.costs:
            p.dead = outcome.error or "the search finds nothing new"
        else:
            m = len(outcome.costs)
            p.trials += m
            p.rounds += 1
            self.total_trials += m
            best = min(outcome.costs)
            if best < p.best_cost:
                p.best_cost, p.best_round, improved = best, p.rounds, True
            p.history.append(p.best_cost)
            fixed = min(outcome.fixed_seconds, wall)
            self._timings.append((i, fixed, (wall - fixed) / m))
            if self.task_early_stopping is not None and p.rounds - p.best_round >= self.task_early_stopping:
                p.dead = f"no improvement in {self.task_early_stopping} rounds"
            self._adjust_group(i)
        self.round_count += 1
        report = RoundReport(
            self.round_count,
            i,
            how,
            len(outcome.costs),
            self.total_trials,
            time.monotonic() - self._start,
            self.estimated_latency(),
            improved,
        )
        self.history.append(report)
        self.curve.append((report.total_trials, report.seconds, report.latency))
        if not self._draws_rounds:
            self.log(self.progress_line(report))
        if self.table:
            self.log(self.format_table())
        for cb in self.callbacks:
            cb(self, report)
        return ""

    def _fits(self, i: int, n: int) -> int:
        """How many of `n` trials of task i fit before the deadline (0: none), from task i's last rounds,
        or the last rounds of any task before its own: one task's candidates can take ten times as long
        to compile and run as another's (ResNet-18's Winograd convolutions against its direct ones)."""
        if self._deadline is None:
            return n
        left = self._deadline - time.monotonic()
        if left <= 0:
            return 0
        recent = [t for t in self._timings if t[0] == i][-ROUND_HISTORY:] or self._timings[-ROUND_HISTORY:]
        if not recent:
            return n
        fixed = max(f for _, f, _ in recent)
        per_trial = max(p for _, _, p in recent) * DEADLINE_MARGIN
        fit = n if per_trial <= 0 else int((left - fixed) / per_trial)
        return min(n, fit) if fit >= min(n, MIN_ROUND_TRIALS) else 0

    # ---- choosing the next task ----

    def _pick(self) -> tuple[int, str]:
        live = self.live()
        if self.strategy == "round-robin":
            i = live[self._rr % len(live)]
            self._rr += 1
            return i, "round-robin"
        chains = {i: self._chain_gradient(i) for i in live}
        useful = [i for i in live if chains[i] > 0] or live
        if self.rng.random() < self.eps:
            return self.rng.choice(useful), "random"
        grads = {i: chains[i] * self._time_gradient(i) for i in live}
        best = min(grads.values())
        ties = [i for i in live if grads[i] == best]
        return (ties[0] if len(ties) == 1 else self.rng.choice(ties)), "gradient"

    def gradients(self) -> dict[int, float]:
        """df/dt_i for every live task (more negative: a round of it should help more)."""
        return {i: self._chain_gradient(i) * self._time_gradient(i) for i in self.live()}

    def _chain_gradient(self, i: int) -> float:
        """df/dg_i by a finite difference (relative step, so latency targets stay exact)."""
        costs = self.best_costs
        delta = max(costs[i] * 1e-3, 1e-12)
        lower = costs.copy()
        lower[i] -= delta
        return (self.objective(costs) - self.objective(lower)) / delta

    def _time_gradient(self, i: int) -> float:
        """alpha x backward + (1 - alpha) x forward, the expected change of g_i per round (<= 0)."""
        p = self.progress[i]
        best = p.best_cost
        h = p.history
        backward = (h[-1] - h[-1 - self.window]) / self.window if len(h) > self.window else 0.0
        g_next_1 = best - best / max(p.rounds, 1)
        g_next_2 = self.beta * 1e30
        group = self.group_of.get(i)
        if group is not None and len(group) > 1 and self.flops[i] > 0:
            reach = max(self.flops[j] / self.progress[j].best_cost for j in group)
            if reach > 0:
                g_next_2 = self.beta * self.flops[i] / reach
        forward = min(g_next_1, g_next_2) - best
        return self.alpha * backward + (1 - self.alpha) * forward

    def _adjust_group(self, i: int) -> None:
        """A task leaves its group when it stays below the group's best FLOP/s over beta after more than 5
        rounds beyond every other member: it is not similar after all (Ansor's rule)."""
        group = self.group_of.get(i)
        if group is None or len(group) <= 1:
            return
        speed = [self.flops[j] / self.progress[j].best_cost for j in group]
        mine = self.flops[i] / self.progress[i].best_cost
        others = max(self.progress[j].rounds for j in group if j != i)
        if mine < max(speed) / self.beta and self.progress[i].rounds > 5 + others:
            group.remove(i)
            del self.group_of[i]

    # ---- reporting ----

    def progress_line(self, r: RoundReport) -> str:
        task = self.tasks[r.task]
        best = self.progress[r.task].best_cost
        budget = f"/{self._budget}" if self._budget is not None else ""
        if self._deadline is not None:
            clock = f"  {r.seconds:6.1f}/{self._deadline - self._start:.0f} s"
        else:
            clock = f"  {r.seconds:6.1f} s"
        line = (
            f"round {r.round:3d}  trials {r.total_trials}{budget}{clock}  "
            f"est. latency {_ms(r.latency)} ms  | task {r.task} {task.name} ({r.how}): "
            f"{r.trials} trials, best {_ms(best)} ms"
        )
        if self.devices:
            from aotc.progress import devices_line

            line += f"  | {devices_line(self.devices, self.queue_depth)}"
        return line

    def rows(self) -> list[dict]:
        """Per task: id, name, trials, best latency (s; None if none valid), GFLOP/s, weight, dead reason."""
        out = []
        for i, (t, p) in enumerate(zip(self.tasks, self.progress)):
            valid = p.best_cost < INVALID
            out.append(
                {
                    "id": i,
                    "name": t.name,
                    "trials": p.trials,
                    "best_latency_s": p.best_cost if valid else None,
                    "gflops": self.flops[i] / p.best_cost / 1e9 if valid else None,
                    "weight": t.weight,
                    "dead": p.dead,
                }
            )
        return out

    def format_table(self) -> str:
        """The per-task table (docs/search.md#task-scheduler), then the estimated end-to-end latency."""
        from aotc.progress import render_text, tasks_table

        lines = [render_text(tasks_table(self))]
        if self.devices:
            from aotc.progress import devices_table

            lines.append(render_text(devices_table(self.devices)))
        lines.append(
            f"estimated end-to-end latency: {_ms(self.estimated_latency())} ms  "
            f"trials: {self.total_trials}  elapsed: {time.monotonic() - self._start:.1f} s"
        )
        return "\n".join(lines)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4f}" if math.isfinite(seconds) else "-"


# ----------------------------------------------------------------------------- the real rounds


class MeasurerPool:
    """Open measurers by task, at most `capacity` at once (each owns worker processes); the least
    recently used is closed first. `open_measurer` opens one (`Measurer`'s signature; a cluster's)."""

    def __init__(
        self,
        target: Target | str,
        options: MeasureOptions | None,
        capacity: int = 2,
        open_measurer: Callable[..., Measurer] = Measurer,
    ):
        self.target, self.options, self.capacity = as_target(target), options, capacity
        self.open_measurer = open_measurer
        self._open: OrderedDict[int, Measurer] = OrderedDict()
        self.opened = 0  # measurers opened so far

    def get(self, i: int, dag: ComputeDAG) -> Measurer:
        if i in self._open:
            self._open.move_to_end(i)
            return self._open[i]
        while len(self._open) >= self.capacity:
            _, old = self._open.popitem(last=False)
            old.close()
        measurer = self.open_measurer(dag, self.target, self.options)
        self._open[i] = measurer
        self.opened += 1
        return measurer

    def drop(self, i: int) -> None:
        m = self._open.pop(i, None)
        if m is not None:
            m.close()

    def close(self) -> None:
        while self._open:
            _, m = self._open.popitem()
            m.close()


def time_split(rounds: object) -> str:
    """Where the tuning time went, summed over the tasks' searches ("; search 12.3 s, build ..."), or ""
    for round runners without local searches (a cluster's)."""
    searches = getattr(rounds, "searches", None)
    if not searches:
        return ""
    parts = ", ".join(f"{k} {sum(s.seconds[k] for s in searches):.1f} s" for k in searches[0].seconds)
    return f"; {parts}"


class SearchRounds:
    """The real round function: one TaskSearch per task sharing `model`, records appended to `records`,
    `untuned[i]` (task i's untuned schedule) then `initial_states[i]` measured in task i's first round;
    task i searches with `params` seeded `params.seed + i`; `open_measurer` opens task i's measurer
    (default `Measurer`: this machine)."""

    def __init__(
        self,
        tasks: Sequence[SchedTask],
        target: Target | str,
        model: CostModel,
        records: str | Path | None = None,
        measure_options: MeasureOptions | None = None,
        initial_states: Sequence[Sequence[State]] | None = None,
        *,
        untuned: Sequence[State] | None = None,
        params: SearchParams | None = None,
        max_open_measurers: int = 2,
        open_measurer: Callable[..., Measurer] = Measurer,
    ):
        self.tasks = list(tasks)
        params = params or SearchParams()
        target = as_target(target)
        self.searches = [
            TaskSearch(
                SearchTask(t.dag, target, t.name),
                model,
                records,
                params.replace(seed=params.seed + i),
                initial_states=initial_states[i] if initial_states else (),
                untuned=untuned[i] if untuned else None,
            )
            for i, t in enumerate(self.tasks)
        ]
        self.pool = MeasurerPool(target, measure_options, max_open_measurers, open_measurer)

    def __call__(self, i: int, n: int) -> RoundOutcome:
        t0 = time.perf_counter()
        try:
            measurer = self.pool.get(i, self.tasks[i].dag)
        except MeasureError as err:
            if isinstance(err, BuildersCannotStart) and not self.pool.opened:
                raise  # not this task's fault and no task could be tuned: the build stops and says why
            return RoundOutcome([], time.perf_counter() - t0, f"cannot be measured: {err}")
        search = self.searches[i]
        states = search.propose(n)
        fixed = time.perf_counter() - t0
        if not states:
            return RoundOutcome([], fixed)
        try:
            search.measure(measurer, states)
        except MeasureError as err:  # its runner cannot start again (a remote device gone): no trials here
            self.pool.drop(i)
            return RoundOutcome([], time.perf_counter() - t0, f"cannot be measured: {err}")
        except BaseException:
            self.pool.drop(i)  # a measurer interrupted mid-batch is not reused
            raise
        costs = [search.cost_of(s) for s in states]
        batch = search.last_batch
        return RoundOutcome(
            [math.inf if c is None else c for c in costs],
            fixed,
            devices=batch.devices if batch else (),
            queue_depth=batch.queue_depth if batch else 0,
        )

    def close(self) -> None:
        self.pool.close()
