"""The GPU search space (issue 16): Ansor's GPU sketch rules and init rules, and the untuned GPU schedule.

Random programs sampled from the sketches (and mutated, as evolution does) of matmul, conv2d (NCHW and
NHWC), depthwise, Winograd, softmax, layer norm, pooling and a reduction are lowered, emitted as one
kernel source, run as OpenCL on the CPU (PoCL) against numpy, and compiled as CUDA for sm_80 and sm_90.
The slow sweep samples many more. No test touches the CUDA driver.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from aotc import te
from aotc.codegen.gpu import build_opencl, compile_cuda, emit_gpu, gpu_source, opencl_device, run_opencl
from aotc.schedule.default_gpu import untiled_gpu_schedule
from aotc.schedule.lower import lower
from aotc.schedule.state import Annotation, ComputeAtKind, IterKind
from aotc.search.annotation import sample_state
from aotc.search.evolution import mutate
from aotc.search.lowering import lowered
from aotc.search.sketch import SearchContext, generate_sketches
from aotc.search.untuned import untuned_schedule
from aotc.target import parse_target
from aotc.te.reference import evaluate
from aotc.te.tensor import LAYOUT_FREE
from aotc.topi import nn, winograd
from aotc.topi.nhwc import conv2d_nhwc

try:
    from aotc.codegen.cuda_compiler import cuda_compiler_name
except ImportError:  # the NVRTC route is optional; nvcc alone serves
    from aotc.codegen.gpu import nvcc_path as cuda_compiler_name

# float32 kernels against a float64 reference: sums of up to 288 terms, exp and division
RTOL = 2e-5
OPENCL = parse_target("opencl")
CUDA = parse_target("cuda -arch=sm_90")

_DEVICE = opencl_device()
needs_opencl = pytest.mark.skipif(
    _DEVICE is None, reason="no OpenCL platform (pip install pyopencl; apt-get install pocl-opencl-icd)"
)
needs_cuda_compiler = pytest.mark.skipif(
    cuda_compiler_name() is None, reason="neither NVRTC (pip install aotc[cuda]) nor nvcc is available"
)


def _matmul():
    return te.ComputeDAG([nn.matmul(te.placeholder((64, 32), name="A"), te.placeholder((32, 48), name="B"))])


def _dense_bias_relu():
    x, w, b = (
        te.placeholder((4, 40), name="x"),
        te.placeholder((24, 40), name="w"),
        te.placeholder((24,), name="b"),
    )
    return te.ComputeDAG([nn.relu(nn.bias_add(nn.dense(x, w), b))])


def _conv_nchw():
    x, w = te.placeholder((1, 8, 14, 14), name="x"), te.placeholder((16, 8, 3, 3), name="w")
    b = te.placeholder((16,), name="b")
    return te.ComputeDAG([nn.relu(nn.bias_add(nn.conv2d_nchw(x, w, 1, 1), b, axis=1))])


def _conv_nhwc():
    x, w = te.placeholder((1, 10, 10, 8), name="x"), te.placeholder((12, 3, 3, 8), name="w")
    return te.ComputeDAG([conv2d_nhwc(x, w, ((2, 2), (1, 1, 1, 1), (1, 1)))])


def _depthwise():
    x, w = te.placeholder((1, 8, 12, 12), name="x"), te.placeholder((8, 1, 3, 3), name="w")
    return te.ComputeDAG([nn.depthwise_conv2d_nchw(x, w, 2, 1)])


def _winograd():
    data = te.placeholder((1, 4, 8, 8), name="data")
    u = te.placeholder((4, 4, 4, 8), name="u", tag=LAYOUT_FREE)
    return te.ComputeDAG([winograd.conv2d_winograd(data, u, 2)])


def _softmax():
    return te.ComputeDAG([nn.softmax(te.placeholder((6, 37), name="x"))])


def _layer_norm():
    x, g, b = (
        te.placeholder((5, 24), name="x"),
        te.placeholder((24,), name="g"),
        te.placeholder((24,), name="b"),
    )
    return te.ComputeDAG([nn.layer_norm(x, g, b)])


def _pool():
    return te.ComputeDAG([nn.pool2d_nchw(te.placeholder((1, 4, 9, 9), name="x"), "max", 3, 2, 1)])


def _sum():
    return te.ComputeDAG([nn.reduce(te.placeholder((4, 11, 6), name="x"), "sum", [0, 2])])


def _long_softmax():
    return te.ComputeDAG([nn.softmax(te.placeholder((3, 300), name="x"))])


def _long_layer_norm():
    x, g, b = (
        te.placeholder((4, 96), name="x"),
        te.placeholder((96,), name="g"),
        te.placeholder((96,), name="b"),
    )
    return te.ComputeDAG([nn.layer_norm(x, g, b)])


def _dense_batch1():
    x, w = te.placeholder((1, 300), name="x"), te.placeholder((16, 300), name="w")
    return te.ComputeDAG([nn.dense(x, w)])


WORKLOADS = {
    "matmul": _matmul,
    "dense_bias_relu": _dense_bias_relu,
    "conv_nchw": _conv_nchw,
    "conv_nhwc": _conv_nhwc,
    "depthwise": _depthwise,
    "winograd": _winograd,
    "softmax": _softmax,
    "layer_norm": _layer_norm,
    "pool": _pool,
    "sum": _sum,
    # long reductions: cross-thread reduction sketches
    "long_softmax": _long_softmax,
    "long_layer_norm": _long_layer_norm,
    "dense_batch1": _dense_batch1,
}


def sampled_states(dag, target, n: int, seed: int) -> list:
    """The untuned schedule, then up to `n` sampled programs each followed by one of its mutations."""
    ctx = SearchContext(dag, target)
    sketches = generate_sketches(dag, target)
    rng = random.Random(seed)
    states = [untuned_schedule(dag, target)]
    for _ in range(40 * n):
        if len(states) > 2 * n:
            break
        state = sample_state(ctx, sketches[rng.randrange(len(sketches))], rng)
        if state is None or lowered(state) is None:
            continue
        states.append(state)
        child = mutate(state, rng, ctx)
        if child is not None and lowered(child) is not None:
            states.append(child)
    return states


def _inputs(dag) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(16)
    return {p.name: rng.uniform(-1, 1, p.shape).astype(p.dtype) for p in dag.placeholders}


def _check_on_opencl(name: str, n: int, seed: int) -> None:
    dag = WORKLOADS[name]()
    states = sampled_states(dag, OPENCL, n, seed)
    assert len(states) > n, f"{name}: only {len(states) - 1} programs sampled"
    modules = [emit_gpu(lower(s, f"{name}_{i}"), OPENCL) for i, s in enumerate(states)]
    program = build_opencl(modules, _DEVICE)
    inputs = _inputs(dag)
    refs = evaluate(dag, inputs, float_dtype="float64")
    for state, module in zip(states, modules):
        outs = run_opencl(module, [inputs[p.name] for p in dag.placeholders], program=program)
        for out, ref in zip(outs, refs):
            scale = float(np.max(np.abs(ref))) or 1.0
            np.testing.assert_allclose(out, ref, rtol=RTOL, atol=RTOL * scale, err_msg=str(state))


@needs_opencl
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_sampled_gpu_programs_match_numpy_on_opencl(name):
    _check_on_opencl(name, n=2, seed=0)


@pytest.mark.slow
@needs_opencl
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_sampled_gpu_programs_sweep(name, seed):
    _check_on_opencl(name, n=12, seed=100 + seed)


@needs_cuda_compiler
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_sampled_programs_compile_as_cuda(arch):
    """Every workload's sampled programs for a CUDA target, in one source, compile for the arch."""
    target = parse_target(f"cuda -arch={arch}")
    modules = []
    for name, make in WORKLOADS.items():
        dag = make()
        for i, s in enumerate(sampled_states(dag, target, 2, seed=1)):
            modules.append(emit_gpu(lower(s, f"{name}_{i}"), target))
    cubin = compile_cuda(gpu_source(modules, "cuda"), arch)
    assert cubin[:4] == b"\x7fELF"
    for m in modules:
        for k in m.kernels:
            assert k.name.encode() in cubin


def test_matmul_sketch_follows_ansor_gpu_rules():
    """Shared-memory caches of both operands at the outermost reduce tile, a local accumulator computed
    at the output's thread level, SSSRRSRS tiles."""
    (sketch,) = generate_sketches(_matmul(), CUDA)
    names = [st.name for st in sketch.stages]
    assert names == ["A", "A.shared", "B", "B.shared", "matmul.local", "matmul"]
    by_name = {st.name: st for st in sketch.stages}
    local = by_name["matmul.local"]
    assert [it.name for it in local.iters][:8] == [
        "ax0.0", "ax1.0", "ax0.1", "ax1.1", "ax0.2", "ax1.2", "k.0", "k.1",
    ]  # fmt: skip
    for shared in ("A.shared", "B.shared"):
        st = by_name[shared]
        assert st.compute_at == ComputeAtKind.ITER
        assert local.iters[local.position(st.attach[1])].name == "k.0"


def test_cuda_samples_respect_the_hardware_limits():
    """Sampled programs (before any mutation, which may shrink a block below a warp)."""
    hw = CUDA.hw
    dag = _conv_nchw()
    ctx, rng = SearchContext(dag, CUDA), random.Random(3)
    (sketch,) = generate_sketches(dag, CUDA)
    samples = (sample_state(ctx, sketch, rng) for _ in range(16))
    states = [s for s in samples if s is not None and lowered(s) is not None]
    assert len(states) >= 6
    for state in states:
        module = emit_gpu(lower(state, "k"), CUDA)
        for k in module.kernels:
            assert k.launch.threads_per_block <= hw.max_threads_per_block
            assert k.launch.shared_bytes <= hw.max_shared_memory_per_block
        root = state.stages[-1]
        bound = {it.annotation: it.extent for it in root.iters if it.annotation != Annotation.NONE}
        assert bound[Annotation.VTHREAD] <= hw.max_vthread_extent
        assert bound[Annotation.THREAD_X] >= hw.warp_size


def test_untiled_gpu_schedule_inlines_and_binds_every_root_stage():
    """The fallback of the untuned schedule (tests/test_gpu_default.py covers the tiled one)."""
    dag = _conv_nchw()
    s = untiled_gpu_schedule(dag, CUDA)
    roots = [st for st in s.stages if not st.is_placeholder and st.compute_at == ComputeAtKind.ROOT]
    assert [st.name for st in roots] == ["conv2d", "relu"]
    for st in roots:
        assert [it.annotation for it in st.iters[:2]] == [Annotation.BLOCK_X, Annotation.THREAD_X]


@pytest.mark.parametrize("name", ["long_softmax", "long_layer_norm", "dense_batch1"])
def test_long_reductions_get_cross_thread_sketches(name):
    """A reduction longer than a warp (or a tiled op with less spatial work than a block) gets a sketch
    whose reduce loop is split by a warp and bound to threadIdx.x, besides the others."""
    sketches = generate_sketches(WORKLOADS[name](), CUDA)
    bound = [
        s
        for s in sketches
        if any(
            it.annotation == Annotation.THREAD_X and it.kind == IterKind.REDUCE
            for st in s.stages
            for it in st.iters
        )
    ]
    assert bound and len(bound) < len(sketches)


def test_untuned_gpu_schedule_reduces_long_rows_across_threads():
    """Softmax over 300 columns of 3 rows: its max and sum stages give each row a block whose 32 threads
    reduce it together; the element-wise normalization keeps one thread per point."""
    s = untuned_schedule(_long_softmax(), CUDA)
    by_name = {st.name: st for st in s.stages}
    for name in ("softmax_maxelem", "softmax_expsum"):
        bound = {it.annotation: it for it in by_name[name].iters if it.annotation != Annotation.NONE}
        assert bound[Annotation.THREAD_X].kind == IterKind.REDUCE and bound[Annotation.THREAD_X].extent == 32
        assert bound[Annotation.BLOCK_X].extent == 3
    assert all(it.kind == IterKind.SPATIAL for it in by_name["softmax_norm"].iters)
