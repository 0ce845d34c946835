"""Where a build finds tuned records: the chain of record sources and the per-task query.

Chain, in order: the recipe's own records file -> the user's store -> the shipped `aotc/tophub/` -> shared
stores named by the recipe's `tuning.tophub` or `AOTC_TOPHUB` (a store directory, a bundle file, or a
`file://` / `https://` bundle URL). `AOTC_TOPHUB=none` or `tophub: none` in the recipe
leaves only the recipe's records. A query takes the fastest valid record for the exact key (workload
fingerprint, target key, record format version) across all sources; on equal cost the earlier
source wins. Anything that almost matches is reported as stale, naming the part that differed.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from aotc.hub.bundle import HubWarning, fetch_bundle, is_bundle, read_bundle
from aotc.hub.store import (
    HubError,
    TargetKey,
    append_to_store,
    record_identity,
    shipped_store_dir,
    store_files,
    user_store_dir,
)
from aotc.schedule.state import State
from aotc.search.records import (
    RECORD_VERSION,
    UNTUNED_PREFERENCE,
    ForeignLine,
    Record,
    RecordFile,
    implausible_for,
    rank_cost,
    read_record_file,
)
from aotc.target import Target
from aotc.te.dag import ComputeDAG

_AUTO = object()


@dataclass
class Lookup:
    """The answer for one task: hit (with the replayed state), miss, or stale (and why)."""

    status: str
    source: str
    reason: str
    state: State | None = None
    record: Record | None = None

    def __str__(self) -> str:
        where = f" [{self.source}]" if self.source else ""
        return f"{self.status}: {self.reason}{where}"


@dataclass
class Source:
    """One link of the chain: `kind` is records, user, tophub or shared; `location` a path or URL."""

    kind: str
    location: str
    files: list[RecordFile] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    problem: str = ""

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.location}"


@dataclass(frozen=True)
class _Entry:
    record: Record
    where: str
    rank: int


class RecordSources:
    """The record sources of one build, loaded once; `save` appends to the user store."""

    def __init__(self, sources: list[Source], user_store: Path):
        self.sources = sources
        self.user_store = user_store
        self._entries: list[_Entry] | None = None
        self._foreign: list[tuple[ForeignLine, str]] = []

    # ---- loading ----

    def _load(self) -> list[_Entry]:
        if self._entries is not None:
            return self._entries
        entries: list[_Entry] = []
        seen: set[tuple] = set()
        for rank, src in enumerate(self.sources):
            try:
                _load_source(src)
            except HubError as err:
                src.problem = str(err)
                warnings.warn(f"tophub source {src.name} skipped: {err}", HubWarning, stacklevel=3)
            for content, label in zip(src.files, src.labels):
                for rec in content.records:
                    ident = record_identity(rec)
                    if ident not in seen:
                        seen.add(ident)
                        entries.append(_Entry(rec, label, rank))
                self._foreign.extend((line, label) for line in content.foreign)
        self._entries = entries
        return entries

    def all_records(self) -> list[tuple[Record, str]]:
        """Every current-version record of every source (duplicates across sources once), with its origin."""
        return [(e.record, e.where) for e in self._load()]

    # ---- the build's API ----

    def lookup(self, dag: ComputeDAG, target: Target) -> Lookup:
        """The fastest record for this DAG and exact target whose steps replay and lower on `dag`."""
        from aotc.schedule.lower import lower

        key = TargetKey.of(target)
        hw = asdict(target.hw)
        failures: list[tuple[str, str]] = []
        tried: set[str] = set()
        matching = self._matching(dag.fingerprint, key, hw)
        for entry in matching:
            steps = json.dumps(entry.record.steps)
            if steps in tried:
                continue
            implausible = implausible_for(entry.record, dag.flop_count, hw)
            if implausible:
                warnings.warn(
                    f"a record of workload {dag.workload_key} from {entry.where} skipped: {implausible}",
                    HubWarning,
                    stacklevel=2,
                )
                continue
            tried.add(steps)
            try:
                state = entry.record.state(dag)
                lower(state, "check")
            except Exception as err:  # noqa: BLE001 - any replay/lowering failure makes the record unusable
                msg = f"{type(err).__name__}: {err}"
                failures.append((msg, entry.where))
                warnings.warn(
                    f"a record of workload {dag.workload_key} from {entry.where} does not replay on this DAG "
                    f"({msg}); trying the next best",
                    HubWarning,
                    stacklevel=2,
                )
                continue
            reason = _hit_reason(entry, len(tried) - 1, matching)
            return Lookup("hit", entry.where, reason, state, entry.record)
        return self._not_found(dag.fingerprint, key, failures)

    def explain(self, workload: str, target: Target) -> Lookup:
        """The status of a workload (fingerprint, or workload key) without its DAG: nothing is replayed."""
        key = TargetKey.of(target)
        found = self._matching(workload, key, asdict(target.hw))
        if found:
            return Lookup("hit", found[0].where, _hit_reason(found[0], 0, found), None, found[0].record)
        return self._not_found(workload, key, [])

    def records_for(self, target: Target) -> list[Record]:
        """Every valid record for this exact target key, from all sources (for the cost model's warm start)."""
        key = TargetKey.of(target)
        return [e.record for e in self._load() if e.record.ok and _key(e.record) == key]

    def records_across(self, target: Target, own: bool = False) -> list[tuple[Record, str, TargetKey]]:
        """Valid records measured for another CPU of the target's ISA (another -mcpu, -mattr features or
        core count, same kind and architecture), each with its origin and key: candidates to measure
        here, never applied for their foreign cost. `own`: the target's own records too."""
        key = TargetKey.of(target)
        out = []
        for e in self._load():
            other = _key(e.record)
            if e.record.ok and (other != key or own) and same_isa(other, key):
                out.append((e.record, e.where, other))
        return out

    def save(self, records: Iterable[Record]) -> None:
        """Append records to the user store (also when reading the stores is disabled)."""
        append_to_store(self.user_store, records)

    def save_missing(self, records: Iterable[Record]) -> int:
        """Append the valid records that the user store does not hold yet; returns how many.

        A build saves every measured record this way, not only those of its own run: records measured
        by a build that was killed (and then resumed) reach the store too."""
        have = {
            record_identity(r)
            for path in store_files(self.user_store)
            for r in read_record_file(path).records
        }
        missing = []
        for rec in records:
            ident = record_identity(rec)
            if rec.ok and ident not in have:
                have.add(ident)
                missing.append(rec)
        append_to_store(self.user_store, missing)
        return len(missing)

    # ---- matching ----

    def _matching(self, workload: str, key: TargetKey, hw: dict) -> list[_Entry]:
        found = [
            e
            for e in self._load()
            if e.record.ok and _same_workload(e.record.fingerprint, workload) and _key(e.record) == key
        ]
        found.sort(key=lambda e: (e.record.hw != hw, rank_cost(e.record), e.rank))
        return found

    def _not_found(self, workload: str, key: TargetKey, failures: list[tuple[str, str]]) -> Lookup:
        if failures:
            msg, where = failures[0]
            return Lookup(
                "stale", where, f"{len(failures)} record(s) for this target no longer replay ({msg})"
            )
        mine = [e for e in self._load() if _same_workload(e.record.fingerprint, workload)]
        exact = [e for e in mine if _key(e.record) == key]
        foreign = [
            (line, where)
            for line, where in self._foreign
            if _same_workload(line.fingerprint or line.workload_key, workload)
        ]
        foreign_exact = [(line, where) for line, where in foreign if TargetKey.of_record(line.target) == key]
        if foreign_exact:
            line, where = foreign_exact[0]
            return Lookup("stale", where, _version_reason(line.version))
        other = [e for e in mine if e.record.ok and _key(e.record) != key]
        if other:
            closest = max(other, key=lambda e: (_similarity(_key(e.record), key), -e.record.mean_cost))
            return Lookup("stale", closest.where, _key(closest.record).difference(key))
        if foreign:
            line, where = foreign[0]
            diff = TargetKey.of_record(line.target).difference(key)
            return Lookup("stale", where, f"{_version_reason(line.version)}; and {diff}")
        if exact:
            return Lookup("miss", "", f"{len(exact)} record(s) for this target, all failed measurement")
        searched = sum(1 for s in self.sources if not s.problem)
        return Lookup("miss", "", f"no record for workload {workload[:32]} in {searched} source(s)")


def _key(rec: Record) -> TargetKey:
    return TargetKey.of_record(rec.target, rec.host)


def same_isa(a: TargetKey, b: TargetKey) -> bool:
    """Both CPU targets of one architecture (x86_64, aarch64, ...): a schedule of one replays, compiles
    and runs on the other, however their CPU models, features or core counts differ."""
    return a.kind == b.kind == "llvm" and bool(a.arch) and a.arch == b.arch


def _same_workload(a: str, b: str) -> bool:
    """Equal fingerprints, or a workload key (a fingerprint's 32-character prefix) and its fingerprint."""
    short, long = sorted((a, b), key=len)
    return bool(short) and long.startswith(short)


def _similarity(a: TargetKey, b: TargetKey) -> int:
    """How many key parts agree before the first that differs."""
    parts = [(a.kind, b.kind), (a.arch, b.arch), (a.cpu, b.cpu), (a.features, b.features), (a.cores, b.cores)]
    for i, (x, y) in enumerate(parts):
        if x != y:
            return i
    return len(parts)


def _version_reason(version: object) -> str:
    if isinstance(version, int) and not isinstance(version, bool):
        rel = "<" if version < RECORD_VERSION else ">"
        newer = " (written by a newer aotc)" if version > RECORD_VERSION else ""
        return f"record format v{version} {rel} v{RECORD_VERSION}{newer}"
    return f"record format {version!r}, this aotc reads v{RECORD_VERSION}"


def _hit_reason(entry: _Entry, skipped: int, matching: list[_Entry]) -> str:
    rec = entry.record
    text = (
        f"{rec.mean_cost * 1e3:.4f} ms, measured on {rec.host.get('cpu_model') or rec.host.get('cpu', '?')}"
    )
    if skipped:
        text += f" ({skipped} faster record(s) did not replay)"
    faster = [
        e.record.mean_cost for e in matching if e.record.hw == rec.hw and e.record.mean_cost < rec.mean_cost
    ]
    if rec.untuned and faster:
        text += (
            f"; the untuned schedule, kept ahead of a tuned record of {min(faster) * 1e3:.4f} ms (a tuned"
            f" schedule must measure {UNTUNED_PREFERENCE:.0%} faster)"
        )
    return text


# ----------------------------------------------------------------------------- building the chain


def shared_entries(tophub: list[str] | None) -> list[str]:
    """The recipe's shared stores, then `AOTC_TOPHUB`'s (split on os.pathsep, keeping URLs whole)."""
    out = list(tophub or [])
    for entry in split_env(os.environ.get("AOTC_TOPHUB", "")):
        if entry not in out:
            out.append(entry)
    return out


def split_env(value: str) -> list[str]:
    """`a:/b:https://host:8080/c.tophub` -> ["a", "/b", "https://host:8080/c.tophub"] (with os.pathsep ":")."""
    pieces = [p for p in value.split(os.pathsep)]
    out: list[str] = []
    for piece in pieces:
        joins_url = out and (
            (piece.startswith("//") and re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", out[-1]))
            or ("://" in out[-1] and re.match(r"\d+(/|$)", piece) and out[-1].count(":") == 1)
        )
        if joins_url:
            out[-1] += os.pathsep + piece
        elif piece.strip():
            out.append(piece.strip())
    return out


def tophub_disabled(tophub: list[str] | None) -> bool:
    return os.environ.get("AOTC_TOPHUB", "").strip().lower() == "none" or tophub == []


def open_sources(
    recipe_records: Path | None,
    tophub: list[str] | None,
    *,
    user_store: Path | None = None,
    shipped: Path | None | object = _AUTO,
) -> RecordSources:
    """The chain for a build. `tophub` is the recipe's `tuning.tophub` (None: not set; []: disabled).
    `user_store` and `shipped` override the default locations (tests, tools)."""
    user = Path(user_store) if user_store is not None else user_store_dir()
    chain: list[Source] = []
    if recipe_records is not None:
        chain.append(Source("records", str(recipe_records)))
    if not tophub_disabled(tophub):
        chain.append(Source("user", str(user)))
        shipped_dir = shipped_store_dir() if shipped is _AUTO else shipped
        if shipped_dir is not None:
            chain.append(Source("tophub", str(shipped_dir)))
        chain.extend(Source("shared", entry) for entry in shared_entries(tophub))
    return RecordSources(chain, user)


def sources_from_paths(paths: Iterable[str], user_store: Path | None = None) -> RecordSources:
    """Sources for explicit paths or URLs (record files, store directories, bundles), in order."""
    user = Path(user_store) if user_store is not None else user_store_dir()
    return RecordSources([Source("shared", str(p)) for p in paths], user)


def _load_source(src: Source) -> None:
    """Read a source's record files (raises HubError for a source that cannot be used)."""
    loc = src.location
    if src.kind == "shared" and "://" in loc:
        path = fetch_bundle(loc)
        label = f"shared:{loc}"
    else:
        path = Path(loc)
        label = ""
    if not path.exists():
        if src.kind in ("records", "user"):
            return
        raise HubError(f"{path} does not exist")
    if is_bundle(path):
        bundle = read_bundle(path)
        src.files.append(RecordFile(str(path), bundle.records))
        src.labels.append(label or f"{src.kind}:{path}")
        return
    if path.is_file():
        src.files.append(_read_reporting(path))
        src.labels.append(f"{src.kind}:{path}")
        return
    for file in store_files(path):
        src.files.append(_read_reporting(file))
        src.labels.append(f"{src.kind}:{file}")
    for file in sorted(path.glob("*.tophub")):
        try:
            bundle = read_bundle(file)
        except HubError as err:
            warnings.warn(f"tophub bundle skipped: {err}", HubWarning, stacklevel=4)
            continue
        src.files.append(RecordFile(str(file), bundle.records))
        src.labels.append(f"{src.kind}:{file}")


def _read_reporting(path: Path) -> RecordFile:
    content = read_record_file(path)
    if content.corrupt:
        lineno, why = content.corrupt[0]
        warnings.warn(
            f"{path}: skipped {len(content.corrupt)} corrupt record line(s) (line {lineno}: {why})",
            HubWarning,
            stacklevel=5,
        )
    return content


def explain_package(
    package: str | os.PathLike, sources: RecordSources
) -> tuple[Target, list[tuple[str, Lookup]]]:
    """Per task of a package (its manifest's kernel info): hit / miss / stale against `sources`.

    The package carries no DAGs, so nothing is replayed: a hit means a valid record with the exact key."""
    from aotc_runtime.package import read_manifest

    from aotc.target import parse_target

    try:
        manifest = read_manifest(os.fspath(package))
    except Exception as err:  # noqa: BLE001 - the runtime's errors name the package and the problem
        raise HubError(f"{package}: cannot read the package manifest ({err})") from None
    target = parse_target(str(manifest.get("target", "")))
    infos = manifest.get("kernel_info") or manifest.get("kernels") or []
    rows = []
    for i, info in enumerate(infos):
        workload = info.get("fingerprint") or info.get("workload_key")
        if not workload:
            continue
        rows.append(
            (str(info.get("task") or info.get("symbol") or f"kernel {i}"), sources.explain(workload, target))
        )
    return target, rows
