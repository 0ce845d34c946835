"""The untuned GPU schedule's tilings timed on an NVIDIA GPU: what the tiling heuristic picks under other
preferences (register tile, block size, staged reduction), measured by the tuner's GPU runner (each
checked against the CPU reference), next to torch.matmul on the same shapes.

    python benchmarks/gpu_tiles.py [--workloads gemm,ff16,qkv16,ff1,conv16] [--ranks 2]

Needs an NVIDIA GPU, `aotc[cuda]` and torch for the peer; without a GPU it says so and exits 2 (the
driver is asked in a child process). `--target opencl` runs on PoCL where there is no GPU: a smoke test
whose timings say nothing about a GPU. A row per distinct tiling, fastest first, with the preferences
that chose it (`default` is the untuned schedule's). TF32 is off for torch: every side computes in fp32.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable

from gpu import median_ms

from aotc import te
from aotc.schedule.gpu_tiling import TilePreferences, tiled_gpu_schedule, tiles_for, wants_tiles
from aotc.schedule.steps import steps_to_json
from aotc.search.measure import MeasureOptions, Measurer, device_unavailable
from aotc.target import parse_target
from aotc.te.dag import ComputeDAG
from aotc.topi import nn
from aotc.topi.nhwc import conv2d_nhwc

NO_GPU = 2

PREFERENCES = {
    "default": TilePreferences(),
    "8x8 128x128": TilePreferences(register_tile=64, block_outputs=128 * 128),
    "8x4 128x64": TilePreferences(register_tile=32, block_outputs=128 * 64),
    "4x4 k8": TilePreferences(staged_reduction=8),
    "8x8 128x128 k8": TilePreferences(register_tile=64, block_outputs=128 * 128, staged_reduction=8),
    "4x4 128x64 512t": TilePreferences(block_outputs=128 * 64, max_threads=512),
}


def _dense(m: int, k: int, n: int) -> Callable[[], ComputeDAG]:
    def make() -> ComputeDAG:
        x, w = te.placeholder((m, k), name="x"), te.placeholder((n, k), name="w")
        return te.ComputeDAG([nn.dense(x, w)])

    return make


def _gemm() -> ComputeDAG:
    a, b = te.placeholder((4096, 4096), name="a"), te.placeholder((4096, 4096), name="b")
    return te.ComputeDAG([nn.matmul(a, b)])


def _conv16() -> ComputeDAG:
    """ResNet-18's 3x3 conv of its first stage at batch 16, NHWC."""
    x, w = te.placeholder((16, 56, 56, 64), name="x"), te.placeholder((64, 3, 3, 64), name="w")
    return te.ComputeDAG([conv2d_nhwc(x, w, ((1, 1), (1, 1, 1, 1), (1, 1)))])


# name -> (the DAG, the torch peer's (m, k, n) for x @ w.T, or None)
WORKLOADS: dict[str, tuple[Callable[[], ComputeDAG], tuple[int, int, int] | None]] = {
    "gemm": (_gemm, (4096, 4096, 4096)),
    "ff16": (_dense(2048, 768, 3072), (2048, 768, 3072)),  # BERT-base feed-forward at batch 16
    "qkv16": (_dense(2048, 768, 768), (2048, 768, 768)),  # ... its projections
    "ff1": (_dense(128, 768, 3072), (128, 768, 3072)),  # ... at batch 1
    "conv16": (_conv16, None),
}


def torch_ms(shape: tuple[int, int, int]) -> float | None:
    """Median milliseconds of torch.matmul(x, w.T) for `shape` (m, k, n) in fp32, or None without torch."""
    try:
        import torch
    except ImportError:
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    m, k, n = shape
    x, w = torch.rand(m, k, device="cuda"), torch.rand(n, k, device="cuda")
    return median_ms(lambda: torch.matmul(x, w.T), torch.cuda.synchronize, repeat=20)


def sweep(name: str, target, ranks: int) -> list[str]:
    make, peer = WORKLOADS[name]
    dag = make()
    anchor = next(op for op in dag.compute_ops if wants_tiles(dag, op, target))
    states, labels, seen = [], [], {}
    for pref_name, prefs in PREFERENCES.items():
        tiles = tiles_for(dag, anchor, target, prefs)
        for rank in range(min(ranks, len(tiles))):
            state = tiled_gpu_schedule(dag, target, rank, prefs)
            if state is None:
                continue
            key = str(steps_to_json(state.steps))
            if key in seen:
                labels[seen[key]][0].append(f"{pref_name}#{rank}")
                continue
            seen[key] = len(states)
            states.append(state)
            labels.append(([f"{pref_name}#{rank}"], tiles[rank]))
    with Measurer(dag, target, MeasureOptions(repeat=3, min_repeat_ms=50)) as measurer:
        results = measurer.measure(states)
    flops = dag.flop_count
    rows = []
    for (names, t), r in zip(labels, results):
        ms = r.mean_cost * 1e3 if r.ok else math.inf
        rows.append((ms, names, t, r))
    rows.sort(key=lambda row: row[0])
    peer_ms = torch_ms(peer) if peer and target.kind == "cuda" else None
    peer_text = f"; torch.matmul {peer_ms:.3f} ms ({flops / peer_ms / 1e9:.1f} TFLOP/s)" if peer_ms else ""
    lines = [f"{name}: {flops / 1e9:.1f} GFLOP{peer_text}"]
    for ms, names, t, r in rows:
        tile = "x".join(str(v) for v in t.block_tile)
        k = "x".join(str(s) for s, _ in t.reduce)
        speed = f"{ms:8.3f} ms {flops / ms / 1e9:6.1f} TFLOP/s" if r.ok else f"failed ({r.error.name})"
        ratio = f"  {peer_ms / ms:5.2f}x torch" if peer_ms and r.ok else ""
        lines.append(
            f"  {speed}{ratio}  block {tile:<14} {t.threads:4d} threads {t.registers:3d} outputs/thread "
            f"k-tile {k:<8} shared {t.shared_bytes:6d} B  {', '.join(names)}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help=f"subset of {', '.join(WORKLOADS)}")
    ap.add_argument("--ranks", type=int, default=2, help="tilings per preference, best first (default 2)")
    ap.add_argument("--target", default="cuda -arch=sm_90", help="default 'cuda -arch=sm_90'")
    args = ap.parse_args(argv)
    names = [w for w in args.workloads.split(",") if w]
    unknown = [w for w in names if w not in WORKLOADS]
    if unknown:
        ap.error(f"unknown workloads {', '.join(unknown)}; known: {', '.join(WORKLOADS)}")
    target = parse_target(args.target)
    why = device_unavailable(target)
    if why is not None:
        print(f"benchmarks/gpu_tiles.py needs an NVIDIA GPU: {why}", file=sys.stderr)
        return NO_GPU
    for name in names:
        print("\n".join(sweep(name, target, args.ranks)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
