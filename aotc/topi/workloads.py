"""Named single-operator workloads with shape parameters: what `aotc tune-op` and benchmarks tune."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from aotc import te
from aotc.te.dag import ComputeDAG
from aotc.te.tensor import LAYOUT_FREE
from aotc.topi import nn


@dataclass(frozen=True)
class Workload:
    params: tuple[str, ...]
    defaults: tuple[int, ...]
    make: Callable[..., ComputeDAG]
    help: str


def _matmul(m: int, n: int, k: int) -> ComputeDAG:
    a = te.placeholder((m, k), name="A")
    b = te.placeholder((k, n), name="B")
    return te.ComputeDAG([nn.matmul(a, b)])


def _dense(m: int, n: int, k: int) -> ComputeDAG:
    x = te.placeholder((m, k), name="X")
    w = te.placeholder((n, k), name="W", tag=LAYOUT_FREE)
    return te.ComputeDAG([nn.dense(x, w)])


def _conv2d(n: int, c: int, h: int, w: int, f: int, k: int, stride: int, pad: int) -> ComputeDAG:
    x = te.placeholder((n, c, h, w), name="data")
    wt = te.placeholder((f, c, k, k), name="weight", tag=LAYOUT_FREE)
    return te.ComputeDAG([nn.conv2d_nchw(x, wt, stride=stride, padding=pad)])


def _conv2d_relu(n: int, c: int, h: int, w: int, f: int, k: int, stride: int, pad: int) -> ComputeDAG:
    x = te.placeholder((n, c, h, w), name="data")
    wt = te.placeholder((f, c, k, k), name="weight", tag=LAYOUT_FREE)
    b = te.placeholder((f,), name="bias", tag=LAYOUT_FREE)
    return te.ComputeDAG([nn.relu(nn.bias_add(nn.conv2d_nchw(x, wt, stride=stride, padding=pad), b))])


def _depthwise(n: int, c: int, h: int, w: int, k: int, stride: int, pad: int) -> ComputeDAG:
    x = te.placeholder((n, c, h, w), name="data")
    wt = te.placeholder((c, 1, k, k), name="weight", tag=LAYOUT_FREE)
    return te.ComputeDAG([nn.depthwise_conv2d_nchw(x, wt, stride=stride, padding=pad)])


def _softmax(rows: int, cols: int) -> ComputeDAG:
    return te.ComputeDAG([nn.softmax(te.placeholder((rows, cols), name="x"))])


WORKLOADS: dict[str, Workload] = {
    "matmul": Workload(("M", "N", "K"), (1024, 1024, 1024), _matmul, "C[M,N] = A[M,K] @ B[K,N]"),
    "dense": Workload(("M", "N", "K"), (1, 1000, 1280), _dense, "Y[M,N] = X[M,K] @ W[N,K]^T"),
    "conv2d": Workload(
        ("N", "C", "H", "W", "F", "K", "stride", "pad"),
        (1, 64, 56, 56, 64, 3, 1, 1),
        _conv2d,
        "NCHW conv, F filters of KxK",
    ),
    "conv2d_relu": Workload(
        ("N", "C", "H", "W", "F", "K", "stride", "pad"),
        (1, 64, 56, 56, 64, 3, 1, 1),
        _conv2d_relu,
        "conv2d + bias + relu",
    ),
    "depthwise": Workload(
        ("N", "C", "H", "W", "K", "stride", "pad"),
        (1, 96, 56, 56, 3, 1, 1),
        _depthwise,
        "depthwise NCHW conv",
    ),
    "softmax": Workload(("rows", "cols"), (128, 1000), _softmax, "softmax over the last axis"),
}


def make_workload(name: str, shape: list[int] | None = None) -> ComputeDAG:
    """The DAG of a named workload; `shape` gives its parameters in order (defaults when None)."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown operator {name!r}; known: {', '.join(sorted(WORKLOADS))}")
    wl = WORKLOADS[name]
    values = list(wl.defaults) if shape is None else list(shape)
    if len(values) != len(wl.params):
        raise ValueError(
            f"{name} takes {len(wl.params)} shape values ({','.join(wl.params)}), got {len(values)}"
        )
    if any(v < 0 for v in values):
        raise ValueError(f"{name}: shape values must not be negative, got {values}")
    return wl.make(*values)
