"""ONNX frontend: Recurrent and control-flow operators (RNN, GRU, LSTM, Scan, If, Loop) with static trip counts."""

from __future__ import annotations

VERSIONS: dict[str, tuple[int, ...]] = {}
"""ONNX operator -> the versions of it that this module converts (merged into aotc.frontend.onnx.VERSIONS)."""
