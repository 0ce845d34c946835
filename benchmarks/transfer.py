"""Records across CPU classes, measured (issue 23): how many trials a task needs to come within 5% of a
from-scratch tuning's best, with and without records transferred from another CPU class.

    python benchmarks/transfer.py [--model small_cnn] [--target "llvm -mcpu=znver3"]
                                  [--source tophub] [--trials 192] [--per-round 32] [--out DIR]

Two `aotc build`s of the same model for `--target`, each in a fresh private store and with the same trial
budget: "scratch" sees no records at all (`tuning.transfer: false`); "transfer" also sees `--source`, a
store of records made for other CPUs of the same ISA (default: the project's shipped aotc/tophub/; its
records for the target's own CPU are left out, so the default, an AVX2 znver3 build on this AVX-512 host,
sees the znver4 and znver5 ones). Per task, from the order in
which each build's records were measured: the trials that task needed until its best came within 5% of
the scratch build's final best for it (`>N`: not within its N trials), and the same for the estimated
end-to-end latency against the trials of the whole build. Every figure is printed with the CPU class it
was measured on (lscpu's model name and LLVM's host CPU) and the target's. Both builds run in one process,
one after the other, on the same host; measured costs carry that host's noise (a shared machine's other
tenants), and on a shared host one schedule's cost drifts by tens of percent between the two builds. So
the running-best schedules of both builds (each schedule that was a new best for its task) are measured
again afterwards, taking turns in one session (`--rounds`, keeping each one's fastest), and the trials
are counted against those costs: the first trial whose running best comes within 5% of the scratch
build's best. `--reuse` skips the builds when `--out` already holds both.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

from timing import cpu_class, private_store
from zoo import onnx_models as models

from aotc.api import with_overrides
from aotc.build import build, load_model
from aotc.graph.partition import Task, extract_tasks, partition
from aotc.hub.store import append_to_store, record_target_key, store_files
from aotc.recipe import load_recipe
from aotc.search.measure import MeasureOptions, Measurer
from aotc.search.params import SearchParams
from aotc.search.records import Record, load_records
from aotc.target import Target, parse_target

WITHIN = 1.05
MODELS = {"small_cnn": models.small_cnn, "mlp": models.mlp}
TOPHUB = Path(__file__).resolve().parent.parent / "aotc" / "tophub"


def run_build(
    out: Path, name: str, target: str, trials: int, transfer: bool, options: dict, reuse: bool
) -> dict:
    """One build (or its earlier output, with `reuse`); returns per task fingerprint the records in
    measurement order, the build's curve, and the transfer outcomes."""
    recipe = out / f"{name}.yaml"
    recipe.write_text(
        f"model: model.onnx\ntarget: {target}\noutput: {name}/model.aotc\nvalidate: false\n"
        f"tuning:\n  trials: {trials}\n  records: {name}/records.jsonl\n  transfer: {str(transfer).lower()}\n"
    )
    report_file = out / name / "model.report" / "report.json"
    if not (reuse and report_file.exists()):
        build(with_overrides(load_recipe(recipe), **options), log=lambda _: None)
    records: dict[str, list[Record]] = {}
    for rec in load_records(out / name / "records.jsonl"):
        records.setdefault(rec.fingerprint, []).append(rec)
    report = json.loads(report_file.read_text())
    transferred = {t["fingerprint"]: t["transfer"] for t in report["tasks"] if t.get("transfer")}
    return {"records": records, "curve": report["curve"], "transfer": transferred}


def other_cpus_store(source: Path, target: Target, dest: Path) -> Path:
    """`dest`, a store of `source`'s records but those for `target`'s CPU (which would be hits, not
    transfers: the shipped store holds records for several CPU classes)."""
    own = record_target_key(str(target))
    shutil.rmtree(dest, ignore_errors=True)  # made again: appending to an earlier copy would double it
    dest.mkdir(parents=True)
    for path in store_files(source):
        others = [
            r for r in load_records(path) if (key := record_target_key(r.target)) and key.cpu != own.cpu
        ]
        append_to_store(dest, others)
    return dest


def improvements(records: list[Record]) -> list[tuple[int, Record]]:
    """(1-based trial, record) of each record that was a new best of its build when measured."""
    out, best = [], math.inf
    for i, rec in enumerate(records, 1):
        if rec.mean_cost < best:
            best = rec.mean_cost
            out.append((i, rec))
    return out


def remeasure(task: Task, target: Target, recs: list[Record], rounds: int) -> dict[str, float]:
    """Each distinct schedule's fastest cost over `rounds` turns in one session (steps JSON -> seconds)."""
    unique = {json.dumps(r.steps): r for r in recs}
    states = [r.state(task.dag) for r in unique.values()]
    best = dict.fromkeys(unique, math.inf)
    with Measurer(task.dag, target, MeasureOptions(repeat=3, min_repeat_ms=20)) as measurer:
        for _ in range(rounds):
            for key, result in zip(unique, measurer.measure(states)):
                if result.ok:
                    best[key] = min(best[key], result.mean_cost)
    return best


def trials_within(points: list[tuple[int, Record]], costs: dict[str, float], goal: float) -> int | None:
    """The first trial whose running best (by the costs measured again) is within `goal`, or None."""
    best = math.inf
    for trial, rec in points:
        best = min(best, costs[json.dumps(rec.steps)])
        if best <= goal:
            return trial
    return None


def shown(n: int | None, total: int) -> str:
    return f">{total}" if n is None else str(n)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(MODELS), default="small_cnn")
    ap.add_argument("--target", default="llvm -mcpu=znver3", help="the CPU class built for (default znver3)")
    ap.add_argument("--source", default=str(TOPHUB), help="store of another CPU class's records")
    ap.add_argument("--trials", type=int, default=192, help="trial budget of each build")
    ap.add_argument("--per-round", type=int, default=32, help="trials per scheduler round")
    ap.add_argument("--out", type=Path, help="keep the builds here (default: a temporary folder)")
    ap.add_argument("--reuse", action="store_true", help="take the builds already in --out")
    ap.add_argument("--rounds", type=int, default=3, help="turns when measuring the best schedules again")
    args = ap.parse_args(argv)

    options = dict(search=SearchParams(per_round=args.per_round))
    target = parse_target(args.target)
    here = cpu_class()
    with tempfile.TemporaryDirectory(prefix="aotc-transfer-") as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        models.save(MODELS[args.model](), out / "model.onnx")
        print(
            f"{args.model}: {args.trials} trials per build for {target.mcpu}, measured on {here}", flush=True
        )
        with private_store(out / "home-scratch"):
            scratch = run_build(out, "scratch", args.target, args.trials, False, options, args.reuse)
        source = other_cpus_store(Path(args.source), target, out / "source")
        with private_store(out / "home-transfer", str(source)):
            seeded = run_build(out, "transfer", args.target, args.trials, True, options, args.reuse)
        tasks = extract_tasks(partition(load_model(load_recipe(out / "scratch.yaml"))))

    print(
        f"\ntrials to come within 5% of the scratch build's best, target -mcpu={target.mcpu}, measured on "
        f"{here} (running-best schedules measured again, {args.rounds} turns):"
    )
    print(
        f"{'task':<30} {'scratch best ms':>15} {'scratch':>8} {'transfer':>8}  {'transfer best ms':>16}  from"
    )
    for task in tasks:
        fp = task.dag.fingerprint
        mine, theirs = scratch["records"].get(fp, []), seeded["records"].get(fp, [])
        ours, others = improvements(mine), improvements(theirs)
        if not ours:
            print(f"{task.name[:30]:<30} (no valid scratch measurement)")
            continue
        costs = remeasure(task, target, [r for _, r in ours + others], args.rounds)
        scratch_best = min(costs[json.dumps(r.steps)] for _, r in ours)
        transfer_best = min((costs[json.dumps(r.steps)] for _, r in others), default=math.inf)
        goal = scratch_best * WITHIN
        origin = seeded["transfer"].get(fp, {}).get("from", "-")
        print(
            f"{task.name[:30]:<30} {scratch_best * 1e3:15.4f} {shown(trials_within(ours, costs, goal), len(mine)):>8} "
            f"{shown(trials_within(others, costs, goal), len(theirs)):>8}  {transfer_best * 1e3:16.4f}  {origin}"
        )
    finals = [p[2] for p in scratch["curve"] if p[2] is not None]
    if finals:  # as each build measured it: drift between the builds included
        goal = finals[-1] * WITHIN
        first = {
            name: next((p[0] for p in run["curve"] if p[2] is not None and p[2] <= goal), None)
            for name, run in (("scratch", scratch), ("transfer", seeded))
        }
        print(
            f"{'whole model (est., as built)':<30} {finals[-1] * 1e3:15.4f} "
            f"{shown(first['scratch'], args.trials):>8} {shown(first['transfer'], args.trials):>8}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
