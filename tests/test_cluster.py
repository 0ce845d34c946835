"""Measuring on a Ray cluster (issue 17, first slice): a real local cluster on loopback, a head that is a
device for this CPU and a second node that measures aarch64 under qemu, both started by `aotc worker`;
measurers send candidates to them through `measure_options_for` (docs/cluster.md).

Two tests run by default as a smoke test (Ray is in the test extra; the cluster starts in about 5 s): no
import of Ray by `import aotc`, and a measurer measuring on the cluster's device. The rest are marked
`cluster`, which the default run deselects: whole builds, faults and a qemu node take a minute or two.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

import pytest

from aotc.cluster import device_key, measure_options_for
from aotc.cluster.runner import NAMESPACE
from aotc.schedule.default import default_schedule
from aotc.schedule.state import State
from aotc.search.common import ErrorCode
from aotc.search.measure import MeasureError, MeasureOptions, Measurer
from aotc.target import host_target, parse_target

from .random_schedules import random_state
from .test_aarch64 import needs_cross, needs_qemu
from .test_measure import hang_func, matmul_relu, naive_func, write_input_func

ray = pytest.importorskip("ray", reason="the cluster extra is not installed (pip install 'aotc[cluster]')")

AARCH64 = "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"
FAST = {"min_repeat_ms": 2.0, "repeat": 2, "n_build_workers": 1, "timeout": 30.0}
NODE_START_S = 90.0


@dataclass
class Node:
    proc: subprocess.Popen
    log: str


@dataclass
class Cluster:
    address: str
    temp: str
    nodes: list[Node]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_node(temp: str, log_name: str, *args: str) -> Node:
    """`aotc worker ...` (as `python -m aotc.cluster.worker`), its output in a log file under `temp`."""
    log = os.path.join(temp, log_name)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    cmd = [sys.executable, "-m", "aotc.cluster.worker", "--node-ip-address=127.0.0.1", *args]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    return Node(proc, log)


def _wait_for_device(key: str, nodes: list[Node]) -> None:
    deadline = time.monotonic() + NODE_START_S
    while key not in ray.cluster_resources():
        for node in nodes:
            if node.proc.poll() is not None:
                with open(node.log) as f:
                    pytest.fail(f"a node exited ({node.proc.returncode}):\n{f.read()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no node advertised {key} within {NODE_START_S:g} s")
        time.sleep(0.5)


def _connect(address: str, nodes: list[Node]) -> None:
    deadline = time.monotonic() + NODE_START_S
    while True:
        try:
            ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level="WARNING")
            return
        except Exception:  # noqa: BLE001 - the head is still starting
            if time.monotonic() > deadline or nodes[0].proc.poll() is not None:
                raise
            time.sleep(1.0)


def _stop(nodes: list[Node], temp: str) -> None:
    """Stop the nodes this module started (SIGTERM, as a service manager would), then kill by id any
    process of theirs still running: Ray's processes name the session folder under `temp`."""
    for node in reversed(nodes):  # the extra nodes, then the head
        if node.proc.poll() is None:
            node.proc.send_signal(signal.SIGTERM)
    for node in reversed(nodes):
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.proc.wait(timeout=60)
    for pid in _processes_naming(temp):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _processes_naming(text: str) -> list[int]:
    """This user's processes with `text` in their command line."""
    out = []
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError), open(f"/proc/{entry}/cmdline", "rb") as f:
            if entry.isdigit() and text.encode() in f.read():
                out.append(int(entry))
    return out


@pytest.fixture(scope="module")
def cluster():
    # Ray's socket paths must stay under 108 bytes: a short folder of its own, not pytest's tmp_path
    temp = tempfile.mkdtemp(prefix="aotcray", dir="/tmp")
    address = f"127.0.0.1:{_free_port()}"
    nodes = [_start_node(temp, "head.log", "--head", f"--port={address.split(':')[1]}", f"--temp-dir={temp}")]
    try:
        _connect(address, nodes)
        _wait_for_device(device_key(host_target()), nodes)
        yield Cluster(address, temp, nodes)
    finally:
        ray.shutdown()
        _stop(nodes, temp)
        leftovers = _processes_naming(temp)
        shutil.rmtree(temp, ignore_errors=True)
        assert not leftovers, f"processes of the test cluster outlived it: {leftovers}"


def _device_actors(key: str) -> list[str]:
    """The names of the device actors of `key` alive on the cluster (one per measurer measuring on it)."""
    named = ray.util.list_named_actors(all_namespaces=True)
    return sorted(a["name"] for a in named if a["namespace"] == NAMESPACE and a["name"].startswith(key))


def _eventually(predicate, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_importing_aotc_does_not_import_ray():
    code = "import sys, aotc, aotc.cluster, aotc.search.measure; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_measurer_measures_on_the_clusters_device(cluster):
    """Right kernels are timed on the device, wrong ones are caught there, a crash restarts the device's
    runner and measuring goes on; the device's actor lives as long as the measurer."""
    dag, target = matmul_relu(), host_target()
    key = device_key(target)
    with Measurer(dag, target, measure_options_for(cluster.address, MeasureOptions(**FAST))) as m:
        assert len(_device_actors(key)) == 1
        default, rand = m.measure([default_schedule(dag, target), random_state(dag, 3)])
        wrong, crash, ok = m.measure_funcs(
            [naive_func(matmul_relu(relu=False)), write_input_func(dag), naive_func(dag)]
        )
    for r in (default, rand, ok):
        assert r.error == ErrorCode.NO_ERROR, r.error_msg
        assert len(r.costs) == 2 and min(r.costs) > 0 and r.noise is not None
    assert wrong.error == ErrorCode.WRONG_ANSWER, wrong.error_msg
    assert "output relu: " in wrong.error_msg and "differ from the naive schedule" in wrong.error_msg
    assert crash.error == ErrorCode.RUNTIME_DEVICE, crash.error_msg
    assert "device's runner process died" in crash.error_msg and "SIGSEGV" in crash.error_msg
    assert _eventually(lambda: not _device_actors(key)), "the device actor outlived its measurer"


@pytest.mark.cluster
def test_a_target_no_device_serves_fails_the_measurer_at_start(cluster):
    target = parse_target("llvm -num-cores=3")  # this CPU tuned for 3 cores: no node advertises that key
    options = measure_options_for(cluster.address, MeasureOptions(**FAST))
    with pytest.raises(MeasureError) as err:
        Measurer(matmul_relu(), target, options)
    text = str(err.value)
    assert f"no device on the Ray cluster at {cluster.address} measures" in text
    assert device_key(target) in text and "| 3 cores" in text
    assert device_key(host_target()) in text  # the devices it has


@pytest.mark.cluster
def test_an_unreachable_cluster_fails_the_measurer_at_start():
    address = f"127.0.0.1:{_free_port()}"  # nothing listens there
    options = measure_options_for(address, MeasureOptions(**FAST))
    start = time.monotonic()
    with pytest.raises(MeasureError, match=f"cannot reach the Ray cluster at {address}: Connection refused"):
        Measurer(matmul_relu(), host_target(), options)
    assert time.monotonic() - start < 60


@pytest.mark.cluster
def test_a_hanging_kernel_times_out_and_leaves_nothing_running_on_the_device(cluster):
    """The measurer's timeout ends the runner process, whose actor (and the device's runner process under
    it, spinning in the kernel) go with it; the next candidate gets a new actor."""
    dag, target = matmul_relu(), host_target()
    key = device_key(target)
    options = measure_options_for(cluster.address, MeasureOptions(**{**FAST, "timeout": 3.0}))
    with Measurer(dag, target, options) as m:
        (name,) = _device_actors(key)
        status = ray.get_actor(name, namespace=NAMESPACE).status.options(concurrency_group="status").remote()
        spinning = ray.get(status, timeout=10)["runner_pid"]
        hang, ok = m.measure_funcs([hang_func(dag), naive_func(dag)])
        after = _device_actors(key)
    assert hang.error == ErrorCode.RUN_TIMEOUT and "within 3 s" in hang.error_msg, hang.error_msg
    assert ok.error == ErrorCode.NO_ERROR, ok.error_msg
    assert len(after) == 1 and after != [name]
    assert _eventually(lambda: not os.path.exists(f"/proc/{spinning}")), "the hanging kernel still runs"


@pytest.mark.cluster
def test_killing_the_device_actor_mid_run_costs_one_candidate(cluster):
    """ray.kill of the device's actor while it times a candidate: that candidate is RUNTIME_DEVICE, the
    next one is measured by a new actor set up for the same task."""
    dag, target = matmul_relu(), host_target()
    key = device_key(target)
    slow = {**FAST, "min_repeat_ms": 300.0, "repeat": 3, "max_retries": 0}  # about a second a candidate
    killed: list[str] = []

    def kill_when_busy(name: str) -> None:
        actor = ray.get_actor(name, namespace=NAMESPACE)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status = actor.status.options(concurrency_group="status").remote()
            if ray.get(status, timeout=10)["busy"]:
                ray.kill(actor)
                killed.append(name)
                return
            time.sleep(0.02)

    with Measurer(dag, target, measure_options_for(cluster.address, MeasureOptions(**slow))) as m:
        (before,) = _device_actors(key)
        killer = threading.Thread(target=kill_when_busy, args=(before,))
        killer.start()
        first, second = m.measure([default_schedule(dag, target), State.initial(dag)])
        killer.join()
        after = _device_actors(key)
    assert killed == [before]
    assert first.error == ErrorCode.RUNTIME_DEVICE, first.error_msg
    assert f"the device {key} died while measuring" in first.error_msg
    assert second.error == ErrorCode.NO_ERROR, second.error_msg
    assert len(after) == 1 and after[0] != before


@needs_cross
@needs_qemu
@pytest.mark.cluster
def test_an_aarch64_device_under_qemu_on_a_second_node(cluster):
    """A second node joins the head as a device that runs cortex-a72 code under qemu; a measurer for that
    target finds it by the emulated key, and its results are checked there."""
    target = parse_target(AARCH64)
    key = device_key(target, emulated=True)
    node = _start_node(cluster.temp, "aarch64.log", f"--address={cluster.address}", f"--target={AARCH64}")
    cluster.nodes.append(node)
    _wait_for_device(key, cluster.nodes)
    options = measure_options_for(cluster.address, MeasureOptions(**{**FAST, "number": 2}))
    dag = matmul_relu(24)
    with Measurer(dag, target, options) as m:
        ok, rand = m.measure([default_schedule(dag, target), random_state(dag, 4)])
        (wrong,) = m.measure_funcs([naive_func(matmul_relu(24, relu=False))])
    assert ok.error == ErrorCode.NO_ERROR and len(ok.costs) == 2, ok.error_msg
    assert rand.error == ErrorCode.NO_ERROR, rand.error_msg
    assert wrong.error == ErrorCode.WRONG_ANSWER, wrong.error_msg


@pytest.mark.cluster
def test_a_build_tunes_through_the_cluster_as_it_would_here(cluster, tmp_path):
    """`TuningOptions(cluster=...)` (recipe `tuning: {cluster: HOST:PORT}`, `aotc build --cluster`): a small
    model's tuning measures every candidate on the cluster's device, checked there, and writes records of
    the same workloads a local build writes."""
    import json

    import aotc
    from aotc.search.model_tuning import TuningOptions
    from recipes.zoo.onnx_models import mlp, save

    model = save(mlp(), tmp_path / "mlp.onnx")
    keys = {}
    for where, address in (("cluster", cluster.address), ("local", None)):
        records = tmp_path / f"{where}.jsonl"
        tuning = TuningOptions(trials=8, records=records, tophub=[], cluster=address)
        package = aotc.compile(model, host_target(), tuning=tuning, output=tmp_path / f"{where}.aotc")
        assert package.result.tuning.trials >= 8 and all(r["ok"] for r in package.result.validation)
        measured = [json.loads(line) for line in records.read_text().splitlines()]
        assert measured and all(r["error"] == 0 and r["costs"] for r in measured)
        keys[where] = {r["workload_key"] for r in measured}
        report = json.loads((package.result.report / "report.json").read_text())
        assert sum(report["tuning"]["measured_by"].values()) == len(measured)  # the device, named
    assert keys["cluster"] == keys["local"]
    assert _eventually(lambda: not _device_actors(device_key(host_target()))), (
        "a device actor outlived the build"
    )


@pytest.mark.cluster
def test_a_device_node_stopped_mid_build_loses_no_trial_and_the_build_ends(cluster, tmp_path):
    """A second node is the only device for `llvm -num-cores=1`; it is stopped (SIGTERM, as `ray stop`)
    while a build tunes through it. The candidate in flight and every later one are recorded with an error
    code (or, between tasks, the next task cannot be measured), nothing measured is lost from the records
    file, and the build writes its package well within its deadline instead of waiting on a device that is
    gone."""
    import json
    import threading

    import aotc
    from aotc.search.model_tuning import TuningOptions
    from recipes.zoo.onnx_models import mlp, save

    text = "llvm -num-cores=1"
    target = parse_target(text)
    node = _start_node(cluster.temp, "one-core.log", f"--address={cluster.address}", f"--target={text}")
    cluster.nodes.append(node)
    _wait_for_device(device_key(target), cluster.nodes)
    model, records = save(mlp(), tmp_path / "mlp.onnx"), tmp_path / "records.jsonl"

    def stop_after_some_records() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if records.exists() and len(records.read_text().splitlines()) >= 6:
                break
            time.sleep(0.2)
        _stop([node], "no-such-folder")  # this node only; the head and its device stay

    stopper = threading.Thread(target=stop_after_some_records)
    stopper.start()
    tuning = TuningOptions(trials=200, deadline=150, records=records, tophub=[], cluster=cluster.address)
    start = time.monotonic()
    package = aotc.compile(model, target, tuning=tuning, output=tmp_path / "m.aotc")
    elapsed = time.monotonic() - start
    stopper.join()
    assert package.path.exists() and elapsed < 150, elapsed
    assert node.proc.poll() is not None  # the device really went away during the build
    measured = [json.loads(line) for line in records.read_text().splitlines()]
    # whatever was in flight, and the tasks after it, end as error records or unmeasured tasks
    assert 6 <= len(measured) < 200 and all(r["error"] == 0 or r["error_msg"] for r in measured)
    lost = [r["error_msg"] for r in measured if r["error"] != 0]
    assert all("device" in m or "runner" in m for m in lost), lost
    assert len(measured) == package.result.tuning.trials  # every trial the build counted is in the file
