"""ONNX frontend: Element-wise math operators (trigonometric, hyperbolic, predicates, activations, bitwise)."""

from __future__ import annotations

VERSIONS: dict[str, tuple[int, ...]] = {}
"""ONNX operator -> the versions of it that this module converts (merged into aotc.frontend.onnx.VERSIONS)."""
