"""ONNX frontend: Attention-family operators (Attention, RotaryEmbedding and the newer sequence-model operators)."""

from __future__ import annotations

VERSIONS: dict[str, tuple[int, ...]] = {}
"""ONNX operator -> the versions of it that this module converts (merged into aotc.frontend.onnx.VERSIONS)."""
