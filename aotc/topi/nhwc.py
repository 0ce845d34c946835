"""NHWC operators (TFLite layout): convolutions, pooling and their registrations."""

from __future__ import annotations
