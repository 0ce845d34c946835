"""Per-candidate compile time of int8 convs, sampled as the tuner samples them, with its breakdown.

    python benchmarks/compile_time.py [--candidates N] [--compare] [--kernels K] [--quick] [--direct] [--reuse]

Each workload is one qnn conv built through a build's graph passes (zero point folded into the bias,
per-channel requantization tables), partitioned into its task; candidates come from
`sample_initial_population`, and each is built as the tuner's builder builds it (replay, weight layout
rewrite, lower, LLVM IR, LLVM O3, object, link; `aotc.search.measure.build_candidate`). `--compare` also
builds every candidate the way each library was built before (the thread pool compiled into every
kernel module), interleaved with the current way, and times the kernels of both (best of rounds): the
same programs, so any difference is the code generator's. `--reuse` then builds the candidates again
the way the tuner's builders do (`build_candidate`: each parallel region compiled on its own, its object
kept for later candidates), followed by as many mutants of them, as the search's later rounds breed them
from measured programs: the mutants' compile reuses the regions they did not change.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np
from kernels import conv_state, gemm_state
from timing import cpu_class, median_seconds

from aotc.codegen.llvm import build_llvm_ir, compile_to_object, link_shared, thread_pool_object
from aotc.codegen.module import load_library
from aotc.graph.ir import Graph, Node, TensorType, Value
from aotc.graph.partition import extract_tasks, partition
from aotc.graph.passes import optimize
from aotc.ir.dot import dot_forms, integer_winograd_rule
from aotc.schedule.default import default_schedule
from aotc.schedule.layout import apply_layouts, rewrite_layout
from aotc.schedule.lower import lower
from aotc.schedule.state import State
from aotc.schedule.steps import replay, steps_from_json, steps_to_json
from aotc.search.annotation import sample_initial_population
from aotc.search.common import ErrorCode
from aotc.search.evolution import mutate
from aotc.search.lowering import is_valid
from aotc.search.measure import build_candidate
from aotc.search.sketch import SearchContext, generate_sketches
from aotc.target import Target, host_target
from aotc.te.dag import ComputeDAG

# (name, input HxW, input channels, output channels, kernel size): ResNet/MobileNet-like int8 layers
WORKLOADS = [
    ("conv3x3 28x28 64->64", 28, 64, 64, 3),
    ("conv3x3 14x14 96->96", 14, 96, 96, 3),
    ("conv1x1 56x56 24->144", 56, 24, 144, 1),
]
PHASES = ("lower", "ir", "parse", "optimize", "emit", "link")


def int8_conv_dag(hw: int, cin: int, cout: int, k: int, target: Target, winograd: bool = True) -> ComputeDAG:
    """The task of one int8 NHWC conv (per-channel weights, RELU6, float requantization) after a build's
    graph passes for `target` (dot products; a 3x3 conv as integer Winograd where the target takes it,
    unless `winograd` is off, as a recipe's `winograd: false` builds it)."""
    rng = np.random.default_rng(0)
    x = Value("x", TensorType((1, hw, hw, cin), "int8"))
    w = rng.integers(-127, 128, (cout, k, k, cin)).astype(np.int8)
    b = rng.integers(-2000, 2000, cout).astype(np.int32)
    weight = Value("w", TensorType(w.shape, "int8"), data=w)
    bias = Value("b", TensorType(b.shape, "int32"), data=b)
    out = Value("y", TensorType((1, hw, hw, cout), "int8"))
    p = k // 2
    attrs = {
        "strides": (1, 1),
        "pads": (p, p, p, p),
        "dilations": (1, 1),
        "input_scale": 0.02,
        "input_zero_point": 3,
        "weight_scales": tuple(0.001 * (1 + c % 7) for c in range(cout)),
        "weight_zero_points": (0,) * cout,
        "activation": "RELU6",
        "output_scale": 0.1,
        "output_zero_point": -5,
        "out_dtype": "int8",
        "requantize": "float",
    }
    node = Node("qnn.conv2d_nhwc", [x, weight, bias], [out], attrs, name="conv")
    out.producer = node
    graph = optimize(
        Graph([x], [out], [node]),
        dot_products=True,
        integer_winograd=integer_winograd_rule(dot_forms(target)) if winograd else None,
    )
    (task,) = extract_tasks(partition(graph))
    return task.dag


def sampled_candidates(dag: ComputeDAG, target: Target, n: int, seed: int) -> list[list]:
    """The step records of `n` distinct valid programs, as the tuner's first round samples them."""
    sketches = generate_sketches(dag, target)
    states = sample_initial_population(dag, sketches, n, random.Random(seed), target)
    return [steps_to_json(s.steps) for s in states]


def build_timed(
    dag: ComputeDAG, steps: list, target: Target, path: str, pool_inside: bool
) -> dict[str, float]:
    """Build one candidate like the tuner's builder (`pool_inside`: as before, the pool compiled into the
    kernel module); seconds per phase, plus the IR's size in "bytes"."""
    t0 = time.perf_counter()
    state, _ = rewrite_layout(replay(dag, steps_from_json(steps)))
    func = lower(state, "k")
    t1 = time.perf_counter()
    ir = build_llvm_ir([func], target, thread_pool=pool_inside)
    t2 = time.perf_counter()
    seconds: dict[str, float] = {"lower": t1 - t0, "ir": t2 - t1}
    obj = compile_to_object(ir, target, seconds=seconds)
    t3 = time.perf_counter()
    link_shared(
        [obj] if pool_inside else [obj, thread_pool_object(target)], path, target.isa, needs_libc=False
    )
    seconds["link"] = time.perf_counter() - t3
    seconds["total"] = time.perf_counter() - t0
    seconds["bytes"] = len(ir)
    return seconds


def reuse_rows(dag: ComputeDAG, candidates: list[list], target: Target, workdir: str, seed: int) -> str:
    """Seconds per candidate built as the tuner's builders build them (regions' objects kept in one
    folder): the sampled candidates, then one mutant of a random one of them for each."""
    ctx = SearchContext(dag, target)
    rng = random.Random(seed)
    parents = [replay(dag, steps_from_json(c)) for c in candidates]
    mutants: list[list] = []
    while len(mutants) < len(candidates):
        child = mutate(parents[rng.randrange(len(parents))], rng, ctx)
        if child is not None and is_valid(child):
            mutants.append(steps_to_json(child.steps))
    lines = []
    for label, programs in (("sampled", candidates), ("mutants", mutants)):
        seconds = []
        for i, steps in enumerate(programs):
            built = build_candidate(dag, target, os.path.join(workdir, f"r{label}{i}"), ("steps", steps))
            if built.error != ErrorCode.NO_ERROR:
                raise RuntimeError(f"{label} {i} did not build: {built.msg}")
            seconds.append(built.seconds)
        lines.append(f"{label} median {statistics.median(seconds):.3f} s, max {max(seconds):.3f} s")
    return "  reused regions: " + "; ".join(lines)


def summary(rows: list[dict[str, float]]) -> str:
    totals = [r["total"] for r in rows]
    parts = ", ".join(f"{p} {statistics.median(r[p] for r in rows) * 1000:.0f}" for p in PHASES)
    kb = statistics.median(r["bytes"] for r in rows) / 1000
    return (
        f"median {statistics.median(totals):.3f} s, max {max(totals):.3f} s "
        f"(medians in ms: {parts}; IR {kb:.0f} KB)"
    )


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def kernel_feed(dag: ComputeDAG, steps: list) -> list[np.ndarray]:
    """Random inputs in the candidate's weight layouts, then zeroed outputs."""
    rng = np.random.default_rng(1)
    arrays = []
    for p in dag.placeholders:
        if np.dtype(p.dtype).kind == "f":  # requantization multipliers
            arrays.append(rng.uniform(0.001, 0.01, p.shape).astype(p.dtype))
            continue
        info = np.iinfo(p.dtype)
        lo, hi = max(info.min, -3000), min(info.max, 3000)
        arrays.append(rng.integers(lo, hi + 1, p.shape).astype(p.dtype))
    arrays = apply_layouts(arrays, rewrite_layout(replay(dag, steps_from_json(steps)))[1])
    outs = [np.zeros([int(d) for d in t.shape], t.dtype) for t in dag.outputs]
    return arrays + outs


def time_pair(calls: list[Callable[[], None]], rounds: int) -> list[float]:
    """Best of `rounds` medians of each call, the calls interleaved round by round."""
    best = [float("inf")] * len(calls)
    for _ in range(rounds):
        for i, call in enumerate(calls):
            best[i] = min(best[i], median_seconds(call, 0.05, 3))
    return best


def compare_kernels(
    kernels: list[tuple[str, State]], target: Target, workdir: str, rounds: int, threads: int = 1
) -> list[str]:
    """Run time of each labelled program built both ways, and whether their outputs agree."""
    lines = []
    for i, (label, state) in enumerate(kernels):
        steps = steps_to_json(state.steps)
        feed = kernel_feed(state.dag, steps)
        outputs, calls = [], []
        for way, inside in (("old", True), ("new", False)):
            path = os.path.join(workdir, f"run{i}{way}.so")
            build_timed(state.dag, steps, target, path, inside)
            library = load_library(path)
            library.set_num_threads(threads)
            arrays = [a.copy() for a in feed]
            calls.append(library.kernel("k").prepare(*arrays))
            calls[-1]()
            outputs.append(arrays[-1])
        same = np.array_equal(outputs[0], outputs[1])
        old, new = time_pair(calls, rounds)
        lines.append(
            f"  {label:<22} old {old * 1e6:9.1f} us  new {new * 1e6:9.1f} us  new/old {new / old:5.3f}"
            f"  {'bit-exact' if same else 'OUTPUTS DIFFER'}  (load {loadavg()})"
        )
    return lines


def float_kernels() -> list[tuple[str, State]]:
    """benchmarks/kernels.py's hand-written float GEMM and conv programs."""
    return [("float gemm 512", gemm_state(512)), ("float conv3x3 56x56x64", conv_state())]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidates", type=int, default=30, help="sampled candidates per workload")
    ap.add_argument(
        "--compare", action="store_true", help="also the old way (pool in every module), interleaved"
    )
    ap.add_argument("--kernels", type=int, default=0, help="with --compare: time the default and K samples")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds per kernel")
    ap.add_argument("--threads", type=int, default=1, help="threads of the timed kernels")
    ap.add_argument("--quick", action="store_true", help="the 1x1 conv, 3 candidates (smoke run)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--direct", action="store_true", help="3x3 convs as direct convs where the host would take Winograd"
    )
    ap.add_argument(
        "--reuse", action="store_true", help="also as the tuner's builders build them, then mutants of them"
    )
    args = ap.parse_args(argv)
    target = host_target()
    workloads = WORKLOADS[2:] if args.quick else WORKLOADS
    n = 3 if args.quick else args.candidates
    print(f"CPU class: {cpu_class()}; target {target}; load average {loadavg()}")
    thread_pool_object(target)  # compiled once per process, as in a builder worker
    with tempfile.TemporaryDirectory() as workdir:
        for name, hw, cin, cout, k in workloads:
            dag = int8_conv_dag(hw, cin, cout, k, target, winograd=not args.direct)
            candidates = sampled_candidates(dag, target, n, args.seed)
            ways = [("new", False), ("old", True)] if args.compare else [("new", False)]
            rows: dict[str, list[dict[str, float]]] = {way: [] for way, _ in ways}
            for i, steps in enumerate(candidates):
                for way, inside in ways if i % 2 == 0 else ways[::-1]:  # alternate which goes first
                    rows[way].append(build_timed(dag, steps, target, os.path.join(workdir, "c.so"), inside))
            print(f"int8 {name}, {len(candidates)} candidates (load average {loadavg()}):")
            for way, _ in ways:
                print(f"  {way}: {summary(rows[way])}")
            if args.reuse:
                print(reuse_rows(dag, candidates, target, workdir, args.seed), flush=True)
            if args.compare and args.kernels:
                picks = [("default", default_schedule(dag, target))]
                picks += [(f"sample {j}", replay(dag, steps_from_json(c))) for j, c in enumerate(candidates)]
                for line in compare_kernels(
                    picks[: args.kernels + 1], target, workdir, args.rounds, args.threads
                ):
                    print(line, flush=True)
        if args.compare and args.kernels:
            print(f"float kernels (load average {loadavg()}):")
            for line in compare_kernels(float_kernels(), target, workdir, args.rounds, args.threads):
                print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
