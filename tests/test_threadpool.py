"""The kernel library's own thread pool: no libgomp, correct team sizes, fork and unload safety."""

from __future__ import annotations

import _ctypes
import ctypes
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from aotc.codegen.llvm import build_llvm_ir, compile_to_object, link_shared, thread_pool_object
from aotc.codegen.threadpool import MAX_TEAM
from aotc.ir.expr import Buffer, Load, Var, cast, const
from aotc.ir.stmt import BufferStore, PrimFunc
from aotc.target import parse_target
from tests.concurrency import failures_in_threads
from tests.test_codegen_llvm import HOST, P, build, loop

N = 4096


def _count_func() -> PrimFunc:
    """`count(n, b)`: b[i] += 1 for i < n, in a parallel loop."""
    n, b, i = Buffer("N", "int64", (1,)), Buffer("B", "int32", (N,)), Var("i")
    body = BufferStore(b, Load(b, (i,)) + cast("int32", const(1)), (i,))
    return PrimFunc("count", (n, b), loop(i, Load(n, (const(0),)), P, body, N))


def _count_kernel(tmp_path, name="m"):
    return build(tmp_path, _count_func(), name=name)


def _check_counts(lib, threads: int, calls: int = 50) -> None:
    lib.set_num_threads(threads)
    for n in (0, 1, 7, 100, N):
        b = np.zeros(N, np.int32)
        for _ in range(calls):
            lib.kernel("count")(np.array([n], np.int64), b)
        np.testing.assert_array_equal(b, np.where(np.arange(N) < n, calls, 0))


def _threads() -> set[int]:
    return {int(t) for t in os.listdir("/proc/self/task")}


def _needed(path: str) -> list[str]:
    dynamic = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    return [line.split("[")[-1].rstrip("]") for line in dynamic.splitlines() if "(NEEDED)" in line]


def test_library_needs_no_openmp_runtime(tmp_path):
    lib = _count_kernel(tmp_path)
    # a candidate library leaves libc's symbols to the Python process that loads it, and needs no OpenMP
    assert not any("omp" in name for name in _needed(lib.path)), _needed(lib.path)
    symbols = subprocess.run(["readelf", "--dyn-syms", lib.path], capture_output=True, text=True).stdout
    assert "GOMP_" not in symbols and "omp_get" not in symbols
    assert "sched_yield" in symbols  # the pool's system calls, undefined until the loader binds them
    # a package's library names libc itself, for any process that loads it
    so = str(tmp_path / "standalone.so")
    ir = build_llvm_ir([_count_func()], HOST, thread_pool=False)
    link_shared([compile_to_object(ir, HOST), thread_pool_object(HOST)], so)
    assert "libc.so.6" in _needed(so) and not any("omp" in name for name in _needed(so)), _needed(so)


def test_default_team_is_the_affinity_mask(tmp_path):
    lib = _count_kernel(tmp_path)
    assert lib.max_threads() == len(os.sched_getaffinity(0))
    lib._lib.aotc_set_num_threads(ctypes.c_int(0))  # clamped: a team has at least the caller
    assert lib.max_threads() == 1


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_every_iteration_runs_once_for_any_team(tmp_path, threads):
    _check_counts(_count_kernel(tmp_path), threads)


def test_concurrent_callers_share_one_pool(tmp_path):
    """While one thread's region holds the pool, another thread's region runs alone and stays correct."""
    lib = _count_kernel(tmp_path)
    lib.set_num_threads(2)

    def check(_):
        b = np.zeros(N, np.int32)
        for _ in range(200):
            lib.kernel("count")(np.array([N], np.int64), b)
        return bool(np.all(b == 200))

    assert failures_in_threads(check, 4) == []


def test_unloading_a_library_stops_its_workers(tmp_path):
    """The tuner unloads every measured library: its destructor must join the workers first, or they
    would run on in unmapped code."""
    for k in range(3):
        (tmp_path / str(k)).mkdir()
        lib = _count_kernel(tmp_path / str(k), name=f"m{k}")
        before = _threads()  # (other threads of this process may end meanwhile: compare thread ids)
        _check_counts(lib, 3, calls=2)
        workers = _threads() - before
        assert len(workers) == 2
        handle = lib._lib._handle
        del lib
        _ctypes.dlclose(handle)
        assert not workers & _threads()


def test_forked_child_starts_its_own_workers(tmp_path):
    lib = _count_kernel(tmp_path)
    _check_counts(lib, 2, calls=2)
    pid = os.fork()
    if pid == 0:  # the child has the parent's pool state but none of its threads
        status = 1
        try:
            _check_counts(lib, 2, calls=20)
            status = 0 if len(_threads()) == 2 else 2
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_process_exits_cleanly_with_sleeping_workers(tmp_path):
    """At exit the destructor wakes sleeping workers and joins them; the process must not hang."""
    lib = _count_kernel(tmp_path)
    code = (
        "import ctypes, time, numpy as np\n"
        f"lib = ctypes.CDLL({lib.path!r})\n"
        "lib.aotc_set_num_threads(4)\n"
        "n, b = np.array([4096], np.int64), np.zeros(4096, np.int32)\n"
        "argv = (ctypes.c_void_p * 2)(n.ctypes.data, b.ctypes.data)\n"
        "assert lib.count(argv) == 0\n"
        "time.sleep(0.3)\n"  # the workers are asleep by now
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    ctypes.CDLL(lib.path)  # still loadable afresh here


@pytest.mark.parametrize("triple", ["aarch64-linux-gnu", "armv7a-linux-gnueabihf"])
def test_pool_compiles_for_arm_targets(triple):
    n, b, i = Buffer("N", "int64", (1,)), Buffer("B", "int32", (64,)), Var("i")
    body = BufferStore(b, Load(b, (i,)) + cast("int32", const(1)), (i,))
    target = parse_target(f"llvm -mtriple={triple}")
    ir = build_llvm_ir([PrimFunc("count", (n, b), loop(i, Load(n, (const(0),)), P, body, 64))], target)
    assert "@aotc.pool.parallel(" in ir and "GOMP" not in ir
    assert compile_to_object(ir, target)[:4] == b"\x7fELF"


def _allowed_cpus(tid: int) -> str:
    with open(f"/proc/self/task/{tid}/status") as f:
        return next(line.split(":")[1].strip() for line in f if line.startswith("Cpus_allowed_list"))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores to bind 2 threads apart")
def test_bound_threads_run_one_per_core(tmp_path):
    lib = _count_kernel(tmp_path)
    allowed = os.sched_getaffinity(0)
    cpus = sorted(allowed)[:2]
    mine = threading.get_native_id()
    try:
        lib.bind_threads(cpus)
        assert _allowed_cpus(mine) == str(cpus[0])
        before = _threads()
        _check_counts(lib, 2, calls=2)
        (worker,) = _threads() - before
        deadline = time.monotonic() + 5  # the worker binds itself once it first runs
        while _allowed_cpus(worker) != str(cpus[1]) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _allowed_cpus(worker) == str(cpus[1])
    finally:  # this thread was bound to one core: give it back the cores it had (later tests count them)
        os.sched_setaffinity(0, allowed)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores to bind 2 threads apart")
def test_unbinding_restores_the_mask_the_library_was_loaded_with(tmp_path):
    lib = _count_kernel(tmp_path)
    everything = sorted(os.sched_getaffinity(0))
    mine = threading.get_native_id()
    try:
        lib.bind_threads(everything[:1])
        assert _allowed_cpus(mine) == str(everything[0])
        assert lib.max_threads() == len(everything)  # the default team still counts the load-time mask
        lib.bind_threads([])
        assert sorted(os.sched_getaffinity(0)) == everything
    finally:
        os.sched_setaffinity(0, set(everything))


def _set_call_threads(lib, n: int) -> None:
    lib._lib.aotc_set_call_threads(ctypes.c_int(n))


def test_a_threads_own_team_overrides_the_librarys_for_that_thread_only(tmp_path):
    lib = _count_kernel(tmp_path)
    lib.set_num_threads(3)
    _set_call_threads(lib, 2)
    try:
        assert lib.max_threads() == 2
        seen = []
        other = threading.Thread(target=lambda: seen.append(lib.max_threads()))
        other.start()
        other.join()
        assert seen == [3]  # another thread (another model's call) still gets the library's team
        before = _threads()
        _check_counts(lib, 3, calls=2)  # (sets the library's team again: the override stays)
        assert len(_threads() - before) == 1  # a team of 2: the caller and one worker
    finally:
        _set_call_threads(lib, 0)
    assert lib.max_threads() == 3


def test_concurrent_calls_with_their_own_teams(tmp_path):
    lib = _count_kernel(tmp_path)
    lib.set_num_threads(1)

    def check(k):
        try:
            _set_call_threads(lib, 1 + k % 3)
            b = np.zeros(N, np.int32)
            for _ in range(100):
                lib.kernel("count")(np.array([N], np.int64), b)
                if lib.max_threads() != 1 + k % 3:
                    return False
            return bool(np.all(b == 100))
        except Exception:  # (an exception in a thread would only be a warning)
            return False

    assert failures_in_threads(check, 4) == []


def test_every_thread_count_is_clamped_to_the_largest_team(tmp_path):
    """No value of either setting reaches past the pool's largest team (or below one thread)."""
    lib = _count_kernel(tmp_path)
    code = (
        "import ctypes, numpy as np\n"
        f"lib = ctypes.CDLL({lib.path!r})\n"
        "n, b = np.array([4096], np.int64), np.zeros(4096, np.int32)\n"
        "argv = (ctypes.c_void_p * 2)(n.ctypes.data, b.ctypes.data)\n"
        "seen = []\n"
        "for shared, own in [(100000, 0), (2**31 - 1, 0), (-5, 0), (1, 100000), (1, -1), (3, 2**31 - 1)]:\n"
        "    lib.aotc_set_num_threads(shared)\n"
        "    lib.aotc_set_call_threads(own)\n"
        "    assert lib.count(argv) == 0\n"
        "    seen.append(lib.aotc_get_max_threads())\n"
        "assert (b == 6).all(), b\n"
        "print(seen)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [
        f"[{MAX_TEAM},",
        f"{MAX_TEAM},",
        "1,",
        f"{MAX_TEAM},",
        "1,",
        f"{MAX_TEAM}]",
    ]
