"""The build report: `<name>.report/` next to the package with report.json, report.md and curve.png.

`report.json` is the data (per task: name, workload key, fingerprint, weight, FLOPs, trials, best and
default-schedule latency, where the kernel came from, and what schedules transferred from other CPUs
or twin workloads measured here; the tuning curve as [trials, wall seconds, estimated end-to-end latency]
triples; the written package's measured latency, a short benchmark at the
target's thread count). `report.md` is the same as tables; `curve.png` plots the
estimated end-to-end latency against trials and against wall time. Every file is written atomically.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from aotc.files import atomic_file
from aotc.progress import render_text, table
from aotc.target import cpu_class

if TYPE_CHECKING:  # annotations only: the report reads these objects, it imports none of their stages
    from aotc.graph.partition import Task
    from aotc.hub import Lookup
    from aotc.recipe import Recipe
    from aotc.schedule.state import State
    from aotc.search.model_tuning import TuningRun
    from aotc.search.records import Record
    from aotc.target import Target

REPORT_FORMAT = "aotc-build-report"
REPORT_VERSION = 1


def report_dir(package: Path) -> Path:
    """`build/model.aotc` -> `build/model.report`."""
    return package.parent / f"{package.stem}.report"


def write_report(directory: Path, report: dict) -> list[Path]:
    """Write report.json, report.md and (when there is a tuning curve) curve.png; returns the paths."""
    directory.mkdir(parents=True, exist_ok=True)
    report = {"format": REPORT_FORMAT, "version": REPORT_VERSION, **report}
    text = json.dumps(report, indent=1, allow_nan=False, default=_jsonable) + "\n"
    written = [
        _written(directory / "report.json", lambda f: f.write(text.encode())),
        _written(directory / "report.md", lambda f: f.write(format_markdown(report).encode())),
    ]
    curve = [p for p in report.get("curve", []) if p[2] is not None]
    if curve:
        written.append(_written(directory / "curve.png", lambda f: plot_curve(curve, f, curve_title(report))))
    return written


def format_markdown(report: dict) -> str:
    tuning = report.get("tuning", {})
    lines = [
        f"# Build report: {Path(report['package']).name}",
        "",
        f"- model: `{report['model']}`",
        f"- target: `{report['target']}`",
        f"- built in {report['seconds']:.1f} s on {report.get('created', '?')}",
    ]
    if tuning.get("enabled"):
        budget = tuning.get("budget_trials")
        deadline = tuning.get("deadline_seconds")
        limits = ", ".join(
            x
            for x in (
                f"budget {budget} trials" if budget is not None else "",
                f"deadline {deadline:g} s" if deadline is not None else "",
            )
            if x
        )
        lines.append(
            f"- tuning: {tuning['new_trials']} new trials ({tuning['trials']} in all) in {tuning['rounds']} "
            f"rounds, {tuning['seconds']:.1f} s ({limits}); stopped: {tuning['stop_reason']}"
        )
    else:
        lines.append("- tuning: off")
    estimated, default = report.get("estimated_latency_s"), report.get("default_latency_s")
    lines += [
        f"- estimated end-to-end latency: {_ms(estimated)} ms "
        f"(default schedules: {_ms(default)} ms, speedup {_speedup(default, estimated)})",
        f"- measured end-to-end latency: {_measured_line(report.get('measured_latency'))}",
        "",
    ]
    # a source that is a file (records:/abs/path/x.jsonl) is listed once below the table, not per row
    paths: dict[str, int] = {}
    rows = []
    for t in report["tasks"]:
        source = t["source"]
        kind, sep, where = source.partition(":")
        if sep and "/" in where:
            source = f"{kind} [{paths.setdefault(source, len(paths) + 1)}]"
        best, default = t.get("best_latency_s"), t.get("default_latency_s")
        rows.append(
            [
                t["id"],
                t["name"],
                t["weight"],
                f"{t['flops'] / 1e6:.3f}",
                t["trials"],
                _ms(best),
                _ms(default),
                _speedup(default, best),
                f"{t['gflops']:.2f}" if t.get("gflops") is not None else "-",
                source,
            ]
        )
    columns = ["ID", "Task", "Weight", "MFLOP", "Trials", "Best (ms)", "Default (ms)", "Speedup", "GFLOP/s"]
    right = [c for c in columns if c != "Task"]
    lines.append(render_text(table([*columns, "Kernel from"], rows, right=right, markdown=True)))
    if paths:
        lines += [""] + [f"[{n}] `{source}`  " for source, n in paths.items()]
    transferred = [t for t in report["tasks"] if t.get("transfer")]
    if transferred:
        lines += ["", "## Schedules transferred from other CPUs or twin workloads (measured here)", ""]
        lines += [f"- {t['id']} {t['name']}: {_transfer_line(t['transfer'])}" for t in transferred]
    if report.get("curve"):
        lines += ["", "Tuning curve: `curve.png` (estimated end-to-end latency vs trials and vs wall time)."]
    return "\n".join(lines) + "\n"


MEASURE_WARMUP_SECONDS, MEASURE_WARMUP_RUNS = 0.1, 10
MEASURE_SECONDS, MEASURE_RUNS = 1.0, 200
"""The build's benchmark of the package it wrote: 1 s or 200 runs, whichever comes first (200 runs give
stable percentiles of a fast model and keep a build of one short)."""


def measure_package(package: str | Path, target: Target) -> dict:
    """The written package's measured latency (`aotc_runtime.bench`'s result) at the target's thread
    count (at most the cores this process may use), or {"skipped": why} where this host cannot load it
    (another architecture, CPU features it lacks, a signature policy the package does not meet, no device
    of a GPU package's kind)."""
    import aotc_runtime
    from aotc_runtime.bench import Budget, benchmark

    from aotc.target import host_cores

    threads = max(1, min(target.hw.num_cores, host_cores()))
    try:
        model = aotc_runtime.load(str(package), num_threads=threads)
    except (aotc_runtime.PackageError, aotc_runtime.GPUUnavailable) as err:
        return {"skipped": str(err)}  # GPUUnavailable: a GPU package where this machine has no such device
    result = benchmark(
        model,
        budget=Budget(seconds=MEASURE_SECONDS, runs=MEASURE_RUNS),
        warmup=Budget(seconds=MEASURE_WARMUP_SECONDS, runs=MEASURE_WARMUP_RUNS),
    )
    return result.to_dict()


def _measured_line(measured: dict | None) -> str:
    if measured is None:
        return "not measured"
    if "skipped" in measured:
        return f"not measured on this host ({measured['skipped']})"
    lat = measured["latency_ms"]
    return (
        f"p50 {lat['p50_ms']:.4f} ms (p90 {lat['p90_ms']:.4f}, p99 {lat['p99_ms']:.4f}, min {lat['min']:.4f}) "
        f"over {measured['runs']} runs at {measured['threads']} threads"
    )


def _speedup(default: float | None, best: float | None) -> str:
    """How many times faster the chosen schedule is than the default one ("-" where either is unknown)."""
    if default is None or best is None or not best > 0 or not math.isfinite(default / best):
        return "-"
    return f"{default / best:.2f}x"


def curve_title(report: dict) -> str:
    """The curve's title: model file, target (its feature list counted, not listed) and CPU."""
    target = re.sub(
        r"-mattr=(\S+)", lambda m: f"-mattr=<{m.group(1).count(',') + 1} features>", str(report["target"])
    )
    cpu = f" on {report['cpu']}" if report.get("cpu") else ""
    return f"{Path(report['model']).name}: {target}{cpu}"


def _transfer_line(transfer: dict) -> str:
    cells = []
    for c in transfer["candidates"]:
        here = f"{_ms(c['cost_s'])} ms here" if c["cost_s"] is not None else c["problem"]
        cells.append(f"{_ms(c['foreign_cost_s'])} ms on {c['from']} -> {here}")
    cells += transfer["skipped"]
    return (
        f"transferred from {transfer['from']}: {'; '.join(cells)}; default schedule "
        f"{_ms(transfer['default_cost_s'])} ms here; kernel: {transfer['kernel']}"
    )


def plot_curve(curve: list, file, title: str = "tuning curve") -> None:
    """Two subplots: estimated end-to-end latency (ms) vs trials, and vs wall seconds, under `title`."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    trials = [p[0] for p in curve]
    seconds = [p[1] for p in curve]
    latency = [p[2] * 1e3 for p in curve]
    fig = Figure(figsize=(10, 4))
    for ax, xs, label in zip(fig.subplots(1, 2), (trials, seconds), ("trials", "wall time (s)")):
        ax.plot(xs, latency, marker=".", drawstyle="steps-post")
        ax.set_xlabel(label)
        ax.set_ylabel("estimated end-to-end latency (ms)")
        ax.grid(True, alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(file, format="png", dpi=100)


def _ms(seconds: float | None) -> str:
    return f"{seconds * 1e3:.4f}" if seconds is not None and math.isfinite(seconds) else "-"


def _jsonable(value):
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serializable")


def format_profile(calls: list, whole_ms: float, threads: int) -> str:
    """`aotc profile`'s table: each kernel call of the plan in order, its median time, share and GFLOP/s
    (and, where timed, its median alone and what running in sequence costs it), then the sum of the
    calls against the whole run's median."""
    in_sum = sum(c.median_ms for c in calls)
    total = in_sum or math.inf
    alone = bool(calls) and all(c.alone_ms is not None for c in calls)
    columns = ["#", "kernel", "median ms", "min ms", "share", "GFLOP/s"] + (
        ["alone ms", "lost ms"] if alone else []
    )
    rows = [
        [
            c.index,
            c.kernel,
            f"{c.median_ms:.3f}",
            f"{c.min_ms:.3f}",
            f"{c.median_ms / total:.1%}",
            f"{c.gflops:.1f}" if c.flops else None,
            *([f"{c.alone_ms:.3f}", f"{c.median_ms - c.alone_ms:.3f}"] if alone else []),
        ]
        for c in calls
    ]
    lines = [render_text(table(columns, rows, right=[c for c in columns if c != "kernel"]))]
    lines.append(
        f"{len(calls)} kernel calls at {threads} threads: {in_sum:.3f} ms in sum; "
        f"the whole run (one call of the entry function) {whole_ms:.3f} ms"
    )
    if alone:
        alone_sum = sum(c.alone_ms for c in calls)
        lines.append(
            f"each call alone (back to back, caches warm): {alone_sum:.3f} ms in sum; "
            f"{in_sum - alone_sum:.3f} ms lost to running in sequence"
        )
    return "\n".join(lines)


def _written(path: Path, write: Callable) -> Path:
    with atomic_file(path) as f:
        write(f)
    return path


def default_cost(task: Task, default: State, records: list[Record], target: Target) -> float | None:
    """The measured latency of the task's default schedule, if it is among the records."""
    from aotc.schedule.steps import steps_to_json

    steps = json.loads(json.dumps(steps_to_json(default.steps)))
    costs = [
        r.mean_cost
        for r in records
        if r.ok and r.fingerprint == task.dag.fingerprint and r.target == str(target) and r.steps == steps
    ]
    return min(costs) if costs else None


def build_report(
    recipe: Recipe,
    target: Target,
    tasks: list[Task],
    lookups: list[Lookup],
    defaults: list[State],
    records: list[Record],
    records_file: Path,
    run: TuningRun | None,
    timings: dict[str, float],
    start: float,
    transfers: list[dict | None],
) -> dict:
    """The build report: per task where its kernel came from, its trials, latency and FLOP rate (best and
    default), the tuning run's totals and curve, and the build's stage timings."""
    from aotc.search.records import measured_by

    counts: dict[str, int] = {}
    devices: dict[str, int] = {}  # which machine measured the records (a cluster's devices, qemu, here)
    for r in records:
        if r.target == str(target):
            counts[r.fingerprint] = counts.get(r.fingerprint, 0) + 1
            devices[measured_by(r.host)] = devices.get(measured_by(r.host), 0) + 1
    rows = []
    for i, (task, found, default, transfer) in enumerate(zip(tasks, lookups, defaults, transfers)):
        best = found.record.mean_cost if found.record is not None else None
        source = found.source if found.record is not None else "default schedule"
        if transfer is not None and transfer["kernel"] == "transferred":
            source = f"transferred from {transfer['from']} (measured here)"
        flops = task.dag.flop_count
        rows.append(
            {
                "id": i,
                "name": task.name,
                "workload_key": task.workload_key,
                "fingerprint": task.dag.fingerprint,
                "weight": task.weight,
                "flops": flops,
                "trials": counts.get(task.dag.fingerprint, 0),
                "new_trials": run.new_trials[i] if run is not None else 0,
                "best_latency_s": best,
                "default_latency_s": default_cost(task, default, records, target),
                "gflops": flops / best / 1e9 if best else None,
                "source": source,
                "lookup": str(found),
                "transfer": transfer,
                "dead": run.scheduler.progress[i].dead if run is not None else "",
            }
        )

    def total(key: str) -> float | None:
        values = [row[key] for row in rows]
        return (
            None if any(v is None for v in values) else sum(v * row["weight"] for v, row in zip(values, rows))
        )

    tuning: dict = {"enabled": run is not None, "records": str(records_file), "measured_by": devices}
    if run is not None:
        s = run.scheduler
        tuning |= {
            "budget_trials": recipe.tuning.trials,
            "deadline_seconds": recipe.tuning.deadline,
            "strategy": s.strategy,
            "trials": s.total_trials,
            "new_trials": run.summary.trials,
            "rounds": run.summary.rounds,
            "seconds": run.summary.seconds,
            "stop_reason": run.summary.stop_reason,
        }
        if s.devices:  # a cluster's devices: trials, strikes, and why one was lost or quarantined
            tuning["devices"] = [dict(d) for d in s.devices]
    curve = (
        []
        if run is None
        else [[n, sec, lat if math.isfinite(lat) else None] for n, sec, lat in run.scheduler.curve]
    )
    return {
        "package": str(recipe.output),
        "model": str(recipe.model),
        "target": str(target),
        "cpu": cpu_class(),
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "seconds": time.perf_counter() - start,
        "timings": dict(timings),
        "tuning": tuning,
        "estimated_latency_s": total("best_latency_s"),
        "default_latency_s": total("default_latency_s"),
        "tasks": rows,
        "curve_columns": ["trials", "seconds", "estimated_latency_s"],
        "curve": curve,
    }
