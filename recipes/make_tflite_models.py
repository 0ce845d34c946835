"""Write the example TFLite models of these recipes (fixed seeds; the int8 one is calibrated with LiteRT on
seeded inputs). Both files are committed, so the recipes build without running this script.

The models are described with the example TFLite model builder (recipes/zoo/tflite_models.py);
calibrating the int8 one needs `ai-edge-litert` (the test extra).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Run as a script, only recipes/ is on sys.path; the zoo is imported from the repository root.
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from recipes.zoo.tflite_models import int8_model, mobilenet_blocks  # noqa: E402

MODELS = {
    "mobilenet_block": lambda: mobilenet_blocks(blocks=3),
    "mobilenet_block_int8": lambda: int8_model(mobilenet_blocks(blocks=3)),
}
"""Three MobileNetV2 inverted residual blocks on a 32x32 RGB image, 10 classes: float, and fully int8
(per-channel weights, int8 input and output)."""

SIZE_LIMIT = 300_000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--out", type=Path, default=HERE / "models", help="output directory (default: recipes/models)"
    )
    parser.add_argument(
        "names", nargs="*", metavar="NAME", help=f"models to write (default: all of {', '.join(MODELS)})"
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(MODELS))
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.names or MODELS:
        data = MODELS[name]().build()
        if len(data) > SIZE_LIMIT:
            raise SystemExit(
                f"{name}: {len(data)} bytes is over the {SIZE_LIMIT}-byte limit for committed models"
            )
        path = args.out / f"{name}.tflite"
        tmp = path.with_suffix(".tflite.tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
        print(f"{path}  {len(data) / 1e3:.1f} KB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
