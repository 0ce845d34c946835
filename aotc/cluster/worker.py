"""`aotc worker`: this machine joins (or starts) a Ray cluster as a device that measures candidates
(docs/cluster.md#setting-up-a-cluster).

The node is a `ray start --block` child process: Ray's own launcher starts the node's processes
(raylet, object store, workers) and stops them on SIGTERM; Ctrl-C or SIGTERM to `aotc worker` stops
the node that way, and kills by id whatever of it is left after a grace period. The node advertises one unit of the device's key
(aotc.cluster.keys) as a custom resource, so a build's `DeviceRunner` actor lands on it and a device
measures one candidate at once, and by default no CPUs, so Ray places no other work on a device while
it measures. `--no-device` joins a machine that runs builds (a Ray driver needs a node of its own).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys

from aotc.cluster.keys import DeviceKey, device_key
from aotc.target import Target

__all__ = [
    "add_worker_parser",
    "cmd_worker",
    "descendants",
    "main",
    "measured_target",
    "ray_start_command",
    "stop_node",
]

DEFAULT_PORT = 6379
OBJECT_STORE_BYTES = 256 << 20  # candidates and references are kilobytes to megabytes
STOP_GRACE_S = 20.0


def add_worker_parser(subparsers) -> argparse.ArgumentParser:
    """Register `aotc worker` on the `aotc` command's subparsers (or any argparse subparsers)."""
    p = subparsers.add_parser(
        "worker",
        help="join a Ray cluster as a device that measures candidates for builds (tuning on a cluster)",
        description="Start (--head) or join (--address) a Ray cluster as a node that measures candidates "
        "for --target on this machine, one at a time, until stopped (Ctrl-C). Needs the cluster extra: "
        "pip install 'aotc[cluster]'. See docs/cluster.md.",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--address", metavar="HOST:PORT", help="the cluster's head to join")
    where.add_argument("--head", action="store_true", help="start the cluster's head on this machine")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="the head's port (with --head)")
    p.add_argument(
        "--target",
        default="llvm",
        help="the target this device measures: 'llvm' (this CPU), a CPU of another architecture run "
        "under qemu, 'cuda -arch=...' or 'opencl'",
    )
    p.add_argument(
        "--no-device", action="store_true", help="join without measuring (a machine that runs builds)"
    )
    p.add_argument(
        "--num-cpus",
        type=int,
        default=None,
        help="CPUs Ray may place tasks on here (default: 0 on a device, so nothing disturbs its timings; "
        "all of them with --no-device)",
    )
    p.add_argument("--node-ip-address", metavar="IP", help="the address other nodes reach this one at")
    p.add_argument("--temp-dir", help="Ray's session folder (with --head; default Ray's /tmp/ray)")
    p.add_argument("--print-key", action="store_true", help="print the device key of --target here and exit")
    p.set_defaults(func=cmd_worker)
    return p


def measured_target(text: str) -> tuple[Target, bool]:
    """The target a device serves, and whether it runs its code under qemu; ValueError if this machine
    cannot measure it (another architecture without qemu, features its CPU lacks, no GPU)."""
    import llvmlite.binding as llvm

    from aotc.emulator import kernel_emulation_unavailable
    from aotc.search.measure import device_unavailable, emulated_arch
    from aotc.target import arch_of, cpu_features, host_target, parse_target

    target = parse_target(text)
    if target.is_gpu:
        missing = device_unavailable(target)
        if missing is not None:
            raise ValueError(f"this machine cannot measure {target}: {missing}")
        return target, False
    here = arch_of(llvm.get_process_triple())
    if target.isa != here:
        if emulated_arch(target) is None:
            why = kernel_emulation_unavailable(target)
            raise ValueError(f"this {here} machine cannot measure {target}: {why}")
        return target, True
    lacking = sorted(set(cpu_features(target)) - set(cpu_features(host_target())))
    if lacking:
        raise ValueError(f"this machine's CPU lacks {', '.join(lacking)}, which code for {target} may use")
    return target, False


def ray_start_command(args: argparse.Namespace, key: DeviceKey | None) -> list[str]:
    """The `ray start --block` command line of this node."""
    ray = shutil.which("ray", path=os.path.dirname(sys.executable)) or shutil.which("ray")
    if ray is None:
        raise ValueError("`aotc worker` needs Ray: pip install 'aotc[cluster]'")
    cmd = [ray, "start", "--block", "--disable-usage-stats"]
    if args.head:
        cmd += ["--head", f"--port={args.port}", "--include-dashboard=false"]
        if args.temp_dir:
            cmd.append(f"--temp-dir={args.temp_dir}")
    else:
        cmd.append(f"--address={args.address}")
    cpus = args.num_cpus if args.num_cpus is not None else (os.cpu_count() or 1) if key is None else 0
    cmd += [f"--num-cpus={cpus}", "--num-gpus=0", f"--object-store-memory={OBJECT_STORE_BYTES}"]
    if key is not None:
        cmd.append(f"--resources={json.dumps({str(key): 1})}")
    if args.node_ip_address:
        cmd.append(f"--node-ip-address={args.node_ip_address}")
    return cmd


def cmd_worker(args: argparse.Namespace) -> int:
    """Run this machine's node until it is stopped; Ray's exit code (130 after Ctrl-C)."""
    key = None
    if not args.no_device:
        target, emulated = measured_target(args.target)
        key = device_key(target, emulated)
        if args.print_key:
            print(key)
            return 0
        print(f"aotc worker: device {key} measures {key.what}", file=sys.stderr)
    if not (args.head or args.address):
        raise ValueError("aotc worker: give --address HOST:PORT of the cluster's head, or --head")
    cmd = ray_start_command(args, key)
    # no usage statistics; a device has nothing to drain, so SIGTERM stops its node at once (not after 30 s)
    env = {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0", **os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    # its own session: Ctrl-C reaches this process only, which stops the node below
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    signal.signal(signal.SIGTERM, _raise_stop)
    try:
        return proc.wait()
    except (KeyboardInterrupt, _Stop):
        stop_node(proc)
        return 130


class _Stop(Exception):
    """SIGTERM: stop the node as Ctrl-C does."""


def _raise_stop(*_) -> None:
    raise _Stop


def stop_node(proc: subprocess.Popen) -> None:
    """Stop a `ray start --block` launcher and every process it started.

    SIGTERM makes the launcher kill its node's processes and exit; whatever still runs after
    STOP_GRACE_S (a launcher that was itself stuck) is killed by id, from the list of its descendants
    taken before the signal, since a process whose parent exited is no longer found as a descendant."""
    started = descendants(proc.pid)
    proc.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=STOP_GRACE_S)
    for pid in [proc.pid, *started]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=STOP_GRACE_S)


def descendants(root: int) -> list[int]:
    """The ids of the processes below `root` (children, theirs, ...), read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])  # the command name may hold spaces and parentheses
        children.setdefault(parent, []).append(int(entry))
    out: list[int] = []
    todo = [root]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m aotc.cluster.worker ...`, the same as `aotc worker ...`."""
    parser = argparse.ArgumentParser(prog="aotc")
    add_worker_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["worker", *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.func(args)
    except ValueError as err:
        print(f"aotc: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
