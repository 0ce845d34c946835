"""Place intermediate tensors in one workspace: liveness over the kernel sequence, greedy by size.

A buffer is live from the call that writes it to the last call that reads it; buffers whose
lifetimes overlap never share bytes. Largest first, each goes to the lowest aligned offset that fits
(TFLite's greedy-by-size arena planner).

Where it costs no workspace, a buffer also keeps off the bytes of any buffer last read fewer than
`reuse_distance` calls before it is written. Those lines still sit in the caches of every core that
read them, so on a multi-core run each write would first invalidate another core's copy: MobileNetV2's
depthwise convs, writing where the 1x1 conv two calls earlier had read on both cores, ran 1.9x
slower in sequence than alone; 2 calls apart still cost 1.5-3x, 8 calls apart nothing measurable.
"""

from __future__ import annotations

from dataclasses import dataclass

ALIGN = 64
REUSE_DISTANCE = 8


@dataclass(frozen=True)
class Lifetime:
    key: str
    nbytes: int
    first: int
    last: int


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def plan_memory(buffers: list[Lifetime], reuse_distance: int = REUSE_DISTANCE) -> tuple[dict[str, int], int]:
    """Byte offset of every buffer and the workspace size (never more than with `reuse_distance` 0)."""
    plain = _place(buffers, 0, None)
    if reuse_distance <= 0:
        return plain
    spaced = _place(buffers, reuse_distance, plain[1])
    return spaced if spaced[1] <= plain[1] else plain


def _place(buffers: list[Lifetime], distance: int, bound: int | None) -> tuple[dict[str, int], int]:
    placed: list[tuple[int, int, Lifetime]] = []
    offsets: dict[str, int] = {}
    for buf in sorted(buffers, key=lambda b: (-b.nbytes, b.first, b.key)):
        size = _align(max(buf.nbytes, 1))
        offset = _lowest_fit(buf, size, placed, distance)
        if distance and bound is not None and offset + size > bound:
            offset = _lowest_fit(buf, size, placed, 0)
        placed.append((offset, offset + size, buf))
        offsets[buf.key] = offset
    return offsets, max((end for _, end, _ in placed), default=0)


def _lowest_fit(buf: Lifetime, size: int, placed: list[tuple[int, int, Lifetime]], distance: int) -> int:
    """The lowest offset where `buf` overlaps no placed buffer live within `distance` calls of it."""
    clashes = sorted(
        (start, end)
        for start, end, other in placed
        if other.first <= buf.last + distance and buf.first <= other.last + distance
    )
    offset = 0
    for start, end in clashes:
        if offset + size <= start:
            break
        offset = max(offset, end)
    return offset
