"""Write the example models of these recipes (fixed seeds, so the files are byte-for-byte reproducible)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

try:
    from aotc import models
except ImportError:
    sys.path.insert(0, str(HERE.parent))
    from aotc import models


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--out", type=Path, default=HERE / "models", help="output directory (default: recipes/models)"
    )
    parser.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"models to write (default: all of {', '.join(models.EXAMPLES)})",
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(models.EXAMPLES))
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(models.EXAMPLES)}")
    for name in args.names or models.EXAMPLES:
        path = models.save(models.EXAMPLES[name](), args.out / f"{name}.onnx")
        print(f"{path}  {path.stat().st_size / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
