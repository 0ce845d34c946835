"""The example model builders (recipes/zoo) for benchmarks that run as scripts: `python benchmarks/x.py`
puts only benchmarks/ on sys.path, so the repository root goes there once, here."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from recipes.zoo import onnx_models, tflite_models  # noqa: E402

__all__ = ["onnx_models", "tflite_models"]
