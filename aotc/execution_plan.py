"""The execution plan of a partitioned model: which kernel runs when on which buffers, where each
intermediate lives in the workspace (aotc.memory plans it), which weights the package stores in which
layout, and how much memory a run needs. It turns the build's kernels into the PackageSpec that
aotc.package writes."""

from __future__ import annotations

import hashlib
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
from aotc.package import BufferRef, DerivedWeight, IOSpec, KernelCall, PackageSpec, VariantSpec, weight_refs
from aotc.schedule.layout import WeightLayout
from aotc.target import Target
from aotc.weight_prepare import prepare_kernel

__all__ = [
    "MemoryLimitError",
    "check_memory",
    "intermediate_lifetimes",
    "kernel_source",
    "kernel_symbol",
    "merge_tasks",
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


def _buffer_keys(first: dict[Value, int]) -> dict[Value, str]:
    """A memory-plan key per intermediate: its name and its place in the order the calls first use them.
    The plan breaks ties between buffers of one size and first call by key, so the key must not depend on
    where Python put the value in memory (it held `id(v)`: two same-named values of one size and first
    call could have swapped places between two builds of one model)."""
    return {v: f"{v.name}#{i}" for i, v in enumerate(first)}


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
    keys = _buffer_keys(first)
    _, workspace = plan_memory([Lifetime(keys[v], v.type.nbytes, first[v], last[v]) for v in first])
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


def spec_inputs(spec: PackageSpec | VariantSpec) -> dict[str, tuple[tuple[int, ...], str]]:
    """The input shapes and dtypes of a package (its first variant) or of one variant: the ml_dtypes type
    of an input of a low-precision element type, as the runtime takes it."""
    return {io.name: (tuple(io.shape), io.element or io.dtype) for io in spec.inputs}


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


def merge_tasks(per_variant: list[list[Task]]) -> list[Task]:
    """The distinct tasks of several variants (the model at several batch sizes): tasks with equal
    workload keys are one task, weighted by its calls in all of them, so it is tuned and compiled once."""
    if len(per_variant) == 1:
        return per_variant[0]
    by_key: dict[str, Task] = {}
    for tasks in per_variant:
        for t in tasks:
            merged = by_key.get(t.workload_key)
            if merged is None:
                by_key[t.workload_key] = Task(t.dag, t.workload_key, t.weight, t.name, list(t.groups))
            else:
                merged.weight += t.weight
                merged.groups.extend(t.groups)
    return list(by_key.values())


def package_spec(
    name: str,
    variants: list[tuple[Graph, list[FusedGroup]]],
    tasks: list[Task],
    funcs: list[PrimFunc],
    target: Target,
    sources: list[dict],
    layouts: list[dict[int, WeightLayout]],
    recipe: dict | None = None,
    weights_mode: str = "compact",
) -> PackageSpec:
    """The package `name` of the kernels `funcs` (one per task, their schedules' `sources` and weight
    `layouts`), holding one execution plan per variant (graph and its fused groups; the tasks cover
    every variant's groups). Each constant is stored once per layout its kernels read it in, shared
    by the variants; with `weights_mode` "compact", a constant derived from a smaller one (Winograd
    weights) is computed at load from that one instead. `recipe` (resolved, as a dict) goes into the
    provenance."""

    task_of = {id(g): i for i, t in enumerate(tasks) for g in t.groups}
    weights = WeightTable(compact=weights_mode == "compact" and target.is_cpu)
    bindings = [_bind_groups(groups, task_of, layouts, weights) for _, groups in variants]
    weight_list, derived = weights.arrays(), weights.derived_weights()
    refs = weight_refs(weight_list, derived)
    weight_offsets = {name: r.offset for name, r in refs.items()}
    weight_bytes = {name: r.nbytes for name, r in refs.items()}
    prepare_funcs, prepare_calls = weights.prepare(target, refs)
    planned = [
        _variant_spec(graph, binding, task_of, funcs, weights, weight_offsets, weight_bytes)
        for (graph, _), binding in zip(variants, bindings)
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
    ] + [
        {"task": f"compute {f.name.removeprefix('prepare_')} at load", "schedule": "default"}
        for f in prepare_funcs
    ]
    provenance = {
        "aotc_version": __version__,
        "recipe": recipe or {},
        "records": sorted({x["record_source"] for x in sources if x["schedule"] == "record"}),
        "host": f"{platform.node()} {platform.machine()} {platform.python_version()}",
    }
    first = planned[0]
    return PackageSpec(
        name=name,
        target=target,
        inputs=first.inputs,
        outputs=first.outputs,
        kernels=[*funcs, *prepare_funcs],
        calls=first.calls,
        weights=weight_list,
        derived_weights=derived,
        prepare=prepare_calls,
        workspace_bytes=first.workspace_bytes,
        memory_plan=first.memory_plan,
        kernel_info=kernel_info,
        provenance=provenance,
        other_variants=planned[1:],
    )


class WeightTable:
    """The constants the package stores, each once per layout its kernels read it in; one constant of
    several variants' graphs (equal name and data) is stored once. With `compact`, a constant derived
    from a smaller one is not stored: its source is (once), and the package computes it at load."""

    def __init__(self, compact: bool = False) -> None:
        self.compact = compact
        self.names: dict[tuple, str] = {}
        self.data: dict[str, tuple[Value, WeightLayout | None]] = {}
        self.derived: dict[str, tuple[Value, WeightLayout | None, str]] = {}  # name -> (.., source's name)
        self.sources: dict[str, np.ndarray] = {}
        self.source_names: dict[tuple, str] = {}

    def key(self, v: Value, layout: WeightLayout | None) -> tuple:
        data = np.ascontiguousarray(v.data)
        digest = hashlib.sha256(data.reshape(-1).view(np.uint8)).hexdigest()
        return (v.name, data.dtype.str, data.shape, digest, layout)

    def add(self, v: Value, layout: WeightLayout | None) -> str:
        key = self.key(v, layout)
        name = self.names.get(key)
        if name is None:
            name = self._unique(v.name if layout is None else f"{v.name}#packed{len(self.names)}")
            self.names[key] = name
            if self.compact and v.derivation is not None:
                self.derived[name] = (v, layout, self._add_source(v))
            else:
                self.data[name] = (v, layout)
        return name

    def _unique(self, name: str) -> str:
        """`name`, or where another constant has it (a variant's, with other data) a numbered one."""
        taken = self.data.keys() | self.derived.keys() | self.sources.keys()
        return name if name not in taken else f"{name}#{len(self.names) + len(self.sources)}"

    def _add_source(self, v: Value) -> str:
        source = np.ascontiguousarray(v.derivation.source)
        key = (source.dtype.str, source.shape, hashlib.sha256(source.reshape(-1).view(np.uint8)).hexdigest())
        if key not in self.source_names:
            name = self._unique(f"{v.name}#source")
            self.source_names[key] = name
            self.sources[name] = source
        return self.source_names[key]

    def arrays(self) -> list[tuple[str, np.ndarray]]:
        """What weights.bin holds: the constants as their kernels read them, and derived ones' sources."""
        stored = [
            (name, np.ascontiguousarray(v.data if layout is None else layout.apply(v.data)))
            for name, (v, layout) in self.data.items()
        ]
        return stored + list(self.sources.items())

    def derived_weights(self) -> list[DerivedWeight]:
        out = []
        for name, (v, layout, source) in self.derived.items():
            shape = layout.new_shape if layout is not None else tuple(v.type.shape)
            how = {"kind": v.derivation.kind, "tile": v.derivation.tile, "from": source}
            out.append(DerivedWeight(name, shape, v.type.dtype, how))
        return out

    def prepare(self, target: Target, refs: dict[str, BufferRef]) -> tuple[list[PrimFunc], list[KernelCall]]:
        """The kernels that compute the derived weights at load (one per distinct computation) and
        their calls, from `refs`, where the weights lie in the package's weights buffer."""
        funcs: dict[tuple, PrimFunc] = {}
        calls = []
        for name, (v, layout, source) in self.derived.items():
            d = v.derivation
            key = (d.kind, d.tile, d.source.shape, d.source.dtype.str, layout)
            if key not in funcs:
                funcs[key] = prepare_kernel(d, layout, f"prepare_weight{len(funcs)}", target)
            calls.append(KernelCall(funcs[key].name, (refs[source], refs[name])))
        return list(funcs.values()), calls


Binding = tuple[FusedGroup, list[Value], dict[int, WeightLayout], list[str | None]]


def _bind_groups(
    groups: list[FusedGroup],
    task_of: dict[int, int],
    layouts: list[dict[int, WeightLayout]],
    weights: WeightTable,
) -> list[Binding]:
    """Per fused group: its arguments and outputs, its task's weight layouts, and the stored name of
    each constant argument."""
    bindings = []
    for g in groups:
        _, args, outs = group_dag(g)
        relaid = layouts[task_of[id(g)]]
        names = [weights.add(v, relaid.get(a)) if v.is_constant else None for a, v in enumerate(args)]
        bindings.append((g, [*args, *outs], relaid, names + [None] * len(outs)))
    return bindings


def _variant_spec(
    graph: Graph,
    bindings: list[Binding],
    task_of: dict[int, int],
    funcs: list[PrimFunc],
    weights: WeightTable,
    weight_offsets: dict[str, int],
    weight_bytes: dict[str, int],
) -> VariantSpec:
    """One variant's I/O, kernel calls and memory plan (intermediates in its own workspace)."""
    inputs = {v: i for i, v in enumerate(graph.inputs)}
    outputs = {v: i for i, v in enumerate(graph.outputs)}
    first, last = intermediate_lifetimes([values for _, values, _, _ in bindings], graph)
    key_of = _buffer_keys(first)
    offsets, workspace = plan_memory([Lifetime(key_of[v], v.type.nbytes, first[v], last[v]) for v in first])

    def ref(v: Value, weight: str | None) -> BufferRef:
        if v.is_constant:
            return BufferRef("weight", offset=weight_offsets[weight], nbytes=weight_bytes[weight])
        if v in inputs:
            return BufferRef("input", index=inputs[v], nbytes=v.type.nbytes)
        if v in outputs:
            return BufferRef("output", index=outputs[v], nbytes=v.type.nbytes)
        return BufferRef("workspace", offset=offsets[key_of[v]], nbytes=v.type.nbytes)

    calls = [
        KernelCall(funcs[task_of[id(g)]].name, tuple(ref(v, w) for v, w in zip(values, names)))
        for g, values, _, names in bindings
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
    return VariantSpec(
        inputs=[
            IOSpec(v.name, tuple(v.type.shape), v.type.dtype, graph.elements.get(v.name))
            for v in graph.inputs
        ],
        outputs=[
            IOSpec(v.name, tuple(v.type.shape), v.type.dtype, graph.elements.get(v.name))
            for v in graph.outputs
        ],
        calls=calls,
        workspace_bytes=workspace,
        memory_plan=memory_plan,
    )
