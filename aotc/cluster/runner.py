"""The build side of cluster measurement: a `RunnerMain` that measures on a cluster's device
(docs/cluster.md#what-runs-where).

The measurer starts `cluster_runner_main` (or a `ClusterRunnerMain` bound to an address) in its runner
process like any runner. That process joins the Ray cluster as a driver, asks Ray for a `DeviceRunner`
actor needing one unit of the target's device key (so Ray places it on a matching device, and a device
serves one measurer at a time), sends it the reference library once, then sends each built candidate's
bytes and returns the device's answer. A Ray error or a device that stops answering becomes an error code
for that candidate, never a hang; a dead actor is replaced on the next candidate (docs/cluster.md#faults).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import uuid
from dataclasses import fields, replace

from aotc.cluster.keys import KEY_PREFIX, DeviceKey, device_key
from aotc.search.common import ErrorCode, Noise
from aotc.search.workers import message_tail, serve

__all__ = [
    "CLUSTER_ENV",
    "NAMESPACE",
    "ClusterError",
    "ClusterRunnerMain",
    "cluster_runner_main",
    "connect",
    "measure_options_for",
]

CLUSTER_ENV = "AOTC_CLUSTER"
NAMESPACE = "aotc"  # the Ray namespace of device actors, so that `ray.get_actor` and tests find them
SETUP_TIMEOUT = 90.0  # for an actor to be placed and its runner to start: under the measurer's 120 s
CONNECT_TIMEOUT = 10.0  # for the head's port to accept a connection
TRANSFER_SLACK = 5.0  # over the kernel timeout, for the candidate's bytes and the answer to travel
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
    """The key of a device for `target` on the cluster: one that measures for real if there is one, else
    one that runs the target's code under qemu (said in the log, since its timings mean nothing)."""
    offered = device_keys_on(ray)
    real = device_key(target)
    if real in offered:
        return real
    emulated = device_key(target, emulated=True)
    if target.is_cpu and emulated in offered:
        log.warning(f"measuring {target} on a device that runs it under qemu: the timings mean nothing")
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


class _ClusterBench:
    """A runner process's link to one device actor (see the module docstring)."""

    def __init__(self, address: str, setup) -> None:
        self.ray = connect(address)
        self.address, self.setup = address, setup
        self.key = pick_device_key(self.ray, setup.target, address)
        with open(setup.reference, "rb") as f:
            self.reference = f.read()
        self.actor = None
        self.device: dict = {}
        self._start_actor()

    def _start_actor(self) -> None:
        from aotc.cluster.device import DeviceRunner

        ray, s = self.ray, self.setup
        actor = (
            ray.remote(concurrency_groups={"status": 1})(DeviceRunner)
            .options(
                name=f"{self.key}/{uuid.uuid4().hex[:12]}",
                namespace=NAMESPACE,
                resources={self.key: 1},
                num_cpus=0,
                max_concurrency=1,
                max_restarts=0,
            )
            .remote()
        )
        call = actor.setup.remote(
            self.reference, s.n_inputs, plain_options(s.options), str(s.target), s.threads
        )
        try:
            self.device = ray.get(call, timeout=SETUP_TIMEOUT)
        except ray.exceptions.GetTimeoutError:
            ray.kill(actor)
            raise ClusterError(
                f"the device {self.key} ({self.key.what}) on the cluster at {self.address} did not take the "
                f"task within {SETUP_TIMEOUT:g} s: it measures for another build, or its node is gone"
            ) from None
        except ray.exceptions.RayError as err:
            with contextlib.suppress(Exception):
                ray.kill(actor)
            raise ClusterError(
                f"the device {self.key} ({self.key.what}) could not set up the task: {_ray_error_text(err)}"
            ) from None
        self.actor = actor
        host = self.device.get("host", {})
        log.info(f"measuring on {self.key}: {host.get('cpu_model', '?')}, {host.get('cores', '?')} cores")

    def _drop_actor(self) -> None:
        with contextlib.suppress(Exception):
            self.ray.kill(self.actor)
        self.actor = None

    def run(self, request: tuple[str, float | None, list]) -> tuple:
        path, cutoff, layouts = request
        ray = self.ray
        if self.actor is None:
            if self.key not in device_keys_on(ray):  # its node is gone: say so now, not after SETUP_TIMEOUT
                return (
                    ErrorCode.RUNTIME_DEVICE,
                    f"no device {self.key} ({self.key.what}) is left on the cluster at {self.address}",
                    [],
                    None,
                )
            try:
                self._start_actor()
            except ClusterError as err:
                return ErrorCode.RUNTIME_DEVICE, str(err), [], None
        with open(path, "rb") as f:
            candidate = f.read()
        timeout = self.setup.options.timeout + TRANSFER_SLACK
        try:
            error, msg, costs, noise = ray.get(
                self.actor.run.remote(candidate, cutoff, layouts), timeout=timeout
            )
        except ray.exceptions.GetTimeoutError:
            self._drop_actor()
            return (
                ErrorCode.RUN_TIMEOUT,
                f"the device {self.key} did not answer within {timeout:g} s",
                [],
                None,
            )
        except ray.exceptions.RayTaskError as err:  # the actor raised: a bug, the actor lives on
            return ErrorCode.UNKNOWN_ERROR, _ray_error_text(err), [], None
        except ray.exceptions.RayError as err:  # the actor or its node died
            self._drop_actor()
            return (
                ErrorCode.RUNTIME_DEVICE,
                f"the device {self.key} died while measuring ({_ray_error_text(err)})",
                [],
                None,
            )
        noise = None if noise is None else Noise(**noise)
        return ErrorCode(error), msg, costs, noise, self.device.get("host")  # the device, in its records


def _ray_error_text(err: BaseException) -> str:
    return message_tail(f"{type(err).__name__}: {err}".strip())


def cluster_runner_main(conn, env: dict[str, str], setup) -> None:
    """A `RunnerMain` measuring on the cluster named by $AOTC_CLUSTER (HOST:PORT of its head)."""
    serve(conn, env, lambda: _ClusterBench(_address_from_environment(), setup).run)


def _address_from_environment() -> str:
    address = os.environ.get(CLUSTER_ENV, "").strip()
    if not address:
        raise ClusterError(f"${CLUSTER_ENV} names no cluster (HOST:PORT of its Ray head)")
    return address


class ClusterRunnerMain:
    """A `RunnerMain` bound to a cluster's address: a module-level class, so a spawned runner process
    unpickles it, and it carries the address without touching the environment."""

    __name__ = "cluster_runner_main"  # the measurer names its runner process after its RunnerMain

    def __init__(self, address: str) -> None:
        self.address = address

    def __call__(self, conn, env: dict[str, str], setup) -> None:
        serve(conn, env, lambda: _ClusterBench(self.address, setup).run)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ClusterRunnerMain) and other.address == self.address

    def __hash__(self) -> int:
        return hash(("ClusterRunnerMain", self.address))

    def __repr__(self) -> str:
        return f"ClusterRunnerMain({self.address!r})"


def measure_options_for(address: str, base):
    """`base` (MeasureOptions) measuring on the device of the cluster at `address` (HOST:PORT of its Ray
    head) that serves the measurer's target (docs/cluster.md#builds)."""
    address = address.strip()
    if not address or ":" not in address:
        raise ValueError(f"cluster address {address!r}: expected HOST:PORT of the Ray head")
    return replace(base, runner=ClusterRunnerMain(address))
