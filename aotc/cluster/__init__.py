"""Tuning on a Ray cluster: devices join it and measure the candidates builds send them
(docs/cluster.md).

Ray is imported only by a runner process that measures on a cluster and by `aotc worker`, never by
`import aotc` or this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aotc.cluster.keys import DeviceKey, device_key
from aotc.cluster.runner import (
    CLUSTER_ENV,
    ClusterError,
    ClusterRunnerMain,
    cluster_runner_main,
    measure_options_for,
)

if TYPE_CHECKING:
    import argparse

__all__ = [
    "CLUSTER_ENV",
    "ClusterError",
    "ClusterRunnerMain",
    "DeviceKey",
    "add_worker_parser",
    "cluster_runner_main",
    "cmd_worker",
    "device_key",
    "measure_options_for",
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
