"""Whole-model tuning: every task of a model searched under one budget by the gradient task scheduler,
and the one options object (`TuningOptions`) that says how much, where records go and how to measure."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from aotc.schedule.state import State
from aotc.search.measure import MeasureOptions, Measurer
from aotc.search.params import SearchParams
from aotc.search.records import Record
from aotc.search.scheduler import SearchRounds, TaskScheduler, TuneSummary
from aotc.target import Target

__all__ = [
    "TuningOptions",
    "TuningRun",
    "deadline_reserve",
    "duration_problem",
    "parse_duration",
    "tune_tasks",
]

# Time kept back from a deadline for what follows tuning: reloading records, lowering, LLVM codegen,
# packaging, validation and the report. Fixed part + per kernel (twice that with validation), at most
# RESERVE_MAX_FRACTION of the deadline.
RESERVE_FIXED_SECONDS = 2.0
RESERVE_PER_TASK_SECONDS = 0.15
RESERVE_MAX_FRACTION = 0.4
MAX_TRIALS = 10_000_000
MAX_DEADLINE_SECONDS = 30 * 24 * 3600.0
DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?")


def parse_duration(text: str) -> float | None:
    """Seconds in ``90s``, ``45m``, ``1h30m``, ``2h`` or a plain number; None when unparsable or not
    finite (``inf``, ``nan``)."""
    text = text.strip().replace(" ", "")
    try:
        value = float(text)
    except ValueError:
        m = DURATION.fullmatch(text)
        if not text or m is None:
            return None
        h, mins, s = (float(g) if g else 0.0 for g in m.groups())
        value = h * 3600 + mins * 60 + s
    return value if math.isfinite(value) else None


def duration_problem(seconds: float | None) -> str:
    """Why `seconds` is not a usable tuning deadline, or ""."""
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        return "expected a positive duration like 90s, 30m, 1h30m"
    if seconds > MAX_DEADLINE_SECONDS:
        return f"more than {MAX_DEADLINE_SECONDS / 86400:g} days"
    return ""


@dataclass(frozen=True)
class TuningOptions:
    """How a model is tuned, every setting with its one default.

    Budget: `trials` (total measurements, spent by the task scheduler) and/or `deadline` (seconds, or a
    duration such as "30m"; the package is written by then); neither means no tuning, and so does
    `trials=0` whatever the deadline (0 is the off switch; leave trials out to tune until a deadline).
    Records: `records`, the build's own log (default: next to the package); `tophub`, shared stores
    (None: $AOTC_TOPHUB, [] none); `transfer`, measure records of other CPUs of the target's ISA here.
    Measurement: `measure`; `cluster`, HOST:PORT of a Ray head whose devices measure the candidates
    (docs/cluster.md#builds; None: this machine). Search: `search`, the search policy (aotc.search.params:
    population, per round, the task scheduler's strategy, the seed, ...)."""

    trials: int | None = None
    deadline: float | str | None = None
    records: Path | str | None = None
    tophub: list[str] | None = None
    transfer: bool = True
    measure: MeasureOptions = field(default_factory=lambda: MeasureOptions(repeat=3, min_repeat_ms=20))
    search: SearchParams = field(default_factory=SearchParams)
    cluster: str | None = None

    def __post_init__(self) -> None:
        if self.trials is not None and not (
            isinstance(self.trials, int)
            and not isinstance(self.trials, bool)
            and 0 <= self.trials <= MAX_TRIALS
        ):
            raise ValueError(
                f"TuningOptions.trials: expected an int from 0 to {MAX_TRIALS}, got {self.trials!r}"
            )
        if self.deadline is not None:
            seconds = (
                parse_duration(self.deadline) if isinstance(self.deadline, str) else float(self.deadline)
            )
            problem = duration_problem(seconds)
            if problem:
                raise ValueError(f"TuningOptions.deadline {self.deadline!r}: {problem}")
            object.__setattr__(self, "deadline", seconds)
        if self.records is not None:
            object.__setattr__(self, "records", Path(os.fspath(self.records)).expanduser())
        if self.tophub is not None:
            object.__setattr__(self, "tophub", [str(s) for s in self.tophub])
        if self.cluster is not None:
            address = str(self.cluster).strip()
            problem = cluster_address_problem(address)
            if problem:
                raise ValueError(f"TuningOptions.cluster {self.cluster!r}: {problem}")
            object.__setattr__(self, "cluster", address)
        if not isinstance(self.search, SearchParams):
            raise TypeError(
                f"TuningOptions.search: expected a SearchParams, got {type(self.search).__name__}"
            )

    @property
    def wants_tuning(self) -> bool:
        """A budget is set and it is not zero trials."""
        return self.trials != 0 and (self.trials is not None or self.deadline is not None)

    @contextlib.contextmanager
    def measurers(self, target: Target) -> Iterator[Callable[..., Measurer]]:
        """What opens a tuning run's measurers (`Measurer`'s signature): this machine's, or with `cluster`
        those of the cluster's devices, through one driver process kept for the run (the only process
        that imports Ray; docs/cluster.md#builds). A cluster that cannot be reached is a ClusterError,
        unless the target is this machine's CPU: then the run measures here, and says so."""
        if self.cluster is None:
            yield Measurer
            return
        from aotc.cluster import Cluster, ClusterError, cluster_problem

        problem = cluster_problem(self.cluster)
        if problem and runs_here(target):
            logging.getLogger("aotc.tuning").warning(f"{problem}: measuring on this machine instead")
            yield Measurer
            return
        if problem:
            raise ClusterError(
                f"{problem}; {target} is not this machine's CPU, so it cannot be measured here"
            )
        with Cluster(self.cluster) as cluster:
            yield cluster.open_measurer

    def replace(self, **changes) -> TuningOptions:
        return replace(self, **changes)


def cluster_address_problem(address: str) -> str:
    """Why `address` is not HOST:PORT of a Ray head, or ""."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return f"expected HOST:PORT of a Ray head (docs/cluster.md), got '{address}'"
    return ""


def runs_here(target: Target) -> bool:
    """`target` is a CPU of this machine's architecture (its kernels run here for real)."""
    import llvmlite.binding as llvm

    from aotc.target import arch_of

    return target.is_cpu and arch_of(target.triple) == arch_of(llvm.get_process_triple())


@dataclass
class TuningRun:
    scheduler: TaskScheduler
    summary: TuneSummary
    new_trials: list[int]


def deadline_reserve(n_tasks: int, validate: bool, deadline_seconds: float) -> float:
    """Seconds kept back from a build's deadline for codegen, packaging, validation and the report."""
    per_task = RESERVE_PER_TASK_SECONDS * n_tasks * (2 if validate else 1)
    return min(RESERVE_FIXED_SECONDS + per_task, RESERVE_MAX_FRACTION * deadline_seconds)


def tune_tasks(
    tasks: Sequence,
    target: Target,
    options: TuningOptions,
    *,
    records: Path,
    known: list[Record],
    cached_costs: Sequence[float | None],
    untuned: Sequence[State],
    seeds: Sequence[list] = (),
    trials: int | None,
    deadline: float | None,
    resume: bool = False,
    warm_start: Callable | None = None,
    callbacks: Sequence[Callable] = (),
    log: Callable[[str], None] = print,
) -> TuningRun:
    """Tune `tasks` (each with `.dag`, `.weight`, `.workload_key`) with the task scheduler until `trials`
    or the `deadline` (time.monotonic()), appending every measurement to `records`.

    `cached_costs[i]` is the cost of task i's stored record, if the lookup found one: without `resume`
    such a task is done (no trials) and the budget goes to the others; with `resume`, every task goes on
    and the trials already in `known` count toward the budget. Nothing in `known` is measured again.
    `untuned[i]` is task i's untuned schedule (the build's, `aotc.search.untuned`), measured first and its
    record marked. `seeds[i]` (schedules of other CPUs) join it in task i's first round and then seed
    its search; `trials=0` measures only those first rounds. `warm_start(cost_model)` trains the shared
    cost model on stored records before a tuning (not a seeds-only) run."""
    from aotc.search.cost_model import XGBCostModel

    seeds = list(seeds) or [[] for _ in tasks]
    model = XGBCostModel()
    params = options.search
    with options.measurers(target) as open_measurer:  # a cluster's driver lives as long as the run
        rounds = SearchRounds(
            tasks,
            target,
            model,
            records,
            options.measure,
            seeds,
            untuned=untuned,
            params=params,
            open_measurer=open_measurer,
        )
        scheduler = TaskScheduler(
            tasks,
            rounds,
            strategy=params.strategy,
            per_round=params.per_round,
            seed=params.seed,
            callbacks=callbacks,
            log=log,
            baseline_trials=[1] * len(tasks),  # set per task below, once resumed records are known
        )
        restored = [0] * len(tasks)
        only_seeds = trials == 0
        for i, (search, cached) in enumerate(zip(rounds.searches, cached_costs)):
            if cached is not None and not resume:
                scheduler.restore(i, 0, cached, dead="cached")
                continue
            done = search.resume(known, train=False)
            if resume and done:
                scheduler.restore(i, done, search.result.best_cost)
                restored[i] = done
            scheduler.baseline_trials[i] = search.pending_initial()
            if only_seeds and not (seeds[i] and scheduler.baseline_trials[i]):
                scheduler.restore(i, 0, search.result.best_cost, dead="no transferred schedule to measure")
        todo = len(scheduler.live())
        if not todo:
            log(f"all {len(tasks)} tasks have tuned records: nothing to tune")
            return TuningRun(scheduler, TuneSummary(0, 0, 0.0, "every task is done"), [0] * len(tasks))
        if only_seeds:
            trials = sum(scheduler.baseline_trials[i] for i in scheduler.live())
            log(
                f"measuring {sum(len(seeds[i]) for i in scheduler.live())} schedule(s) transferred from other "
                f"CPUs or twin workloads next to the default schedules of {todo} of {len(tasks)} tasks"
            )
        else:
            if warm_start is not None:
                warm_start(model)
            limits = [f"{trials} trials" if trials is not None else "", "a deadline" if deadline else ""]
            log(f"tuning {todo} of {len(tasks)} tasks with {' and '.join(x for x in limits if x)}")
            if trials is not None:
                warn_small_budget(scheduler, trials, params.per_round)
        try:
            summary = scheduler.tune(trials, deadline)
        finally:
            for callback in callbacks:  # a display of the tuning (aotc.progress.LiveTuning) ends with it
                close = getattr(callback, "close", None)
                if callable(close):
                    close()
        if (
            scheduler.devices
        ):  # a cluster's devices, once more: which measured, which were lost or quarantined
            from aotc.progress import devices_table, render_text

            log(f"the cluster's devices:\n{render_text(devices_table(scheduler.devices))}")
        if deadline is not None and not only_seeds and summary.stop_reason == "deadline":
            warn_short_deadline(scheduler)
        return TuningRun(scheduler, summary, [p.trials - r for p, r in zip(scheduler.progress, restored)])


def warn_small_budget(scheduler: TaskScheduler, trials: int, per_round: int) -> None:
    """Warn when `trials` cannot give every live task one full search round after its default schedule:
    the scheduler then shrinks every round and has none left to spend where it helps most."""
    live = scheduler.live()
    left = trials - scheduler.total_trials
    baseline = sum(scheduler.baseline_trials[i] for i in live if scheduler.progress[i].rounds == 0)
    needed = baseline + len(live) * per_round
    if left >= needed:
        return
    n = len(live)
    each = max(1, min(per_round, left // max(n, 1)))  # the round size TaskScheduler.tune will use
    logging.getLogger("aotc.tuning").warning(
        f"a budget of {left} trials for {n} tasks: the task scheduler sizes its rounds to {each} "
        f"candidates (a full round is {per_round}), and the default schedules ({baseline} trials) and one "
        f"warm-up round per task use it up, leaving no round for the tasks that gain most. Give at least "
        f"{needed} trials for one full round per task, {needed + n * per_round} or more for the scheduler to "
        "choose"
    )


def warn_short_deadline(scheduler: TaskScheduler) -> None:
    """Warn when the deadline ended tuning before any search round (only default schedules measured)."""
    searched = [r for r in scheduler.history if r.how != "baseline"]
    if searched:
        return
    measured = sum(1 for r in scheduler.history)
    logging.getLogger("aotc.tuning").warning(
        f"the deadline left time for {measured} round(s) measuring default schedules and no search round; "
        "give a longer deadline to tune"
    )
