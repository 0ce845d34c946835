"""Under a deadline, the last round is sized with a margin: rounds that turn 40% slower per trial than
the rounds before them (a busier machine) still end by the deadline."""

import time

from aotc.search.scheduler import RoundOutcome, TaskScheduler

from .test_scheduler import quiet, tasks


class SlowingRounds:
    """0.01 s per trial for the first two rounds, 0.014 s after."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, i: int, n: int) -> RoundOutcome:
        self.calls += 1
        time.sleep(n * (0.01 if self.calls <= 2 else 0.014))
        return RoundOutcome([1e-3] * n, 0.0)


def test_a_slowing_machine_does_not_push_the_last_round_past_the_deadline():
    # without the margin: 32 + 32 trials end at 0.64 s, 26 more are sized to fit 0.26 s and take 0.36 s
    rounds = SlowingRounds()
    sched = TaskScheduler(tasks([1]), rounds, strategy="round-robin", per_round=32, **quiet())
    start = time.monotonic()
    summary = sched.tune(None, deadline=start + 0.9)
    assert summary.stop_reason == "deadline" and rounds.calls >= 3
    assert time.monotonic() - start < 0.9 + 0.05
