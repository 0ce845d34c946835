"""Records across CPU classes and twin workloads: candidates for a task that has no record for its
exact target.

A record tuned on another CPU of the same ISA (another `-mcpu`, other `-mattr` features or core count)
is never applied for its foreign cost. Its schedule is a candidate: the build replays it, measures it
here next to the default schedule, and the faster one wins (the search's first round when tuning, a
measurement of about a second per task without a budget). Candidates come from the closest CPU class
first (same CPU model before another one, then the fewest differing features), fastest first there
(by rank_cost: a noisy measurement ranks behind a steady one).

A task's twin is a workload with the same loops that computes with other constants (the DAGs'
`structure_key` agree, their fingerprints do not): the same layer of another int8 model, calibrated to
other zero points and scales. Records of twins, on this CPU or another of its ISA, are candidates the
same way, after those of the task itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from aotc.hub.lookup import RecordSources
from aotc.hub.store import TargetKey
from aotc.schedule.state import State
from aotc.search.records import Record, rank_cost
from aotc.target import Target
from aotc.te.dag import ComputeDAG

MAX_CANDIDATES = 3  # foreign schedules measured per task: with the default, about a second per task


@dataclass
class Candidate:
    """A replayed schedule of another CPU's record, to be measured here."""

    state: State
    record: Record
    where: str
    origin: str
    same_as_default: bool = False  # lowers to the default schedule's loops: measured as that


@dataclass
class Transfer:
    """What one task takes from other CPUs of its ISA: candidates, and the records skipped and why."""

    candidates: list[Candidate] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def origin(self) -> str:
        """The CPU class(es) the candidates come from, closest first (`znver4`)."""
        names = list(dict.fromkeys(c.origin for c in self.candidates))
        return ", ".join(names) or "?"

    def __str__(self) -> str:
        text = (
            f"transferred from {self.origin}: {len(self.candidates)} candidate(s) to measure here"
            if self.candidates
            else "no record of another CPU replays here"
        )
        same = sum(c.same_as_default for c in self.candidates)
        if same:
            text += f" ({same} of them the default schedule)"
        if self.skipped:
            text += f"; {len(self.skipped)} skipped ({self.skipped[0]})"
        return text

    @property
    def seeds(self) -> list[State]:
        """The candidates' states that are not the default schedule: what measuring here adds."""
        return [c.state for c in self.candidates if not c.same_as_default]


def origin_label(key: TargetKey, wanted: TargetKey) -> str:
    """`znver4`, or for the same CPU model what else differs (`znver4, other -mattr features`); `this
    CPU` for the target itself (a twin workload's record)."""
    if key == wanted:
        return "this CPU"
    if key.cpu != wanted.cpu:
        return key.cpu or key.arch
    what = "other -mattr features" if key.features != wanted.features else "another core count"
    return f"{key.cpu} with {what}"


def find_transfers(
    sources: RecordSources,
    dags: list[ComputeDAG],
    target: Target,
    limit: int = MAX_CANDIDATES,
    defaults: list[State] | None = None,
) -> list[Transfer | None]:
    """Per DAG, the best `limit` schedules of other CPUs of the target's ISA, then of its twins on any CPU
    of the ISA, that replay and lower on it (None where the store holds no such record). A record that
    does not replay is skipped with a reason; one that lowers to the DAG's default schedule
    (`defaults[i]`) is marked so."""
    wanted = TargetKey.of(target)
    by_fingerprint: dict[str, list[tuple[Record, str, TargetKey]]] = {}
    by_structure: dict[str, list[tuple[Record, str, TargetKey]]] = {}
    for rec, where, key in sources.records_across(target, own=True):
        if key != wanted:
            by_fingerprint.setdefault(rec.fingerprint, []).append((rec, where, key))
        if rec.structure is not None:
            by_structure.setdefault(rec.structure, []).append((rec, where, key))
    out: list[Transfer | None] = []
    for i, dag in enumerate(dags):
        found = by_fingerprint.get(dag.fingerprint, [])
        twins = [f for f in by_structure.get(dag.structure_key, []) if f[0].fingerprint != dag.fingerprint]
        default = defaults[i] if defaults else None
        out.append(_candidates(dag, found, twins, wanted, limit, default) if found or twins else None)
    return out


def _closeness(key: TargetKey, wanted: TargetKey) -> tuple:
    return (key.cpu != wanted.cpu, len(key.features ^ wanted.features), key.cores != wanted.cores)


def _candidates(
    dag: ComputeDAG,
    found: list[tuple[Record, str, TargetKey]],
    twins: list[tuple[Record, str, TargetKey]],
    wanted: TargetKey,
    limit: int,
    default: State | None,
) -> Transfer:
    """The best `limit` schedules that replay on `dag`: the task's own records of other CPUs first, then
    its twins' (this CPU before others), each group closest CPU class and fastest first."""
    from aotc.schedule.lower import lower
    from aotc.search.lowering import state_key

    default_key = None if default is None else state_key(default)

    def ranked(group: list[tuple[Record, str, TargetKey]]) -> list[tuple[Record, str, TargetKey]]:
        return sorted(group, key=lambda f: (_closeness(f[2], wanted), rank_cost(f[0])))

    transfer = Transfer()
    tried: set[str] = set()
    for rec, where, key in ranked(found) + ranked(twins):
        if len(transfer.candidates) == limit:
            break
        steps = json.dumps(rec.steps)
        if steps in tried:
            continue
        tried.add(steps)
        origin = origin_label(key, wanted)
        if rec.fingerprint != dag.fingerprint:
            origin = f"{origin}, a twin workload"
        try:
            state = rec.state(dag)
            lower(state, "check")
        except Exception as err:  # noqa: BLE001 - a foreign schedule that does not replay is only skipped
            transfer.skipped.append(
                f"a record from {origin} does not replay: {type(err).__name__}: {err} [{where}]"
            )
            continue
        same = default_key is not None and state_key(state) == default_key
        transfer.candidates.append(Candidate(state, rec, where, origin, same))
    return transfer


def transfer_outcome(
    transfer: Transfer, measured: list[Record], chosen: Record | None, default_steps: list
) -> dict:
    """What measuring a task's transferred candidates here gave: each candidate's foreign and local
    cost (or why it has none), the default schedule's local cost, and whether the kernel is one of them.

    `measured` are this target's records of the task; `chosen` the record the kernel comes from."""
    here: dict[str, Record] = {}
    for rec in measured:
        key = json.dumps(rec.steps)
        if key not in here or rec.mean_cost < here[key].mean_cost:
            here[key] = rec
    rows = []
    for c in transfer.candidates:
        rec = here.get(json.dumps(default_steps if c.same_as_default else c.record.steps))
        problem = "" if rec is not None and rec.ok else "not measured here (tuning stopped first)"
        if c.same_as_default and rec is None:
            problem = "the default schedule itself"
        if rec is not None and not rec.ok:
            problem = (
                f"failed here: {rec.error_msg.splitlines()[0] if rec.error_msg else f'error {rec.error}'}"
            )
        rows.append(
            {
                "from": c.origin,
                "source": c.where,
                "foreign_cost_s": c.record.mean_cost,
                "cost_s": rec.mean_cost if rec is not None and rec.ok else None,
                "problem": problem,
                "same_as_default": c.same_as_default,
            }
        )
    default = here.get(json.dumps(default_steps))
    if chosen is None or chosen.steps == default_steps:
        kernel = "default"  # also where a foreign record holds the default schedule
    elif any(chosen.steps == c.record.steps for c in transfer.candidates if not c.same_as_default):
        kernel = "transferred"
    else:
        kernel = "searched"
    return {
        "from": transfer.origin,
        "candidates": rows,
        "skipped": list(transfer.skipped),
        "default_cost_s": default.mean_cost if default is not None and default.ok else None,
        "kernel": kernel,  # which schedule the package uses: transferred, default or searched
    }


def describe_outcome(outcome: dict) -> str:
    """One line for `--explain-cache`: `transferred from znver4: best 0.0123 ms here (default 0.0200 ms)...`."""
    costs = [c["cost_s"] for c in outcome["candidates"] if c["cost_s"] is not None]
    best = f"best {min(costs) * 1e3:.4f} ms here" if costs else "none ran here"
    default = outcome["default_cost_s"]
    text = (
        f"transferred from {outcome['from']}: {len(costs)} of {len(outcome['candidates'])} measured, {best}"
    )
    if default is not None:
        text += f" (default schedule {default * 1e3:.4f} ms)"
    problems = [c["problem"] for c in outcome["candidates"] if c["problem"]] + outcome["skipped"]
    if problems:
        text += f"; {len(problems)} skipped: {problems[0]}"
    kernel = {
        "transferred": "the transferred schedule",
        "default": "the default schedule",
        "searched": "a schedule the search found",
    }
    return f"{text}; the kernel is {kernel[outcome['kernel']]}"
