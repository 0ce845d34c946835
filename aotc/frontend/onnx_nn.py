"""ONNX frontend: Reductions, normalizations, pooling and signal operators (ReduceProd, LRN, LpPool, DFT, ...)."""

from __future__ import annotations

VERSIONS: dict[str, tuple[int, ...]] = {}
"""ONNX operator -> the versions of it that this module converts (merged into aotc.frontend.onnx.VERSIONS)."""
