"""Who measured what, and which devices a build no longer trusts (docs/cluster.md#faults).

The driver of a cluster build asks the ledger, for every answer a device gives, whether the candidate is
measured again on another device, and tells it when a device disagreed with another or died under a
candidate. A device that earns `QUARANTINE_STRIKES` strikes is quarantined: the build sends it nothing
more and names it in the report. Pure bookkeeping, no Ray, so that the policy is tested on its own.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from aotc.search.common import ErrorCode

__all__ = ["MAX_ATTEMPTS", "QUARANTINE_STRIKES", "RETRIED_ERRORS", "DeviceLedger", "DeviceRow"]

MAX_ATTEMPTS = 3  # a candidate is measured on at most this many devices
QUARANTINE_STRIKES = 3
# answers another device may contradict: a crash or a wrong output can be the device's own doing
RETRIED_ERRORS = (ErrorCode.RUNTIME_DEVICE, ErrorCode.WRONG_ANSWER)

READY, LOST, QUARANTINED = "ready", "lost", "quarantined"


@dataclass
class DeviceRow:
    """One device of a cluster build: `trials` it answered in the build, `batch_trials` in the latest
    batch, its `strikes` and, once lost or quarantined, why (`note`)."""

    name: str
    host: str = ""
    state: str = READY
    trials: int = 0
    batch_trials: int = 0
    strikes: int = 0
    note: str = ""

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class DeviceLedger:
    """The devices of one build and the retry and quarantine policy (module docstring)."""

    rows: dict[str, DeviceRow] = field(default_factory=dict)
    queue_depth: int = 0  # the most candidates that waited for a device in the latest batch

    def add(self, name: str, host: str = "") -> DeviceRow:
        row = self.rows.setdefault(name, DeviceRow(name, host))
        row.host = host or row.host
        if row.state == LOST:  # a node that came back
            row.state, row.note = READY, ""
        return row

    def usable(self, name: str) -> bool:
        row = self.rows.get(name)
        return row is not None and row.state == READY

    def start_batch(self) -> None:
        self.queue_depth = 0
        for row in self.rows.values():
            row.batch_trials = 0

    def waiting(self, depth: int) -> None:
        self.queue_depth = max(self.queue_depth, depth)

    def answered(self, name: str) -> None:
        row = self.rows[name]
        row.trials += 1
        row.batch_trials += 1

    def lost(self, name: str, why: str) -> None:
        row = self.rows[name]
        if row.state != QUARANTINED:
            row.state, row.note = LOST, why

    def strike(self, name: str, why: str) -> bool:
        """A strike against `name`; True when it quarantines the device."""
        row = self.rows[name]
        row.strikes += 1
        if row.strikes >= QUARANTINE_STRIKES and row.state != QUARANTINED:
            row.state, row.note = QUARANTINED, f"quarantined after {row.strikes} strikes, the last: {why}"
            return True
        return False

    @staticmethod
    def retry(error: ErrorCode, attempts: int, other_devices: int) -> bool:
        """Whether a candidate that got `error` after `attempts` tries is measured again elsewhere."""
        return error in RETRIED_ERRORS and attempts < MAX_ATTEMPTS and other_devices > 0

    def table(self) -> tuple[dict, ...]:
        return tuple(row.to_json() for row in self.rows.values())
