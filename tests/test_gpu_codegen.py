"""GPU slice of issue 16: hand-written GPU schedules lowered to thread-binding loops, emitted as one
kernel source, run through OpenCL on the CPU (PoCL) against numpy, and compiled by nvcc for sm_80/sm_90.

No test touches the CUDA driver: without a GPU it fails or hangs. Tests skip, naming what is missing,
where no OpenCL platform or no nvcc is found.
"""

from __future__ import annotations

import numpy as np
import pytest

from aotc import te
from aotc.codegen.gpu import (
    GPUCodegenError,
    compile_cuda,
    emit_gpu,
    nvcc_path,
    opencl_device,
    run_opencl,
)
from aotc.ir.printer import func_str
from aotc.ir.stmt import Allocate, Barrier, For, ForKind, walk_stmts
from aotc.schedule.lower import lower
from aotc.schedule.state import Annotation, State
from aotc.target import parse_target
from aotc.te.reference import evaluate
from aotc.topi import nn

# float32 kernels against a float64 reference: sums of up to 37 terms and exp/division
RTOL = 1e-5

_DEVICE = opencl_device()
needs_opencl = pytest.mark.skipif(
    _DEVICE is None, reason="no OpenCL platform (pip install pyopencl; apt-get install pocl-opencl-icd)"
)
needs_nvcc = pytest.mark.skipif(
    nvcc_path() is None, reason="nvcc is not on PATH (CUDA toolkit not installed)"
)


def _bind_spatial(state: State, stage: str, n_spatial: int, threads: int) -> State:
    """Fuse a root stage's first `n_spatial` iterators, split by `threads`, bind to blockIdx.x/threadIdx.x."""
    if n_spatial > 1:
        state = state.fuse(stage, list(range(n_spatial)))
    state = state.split(stage, 0, [threads])
    return state.bind(stage, 0, Annotation.BLOCK_X).bind(stage, 1, Annotation.THREAD_X)


def matmul_schedule():
    """Ansor's GPU matmul structure: 16x16 outputs per block of 64 threads (2x2 each), accumulated in a
    local buffer, over A and B tiles in shared memory that the block's threads fetch together."""
    a = te.placeholder((64, 32), name="A")
    b = te.placeholder((32, 48), name="B")
    dag = te.ComputeDAG([nn.matmul(a, b)])
    c, local = "matmul", "matmul.local"
    s = State.initial(dag).cache_write(c, "local")
    s = s.split(c, 0, [8, 2]).split(c, 3, [8, 2])
    s = s.reorder(c, [0, 3, 1, 4, 2, 5]).fuse(c, [0, 1]).fuse(c, [1, 2])
    s = s.bind(c, 0, Annotation.BLOCK_X).bind(c, 1, Annotation.THREAD_X)
    s = s.compute_at(local, c, 1)
    s = s.split(local, 2, [8]).reorder(local, [2, 3, 0, 1])  # k.0, k.1, i, j
    s = s.cache_read("A", "shared", [local]).cache_read("B", "shared", [local])
    for shared in ("A.shared", "B.shared"):
        s = s.compute_at(shared, local, 0)
        s = s.fuse(shared, [0, 1]).split(shared, 0, [64]).bind(shared, 1, Annotation.THREAD_X)
    return dag, s


def matmul_2d_vthread_schedule():
    """A 2-D grid of 8x8-thread blocks, each row of threads on two rows of outputs through a vthread."""
    a = te.placeholder((64, 32), name="A")
    b = te.placeholder((32, 48), name="B")
    dag = te.ComputeDAG([nn.matmul(a, b)])
    c, local = "matmul", "matmul.local"
    s = State.initial(dag).cache_write(c, "local")
    s = s.split(c, 0, [2, 8]).split(c, 3, [8]).reorder(c, [0, 3, 1, 2, 4])  # i.0 j.0 i.1 i.2 j.1
    bindings = (
        Annotation.BLOCK_X,
        Annotation.BLOCK_Y,
        Annotation.VTHREAD,
        Annotation.THREAD_Y,
        Annotation.THREAD_X,
    )
    for i, binding in enumerate(bindings):
        s = s.bind(c, i, binding)
    s = s.compute_at(local, c, 4).split(local, 2, [8]).reorder(local, [2, 3, 0, 1])
    s = s.cache_read("A", "shared", [local]).cache_read("B", "shared", [local])
    for shared in ("A.shared", "B.shared"):
        s = s.compute_at(shared, local, 0)
        s = s.fuse(shared, [0, 1]).split(shared, 0, [8]).bind(shared, 1, Annotation.THREAD_X)
    return dag, s


def bias_relu_schedule():
    """Elementwise with a broadcast operand; 30*48 is no multiple of 64, so the last block is guarded."""
    x = te.placeholder((30, 48), name="x")
    b = te.placeholder((48,), name="b")
    dag = te.ComputeDAG([nn.relu(nn.bias_add(x, b))])
    s = State.initial(dag).compute_inline("bias_add")
    return dag, _bind_spatial(s, "relu", 2, 64)


def softmax_schedule():
    """Four root stages (max, exp, sum, normalize): four kernels and a device workspace between them."""
    x = te.placeholder((5, 37), name="x")
    dag = te.ComputeDAG([nn.softmax(x)])
    s = State.initial(dag)
    for stage, n_spatial in (("softmax_maxelem", 1), ("softmax_exp", 2), ("softmax_expsum", 1)):
        s = _bind_spatial(s, stage, n_spatial, 4)
    return dag, _bind_spatial(s, "softmax_norm", 2, 32)


def sum_schedule():
    """A sum over two of three axes, one thread per output element, the reduction serial in it."""
    x = te.placeholder((4, 11, 6), name="x")
    dag = te.ComputeDAG([nn.reduce(x, "sum", [0, 2])])
    return dag, _bind_spatial(State.initial(dag), "reduce", 1, 8)


SCHEDULES = {
    "matmul": matmul_schedule,
    "matmul_2d_vthread": matmul_2d_vthread_schedule,
    "bias_relu": bias_relu_schedule,
    "softmax": softmax_schedule,
    "sum": sum_schedule,
}


def test_lowering_binds_threads_and_fences_shared_memory():
    dag, state = matmul_schedule()
    func = lower(state, "mm")
    stmts = list(walk_stmts(func.body))
    tags = {s.thread_tag for s in stmts if isinstance(s, For) and s.kind == ForKind.THREAD_BINDING}
    scopes = {s.buffer.name: s.buffer.scope for s in stmts if isinstance(s, Allocate)}
    assert tags == {"blockIdx.x", "threadIdx.x"}
    assert scopes == {"matmul.local": "local", "A.shared": "shared", "B.shared": "shared"}
    # per k.0 iteration: one barrier before both tiles are written and one before they are read
    assert sum(isinstance(s, Barrier) for s in stmts) == 2, func_str(func)
    # a shared tile covers what all 64 threads read: 16 rows of A and 16 columns of B per block
    shapes = {s.buffer.name: s.buffer.shape for s in stmts if isinstance(s, Allocate)}
    assert (shapes["A.shared"], shapes["B.shared"], shapes["matmul.local"]) == ((16, 8), (8, 16), (2, 2))
    module = emit_gpu(func, parse_target("cuda -arch=sm_90"))
    (kernel,) = module.kernels
    assert (kernel.launch.grid, kernel.launch.block, kernel.launch.shared_bytes) == (
        (12, 1, 1),
        (64, 1, 1),
        1024,
    )
    assert module.cuda_source.count("__syncthreads();") == 2
    assert "__shared__ float A_shared[128];" in module.body


def test_root_stages_become_kernels_with_a_workspace():
    dag, state = softmax_schedule()
    module = emit_gpu(lower(state, "softmax"))
    assert [k.name for k in module.kernels] == [f"softmax_k{i}" for i in range(4)]
    assert [b.name for b in module.workspace] == ["softmax_maxelem", "softmax_exp", "softmax_expsum"]
    assert [k.launch.grid for k in module.kernels] == [(2, 1, 1), (47, 1, 1), (2, 1, 1), (6, 1, 1)]
    assert module.kernels[-1].launch.block == (32, 1, 1)


def test_two_dimensional_launch_with_a_vthread():
    dag, state = matmul_2d_vthread_schedule()
    (kernel,) = emit_gpu(lower(state, "mm")).kernels
    assert (kernel.launch.grid, kernel.launch.block, kernel.launch.shared_bytes) == (
        (4, 6, 1),
        (8, 8, 1),
        512,
    )


@needs_opencl
@pytest.mark.parametrize("workload", sorted(SCHEDULES))
def test_kernel_runs_on_opencl_and_matches_numpy(workload):
    dag, state = SCHEDULES[workload]()
    func = lower(state, workload)
    module = emit_gpu(func, parse_target("opencl"))
    rng = np.random.default_rng(16)
    inputs = {p.name: rng.uniform(-1, 1, p.shape).astype(p.dtype) for p in dag.placeholders}
    outs = run_opencl(module, [inputs[p.name] for p in dag.placeholders], _DEVICE)
    refs = evaluate(dag, inputs, float_dtype="float64")
    for out, ref in zip(outs, refs):
        scale = float(np.max(np.abs(ref))) or 1.0
        np.testing.assert_allclose(out, ref, rtol=RTOL, atol=RTOL * scale, err_msg=module.opencl_source)


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("workload", sorted(SCHEDULES))
def test_kernel_compiles_with_nvcc(workload, arch):
    dag, state = SCHEDULES[workload]()
    module = emit_gpu(lower(state, workload), parse_target(f"cuda -arch={arch}"))
    cubin = compile_cuda(module.cuda_source, arch)
    assert cubin[:4] == b"\x7fELF"
    for k in module.kernels:
        assert k.name.encode() in cubin


@needs_nvcc
def test_ptx_for_newer_gpus():
    dag, state = matmul_schedule()
    ptx = compile_cuda(emit_gpu(lower(state, "mm")).cuda_source, "sm_90", output="ptx").decode()
    assert ".target sm_90" in ptx and "bar.sync" in ptx and ".shared" in ptx


def test_reduction_across_threads_is_refused():
    """Threads updating one element through a loop that mixes spatial and reduce axes: no cross-thread
    reduction lowers that (a reduce loop of its own bound to threadIdx does, tests/test_gpu_reduction.py)."""
    x = te.placeholder((4, 64), name="x")
    dag = te.ComputeDAG([nn.reduce(x, "sum", [1])])
    state = State.initial(dag).fuse("reduce", [0, 1]).split("reduce", 0, [64])
    state = state.bind("reduce", 0, Annotation.BLOCK_X).bind("reduce", 1, Annotation.THREAD_X)
    with pytest.raises(GPUCodegenError, match="threads along threadIdx.x update the same elements"):
        emit_gpu(lower(state, "r"))


def test_barrier_that_some_threads_skip_is_refused():
    # 60 rows in 16-row tiles: the last block's threads past row 60 would skip the barrier
    a = te.placeholder((60, 8), name="A")
    b = te.placeholder((8, 16), name="B")
    dag = te.ComputeDAG([nn.matmul(a, b)])
    s = State.initial(dag).split("matmul", 0, [16]).bind("matmul", 0, Annotation.BLOCK_X)
    s = s.bind("matmul", 1, Annotation.THREAD_X).cache_read("B", "shared", ["matmul"])
    s = s.compute_at("B.shared", "matmul", 1)
    s = s.fuse("B.shared", [0, 1]).split("B.shared", 0, [16]).bind("B.shared", 1, Annotation.THREAD_X)
    with pytest.raises(GPUCodegenError, match="barrier under"):
        emit_gpu(lower(s, "mm"))


def test_launch_past_the_targets_limits_is_refused():
    x = te.placeholder((4, 512), name="x")
    dag = te.ComputeDAG([nn.relu(x)])
    state = _bind_spatial(State.initial(dag), "relu", 2, 512)
    func = lower(state, "relu")
    assert emit_gpu(func, parse_target("cuda -arch=sm_80")).kernels[0].launch.block == (512, 1, 1)
    with pytest.raises(GPUCodegenError, match="512 threads per block, more than opencl's 256"):
        emit_gpu(func, parse_target("opencl"))


def test_index_bound_twice_around_per_thread_work_is_refused():
    x = te.placeholder((8, 16), name="x")
    b = te.placeholder((16,), name="b")
    dag = te.ComputeDAG([nn.relu(nn.bias_add(x, b))])
    s = State.initial(dag).split("relu", 1, [4]).bind("relu", 0, Annotation.BLOCK_X)
    s = s.bind("relu", 1, Annotation.THREAD_X).compute_at("bias_add", "relu", 1)
    s = s.bind("bias_add", 1, Annotation.BLOCK_X)  # its 4 columns per thread, bound to blocks again
    with pytest.raises(GPUCodegenError, match="blockIdx.x is bound inside a loop bound to it"):
        emit_gpu(lower(s, "k"))


def test_opencl_records_are_keyed_apart_from_cpu_records():
    from aotc.hub.store import TargetKey

    key = TargetKey.of(parse_target("opencl"))
    assert key.kind == "opencl"
    assert key.difference(TargetKey.of(parse_target("llvm -mcpu=generic"))) == (
        "record for a opencl target, this target is llvm"
    )


def _float_divmod_dag(dtype: str):
    a, b = te.placeholder((64,), name="a", dtype=dtype), te.placeholder((64,), name="b", dtype=dtype)
    mod = te.compute((64,), lambda i: a[i] % b[i], "mod")
    div = te.compute((64,), lambda i: a[i] // b[i], "div")
    return te.ComputeDAG([mod, div])


def _bound(dag):
    state = State.initial(dag)
    for name in ("mod", "div"):
        state = (
            state.split(name, 0, [32]).bind(name, 0, Annotation.BLOCK_X).bind(name, 1, Annotation.THREAD_X)
        )
    return state


@needs_opencl
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_float_floor_modulo_and_division_match_numpy_bit_for_bit(dtype):
    """np.remainder and np.floor_divide, as the CPU code computes them: signs, signed zeros, a zero
    divisor (NaN, inf) and infinities included (before, a - floor(a / b) * b missed all of these)."""
    dag = _float_divmod_dag(dtype)
    module = emit_gpu(lower(_bound(dag), "divmod"), parse_target("opencl"))
    rng = np.random.default_rng(3)
    special = [0.0, -0.0, 1.0, -1.0, 2.5, -2.5, np.inf, -np.inf, 7.0, -7.0, 1e-30, 3.0]
    a = np.concatenate([special, rng.uniform(-100, 100, 64 - len(special))]).astype(dtype)
    b = np.concatenate([[3.0, -3.0, 0.0, -0.0, 2.0, -2.0, 3.0, -3.0, np.inf, -np.inf, 3.0, 1e-30]])
    b = np.concatenate([b, rng.uniform(-10, 10, 64 - len(b))]).astype(dtype)
    mod, div = run_opencl(module, [a, b], _DEVICE)
    with np.errstate(all="ignore"):
        want_mod, want_div = np.remainder(a, b), np.floor_divide(a, b)
    for got, want in ((mod, want_mod), (div, want_div)):
        np.testing.assert_array_equal(got, want, err_msg=module.opencl_source)
        number = ~np.isnan(want)  # a NaN's sign bit is not specified
        np.testing.assert_array_equal(np.signbit(got[number]), np.signbit(want[number]))


@needs_nvcc
def test_float_floor_modulo_compiles_as_cuda():
    for dtype in ("float32", "float64"):
        module = emit_gpu(
            lower(_bound(_float_divmod_dag(dtype)), f"divmod_{dtype}"), parse_target("cuda -arch=sm_90")
        )
        assert compile_cuda(module.cuda_source, "sm_90")[:4] == b"\x7fELF"
