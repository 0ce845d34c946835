"""Package size, load time and peak memory of aotc packages next to the model's own runtime (issue 22).

    python benchmarks/footprint.py [--models resnet18,mobilenet_v2,...] [--quick]

Each model is built untuned twice, with `weights: compact` (Winograd weights computed at load) and
`weights: prepacked`; each package, and the source model under onnxruntime (LiteRT for .tflite), is
loaded in 3 fresh processes (aotc/footprint.py): the medians of the load time and of the resident
memory the load, and the load plus a first run, add to a process that had imported the runtime.
Printed with the CPU class and the load average, since load times move with a busy machine.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from e2e import MODELS, QUICK, write_model
from timing import cpu_class

from aotc.build import build
from aotc.footprint import measure_footprint
from aotc.recipe import load_recipe

DEFAULT = ("mlp", "small_cnn", "resnet18", "mobilenet_v2", "transformer", "tfl_mobilenet")


def footprint_rows(name: str, make, workdir: Path) -> list[str]:
    model = write_model(name, make, workdir)
    peer = "litert" if model.suffix == ".tflite" else "onnxruntime"
    base = measure_footprint(model, peer)
    rows = [_row(name, peer, base, model.stat().st_size, base)]
    for mode in ("compact", "prepacked"):
        recipe = workdir / f"{name}-{mode}.yaml"
        recipe.write_text(
            f"model: {model}\noutput: {workdir / f'{name}-{mode}.aotc'}\nweights: {mode}\nvalidate: false\n"
        )
        package = build(load_recipe(recipe), log=lambda _: None).package
        rows.append(
            _row(name, f"aotc {mode}", measure_footprint(package, "aotc"), model.stat().st_size, base)
        )
    return rows


def _row(name: str, who: str, f, model_bytes: int, peer) -> str:
    return (
        f"{name:<14} {who:<15} {f.file_bytes / 2**20:9.2f} {f.file_bytes / model_bytes:6.2f}x "
        f"{f.load_s * 1e3:8.1f} {peer.load_s / f.load_s:6.2f}x {f.rss_load / 2**20:8.1f} "
        f"{f.rss_run / 2**20:8.1f} {peer.rss_run / max(f.rss_run, 1):6.2f}x"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(DEFAULT), help="comma-separated subset")
    ap.add_argument("--quick", action="store_true", help="thin variants of the large ONNX models")
    args = ap.parse_args(argv)
    table = QUICK if args.quick else MODELS
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in table]
    if unknown:
        ap.error(f"unknown models: {', '.join(unknown)}; known: {', '.join(table)}")
    print(f"CPU class {cpu_class()}; load average {os.getloadavg()[0]:.2f} at the start")
    print(
        f"{'model':<14} {'runtime':<15} {'file MiB':>9} {'/model':>7} {'load ms':>8} {'peer/':>7} "
        f"{'+RSS ld':>8} {'+RSS run':>8} {'peer/':>7}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            for row in footprint_rows(name, table[name], Path(tmp)):
                print(row, flush=True)
    print(
        "file: the package (the model file for the peer), /model its size over the model file's; load: "
        "load time, peer/ the peer's over it (> 1: aotc loads faster); +RSS: MiB of resident memory "
        f"added by loading and by loading plus one run, peer/ as for load; medians of 3 fresh processes; "
        f"load average {os.getloadavg()[0]:.2f} at the end"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
