"""The `aotc` command: argument parsing and exit codes; each subcommand calls one function elsewhere.

Exit codes: 0 ok, 1 build or runtime error, 2 usage or recipe error, 3 validation mismatch.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path

OK, BUILD_ERROR, USAGE_ERROR, MISMATCH = 0, 1, 2, 3
MAX_THREADS = 4096  # a sanity bound; the runtime bounds the team to the cores it may use
MAX_REPEAT = 100_000
MAX_SEED = 2**32 - 1


# ----------------------------------------------------------------------------- argument types
# Numbers are checked as argparse parses them, like recipe fields: a bad value is a usage error
# (exit 2) before any work, never a failure after hours of tuning.


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected an integer from {low} to {high}, got {value}")
        return value

    return parse


def finite_float(low: float, high: float = math.inf) -> Callable[[str], float]:
    """An argparse type: a finite number in [low, high]."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not (math.isfinite(value) and low <= value <= high):
            raise argparse.ArgumentTypeError(
                f"expected a finite number from {low:g} to {high:g}, got {text!r}"
            )
        return value

    return parse


def deadline_seconds(text: str) -> float:
    """An argparse type: a tuning deadline (`90s`, `30m`, `1h30m`), positive, finite and bounded."""
    from aotc.recipe import duration_problem, parse_duration

    seconds = parse_duration(text)
    problem = duration_problem(seconds)
    if problem:
        raise argparse.ArgumentTypeError(f"{text!r}: {problem}")
    return seconds


def memory_size(text: str) -> int:
    """An argparse type: a size in bytes (`64GB`, `512GiB`, a number of bytes)."""
    from aotc.recipe import MAX_MEMORY_LIMIT, parse_size

    size = parse_size(text)
    if size is None or not 0 < size <= MAX_MEMORY_LIMIT:
        raise argparse.ArgumentTypeError(f"expected a positive size like 64GB or 512GiB, got {text!r}")
    return size


def add_trust_arguments(p: argparse.ArgumentParser) -> None:
    """`--trusted-key` and `--require-signature` for commands that load a package or bundle."""
    p.add_argument(
        "--trusted-key",
        action="append",
        type=Path,
        metavar="PUB",
        help="public key (PEM, or a directory of *.pub) whose signatures are trusted; repeatable "
        "(default: $AOTC_TRUSTED_KEYS). A signature by another key is then refused",
    )
    p.add_argument(
        "--require-signature",
        action="store_true",
        default=None,
        help="refuse unsigned or untrusted input (default: $AOTC_REQUIRE_SIGNATURE)",
    )


def load_package(args: argparse.Namespace):
    """`aotc_runtime.load` of `args.package` under the command's signature policy."""
    import aotc_runtime

    return aotc_runtime.load(
        str(args.package), trusted_keys=args.trusted_key, require_signature=args.require_signature
    )


def _parser() -> argparse.ArgumentParser:
    from aotc.recipe import MAX_TRIALS

    ap = argparse.ArgumentParser(
        prog="aotc", description="Ahead-of-time compiler for trained neural networks."
    )
    sub = ap.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="compile the model of a recipe into a package")
    b.add_argument("recipe", type=Path)
    b.add_argument("--print-config", action="store_true", help="print the resolved recipe and exit")
    b.add_argument(
        "--trials",
        type=bounded_int(0, MAX_TRIALS),
        metavar="N",
        help="total tuning trials (overrides tuning.trials)",
    )
    b.add_argument(
        "--deadline",
        type=deadline_seconds,
        metavar="DURATION",
        help="tuning wall-clock limit, e.g. 90s, 30m, 1h30m (overrides tuning.deadline)",
    )
    b.add_argument(
        "--memory-limit",
        type=memory_size,
        metavar="SIZE",
        help="most memory a run of the model may need, e.g. 256GB (overrides memory_limit; "
        "default: this machine's physical memory)",
    )
    b.add_argument(
        "--sign",
        type=Path,
        metavar="KEY",
        help="sign the package with this Ed25519 private key (PEM; see `aotc keygen`)",
    )
    b.add_argument(
        "--resume",
        action="store_true",
        help="continue tuning from the build's records: their trials count toward the budget, nothing is re-measured",
    )
    b.add_argument(
        "--explain-cache",
        action="store_true",
        help="print, per task, whether a tuned record was found and why not, and what records of other "
        "CPUs (transferred) measured here",
    )

    r = sub.add_parser("run", help="run a package on inputs from .npy files")
    r.add_argument("package", type=Path)
    r.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy")
    r.add_argument("--output", type=Path, help="directory to write each output as NAME.npy")
    r.add_argument("--threads", type=bounded_int(1, MAX_THREADS))
    add_trust_arguments(r)

    t = sub.add_parser("tune-op", help="tune one named operator and print its best GFLOP/s")
    t.add_argument("op", help="matmul, dense, conv2d, conv2d_relu, depthwise, softmax")
    t.add_argument("--shape", help="comma-separated shape parameters (see the operator's defaults)")
    t.add_argument("--trials", type=bounded_int(1, MAX_TRIALS), default=200)
    t.add_argument("--records", type=Path, help="JSON-lines record log to append to (and resume from)")
    t.add_argument("--target", default="llvm -mcpu=native")
    t.add_argument("--seed", type=bounded_int(0, MAX_SEED), default=0)

    pr = sub.add_parser(
        "profile",
        help="time every kernel call of a package where it runs in the model (seeded random inputs)",
    )
    pr.add_argument("package", type=Path)
    pr.add_argument("--threads", type=bounded_int(1, MAX_THREADS))
    pr.add_argument(
        "--repeat",
        type=bounded_int(1, MAX_REPEAT),
        default=20,
        help="profiled runs of the whole plan (default 20)",
    )
    pr.add_argument(
        "--alone",
        action="store_true",
        help="also time each call back to back (warm, as tuned) and show what the sequence costs it",
    )
    pr.add_argument("--seed", type=bounded_int(0, MAX_SEED), default=0)
    add_trust_arguments(pr)

    i = sub.add_parser(
        "inspect", help="describe a package: inputs, outputs, kernels, sizes, digest, signature, provenance"
    )
    i.add_argument("package", type=Path)
    i.add_argument(
        "--trusted-key",
        action="append",
        type=Path,
        metavar="PUB",
        help="public key (PEM, or a directory of *.pub) to check the signature against; repeatable "
        "(default: $AOTC_TRUSTED_KEYS)",
    )

    k = sub.add_parser("keygen", help="make an Ed25519 key pair for signing packages and bundles")
    k.add_argument(
        "key", type=Path, help="private key file to create (PEM, mode 0600); KEY.pub gets the public key"
    )

    v = sub.add_parser(
        "validate", help="compare a package with onnxruntime (or LiteRT for .tflite) on seeded random inputs"
    )
    v.add_argument("package", type=Path)
    v.add_argument("--model", type=Path, required=True)
    v.add_argument("--seed", type=bounded_int(0, MAX_SEED), default=0)
    v.add_argument("--rtol", type=finite_float(0.0), default=None)
    v.add_argument("--atol", type=finite_float(0.0), default=None)
    add_trust_arguments(v)

    from aotc.benchmark import add_benchmark_parser
    from aotc.hub.cli import add_hub_parser

    add_benchmark_parser(sub)
    add_hub_parser(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        commands = {
            "build": cmd_build,
            "run": cmd_run,
            "inspect": cmd_inspect,
            "profile": cmd_profile,
            "validate": cmd_validate,
            "tune-op": cmd_tune_op,
            "keygen": cmd_keygen,
            "hub": cmd_hub,
            "benchmark": cmd_benchmark,
        }
        return commands[args.command](args)
    except KeyboardInterrupt:
        print("aotc: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - every failure becomes one clear line and an exit code
        code = _exit_code(err)
        print(f"aotc: error: {err}", file=sys.stderr)
        return code


def _exit_code(err: Exception) -> int:
    from aotc.recipe import RecipeError
    from aotc.signing import SigningError
    from aotc.validate import ValidationError

    if isinstance(err, ValidationError):
        return MISMATCH
    if isinstance(err, (RecipeError, SigningError)) or type(err).__name__ in (
        "DynamicShapeError",
        "InputShapeError",
    ):
        return USAGE_ERROR
    if isinstance(err, (FileNotFoundError, KeyError)) or type(err) is ValueError:
        return USAGE_ERROR
    return BUILD_ERROR


def cmd_build(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from aotc.api import compile, with_overrides
    from aotc.recipe import Recipe, format_recipe
    from aotc.validate import format_report_row

    recipe = with_overrides(Recipe.from_yaml(args.recipe), trials=args.trials, deadline=args.deadline)
    if args.memory_limit is not None:
        recipe = replace(recipe, memory_limit=args.memory_limit)
    if args.print_config:
        print(format_recipe(recipe))
        return OK
    package = compile(recipe, resume=args.resume, explain_cache=args.explain_cache, sign_key=args.sign)
    result = package.result
    if result.validation is not None:
        print("validation against the reference:")
        for row in result.validation:
            print(format_report_row(row))
    print(f"wrote {result.package} in {result.seconds:.1f} s (report: {result.report})")
    return OK


def cmd_run(args: argparse.Namespace) -> int:
    import numpy as np

    from aotc.files import atomic_file

    model = load_package(args)
    if args.threads is not None:
        model.num_threads = args.threads
    inputs = {}
    for item in args.input:
        name, sep, path = item.partition("=")
        if not sep:
            raise ValueError(f"--input {item!r}: expected NAME=FILE.npy")
        inputs[name] = np.load(path, allow_pickle=False)
    outputs = model.run(inputs)
    files = output_files(list(outputs)) if args.output else {}
    if args.output:
        args.output.mkdir(parents=True, exist_ok=True)
    for name, value in outputs.items():
        print(f"{name}: {value.dtype}{list(value.shape)}  min {value.min():.6g}  max {value.max():.6g}")
        if args.output:
            file = files[name]
            if file != f"{name}.npy":
                print(f"  output {name!r} written as {file} (a file name inside {args.output})")
            with atomic_file(args.output / file) as f:  # replaces a planted symlink, never follows it
                np.save(f, value)
    return OK


def output_files(names: list[str]) -> dict[str, str]:
    """A file name inside the output directory per output name: `NAME.npy` where the name is a plain
    file name, else the name with every character other than letters, digits, `_`, `-` and `.` (and
    leading dots) replaced by `_`, numbered where two collide. Plain names are placed first, so an
    output really named `a_b` is always `a_b.npy`, never another's renamed file. A package's output
    names are data from its author: `../x` or `/etc/x` must not write outside the directory."""

    def stem(name: str) -> str:
        clean = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:200]
        return "_" + clean.lstrip(".") if clean.startswith(".") or not clean else clean

    out: dict[str, str] = {}
    taken: set[str] = set()
    plain = [n for n in names if stem(n) == n]
    for name in plain + [n for n in names if n not in plain]:
        base = stem(name)
        file, n = f"{base}.npy", 1
        while file.lower() in taken:
            n += 1
            file = f"{base}_{n}.npy"
        taken.add(file.lower())
        out[name] = file
    return {name: out[name] for name in names}


def cmd_tune_op(args: argparse.Namespace) -> int:
    from aotc.api import tune
    from aotc.search.measure import MeasureOptions
    from aotc.search.model_tuning import TuningOptions
    from aotc.search.params import SearchParams
    from aotc.search.task import SearchTask
    from aotc.target import parse_target
    from aotc.topi.workloads import make_workload

    shape = None if args.shape is None else [int(v) for v in args.shape.split(",") if v.strip()]
    target = parse_target(args.target)
    task = SearchTask(make_workload(args.op, shape), target, args.op)
    options = TuningOptions(
        trials=args.trials,
        records=args.records,
        measure=MeasureOptions(),
        search=SearchParams(seed=args.seed),
    )
    result = tune(task, target, options)
    if result.best_state is None:
        print(f"{task.name}: no valid candidate in {result.trials} trials")
        return BUILD_ERROR
    split = ", ".join(f"{k} {v:.1f} s" for k, v in result.seconds.items())
    print(
        f"{task.name}: best {result.gflops(task.dag.flop_count):.2f} GFLOP/s ({result.best_cost * 1e3:.4f} ms) in {result.trials} trials"
    )
    print(f"time: {split}")
    return OK


def cmd_inspect(args: argparse.Namespace) -> int:
    from aotc.package import describe_package

    print(describe_package(str(args.package), trusted_keys=args.trusted_key))
    return OK


def cmd_keygen(args: argparse.Namespace) -> int:
    from aotc.signing import generate_keypair

    private, public, kid = generate_keypair(args.key)
    print(
        f"key {kid}: private {private} (keep it secret), public {public} (give it to those who load your packages)"
    )
    return OK


def cmd_profile(args: argparse.Namespace) -> int:
    from aotc.report import format_profile

    if args.repeat < 1:
        raise ValueError(f"--repeat must be >= 1, got {args.repeat}")
    model = load_package(args)
    if args.threads:
        model.num_threads = args.threads
    calls = model.profile(repeat=args.repeat, seed=args.seed, alone=args.alone)
    whole = model.benchmark(seed=args.seed)["median_ms"]
    print(format_profile(calls, whole, model.num_threads))
    return OK


def cmd_validate(args: argparse.Namespace) -> int:
    from aotc.validate import ATOL, RTOL, format_report_row, validate_package

    model = load_package(args)
    shapes = {t.name: (tuple(t.shape), t.dtype) for t in model.inputs}
    report = validate_package(
        args.package,
        args.model,
        shapes,
        seed=args.seed,
        rtol=RTOL if args.rtol is None else args.rtol,
        atol=ATOL if args.atol is None else args.atol,
        compiled=model,
    )
    for row in report:
        print(format_report_row(row))
    return OK


def cmd_benchmark(args: argparse.Namespace) -> int:
    from aotc.benchmark import cmd_benchmark as run_benchmark

    return run_benchmark(args)


def cmd_hub(args: argparse.Namespace) -> int:
    from aotc.hub.cli import cmd_hub as run_hub

    return run_hub(args)


if __name__ == "__main__":
    sys.exit(main())
