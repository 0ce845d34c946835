"""Tuning on a Ray cluster: devices join it and measure the candidates builds send them, built on the
cluster's CPUs (docs/cluster.md).

Ray is imported only by a build's cluster driver process and by `aotc worker`, never by `import aotc`
or this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aotc.cluster.driver import ClusterError, cluster_problem
from aotc.cluster.keys import DeviceKey, device_key
from aotc.cluster.ledger import DeviceLedger, DeviceRow
from aotc.cluster.measurer import CLUSTER_ENV, Cluster, ClusterMeasurer, check_address

if TYPE_CHECKING:
    import argparse

__all__ = [
    "CLUSTER_ENV",
    "Cluster",
    "ClusterError",
    "ClusterMeasurer",
    "DeviceKey",
    "DeviceLedger",
    "DeviceRow",
    "add_worker_parser",
    "check_address",
    "cluster_problem",
    "cmd_worker",
    "device_key",
]


# `aotc worker`'s entry points, imported on use: `python -m aotc.cluster.worker` then runs a module this
# package has not imported yet
def add_worker_parser(subparsers) -> argparse.ArgumentParser:
    """Register `aotc worker` on the `aotc` command's subparsers."""
    from aotc.cluster.worker import add_worker_parser as add

    return add(subparsers)


def cmd_worker(args: argparse.Namespace) -> int:
    """Run `aotc worker` (this machine's Ray node) until it is stopped; its exit code."""
    from aotc.cluster.worker import cmd_worker as run

    return run(args)
