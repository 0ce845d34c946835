"""ONNX frontend: Indexing and data-movement operators (TopK, Scatter*, GatherND, DepthToSpace, Einsum, ...)."""

from __future__ import annotations

VERSIONS: dict[str, tuple[int, ...]] = {}
"""ONNX operator -> the versions of it that this module converts (merged into aotc.frontend.onnx.VERSIONS)."""
