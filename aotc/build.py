"""`aotc build`: model file -> graph -> fused tasks -> schedules -> kernels -> one package file."""

from __future__ import annotations

import json
import math
import os
import platform
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from aotc import __version__
from aotc.graph.ir import Graph, Value
from aotc.graph.partition import FusedGroup, Task, extract_tasks, group_dag, partition
from aotc.graph.passes import optimize
from aotc.hub import Lookup, RecordSources, Transfer, find_transfers, open_sources
from aotc.hub.transfer import describe_outcome, transfer_outcome
from aotc.ir.stmt import PrimFunc
from aotc.memory import Lifetime, plan_memory
from aotc.recipe import Recipe
from aotc.report import report_dir, write_report
from aotc.schedule.default import default_schedule
from aotc.schedule.layout import WeightLayout, rewrite_layout
from aotc.schedule.lower import lower
from aotc.schedule.state import State
from aotc.search.measure import MeasureOptions
from aotc.search.records import Record
from aotc.search.scheduler import SearchRounds, TaskScheduler, TuneSummary
from aotc.target import Target, parse_target


class BuildError(RuntimeError):
    """The model cannot be compiled (as opposed to a bad recipe or input file)."""


@dataclass
class BuildResult:
    package: Path
    graph: Graph
    tasks: list[Task]
    seconds: float
    timings: dict[str, float] = field(default_factory=dict)
    validation: list[dict] | None = None
    report: Path | None = None
    tuning: TuneSummary | None = None


def load_model(recipe: Recipe) -> Graph:
    """The recipe's model as an optimized graph (ONNX or TFLite by file extension)."""
    shapes = {name: (spec.shape, spec.dtype) for name, spec in recipe.inputs.items()}
    suffix = recipe.model.suffix.lower()
    if suffix == ".onnx":
        from aotc.frontend.onnx import load_onnx

        graph = load_onnx(str(recipe.model), input_shapes=shapes)
    elif suffix == ".tflite":
        from aotc.frontend.tflite import load_tflite

        graph = load_tflite(str(recipe.model), input_shapes=shapes)
    else:
        raise BuildError(f"{recipe.model}: unsupported model format {suffix!r} (expected .onnx or .tflite)")
    return optimize(graph, winograd=recipe.winograd, nhwc=recipe.nhwc)


# Time kept back from a deadline for what follows tuning: reloading records, lowering, LLVM codegen,
# packaging, validation and the report. Fixed part + per kernel (twice that with validation), at most
# RESERVE_MAX_FRACTION of the deadline.
RESERVE_FIXED_SECONDS = 2.0
RESERVE_PER_TASK_SECONDS = 0.15
RESERVE_MAX_FRACTION = 0.4


@dataclass
class TuningOptions:
    """Knobs of whole-model tuning that a recipe does not set (tests and benchmarks change them)."""

    measure: MeasureOptions | None = None
    population: int = 256
    per_round: int = 64
    strategy: str = "gradient"
    seed: int = 0


@dataclass
class TuningRun:
    scheduler: TaskScheduler
    summary: TuneSummary
    new_trials: list[int]


def records_path(recipe: Recipe) -> Path:
    """The build's record log: `tuning.records`, else `<output dir>/<package stem>.records.jsonl`."""
    if recipe.tuning.records is not None:
        return recipe.tuning.records
    return recipe.output.parent / f"{recipe.output.stem}.records.jsonl"


def lookup_kernels(sources: RecordSources, tasks: list[Task], target: Target) -> list[Lookup]:
    """Per task, the fastest usable record along the record chain (hit), or why there is none."""
    return [sources.lookup(task.dag, target) for task in tasks]


def transfer_candidates(
    sources: RecordSources,
    tasks: list[Task],
    lookups: list[Lookup],
    defaults: list[State],
    target: Target,
    enabled: bool,
) -> list[Transfer | None]:
    """Per task without a hit, the schedules of other CPUs of the target's ISA to measure here."""
    if not enabled:
        return [None] * len(tasks)
    todo = [i for i, found in enumerate(lookups) if found.status != "hit"]
    found = find_transfers(
        sources, [tasks[i].dag for i in todo], target, defaults=[defaults[i] for i in todo]
    )
    out: list[Transfer | None] = [None] * len(tasks)
    for i, transfer in zip(todo, found):
        out[i] = transfer
    return out


def tune_tasks(
    tasks: list[Task],
    target: Target,
    lookups: list[Lookup],
    sources: RecordSources,
    records: Path,
    known: list[Record],
    trials: int | None,
    deadline: float | None,
    resume: bool,
    callbacks: Sequence[Callable] = (),
    options: TuningOptions | None = None,
    log: Callable[[str], None] = print,
    transfers: Sequence[Transfer | None] = (),
) -> TuningRun:
    """Tune the tasks with the gradient task scheduler until `trials` or the `deadline` (time.monotonic()).

    Without `resume`, a task with a usable record is done (it gets no trials) and the budget goes to the
    others; with `resume`, every task goes on and the trials already in `records` count toward the budget.
    Nothing already in `records` is measured again. The shared cost model starts from the stored
    records of these tasks (every source of the chain).

    `transfers[i]` (schedules of other CPUs) join the default schedule in task i's first round, measured
    here, and then seed its search; their records warm-start the cost model too. `trials=0` measures
    only those first rounds: the tasks that have transferred schedules, nothing else.
    """
    from aotc.hub import warm_start
    from aotc.search.cost_model import XGBCostModel

    options = options or TuningOptions()
    measure = options.measure or MeasureOptions(repeat=3, min_repeat_ms=20)
    seeds = [tr.seeds if tr else [] for tr in transfers or [None] * len(tasks)]
    initial = [[default_schedule(t.dag, target), *seed] for t, seed in zip(tasks, seeds)]
    model = XGBCostModel()
    rounds = SearchRounds(tasks, target, model, records, measure, initial, options.seed, options.population)
    scheduler = TaskScheduler(
        tasks,
        rounds,
        strategy=options.strategy,
        per_round=options.per_round,
        seed=options.seed,
        callbacks=callbacks,
        log=log,
        baseline_trials=[1] * len(tasks),  # set per task below, once resumed records are known
    )
    restored = [0] * len(tasks)
    only_seeds = trials == 0
    for i, (search, found) in enumerate(zip(rounds.searches, lookups)):
        if found.status == "hit" and not resume:
            scheduler.restore(i, 0, found.record.mean_cost, dead="cached")
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
        summary = TuneSummary(0, 0, 0.0, "every task is done")
        return TuningRun(scheduler, summary, [0] * len(tasks))
    if only_seeds:
        trials = sum(scheduler.baseline_trials[i] for i in scheduler.live())
        log(
            f"measuring {sum(len(seeds[i]) for i in scheduler.live())} schedule(s) transferred from other "
            f"CPUs next to the default schedules of {todo} of {len(tasks)} tasks"
        )
    else:
        dags = {t.workload_key: t.dag for t in tasks}
        warm_start(model, sources, target, dags, transfer=any(tr is not None for tr in transfers))
        limits = [f"{trials} trials" if trials is not None else "", "a deadline" if deadline else ""]
        log(f"tuning {todo} of {len(tasks)} tasks with {' and '.join(x for x in limits if x)}")
    summary = scheduler.tune(trials, deadline)
    return TuningRun(scheduler, summary, [p.trials - r for p, r in zip(scheduler.progress, restored)])


def deadline_reserve(n_tasks: int, validate: bool, deadline_seconds: float) -> float:
    per_task = RESERVE_PER_TASK_SECONDS * n_tasks * (2 if validate else 1)
    return min(RESERVE_FIXED_SECONDS + per_task, RESERVE_MAX_FRACTION * deadline_seconds)


def build(
    recipe: Recipe,
    log: Callable[[str], None] = print,
    *,
    resume: bool = False,
    explain_cache: bool = False,
    callbacks: Sequence[Callable] = (),
    tuning_options: TuningOptions | None = None,
    sign_key: Path | None = None,
) -> BuildResult:
    """Compile the recipe's model into its package (tuning first when the recipe asks), write the build
    report next to it, and validate against the reference when asked. With `sign_key` (an Ed25519
    private key PEM) the package is signed; the key is checked before any work.

    Tuning stops at `tuning.trials` or `tuning.deadline`, whichever comes first; a deadline leaves time
    for codegen and packaging. Ctrl-C during tuning stops it and still writes the package (a second one
    aborts). `callbacks` get (scheduler, round report) after every tuning round.
    """
    start = time.perf_counter()
    started = time.monotonic()
    timings: dict[str, float] = {}
    target = parse_target(recipe.target)
    if not target.is_cpu:
        raise BuildError(f"target {target}: only llvm (CPU) targets can be built so far")
    tuning = recipe.tuning
    if sign_key is not None:
        from aotc.signing import signing_key_id

        log(f"signing the package with key {signing_key_id(sign_key)} ({sign_key})")

    t0 = time.perf_counter()
    graph = load_model(recipe)
    groups = partition(graph)
    tasks = extract_tasks(groups)
    timings["import+partition"] = time.perf_counter() - t0
    log(
        f"{graph.name}: {len(graph.nodes)} nodes -> {len(groups)} kernels calls of {len(tasks)} distinct tasks"
    )
    check_memory(graph, groups, recipe.memory_limit)

    t0 = time.perf_counter()
    records = records_path(recipe)
    known = _load(records)
    sources = open_sources(records, tuning.tophub)
    lookups = lookup_kernels(sources, tasks, target)
    defaults = [default_schedule(task.dag, target) for task in tasks]
    transfers = transfer_candidates(sources, tasks, lookups, defaults, target, tuning.transfer)
    if explain_cache:
        for i, (task, found, transfer) in enumerate(zip(tasks, lookups, transfers)):
            extra = "" if transfer is None else f"; {transfer}"
            log(f"task {i} {task.name} (weight {task.weight}): {found}{extra}")
    wants_tuning = tuning.trials != 0 and (tuning.trials is not None or tuning.deadline_seconds is not None)
    # without a budget, transferred schedules are still measured here against the default (~1 s a task)
    seeding = not wants_tuning and any(tr is not None and tr.seeds for tr in transfers)
    run: TuningRun | None = None
    if wants_tuning or seeding:
        deadline = None
        if wants_tuning and tuning.deadline_seconds is not None:
            reserve = deadline_reserve(len(tasks), recipe.validate, tuning.deadline_seconds)
            deadline = started + tuning.deadline_seconds - reserve
        run = tune_tasks(
            tasks,
            target,
            lookups,
            sources,
            records,
            known,
            tuning.trials if wants_tuning else 0,
            deadline,
            resume,
            callbacks,
            tuning_options,
            log,
            transfers,
        )
        known = _load(records)
        # every record of the build's log, not only this run's: a build killed before it got here
        # (kill -9) left measured records that only the log holds, and --resume goes on from them
        sources.save_missing(known)
        sources = open_sources(records, tuning.tophub)
        lookups = lookup_kernels(sources, tasks, target)
    elif known:
        sources.save_missing(known)
    timings["tune"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    outcomes = _transfer_outcomes(tasks, transfers, lookups, defaults, known, target)
    if explain_cache:
        for i, (task, outcome) in enumerate(zip(tasks, outcomes)):
            if outcome is not None:
                log(f"task {i} {task.name}: {describe_outcome(outcome)}")
    states = [found.state if found.state is not None else d for found, d in zip(lookups, defaults)]
    sources = [_kernel_source(task, found, out) for task, found, out in zip(tasks, lookups, outcomes)]
    rewritten = [rewrite_layout(state) for state in states]
    funcs = [lower(state, _symbol(i, task)) for i, (task, (state, _)) in enumerate(zip(tasks, rewritten))]
    layouts = [{layout.arg: layout for layout in task_layouts} for _, task_layouts in rewritten]
    for source, task_layouts in zip(sources, layouts):
        if task_layouts:
            source["weight_layouts"] = [layout.to_json() for layout in task_layouts.values()]
    timings["schedule+lower"] = time.perf_counter() - t0

    spec = _package_spec(recipe, graph, groups, tasks, funcs, target, sources, layouts)
    out = recipe.output
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        t0 = time.perf_counter()
        from aotc.package import write_package

        write_package(spec, tmp, sign_key=sign_key)
        timings["codegen+package"] = time.perf_counter() - t0
        validation = None
        if recipe.validate:
            from aotc.validate import validate_package

            validation = validate_package(tmp, recipe.model, input_shapes=spec_inputs(spec))
        # the report is written before the package is moved into place: a build that fails to write
        # it (a full disk) fails as a whole and leaves the previous package where it was
        t0 = time.perf_counter()
        report = _build_report(
            recipe, target, tasks, lookups, defaults, known, records, run, timings, start, outcomes
        )
        directory = write_report(report_dir(out), report)[0].parent
        timings["report"] = time.perf_counter() - t0
        os.replace(tmp, out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    result = BuildResult(out, graph, tasks, time.perf_counter() - start, timings, validation)
    result.report = directory
    result.tuning = None if run is None else run.summary
    return result


def _load(path: Path) -> list[Record]:
    from aotc.search.records import load_records

    return load_records(path) if path.exists() else []


def _transfer_outcomes(
    tasks: list[Task],
    transfers: list[Transfer | None],
    lookups: list[Lookup],
    defaults: list[State],
    known: list[Record],
    target: Target,
) -> list[dict | None]:
    """Per task with transferred schedules: what measuring them here gave (aotc.hub.transfer)."""
    from aotc.schedule.steps import steps_to_json

    out: list[dict | None] = []
    for task, transfer, found, default in zip(tasks, transfers, lookups, defaults):
        if transfer is None or not transfer.candidates:
            out.append(None)
            continue
        mine = [r for r in known if r.fingerprint == task.dag.fingerprint and r.target == str(target)]
        steps = json.loads(json.dumps(steps_to_json(default.steps)))
        out.append(transfer_outcome(transfer, mine, found.record, steps))
    return out


def _kernel_source(task: Task, found: Lookup, transfer: dict | None = None) -> dict:
    """The manifest's account of where a kernel's schedule came from."""
    info: dict = {"fingerprint": task.dag.fingerprint}
    if found.record is None:
        return {"schedule": "default", **info}
    rec = found.record
    if transfer is not None and transfer["kernel"] == "transferred":
        info["transferred_from"] = transfer["from"]
    return {
        "schedule": "record",
        **info,
        "record_cost_s": rec.mean_cost,
        "record_time": rec.timestamp,
        "record_source": found.source,
        "record_host": rec.host,
    }


def _default_cost(task: Task, default: State, records: list[Record], target: Target) -> float | None:
    """The measured latency of the task's default schedule, if it is among the records."""
    from aotc.schedule.steps import steps_to_json

    steps = json.loads(json.dumps(steps_to_json(default.steps)))
    costs = [
        r.mean_cost
        for r in records
        if r.ok and r.fingerprint == task.dag.fingerprint and r.target == str(target) and r.steps == steps
    ]
    return min(costs) if costs else None


def _build_report(
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
    counts: dict[str, int] = {}
    for r in records:
        if r.target == str(target):
            counts[r.fingerprint] = counts.get(r.fingerprint, 0) + 1
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
                "default_latency_s": _default_cost(task, default, records, target),
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

    tuning: dict = {"enabled": run is not None, "records": str(records_file)}
    if run is not None:
        s = run.scheduler
        tuning |= {
            "budget_trials": recipe.tuning.trials,
            "deadline_seconds": recipe.tuning.deadline_seconds,
            "strategy": s.strategy,
            "trials": s.total_trials,
            "new_trials": run.summary.trials,
            "rounds": run.summary.rounds,
            "seconds": run.summary.seconds,
            "stop_reason": run.summary.stop_reason,
        }
    curve = (
        []
        if run is None
        else [[n, sec, lat if math.isfinite(lat) else None] for n, sec, lat in run.scheduler.curve]
    )
    return {
        "package": str(recipe.output),
        "model": str(recipe.model),
        "target": str(target),
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


def intermediate_lifetimes(
    calls: list[list[Value]], graph: Graph
) -> tuple[dict[Value, int], dict[Value, int]]:
    """The first and last call using each value that lives in the workspace (neither a constant nor a
    graph input or output), given the values each kernel call reads and writes."""
    outside = set(graph.inputs) | set(graph.outputs)
    first: dict[Value, int] = {}
    last: dict[Value, int] = {}
    for step, values in enumerate(calls):
        for v in values:
            if v.is_constant or v in outside:
                continue
            first.setdefault(v, step)
            last[v] = step
    return first, last


def _buffer_key(v: Value) -> str:
    return v.name + f"#{id(v)}"


def physical_memory() -> int:
    """This machine's physical memory in bytes (os.sysconf), or 0 where it cannot be read."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def check_memory(graph: Graph, groups: list[FusedGroup], limit: int | None) -> dict[str, int]:
    """The bytes a run of the model needs (workspace, weights, inputs and outputs); raises BuildError,
    before any tuning or code generation, when they pass `limit` (None: this machine's physical memory).

    The workspace is the memory plan of the partitioned graph, which the package uses as is; weights
    are the constants the kernels read, before their layout rewrite (which pads a little at most)."""
    calls = [[*g.inputs, *g.outputs] for g in groups]
    first, last = intermediate_lifetimes(calls, graph)
    _, workspace = plan_memory([Lifetime(_buffer_key(v), v.type.nbytes, first[v], last[v]) for v in first])
    constants = {v for g in groups for v in g.inputs if v.is_constant and v.type.num_elements > 1}
    need = {
        "workspace": workspace,
        "weights": sum(v.type.nbytes for v in constants),
        "inputs and outputs": sum(v.type.nbytes for v in {*graph.inputs, *graph.outputs}),
    }
    bound = limit if limit is not None else physical_memory()
    total = sum(need.values())
    if bound and total > bound:
        parts = ", ".join(f"{what} {_size(n)}" for what, n in need.items())
        if limit is not None:
            over = f"more than its memory_limit of {_size(bound)}"
        else:
            over = (
                f"more than this machine's physical memory ({_size(bound)}); raise the limit with "
                "`memory_limit:` in the recipe or --memory-limit"
            )
        raise BuildError(f"{graph.name}: a run needs {_size(total)} ({parts}), {over}")
    return need


def _size(n: int) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def spec_inputs(spec) -> dict[str, tuple[tuple[int, ...], str]]:
    return {io.name: (tuple(io.shape), io.dtype) for io in spec.inputs}


def _symbol(i: int, task: Task) -> str:
    clean = "".join(ch if ch.isalnum() else "_" for ch in task.name)
    return f"k{i}_{clean}"[:64]


def _package_spec(
    recipe: Recipe,
    graph: Graph,
    groups: list[FusedGroup],
    tasks: list[Task],
    funcs: list[PrimFunc],
    target: Target,
    sources: list[dict],
    layouts: list[dict[int, WeightLayout]],
):
    """The package of the kernels; each constant is stored once per layout its kernels read it in."""
    from aotc.package import BufferRef, IOSpec, KernelCall, PackageSpec, layout_weights

    task_of = {id(g): i for i, t in enumerate(tasks) for g in t.groups}
    inputs = {v: i for i, v in enumerate(graph.inputs)}
    outputs = {v: i for i, v in enumerate(graph.outputs)}

    bindings: list[tuple[FusedGroup, list[Value], dict[int, WeightLayout]]] = []
    weights: dict[tuple[Value, WeightLayout | None], str] = {}
    for g in groups:
        _, args, outs = group_dag(g)
        relaid = layouts[task_of[id(g)]]
        for a, v in enumerate(args):
            if v.is_constant:
                key = (v, relaid.get(a))
                weights.setdefault(key, v.name if key[1] is None else f"{v.name}#packed{len(weights)}")
        bindings.append((g, [*args, *outs], relaid))
    weight_list = [
        (name, np.ascontiguousarray(v.data if layout is None else layout.apply(v.data)))
        for (v, layout), name in weights.items()
    ]
    weight_offsets = layout_weights(weight_list)
    weight_bytes = {name: data.nbytes for name, data in weight_list}

    first, last = intermediate_lifetimes([values for _, values, _ in bindings], graph)
    offsets, workspace = plan_memory(
        [Lifetime(_buffer_key(v), v.type.nbytes, first[v], last[v]) for v in first]
    )
    key_of = {v: _buffer_key(v) for v in first}

    def ref(v: Value, layout: WeightLayout | None = None) -> BufferRef:
        if v.is_constant:
            name = weights[(v, layout)]
            return BufferRef("weight", offset=weight_offsets[name], nbytes=weight_bytes[name])
        if v in inputs:
            return BufferRef("input", index=inputs[v], nbytes=v.type.nbytes)
        if v in outputs:
            return BufferRef("output", index=outputs[v], nbytes=v.type.nbytes)
        return BufferRef("workspace", offset=offsets[key_of[v]], nbytes=v.type.nbytes)

    calls = [
        KernelCall(funcs[task_of[id(g)]].name, tuple(ref(v, relaid.get(a)) for a, v in enumerate(values)))
        for g, values, relaid in bindings
    ]
    memory_plan = [
        {
            "value": v.name,
            "offset": offsets[key_of[v]],
            "bytes": v.type.nbytes,
            "first": first[v],
            "last": last[v],
        }
        for v in first
    ]
    kernel_info = [
        {
            "task": t.name,
            "workload_key": t.workload_key,
            "weight": t.weight,
            "flops": t.dag.flop_count,
            **source,
        }
        for t, source in zip(tasks, sources)
    ]
    provenance = {
        "aotc_version": __version__,
        "recipe": recipe.to_dict(),
        "records": sorted({x["record_source"] for x in sources if x["schedule"] == "record"}),
        "host": f"{platform.node()} {platform.machine()} {platform.python_version()}",
    }
    return PackageSpec(
        name=recipe.output.stem,
        target=target,
        inputs=[IOSpec(v.name, tuple(v.type.shape), v.type.dtype) for v in graph.inputs],
        outputs=[IOSpec(v.name, tuple(v.type.shape), v.type.dtype) for v in graph.outputs],
        kernels=funcs,
        calls=calls,
        weights=weight_list,
        workspace_bytes=workspace,
        memory_plan=memory_plan,
        kernel_info=kernel_info,
        provenance=provenance,
    )
