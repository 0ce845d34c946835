"""How each kernel of a model scales from 1 thread to N, timed alone: the kernels of the model's tasks (each
task's best record in `--records`, else its default schedule) built one by one and timed at 1 and N
threads in turns, the best of `--rounds` medians each. `--chunks 8,32` also builds every kernel with each
thread's share of a parallel loop cut into that many chunks to steal (aotc.codegen.stmtgen; the first is
the baseline) and times them in turns at N threads. The first line times the thread pool's fork and join
on a kernel of two tiny iterations.

    python benchmarks/thread_scaling.py MODEL [--records FILE] [--threads N] [--chunks 8,32] [--quick]

docs/int8.md cites it: the scaling that `aotc profile` shows in a whole run, measured here without the
kernels before and after each one.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
from compile_time import kernel_feed, loadavg
from timing import cpu_class, median_seconds
from zoo import tflite_models

from aotc.build import load_variants
from aotc.codegen import stmtgen
from aotc.codegen.module import build_module, load_library
from aotc.graph.partition import extract_tasks
from aotc.ir.expr import Buffer, Load, Var, const
from aotc.ir.stmt import BufferStore, For, ForKind, PrimFunc
from aotc.recipe import load_recipe
from aotc.schedule.default import default_schedule
from aotc.schedule.steps import steps_to_json
from aotc.search.common import ErrorCode
from aotc.search.measure import build_candidate
from aotc.search.records import apply_best, load_records
from aotc.search.timing import KERNEL_NAME
from aotc.target import Target, host_target


def fork_join_us(workdir: str, threads: int) -> tuple[float, float]:
    """Microseconds per call of a kernel whose parallel loop has 2 iterations of 32 floats, at 1 thread
    and at `threads`: what a parallel region costs beyond its work."""
    x, y = Buffer("x", "float32", (64,)), Buffer("y", "float32", (64,))
    i, j = Var("i"), Var("j")
    store = BufferStore(y, Load(x, (i * 32 + j,)) + 1.0, (i * 32 + j,))
    body = For(i, const(2), 2, ForKind.PARALLEL, For(j, const(32), 32, ForKind.SERIAL, store))
    path = os.path.join(workdir, "fork_join.so")
    build_module([PrimFunc("k", (x, y), body)], host_target(), path)
    library = load_library(path)
    call = library.kernel("k").prepare(np.ones(64, np.float32), np.zeros(64, np.float32))
    best = {1: math.inf, threads: math.inf}
    for _ in range(3):
        for t in best:
            library.set_num_threads(t)
            best[t] = min(best[t], median_seconds(call, 0.2, 5))
    return best[1] * 1e6, best[threads] * 1e6


def kernel_call(task, steps: list, target: Target, name: str):
    """The task's kernel built from `steps` as the tuner's builders build a candidate, ready to call on
    random data: (library, call, output array)."""
    built = build_candidate(task.dag, target, name, ("steps", steps))
    if built.error != ErrorCode.NO_ERROR:
        raise RuntimeError(f"{task.name}: the kernel did not build: {built.msg}")
    library = load_library(built.path)
    arrays = [a.copy() for a in kernel_feed(task.dag, steps)]
    return library, library.kernel(KERNEL_NAME).prepare(*arrays), arrays[-1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path, nargs="?", help="an .onnx or .tflite model")
    ap.add_argument("--records", type=Path, help="tuning records (JSON lines); tasks without one: default")
    ap.add_argument("--threads", type=int, default=2, help="the thread count compared with 1 (default 2)")
    ap.add_argument("--chunks", default="", help="comma-separated chunk counts per thread to compare")
    ap.add_argument("--rounds", type=int, default=5, help="timing rounds, in turns (default 5)")
    ap.add_argument("--quick", action="store_true", help="the tests' int8 small CNN, one round")
    args = ap.parse_args(argv)
    target = host_target()
    rounds = 1 if args.quick else args.rounds
    chunks = [int(c) for c in args.chunks.split(",") if c]
    with tempfile.TemporaryDirectory() as workdir:
        model = args.model
        if args.quick or model is None:
            model = Path(workdir) / "small_cnn_int8.tflite"
            model.write_bytes(tflite_models.int8_model(tflite_models.small_cnn()).build())
        recipe = Path(workdir) / "model.yaml"
        recipe.write_text(f"model: {model}\noutput: {Path(workdir) / 'model.aotc'}\n")
        (_, groups), *_ = load_variants(load_recipe(recipe))
        tasks = extract_tasks(groups)
        records = load_records(args.records) if args.records else []
        one, many = fork_join_us(workdir, args.threads)
        print(f"CPU class: {cpu_class()}; load average {loadavg()}; {len(tasks)} tasks of {model.name}")
        print(f"fork and join: {one:.2f} us a call at 1 thread, {many:.2f} us at {args.threads}")
        sums = {1: 0.0, args.threads: 0.0}
        chunk_sums = dict.fromkeys(chunks, 0.0)
        for i, task in enumerate(tasks):
            found = apply_best(records, task.dag, target) if records else None
            state = found[0] if found else default_schedule(task.dag, target)
            steps = steps_to_json(state.steps)
            library, call, _ = kernel_call(task, steps, target, os.path.join(workdir, f"k{i}"))
            best = dict.fromkeys(sums, math.inf)
            for _ in range(rounds):
                for t in best:
                    library.set_num_threads(t)
                    best[t] = min(best[t], median_seconds(call, 0.05, 3))
            for t in sums:
                sums[t] += best[t]
            line = (
                f"{i:3} {task.name:<30} {'record' if found else 'default':<7} "
                f"1t {best[1] * 1e6:8.1f} us  {args.threads}t {best[args.threads] * 1e6:8.1f} us  "
                f"scaling {best[1] / best[args.threads]:5.2f}"
            )
            if chunks:
                line += "  " + chunk_columns(
                    task, steps, target, workdir, chunks, args.threads, rounds, chunk_sums
                )
            print(line, flush=True)
        print(
            f"sum: 1t {sums[1] * 1e3:.3f} ms, {args.threads}t {sums[args.threads] * 1e3:.3f} ms, "
            f"scaling {sums[1] / sums[args.threads]:.3f} (load average {loadavg()})"
        )
        if chunks:
            base = chunk_sums[chunks[0]]
            print(
                f"sum at {args.threads} threads by chunks per thread: "
                + ", ".join(f"{c}: {s * 1e3:.3f} ms ({base / s:.3f}x)" for c, s in chunk_sums.items())
            )
    return 0


def chunk_columns(task, steps, target, workdir, chunks, threads, rounds, sums) -> str:
    """Times at `threads` of the kernel built with each chunk count, in turns; outputs must agree."""
    saved = stmtgen.CHUNKS_PER_THREAD
    calls, outputs, libraries = [], [], []  # the libraries stay loaded while their kernels are timed
    try:
        for c in chunks:
            stmtgen.CHUNKS_PER_THREAD = c
            library, call, out = kernel_call(task, steps, target, os.path.join(workdir, f"c{c}"))
            library.set_num_threads(threads)
            call()
            libraries.append(library)
            calls.append(call)
            outputs.append(out)
    finally:
        stmtgen.CHUNKS_PER_THREAD = saved
    if not all(np.array_equal(outputs[0], o) for o in outputs):
        raise RuntimeError(f"{task.name}: the chunk counts gave different outputs")
    best = [math.inf] * len(calls)
    for _ in range(rounds):
        for k, call in enumerate(calls):
            best[k] = min(best[k], median_seconds(call, 0.05, 3))
    for c, b in zip(chunks, best):
        sums[c] += b
    return " ".join(f"c{c} {b * 1e6:8.1f}" for c, b in zip(chunks, best))


if __name__ == "__main__":
    sys.exit(main())
