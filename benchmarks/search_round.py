"""Seconds of one search round (sample 256, evolve 4 generations, pick 64) of an int8 conv task, in the
tuner's process alone (`workers` 0) and with worker processes lowering and featurizing the candidates
(aotc.search.program_pool), taking turns; both ways must pick the same candidates.

    python benchmarks/search_round.py [--workers N] [--rounds R] [--quick]

The task is compile_time.py's int8 3x3 conv (integer Winograd where the CPU takes it). Each round starts
cold: a fresh DAG (its lowering cache) and an empty feature cache, an untrained XGBoost model (which
still reads every candidate's features). Wall seconds, and the CPU seconds of this process.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import statistics
import sys
import time

from compile_time import int8_conv_dag, loadavg
from timing import cpu_class

from aotc.search.cost_model import XGBCostModel
from aotc.search.evolution import search_round
from aotc.search.features import clear_feature_cache
from aotc.search.params import SearchParams
from aotc.search.program_pool import shutdown
from aotc.target import host_cores, host_target


def one_round(hw: int, channels: int, params: SearchParams, seed: int) -> tuple[float, float, str]:
    """(wall s, CPU s of this process, digest of the picked candidates' steps) of one cold round."""
    target = host_target()
    dag = int8_conv_dag(hw, channels, channels, 3, target)
    clear_feature_cache()
    wall, cpu = time.perf_counter(), time.process_time()
    picked = search_round(dag, target, XGBCostModel(), random.Random(seed), set(), params=params)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    digest = hashlib.sha1(repr([s.steps for s in picked]).encode()).hexdigest()[:12]
    return wall, cpu, digest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=host_cores(), help="worker processes (default: the cores)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds each way, taking turns")
    ap.add_argument("--quick", action="store_true", help="a 14x14x16 conv, a small population, one round")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    hw, channels, base = (
        (14, 16, SearchParams(population=64, generations=1)) if args.quick else (28, 64, SearchParams())
    )
    rounds = 1 if args.quick else args.rounds
    print(f"CPU class: {cpu_class()}; load average {loadavg()}")
    print(f"int8 conv3x3 {hw}x{hw} {channels}->{channels}: one search round, {rounds} each way, taking turns")
    ways = {"alone": base.replace(workers=0), f"{args.workers} workers": base.replace(workers=args.workers)}
    times: dict[str, list[tuple[float, float]]] = {way: [] for way in ways}
    digests = set()
    for r in range(rounds):
        for way, params in ways.items() if r % 2 == 0 else reversed(ways.items()):
            wall, cpu, digest = one_round(hw, channels, params, args.seed)
            times[way].append((wall, cpu))
            digests.add(digest)
    shutdown()
    for way, rows in times.items():
        wall = statistics.median(w for w, _ in rows)
        cpu = statistics.median(c for _, c in rows)
        print(f"  {way:<10} wall {wall:6.1f} s  (this process's CPU {cpu:6.1f} s)")
    alone = statistics.median(w for w, _ in times["alone"])
    pooled = statistics.median(w for w, _ in times[f"{args.workers} workers"])
    same = "the same candidates" if len(digests) == 1 else "DIFFERENT CANDIDATES"
    print(f"  alone / with workers: {alone / pooled:.2f}x wall; {same}; load average {loadavg()}")
    return 0 if len(digests) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
