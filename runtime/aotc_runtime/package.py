"""Reading and verifying aotc packages: a zip of manifest.json, lib/model.so and weights.bin."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "LIBRARY",
    "MANIFEST",
    "WEIGHTS",
    "PackageContents",
    "PackageError",
    "aligned_empty",
    "check_host",
    "host_arch",
    "read_manifest",
    "read_package",
    "verify_package",
]

FORMAT = "aotc-package"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
LIBRARY = "lib/model.so"
WEIGHTS = "weights.bin"
ALIGNMENT = 64
_CHUNK = 1 << 20
_MAX_MANIFEST_BYTES = 64 << 20


class PackageError(ValueError):
    """The file is not a usable aotc package; the message names the file and what is wrong."""


@dataclass(frozen=True)
class PackageContents:
    """A verified package: its manifest, library image and 64-byte aligned weights blob."""

    manifest: dict
    library: np.ndarray
    weights: np.ndarray


def aligned_empty(nbytes: int, alignment: int = ALIGNMENT) -> np.ndarray:
    """An uninitialised uint8 array of `nbytes` whose data starts on an `alignment`-byte boundary."""
    raw = np.empty(nbytes + alignment, np.uint8)
    start = (-raw.__array_interface__["data"][0]) % alignment
    return raw[start : start + nbytes]


def read_manifest(path: str) -> dict:
    """The manifest of the package at `path`, after checking format and version (not checksums)."""
    with _open_zip(path) as zf:
        return _load_manifest(zf, path)


def verify_package(path: str) -> dict:
    """Check format, version and the sha256 of every member; return the manifest."""
    with _open_zip(path) as zf:
        manifest = _load_manifest(zf, path)
        _check_member_list(zf, manifest, path)
        for name, entry in manifest["members"].items():
            _read_member(zf, name, path, entry["sha256"], keep=False)
        return manifest


def read_package(path: str) -> PackageContents:
    """Verify the package at `path` for this host and read its library and weights into memory."""
    with _open_zip(path) as zf:
        manifest = _load_manifest(zf, path)
        check_host(manifest, path)
        _check_member_list(zf, manifest, path)
        members = manifest["members"]
        library = _read_member(zf, LIBRARY, path, members[LIBRARY]["sha256"])
        weights = _read_member(zf, WEIGHTS, path, members[WEIGHTS]["sha256"])
        for name in members.keys() - {LIBRARY, WEIGHTS}:
            _read_member(zf, name, path, members[name]["sha256"], keep=False)
    return PackageContents(manifest, library, weights)


# ----------------------------------------------------------------------------- zip access


@contextmanager
def _open_zip(path: str) -> Iterator[zipfile.ZipFile]:
    path = os.fspath(path)
    if not zipfile.is_zipfile(path):
        with open(path, "rb") as f:
            head = f.read(4)
        if head == b"PK\x03\x04":
            raise PackageError(f"{path} is truncated or damaged (its zip directory is missing)")
        raise PackageError(f"{path} is not an aotc package (not a zip file)")
    try:
        with zipfile.ZipFile(path) as zf:
            yield zf
    except (zipfile.BadZipFile, EOFError, zlib.error, NotImplementedError) as err:
        raise PackageError(f"{path} is damaged: {err}") from None


def _read_member(
    zf: zipfile.ZipFile, name: str, path: str, sha256: str | None = None, keep: bool = True
) -> np.ndarray:
    """The member's bytes (64-byte aligned), checking the zip CRC and, if given, its sha256."""
    info = zf.getinfo(name)
    buf = aligned_empty(info.file_size if keep else min(info.file_size, _CHUNK))
    view = memoryview(buf)
    digest = hashlib.sha256()
    try:
        with zf.open(info) as f:
            pos = 0
            while pos < info.file_size:
                chunk = view[pos : pos + _CHUNK] if keep else view[: info.file_size - pos]
                n = f.readinto(chunk)
                if not n:
                    raise PackageError(f"{path}: member {name} is truncated")
                digest.update(chunk[:n])
                pos += n
            if f.read(1):
                raise PackageError(f"{path}: member {name} is longer than its zip entry says")
    except zipfile.BadZipFile as err:
        reason = "zip CRC mismatch" if "CRC" in str(err) else str(err)
        raise PackageError(f"{path}: member {name} is corrupted ({reason})") from None
    except (EOFError, zlib.error, OSError) as err:
        raise PackageError(f"{path}: member {name} is corrupted ({err})") from None
    if sha256 is not None and digest.hexdigest() != sha256:
        raise PackageError(f"{path}: member {name} is corrupted (sha256 mismatch)")
    return buf


# ----------------------------------------------------------------------------- manifest


def _load_manifest(zf: zipfile.ZipFile, path: str) -> dict:
    try:
        info = zf.getinfo(MANIFEST)
    except KeyError:
        raise PackageError(
            f"{path} is not an aotc package (foreign file: a zip without {MANIFEST})"
        ) from None
    if info.file_size > _MAX_MANIFEST_BYTES:
        raise PackageError(f"{path}: {MANIFEST} is implausibly large ({info.file_size} bytes)")
    raw = _read_member(zf, MANIFEST, path).tobytes()
    try:
        manifest = json.loads(raw)
    except ValueError as err:
        raise PackageError(f"{path}: {MANIFEST} is not valid JSON ({err})") from None
    fmt = manifest.get("format") if isinstance(manifest, dict) else None
    if fmt != FORMAT:
        raise PackageError(
            f"{path} is not an aotc package (foreign file: {MANIFEST} has format {fmt!r}, expected {FORMAT!r})"
        )
    _check_version(manifest.get("format_version"), path)
    _check_schema(manifest, path)
    return manifest


def _check_version(version: object, path: str) -> None:
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise PackageError(f"{path}: {MANIFEST} has an invalid format_version {version!r}")
    if version > FORMAT_VERSION:
        raise PackageError(
            f"{path}: package format version {version} is newer than this runtime supports "
            f"({FORMAT_VERSION}); upgrade aotc-runtime"
        )


_FIELDS = {
    "name": str,
    "target": str,
    "triple": str,
    "entry": str,
    "inputs": list,
    "outputs": list,
    "kernels": list,
    "execution_plan": list,
    "memory_plan": dict,
    "weights": dict,
    "members": dict,
    "provenance": dict,
}


def _check_schema(manifest: dict, path: str) -> None:
    for key, kind in _FIELDS.items():
        if not isinstance(manifest.get(key), kind):
            raise PackageError(f"{path}: {MANIFEST} lacks {key!r} (or it is not a {kind.__name__})")
    for group in ("inputs", "outputs"):
        for i, t in enumerate(manifest[group]):
            _check_tensor(t, f"{group}[{i}]", path)
    workspace = manifest["memory_plan"].get("workspace_bytes")
    if not isinstance(workspace, int) or workspace < 0:
        raise PackageError(f"{path}: {MANIFEST} memory_plan.workspace_bytes is {workspace!r}")
    for name in (LIBRARY, WEIGHTS):
        if name not in manifest["members"]:
            raise PackageError(f"{path}: {MANIFEST} does not list the member {name}")
    for name, entry in manifest["members"].items():
        if not (isinstance(entry, dict) and isinstance(entry.get("sha256"), str)):
            raise PackageError(f"{path}: {MANIFEST} has no sha256 for member {name}")


def _check_tensor(t: object, where: str, path: str) -> None:
    ok = (
        isinstance(t, dict)
        and isinstance(t.get("name"), str)
        and isinstance(t.get("shape"), list)
        and all(isinstance(d, int) and d >= 0 for d in t["shape"])
        and isinstance(t.get("dtype"), str)
    )
    if not ok:
        raise PackageError(f"{path}: {MANIFEST} {where} must have a name, a shape of ints and a dtype")
    try:
        np.dtype(t["dtype"])
    except TypeError:
        raise PackageError(f"{path}: {MANIFEST} {where} has an unknown dtype {t['dtype']!r}") from None


def _check_member_list(zf: zipfile.ZipFile, manifest: dict, path: str) -> None:
    names = zf.namelist()
    if len(names) != len(set(names)):
        raise PackageError(f"{path} is damaged: it holds a member name twice")
    present, listed = set(names) - {MANIFEST}, set(manifest["members"])
    for name in sorted(listed - present):
        raise PackageError(f"{path}: member {name} is missing")
    for name in sorted(present - listed):
        raise PackageError(f"{path}: member {name} is not listed in {MANIFEST}")
    for name in sorted(listed):
        size = manifest["members"][name].get("size")
        if size is not None and zf.getinfo(name).file_size != size:
            raise PackageError(f"{path}: member {name} is corrupted (size mismatch)")


# ----------------------------------------------------------------------------- host compatibility

_ARCH_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}
_X86_FLAGS = {
    "avx": "avx",
    "avx2": "avx2",
    "fma": "fma",
    "f16c": "f16c",
    "avx512f": "avx512f",
    "avx512bw": "avx512bw",
    "avx512dq": "avx512dq",
    "avx512vl": "avx512vl",
    "avx512cd": "avx512cd",
    "avx512vnni": "avx512_vnni",
    "avx512bf16": "avx512_bf16",
    "avx512fp16": "avx512_fp16",
    "avxvnni": "avx_vnni",
}


def _arch(name: str) -> str:
    name = _ARCH_ALIASES.get(name.lower(), name.lower())
    if name.startswith(("arm", "thumb")):
        return "arm"
    return name


def host_arch() -> str:
    """This machine's architecture as it appears in a target triple (x86_64, aarch64, arm)."""
    return _arch(platform.machine())


def check_host(manifest: dict, path: str) -> None:
    """Refuse a package built for another architecture, OS or for CPU features this host lacks."""
    triple = manifest["triple"]
    arch, host = _arch(triple.split("-")[0]), host_arch()
    if arch != host:
        raise PackageError(
            f"{path} was compiled for {arch} ({triple}) but this host is {host}; "
            "rebuild it with a target for this machine"
        )
    if "linux" in triple and not sys.platform.startswith("linux"):
        raise PackageError(f"{path} was compiled for Linux ({triple}) but this host runs {sys.platform}")
    missing = _missing_cpu_features(manifest["target"], arch)
    if missing:
        raise PackageError(
            f"{path} needs CPU features this host lacks: {', '.join(missing)} (target {manifest['target']!r})"
        )


def _missing_cpu_features(target: str, arch: str) -> list[str]:
    if arch != "x86_64" or not os.path.exists("/proc/cpuinfo"):
        return []
    wanted = [
        f[1:]
        for word in target.split()
        if word.startswith("-mattr=")
        for f in word[len("-mattr=") :].split(",")
        if f.startswith("+") and f[1:] in _X86_FLAGS
    ]
    if not wanted:
        return []
    flags = _host_cpu_flags()
    return [f for f in wanted if _X86_FLAGS[f] not in flags]


def _host_cpu_flags() -> set[str]:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()
