"""`aotc build`: model file -> graph -> fused tasks -> schedules -> kernels -> one package file.

`build` is the pipeline, one line per stage; each stage lives in the module that owns it."""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from aotc.emulator import (
    EmulatedModel,
    EmulatorUnavailable,
    ensure_sysroot,
    package_emulation_unavailable,
    qemu_cpu,
)
from aotc.errors import BuildError
from aotc.execution_plan import (
    check_memory,
    kernel_source,
    kernel_symbol,
    merge_tasks,
    package_spec,
    spec_inputs,
)
from aotc.graph.ir import Graph
from aotc.graph.partition import FusedGroup, Task, extract_tasks, partition
from aotc.graph.passes import optimize
from aotc.hub import Lookup, RecordSources, Transfer, find_transfers, open_sources
from aotc.hub.transfer import describe_outcome, transfer_outcome
from aotc.ir.dot import dot_forms, has_narrow_forms, integer_winograd_rule, same_sign_only
from aotc.progress import build_log
from aotc.recipe import InputSpec, Recipe
from aotc.report import build_report, measure_package, report_dir, write_report
from aotc.schedule.layout import rewrite_layout
from aotc.schedule.lower import lower
from aotc.schedule.state import State
from aotc.search.measure import device_unavailable
from aotc.search.model_tuning import TuningRun, deadline_reserve, tune_tasks
from aotc.search.records import Record, load_records
from aotc.search.scheduler import TuneSummary
from aotc.search.untuned import untuned_schedule
from aotc.target import Target, check_features_checkable, host_target, parse_target
from aotc.validate import require_reference


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


@dataclass
class Schedules:
    """What the record chain and tuning decided per task: its lookup, default schedule, the schedules
    other CPUs offered (and what measuring them gave), the build's records and the tuning run."""

    lookups: list[Lookup]
    defaults: list[State]
    transfers: list[Transfer | None]
    outcomes: list[dict | None]
    known: list[Record]
    records: Path
    run: TuningRun | None


def build(
    recipe: Recipe,
    log: Callable[[str], None] | None = None,
    *,
    resume: bool = False,
    explain_cache: bool = False,
    callbacks: Sequence[Callable] = (),
    sign_key: Path | None = None,
) -> BuildResult:
    """Compile the recipe's model into its package (tuning first when `recipe.tuning` has a budget),
    write the build report next to it, and validate against the reference when asked. With `sign_key`
    (an Ed25519 private key PEM) the package is signed; the key is checked before any work.

    Tuning stops at `tuning.trials` or `tuning.deadline`, whichever comes first; a deadline leaves time
    for codegen and packaging. Ctrl-C during tuning stops it and still writes the package (a second one
    aborts). `callbacks` get (scheduler, round report) after every tuning round. Messages go to `log`
    (default: INFO messages of the `aotc.build` logger); warnings always go to `logging`.
    """
    log = log or build_log
    start, started, timings = time.perf_counter(), time.monotonic(), {}
    target = parse_target(recipe.target)
    check_features_checkable(target)
    check_signing_key(sign_key, log)
    check_outputs(recipe)
    if recipe.validate:
        require_reference(recipe.model)
    with timed(timings, "import+partition"):
        variants = load_variants(recipe)
        tasks = variant_tasks(variants)
    graph = variants[0][0]
    for g, groups in variants:
        check_memory(g, groups, recipe.memory_limit)
    calls = sum(len(groups) for _, groups in variants)
    sizes = "" if len(variants) == 1 else f" at {len(variants)} batch sizes"
    log(
        f"{graph.name}: {len(graph.nodes)} nodes -> {calls} kernels calls{sizes} of {len(tasks)} distinct tasks"
    )
    with timed(timings, "tune"):
        chosen = choose_schedules(recipe, tasks, target, started, resume, explain_cache, callbacks, log)
    with timed(timings, "schedule+lower"):
        funcs, sources, layouts = lower_kernels(tasks, chosen, target)
    spec = package_spec(
        recipe.output.stem, variants, tasks, funcs, target, sources, layouts, recipe.to_dict(), recipe.weights
    )

    def report() -> dict:
        return build_report(
            recipe, target, tasks, chosen.lookups, chosen.defaults, chosen.known, chosen.records,
            chosen.run, timings, start, chosen.outcomes,
        )  # fmt: skip

    validation, directory = write_package_and_report(recipe, spec, sign_key, report, timings)
    tuning = None if chosen.run is None else chosen.run.summary
    return BuildResult(
        recipe.output, graph, tasks, time.perf_counter() - start, timings, validation, directory, tuning
    )


# ----------------------------------------------------------------------------- stages


@contextmanager
def timed(timings: dict[str, float], stage: str) -> Iterator[None]:
    t0 = time.perf_counter()
    yield
    timings[stage] = time.perf_counter() - t0


def check_signing_key(sign_key: Path | None, log: Callable[[str], None]) -> None:
    if sign_key is not None:
        from aotc.signing import signing_key_id

        log(f"signing the package with key {signing_key_id(sign_key)} ({sign_key})")


def check_outputs(recipe: Recipe) -> None:
    """Before any work, refuse a package or records path that is a directory, or that lies inside a
    record store of the chain (the user store, the shipped tophub, a shared directory): a build must
    not write over a store's files."""
    writes = {"output": recipe.output, "tuning.records": records_path(recipe)}
    for key, path in writes.items():
        if path.is_dir():
            raise BuildError(f"{key} {path} is a directory; name a file in it (e.g. {path / 'model.aotc'})")
    for source in open_sources(None, recipe.tuning.tophub).sources:
        if "://" in source.location:
            continue
        store = Path(source.location).expanduser().resolve()
        for key, path in writes.items():
            where = path.resolve()
            if where == store or store in where.parents:
                raise BuildError(
                    f"{key} {path} is inside the {source.kind} record store {store}: a build does not write there"
                )


def load_variants(recipe: Recipe) -> list[tuple[Graph, list[FusedGroup]]]:
    """The model at each input shape set the recipe lists (one per batch size), partitioned."""
    graphs = [load_model(recipe, inputs) for inputs in recipe.input_variants()]
    return [(graph, partition(graph)) for graph in graphs]


def variant_tasks(variants: list[tuple[Graph, list[FusedGroup]]]) -> list[Task]:
    """The distinct tasks of the model's variants (`load_variants`), as a build tunes and compiles them."""
    return merge_tasks([extract_tasks(groups) for _, groups in variants])


def load_model(recipe: Recipe, inputs: dict[str, InputSpec] | None = None) -> Graph:
    """The recipe's model as an optimized graph (ONNX or TFLite by file extension), at the given
    inputs' shapes (default: the recipe's, at its first batch size)."""
    chosen = recipe.input_variants()[0] if inputs is None else inputs
    shapes = {name: (spec.shape, spec.dtype) for name, spec in chosen.items()}
    suffix = recipe.model.suffix.lower()
    if suffix == ".onnx":
        from aotc.frontend.onnx import load_onnx

        graph = load_onnx(str(recipe.model), input_shapes=shapes, constants=recipe.constant_values())
    elif suffix == ".tflite":
        from aotc.frontend.tflite import load_tflite

        graph = load_tflite(str(recipe.model), input_shapes=shapes, requantize=recipe.requantize)
    else:
        raise BuildError(f"{recipe.model}: unsupported model format {suffix!r} (expected .onnx or .tflite)")
    forms = dot_forms(parse_target(recipe.target))
    return optimize(
        graph,
        winograd=recipe.winograd,
        nhwc=recipe.nhwc,
        dot_products=bool(forms),
        same_sign_dots=same_sign_only(forms),
        narrow_dots=has_narrow_forms(forms),
        integer_winograd=integer_winograd_rule(forms),
    )


def records_path(recipe: Recipe) -> Path:
    """The build's record log: `tuning.records`, else `<output dir>/<package stem>.records.jsonl`."""
    if recipe.tuning.records is not None:
        return recipe.tuning.records
    return recipe.output.parent / f"{recipe.output.stem}.records.jsonl"


def lookup_kernels(sources: RecordSources, tasks: list[Task], target: Target) -> list[Lookup]:
    """Per task, the fastest usable record along the record chain (hit), or why there is none."""
    return [sources.lookup(task.dag, target) for task in tasks]


def choose_schedules(
    recipe: Recipe,
    tasks: list[Task],
    target: Target,
    started: float,
    resume: bool,
    explain_cache: bool,
    callbacks: Sequence[Callable],
    log: Callable[[str], None],
) -> Schedules:
    """Look every task up in the record chain, measure other CPUs' schedules here, tune when the recipe
    has a budget, and look up again; every record the build's log holds reaches the user store."""
    tuning = recipe.tuning
    if tuning.trials == 0 and tuning.deadline is not None:
        logging.getLogger("aotc.build").warning(
            f"tuning.trials is 0, so the tuning.deadline of {tuning.deadline:g} s is not used and nothing is "
            "tuned; leave trials out to tune until the deadline (`aotc build --deadline` does)"
        )
    records = records_path(recipe)
    known = _load(records)
    sources = open_sources(records, tuning.tophub)
    lookups = lookup_kernels(sources, tasks, target)
    defaults = [untuned_schedule(task.dag, target) for task in tasks]
    transfers = transfer_candidates(sources, tasks, lookups, defaults, target, tuning.transfer)
    if explain_cache:
        for i, (task, found, transfer) in enumerate(zip(tasks, lookups, transfers)):
            extra = "" if transfer is None else f"; {transfer}"
            log(f"task {i} {task.name} (weight {task.weight}): {found}{extra}")
    # without a budget, transferred schedules are still measured here against the default (~1 s a task)
    seeding = not tuning.wants_tuning and any(tr is not None and tr.seeds for tr in transfers)
    run = None
    wants_tuning = tuning.wants_tuning
    if wants_tuning and target.is_gpu and tuning.cluster is None:  # a cluster's device measures there
        missing = device_unavailable(target)
        if missing is not None:
            logging.getLogger("aotc.build").warning(
                f"tuning for {target} measures candidates on the device, and this machine has none ({missing}): "
                "the package is built untuned, from records and the default GPU schedule; tune on a machine "
                "with the GPU"
            )
            wants_tuning = False
    if wants_tuning or seeding:
        deadline = None
        if wants_tuning and tuning.deadline is not None:
            deadline = (
                started + tuning.deadline - deadline_reserve(len(tasks), recipe.validate, tuning.deadline)
            )
        run = tune_tasks(
            tasks,
            target,
            tuning,
            records=records,
            known=known,
            cached_costs=[found.record.mean_cost if found.status == "hit" else None for found in lookups],
            untuned=defaults,
            seeds=[tr.seeds if tr else [] for tr in transfers],
            trials=tuning.trials if wants_tuning else 0,
            deadline=deadline,
            resume=resume,
            warm_start=cost_model_warm_start(sources, tasks, target, transfers),
            callbacks=callbacks,
            log=log,
        )
        known = _load(records)
    # every record of the build's log, not only this run's: a build killed before it got here (kill -9)
    # left measured records that only the log holds, and --resume goes on from them
    if known:
        sources.save_missing(known)
    if run is not None:
        lookups = lookup_kernels(open_sources(records, tuning.tophub), tasks, target)
        if explain_cache:  # what the package takes now: a tuned record, or the untuned schedule's kept
            for i, (task, found) in enumerate(zip(tasks, lookups)):
                log(f"task {i} {task.name}, after tuning: {found}")
    outcomes = transfer_outcomes(tasks, transfers, lookups, defaults, known, target)
    if explain_cache:
        for i, (task, outcome) in enumerate(zip(tasks, outcomes)):
            if outcome is not None:
                log(f"task {i} {task.name}: {describe_outcome(outcome)}")
    return Schedules(lookups, defaults, transfers, outcomes, known, records, run)


def cost_model_warm_start(
    sources: RecordSources, tasks: list[Task], target: Target, transfers: list[Transfer | None]
) -> Callable:
    """Trains a cost model on the stored records of these tasks (every source of the chain)."""
    from aotc.hub import warm_start

    dags = {t.workload_key: t.dag for t in tasks}
    return lambda model: warm_start(
        model, sources, target, dags, transfer=any(tr is not None for tr in transfers)
    )


def transfer_candidates(
    sources: RecordSources,
    tasks: list[Task],
    lookups: list[Lookup],
    defaults: list[State],
    target: Target,
    enabled: bool,
) -> list[Transfer | None]:
    """Per task without a hit, the schedules of other CPUs of the target's ISA to measure here."""
    if not enabled or target.is_gpu:
        return [None] * len(tasks)
    todo = [i for i, found in enumerate(lookups) if found.status != "hit"]
    found = find_transfers(
        sources, [tasks[i].dag for i in todo], target, defaults=[defaults[i] for i in todo]
    )
    out: list[Transfer | None] = [None] * len(tasks)
    for i, transfer in zip(todo, found):
        out[i] = transfer
    return out


def transfer_outcomes(
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


def lower_kernels(
    tasks: list[Task], chosen: Schedules, target: Target
) -> tuple[list, list[dict], list[dict]]:
    """Per task: its kernel (the chosen schedule, weights relaid out as it reads them, lowered), the
    account of where the schedule came from, and its weight layouts by argument."""
    states = [
        found.state if found.state is not None else d for found, d in zip(chosen.lookups, chosen.defaults)
    ]
    sources = [kernel_source(t, found, out) for t, found, out in zip(tasks, chosen.lookups, chosen.outcomes)]
    # GPU kernels read weights as stored: their shared-memory stages lay tiles out for the threads
    rewritten = [(state, []) if target.is_gpu else rewrite_layout(state) for state in states]
    funcs = [
        lower(state, kernel_symbol(i, task)) for i, (task, (state, _)) in enumerate(zip(tasks, rewritten))
    ]
    layouts = [{layout.arg: layout for layout in task_layouts} for _, task_layouts in rewritten]
    for source, task_layouts in zip(sources, layouts):
        if task_layouts:
            source["weight_layouts"] = [layout.to_json() for layout in task_layouts.values()]
    return funcs, sources, layouts


def cannot_run_here(target: Target) -> str | None:
    """Why a package for `target` cannot run on this machine (another CPU architecture, no device of a
    GPU target's kind), or None if it can."""
    if target.is_gpu:
        missing = device_unavailable(target)
        return None if missing is None else f"this machine has no {target.kind} device ({missing})"
    if target.isa != host_target().isa:
        why = package_emulation_unavailable(target)
        if why is None:
            try:
                ensure_sysroot(target.isa)
            except EmulatorUnavailable as e:
                why = str(e)
        if why is not None:
            return f"the package runs on {target.isa}, not on this {host_target().isa} host, nor under qemu here: {why}"
    return None


def write_package_and_report(
    recipe: Recipe, spec, sign_key: Path | None, report: Callable[[], dict], timings: dict[str, float]
) -> tuple[list[dict] | None, Path]:
    """Codegen and package into a temporary file, validate it when asked, write the report, and only
    then rename the package into place: a build that fails anywhere (a full disk while the report is
    written) leaves the previous package where it was."""
    from aotc.package import write_package

    out = recipe.output
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        with timed(timings, "codegen+package"):
            write_package(spec, tmp, sign_key=sign_key)
        validation = None
        why_not = cannot_run_here(spec.target) if recipe.validate else None
        if why_not is not None:
            logging.getLogger("aotc.build").warning(
                f"validation skipped: {why_not}; validate it where it runs with `aotc validate`"
            )
        elif recipe.validate:
            validation = validate_or_skip(tmp, recipe, spec)
        with timed(timings, "measure"):
            measured = measure_package(tmp, parse_target(recipe.target))
        with timed(timings, "report"):
            directory = write_report(report_dir(out), {**report(), "measured_latency": measured})[0].parent
        os.replace(tmp, out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return validation, directory


def validate_or_skip(package: str, recipe: Recipe, spec) -> list[dict] | None:
    """The validation rows of `package`, or None (with a warning saying why) where the reference runtime
    refuses validation's random inputs."""
    from aotc.validate import ReferenceRejectedInputs

    try:
        if not recipe.constants:
            return validate_variants(package, recipe.model, spec, recipe.requantize)
        # onnxruntime runs the model with the constants' inputs fixed to their values, as aotc built it
        from aotc.frontend.onnx import specialized_model

        with tempfile.TemporaryDirectory(prefix="aotc-validate-") as scratch:
            model = Path(scratch) / recipe.model.name
            model.write_bytes(specialized_model(str(recipe.model), recipe.constant_values()))
            return validate_variants(package, model, spec, recipe.requantize)
    except ReferenceRejectedInputs as err:
        logging.getLogger("aotc.build").warning(f"validation skipped: {err}")
        return None


def validate_variants(package: str, model: Path, spec, requantize: str) -> list[dict]:
    """Validate every variant against the reference (sample by sample where re-batched); with several,
    each row names its variant's input shapes."""
    import aotc_runtime

    from aotc.validate import validate_package

    variants = spec.variants
    if spec.target.is_cpu and spec.target.isa != host_target().isa:
        logging.getLogger("aotc.build").info(f"validating under qemu -cpu {qemu_cpu(spec.target)}")
        compiled = EmulatedModel(package, spec.target)  # the runtime in the target's own Python
    else:
        compiled = aotc_runtime.load(package)
    if len(variants) == 1:
        return validate_package(
            package, model, input_shapes=spec_inputs(spec), compiled=compiled, requantize=requantize
        )
    rows = []
    for v in variants:
        shapes = spec_inputs(v)
        label = ", ".join(f"{n}{list(s)}" for n, (s, _) in shapes.items())
        report = validate_package(
            package, model, input_shapes=shapes, compiled=compiled, requantize=requantize
        )
        rows += [{**r, "variant": label} for r in report]
    return rows


def _load(path: Path) -> list[Record]:
    return load_records(path) if path.exists() else []
