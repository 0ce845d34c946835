"""The driver of a cluster build: compiles candidates on the cluster's CPUs and measures them on every
device of the target at once (docs/cluster.md#what-runs-where).

It runs in a child process of the build (`driver_main`), the only process of a build that imports Ray,
and answers two requests: `set_task` (a task's ComputeDAG: every device builds its reference and starts
its runner for it) and `measure` (a batch of candidates). A batch is a pipeline: each candidate is built
by a `CandidateBuilder` actor (one per CPU the cluster offers), and its bytes go from the builder's node
straight to the first idle device (a `DeviceRunner` actor pinned to each device node), so building and
measuring overlap and N devices measure N candidates at a time. Faults are answered per candidate, never
with a hang: a device that dies or passes the timeout is replaced, a candidate it lost is measured on
another device (at most `MAX_ATTEMPTS` in all), and `DeviceLedger` decides which devices to quarantine
(docs/cluster.md#faults).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import traceback
from collections import defaultdict, deque
from dataclasses import dataclass, field, fields

from aotc.cluster.keys import KEY_PREFIX, DeviceKey, device_key
from aotc.cluster.ledger import LOST, DeviceLedger
from aotc.search.common import ErrorCode
from aotc.search.records import measured_by
from aotc.search.workers import message_tail, serve

__all__ = [
    "ClusterDriver",
    "ClusterError",
    "cluster_problem",
    "connect",
    "device_keys_on",
    "driver_main",
    "pick_device_key",
    "plain_options",
]

NAMESPACE = "aotc"  # the Ray namespace of a build's actors, so that `ray.get_actor` and tests find them
SETUP_TIMEOUT = 90.0  # for the first device of a task to be placed and set up
CONNECT_TIMEOUT = 10.0  # for the head's port to accept a connection
TRANSFER_SLACK = 5.0  # over a timeout, for a candidate's bytes and the answer to travel
ACTOR_START_TIMEOUT = 120.0
RESTART_SLACK = 30.0  # for a device's runner to start again after a crash or a timeout  # for a new builder to be placed and import aotc
MAX_BUILDERS = 64
log = logging.getLogger("aotc.cluster")


class ClusterError(RuntimeError):
    """The cluster cannot measure this task: it cannot be reached, or no device there serves the target."""


def connect(address: str):
    """Ray, connected to the cluster at `address` (HOST:PORT of its head) as a driver in namespace "aotc".

    A driver runs on a node of the cluster (the head, or a machine joined with `aotc worker --no-device`):
    Ray connects it to that node's raylet (docs/cluster.md#setting-up-a-cluster). The head's port is
    tried first: `ray.init` retries an address where nothing answers for minutes."""
    _check_reachable(address)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        import ray
    except ImportError:
        raise ClusterError("measuring on a cluster needs Ray: pip install 'aotc[cluster]'") from None
    if not ray.is_initialized():
        try:
            ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING)
        except Exception as err:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, ValueError...
            raise ClusterError(
                f"cannot reach the Ray cluster at {address}: {type(err).__name__}: {err} "
                "(docs/cluster.md#setting-up-a-cluster)"
            ) from None
    return ray


def cluster_problem(address: str) -> str | None:
    """Why a build cannot tune on the cluster at `address` at all (Ray not installed, nothing answers at
    HOST:PORT), or None; checked before tuning starts, without importing Ray."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        return "tuning on a cluster needs Ray: pip install 'aotc[cluster]'"
    try:
        _check_reachable(address)
    except ClusterError as err:
        return str(err)
    return None


def _check_reachable(address: str) -> None:
    """ClusterError unless something accepts connections at HOST:PORT within CONNECT_TIMEOUT."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ClusterError(f"cluster address {address!r}: expected HOST:PORT of the Ray head")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT).close()
    except OSError as err:
        raise ClusterError(
            f"cannot reach the Ray cluster at {address}: {err.strerror or err} "
            "(is `aotc worker --head` running there? docs/cluster.md#setting-up-a-cluster)"
        ) from None


def device_keys_on(ray) -> list[str]:
    """The device keys the cluster's live nodes advertise."""
    return sorted(k for k in ray.cluster_resources() if k.startswith(KEY_PREFIX))


def pick_device_key(ray, target, address: str) -> DeviceKey:
    """The key of the devices for `target` on the cluster: those that measure for real if there are any,
    else those that run the target's code under qemu (said in the log: their timings mean nothing)."""
    offered = device_keys_on(ray)
    real = device_key(target)
    if real in offered:
        return real
    emulated = device_key(target, emulated=True)
    if target.is_cpu and emulated in offered:
        log.warning(f"measuring {target} on devices that run it under qemu: the timings mean nothing")
        return emulated
    wanted = f"{real} ({real.what})"
    if target.is_cpu:
        wanted += f" or {emulated} ({emulated.what})"
    raise ClusterError(
        f"no device on the Ray cluster at {address} measures {target}: none advertises {wanted}; "
        f"the cluster's devices: {', '.join(offered) or 'none'} (start one with `aotc worker --address "
        f"{address} --target '{target}'`; docs/cluster.md#device-keys)"
    )


def plain_options(options) -> dict:
    """MeasureOptions as keyword arguments a device rebuilds them from; `runner` stays here."""
    return {f.name: getattr(options, f.name) for f in fields(options) if f.name != "runner"}


def _error_text(err: BaseException) -> str:
    return message_tail(f"{type(err).__name__}: {err}".strip())


@dataclass
class _Device:
    """A device node: its actor (None until started, or after it died) and the task it is set up for."""

    name: str
    node_id: str
    actor: object = None
    task: int = -1  # the task number its runner is set up for
    busy: bool = False
    restarted: bool = False  # its runner restarts (after a crash or a timeout) before its next candidate
    host: dict = field(default_factory=dict)


@dataclass
class _Builder:
    actor: object
    ready: bool = False
    busy: bool = False
    builds: int = 0


@dataclass
class _Job:
    """Something the driver waits on: a builder's ping, a build, a device's setup, or a run."""

    kind: str
    worker: object  # a _Builder or a _Device
    deadline: float
    index: int = -1  # the candidate
    task: int = -1  # for a setup: the task it sets up


@dataclass
class _Batch:
    tasks: list
    cutoff: float | None
    results: list
    to_build: deque
    to_run: deque = field(default_factory=deque)
    built: dict = field(default_factory=dict)  # candidate -> (bytes ref, layouts, build seconds)
    started: dict = field(default_factory=dict)  # candidate -> when its run was sent
    attempts: defaultdict = field(default_factory=lambda: defaultdict(int))
    tried: defaultdict = field(default_factory=lambda: defaultdict(set))
    suspect: dict = field(default_factory=dict)  # candidate -> the device another may contradict
    rebuilt: set = field(default_factory=set)  # candidates built again after their builder's node left
    build_done: float = 0.0
    start: float = field(default_factory=time.monotonic)

    def finish(self, i: int, error: ErrorCode, msg: str, costs=(), noise=None, host=None, run_s: float = 0.0):
        build_s = self.built[i][2] if i in self.built else 0.0
        self.results[i] = (int(error), msg, list(costs), noise, host, build_s, run_s)


class ClusterDriver:
    """The state of one build on the cluster: its builders, its devices and their ledger (module
    docstring). Not thread-safe; one request at a time."""

    def __init__(self, address: str) -> None:
        self.ray = connect(address)
        self.address = address
        self.ledger = DeviceLedger()
        self.devices: dict[str, _Device] = {}  # by node id
        self.builders: list[_Builder] = []
        self.jobs: dict[object, _Job] = {}  # object ref -> what it answers
        self.blobs: dict[object, object] = {}  # a build's answer ref -> its bytes ref
        self.key: DeviceKey | None = None
        self.task = 0
        self.setup_args: tuple = ()
        self.options: dict = {}

    # -- requests

    def set_task(self, dag, target_text: str, options: dict, threads: int) -> tuple[dict, ...]:
        """Set every device up for the task of `dag`; waits for the first (SETUP_TIMEOUT). The ledger's
        table; ClusterError when no device can measure it."""
        from aotc.target import parse_target

        ray = self.ray
        key = pick_device_key(ray, parse_target(target_text), self.address)
        if key != self.key:  # another target: other devices
            self._drop_devices()
            self.key = key
        self.task += 1
        self.options = options
        self.setup_args = (ray.put(dag), options, target_text, threads)
        self._ensure_builders()  # ClusterError now, not a batch later, when no node offers a CPU
        self._refresh_devices()
        deadline = time.monotonic() + SETUP_TIMEOUT
        while not self._idle_devices() and self._setting_up() and time.monotonic() < deadline:
            self._wait(min(deadline, self._next_deadline()), None)
        if not self._idle_devices():
            problems = [f"{r.name}: {r.note}" for r in self.ledger.rows.values() if r.note]
            raise ClusterError(
                f"no device {key} ({key.what}) on the cluster at {self.address} took the task within "
                f"{SETUP_TIMEOUT:g} s: they measure for another build, or their nodes are gone"
                + (f" ({'; '.join(problems)})" if problems else "")
            )
        return self.ledger.table()

    def measure(self, tasks: list, cutoff: float | None) -> dict:
        """Build and measure a batch of (index, build task) pairs; their results, in order, as plain
        tuples (error, message, costs, noise dict, device host, build seconds, run seconds), with the
        batch's wall seconds and the ledger's table."""
        self._refresh_devices()
        self._ensure_builders()
        self.ledger.start_batch()
        start = time.monotonic()
        batch = _Batch(tasks, cutoff, [None] * len(tasks), deque(range(len(tasks))))
        try:
            while any(r is None for r in batch.results):
                self._dispatch(batch)
                self.ledger.waiting(len(batch.to_run))
                if not self._can_progress(batch):
                    self._give_up(batch)
                    break
                self._wait(self._next_deadline(), batch)
        except BaseException:
            self._abandon()
            raise
        end = time.monotonic()
        build_end = max(batch.build_done, start)
        return {
            "results": batch.results,
            "build_seconds": build_end - start,
            "run_seconds": end - build_end,
            "devices": self.ledger.table(),
            "queue_depth": self.ledger.queue_depth,
        }

    def close(self) -> None:
        for actor in [d.actor for d in self.devices.values()] + [b.actor for b in self.builders]:
            self._kill(actor)
        self.ray.shutdown()

    # -- devices

    def _refresh_devices(self) -> None:
        """Devices that joined get an actor and the task; those whose node left are lost."""
        alive = {
            n["NodeID"]: n for n in self.ray.nodes() if n["Alive"] and n["Resources"].get(self.key, 0) >= 1
        }
        for node_id, d in self.devices.items():
            if node_id not in alive and self.ledger.usable(d.name):
                self.ledger.lost(d.name, "its node left the cluster")
                self._drop_actor(d)
        for node_id, node in alive.items():
            d = self.devices.get(node_id)
            if d is None:
                name = f"{node['NodeManagerAddress']}/{node_id[:8]}"
                d = self.devices[node_id] = _Device(name, node_id)
            if self.ledger.rows.get(d.name) is None or self.ledger.rows[d.name].state == LOST:
                self.ledger.add(d.name)
            if self.ledger.usable(d.name) and d.task != self.task and not self._setting_up(d):
                self._set_up(d)

    def _set_up(self, d: _Device) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from aotc.cluster.device import DeviceRunner

        ray = self.ray
        if d.actor is None:
            d.actor = (
                ray.remote(concurrency_groups={"status": 1})(DeviceRunner)
                .options(
                    name=f"{self.key}/{d.node_id[:8]}/{os.getpid()}/{time.monotonic_ns()}",
                    namespace=NAMESPACE,
                    resources={self.key: 1},
                    num_cpus=0,
                    max_concurrency=1,
                    max_restarts=0,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(d.node_id, soft=False),
                )
                .remote()
            )
        ref = d.actor.setup.remote(*self.setup_args)
        self.jobs[ref] = _Job("setup", d, time.monotonic() + SETUP_TIMEOUT, task=self.task)

    def _setting_up(self, d: _Device | None = None) -> bool:
        return any(j.kind == "setup" and (d is None or j.worker is d) for j in self.jobs.values())

    def _idle_devices(self, exclude: set | None = None) -> list[_Device]:
        return [
            d
            for d in self.devices.values()
            if d.actor is not None
            and d.task == self.task
            and not d.busy
            and self.ledger.usable(d.name)
            and not (exclude and d.name in exclude)
        ]

    def _usable_devices(self) -> list[_Device]:
        return [d for d in self.devices.values() if self.ledger.usable(d.name)]

    def _drop_actor(self, d: _Device) -> None:
        self._kill(d.actor)
        d.actor, d.task, d.busy = None, -1, False
        for ref, job in list(self.jobs.items()):
            if job.worker is d and job.kind == "setup":
                del self.jobs[ref]

    def _drop_devices(self) -> None:
        for d in self.devices.values():
            self._kill(d.actor)
        self.devices.clear()
        self.ledger = DeviceLedger()
        self.jobs = {ref: j for ref, j in self.jobs.items() if not isinstance(j.worker, _Device)}

    def _device_failed(self, d: _Device, why: str) -> None:
        """The device's actor died or broke: lost with its node, else a strike and a new actor."""
        self._drop_actor(d)
        alive = any(n["NodeID"] == d.node_id and n["Alive"] for n in self.ray.nodes())
        if not self.ledger.usable(d.name):  # quarantined or lost already: no more strikes
            return
        if not alive:
            self.ledger.lost(d.name, f"its node left the cluster ({why})")
        elif self.ledger.strike(d.name, why):
            log.warning(f"device {d.name} quarantined: {self.ledger.rows[d.name].note}")
        elif self.ledger.usable(d.name):
            self._set_up(d)

    # -- builders

    def _ensure_builders(self) -> None:
        from aotc.cluster.device import CandidateBuilder

        ray = self.ray
        cpus = min(int(ray.cluster_resources().get("CPU", 0)), MAX_BUILDERS)
        if cpus == 0:
            raise ClusterError(
                f"no node of the cluster at {self.address} offers a CPU to build candidates on (devices offer "
                "none): join the build machine with `aotc worker --no-device` (docs/cluster.md#setting-up-a-cluster)"
            )
        remote = ray.remote(CandidateBuilder).options(namespace=NAMESPACE, num_cpus=1, max_restarts=0)
        while len(self.builders) < cpus:
            b = _Builder(remote.remote())
            self.builders.append(b)
            self.jobs[b.actor.ping.remote()] = _Job("ping", b, time.monotonic() + ACTOR_START_TIMEOUT)

    def _replace_builder(self, b: _Builder) -> None:
        self._kill(b.actor)
        self.builders.remove(b)
        self._ensure_builders()

    # -- the pipeline

    def _dispatch(self, batch: _Batch) -> None:
        build_timeout = self.options["build_timeout"] + TRANSFER_SLACK
        for b in self.builders:
            if batch.to_build and b.ready and not b.busy:
                i = batch.to_build.popleft()
                meta, blob = b.actor.build.options(num_returns=2).remote(
                    self.setup_args[0], self.setup_args[2], batch.tasks[i][1]
                )
                b.busy = True
                self.jobs[meta] = _Job("build", b, time.monotonic() + build_timeout, index=i)
                self.blobs[meta] = blob
        run_timeout = self.options["timeout"] + TRANSFER_SLACK
        for i in list(batch.to_run):
            idle = self._idle_devices(exclude=batch.tried[i])
            if not idle:
                continue
            d = min(idle, key=lambda x: self.ledger.rows[x.name].batch_trials)  # spread the batch
            blob, layouts, _ = batch.built[i]
            ref = d.actor.run.remote(blob, batch.cutoff, layouts)
            d.busy = True
            slack = RESTART_SLACK if d.restarted else 0.0
            batch.to_run.remove(i)
            batch.attempts[i] += 1
            batch.tried[i].add(d.name)
            batch.started[i] = time.monotonic()
            self.jobs[ref] = _Job("run", d, time.monotonic() + run_timeout + slack, index=i)

    def _give_up(self, batch: _Batch) -> None:
        """Nothing is in flight and candidates are left: no device (or builder) can take them."""
        for i in batch.to_run:
            tried = ", ".join(sorted(batch.tried[i]))
            why = f"no device {self.key} ({self.key.what}) is left on the cluster at {self.address}"
            batch.finish(
                i,
                ErrorCode.RUNTIME_DEVICE,
                why + (f" that has not tried it (tried: {tried})" if tried else ""),
            )
        for i in batch.to_build:
            batch.finish(
                i,
                ErrorCode.COMPILE_HOST,
                f"no builder started on the cluster at {self.address} within {ACTOR_START_TIMEOUT:g} s "
                "(its CPUs are taken, by another build's builders?)",
            )
        batch.to_run.clear()
        batch.to_build.clear()

    def _abandon(self) -> None:
        """Forget a batch that failed midway, so that none of its answers reaches the next: its builders
        and devices in flight are replaced."""
        stale = []
        for ref, job in list(self.jobs.items()):
            if job.kind in ("build", "run"):
                del self.jobs[ref]
                self.blobs.pop(ref, None)
                stale.append(job.worker)
        for worker in stale:
            if isinstance(worker, _Builder):
                self._kill(worker.actor)
                self.builders.remove(worker)
            else:
                self._drop_actor(worker)

    def _can_progress(self, batch: _Batch) -> bool:
        """Something in flight can still finish a candidate: a build or run, or a device being set up
        (a builder starting) while candidates wait for one."""
        kinds = {j.kind for j in self.jobs.values()}
        since = max(batch.start, batch.build_done)
        builders_starting = "ping" in kinds and time.monotonic() - since < ACTOR_START_TIMEOUT
        return bool(
            kinds & {"build", "run"}
            or (batch.to_run and "setup" in kinds)
            or (batch.to_build and builders_starting)
        )

    def _next_deadline(self) -> float:
        return min((j.deadline for j in self.jobs.values()), default=time.monotonic() + 1.0)

    def _wait(self, until: float, batch: _Batch | None) -> None:
        ray = self.ray
        if self.jobs:
            timeout = max(0.0, until - time.monotonic())
            ready, _ = ray.wait(list(self.jobs), num_returns=1, timeout=timeout)
            if ready:  # and whatever else is done by now
                ready, _ = ray.wait(list(self.jobs), num_returns=len(self.jobs), timeout=0)
            for ref in ready:
                job = self.jobs.pop(ref, None)  # None: dropped meanwhile (its device quarantined or lost)
                if job is not None:
                    self._answered(ref, job, batch)
        now = time.monotonic()
        for ref, job in list(self.jobs.items()):
            if job.deadline <= now:
                del self.jobs[ref]
                self.blobs.pop(ref, None)
                self._overdue(job, batch)

    def _answered(self, ref, job: _Job, batch: _Batch | None) -> None:
        ray = self.ray
        try:
            answer = ray.get(ref)
        except ray.exceptions.RayError as err:
            self._failed(ref, job, err, batch)
            return
        if job.kind == "ping":
            job.worker.ready = True
        elif job.kind == "setup":
            d = job.worker
            host = answer.get("host", {})
            self.ledger.add(d.name, measured_by(host))
            d.host = {**host, "device": d.name}  # in every record it measures
            if job.task == self.task:
                d.task = self.task
            elif self.ledger.usable(d.name):
                self._set_up(d)  # set up for a task that is over: set it up again
        elif job.kind == "build":
            self._built(ref, job, answer, batch)
        elif job.kind == "run":
            self._ran(job, answer, batch)

    def _built(self, ref, job: _Job, meta: dict, batch: _Batch) -> None:
        b, i = job.worker, job.index
        b.busy = False
        b.builds += 1
        blob = self.blobs.pop(ref)
        batch.build_done = time.monotonic()
        batch.built[i] = (blob, meta["layouts"], meta["seconds"])
        if meta["error"]:
            batch.finish(i, ErrorCode(meta["error"]), meta["msg"])
        else:
            batch.to_run.append(i)
        if b.builds >= self.options["builds_per_worker"]:  # llvmlite leaks memory per compile
            self._replace_builder(b)

    def _ran(self, job: _Job, answer: tuple, batch: _Batch) -> None:
        d, i = job.worker, job.index
        d.busy = False
        error, msg, costs, noise = answer
        error = ErrorCode(error)
        self.ledger.answered(d.name)
        d.restarted = error in (ErrorCode.RUNTIME_DEVICE, ErrorCode.RUN_TIMEOUT)  # its runner starts again
        if not self.ledger.usable(d.name):  # quarantined while it measured this one
            self._drop_actor(d)
        others = [x for x in self._usable_devices() if x.name not in batch.tried[i]]
        if DeviceLedger.retry(error, batch.attempts[i], len(others)):
            batch.suspect.setdefault(i, d.name)  # the first device that failed it
            batch.to_run.appendleft(i)
            return
        if error == ErrorCode.NO_ERROR and i in batch.suspect:
            first = batch.suspect[i]
            if self.ledger.strike(first, f"a candidate it failed passed on {d.name}"):
                log.warning(f"device {first} quarantined: {self.ledger.rows[first].note}")
                bad = next(x for x in self.devices.values() if x.name == first)
                if not bad.busy:  # else when its candidate in flight answers
                    self._drop_actor(bad)
        run_s = time.monotonic() - batch.started[i]
        batch.finish(i, error, msg, costs, noise, d.host, run_s)

    def _failed(self, ref, job: _Job, err: BaseException, batch: _Batch | None) -> None:
        """A Ray error instead of an answer: the actor died, raised, or the candidate's bytes were lost."""
        ray = self.ray
        text = _error_text(err)
        if job.kind == "ping":
            self._replace_builder(job.worker)
        elif job.kind == "setup" and isinstance(err, ray.exceptions.RayTaskError):
            d = job.worker  # it cannot measure this task (its reference does not build, its runner fails)
            self._drop_actor(d)
            self.ledger.lost(d.name, f"it cannot set up the task: {text}")
        elif job.kind == "setup":
            self._device_failed(job.worker, f"its actor died setting up ({text})")
        elif job.kind == "build":
            b, i = job.worker, job.index
            self.blobs.pop(ref, None)
            self._replace_builder(b)
            if isinstance(err, ray.exceptions.RayTaskError):
                batch.finish(i, ErrorCode.COMPILE_HOST, text)
            elif i not in batch.rebuilt:  # its builder or node died: build it once more elsewhere
                batch.rebuilt.add(i)
                batch.to_build.appendleft(i)
            else:
                batch.finish(i, ErrorCode.COMPILE_HOST, f"its builder died twice ({text})")
        elif job.kind == "run":
            d, i = job.worker, job.index
            d.busy = False
            if isinstance(err, ray.exceptions.ObjectLostError) and i not in batch.rebuilt:
                batch.rebuilt.add(i)  # the builder's node left with the bytes: build it again, once
                batch.tried[i].discard(d.name)
                batch.attempts[i] -= 1
                batch.built.pop(i, None)
                batch.to_build.appendleft(i)
                return
            self._device_failed(d, f"it died while measuring ({text})")
            others = [x for x in self._usable_devices() if x.name not in batch.tried[i]]
            if DeviceLedger.retry(ErrorCode.RUNTIME_DEVICE, batch.attempts[i], len(others)):
                batch.to_run.appendleft(i)
            else:
                batch.finish(
                    i, ErrorCode.RUNTIME_DEVICE, f"the device {d.name} died while measuring ({text})"
                )

    def _overdue(self, job: _Job, batch: _Batch | None) -> None:
        if job.kind == "ping":
            self._replace_builder(job.worker)
        elif job.kind == "setup":
            d = job.worker
            self._drop_actor(d)
            self.ledger.lost(
                d.name,
                f"it did not take the task within {SETUP_TIMEOUT:g} s (it measures for another build?)",
            )
        elif job.kind == "build":
            limit = self.options["build_timeout"]
            self._replace_builder(job.worker)
            batch.finish(job.index, ErrorCode.BUILD_TIMEOUT, f"building took longer than {limit:g} s")
        elif job.kind == "run":
            d, i = job.worker, job.index
            self._drop_actor(d)  # stuck in a candidate: a new actor takes the next one
            if self.ledger.usable(d.name):
                self._set_up(d)
            limit = self.options["timeout"] + TRANSFER_SLACK
            batch.finish(i, ErrorCode.RUN_TIMEOUT, f"the device {d.name} did not answer within {limit:g} s")

    def _kill(self, actor) -> None:
        if actor is not None:
            with contextlib.suppress(Exception):  # an actor that is already gone
                self.ray.kill(actor, no_restart=True)


def driver_main(conn, env: dict[str, str], address: str) -> None:
    """The driver process: a `ClusterDriver` answering ("task", args) and ("measure", args) requests with
    ("ok", answer) or ("error", message); asked to stop, it ends its actors and leaves the cluster."""
    drivers: list[ClusterDriver] = []

    def setup():
        driver = ClusterDriver(address)
        drivers.append(driver)

        def handle(request: tuple) -> tuple[str, object]:
            kind, args = request
            try:
                if kind == "task":
                    return "ok", driver.set_task(*args)
                return "ok", driver.measure(*args)
            except ClusterError as err:
                return "error", str(err)
            except Exception:  # noqa: BLE001 - a bug: its traceback, and the build goes on
                return "error", message_tail(traceback.format_exc())

        return handle

    serve(conn, env, setup)
    for driver in drivers:
        driver.close()
