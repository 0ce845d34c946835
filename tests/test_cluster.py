"""Tuning on a Ray cluster (issue 17): a real local cluster on loopback, started by `aotc worker`: a head
that is a device for this CPU and offers its CPUs to builders, two more nodes that are devices for this
CPU tuned for one core, and a node that measures aarch64 under qemu; `Cluster.open_measurer` builds
candidates on the cluster and measures them on its devices (docs/cluster.md).

Two tests run by default as a smoke test (Ray is in the test extra; the cluster starts in about 5 s): no
import of Ray by `import aotc`, and a measurer measuring on the cluster's device. The rest are marked
`cluster`, which the default run deselects: several devices, whole builds, faults and a qemu node take a
few minutes.
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

from aotc.cluster import Cluster, device_key
from aotc.cluster.driver import NAMESPACE
from aotc.schedule.default import default_schedule
from aotc.schedule.state import State
from aotc.search.common import ErrorCode
from aotc.search.measure import MeasureError, MeasureOptions
from aotc.search.records import measured_by
from aotc.target import host_target, parse_target

from .random_schedules import random_state
from .test_aarch64 import needs_cross, needs_qemu
from .test_measure import hang_func, matmul_relu, naive_func, write_input_func

ray = pytest.importorskip("ray", reason="the cluster extra is not installed (pip install 'aotc[cluster]')")

AARCH64 = "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"
FAST = {"min_repeat_ms": 2.0, "repeat": 2, "timeout": 30.0, "max_retries": 0}
ONE_CORE = "llvm -num-cores=1"  # the key of the two extra device nodes: this CPU, kernels for one core
NODE_START_S = 90.0


def test_a_device_key_names_the_cpu_however_the_target_spells_it():
    """A device started for `llvm -mcpu=<its CPU>` serves a build for `llvm -mcpu=native` on a machine of
    that class: the key hashes the features the code sees, not the target string; cores and qemu differ."""
    from aotc.target import cpu_features

    host = host_target()
    named = parse_target(f"llvm -mcpu={host.mcpu} -num-cores={host.hw.num_cores}")
    if set(cpu_features(named)) != set(cpu_features(host)):
        pytest.skip(f"this host's features are not {host.mcpu}'s (a VM that hides some)")
    assert device_key(named) == device_key(host) == device_key(parse_target("llvm -mcpu=native"))
    assert device_key(named) != device_key(parse_target(f"llvm -mcpu={host.mcpu} -num-cores=64"))
    emulated = device_key(named, emulated=True)
    assert emulated != device_key(named) and emulated.what.endswith("| emulated")
    assert device_key(named).what == f"{named} | {host.hw.num_cores} cores"


@dataclass
class Node:
    proc: subprocess.Popen
    log: str


@dataclass
class LocalCluster:
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
    port = address.split(":")[1]
    nodes = [_start_node(temp, "head.log", "--head", f"--port={port}", f"--temp-dir={temp}", "--num-cpus=2")]
    try:
        _connect(address, nodes)
        _wait_for_device(device_key(host_target()), nodes)
        yield LocalCluster(address, temp, nodes)
    finally:
        ray.shutdown()
        _stop(nodes, temp)
        leftovers = _processes_naming(temp)
        shutil.rmtree(temp, ignore_errors=True)
        assert not leftovers, f"processes of the test cluster outlived it: {leftovers}"


@contextlib.contextmanager
def measuring(address: str, dag, target, options: MeasureOptions):
    """A measurer of the cluster at `address`, and the cluster's driver, closed after."""
    with Cluster(address) as link, link.open_measurer(dag, target, options) as measurer:
        yield measurer


@pytest.fixture(scope="module")
def one_core_devices(cluster):
    """Two more device nodes, both for ONE_CORE (started once; the last test of the module stops one)."""
    key = device_key(parse_target(ONE_CORE))
    for n, name in enumerate(("one-core-a.log", "one-core-b.log"), 1):  # one at a time: two nodes starting
        node = _start_node(cluster.temp, name, f"--address={cluster.address}", f"--target={ONE_CORE}")
        cluster.nodes.append(node)  # at once on one machine time out
        deadline = time.monotonic() + NODE_START_S
        while ray.cluster_resources().get(key, 0) < n:
            assert time.monotonic() < deadline and node.proc.poll() is None, (
                f"{name}: the device did not join"
            )
            time.sleep(0.5)
    return cluster.nodes[-2:]


def _device_actors(key: str) -> list[str]:
    """The names of the device actors of `key` alive on the cluster (one per device a build measures on)."""
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
    """Candidates built on the cluster are timed on the device: right kernels pass, wrong ones are caught
    there, a crash restarts the device's runner and measuring goes on; the device's actor lives as long
    as the build's driver, and every result names the device."""
    dag, target = matmul_relu(), host_target()
    key = device_key(target)
    with measuring(cluster.address, dag, target, MeasureOptions(**FAST)) as m:
        assert len(_device_actors(key)) == 1
        default, rand = m.measure([default_schedule(dag, target), random_state(dag, 3)])
        wrong, crash, ok = m.measure_funcs(
            [naive_func(matmul_relu(relu=False)), write_input_func(dag), naive_func(dag)]
        )
        (device,) = m.last_batch.devices
    for r in (default, rand, ok):
        assert r.error == ErrorCode.NO_ERROR, r.error_msg
        assert len(r.costs) == 2 and min(r.costs) > 0 and r.noise is not None
        assert r.host and r.host["cores"] == os.cpu_count()  # the device's host, in the records
    assert wrong.error == ErrorCode.WRONG_ANSWER, wrong.error_msg
    assert "output relu: " in wrong.error_msg and "differ from the naive schedule" in wrong.error_msg
    assert crash.error == ErrorCode.RUNTIME_DEVICE, crash.error_msg
    assert "device's runner process died" in crash.error_msg and "SIGSEGV" in crash.error_msg
    assert device["state"] == "ready" and device["batch_trials"] == 3 and device["trials"] == 5
    assert all(r.host["device"] == device["name"] for r in (default, rand, ok))
    assert _eventually(lambda: not _device_actors(key)), "the device actor outlived the build's driver"


@pytest.mark.cluster
def test_a_target_no_device_serves_fails_the_measurer_at_start(cluster):
    target = parse_target("llvm -num-cores=3")  # this CPU tuned for 3 cores: no node advertises that key
    with (
        pytest.raises(MeasureError) as err,
        measuring(cluster.address, matmul_relu(), target, MeasureOptions(**FAST)),
    ):
        pass
    text = str(err.value)
    assert f"no device on the Ray cluster at {cluster.address} measures" in text
    assert device_key(target) in text and "| 3 cores" in text
    assert device_key(host_target()) in text  # the devices it has


@pytest.mark.cluster
def test_an_unreachable_cluster_fails_the_measurer_at_start():
    address = f"127.0.0.1:{_free_port()}"  # nothing listens there
    start = time.monotonic()
    with (
        pytest.raises(MeasureError, match=f"cannot reach the Ray cluster at {address}: Connection refused"),
        measuring(address, matmul_relu(), host_target(), MeasureOptions(**FAST)),
    ):
        pass
    assert time.monotonic() - start < 60


@pytest.mark.cluster
def test_a_hanging_kernel_times_out_and_leaves_nothing_running_on_the_device(cluster):
    """The device's timeout ends its runner process, spinning in the kernel; the next candidate is
    measured by a new runner."""
    dag, target = matmul_relu(), host_target()
    key = device_key(target)
    with measuring(cluster.address, dag, target, MeasureOptions(**{**FAST, "timeout": 3.0})) as m:
        (name,) = _device_actors(key)
        status = ray.get_actor(name, namespace=NAMESPACE).status.options(concurrency_group="status").remote()
        spinning = ray.get(status, timeout=10)["runner_pid"]
        hang, ok = m.measure_funcs([hang_func(dag), naive_func(dag)])
    assert hang.error == ErrorCode.RUN_TIMEOUT and "within 3 s" in hang.error_msg, hang.error_msg
    assert ok.error == ErrorCode.NO_ERROR, ok.error_msg
    assert _eventually(lambda: not os.path.exists(f"/proc/{spinning}")), "the hanging kernel still runs"


@pytest.mark.cluster
def test_measurers_of_two_tasks_take_turns_on_the_devices(cluster):
    """Two open measurers of one cluster (a build keeps two): each batch sets the devices up for its own
    task first, so each is checked against its own reference (two dense layers with swapped shapes)."""
    from aotc.topi.workloads import make_workload

    target = host_target()
    a, b = make_workload("dense", [4, 128, 64]), make_workload("dense", [4, 64, 128])
    options = MeasureOptions(**FAST)
    with (
        Cluster(cluster.address) as link,
        link.open_measurer(a, target, options) as ma,
        link.open_measurer(b, target, options) as mb,
    ):
        results = [m.measure([default_schedule(d, target)])[0] for m, d in ((ma, a), (mb, b)) * 2]
    assert all(r.error == ErrorCode.NO_ERROR for r in results), [r.error_msg for r in results]


def _kill_when_busy(name: str, what: str, times: int, out: list) -> None:
    """Kill the device actor named `name` (what="actor"), or the runner process of whichever actor has
    the same device (what="runner": `name` up to the node, so a replaced actor goes on being hit),
    whenever it measures, `times` times; the pids killed go to `out`."""
    device = name.rsplit("/", 2)[0]  # key/node: the actor's name, less its build's pid and a counter
    deadline = time.monotonic() + 120
    while len(out) < times and time.monotonic() < deadline:
        current = name if what == "actor" else next(iter(_device_actors(device)), None)
        if current is None:
            return  # the device is gone (quarantined)
        try:
            actor = ray.get_actor(current, namespace=NAMESPACE)
            status = ray.get(actor.status.options(concurrency_group="status").remote(), timeout=10)
        except (ValueError, ray.exceptions.RayError):
            time.sleep(0.05)  # between two actors of the device
            continue
        if status["busy"] and status["runner_pid"]:
            if what == "actor":
                ray.kill(actor)
                out.append(status["pid"])
                return
            with contextlib.suppress(OSError):
                os.kill(status["runner_pid"], signal.SIGKILL)
                out.append(status["runner_pid"])
            _eventually(lambda c=current: _runner_pid(c) != out[-1], 30.0)  # once per candidate
        time.sleep(0.01)


def _runner_pid(name: str) -> int | None:
    with contextlib.suppress(ValueError, ray.exceptions.RayError):
        actor = ray.get_actor(name, namespace=NAMESPACE)
        return ray.get(actor.status.options(concurrency_group="status").remote(), timeout=10)["runner_pid"]
    return None


SLOW = {**FAST, "min_repeat_ms": 300.0, "repeat": 3}  # about a second a candidate


@pytest.mark.cluster
def test_killing_the_only_device_actor_mid_run_costs_one_candidate(cluster):
    """ray.kill of the device's actor while it times a candidate: with no other device to retry it on,
    that candidate is RUNTIME_DEVICE; the other one is measured by a new actor set up for the same task."""
    dag, target = matmul_relu(), host_target()
    key = device_key(target)
    killed: list[int] = []
    with measuring(cluster.address, dag, target, MeasureOptions(**SLOW)) as m:
        (before,) = _device_actors(key)
        killer = threading.Thread(target=_kill_when_busy, args=(before, "actor", 1, killed))
        killer.start()
        results = m.measure([default_schedule(dag, target), State.initial(dag)])
        killer.join()
        after = _device_actors(key)
        (device,) = m.last_batch.devices
    assert len(killed) == 1
    # the two are built at once: whichever was built first is measured first, and killed
    lost, measured = sorted(results, key=lambda r: r.error == ErrorCode.NO_ERROR)
    assert lost.error == ErrorCode.RUNTIME_DEVICE, lost.error_msg
    assert f"the device {device['name']} died while measuring" in lost.error_msg
    assert measured.error == ErrorCode.NO_ERROR, measured.error_msg
    assert len(after) == 1 and after[0] != before
    assert device["strikes"] == 1 and device["state"] == "ready"


@pytest.mark.cluster
def test_several_devices_measure_a_batch_at_once(cluster, one_core_devices):
    """Two devices of the target share a batch: each measures some of it, every candidate checked."""
    dag, target = matmul_relu(), parse_target(ONE_CORE)
    states = [default_schedule(dag, target)] + [random_state(dag, seed) for seed in range(7)]
    with measuring(cluster.address, dag, target, MeasureOptions(**SLOW)) as m:
        results = m.measure(states)
        devices = m.last_batch.devices
    assert all(r.error in (ErrorCode.NO_ERROR, ErrorCode.WRONG_ANSWER) for r in results), results
    assert sum(r.ok for r in results) >= 1
    assert len(devices) == 2 and all(d["batch_trials"] >= 2 for d in devices), devices
    assert sum(d["batch_trials"] for d in devices) == len(states)


@pytest.mark.cluster
def test_a_device_that_keeps_failing_is_quarantined_and_its_candidates_measured_elsewhere(
    cluster, one_core_devices
):
    """One of two devices loses its runner under every candidate (killed, as a faulty board would): each
    such candidate is measured again on the other device, where it passes, which is a strike against the
    first; at the third strike it is quarantined and gets nothing more. No candidate is lost."""
    dag, target = matmul_relu(), parse_target(ONE_CORE)
    key = device_key(target)
    states = [default_schedule(dag, target), State.initial(dag)] * 10
    killed: list[int] = []
    with measuring(cluster.address, dag, target, MeasureOptions(**SLOW)) as m:
        m.measure([default_schedule(dag, target)])  # both devices set up
        bad = _device_actors(key)[0]
        killer = threading.Thread(target=_kill_when_busy, args=(bad, "runner", 3, killed))
        killer.start()
        results = m.measure(states)
        killer.join()
        devices = {d["state"]: d for d in m.last_batch.devices}
    assert len(killed) >= 3
    assert all(r.error == ErrorCode.NO_ERROR for r in results), [r.error_msg for r in results]
    assert set(devices) == {"ready", "quarantined"}, devices
    quarantined = devices["quarantined"]
    assert quarantined["strikes"] >= 3 and "passed on" in quarantined["note"], quarantined
    assert _eventually(lambda: len(_device_actors(key)) <= 1)


@needs_cross
@needs_qemu
@pytest.mark.cluster
def test_an_aarch64_device_under_qemu_on_a_second_node(cluster, tmp_path):
    """A node joins the head as a device that runs cortex-a72 code under qemu; a measurer for that target
    finds it by the emulated key, candidates are built for aarch64 on the head's CPUs, and the device
    checks them against a reference it builds for its own CPU; `aotc.tune` tunes through it."""
    target = parse_target(AARCH64)
    key = device_key(target, emulated=True)
    node = _start_node(cluster.temp, "aarch64.log", f"--address={cluster.address}", f"--target={AARCH64}")
    cluster.nodes.append(node)
    _wait_for_device(key, cluster.nodes)
    dag = matmul_relu(24)
    with measuring(cluster.address, dag, target, MeasureOptions(**{**FAST, "number": 2})) as m:
        ok, rand = m.measure([default_schedule(dag, target), random_state(dag, 4)])
        (wrong,) = m.measure_funcs([naive_func(matmul_relu(24, relu=False))])
    assert ok.error == ErrorCode.NO_ERROR and len(ok.costs) == 2, ok.error_msg
    assert ok.host.get("emulated"), ok.host  # labelled: its timings mean nothing
    assert rand.error == ErrorCode.NO_ERROR, rand.error_msg
    assert wrong.error == ErrorCode.WRONG_ANSWER, wrong.error_msg

    # and a tuning through it: records of the target, labelled emulated, every candidate checked there
    import json

    import aotc
    from aotc.search.model_tuning import TuningOptions

    records = tmp_path / "aarch64.jsonl"
    tuning = TuningOptions(trials=6, records=records, tophub=[], cluster=cluster.address)
    result = aotc.tune(dag, target, tuning, log=lambda _: None)
    measured = [json.loads(line) for line in records.read_text().splitlines()]
    assert result.trials == 6 and len(measured) == 6 and result.best_cost < float("inf")
    assert all(r["target"] == str(target) and r["host"].get("emulated") for r in measured)


@pytest.mark.cluster
def test_a_build_tunes_through_the_cluster_as_it_would_here(cluster, tmp_path):
    """`TuningOptions(cluster=...)` (recipe `tuning: {cluster: HOST:PORT}`, `aotc build --cluster`): a small
    model's tuning measures every candidate on the cluster's device, checked there, and writes records of
    the same workloads a local build writes; the report names the device."""
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
        failed = [(r["error"], r["error_msg"]) for r in measured if r["error"] or not r["costs"]]
        assert measured and not failed, failed
        keys[where] = {r["workload_key"] for r in measured}
        report = json.loads((package.result.report / "report.json").read_text())
        assert sum(report["tuning"]["measured_by"].values()) == len(measured)  # the device, named
        if address:
            (device,) = report["tuning"]["devices"]
            assert device["state"] == "ready" and device["trials"] == len(measured)
            assert list(report["tuning"]["measured_by"]) == [measured_by(measured[0]["host"])]
            assert measured_by(measured[0]["host"]).endswith(f" on {device['name']}")
    assert keys["cluster"] == keys["local"]
    assert _eventually(lambda: not _device_actors(device_key(host_target()))), (
        "a device actor outlived the build"
    )


@pytest.mark.cluster
def test_ctrl_c_during_a_cluster_build_stops_tuning_and_ends_the_driver_and_its_actors(cluster, tmp_path):
    """`aotc build --cluster` interrupted (SIGINT, as Ctrl-C) mid-tuning: as a local build, the package is
    built from the best schedules so far; the build's driver process ends, and with it the build's actors
    (its device actor is gone); every record line written is whole."""
    import json

    from recipes.zoo.onnx_models import mlp, save

    model, records = save(mlp(), tmp_path / "mlp.onnx"), tmp_path / "records.jsonl"
    recipe = tmp_path / "mlp.yaml"
    recipe.write_text(
        f"model: {model}\ninputs:\n  input: {{shape: [1, 64], dtype: float32}}\ntarget: llvm\n"
        f"output: {tmp_path / 'mlp.aotc'}\ntuning: {{trials: 400, records: {records}, tophub: []}}\n"
        "validate: false\n"
    )
    cmd = [sys.executable, "-m", "aotc.cli", "build", str(recipe), "--cluster", cluster.address]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert _eventually(lambda: records.exists() and len(records.read_text().splitlines()) >= 4, 120)
        assert _device_actors(device_key(host_target())), "the build measures on the cluster's device"
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "interrupted" in out, out[-3000:]  # 130: interrupted, as a local build
    assert (tmp_path / "mlp.aotc").exists()
    assert all(json.loads(line) for line in records.read_text().splitlines())
    assert _eventually(lambda: not _device_actors(device_key(host_target()))), "a device actor outlived it"


@pytest.mark.cluster
def test_a_device_node_stopped_mid_build_loses_no_trial_and_the_build_ends(
    cluster, one_core_devices, tmp_path
):
    """One of the two devices of `llvm -num-cores=1` is stopped (SIGTERM, as `ray stop`) while a build
    tunes through both: its candidate in flight is measured again on the other device, the build goes on
    there, nothing measured is lost from the records file, the report names the lost device, and the build
    writes its package by its deadline. (Last in this module: it stops one of `one_core_devices`.)"""
    import json

    import aotc
    from aotc.search.model_tuning import TuningOptions
    from recipes.zoo.onnx_models import mlp, save

    target = parse_target(ONE_CORE)
    victim = one_core_devices[0]
    model, records = save(mlp(), tmp_path / "mlp.onnx"), tmp_path / "records.jsonl"
    stopped_at: list[int] = []

    def stop_after_some_records() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if records.exists() and len(records.read_text().splitlines()) >= 10:
                break
            time.sleep(0.2)
        stopped_at.append(len(records.read_text().splitlines()) if records.exists() else 0)
        _stop([victim], "no-such-folder")  # this node only; the head and the other device stay

    stopper = threading.Thread(target=stop_after_some_records)
    stopper.start()
    tuning = TuningOptions(trials=40, deadline=240, records=records, tophub=[], cluster=cluster.address)
    start = time.monotonic()
    package = aotc.compile(model, target, tuning=tuning, output=tmp_path / "m.aotc")
    elapsed = time.monotonic() - start
    stopper.join()
    assert package.path.exists() and elapsed < 240, elapsed
    assert victim.proc.poll() is not None  # the device really went away during the build
    measured = [json.loads(line) for line in records.read_text().splitlines()]
    assert len(measured) == package.result.tuning.trials  # every trial the build counted is in the file
    assert all(r["error"] == 0 or r["error_msg"] for r in measured)
    after = measured[stopped_at[0] + 2 :]  # the build went on, on the other device
    assert after and sum(r["error"] == 0 for r in after) >= len(after) // 2, [r["error_msg"] for r in after]
    report = json.loads((package.result.report / "report.json").read_text())
    states = sorted(d["state"] for d in report["tuning"]["devices"])
    assert states == ["lost", "ready"], report["tuning"]["devices"]
