"""What a build shows its user: the `aotc` loggers, tuning progress (one line per round, or one in-place
display on a terminal) and tables, all through `logging` and `rich` (imported when first drawn)."""

from __future__ import annotations

import io
import logging
import math
import os
import sys
import time
from collections.abc import Sequence
from typing import IO, Any

__all__ = [
    "LiveTuning",
    "build_log",
    "configure_logging",
    "render_text",
    "table",
    "terminal",
]

BUILD_LOGGER = "aotc.build"


def build_log(line: str) -> None:
    """The build's default `log`: an INFO message of the `aotc.build` logger."""
    logging.getLogger(BUILD_LOGGER).info(line)


class StderrHandler(logging.Handler):
    """Writes to whatever `sys.stderr` is when a message comes: under the live display that is rich's
    proxy, which prints the message above the display instead of through it."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(self.format(record), file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001 - logging must never take the build down
            self.handleError(record)


class CommandFormatter(logging.Formatter):
    """Plain messages for INFO and DEBUG; `aotc: warning: ...` for warnings and errors."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.levelno >= logging.WARNING:
            return f"aotc: {record.levelname.lower()}: {message}"
        return message


def configure_logging(verbosity: int = 0) -> None:
    """Route the `aotc` loggers to stderr for the command line: -q (verbosity < 0) shows warnings and
    errors only, the default adds the build's messages, -v (> 0) adds debug messages."""
    level = logging.WARNING if verbosity < 0 else logging.INFO if verbosity == 0 else logging.DEBUG
    logger = logging.getLogger("aotc")
    for handler in [h for h in logger.handlers if isinstance(h, StderrHandler)]:
        logger.removeHandler(handler)
    handler = StderrHandler()
    handler.setFormatter(CommandFormatter())
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False


def terminal(stream: IO | None = None) -> bool:
    """Whether `stream` (default stderr) is an interactive terminal that can redraw in place."""
    stream = stream if stream is not None else sys.stderr
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and os.environ.get("TERM", "") != "dumb"


# ----------------------------------------------------------------------------- tables


def table(
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    right: Sequence[str] = (),
    title: str | None = None,
    markdown: bool = False,
):
    """A rich Table of `rows` under `columns`; the columns named in `right` are right-aligned;
    `markdown` draws it as a Markdown table (for report.md)."""
    from rich import box
    from rich.table import Table

    if markdown:
        t = Table(title=title, box=box.MARKDOWN, show_edge=True, pad_edge=True)
    else:
        t = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for name in columns:
        t.add_column(name, justify="right" if name in right else "left", no_wrap=True)
    for row in rows:
        t.add_row(*("-" if cell is None else str(cell) for cell in row))
    return t


def render_text(renderable, width: int = 1000) -> str:
    """A rich renderable as plain text (no colours, trailing spaces stripped), for logs and files."""
    from rich.console import Console

    buffer = io.StringIO()
    Console(file=buffer, width=width, color_system=None, force_terminal=False, soft_wrap=False).print(
        renderable
    )
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()).strip("\n")


def ms(seconds: float | None) -> str:
    return f"{seconds * 1e3:.4f}" if seconds is not None and math.isfinite(seconds) else "-"


def tasks_table(scheduler, current: int | None = None):
    """The task scheduler's per-task table: latency, GFLOP/s, trials, weight, and why a task stopped;
    the task of the latest round is marked."""
    rows = []
    for row in scheduler.rows():
        mark = ">" if row["id"] == current else ""
        gflops = f"{row['gflops']:.2f}" if row["gflops"] is not None else None
        rows.append(
            [
                f"{mark}{row['id']}",
                row["name"][:40],
                ms(row["best_latency_s"]),
                gflops,
                row["trials"],
                row["weight"],
                row["dead"] or "",
            ]
        )
    columns = ["ID", "Task", "Latency (ms)", "GFLOP/s", "Trials", "Weight", "Done"]
    return table(columns, rows, right=("ID", "Latency (ms)", "GFLOP/s", "Trials", "Weight"))


def devices_line(devices: Sequence[dict], queue_depth: int) -> str:
    """A cluster's devices in a few words: how many measured in the round, of how many, the queue."""
    ready = [d for d in devices if d["state"] == "ready"]
    used = sum(1 for d in devices if d["batch_trials"])
    out = [d for d in devices if d["state"] != "ready"]
    named = ", ".join(f"{d['name']} {d['state']}" for d in out)
    gone = f", {len(out)} out ({named})" if out else ""
    return f"devices {used}/{len(ready)} measuring{gone}, queue {queue_depth}"


def devices_table(devices: Sequence[dict]):
    """A cluster's devices: state, trials in the latest round and in the build, strikes, and why a device
    is out (docs/cluster.md#observability)."""
    rows = [
        [d["name"], d["host"], d["state"], d["batch_trials"], d["trials"], d["strikes"], d["note"][:60]]
        for d in devices
    ]
    columns = ["Device", "Machine", "State", "Round", "Trials", "Strikes", "Note"]
    return table(columns, rows, right=("Round", "Trials", "Strikes"))


# ----------------------------------------------------------------------------- live display


def remaining_seconds(scheduler, now: float) -> float | None:
    """Seconds until the tuning budget runs out: the deadline's, or the trials' at this run's pace,
    whichever comes first (None while unknown)."""
    estimates = []
    if scheduler.deadline is not None:
        estimates.append(max(0.0, scheduler.deadline - now))
    if scheduler.budget is not None:
        done = scheduler.total_trials - scheduler.trials_at_start
        left = scheduler.budget - scheduler.total_trials
        elapsed = now - scheduler.started
        if done > 0 and elapsed > 0:
            estimates.append(max(0.0, left * elapsed / done))
    return min(estimates) if estimates else None


def fraction_done(scheduler, now: float) -> float:
    """How much of the budget is spent: of the trials or of the deadline's time, whichever is further."""
    parts = [0.0]
    if scheduler.budget:
        parts.append(scheduler.total_trials / scheduler.budget)
    if scheduler.deadline is not None:
        span = scheduler.deadline - scheduler.started
        parts.append((now - scheduler.started) / span if span > 0 else 1.0)
    return min(1.0, max(parts))


def clock(seconds: float | None) -> str:
    if seconds is None:
        return "--:--"
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60:02d}:{rest % 60:02d}"


class LiveTuning:
    """One in-place display for a build's tuning, on a terminal: the overall bar with the time left
    against the trials and the deadline, the latest round, and the per-task table, redrawn after every
    round (and the clock twice a second). A scheduler callback; use it as a context manager.

    `shows_rounds` tells the task scheduler not to log a line per round: this display shows them."""

    shows_rounds = True

    def __init__(self, stream: IO | None = None):
        self.stream = stream if stream is not None else sys.stderr
        self.scheduler = None
        self.report = None
        self.live = None

    def __enter__(self) -> LiveTuning:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __call__(self, scheduler, report) -> None:
        self.scheduler, self.report = scheduler, report
        if self.live is None:
            from rich.console import Console
            from rich.live import Live

            console = Console(file=self.stream)
            self.live = Live(
                get_renderable=self.render, console=console, refresh_per_second=2, redirect_stdout=False
            )
            self.live.start()
        self.live.refresh()

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None

    def render(self):
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        s, r = self.scheduler, self.report
        now = time.monotonic()
        budget = f"/{s.budget}" if s.budget is not None else ""
        head = Table.grid(padding=(0, 1))
        head.add_row(
            ProgressBar(total=1.0, completed=fraction_done(s, now), width=40),
            Text(
                f"{fraction_done(s, now):4.0%}  trials {s.total_trials}{budget}  "
                f"elapsed {clock(now - s.started)}  left {clock(remaining_seconds(s, now))}  "
                f"est. latency {ms(s.estimated_latency())} ms"
            ),
        )
        task = s.tasks[r.task]
        line = Text(
            f"round {r.round}: task {r.task} {task.name} ({r.how}), {r.trials} trials"
            + (", improved" if r.improved else "")
        )
        parts = [head, line, tasks_table(s, current=r.task)]
        if s.devices:
            parts += [Text(devices_line(s.devices, s.queue_depth)), devices_table(s.devices)]
        return Group(*parts)
