"""The `aotc` command: argument parsing and exit codes; each subcommand calls one function elsewhere.

Exit codes: 0 ok, 1 build or runtime error, 2 usage or recipe error, 3 validation mismatch, 130
interrupted (Ctrl-C; a build interrupted while tuning still writes its package first).
Results go to stdout (`--json` makes them one JSON document); messages and progress to stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

from aotc.frontend.options import DEFAULT_REQUANTIZE, REQUANTIZE_CHOICES

OK, BUILD_ERROR, USAGE_ERROR, MISMATCH, INTERRUPTED = 0, 1, 2, 3, 130
RECIPE_SUFFIXES = (".yaml", ".yml")
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


def input_spec(text: str) -> tuple[str, tuple[int, ...], str | None]:
    """An argparse type: `NAME=SHAPE[:DTYPE]`, e.g. `input=1,3,224,224:float32` or `x=[4,64]`."""
    name, sep, rest = text.partition("=")
    shape_text, _, dtype = rest.partition(":")
    try:
        shape = tuple(int(v) for v in shape_text.strip("[]() ").split(",") if v.strip())
    except ValueError:
        shape = ()
    if not sep or not name or not shape or any(d <= 0 for d in shape):
        raise argparse.ArgumentTypeError(
            f"expected NAME=SHAPE[:DTYPE] with positive dimensions, e.g. input=1,3,224,224:float32, got {text!r}"
        )
    return name, shape, dtype or None


def constant_entry(text: str) -> tuple[str, object]:
    """An argparse type: `NAME=VALUE`, VALUE a number, a YAML list of numbers (`axes=[1]`, `[[0, 1]]`) or
    a .npy file: the recipe's `constants` entry for graph input NAME."""
    import yaml

    name, sep, rest = text.partition("=")
    try:
        value = yaml.safe_load(rest) if rest.strip() else None
    except yaml.YAMLError:
        value = None
    if isinstance(value, str) and value.lower().endswith(".npy"):
        return name, value
    if not sep or not name or not _numbers(value):
        raise argparse.ArgumentTypeError(
            f"expected NAME=VALUE with a number, a list of numbers or a .npy file, e.g. axes=[1], got {text!r}"
        )
    return name, value


def _numbers(value: object) -> bool:
    if isinstance(value, list):
        return all(_numbers(v) for v in value)
    return isinstance(value, (int, float, bool))


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default in its help, except where there is none to show (None, off)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False, [], argparse.SUPPRESS) or "default" in (action.help or ""):
            return action.help or ""
        return super()._get_help_string(action)


def add_verbosity_arguments(p: argparse.ArgumentParser, suppress: bool = True) -> None:
    """`-v/--verbose` and `-q/--quiet` (before or after the subcommand)."""
    default = argparse.SUPPRESS if suppress else 0
    p.add_argument(
        "-v", "--verbose", action="count", default=default, help="more messages (debug); repeatable"
    )
    p.add_argument(
        "-q",
        "--quiet",
        action="store_const",
        const=-1,
        dest="verbose",
        default=default,
        help="warnings and errors only; no progress display",
    )


def add_json_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the result as one JSON document")


def print_json(data) -> None:
    print(json.dumps(data, indent=1, default=str, allow_nan=False))


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


def add_emulate_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--emulate",
        action="store_true",
        help="run the package under qemu, in its CPU architecture's own Python (an aarch64 package on "
        "an x86 host; the first use makes that Python with mmdebstrap, about 110 MB)",
    )


def load_package(args: argparse.Namespace):
    """`aotc_runtime.load` of `args.package` under the command's signature policy; with `--emulate`, the
    package run under qemu by its own architecture's runtime."""
    import aotc_runtime

    if getattr(args, "emulate", False):
        from aotc.emulator import EmulatedModel
        from aotc.target import parse_target

        target = parse_target(aotc_runtime.read_manifest(str(args.package))["target"])
        return EmulatedModel(
            args.package, target, trusted_keys=args.trusted_key, require_signature=args.require_signature
        )
    return aotc_runtime.load(
        str(args.package), trusted_keys=args.trusted_key, require_signature=args.require_signature
    )


def build_parser() -> argparse.ArgumentParser:
    """The `aotc` command's argument parser, every subcommand included."""
    from aotc import __version__
    from aotc.recipe import DEFAULT_TARGET, MAX_TRIALS

    ap = argparse.ArgumentParser(
        prog="aotc",
        description="Ahead-of-time compiler for trained neural networks.",
        formatter_class=HelpFormatter,
        epilog="Exit codes: 0 ok, 1 build or runtime error, 2 usage or recipe error, 3 validation "
        "mismatch, 130 interrupted.",
    )
    ap.add_argument("--version", action="version", version=f"aotc {__version__}")
    add_verbosity_arguments(ap, suppress=False)
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, **kwargs) -> argparse.ArgumentParser:
        p = sub.add_parser(name, formatter_class=HelpFormatter, **kwargs)
        add_verbosity_arguments(p)
        return p

    b = command(
        "build",
        help="compile a model (.onnx, .tflite) or the model of a recipe (.yaml) into a package",
        description="aotc build model.onnx [-o model.aotc] [--target ...] compiles a model file as it is; "
        "aotc build recipe.yaml compiles what the recipe says. The options below override either.",
    )
    b.add_argument(
        "source", type=Path, metavar="MODEL|RECIPE", help="a .onnx/.tflite model or a .yaml recipe"
    )
    b.add_argument(
        "--target",
        help=f"target string, e.g. 'llvm -mcpu=znver4' (default: the recipe's, else {DEFAULT_TARGET!r})",
    )
    b.add_argument(
        "-o",
        "--output",
        type=Path,
        metavar="FILE",
        help="package file to write (default: the recipe's output; for a model, MODEL_STEM.aotc here)",
    )
    b.add_argument(
        "--input",
        type=input_spec,
        action="append",
        metavar="NAME=SHAPE[:DTYPE]",
        help="fix an input's shape (and dtype), e.g. input=1,3,224,224:float32; repeatable",
    )
    b.add_argument(
        "--constant",
        type=constant_entry,
        action="append",
        metavar="NAME=VALUE",
        help="fix an ONNX graph input's value at build time (the recipe's constants), e.g. axes=[1] or "
        "shape=shape.npy; repeatable",
    )
    b.add_argument("--print-config", action="store_true", help="print the resolved recipe and exit")
    b.add_argument(
        "--trials",
        type=bounded_int(0, MAX_TRIALS),
        metavar="N",
        help="total tuning trials (overrides tuning.trials; 0: no tuning, a deadline then unused)",
    )
    b.add_argument(
        "--deadline",
        type=deadline_seconds,
        metavar="DURATION",
        help="tune until this wall-clock limit, e.g. 90s, 30m, 1h30m (overrides tuning.deadline; without "
        "--trials it also lifts a recipe's trials: 0)",
    )
    b.add_argument(
        "--cluster",
        metavar="HOST:PORT",
        default=os.environ.get("AOTC_CLUSTER") or None,
        help="measure candidates on the devices of this Ray cluster (overrides tuning.cluster; default: "
        "$AOTC_CLUSTER; docs/cluster.md)",
    )
    b.add_argument(
        "--no-validate",
        dest="validate",
        action="store_false",
        default=None,
        help="do not compare the package with onnxruntime / LiteRT before writing it (overrides validate)",
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
        "CPUs (transferred) measured here; after tuning, which record each task took",
    )

    r = command("run", help="run a package on inputs from .npy files")
    r.add_argument("package", type=Path, help="the .aotc package")
    r.add_argument(
        "--input", action="append", default=[], metavar="NAME=FILE.npy", help="an input's array; repeatable"
    )
    r.add_argument("--output", type=Path, metavar="DIR", help="directory to write each output as NAME.npy")
    r.add_argument(
        "--threads",
        type=bounded_int(1, MAX_THREADS),
        help="threads (default: the cores this process may use)",
    )
    add_emulate_argument(r)
    add_trust_arguments(r)

    t = command("tune-op", help="tune one named operator and print its best GFLOP/s")
    t.add_argument("op", help="matmul, dense, conv2d, conv2d_relu, depthwise, softmax")
    t.add_argument("--shape", help="comma-separated shape parameters (default: the operator's default shape)")
    t.add_argument("--trials", type=bounded_int(1, MAX_TRIALS), default=200, help="measurements to spend")
    t.add_argument("--records", type=Path, help="JSON-lines record log to append to (and resume from)")
    t.add_argument("--target", default="llvm -mcpu=native", help="target string")
    t.add_argument("--seed", type=bounded_int(0, MAX_SEED), default=0, help="search seed")

    pr = command(
        "profile",
        help="time every kernel call of a package where it runs in the model (seeded random inputs)",
    )
    pr.add_argument("package", type=Path, help="the .aotc package")
    pr.add_argument(
        "--threads",
        type=bounded_int(1, MAX_THREADS),
        help="threads (default: the cores this process may use)",
    )
    pr.add_argument(
        "--repeat", type=bounded_int(1, MAX_REPEAT), default=20, help="profiled runs of the whole plan"
    )
    pr.add_argument(
        "--alone",
        action="store_true",
        help="also time each call back to back (warm, as tuned) and show what the sequence costs it",
    )
    pr.add_argument("--seed", type=bounded_int(0, MAX_SEED), default=0, help="seed of the random inputs")
    add_json_argument(pr)
    add_trust_arguments(pr)

    i = command(
        "inspect", help="describe a package: inputs, outputs, kernels, sizes, digest, signature, provenance"
    )
    i.add_argument("package", type=Path, help="the .aotc package")
    i.add_argument(
        "--load",
        action="store_true",
        help="also load it (in fresh processes, running its code) and report load time and peak memory",
    )
    i.add_argument(
        "--trusted-key",
        action="append",
        type=Path,
        metavar="PUB",
        help="public key (PEM, or a directory of *.pub) to check the signature against; repeatable "
        "(default: $AOTC_TRUSTED_KEYS)",
    )
    add_json_argument(i)

    k = command("keygen", help="make an Ed25519 key pair for signing packages and bundles")
    k.add_argument(
        "key", type=Path, help="private key file to create (PEM, mode 0600); KEY.pub gets the public key"
    )

    v = command(
        "validate", help="compare a package with onnxruntime (or LiteRT for .tflite) on seeded random inputs"
    )
    v.add_argument("package", type=Path, help="the .aotc package")
    v.add_argument("--model", type=Path, required=True, help="the model it was built from (.onnx, .tflite)")
    v.add_argument("--seed", type=bounded_int(0, MAX_SEED), default=0, help="seed of the random inputs")
    v.add_argument(
        "--constant",
        type=constant_entry,
        action="append",
        metavar="NAME=VALUE",
        help="a graph input the package was built with a value for (the build's constants); repeatable",
    )
    v.add_argument(
        "--requantize",
        choices=REQUANTIZE_CHOICES,
        default=DEFAULT_REQUANTIZE,
        help="the build's requantize setting: a .tflite model's reference is LiteRT with XNNPACK (float) "
        "or with TFLite's builtin kernels (fixed_point) (default: %(default)s)",
    )
    v.add_argument(
        "--rtol", type=finite_float(0.0), default=None, help="relative tolerance (default: 1e-4, see README)"
    )
    v.add_argument(
        "--atol", type=finite_float(0.0), default=None, help="absolute tolerance (default: 1e-5, see README)"
    )
    add_emulate_argument(v)
    add_trust_arguments(v)

    from aotc.benchmark import add_benchmark_parser
    from aotc.cluster import add_worker_parser
    from aotc.hub.cli import add_hub_parser

    add_benchmark_parser(sub)
    add_hub_parser(sub)
    add_worker_parser(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run one `aotc` command; returns its exit code. Output to a reader that went away (`aotc hub ls |
    head`) ends the command quietly with 0: what it did not read is not wanted."""
    try:
        try:
            code = run_command(argv)
        except SystemExit:  # argparse's --help, --version and usage errors print, then exit
            sys.stdout.flush()
            raise
        sys.stdout.flush()  # here, not at interpreter exit, where a broken pipe could not be handled
        return code
    except BrokenPipeError:
        quiet_stdout()
        return OK


def run_command(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    from aotc.progress import configure_logging

    configure_logging(args.verbose)
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
            "worker": cmd_worker,
            "benchmark": cmd_benchmark,
        }
        return commands[args.command](args)
    except BrokenPipeError:
        raise  # handled by main
    except KeyboardInterrupt:
        print("aotc: interrupted", file=sys.stderr)
        return INTERRUPTED
    except Exception as err:  # noqa: BLE001 - every failure becomes one clear line and an exit code
        code = _exit_code(err)
        print(f"aotc: error: {err}", file=sys.stderr)
        return code


def quiet_stdout() -> None:
    """Point file descriptor 1 at /dev/null after a broken pipe, so that flushing stdout's buffer at
    exit does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # not a real file (a test's capture): nothing to flush
        pass


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
    from contextlib import nullcontext

    from aotc.api import compile
    from aotc.progress import LiveTuning, terminal
    from aotc.recipe import format_recipe
    from aotc.validate import format_report_row

    recipe = build_recipe(args)
    if args.print_config:
        print(format_recipe(recipe))
        return OK
    # on a terminal, one display redrawn in place; elsewhere (a log file, CI) one line per round
    display = LiveTuning() if terminal() and args.verbose >= 0 else None
    with display or nullcontext():
        package = compile(
            recipe,
            resume=args.resume,
            explain_cache=args.explain_cache,
            sign_key=args.sign,
            callbacks=[display] if display else (),
            log=None,
        )
    result = package.result
    if result.validation is not None:
        print("validation against the reference:")
        for row in result.validation:
            print(format_report_row(row))
    print(f"wrote {result.package} in {result.seconds:.1f} s (report: {result.report})")
    if result.tuning is not None and result.tuning.stop_reason == "interrupted":
        print(
            "aotc: interrupted: tuning stopped early; the package holds the best schedules so far",
            file=sys.stderr,
        )
        return INTERRUPTED
    return OK


def build_recipe(args: argparse.Namespace):
    """The recipe `aotc build` compiles: the recipe file's, or one made for a model file, with the
    command line's options applied."""
    from dataclasses import replace

    from aotc.api import with_overrides
    from aotc.recipe import MODEL_SUFFIXES, InputSpec, Recipe
    from aotc.search.model_tuning import TuningOptions

    source: Path = args.source
    suffix = source.suffix.lower()
    inputs = {name: InputSpec(shape, dtype) for name, shape, dtype in args.input or []}
    if suffix in RECIPE_SUFFIXES:
        recipe = Recipe.from_yaml(source)
        if inputs:
            recipe = replace(recipe, inputs={**recipe.inputs, **inputs})
    elif suffix in MODEL_SUFFIXES:
        if not source.is_file():
            raise FileNotFoundError(f"model file not found: {source}")
        output = Path.cwd() / f"{source.stem}.aotc"
        recipe = Recipe(model=source, inputs=inputs, output=output, tuning=TuningOptions())
    else:
        raise ValueError(  # a usage error (exit 2)
            f"{source}: expected a model (.onnx, .tflite) or a recipe (.yaml, .yml), got "
            f"{suffix or 'a file without a suffix'!r}"
        )
    changes = {
        key: value
        for key, value in (("target", args.target), ("output", args.output), ("validate", args.validate))
        if value is not None
    }
    if args.constant:
        # a relative .npy path on the command line is relative to the working directory, not the recipe
        given = {name: Path(v).resolve() if isinstance(v, str) else v for name, v in args.constant}
        changes["constants"] = {**recipe.constants, **given}
    if args.memory_limit is not None:
        changes["memory_limit"] = args.memory_limit
    if changes:
        recipe = replace(recipe, **changes)
    trials = args.trials
    if args.deadline is not None and trials is None and recipe.tuning.trials == 0:
        # a deadline asked for on the command line is a request to tune: it lifts the recipe's off switch
        logging.getLogger("aotc.build").info(
            "--deadline given: tuning until the deadline (the recipe's trials: 0 is lifted)"
        )
        recipe = replace(recipe, tuning=recipe.tuning.replace(trials=None))
    if args.cluster is not None:
        recipe = replace(recipe, tuning=recipe.tuning.replace(cluster=args.cluster))
    return with_overrides(recipe, trials=trials, deadline=args.deadline)


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
        print(
            f"{printable(name)}: {value.dtype}{list(value.shape)}  min {value.min():.6g}  max {value.max():.6g}"
        )
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

    summary = package_summary(args.package, args.trusted_key)
    footprint = None
    if args.load:
        from aotc.footprint import measure_footprint

        footprint = measure_footprint(args.package, "aotc")
        summary["footprint"] = footprint.to_dict()
    if args.json:
        print_json(summary)
    else:
        print(printable(describe_package(str(args.package), trusted_keys=args.trusted_key)))
        if footprint is not None:
            print(
                f"load          {footprint.load_s * 1e3:.0f} ms; resident memory +{footprint.rss_load / 2**20:.0f} "
                f"MiB after loading, +{footprint.rss_run / 2**20:.0f} MiB after a first run "
                "(medians of 3 fresh processes)"
            )
    # described in full, but a package that loading refuses is not "ok" for a script checking the exit code
    invalid = summary["signature"] is not None and summary["signature"]["state"] == "invalid"
    return BUILD_ERROR if invalid else OK


def printable(text: str) -> str:
    """`text` with every control character but newline escaped (`\\x1b`): a package's names and
    strings are its author's data and must not drive the terminal."""
    return "".join(ch if ch == "\n" or ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def package_summary(path: Path, trusted_keys: list[Path] | None) -> dict:
    """`aotc inspect --json`: the verified package's digest, size, signature state and whole manifest."""
    from aotc_runtime import verify_package
    from aotc_runtime.signing import TRUSTED_KEYS_ENV, load_trusted_keys, verify_signature

    checked = verify_package(str(path))
    signature = None
    if checked.signature is not None:
        keys = load_trusted_keys(trusted_keys) if trusted_keys or os.environ.get(TRUSTED_KEYS_ENV) else {}
        status = verify_signature(checked.signature, checked.digest, "package", keys)
        signature = {"state": status.state, "key_id": status.key_id, "message": status.message}
    return {
        "package": str(path),
        "size": path.stat().st_size,
        "digest": f"sha256:{checked.digest}",
        "integrity": "ok",
        "signature": signature,
        "manifest": checked.manifest,
    }


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
    if args.json:
        from dataclasses import asdict

        print_json(
            {
                "package": str(args.package),
                "threads": model.num_threads,
                "whole_run_median_ms": whole,
                "calls": [asdict(call) | {"gflops": call.gflops} for call in calls],
            }
        )
    else:
        print(format_profile(calls, whole, model.num_threads))
    return OK


def cmd_validate(args: argparse.Namespace) -> int:
    model = load_package(args)
    shapes = {t.name: (tuple(t.shape), t.dtype) for t in model.inputs}
    if args.constant:
        return _validate_with_constants(args, model, shapes)
    return _run_validate(args, model, shapes)


def _run_validate(args: argparse.Namespace, model, shapes: dict) -> int:
    from aotc.validate import ATOL, RTOL, format_report_row, validate_package

    report = validate_package(
        args.package,
        args.model,
        shapes,
        seed=args.seed,
        rtol=RTOL if args.rtol is None else args.rtol,
        atol=ATOL if args.atol is None else args.atol,
        compiled=model,
        requantize=args.requantize,
    )
    for row in report:
        print(format_report_row(row))
    return OK


def _validate_with_constants(args: argparse.Namespace, model, shapes: dict) -> int:
    """`aotc validate --constant`: the reference runs the model with those inputs fixed to their values."""
    import tempfile

    from aotc.frontend.onnx import specialized_model
    from aotc.recipe import load_constant

    if args.model.suffix.lower() != ".onnx":
        raise ValueError(f"--constant applies to ONNX models, not {args.model}")
    constants = {
        name: load_constant(Path(v).resolve()) if isinstance(v, str) else v for name, v in args.constant
    }
    with tempfile.TemporaryDirectory(prefix="aotc-validate-") as scratch:
        specialized = Path(scratch) / args.model.name
        specialized.write_bytes(specialized_model(str(args.model), constants))
        args = argparse.Namespace(**{**vars(args), "model": specialized, "constant": None})
        return _run_validate(args, model, shapes)


def cmd_benchmark(args: argparse.Namespace) -> int:
    from aotc.benchmark import cmd_benchmark as run_benchmark

    return run_benchmark(args)


def cmd_worker(args: argparse.Namespace) -> int:
    from aotc.cluster import cmd_worker as run_worker

    return run_worker(args)


def cmd_hub(args: argparse.Namespace) -> int:
    from aotc.hub.cli import cmd_hub as run_hub

    return run_hub(args)


if __name__ == "__main__":
    sys.exit(main())
