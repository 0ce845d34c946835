"""Cross-thread reductions on GPU (issue 16): a reduce iterator bound to threadIdx lowers to a block-wide
all-reduce (per-thread partials in registers, a shared-memory tree, barriers every thread reaches).

The states are built by hand as Ansor's CrossThreadReduction sketch makes them: reduce iterators fused,
split by a warp (or 64, 128, a non-divisor), the inner part bound to threadIdx.x, the spatial ones fused
and bound to blockIdx.x; or computed inside their consumer's blockIdx loop, so several stages share one
kernel. They run on PoCL against the float64 reference and compile as CUDA for sm_90.
"""

from __future__ import annotations

import numpy as np
import pytest

from aotc import te
from aotc.codegen.gpu import (
    GPUCodegenError,
    build_opencl,
    compile_cuda,
    cuda_compiler_name,
    emit_gpu,
    gpu_source,
    opencl_device,
    run_opencl,
)
from aotc.ir.expr import free_vars
from aotc.ir.printer import func_str
from aotc.ir.stmt import Barrier, For, ForKind, IfThenElse, Stmt, stmt_children
from aotc.schedule.lower import lower
from aotc.schedule.state import Annotation, IterKind, ScheduleError, State
from aotc.search.features import extract_features
from aotc.target import parse_target
from aotc.te.reference import evaluate
from aotc.topi import nn

RTOL = 2e-5
_DEVICE = opencl_device()
_OPENCL = parse_target("opencl")


def cross_thread(s: State, stage: str, threads: int, spatial_block: bool = True) -> State:
    """Ansor's CrossThreadReduction on a stage: fuse its reduce iterators, split by `threads`, bind the
    inner part to threadIdx.x; then (for a root stage) its fused spatial iterators to blockIdx.x."""
    iters = s.stages[s.stage_id(stage)].iters
    spatial = [i for i, it in enumerate(iters) if it.kind == IterKind.SPATIAL]
    red = [i for i, it in enumerate(iters) if it.kind == IterKind.REDUCE]
    if len(red) > 1:
        s = s.fuse(stage, red)
    s = s.split(stage, red[0], [threads]).bind(stage, red[0] + 1, Annotation.THREAD_X)
    if spatial_block and spatial:
        if len(spatial) > 1:
            s = s.fuse(stage, spatial)
        s = s.bind(stage, 0, Annotation.BLOCK_X)
    return s


def one_thread_per_point(s: State, stage: str, threads: int) -> State:
    n = sum(it.kind == IterKind.SPATIAL for it in s.stages[s.stage_id(stage)].iters)
    if n > 1:
        s = s.fuse(stage, list(range(n)))
    s = s.split(stage, 0, [threads])
    return s.bind(stage, 0, Annotation.BLOCK_X).bind(stage, 1, Annotation.THREAD_X)


def fused_into_rows(s: State, consumer: str, reductions: list[str], threads: int, red_threads: int) -> State:
    """The consumer's first axis to blockIdx.x, the rest fused and split by `threads` (inner to
    threadIdx.x); each reduction computed at the consumer's blockIdx loop, reducing across threads."""
    n = len(s.stages[s.stage_id(consumer)].iters)
    if n > 2:
        s = s.fuse(consumer, list(range(1, n)))
    s = s.split(consumer, 1, [threads])
    s = s.bind(consumer, 0, Annotation.BLOCK_X).bind(consumer, 2, Annotation.THREAD_X)
    for r in reductions:
        s = cross_thread(s, r, red_threads, spatial_block=False).compute_at(r, consumer, 0)
    return s


def sum_one_axis(threads: int):
    x = te.placeholder((6, 300), name="x")
    dag = te.ComputeDAG([nn.reduce(x, "sum", [1])])
    return dag, cross_thread(State.initial(dag), "reduce", threads)


def sum_two_axes():
    """Two of three axes (11 * 6 = 66 points, fused) by 32 threads: 3 rounds, the last one short."""
    x = te.placeholder((11, 5, 6), name="x")
    dag = te.ComputeDAG([nn.reduce(x, "sum", [0, 2])])
    return dag, cross_thread(State.initial(dag), "reduce", 32)


def sum_to_scalar():
    """No spatial axis: one block of 64 threads."""
    x = te.placeholder((9, 23), name="x")
    dag = te.ComputeDAG([nn.reduce(x, "sum", [0, 1])])
    return dag, cross_thread(State.initial(dag), "reduce", 64)


def min_37_threads():
    """37 elements split by 64: 37 threads, not a power of two (the tree folds 5 slots first)."""
    x = te.placeholder((3, 37), name="x")
    dag = te.ComputeDAG([nn.reduce(x, "min", [1])])
    return dag, cross_thread(State.initial(dag), "reduce", 64)


def prod_37_threads():
    """A product (ReduceProd's combiner): threads past the 37 elements contribute its identity, 1."""
    x = te.placeholder((3, 37), name="x")
    dag = te.ComputeDAG([nn.reduce(x, "prod", [1])])
    return dag, cross_thread(State.initial(dag), "reduce", 64)


def softmax_maxelem():
    x = te.placeholder((5, 37), name="x")
    dag = te.ComputeDAG([nn.softmax(x)])
    s = State.initial(dag)
    s = cross_thread(s, "softmax_maxelem", 32)
    for stage in ("softmax_exp", "softmax_expsum", "softmax_norm"):  # one thread a point
        s = one_thread_per_point(s, stage, 4)
    return dag, s


def softmax_root():
    """Two cross-thread reductions as their own kernels, exp inlined, normalize one thread a point."""
    x = te.placeholder((7, 37), name="x")
    dag = te.ComputeDAG([nn.softmax(x)])
    s = State.initial(dag).compute_inline("softmax_exp")
    s = cross_thread(s, "softmax_maxelem", 32)
    s = cross_thread(s, "softmax_expsum", 32)
    return dag, one_thread_per_point(s, "softmax_norm", 64)


def softmax_fused():
    """One kernel a row: max and sum in shared memory, read by the 32 threads that normalize."""
    x = te.placeholder((7, 37), name="x")
    dag = te.ComputeDAG([nn.softmax(x)])
    s = State.initial(dag).compute_inline("softmax_exp")
    return dag, fused_into_rows(s, "softmax_norm", ["softmax_maxelem", "softmax_expsum"], 32, 32)


def softmax_fused_wider_consumer():
    """The consumer's 64 threads, the reductions split by 32: threads 32..63 contribute the identity."""
    x = te.placeholder((3, 100), name="x")
    dag = te.ComputeDAG([nn.softmax(x)])
    s = State.initial(dag).compute_inline("softmax_exp")
    return dag, fused_into_rows(s, "softmax_norm", ["softmax_maxelem", "softmax_expsum"], 64, 32)


def _layer_norm_dag():
    x = te.placeholder((3, 6, 10), name="x")
    g = te.placeholder((6, 10), name="g")
    b = te.placeholder((6, 10), name="b")
    return te.ComputeDAG([nn.layer_norm(x, g, b, axis=1)])


def layer_norm_root():
    dag = _layer_norm_dag()
    s = State.initial(dag)
    s = cross_thread(s, "layer_norm_sum", 32)
    s = cross_thread(s, "layer_norm_sqsum", 64)
    return dag, one_thread_per_point(s, "layer_norm", 64)


def layer_norm_fused():
    dag = _layer_norm_dag()
    s = State.initial(dag)
    return dag, fused_into_rows(s, "layer_norm", ["layer_norm_sum", "layer_norm_sqsum"], 32, 32)


def dense_batch1():
    """Batch 1, a reduction of 300 (not a multiple of 32): one block per output."""
    x = te.placeholder((1, 300), name="x")
    w = te.placeholder((24, 300), name="w")
    dag = te.ComputeDAG([nn.dense(x, w)])
    return dag, cross_thread(State.initial(dag), "dense", 32)


def dense_batch1_shared():
    """As dense_batch1, with x and w staged in shared memory at the serial reduce loop (Ansor's shared
    cache reads), fetched by the same 32 threads: its barriers sit outside the reducing thread loop."""
    dag, s = dense_batch1()
    s = s.cache_read("x", "shared", ["dense"]).cache_read("w", "shared", ["dense"])
    for shared in ("x.shared", "w.shared"):
        s = s.compute_at(shared, "dense", 1)
        s = s.fuse(shared, [0, 1]).split(shared, 0, [32]).bind(shared, 1, Annotation.THREAD_X)
    return dag, s


def softmax_fused_one_thread_reduces():
    """Reductions split by 1 (one thread each) inside a 32-thread kernel: the other 31 add nothing."""
    x = te.placeholder((3, 40), name="x")
    dag = te.ComputeDAG([nn.softmax(x)])
    s = State.initial(dag).compute_inline("softmax_exp")
    return dag, fused_into_rows(s, "softmax_norm", ["softmax_maxelem", "softmax_expsum"], 32, 1)


def global_avg_pool():
    """Mean over 7x7 (49 points by 32 threads) per (n, c); the mean a separate kernel."""
    x = te.placeholder((2, 8, 7, 7), name="x")
    dag = te.ComputeDAG([nn.reduce(x, "mean", [2, 3], keepdims=True)])
    s = cross_thread(State.initial(dag), "reduce_sum", 32)
    return dag, one_thread_per_point(s, "reduce", 8)


def global_avg_pool_fused():
    """The sum computed in the mean's blockIdx loop: one kernel, one block per (n, c)."""
    x = te.placeholder((2, 8, 7, 7), name="x")
    dag = te.ComputeDAG([nn.reduce(x, "mean", [2, 3], keepdims=True)])
    s = State.initial(dag).fuse("reduce", [0, 1, 2, 3]).bind("reduce", 0, Annotation.BLOCK_X)
    s = cross_thread(s, "reduce_sum", 32, spatial_block=False).compute_at("reduce_sum", "reduce", 0)
    return dag, s


def rows_per_block():
    """Four outputs per block along threadIdx.y, each reduced by 32 threads along x (block 32x4)."""
    x = te.placeholder((10, 70), name="x")
    dag = te.ComputeDAG([nn.reduce(x, "max", [1])])
    s = State.initial(dag).split("reduce", 1, [32]).bind("reduce", 2, Annotation.THREAD_X)
    s = s.split("reduce", 0, [4]).bind("reduce", 0, Annotation.BLOCK_X).bind("reduce", 1, Annotation.THREAD_Y)
    return dag, s


WORKLOADS = {
    "sum_32": lambda: sum_one_axis(32),
    "sum_64": lambda: sum_one_axis(64),
    "sum_128": lambda: sum_one_axis(128),
    "sum_two_axes": sum_two_axes,
    "sum_to_scalar": sum_to_scalar,
    "min_37_threads": min_37_threads,
    "prod_37_threads": prod_37_threads,
    "softmax_maxelem": softmax_maxelem,
    "softmax_root": softmax_root,
    "softmax_fused": softmax_fused,
    "softmax_fused_wider_consumer": softmax_fused_wider_consumer,
    "layer_norm_root": layer_norm_root,
    "layer_norm_fused": layer_norm_fused,
    "dense_batch1": dense_batch1,
    "dense_batch1_shared": dense_batch1_shared,
    "softmax_fused_one_thread_reduces": softmax_fused_one_thread_reduces,
    "global_avg_pool": global_avg_pool,
    "global_avg_pool_fused": global_avg_pool_fused,
    "rows_per_block": rows_per_block,
}


@pytest.fixture(scope="module")
def modules():
    """Every workload lowered and emitted for opencl (names unique, so one source holds them all)."""
    out = {}
    for name, make in WORKLOADS.items():
        dag, state = make()
        out[name] = (dag, emit_gpu(lower(state, name), _OPENCL))
    return out


@pytest.fixture(scope="module")
def program(modules):
    if _DEVICE is None:
        pytest.skip("no OpenCL platform (pip install pyopencl; apt-get install pocl-opencl-icd)")
    return build_opencl([m for _, m in modules.values()], _DEVICE)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_runs_on_opencl_and_matches_the_reference(name, modules, program):
    dag, module = modules[name]
    rng = np.random.default_rng(16)
    inputs = {p.name: rng.uniform(-1, 1, p.shape).astype(p.dtype) for p in dag.placeholders}
    outs = run_opencl(module, [inputs[p.name] for p in dag.placeholders], program=program)
    refs = evaluate(dag, inputs, float_dtype="float64")
    for out, ref in zip(outs, refs):
        scale = float(np.max(np.abs(ref))) or 1.0
        np.testing.assert_allclose(out, ref, rtol=RTOL, atol=RTOL * scale, err_msg=module.opencl_source)


def test_compiles_as_cuda_for_sm_90(modules):
    if cuda_compiler_name() is None:
        pytest.skip("neither NVRTC (pip install 'aotc[cuda]') nor nvcc is available")
    cuda = [
        emit_gpu(lower(make()[1], name), parse_target("cuda -arch=sm_90")) for name, make in WORKLOADS.items()
    ]
    cubin = compile_cuda(gpu_source(cuda, "cuda"), "sm_90")
    assert cubin[:4] == b"\x7fELF"
    for m in cuda:
        for k in m.kernels:
            assert k.name.encode() in cubin


def _barriers_outside_thread_conditions(s: Stmt, thread_vars: set, under: bool) -> None:
    """Every barrier sits under no condition or loop bound that reads a thread index."""
    if isinstance(s, Barrier):
        assert not under
    if isinstance(s, For) and s.kind == ForKind.THREAD_BINDING and s.thread_tag.startswith("threadIdx"):
        thread_vars = thread_vars | {s.var}
    else:
        read = s.cond if isinstance(s, IfThenElse) else s.extent if isinstance(s, For) else None
        under = under or (read is not None and bool(free_vars(read) & thread_vars))
    for c in stmt_children(s):
        _barriers_outside_thread_conditions(c, thread_vars, under)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_every_thread_reaches_every_barrier(name, modules):
    dag, state = WORKLOADS[name]()
    func = lower(state, name)
    _barriers_outside_thread_conditions(func.body, set(), False)


def test_lowered_structure_and_launch():
    dag, state = sum_one_axis(32)
    func = lower(state, "r")
    text = func_str(func)
    # partial in a register from the identity, 32 slots in shared memory, 5 tree steps
    assert "alloc reduce.acc: float32[1] local" in text and "alloc reduce.red: float32[32] shared" in text
    assert text.count("barrier") == 6, text
    assert "if (k1.1 == 0):" in text
    (kernel,) = emit_gpu(func, _OPENCL).kernels
    assert (kernel.launch.grid, kernel.launch.block, kernel.launch.shared_bytes) == (
        (6, 1, 1),
        (32, 1, 1),
        128,
    )
    # the identities of max and min
    assert "-inff" in func_str(lower(softmax_maxelem()[1], "m"))
    assert "min(reduce.acc[0]" in func_str(lower(min_37_threads()[1], "m"))


def test_fused_kernel_keeps_the_results_in_shared_memory():
    dag, state = softmax_fused()
    module = emit_gpu(lower(state, "sm"), _OPENCL)
    (kernel,) = module.kernels
    assert kernel.launch.grid == (7, 1, 1) and kernel.launch.block == (32, 1, 1)
    # max and sum (one value each) plus their two 32-slot trees
    assert kernel.launch.shared_bytes == 4 * (1 + 1 + 32 + 32)
    assert not module.workspace
    dag, state = rows_per_block()
    (kernel,) = emit_gpu(lower(state, "rows"), _OPENCL).kernels
    assert (kernel.launch.block, kernel.launch.shared_bytes) == ((32, 4, 1), 4 * 4 * 32)


def test_the_targets_limits_count_the_tree():
    x = te.placeholder((2, 1000), name="x")
    dag = te.ComputeDAG([nn.reduce(x, "sum", [1])])
    func = lower(cross_thread(State.initial(dag), "reduce", 512), "r")
    assert emit_gpu(func, parse_target("cuda -arch=sm_90")).kernels[0].launch.shared_bytes == 2048
    with pytest.raises(GPUCodegenError, match="512 threads per block, more than opencl's 256"):
        emit_gpu(func, _OPENCL)


def test_features_walk_a_cross_thread_reduction():
    dag, state = softmax_fused()
    feats = extract_features(lower(state, "sm"))
    assert feats.shape[0] > 0 and np.isfinite(feats).all()


def test_unsupported_bindings_are_refused():
    x = te.placeholder((4, 64), name="x")
    dag = te.ComputeDAG([nn.reduce(x, "sum", [1])])
    s = State.initial(dag).bind("reduce", 0, Annotation.THREAD_X).bind("reduce", 1, Annotation.BLOCK_X)
    with pytest.raises(GPUCodegenError, match="threads along blockIdx.x update the same elements"):
        emit_gpu(lower(s, "r"))
    s = State.initial(dag).fuse("reduce", [0, 1]).split("reduce", 0, [64])  # spatial and reduce mixed
    s = s.bind("reduce", 0, Annotation.BLOCK_X).bind("reduce", 1, Annotation.THREAD_X)
    with pytest.raises(GPUCodegenError, match="threads along threadIdx.x update .* a cross-thread reduction"):
        emit_gpu(lower(s, "r"))
    s = State.initial(dag).split("reduce", 1, [8]).bind("reduce", 1, Annotation.THREAD_Y)
    with pytest.raises(ScheduleError, match="all bound to threads"):
        lower(s.bind("reduce", 2, Annotation.THREAD_X), "r")
    s = State.initial(dag).split("reduce", 1, [8]).bind("reduce", 1, Annotation.BLOCK_X)
    with pytest.raises(ScheduleError, match="a reduction across blocks"):
        lower(s.bind("reduce", 2, Annotation.THREAD_X), "r")
    s = State.initial(dag).split("reduce", 1, [8]).reorder("reduce", [1, 0, 2])
    s = s.bind("reduce", 2, Annotation.THREAD_X)
    with pytest.raises(ScheduleError, match="every spatial iterator outside"):
        lower(s, "r")
    # threadIdx.x bound around the reduction and to its reduce iterator
    s = State.initial(dag).bind("reduce", 0, Annotation.THREAD_X).split("reduce", 1, [8])
    with pytest.raises(ScheduleError, match="threadIdx.x is bound both"):
        lower(s.bind("reduce", 2, Annotation.THREAD_X), "r")
