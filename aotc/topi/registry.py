"""The operator registry: each graph operator's fusion pattern and its tensor-expression compute."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from aotc.te.tensor import Operation


class OpPattern(IntEnum):
    """Relay's fusion patterns (docs/README.md#partitioning-into-tasks); lower values fuse more freely."""

    ELEMWISE = 0
    BROADCAST = 1
    INJECTIVE = 2
    COMM_REDUCE = 3
    OUT_ELEMWISE_FUSABLE = 4  # anchors: conv, matmul, dense, pool
    OPAQUE = 8


ComputeFn = Callable[[Sequence[Operation], dict[str, Any]], list[Operation]]


@dataclass(frozen=True)
class OpDef:
    name: str
    pattern: OpPattern
    compute: ComputeFn
    num_outputs: int = 1


_REGISTRY: dict[str, OpDef] = {}


class UnknownOperatorError(KeyError):
    pass


def register(name: str, pattern: OpPattern, num_outputs: int = 1):
    """Decorator: `@register("add", OpPattern.BROADCAST)` over `compute(inputs, attrs) -> list[Operation]`."""

    def wrap(fn: ComputeFn) -> ComputeFn:
        if name in _REGISTRY:
            raise ValueError(f"operator {name!r} is registered twice")
        _REGISTRY[name] = OpDef(name, pattern, fn, num_outputs)
        return fn

    return wrap


def get_op(name: str) -> OpDef:
    _load_all()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownOperatorError(f"no operator {name!r} is registered") from None


def registered_ops() -> list[str]:
    _load_all()
    return sorted(_REGISTRY)


def _load_all() -> None:
    """Import the modules whose decorators fill the registry."""
    import aotc.topi.indexing  # noqa: F401
    import aotc.topi.lowp  # noqa: F401
    import aotc.topi.nhwc  # noqa: F401
    import aotc.topi.ops  # noqa: F401
    import aotc.topi.quantized  # noqa: F401
    import aotc.topi.sampling  # noqa: F401
