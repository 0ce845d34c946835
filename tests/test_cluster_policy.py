"""What a cluster build decides without Ray: retries and quarantine (aotc.cluster.ledger), how its devices
are shown, and what a build does when its cluster cannot be reached (docs/cluster.md#faults)."""

from __future__ import annotations

import logging
import socket

import pytest

from aotc.cluster import ClusterError
from aotc.cluster.ledger import MAX_ATTEMPTS, QUARANTINE_STRIKES, DeviceLedger
from aotc.progress import devices_line, devices_table, render_text
from aotc.search.common import ErrorCode
from aotc.search.measure import Measurer
from aotc.search.model_tuning import TuningOptions
from aotc.target import host_target, parse_target


def test_a_crash_or_a_wrong_answer_is_measured_again_elsewhere_a_bounded_number_of_times():
    for error in (ErrorCode.RUNTIME_DEVICE, ErrorCode.WRONG_ANSWER):
        assert DeviceLedger.retry(error, attempts=1, other_devices=1)
        assert not DeviceLedger.retry(error, attempts=MAX_ATTEMPTS, other_devices=1)
        assert not DeviceLedger.retry(error, attempts=1, other_devices=0)  # nobody else to ask
    for error in (ErrorCode.NO_ERROR, ErrorCode.RUN_TIMEOUT, ErrorCode.COMPILE_HOST):
        assert not DeviceLedger.retry(error, attempts=1, other_devices=3)  # the candidate's own doing


def test_a_device_is_quarantined_at_its_third_strike_and_stays_out():
    ledger = DeviceLedger()
    ledger.add("a", "EPYC (2 cores)")
    ledger.add("b")
    for n in range(1, QUARANTINE_STRIKES):
        assert not ledger.strike("a", f"disagreed {n}")
        assert ledger.usable("a")
    assert ledger.strike("a", "disagreed again")
    assert not ledger.usable("a") and ledger.usable("b")
    row = ledger.rows["a"]
    assert row.state == "quarantined" and "3 strikes" in row.note and "disagreed again" in row.note
    ledger.lost("a", "its node left")  # quarantine is not undone by anything later
    ledger.add("a")
    assert ledger.rows["a"].state == "quarantined"
    assert not ledger.strike("a", "once more")  # quarantined once, said once


def test_a_lost_device_comes_back_when_its_node_does():
    ledger = DeviceLedger()
    ledger.add("a")
    ledger.lost("a", "its node left the cluster")
    assert not ledger.usable("a") and ledger.rows["a"].note
    ledger.add("a")
    assert ledger.usable("a") and ledger.rows["a"].note == ""


def test_trials_per_device_and_queue_depth_per_batch():
    ledger = DeviceLedger()
    ledger.add("a")
    ledger.add("b")
    ledger.start_batch()
    for name in "aab":
        ledger.answered(name)
    ledger.waiting(5)
    ledger.waiting(2)
    assert (ledger.rows["a"].batch_trials, ledger.rows["b"].batch_trials, ledger.queue_depth) == (2, 1, 5)
    ledger.start_batch()
    ledger.answered("b")
    assert [(r["name"], r["batch_trials"], r["trials"]) for r in ledger.table()] == [("a", 0, 2), ("b", 1, 2)]
    assert ledger.queue_depth == 0


def test_the_round_line_and_table_name_the_devices_and_why_one_is_out():
    ledger = DeviceLedger()
    for name in ("10.0.0.2/ab12cd34", "10.0.0.3/ef56ab78", "10.0.0.4/00aa11bb"):
        ledger.add(name, "AMD EPYC (2 cores)")
    ledger.start_batch()
    ledger.answered("10.0.0.2/ab12cd34")
    ledger.lost("10.0.0.4/00aa11bb", "its node left the cluster")
    ledger.waiting(7)
    line = devices_line(ledger.table(), ledger.queue_depth)
    assert line == "devices 1/2 measuring, 1 out (10.0.0.4/00aa11bb lost), queue 7"
    text = render_text(devices_table(ledger.table()))
    assert (
        "10.0.0.3/ef56ab78" in text and "AMD EPYC (2 cores)" in text and "its node left the cluster" in text
    )


def _nobody_listening() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_an_unreachable_cluster_falls_back_to_this_machine_for_its_own_cpu(caplog):
    address = _nobody_listening()
    with (
        caplog.at_level(logging.WARNING, "aotc.tuning"),
        TuningOptions(cluster=address).measurers(host_target()) as opener,
    ):
        assert opener is Measurer
    assert (
        f"cannot reach the Ray cluster at {address}" in caplog.text
        and "measuring on this machine" in caplog.text
    )


def test_an_unreachable_cluster_is_an_error_for_a_target_this_machine_cannot_measure():
    address = _nobody_listening()
    target = parse_target("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72")
    with (
        pytest.raises(
            ClusterError, match=f"cannot reach the Ray cluster at {address}.*not this machine's CPU"
        ),
        TuningOptions(cluster=address).measurers(target),
    ):
        pass
