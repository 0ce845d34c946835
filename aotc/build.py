"""`aotc build`: model file -> graph -> fused tasks -> schedules -> kernels -> one package file."""

from __future__ import annotations

import os
import platform
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from aotc import __version__
from aotc.graph.ir import Graph, Value
from aotc.graph.partition import FusedGroup, Task, extract_tasks, group_dag, partition
from aotc.graph.passes import optimize
from aotc.ir.stmt import PrimFunc
from aotc.memory import Lifetime, plan_memory
from aotc.recipe import Recipe
from aotc.schedule.default import default_schedule
from aotc.schedule.lower import lower
from aotc.schedule.state import State
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
    return optimize(graph)


def schedule_tasks(
    tasks: list[Task], target: Target, trials: int, records: Path | None, log: Callable[[str], None]
) -> tuple[list[State], list[dict]]:
    """Each task's best tuning record if there is one, else its default schedule; tunes first if asked.

    The trial budget is split across tasks by weight x FLOPs (the task scheduler of a later milestone
    will spend it adaptively); trials already in the records count, so a repeated build tunes nothing.
    """
    from aotc.search.records import apply_best, load_records

    if trials > 0:
        if records is None:
            raise BuildError("tuning.trials is set but tuning.records is not: give the record file to write")
        tune_tasks(tasks, target, trials, records, log)
    found = load_records(records) if records is not None and records.exists() else []
    states, sources = [], []
    for task in tasks:
        best = apply_best(found, task.dag, target) if found else None
        if best is None:
            states.append(default_schedule(task.dag, target))
            sources.append({"schedule": "default"})
        else:
            states.append(best[0])
            sources.append(
                {"schedule": "record", "record_cost_s": best[1].mean_cost, "record_time": best[1].timestamp}
            )
    return states, sources


def allocate_trials(tasks: list[Task], trials: int) -> list[int]:
    """Trials per task in proportion to weight x FLOPs (largest remainders get the leftovers)."""
    shares = [t.weight * max(t.dag.flop_count, 1) for t in tasks]
    total = sum(shares)
    exact = [trials * s / total for s in shares]
    alloc = [int(e) for e in exact]
    for i in sorted(range(len(tasks)), key=lambda i: exact[i] - alloc[i], reverse=True)[
        : trials - sum(alloc)
    ]:
        alloc[i] += 1
    return alloc


def tune_tasks(
    tasks: list[Task], target: Target, trials: int, records: Path, log: Callable[[str], None]
) -> None:
    from aotc.search.measure import MeasureOptions
    from aotc.search.records import load_records
    from aotc.search.task import SearchTask

    done: dict[str, int] = {}
    if records.exists():
        for rec in load_records(records):
            if rec.target == str(target):
                done[rec.fingerprint] = done.get(rec.fingerprint, 0) + 1
    options = MeasureOptions(repeat=3, min_repeat_ms=20)
    for task, budget in zip(tasks, allocate_trials(tasks, trials)):
        need = budget - done.get(task.dag.fingerprint, 0)
        if need <= 0:
            continue
        log(f"tuning {task.name} (weight {task.weight}): {need} trials")
        SearchTask(task.dag, target, task.name).tune(
            need,
            records=records,
            measure_options=options,
            initial_states=[default_schedule(task.dag, target)],
            log=log,
        )


def build(recipe: Recipe, log: Callable[[str], None] = print) -> BuildResult:
    """Compile the recipe's model into its package; validates against the reference when asked."""
    start = time.perf_counter()
    timings: dict[str, float] = {}
    target = parse_target(recipe.target)
    if not target.is_cpu:
        raise BuildError(f"target {target}: only llvm (CPU) targets can be built so far")

    t0 = time.perf_counter()
    graph = load_model(recipe)
    groups = partition(graph)
    tasks = extract_tasks(groups)
    timings["import+partition"] = time.perf_counter() - t0
    log(
        f"{graph.name}: {len(graph.nodes)} nodes -> {len(groups)} kernels calls of {len(tasks)} distinct tasks"
    )

    t0 = time.perf_counter()
    trials = recipe.tuning.trials or 0
    states, sources = schedule_tasks(tasks, target, trials, recipe.tuning.records, log)
    funcs = [lower(state, _symbol(i, task)) for i, (task, state) in enumerate(zip(tasks, states))]
    timings["tune+schedule+lower"] = time.perf_counter() - t0

    spec = _package_spec(recipe, graph, groups, tasks, funcs, target, sources)
    out = recipe.output
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        t0 = time.perf_counter()
        from aotc.package import write_package

        write_package(spec, tmp)
        timings["codegen+package"] = time.perf_counter() - t0
        validation = None
        if recipe.validate:
            from aotc.validate import validate_package

            validation = validate_package(tmp, recipe.model, input_shapes=spec_inputs(spec))
        os.replace(tmp, out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return BuildResult(out, graph, tasks, time.perf_counter() - start, timings, validation)


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
):
    from aotc.package import BufferRef, IOSpec, KernelCall, PackageSpec, layout_weights

    task_of = {id(g): i for i, t in enumerate(tasks) for g in t.groups}
    inputs = {v: i for i, v in enumerate(graph.inputs)}
    outputs = {v: i for i, v in enumerate(graph.outputs)}

    bindings: list[tuple[FusedGroup, list[Value]]] = []
    weights: dict[Value, None] = {}
    for g in groups:
        _, args, outs = group_dag(g)
        for v in args:
            if v.is_constant:
                weights.setdefault(v)
        bindings.append((g, [*args, *outs]))
    weight_list = [(v.name, np.ascontiguousarray(v.data)) for v in weights]
    weight_offsets = layout_weights(weight_list)

    first: dict[Value, int] = {}
    last: dict[Value, int] = {}
    for step, (_, values) in enumerate(bindings):
        for v in values:
            if v.is_constant or v in inputs or v in outputs:
                continue
            first.setdefault(v, step)
            last[v] = step
    lifetimes = [Lifetime(v.name + f"#{id(v)}", v.type.nbytes, first[v], last[v]) for v in first]
    offsets, workspace = plan_memory(lifetimes)
    key_of = {v: v.name + f"#{id(v)}" for v in first}

    def ref(v: Value) -> BufferRef:
        if v.is_constant:
            return BufferRef("weight", offset=weight_offsets[v.name], nbytes=v.type.nbytes)
        if v in inputs:
            return BufferRef("input", index=inputs[v], nbytes=v.type.nbytes)
        if v in outputs:
            return BufferRef("output", index=outputs[v], nbytes=v.type.nbytes)
        return BufferRef("workspace", offset=offsets[key_of[v]], nbytes=v.type.nbytes)

    calls = [KernelCall(funcs[task_of[id(g)]].name, tuple(ref(v) for v in values)) for g, values in bindings]
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
        "records": [str(recipe.tuning.records)] if any(x["schedule"] == "record" for x in sources) else [],
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
