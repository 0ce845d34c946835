"""End-to-end latency of aotc packages (untuned: default schedules) next to onnxruntime, same run.

    python benchmarks/e2e.py [--models mlp,small_cnn,...] [--quick]

Ratios are onnxruntime latency / aotc latency at the same thread count (> 1: aotc is faster).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from timing import median_seconds

from aotc import models
from aotc.build import build
from aotc.recipe import load_recipe
from aotc.validate import random_inputs

MODELS = {
    "mlp": lambda: models.mlp(),
    "small_cnn": lambda: models.small_cnn(),
    "resnet18": lambda: models.resnet18(),
    "mobilenet_v2": lambda: models.mobilenet_v2(),
    "transformer": lambda: models.transformer_encoder(),
}
QUICK = {
    "mlp": lambda: models.mlp(),
    "small_cnn": lambda: models.small_cnn(),
    "resnet18": lambda: models.resnet18(width=16, size=64),
    "mobilenet_v2": lambda: models.mobilenet_v2(width_mult=0.35, size=96),
    "transformer": lambda: models.transformer_encoder(),
}


def bench_model(name: str, make, workdir: Path, threads: list[int], trials: int = 0) -> list[str]:
    import aotc_runtime
    import onnxruntime as ort

    model_path = workdir / f"{name}.onnx"
    models.save(make(), str(model_path))
    recipe_path = workdir / f"{name}.yaml"
    tuning = f"tuning: {{trials: {trials}, records: {workdir / (name + '.jsonl')}}}\n" if trials else ""
    recipe_path.write_text(
        f"model: {model_path}\noutput: {workdir / (name + '.aotc')}\nvalidate: true\n{tuning}"
    )
    result = build(load_recipe(recipe_path), log=lambda _: None)
    compiled = aotc_runtime.load(str(result.package))
    inputs = random_inputs({t.name: (tuple(t.shape), t.dtype) for t in compiled.inputs}, seed=0)
    rows = []
    for t in threads:
        compiled.num_threads = t
        ours = median_seconds(lambda: compiled.run(inputs))
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = t
        opts.inter_op_num_threads = 1
        sess = ort.InferenceSession(str(model_path), opts, providers=["CPUExecutionProvider"])
        feed = dict(inputs)
        peer = median_seconds(lambda s=sess, f=feed: s.run(None, f))
        rows.append(
            f"{name:<14} {t:>2}  {ours * 1e3:9.3f}  {peer * 1e3:9.3f}  {peer / ours:6.2f}x  "
            f"{result.seconds:7.1f} s  {len(result.tasks):>3}"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated subset")
    ap.add_argument("--quick", action="store_true", help="thin variants of the large models")
    ap.add_argument(
        "--trials", type=int, default=0, help="tune each model with this many trials (default: untuned)"
    )
    args = ap.parse_args(argv)
    table = QUICK if args.quick else MODELS
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in table]
    if unknown:
        ap.error(f"unknown models: {', '.join(unknown)}; known: {', '.join(table)}")
    threads = [1, 2]
    print(f"{'model':<14} {'th':>2}  {'aotc ms':>9}  {'ort ms':>9}  {'ratio':>7}  {'build':>9}  tasks")
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            for row in bench_model(name, table[name], Path(tmp), threads, args.trials):
                print(row, flush=True)
    how = f"tuned with {args.trials} trials per model" if args.trials else "untuned default schedules"
    print(f"ratio = onnxruntime latency / aotc latency ({how}); build includes tuning and validation")
    return 0


if __name__ == "__main__":
    sys.exit(main())
