"""Quantized (int8/uint8) operators with TFLite's fixed-point arithmetic, and their registrations."""

from __future__ import annotations
