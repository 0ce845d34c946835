"""Run a check from several threads at once (kernels and the runtime release the GIL)."""

from __future__ import annotations

import threading
from collections.abc import Callable


def failures_in_threads(check: Callable[[int], bool], threads: int) -> list[int]:
    """Call `check(seed)` in `threads` threads at once, seed 0..threads-1; the seeds whose check failed."""
    failed: list[int] = []

    def worker(seed: int) -> None:
        if not check(seed):
            failed.append(seed)

    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return failed
