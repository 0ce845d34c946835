"""The untuned GPU schedule of stages with data reuse (aotc/schedule/gpu_tiling.py): Ansor's GPU sketch with
tile sizes from a heuristic. Its programs match float64 numpy on PoCL, stage their inputs in shared memory,
give each thread several outputs, keep within the limits of CUDA (sm_80, sm_90) and OpenCL, compile as
CUDA, and are the search's own sketch with its lengths filled. No test touches the CUDA driver.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from aotc import te
from aotc.codegen.gpu import build_opencl, compile_cuda, emit_gpu, gpu_source, opencl_device, run_opencl
from aotc.schedule import gpu_tiling
from aotc.schedule.default_gpu import untiled_gpu_schedule
from aotc.schedule.gpu_tiling import tiled_gpu_schedule, tiles_for, wants_tiles
from aotc.schedule.lower import lower
from aotc.schedule.state import Annotation, ComputeAtKind
from aotc.search.sketch import generate_sketches, sketch_signature
from aotc.search.untuned import untuned_schedule
from aotc.target import parse_target
from aotc.te.reference import evaluate
from aotc.topi import nn
from aotc.topi.nhwc import conv2d_nhwc

try:
    from aotc.codegen.cuda_compiler import cuda_compiler_name
except ImportError:  # the NVRTC route is optional; nvcc alone serves
    from aotc.codegen.gpu import nvcc_path as cuda_compiler_name

RTOL = 2e-5
OPENCL = parse_target("opencl")
TARGETS = [parse_target("cuda -arch=sm_80"), parse_target("cuda -arch=sm_90"), OPENCL]

_DEVICE = opencl_device()
needs_opencl = pytest.mark.skipif(
    _DEVICE is None, reason="no OpenCL platform (pip install pyopencl; apt-get install pocl-opencl-icd)"
)
needs_cuda_compiler = pytest.mark.skipif(
    cuda_compiler_name() is None, reason="neither NVRTC (pip install aotc[cuda]) nor nvcc is available"
)


def _matmul(m=128, n=96, k=64):
    return te.ComputeDAG([nn.matmul(te.placeholder((m, k), name="A"), te.placeholder((k, n), name="B"))])


def _dense_bias_relu(m=64, n=96, k=48):
    x, w, b = (
        te.placeholder((m, k), name="x"),
        te.placeholder((n, k), name="w"),
        te.placeholder((n,), name="b"),
    )
    return te.ComputeDAG([nn.relu(nn.bias_add(nn.dense(x, w), b))])


def _conv_nchw(n=1, c=16, hw=16, co=32):
    x, w = te.placeholder((n, c, hw, hw), name="x"), te.placeholder((co, c, 3, 3), name="w")
    b = te.placeholder((co,), name="b")
    return te.ComputeDAG([nn.relu(nn.bias_add(nn.conv2d_nchw(x, w, 1, 1), b, axis=1))])


def _conv_nhwc(n=1, c=16, hw=16, co=32):
    x, w = te.placeholder((n, hw, hw, c), name="x"), te.placeholder((co, 3, 3, c), name="w")
    return te.ComputeDAG([conv2d_nhwc(x, w, ((1, 1), (1, 1, 1, 1), (1, 1)))])


WORKLOADS = {
    "matmul": _matmul,
    "dense_bias_relu": _dense_bias_relu,
    "conv_nchw": _conv_nchw,
    "conv_nhwc": _conv_nhwc,
}


def _anchor(dag):
    return next(op for op in dag.compute_ops if op.reduce_axes)


def _kernels(dag, target, name="k"):
    return emit_gpu(lower(untuned_schedule(dag, target), name), target)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_tiled_default_is_the_gpu_sketch_with_lengths(name):
    """The untuned state replays the search's GPU sketch step for step (lengths filled), then binds
    threads and unrolls as the init rules do; it stages inputs in shared memory and accumulates a
    register tile of several outputs per thread, fused into its element-wise consumer or a `.local` copy."""
    dag = WORKLOADS[name]()
    target = OPENCL
    state = untuned_schedule(dag, target)
    (sketch,) = generate_sketches(dag, target)
    assert sketch_signature(state)[: len(sketch.steps)] == sketch_signature(sketch)
    names = [st.name for st in state.stages]
    assert names == [st.name for st in sketch.stages]
    assert sum(n.endswith(".shared") for n in names) == 2
    tiles = tiles_for(dag, _anchor(dag), target)[0]
    assert tiles.registers > 1 and tiles.threads >= 32  # these small shapes on CUDA: 1 (more blocks)
    root = state.stages[-1]
    bound = [it.annotation for it in root.iters[:3]]
    assert bound == [Annotation.BLOCK_X, Annotation.VTHREAD, Annotation.THREAD_X]
    assert root.iters[2].extent == tiles.threads
    tiled = next(st for st in state.stages if st.auto_unroll_max_step)
    assert tiled.compute_at == ComputeAtKind.ITER


@pytest.mark.parametrize("target", TARGETS, ids=str)
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_tiled_default_respects_the_target_limits(name, target):
    dag = WORKLOADS[name]()
    hw = target.hw
    module = _kernels(dag, target)
    (kernel,) = module.kernels
    assert kernel.launch.shared_bytes > 0
    assert kernel.launch.threads_per_block <= hw.max_threads_per_block
    assert kernel.launch.shared_bytes <= hw.max_shared_memory_per_block
    tiles = tiles_for(dag, _anchor(dag), target)[0]
    assert tiles.shared_bytes == kernel.launch.shared_bytes  # the estimate is the staged regions


@needs_opencl
def test_tiled_defaults_match_numpy_on_opencl():
    dags = {name: make() for name, make in WORKLOADS.items()}
    modules = [_kernels(dag, OPENCL, name) for name, dag in dags.items()]
    program = build_opencl(modules, _DEVICE)
    rng = np.random.default_rng(7)
    for (name, dag), module in zip(dags.items(), modules):
        inputs = {p.name: rng.uniform(-1, 1, p.shape).astype(p.dtype) for p in dag.placeholders}
        (ref,) = evaluate(dag, inputs, float_dtype="float64")
        (out,) = run_opencl(module, [inputs[p.name] for p in dag.placeholders], program=program)
        np.testing.assert_allclose(out, ref, rtol=RTOL, atol=RTOL * float(np.max(np.abs(ref))), err_msg=name)


@needs_cuda_compiler
def test_tiled_defaults_compile_as_cuda():
    target = TARGETS[1]
    modules = [_kernels(make(), target, name) for name, make in WORKLOADS.items()]
    cubin = compile_cuda(gpu_source(modules, "cuda"), "sm_90")
    assert cubin[:4] == b"\x7fELF"


def test_heuristic_tiles_of_a_large_gemm_and_resnet_conv():
    """GEMM 4096^3 on sm_90: 64x64 blocks of 128 threads, 32 outputs each, k tiles of 16 in 8 KiB of
    shared memory (the fastest of the heuristic's choices timed on an H200, 3.69 ms). ResNet-18's 3x3 conv at 56x56x64: input channels staged 4 at a time with the window;
    at batch 16 64-channel x 8x8 blocks (or so) of 256 threads; at batch 1 smaller blocks, about one per SM
    of the 132."""
    cuda = TARGETS[1]
    gemm = _matmul(4096, 4096, 4096)
    t = tiles_for(gemm, _anchor(gemm), cuda)[0]
    assert (t.block_tile, t.threads, t.registers, t.reduce, t.shared_bytes) == (
        (64, 64),
        128,
        32,
        ((16, 1),),
        8192,
    )
    for batch, least_blocks in ((1, cuda.hw.num_cores // 2), (16, 4 * cuda.hw.num_cores)):
        conv = _conv_nchw(batch, 64, 56, 64)
        t = tiles_for(conv, _anchor(conv), cuda)[0]
        assert t.reduce == ((4, 1), (3, 1), (3, 1))
        assert 64 <= t.threads <= 256 and t.threads % 32 == 0 and 8 <= t.registers <= 64
        assert t.blocks >= least_blocks


@pytest.mark.parametrize("target", TARGETS, ids=str)
def test_small_shapes_get_small_valid_tiles(target):
    """A batch-1 dense layer (1x768 by 768x3072) and a conv with 7x7 outputs: fewer threads and smaller
    tiles, still valid; a batch-1 dense layer with the longer reduction (3072 -> 768) reduces each output
    across a warp instead."""
    dense = _dense_bias_relu(1, 3072, 768)
    conv = _conv_nchw(1, 512, 7, 512)
    for dag in (dense, conv):
        state = untuned_schedule(dag, target)
        assert any(st.name.endswith(".shared") for st in state.stages)
        (kernel,) = emit_gpu(lower(state, "k"), target).kernels
        assert kernel.launch.threads_per_block <= target.hw.max_threads_per_block
    gemv = _dense_bias_relu(1, 768, 3072)
    assert not wants_tiles(gemv, _anchor(gemv), target)
    state = untuned_schedule(gemv, target)
    assert not any(st.name.endswith(".shared") for st in state.stages)


def test_stages_without_reuse_keep_the_untiled_schedule():
    x = te.placeholder((4, 8, 9, 9), name="x")
    for dag in (te.ComputeDAG([nn.relu(x)]), te.ComputeDAG([nn.pool2d_nchw(x, "max", 3, 2, 1)])):
        assert tiled_gpu_schedule(dag, TARGETS[1]) is None
        assert untuned_schedule(dag, TARGETS[1]).steps == untiled_gpu_schedule(dag, TARGETS[1]).steps


def test_a_tiling_the_codegen_rejects_falls_back(monkeypatch):
    """Tiles chosen for 48 KiB of shared memory on a target with 256 bytes: the codegen refuses every
    candidate's program, and the untiled schedule is what the build gets."""
    dag = _matmul()
    cuda = TARGETS[1]
    small = dataclasses.replace(cuda, hw=dataclasses.replace(cuda.hw, max_shared_memory_per_block=256))
    big = tiles_for(dag, _anchor(dag), cuda)
    assert all(t.shared_bytes > 256 for t in big)
    monkeypatch.setattr(gpu_tiling, "tiles_for", lambda dag, op, target, prefs: big)
    state = untuned_schedule(dag, small)
    assert state.steps == untiled_gpu_schedule(dag, small).steps
