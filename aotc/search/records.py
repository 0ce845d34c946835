"""Tuning records: one measured candidate per JSON line (ANSOR.md §7), append-only, versioned.

A line is `{"v", "workload_key", "fingerprint", "target", "hw", "steps", "costs", "error",
"error_msg", "timestamp", "aotc_version", "host"}`, and, for a candidate timed since aotc measures
interference, `"noise": {"interference", "spread", "retries"}` (aotc.search.interference). Loading
never fails on a bad line: lines of an unknown (newer) format version and corrupt lines are skipped
with a warning. Records are applied only to the exact target string and the exact DAG fingerprint,
and only after their steps replay and lower on the DAG (ANSOR.md §1.4 and §7.2, "Note for us").

The format version `v` changes only when a reader of the previous version would misread a line.
An optional field that older readers ignore does not change it: `noise` came in version 1, a line
without it loads as a record whose noise is unknown, and older aotc versions read the new lines.

Ranking records of one key (`rank_cost`, used wherever "the best record" is chosen): the mean cost
inflated by the record's relative uncertainty, the spread (max - min) / min of its repeats, plus
`DISTURBED_MARGIN` where other processes took more than `DISTURBED_INTERFERENCE` of the CPU while
it was timed. A noisy record must beat a quiet one by its noise to rank first, so a lucky noisy
timing does not displace a schedule measured quietly; among records measured alike, the cost decides.
Records without a noise field get the spread of their costs and no margin.
"""

from __future__ import annotations

import functools
import json
import math
import os
import platform
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from aotc import __version__
from aotc.schedule.state import State
from aotc.search.common import MeasureResult, Noise
from aotc.search.interference import spread
from aotc.target import Target, _host_cores
from aotc.te.dag import ComputeDAG

__all__ = [
    "DISTURBED_INTERFERENCE",
    "DISTURBED_MARGIN",
    "RECORD_VERSION",
    "Record",
    "RecordWarning",
    "append_records",
    "append_results",
    "apply_best",
    "best_records",
    "host_info",
    "load_records",
    "rank_cost",
]

RECORD_VERSION = 1
_ERROR_MSG_LIMIT = 1000
_LINES_NAMED = 20
DISTURBED_INTERFERENCE = 0.2  # the measurer's default max_interference
DISTURBED_MARGIN = 0.05


class RecordWarning(UserWarning):
    """A record line or record that was skipped."""


@dataclass
class Record:
    """One measured candidate: the steps of its state, where it was measured, and the outcome."""

    workload_key: str
    fingerprint: str
    target: str
    hw: dict
    steps: list
    costs: list[float]
    error: int
    error_msg: str = ""
    timestamp: float = 0.0
    aotc_version: str = __version__
    host: dict = field(default_factory=dict)
    version: int = RECORD_VERSION
    noise: Noise | None = None  # None: measured before aotc recorded noise, or not timed

    @property
    def ok(self) -> bool:
        return self.error == 0 and bool(self.costs)

    @property
    def mean_cost(self) -> float:
        """Mean seconds per run; inf for a failed candidate."""
        return sum(self.costs) / len(self.costs) if self.ok else math.inf

    @staticmethod
    def from_result(dag: ComputeDAG, target: Target, state: State, result: MeasureResult) -> Record:
        from aotc.schedule.steps import steps_to_json

        return Record(
            workload_key=dag.workload_key,
            fingerprint=dag.fingerprint,
            target=str(target),
            hw=asdict(target.hw),
            steps=steps_to_json(state.steps),
            costs=[float(c) for c in result.costs],
            error=int(result.error),
            error_msg=result.error_msg[:_ERROR_MSG_LIMIT],
            timestamp=float(result.timestamp),
            host=host_info(),
            noise=result.noise,
        )

    def to_json(self) -> str:
        """One line of JSON (no newline)."""
        obj = {
            "v": self.version,
            "workload_key": self.workload_key,
            "fingerprint": self.fingerprint,
            "target": self.target,
            "hw": self.hw,
            "steps": self.steps,
            "costs": self.costs,
            "error": self.error,
            "error_msg": self.error_msg,
            "timestamp": self.timestamp,
            "aotc_version": self.aotc_version,
            "host": self.host,
        }
        if self.noise is not None:
            obj["noise"] = {
                "interference": round(self.noise.interference, 4),
                "spread": round(self.noise.spread, 4),
                "retries": self.noise.retries,
            }
        return json.dumps(obj, separators=(",", ":"), allow_nan=False)

    @staticmethod
    def from_json(line: str) -> Record:
        """Parse one line; raises ValueError on anything malformed (the version is not checked here)."""
        obj = json.loads(line)
        if not isinstance(obj, dict):
            raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
        try:
            rec = Record(
                workload_key=_typed(obj, "workload_key", str),
                fingerprint=_typed(obj, "fingerprint", str),
                target=_typed(obj, "target", str),
                hw=_typed(obj, "hw", dict),
                steps=_typed(obj, "steps", list),
                costs=[float(c) for c in _typed(obj, "costs", list)],
                error=_typed(obj, "error", int),
                error_msg=_typed(obj, "error_msg", str),
                timestamp=float(_typed(obj, "timestamp", int | float)),
                aotc_version=_typed(obj, "aotc_version", str),
                host=_typed(obj, "host", dict),
                version=_typed(obj, "v", int),
                noise=_noise(obj["noise"]) if obj.get("noise") is not None else None,
            )
        except TypeError as err:
            raise ValueError(str(err)) from None
        return rec

    def state(self, dag: ComputeDAG) -> State:
        """The record's state, rebuilt by replaying its steps on `dag` (raises ScheduleError)."""
        from aotc.schedule.steps import replay, steps_from_json

        return replay(dag, steps_from_json(self.steps))


def _noise(obj) -> Noise:
    if not isinstance(obj, dict):
        raise ValueError(f"field 'noise' has the wrong type ({type(obj).__name__})")
    interference = float(_typed(obj, "interference", int | float))
    spread_ = float(_typed(obj, "spread", int | float))
    retries = _typed(obj, "retries", int)
    if not (0 <= interference <= 1 and spread_ >= 0 and retries >= 0):
        raise ValueError(f"field 'noise' out of range: {obj}")
    return Noise(interference, spread_, retries)


def rank_cost(rec: Record) -> float:
    """The cost by which records of one key are ranked (module docstring); inf for a failed one."""
    if not rec.ok:
        return math.inf
    uncertainty = spread(rec.costs)
    if rec.noise is not None and rec.noise.interference > DISTURBED_INTERFERENCE:
        uncertainty += DISTURBED_MARGIN
    return rec.mean_cost * (1.0 + uncertainty)


def _typed(obj: dict, key: str, kind):
    if key not in obj:
        raise ValueError(f"missing field {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"field {key!r} has the wrong type ({type(value).__name__})")
    return value


@functools.cache
def host_info() -> dict:
    """The machine that measured: CPU, cores, OS, and the Python and LLVM versions."""
    import llvmlite
    import llvmlite.binding as llvm

    return {
        "machine": platform.machine(),
        "system": platform.system(),
        "cpu": llvm.get_host_cpu_name(),
        "cpu_model": _cpu_model(),
        "cores": _host_cores(),
        "python": platform.python_version(),
        "llvmlite": llvmlite.__version__,
        "llvm": ".".join(str(v) for v in llvm.llvm_version_info),
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


# ----------------------------------------------------------------------------- writing


def append_records(path: str | os.PathLike, records: Iterable[Record], fsync: bool = False) -> None:
    """Append records, one `os.write` per line on an O_APPEND descriptor (concurrent writers never
    interleave lines); creates parent directories."""
    path = os.fspath(path)
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        lead = b"\n" if _ends_mid_line(fd) else b""
        for rec in records:
            data = lead + rec.to_json().encode() + b"\n"
            lead = b""
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(f"{path}: short write ({written} of {len(data)} bytes); the disk may be full")
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _ends_mid_line(fd: int) -> bool:
    """True if the file's last line has no newline (a writer died mid-line): start ours on a fresh line."""
    size = os.fstat(fd).st_size
    return size > 0 and os.pread(fd, 1, size - 1) != b"\n"


def append_results(
    path: str | os.PathLike,
    dag: ComputeDAG,
    target: Target,
    states: Iterable[State],
    results: Iterable[MeasureResult],
    fsync: bool = False,
) -> None:
    """Append one record per measured state (what Ansor's RecordToFile callback does)."""
    recs = [Record.from_result(dag, target, s, r) for s, r in zip(states, results, strict=True)]
    append_records(path, recs, fsync)


# ----------------------------------------------------------------------------- reading


def load_records(path: str | os.PathLike) -> list[Record]:
    """Every readable record of a file; blank and `#` lines are ignored, bad lines skipped with a warning."""
    path = os.fspath(path)
    records: list[Record] = []
    corrupt: list[tuple[int, str]] = []
    newer: list[int] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            try:
                rec = Record.from_json(text)
            except ValueError as err:
                version = _version_of(text)
                if version is not None and version != RECORD_VERSION:
                    newer.append(lineno)
                else:
                    corrupt.append((lineno, str(err)))
                continue
            if rec.version != RECORD_VERSION:
                newer.append(lineno)
                continue
            records.append(rec)
    _warn_skipped(path, corrupt, newer)
    return records


def _version_of(text: str):
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    return obj.get("v") if isinstance(obj, dict) else None


def _warn_skipped(path: str, corrupt: list[tuple[int, str]], newer: list[int]) -> None:
    if corrupt:
        lines = ", ".join(str(n) for n, _ in corrupt[:_LINES_NAMED]) + (
            ", ..." if len(corrupt) > _LINES_NAMED else ""
        )
        first_line, first_err = corrupt[0]
        warnings.warn(
            f"{path}: skipped {len(corrupt)} corrupt record line(s): line {lines} "
            f"(line {first_line}: {first_err})",
            RecordWarning,
            stacklevel=3,
        )
    if newer:
        lines = ", ".join(str(n) for n in newer[:_LINES_NAMED]) + (
            ", ..." if len(newer) > _LINES_NAMED else ""
        )
        warnings.warn(
            f"{path}: skipped {len(newer)} record line(s) of a format version other than {RECORD_VERSION} "
            f"(written by another aotc version?): line {lines}",
            RecordWarning,
            stacklevel=3,
        )


# ----------------------------------------------------------------------------- choosing


def best_records(records: Iterable[Record]) -> dict[tuple[str, str], Record]:
    """The best valid record (lowest `rank_cost`) per (workload_key, target string)."""
    best: dict[tuple[str, str], Record] = {}
    for rec in records:
        if not rec.ok:
            continue
        key = (rec.workload_key, rec.target)
        if key not in best or rank_cost(rec) < rank_cost(best[key]):
            best[key] = rec
    return best


def apply_best(
    records: Iterable[Record] | str | os.PathLike, dag: ComputeDAG, target: Target
) -> tuple[State, Record] | None:
    """The state of the best valid record (`rank_cost`) for exactly this target string and DAG fingerprint.

    Records measured with the target's hardware parameters come first. Each candidate is replayed
    and lowered on `dag`; one that fails is skipped with a warning and the next best is tried.
    """
    from aotc.schedule.lower import lower

    if isinstance(records, str | os.PathLike):
        records = load_records(records)
    target_str, hw = str(target), asdict(target.hw)
    matching = [r for r in records if r.ok and r.target == target_str and r.fingerprint == dag.fingerprint]
    matching.sort(key=lambda r: (r.hw != hw, rank_cost(r)))
    for rec in matching:
        try:
            state = rec.state(dag)
            lower(state, "check")
        except Exception as err:
            warnings.warn(
                f"a record of workload {rec.workload_key} no longer applies to {dag} "
                f"({type(err).__name__}: {err}); trying the next best",
                RecordWarning,
                stacklevel=2,
            )
            continue
        return state, rec
    return None
