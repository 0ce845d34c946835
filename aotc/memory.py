"""Place intermediate tensors in one workspace: liveness over the kernel sequence, greedy by size.

A buffer is live from the call that writes it to the last call that reads it; buffers whose
lifetimes overlap never share bytes. Largest first, each goes to the lowest aligned offset that fits
(TFLite's greedy-by-size arena planner).
"""

from __future__ import annotations

from dataclasses import dataclass

ALIGN = 64


@dataclass(frozen=True)
class Lifetime:
    key: str
    nbytes: int
    first: int
    last: int


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def plan_memory(buffers: list[Lifetime]) -> tuple[dict[str, int], int]:
    """Byte offset of every buffer and the workspace size."""
    placed: list[tuple[int, int, Lifetime]] = []
    offsets: dict[str, int] = {}
    for buf in sorted(buffers, key=lambda b: (-b.nbytes, b.first, b.key)):
        size = _align(max(buf.nbytes, 1))
        clashes = sorted(
            (start, end)
            for start, end, other in placed
            if other.first <= buf.last and buf.first <= other.last
        )
        offset = 0
        for start, end in clashes:
            if offset + size <= start:
                break
            offset = max(offset, end)
        placed.append((offset, offset + size, buf))
        offsets[buf.key] = offset
    total = max((end for _, end, _ in placed), default=0)
    return offsets, total
