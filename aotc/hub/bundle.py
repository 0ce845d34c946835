"""Tophub bundles: the best record per workload for a target, with provenance and a sha256 manifest.

A bundle is a zip (or a directory) holding `manifest.json` and `records.jsonl`. The manifest lists the
sha256, size and line count of every member, who exported it (user@host, host CPU, when), and per
workload the record's provenance: where and when it was measured, the trials spent on that workload
and the measurement noise (relative standard deviation of the record's repeated costs). A bundle is
only ever read whole and verified first; a damaged one is refused with the reason.

Bundles come from other teams and servers, so their size is bounded before anything is decompressed:
at most `MAX_BUNDLE_MEMBERS` members and `MAX_BUNDLE_BYTES` in all (as the zip's infos declare them,
and as read), each member compressed at most `MAX_COMPRESSION_RATIO` : 1 (records compress about 10:1;
a zip bomb, thousands). A URL pinned with `#sha256=` is only ever satisfied by bytes with that hash.
"""

from __future__ import annotations

import getpass
import hashlib
import io
import json
import math
import os
import platform
import re
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from aotc_runtime.signing import SIGNATURE_MEMBER, SignatureError, check_signature

from aotc import __version__
from aotc.files import write_atomic
from aotc.hub.store import HubError, TargetKey, best_per_key, download_cache_dir
from aotc.search.records import RECORD_VERSION, Record, host_info, parse_record_lines

BUNDLE_FORMAT = "aotc-tophub-bundle"
BUNDLE_VERSION = 1
MANIFEST = "manifest.json"
RECORDS = "records.jsonl"
DOWNLOAD_TIMEOUT_S = 30
MAX_BUNDLE_BYTES = 64 << 20
MAX_BUNDLE_MEMBERS = 16
MAX_COMPRESSION_RATIO = 200


class BundleError(HubError):
    """A bundle that fails verification."""


class HubWarning(UserWarning):
    """A source that was skipped or only partly usable."""


@dataclass
class Bundle:
    """A verified bundle. `digest` is the sha256 of its manifest.json (which lists every other member's
    sha256); `signature` says who signed that digest ("unsigned", or "verified"/"untrusted-key" and the key)."""

    path: str
    manifest: dict
    records: list[Record]
    digest: str = ""
    signature: str = "unsigned"


# ----------------------------------------------------------------------------- writing


def who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid{os.getuid()}"
    return f"{user}@{platform.node() or 'unknown-host'}"


def relative_noise(costs: list[float]) -> float | None:
    """Population standard deviation / mean of a record's repeated costs; None with fewer than two."""
    if len(costs) < 2:
        return None
    mean = sum(costs) / len(costs)
    var = sum((c - mean) ** 2 for c in costs) / len(costs)
    return math.sqrt(var) / mean if mean > 0 else None


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if ts else ""


def bundle_bytes(
    records: Iterable[Record], target: TargetKey, sign_key: str | os.PathLike | None = None
) -> tuple[bytes, dict]:
    """The zip of the best record per workload of `records` for `target`, and its manifest; with
    `sign_key` (Ed25519 private key PEM), also `signature.json` over the manifest's sha256."""
    records = list(records)
    trials: dict[str, int] = {}
    for rec in records:
        if TargetKey.of_record(rec.target, rec.host) == target:
            trials[rec.fingerprint] = trials.get(rec.fingerprint, 0) + 1
    best = [recs[0] for (_, key), recs in best_per_key(records).items() if key == target]
    best.sort(key=lambda r: r.fingerprint)
    body = "".join(r.to_json() + "\n" for r in best).encode()
    manifest = {
        "format": BUNDLE_FORMAT,
        "bundle_version": BUNDLE_VERSION,
        "record_version": RECORD_VERSION,
        "aotc_version": __version__,
        "target": target.text,
        "created_utc": _iso(time.time()),
        "exported_by": who(),
        "exporter_host": host_info(),
        "members": {
            RECORDS: {"sha256": hashlib.sha256(body).hexdigest(), "bytes": len(body), "lines": len(best)}
        },
        "workloads": [
            {
                "workload_key": r.workload_key,
                "fingerprint": r.fingerprint,
                "target": r.target,
                "best_cost_s": r.mean_cost,
                "trials": trials.get(r.fingerprint, 0),
                "noise": relative_noise(r.costs),
                "measured_utc": _iso(r.timestamp),
                "measured_on": r.host.get("cpu_model") or r.host.get("cpu", ""),
                "host_cpu": r.host.get("cpu", ""),
                "aotc_version": r.aotc_version,
            }
            for r in best
        ],
    }
    buf = io.BytesIO()
    manifest_bytes = json.dumps(manifest, indent=1, sort_keys=True).encode()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(MANIFEST, manifest_bytes)
        zf.writestr(RECORDS, body)
        if sign_key is not None:
            from aotc.signing import sign_digest

            block = sign_digest(sign_key, hashlib.sha256(manifest_bytes).hexdigest(), "bundle")
            zf.writestr(SIGNATURE_MEMBER, json.dumps(block, indent=1))
    return buf.getvalue(), manifest


def export_bundle(
    records: Iterable[Record],
    target: TargetKey,
    out: str | os.PathLike,
    sign_key: str | os.PathLike | None = None,
) -> dict:
    """Write the bundle to `out` atomically (signed with `sign_key` if given); returns its manifest.
    Raises HubError if nothing matches."""
    data, manifest = bundle_bytes(records, target, sign_key)
    if not manifest["workloads"]:
        raise HubError(f"no valid records for target {target.text!r}: nothing to export")
    write_atomic(Path(out), data)
    return manifest


# ----------------------------------------------------------------------------- reading


def _members(path: Path) -> dict[str, bytes]:
    """Every member of a zip or directory bundle, refused (BundleError) past the size bounds."""
    if path.is_dir():
        files = [p for p in sorted(path.iterdir()) if p.is_file() and not p.name.startswith(".")]
        _check_bounds(path, [(p.name, p.stat().st_size, None) for p in files])
        return {p.name: p.read_bytes() for p in files}
    if path.stat().st_size > MAX_BUNDLE_BYTES:
        raise BundleError(
            f"{path}: {path.stat().st_size} bytes, more than a bundle may hold ({MAX_BUNDLE_BYTES})"
        )
    try:
        with zipfile.ZipFile(path) as zf:
            infos = [info for info in zf.infolist() if not info.is_dir()]
            _check_bounds(path, [(i.filename, i.file_size, i.compress_size) for i in infos])
            out = {}
            for info in infos:
                if info.filename in out:
                    raise BundleError(f"{path}: member {info.filename} appears twice")
                with zf.open(info) as member:
                    data = member.read(info.file_size + 1)
                if len(data) != info.file_size:
                    raise BundleError(
                        f"{path}: member {info.filename} holds {len(data)} bytes, its header says {info.file_size}"
                    )
                out[info.filename] = data
            return out
    except BundleError:
        raise
    except zipfile.BadZipFile as err:
        raise BundleError(f"{path}: not a bundle zip, or a damaged one ({err})") from None
    except Exception as err:  # noqa: BLE001 - zipfile raises many types on damaged input; all mean refuse
        raise BundleError(f"{path}: a zip member is damaged ({type(err).__name__}: {err})") from None


def _check_bounds(path: Path, members: list[tuple[str, int, int | None]]) -> None:
    """Refuse a bundle with too many members, too many bytes, or a member compressed like a zip bomb."""
    if len(members) > MAX_BUNDLE_MEMBERS:
        raise BundleError(
            f"{path}: {len(members)} members, more than a bundle may hold ({MAX_BUNDLE_MEMBERS})"
        )
    total = sum(size for _, size, _ in members)
    if total > MAX_BUNDLE_BYTES:
        raise BundleError(
            f"{path}: members of {total} bytes in all, more than a bundle may hold ({MAX_BUNDLE_BYTES})"
        )
    for name, size, packed in members:
        if packed is not None and size > MAX_COMPRESSION_RATIO * max(packed, 1):
            raise BundleError(
                f"{path}: member {name} expands {packed} bytes to {size} (more than "
                f"{MAX_COMPRESSION_RATIO}:1; a zip bomb?)"
            )


def read_bundle(
    path: str | os.PathLike,
    trusted_keys: Iterable[str | os.PathLike] | None = None,
    require_signature: bool | None = None,
) -> Bundle:
    """Verify a bundle (signature policy, manifest, versions, every member's sha256, every line) and
    return its records. The signature is checked as `aotc_runtime.load` checks a package's (None:
    $AOTC_TRUSTED_KEYS, $AOTC_REQUIRE_SIGNATURE); a refusal is a BundleError."""
    path = Path(path)
    if not path.exists():
        raise BundleError(f"{path}: no such bundle")
    members = _members(path)
    if MANIFEST not in members:
        raise BundleError(f"{path}: missing member {MANIFEST}")
    digest = hashlib.sha256(members[MANIFEST]).hexdigest()
    try:
        status = check_signature(
            members.get(SIGNATURE_MEMBER), digest, "bundle", str(path), trusted_keys, require_signature
        )
    except SignatureError as err:
        raise BundleError(str(err)) from None
    try:
        manifest = json.loads(members[MANIFEST])
    except (ValueError, UnicodeDecodeError) as err:
        raise BundleError(f"{path}: {MANIFEST} is not valid JSON ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
        raise BundleError(
            f"{path}: {MANIFEST} is not an aotc tophub bundle manifest (format {BUNDLE_FORMAT!r})"
        )
    if manifest.get("bundle_version") != BUNDLE_VERSION:
        raise BundleError(
            f"{path}: bundle version {manifest.get('bundle_version')!r}, this aotc reads version {BUNDLE_VERSION}"
        )
    if manifest.get("record_version") != RECORD_VERSION:
        raise BundleError(
            f"{path}: records of format v{manifest.get('record_version')}, this aotc reads v{RECORD_VERSION}"
        )
    listed = manifest.get("members")
    if not isinstance(listed, dict) or RECORDS not in listed:
        raise BundleError(f"{path}: {MANIFEST} does not list the member {RECORDS}")
    for name in sorted(set(members) - set(listed) - {MANIFEST, SIGNATURE_MEMBER}):
        raise BundleError(f"{path}: member {name} is not listed in {MANIFEST}")
    for name, meta in listed.items():
        if name not in members:
            raise BundleError(f"{path}: missing member {name}")
        if not isinstance(meta, dict) or not isinstance(meta.get("sha256"), str):
            raise BundleError(f"{path}: {MANIFEST} entry of {name} has no sha256")
        member_digest = hashlib.sha256(members[name]).hexdigest()
        if member_digest != meta["sha256"]:
            raise BundleError(
                f"{path}: member {name} fails its sha256 check (manifest {meta['sha256'][:16]}..., file {member_digest[:16]}...)"
            )
    try:
        text = members[RECORDS].decode("utf-8")
    except UnicodeDecodeError as err:
        raise BundleError(f"{path}: {RECORDS} is not UTF-8 ({err})") from None
    content = parse_record_lines(text.splitlines(), f"{path}/{RECORDS}")
    bad = [(n, f"not a valid record ({why})") for n, why in content.corrupt]
    bad += [(f.lineno, f"record format v{f.version}, expected v{RECORD_VERSION}") for f in content.foreign]
    if bad:
        bad.sort()
        lines = "".join(f"\n  {RECORDS} line {n}: {why}" for n, why in bad)
        raise BundleError(f"{path}: {len(bad)} bad line(s) in {RECORDS}:{lines}")
    expected = listed[RECORDS].get("lines")
    if expected != len(content.records):
        raise BundleError(
            f"{path}: {RECORDS} holds {len(content.records)} records, the manifest says {expected}"
        )
    signer = status.state if status.key_id is None else f"{status.state}, key {status.key_id}"
    return Bundle(str(path), manifest, content.records, digest, signer)


def is_bundle(path: Path) -> bool:
    """A zip file or a directory holding a bundle manifest (as opposed to a store directory)."""
    return (path.is_dir() and (path / MANIFEST).is_file()) or (path.is_file() and zipfile.is_zipfile(path))


# ----------------------------------------------------------------------------- fetching


def fetch_bundle(url: str) -> Path:
    """A local path for a bundle URL: file:// maps to its path; http(s):// is downloaded into the user
    cache and verified (and checked against `#sha256=<hex>` when the URL carries one). When the download
    fails, an earlier verified copy is used with a warning; without one, HubError says why."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https", "file"):
        raise HubError(
            f"tophub source {url!r}: unsupported URL scheme {parts.scheme!r} (use https:// or file://)"
        )
    pin = ""
    if parts.fragment.startswith("sha256="):
        pin = parts.fragment[len("sha256=") :].lower()
        if not re.fullmatch(r"[0-9a-f]{64}", pin):
            raise HubError(f"tophub source {url!r}: #sha256= needs 64 hex digits")
    if parts.scheme == "file":
        path = Path(urllib.request.url2pathname(parts.path))
        if pin and not (path.is_file() and _sha256_file(path) == pin):
            raise BundleError(f"tophub bundle {path}: not a file whose sha256 is the pinned {pin}")
        return path
    clean = urllib.parse.urlunsplit(parts._replace(fragment=""))
    name = os.path.basename(parts.path) or "bundle.tophub"
    # a pinned URL has its own cache entry: an unpinned (or otherwise pinned) copy never stands in for it
    keyed = clean + (f"#sha256={pin}" if pin else "")
    cached = download_cache_dir() / f"{hashlib.sha256(keyed.encode()).hexdigest()[:16]}-{name}"
    try:
        with urllib.request.urlopen(clean, timeout=DOWNLOAD_TIMEOUT_S) as resp:
            data = resp.read(MAX_BUNDLE_BYTES + 1)
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        if cached.exists() and (not pin or _sha256_file(cached) == pin):
            warnings.warn(
                f"cannot download tophub bundle {clean} ({reason}); using the copy from {cached}",
                HubWarning,
                stacklevel=2,
            )
            return cached
        raise HubError(
            f"cannot download tophub bundle {clean} ({reason}); are we offline? "
            "Remove it from tuning.tophub / AOTC_TOPHUB, or set AOTC_TOPHUB=none"
        ) from None
    if len(data) > MAX_BUNDLE_BYTES:
        raise BundleError(
            f"tophub bundle {clean}: more than {MAX_BUNDLE_BYTES} bytes, more than a bundle may hold"
        )
    digest = hashlib.sha256(data).hexdigest()
    if pin and digest != pin:
        raise BundleError(f"tophub bundle {clean}: sha256 {digest} does not match the pinned {pin}")
    staging = cached.with_name(cached.name + ".download")
    write_atomic(staging, data)
    try:
        read_bundle(staging)
    except BundleError as err:
        staging.unlink(missing_ok=True)
        raise BundleError(f"tophub bundle {clean}: {str(err).split(': ', 1)[-1]}") from None
    os.replace(staging, cached)
    return cached


def _sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
