"""The execution plan of a partitioned model: which kernel runs when on which buffers, where each
intermediate lives in the workspace (aotc.memory plans it), which weights the package stores in which
layout, and how much memory a run needs. It turns the build's kernels into the PackageSpec that
aotc.package writes."""

from __future__ import annotations

import os
import platform

import numpy as np

from aotc import __version__
from aotc.errors import BuildError
from aotc.graph.ir import Graph, Value
from aotc.graph.partition import FusedGroup, Task, group_dag
from aotc.hub import Lookup
from aotc.ir.stmt import PrimFunc
from aotc.memory import Lifetime, plan_memory
from aotc.package import BufferRef, IOSpec, KernelCall, PackageSpec, layout_weights
from aotc.schedule.layout import WeightLayout
from aotc.target import Target

__all__ = [
    "MemoryLimitError",
    "check_memory",
    "intermediate_lifetimes",
    "kernel_source",
    "kernel_symbol",
    "package_spec",
    "physical_memory",
    "spec_inputs",
]


class MemoryLimitError(BuildError):
    """A run of the model would need more memory than allowed."""


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
        raise MemoryLimitError(f"{graph.name}: a run needs {_size(total)} ({parts}), {over}")
    return need


def _size(n: int) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def spec_inputs(spec) -> dict[str, tuple[tuple[int, ...], str]]:
    return {io.name: (tuple(io.shape), io.dtype) for io in spec.inputs}


def kernel_symbol(i: int, task: Task) -> str:
    clean = "".join(ch if ch.isalnum() else "_" for ch in task.name)
    return f"k{i}_{clean}"[:64]


def kernel_source(task: Task, found: Lookup, transfer: dict | None = None) -> dict:
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


def package_spec(
    name: str,
    graph: Graph,
    groups: list[FusedGroup],
    tasks: list[Task],
    funcs: list[PrimFunc],
    target: Target,
    sources: list[dict],
    layouts: list[dict[int, WeightLayout]],
    recipe: dict | None = None,
) -> PackageSpec:
    """The package `name` of the kernels `funcs` (one per task, their schedules' `sources` and weight
    `layouts`); each constant is stored once per layout its kernels read it in. `recipe` (resolved, as
    a dict) goes into the provenance."""

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
        "recipe": recipe or {},
        "records": sorted({x["record_source"] for x in sources if x["schedule"] == "record"}),
        "host": f"{platform.node()} {platform.machine()} {platform.python_version()}",
    }
    return PackageSpec(
        name=name,
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
