"""The task scheduler with an injected, in-process round function: deterministic and fast."""

import math
import time
from dataclasses import dataclass

import pytest

from aotc.search.scheduler import (
    INVALID,
    Objective,
    RoundOutcome,
    TaskScheduler,
    merge_models,
    similarity_tag,
)
from aotc.te.dag import ComputeDAG
from aotc.topi.workloads import make_workload


@dataclass
class FakeTask:
    dag: ComputeDAG
    name: str
    weight: int


class FakeRounds:
    """Task i's best cost after t trials is base[i] * (0.3 + 0.7 / (1 + t / 32)); every candidate of a
    round costs a little more than that, the best one exactly that."""

    def __init__(self, base, exhausted_after=None, flat=(), sleep_per_trial=0.0):
        """`sleep_per_trial`: seconds, one for all tasks or a list with one per task."""
        self.base = base
        self.trials = [0] * len(base)
        self.calls: list[int] = []
        self.exhausted_after = exhausted_after or {}
        self.flat = set(flat)
        self.sleep = sleep_per_trial
        self.closed = False

    def __call__(self, i, n):
        self.calls.append(i)
        if self.calls.count(i) > self.exhausted_after.get(i, math.inf):
            return RoundOutcome([])
        time.sleep((self.sleep[i] if isinstance(self.sleep, list) else self.sleep) * n)
        self.trials[i] += n
        t = 0 if i in self.flat else self.trials[i]
        best = self.base[i] * (0.3 + 0.7 / (1 + t / 32))
        return RoundOutcome([best * (1 + 0.01 * k) for k in range(n)])

    def close(self):
        self.closed = True


def tasks(weights, shapes=None):
    shapes = shapes or [[64, 64, 64]] * len(weights)
    return [FakeTask(make_workload("matmul", s), f"t{i}", w) for i, (w, s) in enumerate(zip(weights, shapes))]


def quiet(**kw):
    return dict(log=lambda _: None, **kw)


def test_heavy_task_gets_more_trials_than_light_one():
    rounds = FakeRounds([1e-3, 1e-3])
    sched = TaskScheduler(tasks([8, 1]), rounds, per_round=16, eps=0.0, **quiet())
    summary = sched.tune(320)
    heavy, light = (p.trials for p in sched.progress)
    assert summary.trials == 320 and heavy + light == 320
    assert heavy > 2 * light > 0
    assert rounds.calls[:2] == [0, 1]  # warm-up: one round per task first
    assert rounds.closed
    assert sched.curve[-1][0] == 320 and sched.curve[-1][2] < sched.curve[1][2]


def test_a_task_whose_baseline_failed_warms_up_first():
    """A small budget (the default schedules, then one 2-trial round for two of four tasks) goes first to
    the task whose default schedule measured nothing valid (a timeout under load): otherwise it ends the
    run with no valid schedule, and a build from the store tunes it again."""

    class FailingBaseline(FakeRounds):
        def __call__(self, i, n):
            if i == 0 and not self.calls.count(0):
                self.calls.append(i)
                return RoundOutcome([math.inf] * n)
            return super().__call__(i, n)

    rounds = FailingBaseline([1e-3] * 4)
    sched = TaskScheduler(tasks([1, 1, 1, 1]), rounds, per_round=8, baseline_trials=1, eps=0.0, **quiet())
    sched.tune(8)
    assert rounds.calls == [0, 1, 2, 3, 0, 3]  # baselines, then task 0, then the rest last first
    assert sched.progress[0].best_cost < INVALID and math.isfinite(sched.estimated_latency())


def test_round_robin_alternates_and_ignores_weights():
    rounds = FakeRounds([1e-3, 1e-3, 1e-3])
    sched = TaskScheduler(tasks([8, 1, 1]), rounds, strategy="round-robin", per_round=10, **quiet())
    sched.tune(90)
    assert rounds.calls == [0, 1, 2] * 3
    assert [p.trials for p in sched.progress] == [30, 30, 30]


def test_dead_tasks_get_no_more_trials():
    # task 0's search is exhausted after 2 rounds; task 1 never improves after its first round
    rounds = FakeRounds([1e-3, 1e-3, 1e-3], exhausted_after={0: 2}, flat={1})
    sched = TaskScheduler(tasks([4, 4, 1]), rounds, per_round=8, eps=0.0, task_early_stopping=3, **quiet())
    sched.tune(400)
    p0, p1, _ = sched.progress
    assert p0.dead == "the search finds nothing new" and p0.trials == 16
    assert p1.dead == "no improvement in 3 rounds" and p1.rounds == 4
    assert rounds.calls.count(0) == 3 and rounds.calls.count(1) == 4
    assert sched.progress[2].trials == 400 - 16 - 32


def test_latency_target_stops_early():
    rounds = FakeRounds([1e-3, 2e-3])
    target = 0.6 * (1e-3 + 2e-3)
    sched = TaskScheduler(
        tasks([1, 1]), rounds, Objective.total_latency([1, 1], target), **quiet(per_round=8)
    )
    summary = sched.tune(10_000)
    assert summary.stop_reason == "latency target met"
    assert sched.estimated_latency() <= target and summary.trials < 10_000


def test_eps_greedy_sometimes_picks_at_random_and_is_seeded():
    def run(eps, seed):
        sched = TaskScheduler(
            tasks([50, 1]), FakeRounds([1e-3, 1e-3]), per_round=4, eps=eps, seed=seed, **quiet()
        )
        sched.tune(400)
        return [r.how for r in sched.history], [r.task for r in sched.history]

    hows, picks = run(0.3, seed=1)
    assert "random" in hows and "gradient" in hows
    assert run(0.3, seed=1) == (hows, picks)
    assert "random" not in run(0.0, seed=1)[0]


def test_similar_faster_task_makes_the_gradient_steeper():
    sched = TaskScheduler(tasks([1, 1]), FakeRounds([1e-3, 1e-3]), per_round=4, eps=0.0, **quiet())
    sched.restore(0, 64, 1e-3)
    sched.restore(1, 64, 1e-5)  # the same op reaches 100x the FLOP/s
    with_group = sched.gradients()[0]
    sched.group_of.clear()
    assert with_group < sched.gradients()[0] < 0


def test_similarity_tags_follow_the_anchor_op_and_size():
    a = similarity_tag(make_workload("matmul", [64, 64, 64]))
    assert a == similarity_tag(make_workload("matmul", [64, 64, 60]))
    assert a != similarity_tag(make_workload("matmul", [512, 512, 512]))
    assert a != similarity_tag(make_workload("conv2d"))


def test_several_models_share_tasks_in_one_objective():
    m1 = tasks([2, 1], [[64, 64, 64], [32, 32, 32]])
    m2 = tasks([3], [[64, 64, 64]])
    merged, weights = merge_models([m1, m2])
    assert [t.dag.workload_key for t in merged] == [t.dag.workload_key for t in m1]
    obj = Objective.several_models(merged, weights, targets=[None, 1.0])
    assert obj.weights.tolist() == [[2.0, 1.0], [3.0, 0.0]]
    assert obj([1e-3, 2e-3]) == pytest.approx(2e-3 + 2e-3 + 1.0)  # model 2 is under its 1 s target
    sched = TaskScheduler(merged, FakeRounds([1e-3, 2e-3]), obj, per_round=4, eps=0.0, **quiet())
    sched.restore(0, 4, 1e-3)
    sched.restore(1, 4, 2e-3)
    assert sched._chain_gradient(0) == pytest.approx(2.0) and sched._chain_gradient(1) == pytest.approx(1.0)


def test_deadline_is_kept_and_interrupt_stops_cleanly():
    rounds = FakeRounds([1e-3, 1e-3], sleep_per_trial=0.005)
    sched = TaskScheduler(tasks([1, 1]), rounds, per_round=16, **quiet())
    start = time.monotonic()
    summary = sched.tune(None, deadline=start + 1.0)
    assert summary.stop_reason == "deadline" and summary.trials > 32
    assert time.monotonic() - start < 1.0 + 0.1

    def interrupt(s, report):
        if report.round == 3:
            raise KeyboardInterrupt

    rounds = FakeRounds([1e-3, 1e-3])
    sched = TaskScheduler(tasks([1, 1]), rounds, per_round=8, callbacks=[interrupt], **quiet())
    summary = sched.tune(1000)
    assert summary.stop_reason == "interrupted" and summary.rounds == 3 and rounds.closed


def test_deadline_holds_when_one_task_is_much_slower_than_the_others():
    """Three fast tasks, then a slow one: the slow task's round must be sized by its own timings, not by
    the fast rounds just before it (which would overrun the deadline by most of a slow round, 0.8 s)."""
    rounds = FakeRounds([1e-3] * 4, sleep_per_trial=[0.0005, 0.0005, 0.0005, 0.05])
    sched = TaskScheduler(tasks([1] * 4), rounds, strategy="round-robin", per_round=16, **quiet())
    start = time.monotonic()
    summary = sched.tune(None, deadline=start + 2.0)
    assert summary.stop_reason == "deadline"
    assert time.monotonic() - start < 2.0 + 0.15
    assert rounds.calls.count(3) >= 2


def test_restored_trials_count_toward_the_budget():
    rounds = FakeRounds([1e-3, 1e-3])
    sched = TaskScheduler(tasks([1, 1]), rounds, per_round=8, **quiet())
    sched.restore(0, 40, 1e-3)
    sched.restore(1, 0, 1e-3, dead="cached")
    summary = sched.tune(64)
    assert summary.trials == 24 and rounds.calls == [0, 0, 0]
