"""Tuning records: one measured candidate per JSON line, append-only, versioned (docs/records.md).

A line is `{"v", "workload_key", "fingerprint", "target", "hw", "steps", "costs", "error",
"error_msg", "timestamp", "aotc_version", "host"}`, and, for a candidate timed since aotc measures
interference, `"noise": {"interference", "spread", "retries"}` (aotc.search.interference); records
written since aotc recorded them carry `"flops"` and `"structure"` (the DAG's `structure_key`), and the
record of a task's untuned schedule, measured by a tuning since aotc marks it, `"untuned": true`. Loading
never fails on a bad line: lines of an unknown (newer) format version and corrupt lines are skipped
with a warning. Records are applied only to the exact target string and the exact DAG fingerprint,
and only after their steps replay and lower on the DAG (docs/records.md#validation-on-the-way-in).

The format version `v` changes only when a reader of the previous version would misread a line.
An optional field that older readers ignore does not change it: `noise` came in version 1, a line
without it loads as a record whose noise is unknown, and older aotc versions read the new lines.

Ranking records of one key (`rank_cost`, used wherever "the best record" is chosen): the mean cost
inflated by the record's relative uncertainty, the spread (max - min) / min of its repeats, plus
`DISTURBED_MARGIN` where other processes took more than `DISTURBED_INTERFERENCE` of the CPU while
it was timed. A noisy record must beat a quiet one by its noise to rank first, so a lucky noisy
timing does not displace a schedule measured quietly; among records measured alike, the cost decides.
Records without a noise field get the spread of their costs and no margin.

The record of a task's untuned schedule ranks by its mean cost less `UNTUNED_PREFERENCE`: a tuned
schedule replaces it only when measured that much faster alone, its own noise counted. A candidate is
timed alone, back to back, its weights in cache; in a model's sequence they are not, and the untuned
schedule is built for that (it prefetches the next weight block, docs/loop-ir.md). On Zen 5, QDQ
ResNet-18's last-stage convs tuned 1.6-2.2% faster alone ran 1.15-1.42x slower in the model
(docs/search.md#ranking-against-the-untuned-schedule). The untuned record's own spread does not count
against it: the spread keeps a lucky noisy timing from winning, and the untuned schedule is the one to
beat. It is measured first, on a freshly started runner, and its repeats spread 2-4% where the best
tuned ones' spread under 1%, which let a program 1.7% faster alone (1.16x slower in the model) through.

Records are data from other teams, so every reader validates them (`record_problem`, called by
`Record.from_json`): a successful record's costs are finite, at least `MIN_COST_S` and at most
`MAX_COST_S`; steps parse; the workload key is its fingerprint's prefix. A record also claims no more
FLOP/s than its target could compute (`peak_flops`): checked against its own `flops` field where it has
one (records written since aotc recorded it, an optional field), and, at lookup, against the DAG's FLOPs
and the target being built (`implausible_for`), which also covers records without the field.
"""

from __future__ import annotations

import functools
import json
import math
import os
import platform
import re
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from aotc import __version__
from aotc.schedule.state import State
from aotc.search.common import MeasureResult, Noise
from aotc.search.interference import spread
from aotc.target import Target, as_target, host_cores
from aotc.te.dag import ComputeDAG

__all__ = [
    "DISTURBED_INTERFERENCE",
    "DISTURBED_MARGIN",
    "MAX_COST_S",
    "MIN_COST_S",
    "RECORD_VERSION",
    "UNTUNED_PREFERENCE",
    "Record",
    "RecordWarning",
    "append_records",
    "ForeignLine",
    "RecordFile",
    "append_results",
    "apply_best",
    "best_records",
    "host_info",
    "implausible_for",
    "load_records",
    "parse_record_lines",
    "peak_flops",
    "rank_cost",
    "read_record_file",
    "is_emulated",
    "measured_by",
    "measuring_host",
    "record_problem",
]

RECORD_VERSION = 1
_ERROR_MSG_LIMIT = 1000
_LINES_NAMED = 20
DISTURBED_INTERFERENCE = 0.2  # the measurer's default max_interference
DISTURBED_MARGIN = 0.05
# How much faster alone a tuned schedule must measure to rank ahead of the untuned one (module docstring).
UNTUNED_PREFERENCE = 0.03
# No kernel call returns in less than a nanosecond (the call alone costs several), and no candidate
# is timed for an hour: costs outside these bounds are forged or corrupt, not measured.
MIN_COST_S = 1e-9
MAX_COST_S = 3600.0
# A generous ceiling on a CPU's arithmetic rate: per core, one lane per byte of the vector register
# (int8 lanes, 4x float32's, so quantized kernels fit too), 2 FMA units, 2 FLOPs per FMA, at 6 GHz
# (above any shipping CPU's boost clock). A record claiming more FLOP/s than this was not measured.
CLOCK_CEILING_HZ = 6e9
FMA_UNITS = 2
_STEP_INT_LIMIT = 2**31


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
    flops: int | None = None  # the DAG's FLOPs; None in records written before aotc recorded it
    # the DAG's structure_key (its fingerprint without value constants): None in older records
    structure: str | None = None
    untuned: bool = False  # the task's untuned schedule, as the tuning that measured it built it

    @property
    def ok(self) -> bool:
        return self.error == 0 and bool(self.costs)

    @property
    def mean_cost(self) -> float:
        """Mean seconds per run; inf for a failed candidate."""
        return sum(self.costs) / len(self.costs) if self.ok else math.inf

    @staticmethod
    def from_result(
        dag: ComputeDAG, target: Target, state: State, result: MeasureResult, untuned: bool = False
    ) -> Record:
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
            host=result.host or measuring_host(target),
            noise=result.noise,
            flops=int(dag.flop_count),
            structure=dag.structure_key,
            untuned=untuned,
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
        if self.flops is not None:
            obj["flops"] = self.flops
        if self.structure is not None:
            obj["structure"] = self.structure
        if self.untuned:
            obj["untuned"] = True
        return json.dumps(obj, separators=(",", ":"), allow_nan=False)

    @staticmethod
    def from_json(line: str) -> Record:
        """Parse and validate one line (`record_problem`); raises ValueError on anything malformed or
        implausible (the version is not checked here)."""
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
                costs=[_number(c, "costs") for c in _typed(obj, "costs", list)],
                error=_typed(obj, "error", int),
                error_msg=_typed(obj, "error_msg", str),
                timestamp=float(_typed(obj, "timestamp", int | float)),
                aotc_version=_typed(obj, "aotc_version", str),
                host=_typed(obj, "host", dict),
                version=_typed(obj, "v", int),
                noise=_noise(obj["noise"]) if obj.get("noise") is not None else None,
                flops=_typed(obj, "flops", int) if obj.get("flops") is not None else None,
                structure=_typed(obj, "structure", str) if obj.get("structure") is not None else None,
                untuned=_typed(obj, "untuned", bool) if "untuned" in obj else False,
            )
        except (TypeError, OverflowError) as err:
            raise ValueError(str(err)) from None
        problem = record_problem(rec)
        if problem:
            raise ValueError(problem)
        return rec

    def state(self, dag: ComputeDAG) -> State:
        """The record's state, rebuilt by replaying its steps on `dag` (raises ScheduleError)."""
        from aotc.schedule.steps import replay, steps_from_json

        return replay(dag, steps_from_json(self.steps))


def _number(value, key: str) -> float:
    """A JSON number as a float; a string, boolean or null is refused (float() would take "1e-5")."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"field {key!r} holds {type(value).__name__} {str(value)[:20]!r}, not a number")
    return float(value)


def _noise(obj) -> Noise:
    if not isinstance(obj, dict):
        raise ValueError(f"field 'noise' has the wrong type ({type(obj).__name__})")
    interference = float(_typed(obj, "interference", int | float))
    spread_ = float(_typed(obj, "spread", int | float))
    retries = _typed(obj, "retries", int)
    if not (0 <= interference <= 1 and spread_ >= 0 and retries >= 0):
        raise ValueError(f"field 'noise' out of range: {obj}")
    return Noise(interference, spread_, retries)


_STRUCTURE_KEY = re.compile(r"[0-9a-f]{32}")


def record_problem(rec: Record) -> str:
    """Why `rec` is not a record to store or use, or "" when it is valid (module docstring)."""
    if not rec.workload_key or not rec.fingerprint.startswith(rec.workload_key):
        return f"workload_key {rec.workload_key[:40]!r} is not a prefix of the fingerprint"
    if not rec.target.strip():
        return "empty target"
    if not 0 <= rec.error < 256:
        return f"error code {rec.error} out of range"
    if not (math.isfinite(rec.timestamp) and rec.timestamp >= 0):
        return f"timestamp {rec.timestamp} is not a finite time"
    if any(not math.isfinite(c) for c in rec.costs):
        return f"cost {_first(c for c in rec.costs if not math.isfinite(c))} is not finite"
    if rec.error == 0:
        if not rec.costs:
            return "a successful record without costs"
        low, high = min(rec.costs), max(rec.costs)
        if low < MIN_COST_S:
            return f"cost {low:g} s is below {MIN_COST_S:g} s (not a measured time)"
        if high > MAX_COST_S:
            return f"cost {high:g} s is above {MAX_COST_S:g} s (not a measured time)"
    for name in ("num_cores", "vector_bytes"):
        value = rec.hw.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            return f"hw.{name} {value!r} is not a count"
    if rec.structure is not None and not _STRUCTURE_KEY.fullmatch(rec.structure):
        return f"structure {rec.structure[:40]!r} is not 32 hex digits"
    if rec.flops is not None:
        if rec.flops < 0:
            return f"flops {rec.flops} is negative"
        problem = implausible_for(rec, rec.flops, rec.hw)
        if problem:
            return problem
    problem = _steps_problem(rec.steps)
    return f"steps: {problem}" if problem else ""


def _first(values: Iterable):
    return next(iter(values))


def _steps_problem(steps: list) -> str:
    from aotc.schedule.steps import steps_from_json

    try:
        steps_from_json(steps)
    except Exception as err:  # noqa: BLE001 - any failure to parse means the steps are garbage
        return f"{type(err).__name__}: {str(err)[:200]}"
    stack = [steps]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, float) and not math.isfinite(item):
            return f"non-finite number {item}"
        elif isinstance(item, int | float) and abs(item) >= _STEP_INT_LIMIT:
            return f"number {item:g} out of range"
    return ""


def peak_flops(hw: dict) -> float:
    """The generous FLOP/s ceiling (`CLOCK_CEILING_HZ`) of a CPU target's hardware parameters."""
    cores = max(int(hw.get("num_cores") or 1), 1)
    vector_bytes = max(int(hw.get("vector_bytes") or 64), 1)
    return cores * vector_bytes * FMA_UNITS * 2 * CLOCK_CEILING_HZ


def implausible_for(rec: Record, flops: float, hw: dict) -> str:
    """Why `rec` (a successful CPU record) claims a rate no CPU of `hw` reaches for a task of `flops`
    FLOPs, or "". Only llvm (CPU) targets are checked: GPUs have no ceiling here yet."""
    if not rec.ok or not rec.target.startswith("llvm") or flops <= 0:
        return ""
    rate = flops / min(rec.costs)
    peak = peak_flops(hw)
    if rate > peak:
        return (
            f"cost {min(rec.costs):g} s for {flops:g} FLOPs is {rate / 1e9:.4g} GFLOP/s, more than the "
            f"target's ceiling of {peak / 1e9:.4g} GFLOP/s (not a measured time)"
        )
    return ""


def rank_cost(rec: Record) -> float:
    """The cost by which records of one key are ranked (module docstring); inf for a failed one."""
    if not rec.ok:
        return math.inf
    if rec.untuned:  # what a tuned record must beat, not a lucky timing: its noise does not count against it
        return rec.mean_cost * (1.0 - UNTUNED_PREFERENCE)
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


def measuring_host(target: Target) -> dict:
    """`host_info()`, and for a target of another architecture, measured here under qemu, `emulated`:
    the emulator and CPU model. Such a record's timing says nothing about the device (`is_emulated`)."""
    import llvmlite.binding as llvm

    from aotc.emulator import EMULATORS, qemu_cpu
    from aotc.target import arch_of

    info = host_info()
    if target.is_cpu and target.isa != arch_of(llvm.get_process_triple()) and target.isa in EMULATORS:
        info = {**info, "emulated": f"{EMULATORS[target.isa].qemu} -cpu {qemu_cpu(target)}"}
    return info


def measured_by(host: dict) -> str:
    """A record's measuring machine in words: its CPU and cores, the emulator where it ran under one, and
    the cluster's device (node address/id) that measured it."""
    if not isinstance(host, dict):
        return "unknown"
    where = f"{host.get('cpu_model') or host.get('cpu') or 'unknown CPU'} ({host.get('cores', '?')} cores)"
    where = f"{where} under {host['emulated']}" if host.get("emulated") else where
    return f"{where} on {host['device']}" if host.get("device") else where  # a cluster's device


def is_emulated(rec: Record) -> bool:
    """Measured under an emulator: a valid schedule, whose timing says nothing about the device, so a
    store that shares timings keeps it out."""
    return bool(rec.host.get("emulated")) if isinstance(rec.host, dict) else False


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
        "cores": host_cores(),
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
    interleave lines); creates parent directories. An invalid record (`record_problem`) is skipped
    with a RecordWarning, never written."""
    path = os.fspath(path)
    lines = []
    for rec in records:
        problem = record_problem(rec)
        if problem:  # never stored: readers would refuse it; a tuning run goes on without it
            warnings.warn(
                f"{path}: not writing an invalid record of {rec.workload_key}: {problem}",
                RecordWarning,
                stacklevel=2,
            )
            continue
        lines.append(rec.to_json().encode() + b"\n")
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        lead = b"\n" if _ends_mid_line(fd) else b""
        for line in lines:
            data = lead + line
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
    target: Target | str,
    states: Iterable[State],
    results: Iterable[MeasureResult],
    fsync: bool = False,
    untuned: Iterable[bool] | None = None,
) -> None:
    """Append one record per measured state (what Ansor's RecordToFile callback does); `untuned` says
    which states are the task's untuned schedule (none if not given)."""
    target = as_target(target)
    states, results = list(states), list(results)
    flags = [False] * len(states) if untuned is None else list(untuned)
    recs = [Record.from_result(dag, target, s, r, u) for s, r, u in zip(states, results, flags, strict=True)]
    append_records(path, recs, fsync)


# ----------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class ForeignLine:
    """A line of another record format version: enough of it to say why it is not used."""

    version: object
    workload_key: str
    fingerprint: str
    target: str
    lineno: int


@dataclass
class RecordFile:
    """What one record file holds: current-version records, lines of other versions, corrupt lines."""

    path: str
    records: list[Record] = field(default_factory=list)
    foreign: list[ForeignLine] = field(default_factory=list)
    corrupt: list[tuple[int, str]] = field(default_factory=list)


def parse_record_lines(lines: Iterable[str], path: str) -> RecordFile:
    """The one record-line reader: classify lines (blank and `#` lines are ignored); never raises on
    bad content."""
    out = RecordFile(path)
    for lineno, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        try:
            obj = json.loads(text)
        except ValueError as err:
            out.corrupt.append((lineno, f"not JSON ({err})"))
            continue
        if not isinstance(obj, dict):
            out.corrupt.append((lineno, f"expected a JSON object, got {type(obj).__name__}"))
            continue
        if obj.get("v") != RECORD_VERSION:
            fields = (str(obj.get(k, "")) for k in ("workload_key", "fingerprint", "target"))
            out.foreign.append(ForeignLine(obj.get("v"), *fields, lineno))
            continue
        try:
            out.records.append(Record.from_json(text))
        except ValueError as err:
            out.corrupt.append((lineno, str(err)))
    return out


def read_record_file(path: str | os.PathLike) -> RecordFile:
    """Every line of a record file (a build's log or a tophub store file), classified."""
    path = os.fspath(path)
    with open(path, encoding="utf-8", errors="replace") as f:
        return parse_record_lines(f, path)


def load_records(path: str | os.PathLike) -> list[Record]:
    """Every readable record of a file; blank and `#` lines are ignored, bad lines skipped with a warning."""
    content = read_record_file(path)
    _warn_skipped(content.path, content.corrupt, [line.lineno for line in content.foreign])
    return content.records


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
    records: Iterable[Record] | str | os.PathLike, dag: ComputeDAG, target: Target | str
) -> tuple[State, Record] | None:
    """The state of the best valid record (`rank_cost`) for exactly this target string and DAG fingerprint.

    Records measured with the target's hardware parameters come first. Each candidate is replayed
    and lowered on `dag`; one that fails is skipped with a warning and the next best is tried.
    """
    from aotc.schedule.lower import lower

    if isinstance(records, str | os.PathLike):
        records = load_records(records)
    target = as_target(target)
    target_str, hw = str(target), asdict(target.hw)
    matching = [
        r
        for r in records
        if r.ok
        and r.target == target_str
        and r.fingerprint == dag.fingerprint
        and not _warn_implausible(r, dag, hw)
    ]
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


def _warn_implausible(rec: Record, dag: ComputeDAG, hw: dict) -> bool:
    """True (with a warning) when `rec` claims more FLOP/s on `dag` than the target `hw` computes."""
    problem = implausible_for(rec, dag.flop_count, hw)
    if problem:
        warnings.warn(
            f"a record of workload {rec.workload_key} skipped: {problem}", RecordWarning, stacklevel=3
        )
    return bool(problem)
