"""Write the example models of these recipes (fixed seeds, so the files are byte-for-byte reproducible)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Run as a script, only recipes/ is on sys.path; the zoo is imported from the repository root.
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from recipes.zoo import onnx_models  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--out", type=Path, default=HERE / "models", help="output directory (default: recipes/models)"
    )
    parser.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"models to write (default: all of {', '.join(onnx_models.EXAMPLES)})",
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(onnx_models.EXAMPLES))
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(onnx_models.EXAMPLES)}")
    for name in args.names or onnx_models.EXAMPLES:
        path = onnx_models.save(onnx_models.EXAMPLES[name](), args.out / f"{name}.onnx")
        print(f"{path}  {path.stat().st_size / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
