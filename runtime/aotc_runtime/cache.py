"""A per-user cache of extracted kernel libraries, keyed by their sha256."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile

__all__ = ["cache_dir", "install_library"]


def cache_dir() -> str:
    """`$AOTC_RUNTIME_CACHE`, else `$XDG_CACHE_HOME/aotc_runtime`, else `~/.cache/aotc_runtime`."""
    explicit = os.environ.get("AOTC_RUNTIME_CACHE")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "aotc_runtime")


def _fallback_dir() -> str:
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    return os.path.join(tempfile.gettempdir(), f"aotc_runtime-{uid}")


def install_library(data: bytes | memoryview, sha256: str) -> str:
    """Path of a cached file holding `data` (whose sha256 is `sha256`), written there if needed."""
    errors = []
    for directory in dict.fromkeys((cache_dir(), _fallback_dir())):
        try:
            return _install(directory, data, sha256)
        except OSError as err:
            errors.append(f"{directory}: {err}")
    raise OSError("cannot write the kernel library to a cache directory: " + "; ".join(errors))


def _install(directory: str, data: bytes | memoryview, sha256: str) -> str:
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory, f"{sha256}.so")
    if os.path.isfile(path) and _file_sha256(path) == sha256:
        return path
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{sha256[:16]}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def _file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
