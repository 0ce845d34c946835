"""The `aotc` command: argument parsing and exit codes; each subcommand calls one function elsewhere.

Exit codes: 0 ok, 1 build or runtime error, 2 usage or recipe error, 3 validation mismatch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

OK, BUILD_ERROR, USAGE_ERROR, MISMATCH = 0, 1, 2, 3


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="aotc", description="Ahead-of-time compiler for trained neural networks."
    )
    sub = ap.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="compile the model of a recipe into a package")
    b.add_argument("recipe", type=Path)
    b.add_argument("--print-config", action="store_true", help="print the resolved recipe and exit")
    b.add_argument("--trials", type=int, metavar="N", help="total tuning trials (overrides tuning.trials)")
    b.add_argument(
        "--deadline",
        metavar="DURATION",
        help="tuning wall-clock limit, e.g. 90s, 30m, 1h30m (overrides tuning.deadline)",
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
    r.add_argument("--threads", type=int)

    t = sub.add_parser("tune-op", help="tune one named operator and print its best GFLOP/s")
    t.add_argument("op", help="matmul, dense, conv2d, conv2d_relu, depthwise, softmax")
    t.add_argument("--shape", help="comma-separated shape parameters (see the operator's defaults)")
    t.add_argument("--trials", type=int, default=200)
    t.add_argument("--records", type=Path, help="JSON-lines record log to append to (and resume from)")
    t.add_argument("--target", default="llvm -mcpu=native")
    t.add_argument("--seed", type=int, default=0)

    pr = sub.add_parser(
        "profile",
        help="time every kernel call of a package where it runs in the model (seeded random inputs)",
    )
    pr.add_argument("package", type=Path)
    pr.add_argument("--threads", type=int)
    pr.add_argument("--repeat", type=int, default=20, help="profiled runs of the whole plan (default 20)")
    pr.add_argument(
        "--alone",
        action="store_true",
        help="also time each call back to back (warm, as tuned) and show what the sequence costs it",
    )
    pr.add_argument("--seed", type=int, default=0)

    i = sub.add_parser("inspect", help="describe a package: inputs, outputs, kernels, sizes, provenance")
    i.add_argument("package", type=Path)

    v = sub.add_parser(
        "validate", help="compare a package with onnxruntime (or LiteRT for .tflite) on seeded random inputs"
    )
    v.add_argument("package", type=Path)
    v.add_argument("--model", type=Path, required=True)
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--rtol", type=float, default=None)
    v.add_argument("--atol", type=float, default=None)

    from aotc.hub.cli import add_hub_parser

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
            "hub": cmd_hub,
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
    from aotc.validate import ValidationError

    if isinstance(err, ValidationError):
        return MISMATCH
    if isinstance(err, RecipeError) or type(err).__name__ in ("DynamicShapeError", "InputShapeError"):
        return USAGE_ERROR
    if isinstance(err, (FileNotFoundError, KeyError)) or type(err) is ValueError:
        return USAGE_ERROR
    return BUILD_ERROR


def cmd_build(args: argparse.Namespace) -> int:
    from aotc.build import build
    from aotc.recipe import format_recipe, load_recipe
    from aotc.validate import format_report_row

    recipe = with_overrides(load_recipe(args.recipe), args.trials, args.deadline)
    if args.print_config:
        print(format_recipe(recipe))
        return OK
    result = build(recipe, resume=args.resume, explain_cache=args.explain_cache)
    if result.validation is not None:
        print("validation against the reference:")
        for row in result.validation:
            print(format_report_row(row))
    print(f"wrote {result.package} in {result.seconds:.1f} s (report: {result.report})")
    return OK


def with_overrides(recipe, trials: int | None, deadline: str | None):
    """The recipe with `--trials` / `--deadline` in place of its tuning values."""
    from dataclasses import replace

    from aotc.recipe import parse_duration

    tuning = recipe.tuning
    if trials is not None:
        if trials < 0:
            raise ValueError(f"--trials {trials}: expected an integer >= 0 (0 = no tuning)")
        tuning = replace(tuning, trials=trials)
    if deadline is not None:
        seconds = parse_duration(deadline)
        if seconds is None or not seconds > 0:
            raise ValueError(f"--deadline {deadline!r}: expected a positive duration like 90s, 30m, 1h30m")
        tuning = replace(tuning, deadline_seconds=seconds)
    return replace(recipe, tuning=tuning)


def cmd_run(args: argparse.Namespace) -> int:
    import aotc_runtime
    import numpy as np

    model = aotc_runtime.load(str(args.package))
    if args.threads:
        model.num_threads = args.threads
    inputs = {}
    for item in args.input:
        name, sep, path = item.partition("=")
        if not sep:
            raise ValueError(f"--input {item!r}: expected NAME=FILE.npy")
        inputs[name] = np.load(path, allow_pickle=False)
    outputs = model.run(inputs)
    if args.output:
        args.output.mkdir(parents=True, exist_ok=True)
    for name, value in outputs.items():
        print(f"{name}: {value.dtype}{list(value.shape)}  min {value.min():.6g}  max {value.max():.6g}")
        if args.output:
            np.save(args.output / f"{name}.npy", value)
    return OK


def cmd_tune_op(args: argparse.Namespace) -> int:
    from aotc.search.task import tune_workload
    from aotc.target import parse_target

    shape = None if args.shape is None else [int(v) for v in args.shape.split(",") if v.strip()]
    task, result = tune_workload(
        args.op, shape, parse_target(args.target), args.trials, args.records, args.seed
    )
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

    print(describe_package(str(args.package)))
    return OK


def cmd_profile(args: argparse.Namespace) -> int:
    import aotc_runtime

    from aotc.report import format_profile

    if args.repeat < 1:
        raise ValueError(f"--repeat must be >= 1, got {args.repeat}")
    model = aotc_runtime.load(str(args.package))
    if args.threads:
        model.num_threads = args.threads
    calls = model.profile(repeat=args.repeat, seed=args.seed, alone=args.alone)
    whole = model.benchmark(seed=args.seed)["median_ms"]
    print(format_profile(calls, whole, model.num_threads))
    return OK


def cmd_validate(args: argparse.Namespace) -> int:
    import aotc_runtime

    from aotc.validate import ATOL, RTOL, format_report_row, validate_package

    model = aotc_runtime.load(str(args.package))
    shapes = {t.name: (tuple(t.shape), t.dtype) for t in model.inputs}
    report = validate_package(
        args.package,
        args.model,
        shapes,
        seed=args.seed,
        rtol=RTOL if args.rtol is None else args.rtol,
        atol=ATOL if args.atol is None else args.atol,
    )
    for row in report:
        print(format_report_row(row))
    return OK


def cmd_hub(args: argparse.Namespace) -> int:
    from aotc.hub.cli import cmd_hub as run_hub

    return run_hub(args)


if __name__ == "__main__":
    sys.exit(main())
