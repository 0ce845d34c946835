"""The peak of the host's int8 dot-product instruction: what no int8 kernel on this CPU can beat.

    python benchmarks/dot_peak.py [--form NAME] [--macs G]

Times a loop of 12 independent accumulations with the widest form aotc's int8 kernels use on this host
(aotc.ir.dot.dot_forms: vpdpbusd on zmm with AVX-512 VNNI, on ymm with AVX-VNNI, vpmaddubsw then
vpmaddwd by ones, or vpmaddwd on 16-bit factors), on 1 thread and on every core at once (one loop per
core; ctypes lets go of the GIL while a loop runs), best of 7. It prints instructions and multiply-adds
per second, and with `--macs G` (a model's multiply-adds in billions) the least time those take at that
rate: QDQ ResNet-18 224 is 1.85 G with its stem padded to 4 channels, so its latency bound is 1.85 G
over the 1-thread figure.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import threading
import time

import llvmlite.binding as llvm

from aotc.ir.dot import DotForm, dot_forms
from aotc.target import cpu_class, host_target

CHAINS = 12  # independent accumulators: enough to cover the instruction's latency on every x86 core
ITERATIONS = 2_000_000


def loop_ir(form: DotForm) -> str:
    """LLVM IR of `run(n)`: n rounds of CHAINS independent accumulation steps of `form` (lanes x depth
    multiply-adds each), returning one lane of their sum. The factors are loaded from globals with
    volatile loads, and where the instruction does not take the accumulator (vpmaddwd, vpmaddubsw) one
    factor is the accumulator itself, so LLVM can neither fold, merge nor hoist the products."""
    acc = f"<{form.lanes} x i32>"
    pairs = f"<{2 * form.lanes} x i16>"  # what vpmaddwd reads (and vpmaddubsw writes)
    factor = form.operand_type if not form.halves else pairs
    lines = [f"@a = global {factor} zeroinitializer", f"@b = global {factor} zeroinitializer"]
    if form.name == "vnni":
        lines.append(f"declare {acc} @{form.intrinsic}({acc}, {factor}, {factor})")
        body = [f"  %n{{k}} = call {acc} @{form.intrinsic}({acc} %c{{k}}, {factor} %a, {factor} %b)"]
    elif form.pairs_by:  # vpmaddubsw: u8 x s8 into int16 pairs, then vpmaddwd by ones into int32
        ones = f"{pairs} <" + ", ".join(["i16 1"] * (2 * form.lanes)) + ">"
        lines += [
            f"declare {pairs} @{form.intrinsic}({factor}, {factor})",
            f"declare {acc} @{form.pairs_by}({pairs}, {pairs})",
        ]
        body = [
            f"  %x{{k}} = bitcast {acc} %c{{k}} to {factor}",
            f"  %p{{k}} = call {pairs} @{form.intrinsic}({factor} %x{{k}}, {factor} %b)",
            f"  %s{{k}} = call {acc} @{form.pairs_by}({pairs} %p{{k}}, {ones})",
            f"  %n{{k}} = add {acc} %c{{k}}, %s{{k}}",
        ]
    else:  # vpmaddwd on int16 pairs; the halves form runs it twice a step (even and odd bytes)
        lines.append(f"declare {acc} @{form.intrinsic}({pairs}, {pairs})")
        body = [
            f"  %x{{k}} = bitcast {acc} %c{{k}} to {pairs}",
            f"  %s{{k}} = call {acc} @{form.intrinsic}({pairs} %x{{k}}, {pairs} %b)",
        ]
        if form.halves:
            body += [
                f"  %h{{k}} = call {acc} @{form.intrinsic}({pairs} %x{{k}}, {pairs} %a)",
                f"  %s2{{k}} = add {acc} %s{{k}}, %h{{k}}",
                f"  %n{{k}} = add {acc} %c{{k}}, %s2{{k}}",
            ]
        else:
            body.append(f"  %n{{k}} = add {acc} %c{{k}}, %s{{k}}")
    lines += ["define i32 @run(i64 %n) {", "entry:"]
    lines += [f"  %a = load volatile {factor}, ptr @a", f"  %b = load volatile {factor}, ptr @b"]
    lines += ["  br label %loop", "loop:", "  %i = phi i64 [0, %entry], [%i1, %loop]"]
    lines += [f"  %c{k} = phi {acc} [zeroinitializer, %entry], [%n{k}, %loop]" for k in range(CHAINS)]
    lines += [line.format(k=k) for k in range(CHAINS) for line in body]
    lines += [
        "  %i1 = add i64 %i, 1",
        "  %more = icmp ult i64 %i1, %n",
        "  br i1 %more, label %loop, label %done",
    ]
    lines.append("done:")
    total = "%n0"
    for k in range(1, CHAINS):
        lines.append(f"  %t{k} = add {acc} {total}, %n{k}")
        total = f"%t{k}"
    lines += [f"  %r = extractelement {acc} {total}, i32 0", "  ret i32 %r", "}"]
    return "\n".join(lines)


def compiled_loop(ir: str):
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    machine = llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3
    )
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(ir), machine)
    engine.finalize_object()
    fn = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int64)(engine.get_function_address("run"))
    return engine, fn


def seconds_on(fn, threads: int) -> float:
    """Wall seconds of ITERATIONS rounds on each of `threads` threads at once, best of 7."""
    best = float("inf")
    for _ in range(7):
        workers = [threading.Thread(target=fn, args=(ITERATIONS,)) for _ in range(threads)]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--form", help="a dot-product form of this host by name (default: the widest)")
    ap.add_argument("--macs", type=float, help="a model's multiply-adds, in billions: print its time bound")
    args = ap.parse_args(argv)
    forms = dot_forms(host_target())
    if args.form:
        forms = tuple(f for f in forms if f.name == args.form)
    if not forms:
        print(f"no int8 dot-product form {args.form or ''} on this host ({cpu_class()})", file=sys.stderr)
        return 1
    form = forms[0]
    ir = loop_ir(form)
    engine, fn = compiled_loop(ir)
    fn(1000)  # warm up, and fault the code in
    products = form.lanes * form.depth  # multiply-adds one accumulation step does
    steps = CHAINS * ITERATIONS
    cores = len(os.sched_getaffinity(0))
    print(f"CPU: {cpu_class()}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"form {form.name} ({form.intrinsic}, {form.lanes} lanes x {form.depth})")
    rate1 = 0.0
    for threads in sorted({1, cores}):
        seconds = seconds_on(fn, threads)
        rate = steps * threads / seconds
        rate1 = rate1 or rate
        print(
            f"  {threads} thread{'s' if threads > 1 else ' '}: {rate / 1e9:6.2f} G steps/s, "
            f"{rate * products / 1e9:7.1f} G multiply-adds/s ({rate * products * 2 / 1e9:7.1f} GOP/s)"
        )
    if args.macs:
        bound = args.macs * 1e9 / (rate1 * products)
        print(f"  {args.macs:g} G multiply-adds take at least {bound * 1e3:.2f} ms on 1 thread at that rate")
    del engine
    return 0


if __name__ == "__main__":
    sys.exit(main())
