"""QDQ-quantized ONNX models: aotc packages next to onnxruntime running the same QDQ model, same run.

    python benchmarks/qdq.py [--models resnet18,mobilenet_v2] [--quick] [--trials N [--per-thread-tuning]]
                             [--activations uint8|int8] [--calibration N] [--samples N] [--no-preprocess]
                             [--keep DIR]

The float models come from the zoo (recipes/zoo/onnx_models.py, fixed seeds): ResNet-18 and MobileNetV2
at 224x224, batch 1 (`--quick`: e2e.py's thin variants, ResNet-18 width 16 at 64x64 and MobileNetV2 x0.35
at 96x96; `--models` also takes e2e.py's other ONNX models, e.g. small_cnn). Each goes through
onnxruntime's `quant_pre_process` (batch norms folded into the convolutions, as onnxruntime recommends;
`--no-preprocess` skips it, leaving each BatchNormalization a float op between DequantizeLinear and
QuantizeLinear), then `quantize_static` in the QDQ format with per-channel int8 weights and, by default,
uint8 activations (onnxruntime's recommendation for x86: QUInt8 activations, QInt8 weights; `--activations
int8` for QInt8), calibrated on `--calibration` seeded standard-normal inputs (the zoo's `quantize`), with
7-bit weights (`reduce_range`, onnxruntime's advice for x86 without VNNI: on AVX2 its u8s8 kernel adds
pairs of products in int16 with saturation, so with 8-bit weights its outputs there are not the model's;
the speed of either side does not depend on it).

The package is built untuned (default schedules; `--trials N`: tuned with N trials, as e2e.py, for this
machine's cores; with `--per-thread-tuning` one package per thread count, each tuned with N trials for
that many cores, `-num-cores=t`, as a deployment at t threads would be: records tuned for 2 cores ran
QDQ ResNet-18's last stage 1.5x slower at 1 thread than its default schedules on Zen 5). Its
outputs on `--samples` other seeded standard-normal inputs are checked against onnxruntime's run of the
same QDQ model: the largest absolute difference (also in units of the final DequantizeLinear's scale,
LSB) and how many argmaxes agree. Latency: aotc vs onnxruntime (the QDQ model, graph optimizations all on,
`intra_op_num_threads` = t) at 1 and 2 threads, the timed call including setting the inputs and fetching
the outputs on both sides, taking turns, each latency the best of 3 medians (1 with `--quick`). The ratio
is onnxruntime latency / aotc latency (> 1: aotc is faster). The CPU class and the load average before
and after are printed so a reader knows how quiet the machine was; time on a quiet one. `--keep DIR`
leaves the models, packages and records in DIR (to compare a tuned and an untuned run's kernels
afterwards with `aotc profile`, which is steadier than two runs' ratios).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from e2e import MODELS, QUICK, TFLITE, best_of_turns, build_package, work_folder
from timing import cpu_class
from zoo import onnx_models as models

from aotc.benchmark import peer_calls
from aotc.validate import reference_outputs

DEFAULT_MODELS = ("resnet18", "mobilenet_v2")
ONNX_MODELS = [name for name in MODELS if name not in TFLITE]
THREADS = (1, 2)


@dataclass
class Accuracy:
    """aotc against onnxruntime on the same QDQ model and seeded inputs."""

    max_abs: float
    max_lsb: float | None  # max_abs in units of the output's final DequantizeLinear scale
    argmax_agree: int
    argmax_total: int


def quantized_model(
    name: str,
    make: Callable[[], onnx.ModelProto],
    workdir: Path,
    activations: str,
    calibration: int,
    preprocess: bool = True,
) -> Path:
    """The float model `make()` quantized to QDQ (per-channel int8 weights, `activations` uint8 or int8),
    calibrated on `calibration` seeded inputs, as `workdir/<name>.qdq.onnx`. `preprocess`: first
    onnxruntime's `quant_pre_process` (batch norms folded into the convolutions), as it recommends."""
    model = make()
    if preprocess:
        from onnxruntime.quantization.shape_inference import quant_pre_process

        source, folded = workdir / f"{name}.source.onnx", workdir / f"{name}.pre.onnx"
        models.save(model, source)
        # The zoo's shapes are static: ONNX shape inference suffices (the symbolic one needs sympy).
        quant_pre_process(source, folded, skip_symbolic_shape=True)
        model = onnx.load(str(folded))
    return models.quantize(
        model,
        workdir / f"{name}.qdq.onnx",
        per_channel=True,
        activations=activations,
        quant_format="QDQ",
        samples=calibration,
        seed=0,
    )


def seeded_inputs(specs: dict[str, tuple[tuple[int, ...], str]], seed: int) -> dict[str, np.ndarray]:
    """Standard-normal inputs (the calibration's distribution) drawn from `seed`."""
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape).astype(dtype) for name, (shape, dtype) in specs.items()}


def output_scales(model_path: Path) -> dict[str, float]:
    """The scale of each graph output that a DequantizeLinear with a constant scalar scale produces."""
    model = onnx.load(str(model_path))
    consts = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    scales = {}
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and node.input[1] in consts:
            scale = consts[node.input[1]]
            if scale.size == 1:
                scales[node.output[0]] = float(scale.reshape(()))
    return {o.name: scales[o.name] for o in model.graph.output if o.name in scales}


def check_outputs(compiled, model_path: Path, samples: int) -> Accuracy:
    """Run the package and onnxruntime on `samples` seeded inputs (seeds 1..samples) and compare."""
    specs = {t.name: (tuple(t.shape), t.dtype) for t in compiled.inputs}
    scales = output_scales(model_path)
    max_abs, max_lsb, agree, total = 0.0, None, 0, 0
    for seed in range(1, samples + 1):
        inputs = seeded_inputs(specs, seed)
        ours, ref = compiled.run(inputs), reference_outputs(model_path, inputs)
        for name, expected in ref.items():
            diff = float(np.max(np.abs(ours[name].astype(np.float64) - expected.astype(np.float64))))
            max_abs = max(max_abs, diff)
            if name in scales:
                max_lsb = max(max_lsb or 0.0, diff / scales[name])
        first = next(iter(ref))  # the classifier's logits: argmax over the last axis, per batch row
        got = np.argmax(ours[first].reshape(-1, ours[first].shape[-1]), axis=-1)
        want = np.argmax(ref[first].reshape(-1, ref[first].shape[-1]), axis=-1)
        agree += int(np.sum(got == want))
        total += want.size
    return Accuracy(max_abs, max_lsb, agree, total)


def bench_qdq(
    name: str,
    make: Callable[[], onnx.ModelProto],
    workdir: Path,
    args: argparse.Namespace,
    rounds: int,
) -> list[str]:
    """Quantize, build, check against onnxruntime and time one model; its table rows."""
    import aotc_runtime

    model_path = quantized_model(
        name, make, workdir, args.activations, args.calibration, not args.no_preprocess
    )
    # tuned per thread count: a package for t cores each (the records' key holds the core count), as a
    # deployment at t threads would tune; otherwise one package, tuned for this machine's cores
    if args.trials and args.per_thread_tuning:
        builds = {
            t: build_package(
                f"{name}_qdq_{t}", model_path, workdir, args.trials, False, target=f"llvm -num-cores={t}"
            )
            for t in args.threads
        }
    else:
        builds = dict.fromkeys(
            args.threads, build_package(f"{name}_qdq", model_path, workdir, args.trials, False)
        )
    loaded = {b.package: aotc_runtime.load(str(b.package)) for b in builds.values()}
    compiled = loaded[builds[args.threads[0]].package]
    acc = check_outputs(compiled, model_path, args.samples)
    lsb = "-" if acc.max_lsb is None else f"{acc.max_lsb:.1f}"
    inputs = seeded_inputs({t.name: (tuple(t.shape), t.dtype) for t in compiled.inputs}, seed=0)
    rows = []
    for t in args.threads:
        _, (run_peer,) = peer_calls(model_path, inputs, 1, t)
        result = builds[t]
        package = loaded[result.package]
        package.num_threads = t
        ours, peer = best_of_turns(lambda p=package: p.run(inputs), run_peer, rounds)
        rows.append(
            f"{name:<14} {args.activations:<5} {t:>2}  {ours * 1e3:9.3f}  {peer * 1e3:9.3f}  {peer / ours:6.2f}x  "
            f"{result.seconds:7.1f} s  {len(result.tasks):>3}  {acc.max_abs:9.3g}  {lsb:>5}  "
            f"{acc.argmax_agree}/{acc.argmax_total}"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--models",
        default=",".join(DEFAULT_MODELS),
        help=f"comma-separated, of {', '.join(ONNX_MODELS)} (default: %(default)s)",
    )
    ap.add_argument("--quick", action="store_true", help="thin, small variants; one timing round")
    ap.add_argument(
        "--trials", type=int, default=0, help="tune each model with this many trials (default: untuned)"
    )
    ap.add_argument(
        "--activations",
        choices=("uint8", "int8"),
        default="uint8",
        help="activation type (default: uint8, onnxruntime's recommendation for x86)",
    )
    ap.add_argument(
        "--no-preprocess",
        action="store_true",
        help="quantize the zoo's model as built, batch norms unfolded (default: quant_pre_process first)",
    )
    ap.add_argument(
        "--per-thread-tuning",
        action="store_true",
        help="with --trials: tune a package for each thread count (-num-cores=t), not one for this machine",
    )
    ap.add_argument("--calibration", type=int, default=4, help="seeded calibration inputs (default: 4)")
    ap.add_argument(
        "--samples", type=int, default=4, help="seeded inputs for the accuracy check (default: 4)"
    )
    ap.add_argument("--keep", metavar="DIR", help="build in DIR and keep the packages and records there")
    args = ap.parse_args(argv)
    args.threads = THREADS
    table = QUICK if args.quick else MODELS
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in ONNX_MODELS]
    if unknown:
        ap.error(f"unknown models: {', '.join(unknown)}; known: {', '.join(ONNX_MODELS)}")
    load = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    print(f"CPU: {cpu_class()}, {os.cpu_count()} cores; load average before: {load}", flush=True)
    print(
        f"{'model':<14} {'acts':<5} {'th':>2}  {'aotc ms':>9}  {'ort ms':>9}  {'ratio':>7}  {'build':>9}  "
        f"tasks  {'max|diff|':>9}  {'LSB':>5}  argmax"
    )
    failed = 0
    with work_folder(args.keep) as workdir:
        for name in names:
            try:
                rows = bench_qdq(name, table[name], workdir, args, 1 if args.quick else 3)
            except Exception as err:  # noqa: BLE001 - one model's refusal is a result; the others still run
                print(f"{name:<14} {args.activations:<5} failed: {type(err).__name__}: {err}", flush=True)
                failed += 1
                continue
            for row in rows:
                print(row, flush=True)
    how = f"tuned with {args.trials} trials per model" if args.trials else "untuned default schedules"
    if args.trials and args.per_thread_tuning:
        how += " and thread count, each package tuned for the cores it runs on"
    print(
        f"ratio = onnxruntime latency / aotc latency ({how}); onnxruntime runs the same QDQ model "
        f"(per-channel int8 weights, {args.activations} activations); max|diff| and argmax over "
        f"{args.samples} seeded inputs; build includes tuning"
    )
    load = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    print(f"load average after: {load}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
