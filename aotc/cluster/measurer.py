"""The build side of tuning on a cluster: `Cluster`, a build's link to a Ray cluster, and the measurers
it opens (docs/cluster.md#builds).

A `Cluster` starts one driver process for the build (aotc.cluster.driver: the only process of a build that
imports Ray) and keeps it for every task: a `ClusterMeasurer` is a `Measurer` whose batches that process
builds on the cluster's CPUs and measures on the target's devices, several at once. Measurers of one
cluster take turns: the one that measures makes its task the driver's current one first (every device
then builds that task's reference, about a second).
"""

from __future__ import annotations

import multiprocessing as mp
import time
import weakref
from collections.abc import Sequence

from aotc.search.common import ErrorCode, MeasureResult, Noise
from aotc.search.measure import BatchStats, MeasureError, MeasureOptions, Measurer
from aotc.search.model_tuning import cluster_address_problem
from aotc.search.workers import STARTUP_TIMEOUT, RunnerProcess, Worker, WorkerStartError
from aotc.target import Target, as_target
from aotc.te.dag import ComputeDAG

__all__ = ["CLUSTER_ENV", "Cluster", "ClusterMeasurer", "check_address"]

CLUSTER_ENV = "AOTC_CLUSTER"
SETUP_SECONDS = 90.0 + 30.0  # the driver's SETUP_TIMEOUT and the Ray connection around it
PER_CANDIDATE_SLACK = 10.0


def check_address(address: str) -> str:
    """`address` stripped; ValueError unless it is HOST:PORT (of a Ray head)."""
    address = str(address).strip()
    problem = cluster_address_problem(address)
    if problem:
        raise ValueError(f"cluster address: {problem}")
    return address


class Cluster:
    """A build's link to the Ray cluster at `address` (HOST:PORT of its head): one driver process,
    started on first use and restarted if it dies; `open_measurer` has `Measurer`'s signature. Close it
    (or use it as a context manager) to end the driver, whose actors Ray then ends."""

    def __init__(self, address: str) -> None:
        self.address = check_address(address)
        self.current: ClusterMeasurer | None = None  # the measurer whose task the driver holds
        self._holder: list[Worker] = []
        self._finalizer = weakref.finalize(self, _stop_driver, self._holder)

    def open_measurer(
        self, dag: ComputeDAG, target: Target | str, options: MeasureOptions | None = None
    ) -> ClusterMeasurer:
        return ClusterMeasurer(dag, target, options, self)

    def ask(self, request: tuple, timeout: float) -> object:
        """The driver's answer to `request`; MeasureError when it cannot start, fails, dies or passes
        `timeout`. A request left unanswered (Ctrl-C) ends the driver: its answer would come late."""
        worker = self._driver()
        try:
            worker.submit(0, request, timeout)
            if not worker.conn.poll(timeout):
                raise MeasureError(f"the cluster driver did not answer within {timeout:g} s")
            _, (_, (status, answer)) = worker.receive()
        except (EOFError, OSError):
            reason = worker.death_reason()
            self._end_driver()
            raise MeasureError(f"the cluster driver died ({reason})") from None
        except BaseException:
            self._end_driver()
            raise
        if status == "error":
            raise MeasureError(answer)
        return answer

    def _driver(self) -> Worker:
        if self._holder and self._holder[0].proc.is_alive():
            return self._holder[0]
        self._end_driver()
        from aotc.cluster.driver import driver_main

        worker = Worker(mp.get_context("spawn"), "aotc-cluster-driver", driver_main, ({}, self.address))
        self._holder.append(worker)
        try:
            RunnerProcess(worker, "the cluster driver").await_ready()
        except WorkerStartError as err:
            self._end_driver()
            raise MeasureError(str(err)) from None
        return worker

    def _end_driver(self) -> None:
        _stop_driver(self._holder)
        self.current = None

    def close(self) -> None:
        self._finalizer()
        self.current = None

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Cluster({self.address!r})"


def _stop_driver(holder: list[Worker]) -> None:
    while holder:
        worker = holder.pop()
        worker.ask_to_stop()
        worker.proc.join(timeout=15.0)  # Ray's shutdown
        worker.kill()


class ClusterMeasurer(Measurer):
    """A `Measurer` whose candidates are built on the cluster's CPUs and measured on its devices for the
    target (docs/cluster.md#builds): same results, same error codes; a result's `host` is the device that
    measured it, and `last_batch.devices` the cluster's devices after the batch."""

    measures_here = False

    def __init__(
        self, dag: ComputeDAG, target: Target | str, options: MeasureOptions | None, cluster: Cluster
    ) -> None:
        self.cluster = cluster
        super().__init__(dag, as_target(target), options)

    def _start(self) -> None:
        self._take_driver()

    def _take_driver(self) -> None:
        """Make this measurer's task the driver's current one (every device sets it up)."""
        if self.cluster.current is self:
            return
        from aotc.cluster.driver import plain_options

        request = ("task", (self.dag, str(self.target), plain_options(self.options), self.threads))
        self.cluster.current = None
        self.cluster.ask(request, SETUP_SECONDS + STARTUP_TIMEOUT)
        self.cluster.current = self

    def close(self) -> None:
        if self.cluster.current is self:
            self.cluster.current = None
        super().close()

    def _measure_tasks(
        self, n: int, tasks: list, cutoff: float | None
    ) -> tuple[list[MeasureResult], BatchStats]:
        """Built on the cluster's CPUs and measured on its devices; a driver that fails mid-batch makes
        every candidate of the batch RUNTIME_DEVICE, saying why."""
        start = time.perf_counter()
        self._take_driver()  # MeasureError: no device takes the task (any more)
        o = self.options
        timeout = SETUP_SECONDS + len(tasks) * (o.build_timeout + o.timeout + PER_CANDIDATE_SLACK)
        try:
            answer = self.cluster.ask(("measure", (tasks, cutoff)), timeout)
        except MeasureError as err:
            lost = (int(ErrorCode.RUNTIME_DEVICE), str(err), [], None, None, 0.0, 0.0)
            answer = {"results": [lost] * len(tasks)}
        build_s = answer.get("build_seconds", 0.0)
        stats = BatchStats(
            n,
            build_s,
            time.perf_counter() - start - build_s,
            tuple(answer.get("devices", ())),
            answer.get("queue_depth", 0),
        )
        return [_result(r) for r in answer["results"]], stats


def _result(answer: Sequence) -> MeasureResult:
    error, msg, costs, noise, host, build_s, run_s = answer
    noise = None if noise is None else Noise(**noise)
    return MeasureResult(list(costs), ErrorCode(error), msg, build_s, run_s, noise=noise, host=host)
