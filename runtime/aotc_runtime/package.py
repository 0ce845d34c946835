"""Reading and verifying aotc packages: a zip of manifest.json, lib/model.so and weights.bin.

Nothing in a package is believed before it is checked, and no code of it runs before that: the manifest
lists the sha256 and size of every other member, the kernel library carries its own execution plan in an
ELF section (read from its bytes, see `plan` and `elf`), every execution-critical manifest field must equal
that plan, and the plan must be self-consistent. The package digest is the sha256 of manifest.json's bytes,
which therefore covers the whole package; `signature.json`, the one member the manifest does not list,
is returned uninterpreted.

A GPU package (target `opencl` or `cuda -arch=sm_XX`) holds no library: its plan is the member plan.json
(the same document, each kernel with its launches) and its kernels are `GPU_KERNEL_MEMBERS[kind]`; the
manifest must equal plan.json as it must equal a library's plan (`read_gpu_package`).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import sys
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from aotc_runtime.elf import ElfError, read_elf
from aotc_runtime.plan import (
    PLAN_SECTION,
    ModelPlan,
    PlanError,
    check_manifest_matches,
    parse_plan,
)

__all__ = [
    "CPU_FLAGS",
    "FORMAT",
    "FORMAT_VERSION",
    "GPU_KERNEL_MEMBERS",
    "GPU_PLAN",
    "LIBRARY",
    "MANIFEST",
    "RUNTIME_SYMBOLS",
    "SIGNATURE",
    "WEIGHTS",
    "GPUPackageContents",
    "PackageContents",
    "PackageError",
    "VerifiedPackage",
    "aligned_empty",
    "check_host",
    "gpu_kind",
    "host_arch",
    "read_gpu_package",
    "read_manifest",
    "read_package",
    "verify_package",
]

FORMAT = "aotc-package"
FORMAT_VERSION = 2
MANIFEST = "manifest.json"
LIBRARY = "lib/model.so"
WEIGHTS = "weights.bin"
SIGNATURE = "signature.json"
GPU_PLAN = "plan.json"
# the kernels of a GPU package per kind: OpenCL C source; CUDA cubin (for the target's arch), PTX (for the
# driver to compile on other GPUs) and the CUDA source they were compiled from (for people to read)
GPU_KERNEL_MEMBERS = {
    "opencl": ("kernels.cl",),
    "cuda": ("kernels.cubin", "kernels.ptx", "kernels.cu"),
}
# functions of the package's thread pool that CompiledModel calls besides the plan's
RUNTIME_SYMBOLS = ("aotc_get_max_threads", "aotc_set_num_threads", "aotc_set_call_threads")
ALIGNMENT = 64
_CHUNK = 1 << 20
_MAX_MANIFEST_BYTES = 64 << 20
_MAX_SIGNATURE_BYTES = 1 << 20
_MAX_DEFLATE_RATIO = 1100  # deflate never expands data more than ~1032x
_SHA256_RE = re.compile(r"[0-9a-f]{64}\Z")


class PackageError(ValueError):
    """The file is not a usable aotc package; the message names the file and what is wrong."""


@dataclass(frozen=True)
class VerifiedPackage:
    """A package whose members, checksums and plan were checked (not yet against this host).
    `digest` is the sha256 of manifest.json; `signature` the raw bytes of signature.json, if any."""

    manifest: dict
    digest: str
    plan: ModelPlan
    signature: bytes | None


@dataclass(frozen=True)
class GPUPackageContents:
    """A GPU package, verified: its manifest, checked plan (with launches), 64-byte aligned weights, the
    bytes of each kernel member by name, digest and signature bytes."""

    manifest: dict
    kind: str
    weights: np.ndarray
    kernels: dict[str, bytes]
    digest: str
    plan: ModelPlan
    signature: bytes | None = None


@dataclass(frozen=True)
class PackageContents:
    """A package verified for this host: its manifest, checked plan, library image and 64-byte aligned
    weights blob, digest and signature bytes."""

    manifest: dict
    library: np.ndarray
    weights: np.ndarray
    digest: str
    plan: ModelPlan
    signature: bytes | None = None


def aligned_empty(nbytes: int, alignment: int = ALIGNMENT) -> np.ndarray:
    """An uninitialised uint8 array of `nbytes` whose data starts on an `alignment`-byte boundary."""
    raw = np.empty(nbytes + alignment, np.uint8)
    start = (-raw.__array_interface__["data"][0]) % alignment
    return raw[start : start + nbytes]


def gpu_kind(target: object) -> str | None:
    """The GPU kind of a target string: "opencl" (`opencl`), "cuda" (`cuda -arch=sm_90`), else None."""
    kind = target.split(" ", 1)[0] if isinstance(target, str) else None
    return kind if kind in GPU_KERNEL_MEMBERS else None


def read_manifest(path: str) -> dict:
    """The manifest of the package at `path`, after checking format and version (not checksums)."""
    with _open_zip(path) as zf:
        return _load_manifest(zf, path)[0]


def verify_package(path: str) -> VerifiedPackage:
    """Check format, version, every member's size and sha256, and the manifest against the kernel
    library's plan (a GPU package's plan.json). Runs no code of the package and needs no particular host."""
    with _open_zip(path) as zf:
        manifest, digest = _load_manifest(zf, path)
        if gpu_kind(manifest["target"]):
            plan = _check_gpu_plan(zf, manifest, path)
        else:
            plan = _check_library(zf, manifest, path)[0]
        _read_member(zf, WEIGHTS, path, manifest["members"][WEIGHTS]["sha256"], keep=False)
        _check_other_members(zf, manifest, path)
        return VerifiedPackage(manifest, digest, plan, _read_signature(zf, path))


def read_package(path: str) -> PackageContents:
    """Verify the package at `path` completely and for this host; read its library and weights.
    A GPU package is refused here: `read_gpu_package` reads it."""
    with _open_zip(path) as zf:
        manifest, digest = _load_manifest(zf, path)
        kind = gpu_kind(manifest["target"])
        if kind:
            raise PackageError(
                f"{path} holds {kind} GPU kernels (target {manifest['target']!r}), not a CPU library; "
                "aotc_runtime.load runs it on a GPU"
            )
        plan, library = _check_library(zf, manifest, path)
        check_host(manifest, path)
        # the whole weights buffer: what weights.bin holds, then room for the weights computed at load
        weights = _read_member(
            zf, WEIGHTS, path, manifest["members"][WEIGHTS]["sha256"], room=plan.weights_nbytes
        )
        _check_other_members(zf, manifest, path)
        signature = _read_signature(zf, path)
    return PackageContents(manifest, library, weights, digest, plan, signature)


def read_gpu_package(path: str) -> GPUPackageContents:
    """Verify the GPU package at `path` completely (checksums, plan.json and the manifest against it)
    and read its weights and kernels; no device is touched."""
    with _open_zip(path) as zf:
        manifest, digest = _load_manifest(zf, path)
        kind = gpu_kind(manifest["target"])
        if kind is None:
            raise PackageError(f"{path} is a CPU package (target {manifest['target']!r}), not a GPU one")
        plan = _check_gpu_plan(zf, manifest, path)
        weights = _read_member(zf, WEIGHTS, path, manifest["members"][WEIGHTS]["sha256"])
        kernels = {
            name: _read_member(zf, name, path, manifest["members"][name]["sha256"]).tobytes()
            for name in GPU_KERNEL_MEMBERS[kind]
        }
        _check_other_members(zf, manifest, path, GPU_KERNEL_MEMBERS[kind])
        signature = _read_signature(zf, path)
    return GPUPackageContents(manifest, kind, weights, kernels, digest, plan, signature)


def _check_gpu_plan(zf: zipfile.ZipFile, manifest: dict, path: str) -> ModelPlan:
    """plan.json, checked and equal to the manifest's execution-critical fields."""
    _check_member_list(zf, manifest, path)
    if zf.getinfo(GPU_PLAN).file_size > _MAX_MANIFEST_BYTES:
        raise PackageError(f"{path}: {GPU_PLAN} is implausibly large")
    raw = _read_member(zf, GPU_PLAN, path, manifest["members"][GPU_PLAN]["sha256"]).tobytes()
    try:
        plan = parse_plan(raw, gpu=True)
        check_manifest_matches(manifest, plan)
    except PlanError as err:
        raise PackageError(f"{path}: {GPU_PLAN}: {err}") from None
    if zf.getinfo(WEIGHTS).file_size != plan.weights_nbytes:
        raise PackageError(
            f"{path}: member {WEIGHTS} holds {zf.getinfo(WEIGHTS).file_size} bytes "
            f"but {GPU_PLAN} says {plan.weights_nbytes}"
        )
    return plan


def _check_library(zf: zipfile.ZipFile, manifest: dict, path: str) -> tuple[ModelPlan, np.ndarray]:
    _check_member_list(zf, manifest, path)
    library = _read_member(zf, LIBRARY, path, manifest["members"][LIBRARY]["sha256"])
    plan = _library_plan(library.tobytes(), manifest, path)
    if zf.getinfo(WEIGHTS).file_size != plan.weights_stored_nbytes:
        raise PackageError(
            f"{path}: member {WEIGHTS} holds {zf.getinfo(WEIGHTS).file_size} bytes "
            f"but the kernel library was compiled for {plan.weights_stored_nbytes}"
        )
    return plan, library


def _library_plan(library: bytes, manifest: dict, path: str) -> ModelPlan:
    """The kernel library's own plan, after checking it and the manifest against it."""
    try:
        image = read_elf(library)
        raw = image.section(PLAN_SECTION)
        defined = image.defined_functions()
    except ElfError as err:
        raise PackageError(
            f"{path}: its kernel library {LIBRARY} is not a well-formed ELF file ({err})"
        ) from None
    triple = manifest["triple"]
    if image.arch != _arch(triple.split("-")[0]):
        raise PackageError(
            f"{path}: its kernel library is {image.arch} code but manifest.json triple is {triple!r}"
        )
    if raw is None:
        raise PackageError(
            f"{path}: its kernel library carries no execution plan ({PLAN_SECTION} section); rebuild it with this aotc"
        )
    try:
        if not raw.endswith(b"\0"):
            raise PlanError(f"the {PLAN_SECTION} section is not NUL-terminated")
        plan = parse_plan(raw[:-1])
    except PlanError as err:
        raise PackageError(f"{path}: its kernel library's plan is unusable: {err}") from None
    try:
        check_manifest_matches(manifest, plan)
    except PlanError as err:
        raise PackageError(f"{path}: {err}") from None
    wanted = dict.fromkeys((*plan.symbols, *plan.kernels, *RUNTIME_SYMBOLS))
    missing = [s for s in wanted if s not in defined]
    if missing:
        raise PackageError(
            f"{path}: its kernel library does not define {', '.join(missing)}, which the plan calls"
        )
    return plan


def _check_other_members(zf: zipfile.ZipFile, manifest: dict, path: str, read: tuple[str, ...] = ()) -> None:
    """Check the sha256 of every listed member but the library, weights, plan.json and those `read`."""
    read = (LIBRARY, WEIGHTS, GPU_PLAN, *read)
    for name, entry in manifest["members"].items():
        if name not in read:
            _read_member(zf, name, path, entry["sha256"], keep=False)


def _read_signature(zf: zipfile.ZipFile, path: str) -> bytes | None:
    if SIGNATURE not in zf.NameToInfo:
        return None
    if zf.getinfo(SIGNATURE).file_size > _MAX_SIGNATURE_BYTES:
        raise PackageError(f"{path}: member {SIGNATURE} is implausibly large")
    return _read_member(zf, SIGNATURE, path).tobytes()


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
    zf: zipfile.ZipFile,
    name: str,
    path: str,
    sha256: str | None = None,
    keep: bool = True,
    room: int = 0,
) -> np.ndarray:
    """The member's bytes (64-byte aligned), checking the zip CRC and, if given, its sha256; with `room`,
    in a buffer of that many bytes at least, zero past the member (where derived weights go)."""
    info = zf.getinfo(name)
    stored = info.compress_type == zipfile.ZIP_STORED
    if (stored and info.file_size != info.compress_size) or (
        info.file_size > _MAX_DEFLATE_RATIO * info.compress_size + _CHUNK
    ):
        raise PackageError(f"{path}: member {name} is damaged (implausible size {info.file_size})")
    if info.header_offset + info.compress_size > _archive_size(zf):
        raise PackageError(f"{path}: member {name} is truncated")
    buf = aligned_empty(max(info.file_size, room) if keep else min(info.file_size, _CHUNK))
    if keep and room > info.file_size:
        buf[info.file_size :] = 0
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


def _archive_size(zf: zipfile.ZipFile) -> int:
    fp = zf.fp
    here = fp.tell()
    size = fp.seek(0, os.SEEK_END)
    fp.seek(here)
    return size


# ----------------------------------------------------------------------------- manifest


def _load_manifest(zf: zipfile.ZipFile, path: str) -> tuple[dict, str]:
    """The checked manifest and its digest (the sha256 of its bytes)."""
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
        manifest = json.loads(raw, object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError) as err:
        raise PackageError(f"{path}: {MANIFEST} is not valid JSON ({err})") from None
    fmt = manifest.get("format") if isinstance(manifest, dict) else None
    if fmt != FORMAT:
        raise PackageError(
            f"{path} is not an aotc package (foreign file: {MANIFEST} has format {fmt!r}, expected {FORMAT!r})"
        )
    _check_version(manifest.get("format_version"), path)
    _check_schema(manifest, path)
    return manifest, hashlib.sha256(raw).hexdigest()


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"a key appears twice among {sorted(keys)}")
    return dict(pairs)


def _check_version(version: object, path: str) -> None:
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise PackageError(f"{path}: {MANIFEST} has an invalid format_version {version!r}")
    if version > FORMAT_VERSION:
        raise PackageError(
            f"{path}: package format version {version} is newer than this runtime supports "
            f"({FORMAT_VERSION}); upgrade aotc-runtime"
        )
    if version < FORMAT_VERSION:
        raise PackageError(
            f"{path}: package format {version} predates plan checks; rebuild it with this aotc"
        )


_FIELDS = {
    "name": str,
    "target": str,
    "triple": str,
    "entry": str,
    "requires": list,
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
    """The types of the fields readers of the manifest use; their values are checked against the plan."""
    for key, kind in _FIELDS.items():
        if not isinstance(manifest.get(key), kind):
            raise PackageError(f"{path}: {MANIFEST} lacks {key!r} (or it is not a {kind.__name__})")
    for group in ("inputs", "outputs"):
        for i, t in enumerate(manifest[group]):
            _check_tensor(t, f"{group}[{i}]", path)
    if not all(isinstance(f, str) for f in manifest["requires"]):
        raise PackageError(f"{path}: {MANIFEST} requires must list CPU feature names")
    workspace = manifest["memory_plan"].get("workspace_bytes")
    if not isinstance(workspace, int) or isinstance(workspace, bool) or workspace < 0:
        raise PackageError(f"{path}: {MANIFEST} memory_plan.workspace_bytes is {workspace!r}")
    for i, k in enumerate(manifest["kernels"]):
        if not (isinstance(k, dict) and isinstance(k.get("symbol"), str)):
            raise PackageError(f"{path}: {MANIFEST} kernels[{i}] has no symbol")
    _check_weight_tensors(manifest["weights"], path)
    kind = gpu_kind(manifest["target"])
    for name in (GPU_PLAN, WEIGHTS, *GPU_KERNEL_MEMBERS[kind]) if kind else (LIBRARY, WEIGHTS):
        if name not in manifest["members"]:
            raise PackageError(f"{path}: {MANIFEST} does not list the member {name}")
    for name, entry in manifest["members"].items():
        _check_member_name(name, path)
        if name in (MANIFEST, SIGNATURE):
            raise PackageError(f"{path}: {MANIFEST} must not list {name} among its members")
        ok = (
            isinstance(entry, dict)
            and isinstance(entry.get("sha256"), str)
            and _SHA256_RE.match(entry["sha256"])
            and _is_count(entry.get("size"))
        )
        if not ok:
            raise PackageError(f"{path}: {MANIFEST} needs the sha256 and size of member {name}")


def _is_count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _check_weight_tensors(weights: dict, path: str) -> None:
    """The weights table `aotc inspect` shows: names, dtypes, shapes and places inside the blob."""
    tensors, nbytes = weights.get("tensors", []), weights.get("nbytes")
    if not (isinstance(tensors, list) and _is_count(nbytes)):
        raise PackageError(f"{path}: {MANIFEST} weights must have a byte count and a list of tensors")
    for i, t in enumerate(tensors):
        ok = (
            isinstance(t, dict)
            and isinstance(t.get("name"), str)
            and isinstance(t.get("dtype"), str)
            and isinstance(t.get("shape"), list)
            and _is_count(t.get("offset"))
            and _is_count(t.get("nbytes"))
            and t["offset"] + t["nbytes"] <= nbytes
        )
        if not ok:
            raise PackageError(
                f"{path}: {MANIFEST} weights.tensors[{i}] must have a name, dtype, shape, and an offset "
                "and nbytes inside the weights blob"
            )


def _check_member_name(name: str, path: str) -> None:
    parts = name.split("/")
    if name.startswith("/") or "\\" in name or "\0" in name or any(p in ("", ".", "..") for p in parts):
        raise PackageError(f"{path}: member name {name!r} is not a plain relative path")


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
    for name in names:
        _check_member_name(name, path)
    present, listed = set(names) - {MANIFEST, SIGNATURE}, set(manifest["members"])
    for name in sorted(listed - present):
        raise PackageError(f"{path}: member {name} is missing")
    for name in sorted(present - listed):
        raise PackageError(f"{path}: member {name} is not listed in {MANIFEST}")
    for name in sorted(listed):
        if zf.getinfo(name).file_size != manifest["members"][name]["size"]:
            raise PackageError(f"{path}: member {name} is corrupted (size mismatch)")


# ----------------------------------------------------------------------------- host compatibility

_ARCH_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}
# CPU feature (LLVM's name, as `requires` lists it) -> the flag /proc/cpuinfo shows for it, per architecture.
# The compiler resolves a target's features among these names (aotc.target.CPU_FEATURES is this table).
CPU_FLAGS: dict[str, dict[str, str]] = {
    "x86_64": {
        "sse3": "pni",
        "ssse3": "ssse3",
        "sse4.1": "sse4_1",
        "sse4.2": "sse4_2",
        "sse4a": "sse4a",
        "popcnt": "popcnt",
        "lzcnt": "abm",
        "bmi": "bmi1",
        "bmi2": "bmi2",
        "tbm": "tbm",
        "movbe": "movbe",
        "f16c": "f16c",
        "fma": "fma",
        "fma4": "fma4",
        "xop": "xop",
        "avx": "avx",
        "avx2": "avx2",
        "avxvnni": "avx_vnni",
        "avxifma": "avx_ifma",
        "avxvnniint8": "avx_vnni_int8",
        "avxneconvert": "avx_ne_convert",
        "gfni": "gfni",
        "avx512f": "avx512f",
        "avx512bw": "avx512bw",
        "avx512cd": "avx512cd",
        "avx512dq": "avx512dq",
        "avx512vl": "avx512vl",
        "avx512vnni": "avx512_vnni",
        "avx512bf16": "avx512_bf16",
        "avx512fp16": "avx512_fp16",
        "avx512ifma": "avx512ifma",
        "avx512vbmi": "avx512vbmi",
        "avx512vbmi2": "avx512_vbmi2",
        "avx512bitalg": "avx512_bitalg",
        "avx512vpopcntdq": "avx512_vpopcntdq",
    },
    "aarch64": {
        "fp-armv8": "fp",
        "neon": "asimd",
        "lse": "atomics",
        "rcpc": "lrcpc",
        "fullfp16": "asimdhp",
        "fp16fml": "asimdfhm",
        "dotprod": "asimddp",
        "i8mm": "i8mm",
        "bf16": "bf16",
        "cssc": "cssc",
        "mops": "mops",
        "sve": "sve",
        "sve2": "sve2",
    },
    "arm": {
        "vfp3": "vfpv3",
        "vfp4": "vfpv4",
        "d32": "vfpd32",
        "neon": "neon",
        "hwdiv-arm": "idiva",
    },
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
    """Refuse a package built for another architecture, OS or for CPU features this host lacks.
    The manifest must already have been checked against the kernel library's plan."""
    triple = manifest["triple"]
    arch, host = _arch(triple.split("-")[0]), host_arch()
    if arch != host:
        raise PackageError(
            f"{path} was compiled for {arch} ({triple}) but this host is {host}; "
            "rebuild it with a target for this machine"
        )
    if "linux" in triple and not sys.platform.startswith("linux"):
        raise PackageError(f"{path} was compiled for Linux ({triple}) but this host runs {sys.platform}")
    target = manifest["target"]
    known = CPU_FLAGS.get(arch, {})
    unknown = [f for f in manifest["requires"] if f not in known]
    if unknown:
        raise PackageError(
            f"{path} requires CPU features this runtime does not know for {arch}: {', '.join(unknown)} "
            f"(target {target!r}; built by a newer aotc? upgrade aotc-runtime)"
        )
    if not manifest["requires"]:
        return
    flags = _host_cpu_flags()
    if flags is None:
        raise PackageError(
            f"{path} requires CPU features {', '.join(manifest['requires'])} (target {target!r}) "
            "and this host's cannot be read (/proc/cpuinfo)"
        )
    missing = [f for f in manifest["requires"] if known[f] not in flags]
    if missing:
        raise PackageError(
            f"{path} needs CPU features this host lacks: {', '.join(missing)} (target {target!r})"
        )


# Arm Linux: per architecture, bit -> the flag /proc/cpuinfo shows, for AT_HWCAP and AT_HWCAP2 (asm/hwcap.h)
_HWCAP = {
    "aarch64": (
        {
            0: "fp",
            1: "asimd",
            8: "atomics",
            10: "asimdhp",
            15: "lrcpc",
            20: "asimddp",
            22: "sve",
            23: "asimdfhm",
        },
        {1: "sve2", 13: "i8mm", 14: "bf16", 34: "cssc", 43: "mops"},
    ),
    "arm": ({12: "neon", 13: "vfpv3", 16: "vfpv4", 17: "idiva", 19: "vfpd32"}, {}),
}
_AT_HWCAP, _AT_HWCAP2 = 16, 26


def _host_cpu_flags() -> set[str] | None:
    """The CPU flags /proc/cpuinfo lists (x86 `flags`, Arm `Features`), or None where it cannot be read.
    On AArch64 Linux they come from the kernel's hardware capability bits instead (getauxval), which
    hold under qemu-user too, where /proc/cpuinfo shows the host's CPU."""
    if host_arch() in _HWCAP and sys.platform.startswith("linux"):
        return _hwcap_flags(*_HWCAP[host_arch()])
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key = line.split(":", 1)[0].strip()
                if key in ("flags", "Features"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        return None
    return set()


def _hwcap_flags(bits: dict[int, str], bits2: dict[int, str]) -> set[str] | None:
    import ctypes

    try:
        getauxval = ctypes.CDLL(None).getauxval
    except (OSError, AttributeError):
        return None
    getauxval.restype, getauxval.argtypes = ctypes.c_ulong, [ctypes.c_ulong]
    hwcap, hwcap2 = getauxval(_AT_HWCAP), getauxval(_AT_HWCAP2)
    return {f for b, f in bits.items() if hwcap >> b & 1} | {f for b, f in bits2.items() if hwcap2 >> b & 1}
