"""Re-batching: compiling a model exported with batch 1 at another batch size.

A given input shape may differ from the model's in its leading dimension alone, and only where the model
fixes it to 1: that dimension is the batch, and the graph is re-inferred at the new size. Shapes the model
bakes in are adjusted by one rule: a Reshape of a batched value to a target whose leading extent is 1 keeps
the batch there (`[1, -1]` flattens each sample). Any other shape that no longer fits fails conversion
naming its node; validation compares with the reference run sample by sample.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from aotc.frontend.errors import InputShapeError

MODEL_BATCH = 1
"""The only fixed batch size re-batching starts from: where samples lie in a larger batch is unknown."""


def rebatch_size(model_dims: Sequence[object], given: Sequence[int]) -> int | None:
    """The new batch when `given` differs from the model's fixed dims only in a leading 1, else None
    (including when it does not differ at all). Dims that are not ints are dynamic and match anything."""
    if len(model_dims) != len(given) or not given or model_dims[0] != MODEL_BATCH:
        return None
    if given[0] == MODEL_BATCH:
        return None
    rest_ok = all(not isinstance(d, int) or d == g for d, g in zip(model_dims[1:], given[1:]))
    return int(given[0]) if rest_ok else None


class BatchTracker:
    """The batch size a model is re-batched to, agreed by every re-batched input (None: not re-batched)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.batch: int | None = None
        self.first_input: str | None = None

    def add(self, name: str, batch: int) -> None:
        if self.batch is not None and batch != self.batch:
            raise InputShapeError(
                f"{self.source}: input {name}: re-batched to {batch} but input {self.first_input} to "
                f"{self.batch}; give every batch-1 input the same batch size"
            )
        self.batch, self.first_input = batch, name

    def reshape_target(self, target: list[int], x_shape: Sequence[int]) -> list[int]:
        """`target` with a leading 1 turned into the batch when the reshaped value carries it."""
        batch = self.batch
        if batch is None or not target or not x_shape or target[0] != MODEL_BATCH or x_shape[0] != batch:
            return target
        return [batch, *target[1:]]

    def note(self) -> str:
        """What a conversion error adds while re-batching: the likely cause."""
        if self.batch is None:
            return ""
        return (
            f" (the model is being re-batched from batch {MODEL_BATCH} to {self.batch}: this node bakes "
            "the batch size into its shapes; compile it at batch 1 or export the model with a dynamic batch)"
        )


def run_by_sample(
    run: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]],
    inputs: Mapping[str, np.ndarray],
    declared: Mapping[str, Sequence[object]],
) -> dict[str, np.ndarray]:
    """A reference runtime's outputs for a re-batched model: `run` (the model at its own shapes,
    `declared` per input, non-int dims dynamic) once per sample, outputs joined on the batch axis; one
    plain call when no input is re-batched."""
    batched = {n: rebatch_size(declared[n], a.shape) for n, a in inputs.items() if n in declared}
    batched = {n: b for n, b in batched.items() if b is not None}
    if not batched:
        return run(dict(inputs))
    batch = next(iter(batched.values()))
    per_sample = [
        run({n: a[i : i + 1] if n in batched else a for n, a in inputs.items()}) for i in range(batch)
    ]
    return {name: np.concatenate([out[name] for out in per_sample]) for name in per_sample[0]}
