"""A record store: a directory of JSON-lines files, one per target, that many builds append to at once.

Why JSON lines and not SQLite: a record already is one JSON line (aotc.search.records), so a store
file, a build's records file and a bundle member are the same format and can be read, diffed, grepped
and concatenated with ordinary tools. Appends are atomic without a database: each line goes out in
one `os.write` on an O_APPEND descriptor, so two builds appending at once never interleave lines.
Shared stores often live on network filesystems, where SQLite's locking is documented as unreliable;
aotc only ever reads those. Whole-file rewrites (prune) go to a temporary file and `os.replace`, and
take an exclusive `flock` on the store directory that every appender takes shared, so no append is
lost to a concurrent rewrite.

A store file is recognised by its name (`TargetKey.file_name`: `<kind>-<cpu>-<12 hex>.jsonl`); every
reader and writer of a store touches only such files, so a directory of other JSON-lines files (a
training set) is never read as records, pruned or appended to, and `prune` refuses it. Records are
validated on the way in (`aotc.search.records.record_problem`): an invalid line is reported and
dropped, never ranked, and an import is all-or-nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import os
import platform
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from aotc.files import write_all_atomic, write_atomic
from aotc.search.records import (
    RECORD_VERSION,
    Record,
    append_records,
    is_emulated,
    rank_cost,
    read_record_file,
    record_problem,
)
from aotc.target import Target, TargetError, code_features, parse_target

STORE_SUFFIX = ".jsonl"
STORE_FILE_NAME = re.compile(r"[A-Za-z0-9_.-]+-[0-9a-f]{12}" + re.escape(STORE_SUFFIX))


class HubError(ValueError):
    """A store, bundle or source that cannot be used; the message names it and says why."""


# ----------------------------------------------------------------------------- where stores live


def user_store_dir() -> Path:
    """`$AOTC_HOME/tophub`, else `$XDG_CACHE_HOME/aotc/tophub`, else `~/.cache/aotc/tophub`."""
    home = os.environ.get("AOTC_HOME")
    if home:
        return Path(home) / "tophub"
    cache = os.environ.get("XDG_CACHE_HOME")
    base = Path(cache) if cache else Path.home() / ".cache"
    return base / "aotc" / "tophub"


def download_cache_dir() -> Path:
    """Where downloaded bundles are kept (next to the user store)."""
    return user_store_dir().parent / "tophub-downloads"


SHIPPED_STORE = Path(__file__).resolve().parents[1] / "tophub"
"""`aotc/tophub/`: package data, so a checkout and an installed wheel find it at the same place."""


def shipped_store_dir() -> Path | None:
    """The records that ship with aotc (`SHIPPED_STORE`), or None where that folder is absent.

    `AOTC_SHIPPED_TOPHUB` overrides it: `none` leaves it out (a build that must tune from scratch), a
    directory stands in for it."""
    override = os.environ.get("AOTC_SHIPPED_TOPHUB")
    if override:
        return None if override.lower() == "none" else Path(override)
    return SHIPPED_STORE if SHIPPED_STORE.is_dir() else None


# ----------------------------------------------------------------------------- keys


@functools.lru_cache(maxsize=4096)
def record_target_key(target_text: str) -> TargetKey | None:
    """TargetKey.of the target a record's string names, None if it names none. Cached: a store holds
    thousands of records of a few targets, and parsing each string (shlex, LLVM's names) took seconds
    per build; a string that names its CPU parses the same everywhere (bare `llvm` is the host's, which
    does not change while a process runs)."""
    try:
        return TargetKey.of(parse_target(target_text))
    except TargetError:
        return None


@dataclass(frozen=True)
class TargetKey:
    """The part of a target a record is tied to: kind, architecture, CPU model, features (as the code sees
    them: `code_features`), core count."""

    kind: str
    arch: str
    cpu: str
    features: frozenset[str]
    cores: int
    text: str = field(default="", compare=False)

    @staticmethod
    def of(target: Target) -> TargetKey:
        if target.is_gpu:
            return TargetKey(target.kind, target.arch, "", frozenset(), 0, str(target))
        arch = target.mtriple.split("-")[0] if target.mtriple else platform.machine()
        return TargetKey("llvm", arch, target.mcpu, code_features(target), target.num_cores, str(target))

    @staticmethod
    def of_record(target_text: str, host: dict | None = None) -> TargetKey:
        """The key of a record's target string; without a -mtriple the measuring host's machine is the arch."""
        key = record_target_key(target_text) if "-mcpu=native" not in target_text else None
        if key is None:
            return TargetKey("?", "", "", frozenset(), 0, target_text)
        machine = (host or {}).get("machine")
        if key.kind == "llvm" and "-mtriple=" not in target_text and isinstance(machine, str) and machine:
            key = TargetKey(key.kind, machine, key.cpu, key.features, key.cores, target_text)
        return key

    def difference(self, wanted: TargetKey) -> str:
        """Which part of this (a record's) key differs from `wanted` (the target being built), or ""."""
        if self.kind != wanted.kind:
            if self.kind == "?":
                return f"record for target {self.text!r} (not a valid target string)"
            return f"record for a {self.kind} target, this target is {wanted.kind}"
        if self.arch != wanted.arch:
            what = "-arch" if self.kind == "cuda" else "arch"
            return f"record for {what}={self.arch}, this target is {what}={wanted.arch}"
        if self.cpu != wanted.cpu:
            return f"record for -mcpu={self.cpu}, this target is -mcpu={wanted.cpu}"
        if self.features != wanted.features:
            extra = sorted(self.features - wanted.features)
            missing = sorted(wanted.features - self.features)
            parts = []
            if extra:
                parts.append(f"record has {_listed(extra)} that this target has not")
            if missing:
                parts.append(f"this target has {_listed(missing)} that the record has not")
            return "record for other -mattr features: " + "; ".join(parts)
        if self.cores != wanted.cores:
            return f"record for {_cores(self.cores)}, this target is {_cores(wanted.cores)}"
        return ""

    def file_name(self) -> str:
        """`llvm-skylake-avx512-<hash>.jsonl`: readable, and distinct per key."""
        text = json.dumps([self.kind, self.arch, self.cpu, sorted(self.features), self.cores])
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{self.kind}-{self.cpu or self.arch}")
        return f"{name}-{digest}{STORE_SUFFIX}"


def _listed(items: list[str], limit: int = 6) -> str:
    return ",".join(items[:limit]) + (f",... ({len(items)} in all)" if len(items) > limit else "")


def _cores(n: int) -> str:
    return f"-num-cores={n}" if n else "the host's core count (no -num-cores)"


# ----------------------------------------------------------------------------- reading


def is_store_file_name(name: str) -> bool:
    """True for a name a store gives its files (`TargetKey.file_name`)."""
    return STORE_FILE_NAME.fullmatch(name) is not None


def store_files(directory: str | os.PathLike) -> list[Path]:
    """The record files of a store directory (named as `TargetKey.file_name` names them), sorted by name."""
    d = Path(directory)
    if not d.is_dir():
        return []
    return sorted(p for p in d.glob(f"*{STORE_SUFFIX}") if p.is_file() and is_store_file_name(p.name))


def check_store_dir(directory: Path) -> None:
    """Raise HubError unless `directory` is a store: it holds store files, or nothing visible at all."""
    if not directory.is_dir():
        raise HubError(f"{directory} is not a store directory")
    if store_files(directory):
        return
    others = sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))
    if others:
        shown = ", ".join(others[:5]) + (", ..." if len(others) > 5 else "")
        raise HubError(
            f"{directory} is not a tophub store: none of its files ({shown}) is a store file "
            f"(named <kind>-<cpu>-<12 hex digits>{STORE_SUFFIX}); nothing was changed"
        )


# ----------------------------------------------------------------------------- writing


@contextlib.contextmanager
def store_lock(directory: Path, exclusive: bool) -> Iterator[None]:
    """`flock` on the store directory itself (no lock file): appenders share it, rewriters hold it alone."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def group_by_target(records: Iterable[Record]) -> dict[str, list[Record]]:
    """Records by the store file name of their target key."""
    groups: dict[str, list[Record]] = {}
    for rec in records:
        name = TargetKey.of_record(rec.target, rec.host).file_name()
        groups.setdefault(name, []).append(rec)
    return groups


def append_to_store(directory: str | os.PathLike, records: Iterable[Record], _locked: bool = False) -> int:
    """Append records to the store's per-target files; returns how many were written. Records measured
    under qemu stay out (in the build's record log only): a store shares timings, and theirs mean nothing."""
    directory = Path(directory)
    records = list(records)
    emulated = sum(map(is_emulated, records))
    if emulated:
        logging.getLogger("aotc.hub").info(
            f"{emulated} records measured under qemu kept out of the store {directory}: their timings say "
            "nothing about the device"
        )
    groups = group_by_target(r for r in records if not is_emulated(r))
    if not groups:
        return 0
    lock = contextlib.nullcontext() if _locked else store_lock(directory, exclusive=False)
    with lock:
        for name, recs in groups.items():
            append_records(directory / name, recs)
    return sum(len(r) for r in groups.values())


def record_identity(rec: Record) -> tuple:
    """Records equal in this are the same measurement (seen through two sources)."""
    return (rec.fingerprint, rec.target, json.dumps(rec.steps), tuple(rec.costs), rec.error, rec.timestamp)


def best_per_key(records: Iterable[Record], keep: int = 1) -> dict[tuple[str, TargetKey], list[Record]]:
    """The `keep` best valid records (distinct steps) per (fingerprint, target key), best first.

    Best is the lowest `aotc.search.records.rank_cost`: the cost inflated by the record's noise, so a
    lucky timing under interference does not displace a quietly measured schedule."""
    groups: dict[tuple[str, TargetKey], list[Record]] = {}
    for rec in records:
        if rec.ok:
            groups.setdefault((rec.fingerprint, TargetKey.of_record(rec.target, rec.host)), []).append(rec)
    out = {}
    for key, recs in groups.items():
        recs.sort(key=lambda r: (rank_cost(r), r.timestamp))
        chosen, seen = [], set()
        for rec in recs:
            steps = json.dumps(rec.steps)
            if steps not in seen:
                seen.add(steps)
                chosen.append(rec)
            if len(chosen) == keep:
                break
        out[key] = chosen
    return out


@dataclass
class PruneReport:
    files: int = 0
    kept: int = 0
    dropped_errors: int = 0
    dropped_versions: int = 0
    dropped_corrupt: int = 0
    dropped_slower: int = 0
    skipped: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        text = (
            f"{self.files} file(s): kept {self.kept} record(s); dropped {self.dropped_slower} slower, "
            f"{self.dropped_errors} failed, {self.dropped_versions} of another format version, "
            f"{self.dropped_corrupt} corrupt or invalid"
        )
        if self.skipped:
            text += f"; left alone (no record in them): {', '.join(self.skipped)}"
        return text


def prune_store(directory: str | os.PathLike, keep: int = 3) -> PruneReport:
    """Keep the `keep` best records per (workload, target); drop failed, foreign-version, corrupt and
    invalid lines. Each file is rewritten atomically while no one appends. Refuses (HubError) a
    directory that is not a store; a store-named file without a single record line is left alone."""
    if keep < 1:
        raise HubError(f"prune: keep must be at least 1, got {keep}")
    directory = Path(directory)
    report = PruneReport()
    if not directory.exists():
        return report
    check_store_dir(directory)
    with store_lock(directory, exclusive=True):
        for path in store_files(directory):
            content = read_record_file(path)
            if content.corrupt and not content.records and not content.foreign:
                report.skipped.append(path.name)
                continue
            best = best_per_key(content.records, keep)
            kept = sorted(
                (r for recs in best.values() for r in recs), key=lambda r: (r.fingerprint, rank_cost(r))
            )
            report.files += 1
            report.kept += len(kept)
            report.dropped_errors += sum(not r.ok for r in content.records)
            report.dropped_versions += len(content.foreign)
            report.dropped_corrupt += len(content.corrupt)
            report.dropped_slower += sum(r.ok for r in content.records) - len(kept)
            write_atomic(path, "".join(r.to_json() + "\n" for r in kept).encode())
    return report


def merge_into_store(directory: str | os.PathLike, records: Iterable[Record]) -> tuple[int, int]:
    """Add each record that ranks better (`rank_cost`) than the store's best for its (workload,
    target), or whose key the store lacks. Returns (added, not added).

    All or nothing: every record is validated first (HubError names the first invalid one), and the
    changed store files are staged and renamed into place together."""
    directory = Path(directory)
    records = list(records)
    for i, rec in enumerate(records):
        problem = record_problem(rec)
        if not problem and is_emulated(rec):
            problem = (
                f"it was measured under {rec.host['emulated']}, whose timings say nothing about the device"
            )
        if problem:
            raise HubError(f"record {i + 1} (workload {rec.workload_key[:32]}) is invalid: {problem}")
    incoming = best_per_key(records)
    with store_lock(directory, exclusive=True):
        current: list[Record] = []
        for path in store_files(directory):
            current.extend(read_record_file(path).records)
        have = best_per_key(current)
        new = [
            recs[0]
            for key, recs in incoming.items()
            if key not in have or rank_cost(recs[0]) < rank_cost(have[key][0])
        ]
        files = {}
        for name, recs in group_by_target(new).items():
            path = directory / name
            old = path.read_bytes() if path.exists() else b""
            if old and not old.endswith(b"\n"):
                old += b"\n"
            files[path] = old + "".join(r.to_json() + "\n" for r in recs).encode()
        write_all_atomic(files)
    return len(new), len(incoming) - len(new)


@dataclass
class AnnotateReport:
    annotated: int = 0  # records given their structure key
    had: int = 0  # records of the tasks that already carried it
    differs: int = 0  # records whose structure key is not the one their task has now (left as they are)
    files: int = 0  # files rewritten

    def __str__(self) -> str:
        text = f"{self.annotated} record(s) annotated in {self.files} file(s), {self.had} had their structure key"
        if self.differs:
            text += f"; {self.differs} carry another one (left as they are)"
        return text


def annotate_records(path: str | os.PathLike, structures: Mapping[str, str]) -> AnnotateReport:
    """Give each record without a `structure` field whose fingerprint `structures` maps (a model's tasks:
    fingerprint -> `ComputeDAG.structure_key`) that key, so that builds take it as a twin's record
    (docs/records.md#twin-workloads). `path` is a store directory (its files rewritten atomically while no
    one appends) or one record file (a build's log). Every other line stays as it was."""
    path = Path(path)
    report = AnnotateReport()
    if path.is_dir():
        check_store_dir(path)
        with store_lock(path, exclusive=True):
            for file in store_files(path):
                _annotate_file(file, structures, report)
    elif path.is_file():
        _annotate_file(path, structures, report)
    else:
        raise HubError(f"{path}: no such store directory or record file")
    return report


def _annotate_file(path: Path, structures: Mapping[str, str], report: AnnotateReport) -> None:
    lines = path.read_bytes().splitlines(keepends=True)  # bytes: a line not touched is kept byte for byte
    changed = 0
    for i, line in enumerate(lines):
        text = line.decode("utf-8", errors="replace").strip()
        try:
            obj = json.loads(text) if text and not text.startswith("#") else None
            rec = Record.from_json(text) if isinstance(obj, dict) and obj.get("v") == RECORD_VERSION else None
        except ValueError:  # a corrupt line is left for `prune` to drop
            continue
        key = None if rec is None else structures.get(rec.fingerprint)
        if key is None:
            continue
        if rec.structure is not None:
            report.had += rec.structure == key
            report.differs += rec.structure != key
            continue
        obj["structure"] = key  # the line's own fields, any this version does not know included
        lines[i] = json.dumps(obj, separators=(",", ":"), allow_nan=False).encode() + b"\n"
        changed += 1
    if changed:
        write_atomic(path, b"".join(lines))
        report.annotated += changed
        report.files += 1
