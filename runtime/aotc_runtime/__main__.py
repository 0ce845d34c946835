"""`python -m aotc_runtime run PACKAGE INPUTS.npz OUTPUTS.npz`: run a package once on the inputs of an
.npz file (arrays named after the model's inputs) and write its outputs to another .npz. It needs only
this package and numpy, so it runs where aotc does not: in an emulated device's Python under qemu
(aotc's `--emulate`), or on the device itself. Exit status 0, or 1 with the reason on stderr."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

from aotc_runtime.model import load
from aotc_runtime.package import PackageError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m aotc_runtime", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a package on the arrays of an .npz file")
    run.add_argument("package")
    run.add_argument("inputs", help=".npz with one array per model input")
    run.add_argument("outputs", help=".npz to write the outputs to (replaced atomically)")
    run.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    try:
        model = load(args.package, num_threads=args.threads)
        with np.load(args.inputs, allow_pickle=False) as data:
            inputs = {name: data[name] for name in data.files}
        outputs = model.run(inputs)
        save_npz(args.outputs, outputs)
    except (PackageError, ValueError, OSError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def save_npz(path: str, arrays: dict[str, np.ndarray]) -> None:
    """Write `arrays` to `path` through a temporary file renamed into place."""
    fd, tmp = tempfile.mkstemp(prefix=".outputs.", suffix=".npz", dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


if __name__ == "__main__":
    sys.exit(main())
