"""End-to-end latency of aotc packages (untuned: default schedules) next to the model's own runtime, same run.

    python benchmarks/e2e.py [--models mlp,small_cnn,...] [--tflite] [--quick] [--trials N] [--keep DIR]

ONNX models (mlp, small_cnn, resnet18, mobilenet_v2, transformer) run next to onnxruntime; the TFLite
models (`tfl_*`: the tests' MobileNetV2-style block stack, small CNN and transformer block in float32,
the block stack and small CNN quantized to int8, and MobileNetV2 itself at 224x224 in int8 with
per-channel weights, `tfl_mobilenet_v2_int8`) next to the LiteRT interpreter with its default XNNPACK
delegate. `--tflite` selects just the TFLite models. Each runtime runs at 1 and 2 threads; the
timed call includes setting the inputs and fetching the outputs on both sides; aotc and the peer take
turns, each latency the best of 3 medians (1 with `--quick`). Ratios are peer latency / aotc latency at
the same thread count (> 1: aotc is faster). Packages are built with `validate: true`. `--keep DIR`
builds in DIR and leaves the models, packages and records there (to compare kernels afterwards with
`aotc profile`); otherwise they go with a temporary folder.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from timing import median_seconds, private_store
from zoo import onnx_models as models
from zoo import tflite_models

from aotc.benchmark import peer_calls
from aotc.build import BuildResult, build
from aotc.recipe import load_recipe
from aotc.validate import random_inputs


def _tflite(make: Callable) -> Callable[[], bytes]:
    """A maker of .tflite bytes from the example TFLite model builders (recipes/zoo/tflite_models.py)."""

    def bytes_of() -> bytes:
        return make(tflite_models).build()

    return bytes_of


TFLITE = {
    "tfl_mobilenet": _tflite(lambda tb: tb.mobilenet_blocks()),
    "tfl_small_cnn": _tflite(lambda tb: tb.small_cnn()),
    "tfl_transformer": _tflite(lambda tb: tb.transformer_block()),
    "tfl_mobilenet_int8": _tflite(lambda tb: tb.int8_model(tb.mobilenet_blocks())),
    "tfl_small_cnn_int8": _tflite(lambda tb: tb.int8_model(tb.small_cnn())),
    "tfl_mobilenet_v2_int8": _tflite(lambda tb: tb.int8_model(tb.mobilenet_v2())),
}
MODELS = {
    "mlp": lambda: models.mlp(),
    "small_cnn": lambda: models.small_cnn(),
    "resnet18": lambda: models.resnet18(),
    "mobilenet_v2": lambda: models.mobilenet_v2(),
    "transformer": lambda: models.transformer_encoder(),
    **TFLITE,
}
QUICK = {
    "mlp": lambda: models.mlp(),
    "small_cnn": lambda: models.small_cnn(),
    "resnet18": lambda: models.resnet18(width=16, size=64),
    "mobilenet_v2": lambda: models.mobilenet_v2(width_mult=0.35, size=96),
    "transformer": lambda: models.transformer_encoder(),
    **TFLITE,
}


def write_model(name: str, make: Callable, workdir: Path) -> Path:
    """The model made by `make` (an ONNX ModelProto or .tflite bytes) as a file in `workdir`."""
    model = make()
    if isinstance(model, bytes):
        path = workdir / f"{name}.tflite"
        path.write_bytes(model)
        return path
    return models.save(model, workdir / f"{name}.onnx")


def build_package(
    name: str, model_path: Path, workdir: Path, trials: int = 0, validate: bool = True, target: str = ""
) -> BuildResult:
    """Build `model_path` into `workdir/<name>.aotc`: untuned (as a fresh install would: the shipped tophub
    and default schedules, not this machine's user store), or tuned from scratch with `trials` trials
    (records in `workdir/<name>.jsonl`; neither store, whose records would leave nothing to tune);
    `validate` checks the package against the model's runtime at build time; `target` (default: the
    host's) e.g. names the cores the package is tuned for."""
    recipe_path = workdir / f"{name}.yaml"
    tuning = f"tuning: {{trials: {trials}, records: {workdir / (name + '.jsonl')}}}\n" if trials else ""
    recipe_path.write_text(
        f"model: {model_path}\noutput: {workdir / (name + '.aotc')}\n"
        f"validate: {str(validate).lower()}\n{tuning}" + (f"target: {target}\n" if target else "")
    )
    with private_store(workdir / "home", shipped="none" if trials else None):
        return build(load_recipe(recipe_path), log=lambda _: None)


@contextlib.contextmanager
def work_folder(keep: str | None) -> Iterator[Path]:
    """`keep` (made if missing, its contents left after the run), or a temporary folder removed after."""
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        yield Path(keep).resolve()
        return
    with tempfile.TemporaryDirectory() as tmp:
        yield Path(tmp)


def best_of_turns(run_ours: Callable, run_peer: Callable, rounds: int) -> tuple[float, float]:
    """Seconds per call of aotc and of the peer, taking turns: each the best of `rounds` medians."""
    ours = peer = float("inf")
    for _ in range(rounds):
        ours = min(ours, median_seconds(run_ours))
        peer = min(peer, median_seconds(run_peer))
    return ours, peer


def bench_model(
    name: str, make, workdir: Path, threads: list[int], trials: int = 0, rounds: int = 3
) -> list[str]:
    import aotc_runtime

    model_path = write_model(name, make, workdir)
    result = build_package(name, model_path, workdir, trials)
    compiled = aotc_runtime.load(str(result.package))
    inputs = random_inputs({t.name: (tuple(t.shape), t.dtype) for t in compiled.inputs}, seed=0)
    rows = []
    for t in threads:
        peer_name, (run_peer,) = peer_calls(model_path, inputs, 1, t)
        peer_name = peer_name.split()[0].lower()  # "onnxruntime" / "litert", without the version
        compiled.num_threads = t
        ours, peer = best_of_turns(lambda: compiled.run(inputs), run_peer, rounds)
        rows.append(
            f"{name:<21} {t:>2}  {ours * 1e3:9.3f}  {peer_name:<11} {peer * 1e3:9.3f}  {peer / ours:6.2f}x  "
            f"{result.seconds:7.1f} s  {len(result.tasks):>3}"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="", help="comma-separated subset (default: every model)")
    ap.add_argument("--tflite", action="store_true", help="only the TFLite models (tfl_*)")
    ap.add_argument(
        "--quick", action="store_true", help="thin variants of the large ONNX models, one timing round"
    )
    ap.add_argument(
        "--trials", type=int, default=0, help="tune each model with this many trials (default: untuned)"
    )
    ap.add_argument("--keep", metavar="DIR", help="build in DIR and keep the packages and records there")
    args = ap.parse_args(argv)
    table = QUICK if args.quick else MODELS
    names = [n for n in args.models.split(",") if n] or list(TFLITE if args.tflite else table)
    if args.tflite:
        names = [n for n in names if n in TFLITE]
    unknown = [n for n in names if n not in table]
    if unknown:
        ap.error(f"unknown models: {', '.join(unknown)}; known: {', '.join(table)}")
    threads = [1, 2]
    print(
        f"{'model':<21} {'th':>2}  {'aotc ms':>9}  {'peer':<6} {'peer ms':>9}  {'ratio':>7}  {'build':>9}  tasks"
    )
    with work_folder(args.keep) as workdir:
        for name in names:
            rounds = 1 if args.quick else 3
            for row in bench_model(name, table[name], workdir, threads, args.trials, rounds):
                print(row, flush=True)
    how = f"tuned with {args.trials} trials per model" if args.trials else "untuned default schedules"
    print(
        f"ratio = peer latency / aotc latency ({how}); peer: onnxruntime (ort) or LiteRT with XNNPACK "
        "(litert); build includes tuning and validation"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
