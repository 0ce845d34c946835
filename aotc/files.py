"""Writing files whole or not at all: a temporary file beside the target, synced, then renamed over it."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = ["atomic_file", "current_umask", "write_all_atomic", "write_atomic"]


def current_umask() -> int:
    """The process's umask, read from /proc where it can be (setting it to read it back, the only other
    way, races with threads creating files meanwhile)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: int = 0o666) -> Iterator[BinaryIO]:
    """A binary file that replaces `path` (with permissions `mode` less the process's umask, as `open`
    would create it) only when the block completes; a failure anywhere leaves `path` as it was and no
    temporary file behind. Creates the parent directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w+b") as f:
            os.fchmod(f.fileno(), mode & ~current_umask())  # mkstemp made it 0600 whatever the umask
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_atomic(path: str | os.PathLike, data: bytes, mode: int = 0o666) -> None:
    """Write `data` to `path` whole or not at all (see `atomic_file`)."""
    with atomic_file(path, mode) as f:
        f.write(data)


def write_all_atomic(files: dict[Path, bytes], mode: int = 0o666) -> None:
    """Write every file in full before any is renamed into place: a failure while writing (a full disk)
    changes none of them."""
    with contextlib.ExitStack() as stack:
        for path, data in files.items():
            stack.enter_context(atomic_file(path, mode)).write(data)
