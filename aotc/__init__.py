"""aotc: an ahead-of-time compiler for trained neural networks.

    import aotc
    pkg = aotc.compile("model.onnx", target="llvm -mcpu=native", tuning=aotc.TuningOptions(trials=2000))
    pkg.save("model.aotc")
    model = aotc.load("model.aotc")
    y = model.run({"input": x})

The names below are imported on first use, so `import aotc` stays cheap.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "compile": "aotc.api",
    "tune": "aotc.api",
    "Package": "aotc.api",
    "Recipe": "aotc.recipe",
    "RecipeError": "aotc.recipe",
    "TuningOptions": "aotc.search.model_tuning",
    "MeasureOptions": "aotc.search.measure",
    "SearchParams": "aotc.search.params",
    "BuildError": "aotc.errors",
    "parse_target": "aotc.target",
    "load": "aotc_runtime",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'aotc' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
