"""Lowering and featurizing candidates in worker processes (aotc.search.program_pool): the caches get what
this process computes, a search finds the same candidates, and a broken pool changes nothing."""

import contextlib
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np

from aotc.schedule.steps import replay
from aotc.search import program_pool
from aotc.search.common import RandomCostModel
from aotc.search.evolution import search_round
from aotc.search.features import clear_feature_cache, knows_features, state_features
from aotc.search.lowering import knows_key, state_key
from aotc.search.params import SearchParams

from .test_annotation import TARGET, conv_bias_relu, population

SERIAL = SearchParams(population=48, generations=2, workers=0)


def unlowered(states):
    """The same programs on a fresh DAG, replayed only: nothing of them is lowered or cached yet."""
    dag = conv_bias_relu()
    return [replay(dag, s.steps) for s in states]


def test_prefetch_caches_the_keys_and_features_this_process_computes():
    here = population(conv_bias_relu(), 40)
    expected = [(state_key(s), state_features(s)) for s in here]
    there = unlowered(here)
    clear_feature_cache()  # keyed by workload and steps: `here` filled it for `there` too
    assert not any(knows_key(s) or knows_features(s) for s in there)
    program_pool.prefetch(there, workers=2)
    assert all(knows_key(s) and knows_features(s) for s in there)
    for s, (key, feats) in zip(there, expected):
        assert state_key(s) == key
        np.testing.assert_array_equal(state_features(s), feats)


def test_small_batches_and_single_workers_stay_in_this_process(monkeypatch):
    states = population(conv_bias_relu(), 40)
    monkeypatch.setattr(program_pool, "_start", lambda workers: (_ for _ in ()).throw(AssertionError("pool")))
    few, one_worker = unlowered(states[: program_pool.MIN_BATCH - 1]), unlowered(states)
    program_pool.prefetch(few, workers=2)  # too few to ship
    program_pool.prefetch(one_worker, workers=1)
    program_pool.prefetch(states, workers=2)  # all lowered already
    assert not any(knows_key(s) for s in few + one_worker)


def test_a_search_round_finds_the_same_candidates_with_workers():
    def run(workers):
        out = search_round(
            conv_bias_relu(),
            TARGET,
            RandomCostModel(3),
            random.Random(3),
            set(),
            n=16,
            params=SERIAL.replace(workers=workers),
        )
        return [s.steps for s in out]

    assert run(2) == run(0)


def test_a_broken_pool_leaves_the_work_to_this_process(monkeypatch):
    class Broken:
        def submit(self, *args):
            raise RuntimeError("A process in the process pool was terminated abruptly")

    states = population(conv_bias_relu(), 40)
    for start in (lambda workers: Broken(), lambda workers: (_ for _ in ()).throw(OSError("no processes"))):
        monkeypatch.setattr(program_pool, "_start", start)
        fresh = unlowered(states)
        program_pool.prefetch(fresh, workers=2)
        assert not any(knows_key(s) for s in fresh)
        assert [state_key(s) for s in fresh] == [state_key(s) for s in states]


# Starts the pool, prints this process's children (the workers and multiprocessing's resource tracker),
# then ends as a killed process or a pytest-xdist worker does: no exit handler runs.
ABRUPT_EXIT = textwrap.dedent(
    """
    import os
    from aotc.schedule.steps import replay
    from aotc.search import program_pool
    from tests.test_annotation import conv_bias_relu, population

    def children():
        me = str(os.getpid())
        out = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[1] == me:
                        out.append(pid)
            except OSError:
                pass
        return out

    if __name__ == "__main__":
        dag = conv_bias_relu()
        program_pool.prefetch([replay(dag, s.steps) for s in population(conv_bias_relu(), 40)], workers=2)
        print(" ".join(children()), flush=True)
        os._exit(0)
    """
)


def test_the_workers_die_with_a_parent_that_ends_without_exit_handlers(tmp_path):
    """A tuner killed, or ended by os._exit as a pytest-xdist worker ends, left its lowering workers
    waiting forever, adopted by init (one pair a test run)."""
    root = Path(__file__).resolve().parents[1]
    out, err = tmp_path / "children.txt", tmp_path / "stderr.txt"
    # files, not pipes: workers that outlive the script would hold a pipe open
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.run(
            [sys.executable, "-c", ABRUPT_EXIT], cwd=root, stdout=stdout, stderr=stderr, timeout=120
        )
    assert proc.returncode == 0, err.read_text()
    pids = [int(p) for p in out.read_text().split()]
    assert len(pids) >= 2, pids  # the two workers (and the resource tracker)
    try:
        deadline = time.monotonic() + 10
        while (alive := [p for p in pids if Path(f"/proc/{p}").exists()]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive, f"processes {alive} outlived their parent"
    finally:
        for p in pids:
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
