"""Files written whole or not at all (a temporary file beside the target, synced, then renamed over it),
and scratch folders that a killed process does not leave behind (`ScratchDir`)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "SCRATCH_LOCK",
    "ScratchDir",
    "atomic_file",
    "current_umask",
    "remove_abandoned_scratch",
    "write_all_atomic",
    "write_atomic",
]

SCRATCH_LOCK = ".owner.lock"
# A folder of the prefix without a lock file is one being made right now, or one an older aotc left:
# it is deleted only once it has been left alone this long.
UNLOCKED_SCRATCH_AGE_S = 3600.0


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


class ScratchDir:
    """A new temporary folder `<tmp>/<prefix>XXXXXXXX` that lives until `remove()` or its process's end.

    A process that ends by SIGKILL or `os._exit` (a killed build, a pytest-xdist worker) runs no exit
    handler, so nothing deletes its folders then. The owner therefore holds an exclusive `flock` on a
    lock file inside while it lives (the kernel drops it with the process), and making a folder first
    deletes the prefix's folders whose lock nobody holds (`remove_abandoned_scratch`). A lock rather
    than a process id in the name: ids are reused, and differ between pid namespaces sharing /tmp."""

    def __init__(self, prefix: str, base: str | None = None) -> None:
        base = base or tempfile.gettempdir()
        remove_abandoned_scratch(prefix, base)
        self.path = tempfile.mkdtemp(prefix=prefix, dir=base)
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
        self._lock: int | None = os.open(os.path.join(self.path, SCRATCH_LOCK), flags, 0o600)
        fcntl.flock(self._lock, fcntl.LOCK_EX)

    def remove(self) -> None:
        """Delete the folder (the lock is held until it is gone, so no one else deletes it meanwhile)."""
        shutil.rmtree(self.path, ignore_errors=True)
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def remove_abandoned_scratch(prefix: str, base: str | None = None) -> list[str]:
    """Delete the folders `<base>/<prefix>*` whose owner has ended (see `ScratchDir`); their paths."""
    base = base or tempfile.gettempdir()
    removed = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    for entry in entries:
        if entry.name.startswith(prefix) and entry.is_dir(follow_symlinks=False) and _abandoned(entry.path):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
    return removed


def _abandoned(path: str) -> bool:
    try:
        fd = os.open(os.path.join(path, SCRATCH_LOCK), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        try:
            return time.time() - os.lstat(path).st_mtime > UNLOCKED_SCRATCH_AGE_S
        except OSError:
            return False
    except OSError:  # another user's folder, say: not ours to judge
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held: its owner lives
        return False
    finally:
        os.close(fd)
    return True
