"""Weights a package computes when it loads instead of storing them (`weights: compact`,
docs/package.md#derived-weights).

A Winograd convolution reads U = G g G^T, four times the bytes of its 3x3 weights g for F(4, 3), re-laid
out to follow its tiles. A compact package stores g once and computes the re-laid-out U from it at
load, with a kernel compiled into the package's library like any other: `prepare_kernel` builds it from
the weight transform and the layout rewrite as loop stages, on the default schedule.
"""

from __future__ import annotations

import numpy as np

from aotc import te
from aotc.graph.ir import Derivation
from aotc.ir.stmt import PrimFunc
from aotc.schedule.default import default_schedule
from aotc.schedule.layout import WeightLayout
from aotc.schedule.lower import lower
from aotc.target import Target
from aotc.topi import winograd


def prepare_dag(derivation: Derivation, layout: WeightLayout | None) -> te.ComputeDAG:
    """The computation of a derived weight from its source: the Winograd transform, then the layout."""
    if derivation.kind != "winograd":
        raise ValueError(f"no way to compute a weight derived by {derivation.kind!r} at load")
    source = te.placeholder(derivation.source.shape, dtype=derivation.source.dtype.name, name="source")
    out = winograd.weight_transform(source, derivation.tile)
    if layout is not None:
        out = layout.compute(out, "packed")
    return te.ComputeDAG([out])


def prepare_kernel(
    derivation: Derivation, layout: WeightLayout | None, symbol: str, target: Target
) -> PrimFunc:
    """The kernel `symbol(source, derived)` that computes the weight as the build computed it."""
    return lower(default_schedule(prepare_dag(derivation, layout), target), symbol)


def derived_value(derivation: Derivation, layout: WeightLayout | None) -> np.ndarray:
    """What the build computes for the weight (float64 transform, then the layout): the reference the
    kernel's result is compared with in tests."""
    u = winograd.transform_weight(derivation.source, derivation.tile)
    return u if layout is None else layout.apply(u)
