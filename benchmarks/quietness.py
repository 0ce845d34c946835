"""How quiet is this machine: probes of one core's vector multiplies and of loads from 256 KB, 8 MB and 128 MB,
timed in turns with a package (and its peer), and how much each slowed in the package's slow rounds.

    python benchmarks/quietness.py [--package model.aotc [--compare model.tflite|.onnx]] [--threads T]
                                   [--rounds N] [--quick]

The load average sees only this machine's processes. On a VM the core under a vCPU may also run another
guest's thread (its SMT sibling) and the caches and memory are shared with other guests: a probe of
independent vector multiply chains, which touches no memory, then runs slower as well, and loads from a
buffer that fits the L2 slow down most. Each probe's p50/min over the rounds says how quiet the machine was
(1.00: quiet); with a package, rounds are split by its time (slow: its slowest 40%, fast: its fastest 30%)
and each line shows how much that thing slowed between them. The probes are built with aotc's own LLVM
path, so nothing but aotc is needed.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import pathlib
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np
from timing import cpu_class

from aotc.codegen.llvm import compile_to_object, link_shared
from aotc.target import host_target

PROBES_IR = """
define i32 @probe_multiply(i64 %n, i32 %k) {
entry:
  %kv0 = insertelement <8 x i32> poison, i32 %k, i64 0
  %kv = shufflevector <8 x i32> %kv0, <8 x i32> poison, <8 x i32> zeroinitializer
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %i1, %loop ]
{chains}
  %i1 = add i64 %i, 1
  %more = icmp slt i64 %i1, %n
  br i1 %more, label %loop, label %done
done:
{reduce}
  %r = extractelement <8 x i32> %x7, i64 0
  ret i32 %r
}

define i32 @probe_loads(ptr %p, i64 %vectors, i64 %reps) {
entry:
  br label %rep
rep:
  %r = phi i64 [ 0, %entry ], [ %r1, %repend ]
  %s0 = phi <32 x i8> [ zeroinitializer, %entry ], [ %s2, %repend ]
  br label %loop
loop:
  %i = phi i64 [ 0, %rep ], [ %i1, %loop ]
  %s = phi <32 x i8> [ %s0, %rep ], [ %s1, %loop ]
  %a = getelementptr <32 x i8>, ptr %p, i64 %i
  %v = load <32 x i8>, ptr %a, align 1
  %s1 = add <32 x i8> %s, %v
  %i1 = add i64 %i, 1
  %more = icmp slt i64 %i1, %vectors
  br i1 %more, label %loop, label %repend
repend:
  %s2 = phi <32 x i8> [ %s1, %loop ]
  %r1 = add i64 %r, 1
  %again = icmp slt i64 %r1, %reps
  br i1 %again, label %rep, label %done
done:
  %w = bitcast <32 x i8> %s2 to <8 x i32>
  %out = extractelement <8 x i32> %w, i64 0
  ret i32 %out
}
"""
CHAINS = 8  # independent multiply chains: enough to keep the multipliers of one core busy


def probes_ir() -> str:
    """Eight independent chains x = (x * k) ^ x of 8-lane int32 vectors (k a run-time value, so nothing
    folds), and a sum of 32-byte loads over a buffer."""
    phis = "\n".join(
        f"  %a{c} = phi <8 x i32> [ <{', '.join(f'i32 {c + j + 1}' for j in range(8))}>, %entry ], [ %b{c}, %loop ]"
        for c in range(CHAINS)
    )
    steps = "\n".join(
        f"  %m{c} = mul <8 x i32> %a{c}, %kv\n  %b{c} = xor <8 x i32> %m{c}, %a{c}" for c in range(CHAINS)
    )
    chains = phis + "\n" + steps
    reduce = "\n".join(
        f"  %x{c} = xor <8 x i32> {'%b0' if c == 1 else f'%x{c - 1}'}, %b{c}" for c in range(1, CHAINS)
    )
    return PROBES_IR.replace("{chains}", chains).replace("{reduce}", reduce)


def build_probes(workdir: str) -> ctypes.CDLL:
    target = host_target()
    path = os.path.join(workdir, "probes.so")
    link_shared([compile_to_object(probes_ir(), target)], path, target.isa, needs_libc=False)
    lib = ctypes.CDLL(path)
    lib.probe_multiply.argtypes = [ctypes.c_int64, ctypes.c_int32]
    lib.probe_loads.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
    return lib


def sized(run: Callable[[int], object], seconds: float) -> Callable[[], object]:
    """`run(count)` with the count that takes about `seconds` here and now (each trial count run twice:
    the first call of a probe pays for cold caches and pages)."""
    count = 1
    while True:
        took = min(_seconds(run, count) for _ in range(2))
        if took > seconds / 4 or count > 1 << 40:
            break
        count *= 4
    count = max(1, round(count * seconds / took))
    return lambda: run(count)


def _seconds(run: Callable[[int], object], count: int) -> float:
    start = time.perf_counter()
    run(count)
    return time.perf_counter() - start


def probe_calls(lib: ctypes.CDLL, seconds: float, buffers: list) -> dict[str, Callable[[], object]]:
    """The probes, each sized to take about `seconds`; their buffers are appended to `buffers`."""
    calls = {"multiply chains, no memory": sized(lambda n: lib.probe_multiply(n, 3), seconds)}
    for label, nbytes in (("loads, 256 KB buffer", 256 << 10), ("loads, 8 MB buffer", 8 << 20)):
        buf = np.ones(nbytes, np.int8)
        buffers.append(buf)
        calls[label] = sized(
            lambda reps, b=buf: lib.probe_loads(b.ctypes.data, b.nbytes // 32, reps), seconds
        )
    # 128 MB read a part at a time, each call the part after the last: no load finds its line in a cache
    big = np.ones(128 << 20, np.int8)
    buffers.append(big)
    at = [0]

    def stream(vectors: int) -> None:
        vectors = min(vectors, big.nbytes // 32)
        if at[0] + vectors > big.nbytes // 32:
            at[0] = 0
        lib.probe_loads(big.ctypes.data + at[0] * 32, vectors, 1)
        at[0] += vectors

    calls["loads, 128 MB streamed"] = sized(stream, seconds)
    return calls


def package_calls(args) -> dict[str, Callable[[], object]]:
    import aotc_runtime

    from aotc.benchmark import peer_calls
    from aotc.validate import random_inputs

    model = aotc_runtime.load(str(args.package))
    model.num_threads = args.threads
    inputs = random_inputs({t.name: (tuple(t.shape), t.dtype) for t in model.inputs}, seed=0)
    calls: dict[str, Callable[[], object]] = {args.package.name: lambda: model.run(inputs)}
    if args.compare:
        name, (peer,) = peer_calls(args.compare, inputs, 1, args.threads)
        calls[name] = peer
    return calls


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--package", type=pathlib.Path, help="an .aotc package, timed in turns with the probes")
    ap.add_argument("--compare", type=pathlib.Path, help="its model (.onnx, .tflite), run by its peer too")
    ap.add_argument("--threads", type=int, default=1, help="threads of the package and the peer (default 1)")
    ap.add_argument("--rounds", type=int, default=300, help="rounds, each timing every probe once")
    ap.add_argument("--quick", action="store_true", help="20 short rounds (a smoke run)")
    args = ap.parse_args(argv)
    if args.compare and not args.package:
        ap.error("--compare needs --package")
    rounds = 20 if args.quick else args.rounds
    with tempfile.TemporaryDirectory() as workdir:
        buffers: list = []  # alive while the probes run
        probes = probe_calls(build_probes(workdir), 0.0002 if args.quick else 0.0005, buffers)
        calls = {**probes, **(package_calls(args) if args.package else {})}
        for call in calls.values():
            call()
        times: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(rounds):
            for name, call in calls.items():
                start = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - start)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"CPU class: {cpu_class()}; load average {load}; {rounds} rounds, each thing timed once a round")
    arrays = {name: np.array(t) for name, t in times.items()}
    key = args.package.name if args.package else next(iter(arrays))
    order = arrays[key]
    slow, fast = order >= np.percentile(order, 60), order <= np.percentile(order, 30)
    print(f"slow rounds: the slowest 40% of {key}'s, fast: its fastest 30%")
    for name, t in arrays.items():
        print(
            f"  {name:<28} min {t.min() * 1e3:8.3f} ms  p50/min {np.median(t) / t.min():5.2f}  "
            f"slow/fast rounds {np.median(t[slow]) / np.median(t[fast]):5.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
