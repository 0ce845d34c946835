"""Trials per minute measured on this machine and through a Ray cluster, and how a cluster's throughput
scales with its builders and devices (issue 17).

    python benchmarks/cluster.py [--candidates 48] [--devices 2] [--workload matmul --shape 256,256,256]

The same candidates (random programs of one task, sampled as the search's first round samples them) are
measured twice, in the same run:

- here: a `Measurer` (builders on every core, then one runner, as a local build measures);
- on a loopback cluster started here with `aotc worker`: a head whose CPUs host the builders, and
  `--devices` device nodes for this CPU with kernels for one core (`llvm -num-cores=1`, so that each device
  of a 2-core machine has a core), measured through a `ClusterMeasurer` (docs/cluster.md#builds).

Both measure for `llvm -num-cores=1`. Printed with the CPU class and the load average before and after.
On one machine the cluster's builders and devices share its cores, so the loopback run shows the cost of
the cluster's machinery, not its gain; the model below, fed with the per-candidate build and run times
measured here, says what a real cluster gives (its assumptions are printed with it).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time

from timing import cpu_class

from aotc.cluster import Cluster, device_key
from aotc.search.annotation import sample_initial_population
from aotc.search.measure import MeasureOptions, Measurer
from aotc.search.sketch import SearchContext, derive_sketches
from aotc.target import parse_target
from aotc.topi.workloads import make_workload

TARGET = "llvm -num-cores=1"
OPTIONS = MeasureOptions(repeat=3, min_repeat_ms=20, timeout=20.0)
NODE_START_S = 120.0


def candidates(workload: str, shape: list[int], n: int):
    dag = make_workload(workload, shape)
    target = parse_target(TARGET)
    sketches = derive_sketches(SearchContext(dag, target))
    return dag, target, sample_initial_population(dag, sketches, n, random.Random(0), target)


def rate(results, seconds: float) -> tuple[float, int]:
    """Trials per minute and how many of them were valid."""
    return 60.0 * len(results) / seconds, sum(r.ok for r in results)


def measure_here(dag, target, states) -> tuple[float, int, float]:
    with Measurer(dag, target, OPTIONS) as m:
        start = time.perf_counter()
        results = m.measure(states)
        wall = time.perf_counter() - start
    return (*rate(results, wall), wall)


@contextlib.contextmanager
def loopback_cluster(devices: int):
    """A head (its CPUs for builders) and `devices` device nodes for TARGET, started one at a time."""
    import ray

    temp = tempfile.mkdtemp(prefix="aotcray", dir="/tmp")  # Ray's socket paths must stay short
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"127.0.0.1:{port}"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    base = [sys.executable, "-m", "aotc.cluster.worker", "--node-ip-address=127.0.0.1"]
    cpus = os.cpu_count() or 1
    procs = [
        subprocess.Popen(
            [*base, "--head", f"--port={port}", f"--temp-dir={temp}", "--no-device", f"--num-cpus={cpus}"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    ]
    key = device_key(parse_target(TARGET))
    try:
        deadline = time.monotonic() + NODE_START_S
        while True:
            try:
                ray.init(address=address, log_to_driver=False, logging_level="WARNING")
                break
            except Exception:  # noqa: BLE001 - the head is still starting
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)
        for n in range(1, devices + 1):  # two nodes starting at once on one machine time out
            procs.append(
                subprocess.Popen(
                    [*base, f"--address={address}", f"--target={TARGET}"],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            while ray.cluster_resources().get(key, 0) < n:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"device node {n} did not join within {NODE_START_S:g} s")
                time.sleep(0.5)
        ray.shutdown()
        yield address
    finally:
        with contextlib.suppress(Exception):
            ray.shutdown()
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
        for p in reversed(procs):
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=60)


def measure_on_cluster(address: str, dag, target, states):
    with Cluster(address) as cluster, cluster.open_measurer(dag, target, OPTIONS) as m:
        m.measure(states[:2])  # builders and devices up, as in a build's later rounds
        start = time.perf_counter()
        results = m.measure(states)
        wall = time.perf_counter() - start
        devices = m.last_batch.devices
    ok = [r for r in results if r.error == 0]
    t_build = sum(r.build_seconds for r in results) / len(results)
    t_run = sum(r.run_seconds for r in ok) / max(len(ok), 1)
    return (*rate(results, wall), wall, t_build, t_run, devices)


def model_lines(t_build: float, t_run: float) -> list[str]:
    """Pipelined throughput of B builders and N devices: each side passes min(B / t_build, N / t_run)."""
    lines = [
        "model: trials/min = 60 / max(t_build / B, t_run / N)   "
        f"(t_build {t_build * 1e3:.0f} ms on one builder, t_run {t_run * 1e3:.0f} ms on one device, measured above)",
        f"{'devices N':>10} " + " ".join(f"{f'B={b}':>14}" for b in (2, 8, 32)),
    ]
    for n in (1, 2, 4, 8, 16, 32):
        cells = []
        for b in (2, 8, 32):
            per_trial = max(t_build / b, t_run / n)
            bound = "build" if t_build / b >= t_run / n else "run"
            cells.append(f"{60 / per_trial:8.0f} {bound:>5}")
        lines.append(f"{n:>10} " + " ".join(cells))
    lines += [
        "assumptions: each builder has a core and each device a machine of its own (unlike the loopback run);",
        "  a candidate's bytes (tens of kB) cross the network in far less than t_run; batches are large enough",
        "  to keep every device busy (a round of 64 trials on 32 devices is not); the search's own time per",
        "  round (sampling, evolution, cost model) on the build machine is not included: it adds to every round",
        "  whatever the cluster, so a build's speed-up levels off where that time dominates (Amdahl).",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidates", type=int, default=48)
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--workload", default="matmul")
    ap.add_argument("--shape", default="256,256,256")
    args = ap.parse_args(argv)
    shape = [int(v) for v in args.shape.split(",")]
    dag, target, states = candidates(args.workload, shape, args.candidates)
    print(f"CPU: {cpu_class()}, {os.cpu_count()} cores; load average before: {os.getloadavg()[0]:.2f}")
    print(f"{len(states)} candidates of {args.workload} {shape} for {TARGET}")
    here, here_ok, here_wall = measure_here(dag, target, states)
    print(f"here:    {here:7.1f} trials/min ({here_ok} valid, {here_wall:.1f} s)")
    with loopback_cluster(args.devices) as address:
        there, there_ok, wall, t_build, t_run, devices = measure_on_cluster(address, dag, target, states)
    per_device = ", ".join(f"{d['name']} {d['batch_trials']}" for d in devices)
    print(
        f"cluster: {there:7.1f} trials/min ({there_ok} valid, {wall:.1f} s; {args.devices} devices on this "
        f"machine: {per_device}) = {there / here:.2f}x here"
    )
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print("\n".join(model_lines(t_build, t_run)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
