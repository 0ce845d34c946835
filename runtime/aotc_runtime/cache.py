"""A private per-user cache of extracted kernel libraries, keyed by their sha256.

Loading a library runs its code, so two things are guarded:

- The directory is private. It is created 0700 and, before each use, opened without following a
  symlink and checked: a real directory, owned by this user, not writable by group or others. A
  directory that fails is not used (with a RuntimeWarning): a path in a shared /tmp that another
  user made first is never trusted. Candidates: `cache_dir()`, then `<tmp>/aotc_runtime-<uid>`
  (checked the same way), then a fresh `mkdtemp` directory for this process, removed at exit.
- The library loaded is the file that was verified. `install_library` opens the cache entry once,
  hashes that open file and returns `/proc/self/fd/N`: dlopen reopens the very inode that was hashed,
  so swapping the directory entry after the check loads nothing else (the earlier design hashed the
  path and then dlopened the path, which loads whatever the path names by then). The descriptor stays
  open for the life of the process: ctypes never unloads a library, and glibc finds an already
  loaded library by its path name, so a reused descriptor number must never name a different file.
  Where /proc/self/fd does not exist (not Linux) the entry's path is returned; only this user can
  write in the directory it lives in.

Old entries are removed after a new one is written: beyond `MAX_ENTRIES` or `MAX_BYTES` (most
recently used kept), but only entries unused for `MIN_AGE_S`. Removing an entry cannot break a
process that uses it: it holds the file open, and a process that finds the entry gone writes it again.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import re
import secrets
import shutil
import stat
import tempfile
import threading
import time
import warnings

__all__ = [
    "MAX_BYTES",
    "MAX_ENTRIES",
    "MIN_AGE_S",
    "UnsafeCacheDirectory",
    "cache_dir",
    "clean_cache",
    "install_library",
    "open_private_directory",
]

MAX_ENTRIES = 64
MAX_BYTES = 1 << 30
MIN_AGE_S = 24 * 3600
ENTRY = re.compile(r"[0-9a-f]{64}\.so")
TEMPORARY = re.compile(r"\.[0-9a-f]{16}\.[0-9a-f]+\.tmp")
PROC_FD = "/proc/self/fd"
_CHUNK = 1 << 20
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

_lock = threading.Lock()
# (directory, sha256) -> descriptor of the verified entry, open for the life of the process.
_open_entries: dict[tuple[str, str], int] = {}
_process_dir: list[str] = []


class UnsafeCacheDirectory(OSError):
    """A cache directory that another user could write to (or swap); the message says why."""


def cache_dir() -> str:
    """`$AOTC_RUNTIME_CACHE`, else `$XDG_CACHE_HOME/aotc_runtime`, else `~/.cache/aotc_runtime`."""
    explicit = os.environ.get("AOTC_RUNTIME_CACHE")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "aotc_runtime")


def _shared_tmp_dir() -> str:
    return os.path.join(tempfile.gettempdir(), f"aotc_runtime-{os.getuid()}")


def open_private_directory(path: str) -> int:
    """A descriptor of directory `path`, created 0700 if missing, after checking that only this
    user can write to it; raises UnsafeCacheDirectory (or another OSError) otherwise."""
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeCacheDirectory(f"{path}: is a symbolic link, not a directory of this user's")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeCacheDirectory(f"{path}: is not a directory")
    if st.st_uid != os.getuid():
        raise UnsafeCacheDirectory(
            f"{path}: is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
        )
    if st.st_mode & 0o022:
        raise UnsafeCacheDirectory(
            f"{path}: is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); it must be 0700"
        )
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW | _CLOEXEC)
    opened = os.fstat(fd)
    if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)
        raise UnsafeCacheDirectory(f"{path}: was replaced while being checked")
    return fd


def install_library(data: bytes | memoryview, sha256: str) -> str:
    """The path to dlopen for a library holding `data` (whose sha256 is `sha256`), cached privately:
    `/proc/self/fd/N` of the verified entry on Linux, else the entry's path (see the module notes)."""
    errors = []
    with _lock:
        for directory in _candidates():
            key = (directory, sha256)
            if key in _open_entries:
                return _path_to_load(_open_entries[key], directory, sha256)
            try:
                fd = _install(directory, data, sha256)
            except UnsafeCacheDirectory as err:
                warnings.warn(
                    f"aotc_runtime: not using the library cache {err}", RuntimeWarning, stacklevel=2
                )
                errors.append(str(err))
                continue
            except OSError as err:
                errors.append(f"{directory}: {err}")
                continue
            if not os.path.isdir(PROC_FD):
                os.close(fd)
                return os.path.join(directory, f"{sha256}.so")
            _open_entries[key] = fd
            return _path_to_load(fd, directory, sha256)
    raise OSError("cannot write the kernel library to a private cache directory: " + "; ".join(errors))


def _candidates():
    """Cache directories to try in order; the last, made fresh for this process, only if reached."""
    yield from dict.fromkeys((cache_dir(), _shared_tmp_dir()))
    if not _process_dir:
        _process_dir.append(tempfile.mkdtemp(prefix="aotc_runtime-"))
        atexit.register(shutil.rmtree, _process_dir[0], True)
    yield _process_dir[0]


def _path_to_load(fd: int, directory: str, sha256: str) -> str:
    return f"{PROC_FD}/{fd}" if os.path.isdir(PROC_FD) else os.path.join(directory, f"{sha256}.so")


def _install(directory: str, data: bytes | memoryview, sha256: str) -> int:
    """A read-only descriptor of `directory`'s verified entry for `sha256`, written there if needed."""
    name = f"{sha256}.so"
    dir_fd = open_private_directory(directory)
    try:
        fd = _open_entry(dir_fd, name)
        if fd is not None:
            if _fd_sha256(fd) == sha256:
                now = time.time()
                with contextlib.suppress(OSError):  # the access time is the entry's last use
                    os.utime(fd, (now, os.fstat(fd).st_mtime))
                return fd
            os.close(fd)
        fd = _write_entry(dir_fd, name, data)
        if _fd_sha256(fd) != sha256:
            os.close(fd)
            raise ValueError(f"kernel library data does not match its sha256 {sha256[:16]}...")
        with contextlib.suppress(OSError):
            clean_cache(directory, keep=name)
        return fd
    finally:
        os.close(dir_fd)


def _open_entry(dir_fd: int, name: str) -> int | None:
    """A read-only descriptor of the regular file `name`, or None when it is missing or not one."""
    try:
        fd = os.open(name, os.O_RDONLY | _NOFOLLOW | _CLOEXEC, dir_fd=dir_fd)
    except OSError:  # missing, or a symlink (ELOOP): either way it is written afresh
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def _write_entry(dir_fd: int, name: str, data: bytes | memoryview) -> int:
    """Write `data` to a new file, rename it to `name`; returns a read-only descriptor of that file."""
    tmp = f".{name[:16]}.{secrets.token_hex(8)}.tmp"
    wfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o500, dir_fd=dir_fd)
    try:
        with os.fdopen(wfd, "wb") as f:
            f.write(data)
        fd = os.open(tmp, os.O_RDONLY | _NOFOLLOW | _CLOEXEC, dir_fd=dir_fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    return fd


def _fd_sha256(fd: int) -> str:
    digest = hashlib.sha256()
    offset = 0
    while block := os.pread(fd, _CHUNK, offset):
        digest.update(block)
        offset += len(block)
    return digest.hexdigest()


def clean_cache(
    directory: str,
    keep: str = "",
    max_entries: int = MAX_ENTRIES,
    max_bytes: int = MAX_BYTES,
    min_age_s: float = MIN_AGE_S,
    now: float | None = None,
) -> list[str]:
    """Remove the entries beyond the newest `max_entries` / `max_bytes` (by last use) that have gone
    unused for `min_age_s`, and abandoned temporary files as old; never `keep`. Returns the names removed."""
    now = time.time() if now is None else now
    entries = []
    removed = []
    dir_fd = open_private_directory(directory)
    try:
        with os.scandir(dir_fd) as it:
            for item in it:
                try:
                    st = item.stat(follow_symlinks=False)
                except OSError:
                    continue
                last_use = max(st.st_atime, st.st_mtime)
                if TEMPORARY.fullmatch(item.name) and now - last_use > min_age_s:
                    removed.append(item.name)
                elif ENTRY.fullmatch(item.name):
                    entries.append((item.name == keep, last_use, st.st_size, item.name))
        entries.sort(reverse=True)  # `keep` first, then the most recently used
        size = 0
        for count, (_, last_use, nbytes, name) in enumerate(entries, 1):
            size += nbytes
            if (count > max_entries or size > max_bytes) and name != keep and now - last_use > min_age_s:
                removed.append(name)
        for name in removed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    return removed
