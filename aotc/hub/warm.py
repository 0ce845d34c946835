"""Which stored records warm-start the cost model (transfer from earlier builds of the same workloads);
the cost model itself learns from them (`XGBCostModel.warm_start`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from aotc.schedule.state import State
from aotc.search.records import Record
from aotc.target import Target
from aotc.te.dag import ComputeDAG

if TYPE_CHECKING:
    from aotc.hub.lookup import RecordSources
    from aotc.search.cost_model import XGBCostModel


def warm_start(
    model: XGBCostModel,
    sources: RecordSources,
    target: Target,
    dags: dict[str, ComputeDAG],
    max_per_workload: int = 512,
    transfer: bool = False,
) -> int:
    """Train `model` on the stored records of `target` whose fingerprint is one of `dags` (the tasks of
    the model being built; a record's features need its DAG). Returns how many programs were added.

    With `transfer`, records of other CPUs of the same ISA count too, each CPU class as a task of its own:
    the model's labels are normalized per task, so foreign costs only rank schedules among themselves.
    Each group contributes its `max_per_workload` fastest records; records that no longer replay are
    skipped.
    """
    by_fingerprint = {dag.fingerprint: dag for dag in dags.values()}
    groups: dict[tuple[str, str], list[Record]] = {}
    for rec in sources.records_for(target):
        if rec.fingerprint in by_fingerprint:
            groups.setdefault((rec.fingerprint, ""), []).append(rec)
    for rec, _, key in sources.records_across(target) if transfer else ():
        if rec.fingerprint in by_fingerprint:
            groups.setdefault((rec.fingerprint, key.text), []).append(rec)

    def samples() -> Iterator[tuple[str, list[State], list[float]]]:
        for (fingerprint, origin), recs in groups.items():
            dag = by_fingerprint[fingerprint]
            states, costs = [], []
            for rec in sorted(recs, key=lambda r: r.mean_cost)[:max_per_workload]:
                try:
                    states.append(rec.state(dag))
                except Exception:  # noqa: BLE001 - a record that no longer replays teaches nothing
                    continue
                costs.append(rec.mean_cost)
            yield (f"{dag.workload_key}@{origin}" if origin else dag.workload_key), states, costs

    return model.warm_start(samples())
