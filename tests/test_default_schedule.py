"""The untuned schedule fits the target's register file: AVX2 has 16 ymm registers, AVX-512 32 zmm."""

from __future__ import annotations

import math

import pytest

from aotc.schedule.default import default_schedule
from aotc.schedule.lower import infer_bound
from aotc.target import parse_target
from aotc.te.dag import ComputeDAG
from aotc.te.tensor import LAYOUT_FREE, placeholder
from aotc.topi.nhwc import conv2d_nhwc
from aotc.topi.nn import conv2d_nchw, matmul, softmax


def _accumulators(dag: ComputeDAG, target) -> int:
    """Vector accumulators of the register block: the innermost spatial tile, in registers."""
    s = infer_bound(default_schedule(dag, target))
    stage = next(st for st in s.stages if any(it.name.endswith(".3") for it in st.iters))
    elements = math.prod(
        it.extent for it in stage.iters if it.name.endswith(".3") and it.kind.name == "SPATIAL"
    )
    return elements // (target.hw.vector_bytes // 4)


def _matmul(n: int) -> ComputeDAG:
    return ComputeDAG([matmul(placeholder((n, n), "float32", "A"), placeholder((n, n), "float32", "B"))])


def _conv(c: int, hw: int) -> ComputeDAG:
    data = placeholder((1, c, hw, hw), "float32", "data")
    weight = placeholder((c, c, 3, 3), "float32", "weight")
    return ComputeDAG([conv2d_nchw(data, weight, (1, 1), (1, 1, 1, 1))])


def _conv_nhwc(c: int, hw: int) -> ComputeDAG:
    data = placeholder((1, hw, hw, c), "float32", "data")
    weight = placeholder((c, 3, 3, c), "float32", "weight", tag=LAYOUT_FREE)
    return ComputeDAG([conv2d_nhwc(data, weight, ((1, 1), (1, 1, 1, 1), (1, 1)))])


# a prime row count (ViT's 197 tokens) keeps a (partial) block of several rows
@pytest.mark.parametrize(
    "dag",
    [_matmul(256), _matmul(384), _matmul(197), _conv(64, 56), _conv(128, 28), _conv_nhwc(512, 7)],
    ids=str,
)
@pytest.mark.parametrize(("cpu", "registers", "most"), [("znver3", 16, 12), ("znver4", 32, 16)])
def test_register_block_fits_the_register_file(dag, cpu, registers, most):
    target = parse_target(f"llvm -mcpu={cpu}")
    assert target.hw.vector_registers == registers
    assert 4 <= _accumulators(dag, target) <= most


def _int8_conv(c: int, hw: int) -> ComputeDAG:
    from .test_dot_products import quantized_dag

    return quantized_dag("qnn.conv2d_nhwc", (1, hw, hw, c), (c, 3, 3, c), "int8", 3, True)


@pytest.mark.parametrize(
    "dag",
    [_conv(256, 14), _conv(512, 7), _conv_nhwc(512, 7), _int8_conv(256, 14), _int8_conv(512, 7)],
    ids=str,
)
@pytest.mark.parametrize("cpu", ["znver3", "znver4"])
def test_register_block_divides_the_axes_it_blocks(dag, cpu):
    """ResNet's 14x14 and 7x7 stages: a register block that left a partial tile (AVX2's 12 accumulators
    as 6 rows of 14) had a loop of variable extent, its accumulators in memory (1.7x slower on znver3).
    A float NHWC conv on a 7x7 stage takes 7 rows of one ymm register there, not 6 of two (2x faster)."""
    target = parse_target(f"llvm -mcpu={cpu}")
    s = infer_bound(default_schedule(dag, target))
    extents = {a.name: a.extent for op in dag.compute_ops for a in op.axes}
    stage = next(st for st in s.stages if any(it.name.endswith(".3") for it in st.iters))
    blocks = {it.name[:-2]: it.extent for it in stage.iters if it.name.endswith(".3") and it.extent > 1}
    assert blocks and all(extents[name] % b == 0 for name, b in blocks.items()), blocks
    assert math.prod(blocks.values()) >= 4, blocks


def test_a_smaller_block_of_rows_gives_its_accumulators_to_the_columns():
    """A 3x3 stride-2 conv onto 28x28 tiles its padded input by rows split evenly over the cores: on AVX2
    its 4-row block became 2 rows of 2 columns, not 2 rows alone (4 of 12 accumulators; 1.4x slower)."""
    data = placeholder((1, 56, 56, 64), "float32", "data")
    weight = placeholder((128, 3, 3, 64), "float32", "weight", tag=LAYOUT_FREE)
    dag = ComputeDAG([conv2d_nhwc(data, weight, ((2, 2), (1, 1, 1, 1), (1, 1)))])
    for cpu in ("znver3", "znver4"):
        target = parse_target(f"llvm -mcpu={cpu} -num-cores=2")
        assert 8 <= _accumulators(dag, target) <= target.hw.vector_registers - 4, cpu


@pytest.mark.parametrize("cpu", ["znver3", "znver4"])
def test_a_dot_product_block_trades_vectors_for_a_row_with_no_divisor_between(cpu, tmp_path):
    """ResNet-18's int8 3x3 stride-2 conv onto 14x14x256 tiles one output row a tile (two would leave 7
    tiles for 2 cores); its 2 columns x 4 vectors (8 accumulators; 14 has no divisor between 2 and 7)
    became 7 columns x 2 vectors (0.161 -> 0.111 ms at 1 thread on Zen 5). AVX2's blocks of 2 vectors
    take 7 rows a tile there already. Bit for bit."""
    from aotc.topi.registry import get_op

    from .test_dot_products import check_exact, layer_attrs

    attrs = layer_attrs("qnn.conv2d_nhwc", (256, 3, 3, 128), 3, True) | {"strides": (2, 2)}
    x = placeholder((1, 28, 28, 128), "uint8", name="x")
    w = placeholder((256, 3, 3, 128), "int8", name="w", tag=LAYOUT_FREE)
    b = placeholder((256,), "int32", name="b", tag=LAYOUT_FREE)
    dag = ComputeDAG(get_op("qnn.conv2d_nhwc").compute([x, w, b], attrs | {"input_zero_point_in_bias": True}))
    target = parse_target(f"llvm -mcpu={cpu} -num-cores=2")
    s = default_schedule(dag, target)
    bound = infer_bound(s)
    stage = next(st for st in bound.stages if any(it.name.endswith(".3") for it in st.iters))
    blocks = {it.name[:-2]: it.extent for it in stage.iters if it.name.endswith(".3") and it.extent > 1}
    assert math.prod(blocks.values()) >= 12, blocks  # vectors x columns: the lanes are the .4 loop
    check_exact(dag, s, target, tmp_path, "k")


def _uint8_stem(hw: int, channels: int, kernel: int, stride: int, seed: int):
    """(input, graph) of one uint8 conv of 16 outputs, `kernel` x `kernel` (padded by kernel // 2) over an
    hw x hw image of `channels`: an int8 stem."""
    import numpy as np

    from aotc.graph.ir import Graph, Node, TensorType, Value

    rng = np.random.default_rng(seed)
    x = Value("x", TensorType((1, hw, hw, channels), "uint8"))
    shape = (16, kernel, kernel, channels)
    w = Value("w", TensorType(shape, "int8"), data=rng.integers(-127, 128, shape, dtype=np.int8))
    b = Value("b", TensorType((16,), "int32"), data=rng.integers(-999, 999, 16, dtype=np.int32))
    side = (hw + 2 * (kernel // 2) - kernel) // stride + 1
    out = Value("y", TensorType((1, side, side, 16), "uint8"))
    attrs = {
        "strides": (stride, stride),
        "pads": (kernel // 2,) * 4,
        "dilations": (1, 1),
        "input_scale": 0.02,
        "input_zero_point": 120,
        "weight_scales": (0.003,) * 16,
        "weight_zero_points": (0,) * 16,
        "activation": "NONE",
        "output_scale": 0.05,
        "output_zero_point": 7,
        "out_dtype": "uint8",
        "requantize": "float",
    }
    node = Node("qnn.conv2d_nhwc", [x, w, b], [out], attrs, name="stem")
    out.producer = node
    return x, Graph([x], [out], [node])


@pytest.mark.parametrize("cpu", ["znver3", "znver4", "neoverse-n2 -mtriple=aarch64-linux-gnu"])
@pytest.mark.parametrize(("hw", "channels", "kernel", "stride"), [(20, 3, 7, 2), (13, 1, 3, 1)])
def test_window_columns_are_gathered_inside_the_conv_tiles(cpu, hw, channels, kernel, stride, tmp_path):
    """A conv whose window rows are read as channels (`window_columns_as_channels`: ResNet's 7x7 stride-2
    RGB stem, a grayscale 3x3 conv) gathers them per tile into its window copy, not in a pass of its own
    (QDQ ResNet-18's stem on Zen 5: 0.397 -> 0.35 ms at 1 thread). Bit for bit against its graph where
    the code runs here (AArch64's: compiled only)."""
    import numpy as np

    from aotc.graph.interpret import run_graph
    from aotc.graph.partition import extract_tasks, partition
    from aotc.graph.passes import optimize
    from aotc.schedule.state import ComputeAtKind

    from .test_dot_products import check_exact

    x, graph = _uint8_stem(hw, channels, kernel, stride, seed=1)
    image = np.random.default_rng(2).integers(0, 256, x.type.shape, dtype=np.uint8)
    expected = run_graph(graph, {"x": image})["y"]
    graph = optimize(graph, dot_products=True)
    assert "window_columns" in [n.op for n in graph.nodes]
    np.testing.assert_array_equal(run_graph(graph, {"x": image})["y"], expected)
    (task,) = extract_tasks(partition(graph))
    target = parse_target(f"llvm -mcpu={cpu}")
    s = default_schedule(task.dag, target)
    gather = s.stages[s.stage_id("window_columns")]
    assert gather.compute_at == ComputeAtKind.INLINED
    check_exact(task.dag, s, target, tmp_path, "k")


@pytest.mark.parametrize(
    ("hw", "channels", "stride"), [(112, 32, 1), (112, 96, 2), (14, 576, 1), (7, 960, 1)]
)
@pytest.mark.parametrize("cpu", ["znver3", "znver4"])
def test_a_float_depthwise_conv_pads_per_register_block(hw, channels, stride, cpu):
    """MobileNetV2's float depthwise convs: each register block (up to 8 pixels of one vector of channels)
    pads the few rows and columns it reads, where a tile of rows had padded a copy of all its input rows
    first (146 KB for 8 rows of 112x112x32) and a separate pass over the whole input where that did not
    fit (2.4-2.6x slower on AVX2); 0.46-0.80x the time each in the model on Zen 5. The parallel loop has
    work for every core: blocks of channels join the rows where a 14x14 or 7x7 stage has few."""
    from aotc.schedule.default import DEPTHWISE_BLOCK
    from aotc.schedule.state import ComputeAtKind
    from aotc.topi.nhwc import depthwise_conv2d_nhwc

    target = parse_target(f"llvm -mcpu={cpu} -num-cores=2")
    data = placeholder((1, hw, hw, channels), "float32", "data")
    weight = placeholder((1, 3, 3, channels), "float32", "weight", tag=LAYOUT_FREE)
    pads = (1, 1, 1, 1) if stride == 1 else (0, 0, 1, 1)
    dag = ComputeDAG([depthwise_conv2d_nhwc(data, weight, ((stride, stride), pads, (1, 1)))])
    s = infer_bound(default_schedule(dag, target))
    pad = next(st for st in s.stages if st.name.endswith("_pad"))
    assert pad.compute_at == ComputeAtKind.ITER
    assert 4 * math.prod(it.extent for it in pad.iters) <= 4096, [it.extent for it in pad.iters]
    stage = next(st for st in s.stages if any(it.name.endswith(".3") for it in st.iters))
    blocks = {it.name[:-2]: it.extent for it in stage.iters if it.name.endswith(".3")}
    lanes = target.hw.vector_bytes // 4
    assert blocks.pop("ff") == lanes and 4 <= math.prod(blocks.values()) <= DEPTHWISE_BLOCK, blocks
    parallel = next(st for st in s.stages if st.iters and st.iters[0].annotation.name == "PARALLEL")
    assert parallel.iters[0].extent >= 2 * target.hw.num_cores


def test_row_reductions_run_in_parallel():
    """Softmax's row max and row sum (512 rows of 128) are worth a parallel loop though each has fewer
    than MIN_PARALLEL_POINTS outputs: their threads' work includes the reduction."""
    dag = ComputeDAG([softmax(placeholder((1, 4, 128, 128), "float32", "x"))])
    s = default_schedule(dag, parse_target("llvm -mcpu=znver4"))
    for name in ("softmax_maxelem", "softmax_expsum"):
        assert s.stages[s.stage_id(name)].iters[0].annotation.name == "PARALLEL"


@pytest.mark.parametrize("dtype", ["int8", "float16"])
def test_vectors_stay_within_the_codegens_lane_limit(dtype, tmp_path):
    """An axis of 90 narrow elements (no power of two divides it; it fits four AVX-512 registers) is not
    vectorized whole: 90 lanes were past the codegen's 64 (found by the ONNX fuzz test)."""
    from aotc import te
    from aotc.codegen.module import build_module
    from aotc.ir.stmt import MAX_VECTOR_LANES, For, ForKind, walk_stmts
    from aotc.schedule.lower import lower

    x = placeholder((3, 90), dtype, name="x")
    dag = ComputeDAG([te.compute((3, 90), lambda i, j: x[i, j] + x[i, j], "add")])
    target = parse_target("llvm -mcpu=znver4")
    func = lower(default_schedule(dag, target), "k")
    lanes = [
        s.max_extent for s in walk_stmts(func.body) if isinstance(s, For) and s.kind == ForKind.VECTORIZED
    ]
    assert lanes and max(lanes) <= MAX_VECTOR_LANES
    build_module([func], target, str(tmp_path / "k.so"))


def _conv_then_add() -> tuple[ComputeDAG, str]:
    """A batch-1 conv whose element-wise consumer (a residual add) reads it as broadcasting computes do:
    the batch axis of extent 1 at constant 0, not at the add's own batch axis."""
    from aotc.topi.elemwise import map_inputs

    data = placeholder((1, 16, 14, 14), "float32", "data")
    weight = placeholder((16, 16, 3, 3), "float32", "weight")
    conv = conv2d_nchw(data, weight, (1, 1), (1, 1, 1, 1))
    add = map_inputs([conv, placeholder((1, 16, 14, 14), "float32", "residual")], lambda a, b: a + b, "add")
    return ComputeDAG([add]), conv.name


def test_a_conv_fuses_into_a_consumer_that_reads_its_batch_axis_at_zero():
    """The conv's register tiles are computed inside the add's tiles (one pass, no global intermediate),
    as for a consumer that reads it at its own axes; it used to take a cache_write and a second pass."""
    from aotc.schedule.state import ComputeAtKind

    dag, conv = _conv_then_add()
    s = default_schedule(dag, parse_target("llvm -mcpu=znver4"))
    assert s.stages[s.stage_id(conv)].compute_at == ComputeAtKind.ITER
    assert not any(st.name.startswith(f"{conv}.") for st in s.stages)  # no cache_write stage


def test_an_image_transpose_vectorizes_its_width_not_its_three_channels():
    """NCHW -> NHWC of a 3-channel image: vectors along the width it reads contiguously (a plane's row),
    channels unrolled around them, instead of a 3-lane vector per pixel gathered across the planes (a
    QDQ ResNet-18 stem: 1.18 -> 0.98 ms on a Zen 4)."""
    from aotc import te
    from aotc.schedule.state import Annotation
    from aotc.topi.transform import transpose

    image = placeholder((1, 3, 224, 224), "float32", "image")
    nhwc = transpose(te.compute(image.shape, lambda *i: image[i] * 2.0, "scaled"), (0, 2, 3, 1))
    s = default_schedule(ComputeDAG([nhwc]), parse_target("llvm -mcpu=znver4"))
    iters = s.stages[s.stage_id(nhwc.name)].iters
    assert [it.annotation for it in iters[-2:]] == [Annotation.UNROLL, Annotation.VECTORIZE]
    assert iters[-2].extent == 3 and iters[-1].extent in (16, 32)
    assert iters[0].annotation == Annotation.PARALLEL


def test_a_transpose_back_to_nchw_gives_each_thread_whole_rows_of_its_output():
    """NHWC -> NCHW of a 7x7x512 feature map: its last axis (a row of 7) is not a few channels read across
    planes, so the parallel loop runs over the output's outer axes in order and each thread writes rows
    of its own. As the image rule had it (vectors along the channels, the row's pixels unrolled, the
    parallel loop over the rows' planes) both threads wrote into the same cache lines: 0.077 ms at 2
    threads on Zen 5 instead of 0.005."""
    from aotc.schedule.state import Annotation
    from aotc.topi.transform import transpose

    x = placeholder((1, 7, 7, 512), "uint8", "x")
    nchw = transpose(x, (0, 3, 1, 2))
    s = default_schedule(ComputeDAG([nchw]), parse_target("llvm -mcpu=znver4 -num-cores=2"))
    iters = s.stages[s.stage_id(nchw.name)].iters
    assert iters[0].annotation == Annotation.PARALLEL and iters[0].name == "ax0@ax1@ax2", iters[0].name
    assert iters[-1].annotation == Annotation.VECTORIZE and iters[-1].name == "ax3"


def test_a_small_image_transpose_runs_on_the_calling_thread():
    """The transpose rule keeps the MIN_PARALLEL_POINTS floor: 16x16x3 points do not wake the pool."""
    from aotc.schedule.state import Annotation
    from aotc.topi.transform import transpose

    image = placeholder((1, 3, 16, 16), "float32", "image")
    nhwc = transpose(image, (0, 2, 3, 1))
    s = default_schedule(ComputeDAG([nhwc]), parse_target("llvm -mcpu=znver4"))
    iters = s.stages[s.stage_id(nhwc.name)].iters
    assert iters[-1].annotation == Annotation.VECTORIZE and iters[-2].annotation == Annotation.UNROLL
    assert all(it.annotation != Annotation.PARALLEL for it in iters)


@pytest.mark.parametrize("mcpu", ["znver3", "znver4"])
def test_a_tiled_op_of_about_a_microsecond_runs_on_the_calling_thread(mcpu):
    """Below MIN_PARALLEL_VECTOR_MACS vector multiply-adds a conv is not worth waking the pool (small
    models' kernels ran 1.0-1.8x slower at 2 threads on Zen 5); a larger one runs in parallel."""
    from aotc.schedule.default import MIN_PARALLEL_VECTOR_MACS, vector_macs

    target = parse_target(f"llvm -mcpu={mcpu}")
    small, large = _conv_nhwc(8, 8), _conv_nhwc(32, 8)
    lanes = target.hw.vector_bytes // 4
    assert vector_macs(small.compute_ops[-1], target) == 8 * 8 * 8 * 9 * 8 // lanes < MIN_PARALLEL_VECTOR_MACS
    assert vector_macs(large.compute_ops[-1], target) >= MIN_PARALLEL_VECTOR_MACS

    def parallel_stages(dag):
        s = default_schedule(dag, target)
        return [st.name for st in s.stages if any(it.annotation.name == "PARALLEL" for it in st.iters)]

    assert parallel_stages(small) == []
    assert parallel_stages(large) == ["conv2d_nhwc"]


def test_vector_macs_counts_lanes_of_the_narrowest_type_read():
    """An int8 matmul's vector holds 4x the products of a float32 one: 4x fewer vector multiply-adds."""
    from aotc.schedule.default import vector_macs

    target = parse_target("llvm -mcpu=znver4")
    ops = {
        t: matmul(placeholder((8, 64), t, "A"), placeholder((64, 32), t, "B")) for t in ("float32", "int8")
    }
    assert vector_macs(ops["float32"], target) == 8 * 64 * 32 // 16
    assert vector_macs(ops["int8"], target) == 8 * 64 * 32 // 64


@pytest.mark.parametrize("cores", [1, 2])
def test_large_weights_are_shared_out_between_the_cores(cores, tmp_path):
    """A 7x7 conv of 256 channels (2.4 MB of float weights, 50 KB of input): on several cores its parallel
    loop runs over blocks of output channels outermost, so each core reads its share of the weights (with
    the pixel blocks outermost each core read them all; ResNet-18's last stage 1.13-1.2x faster at 2
    threads); on one core the order stays. The outputs are the conv's either way."""
    import numpy as np

    from aotc.codegen.module import build_module, load_library
    from aotc.schedule.lower import lower

    dag = _conv_nhwc(256, 7)
    target = parse_target(f"llvm -mcpu=znver3 -num-cores={cores}")
    s = default_schedule(dag, target)
    outer = s.stages[s.stage_id("conv2d_nhwc")].iters[0]
    assert outer.annotation.name == "PARALLEL"
    assert outer.name.startswith("ax3.0@") == (cores > 1), outer.name
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 7, 7, 256), dtype=np.float32)
    w = rng.standard_normal((256, 3, 3, 256), dtype=np.float32)
    out = np.zeros((1, 7, 7, 256), np.float32)
    build_module([lower(s, "k")], target, str(tmp_path / "k.so"))
    load_library(str(tmp_path / "k.so")).kernel("k")(x, w, out)
    padded = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(1, 2))  # n, y, x, c, ky, kx
    want = np.einsum("nyxcij,fijc->nyxf", windows, w)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("kind", ["max", "avg"])
def test_a_pool_reads_its_input_unpadded_and_runs_per_pixel_of_its_consumer(kind, tmp_path):
    """A 3x3 stride-2 pool's padded input is inlined (no padded copy of the whole input) and the pool,
    where one element-wise stage consumes it (a ReLU; the average's division), is computed per pixel
    inside that stage's parallel loop: one pass over memory. The outputs are numpy's (padding excluded
    from the average, as TFLite does)."""
    import numpy as np

    from aotc.codegen.module import build_module, load_library
    from aotc.schedule.lower import lower
    from aotc.schedule.state import ComputeAtKind
    from aotc.topi.nhwc import pool2d_nhwc
    from aotc.topi.nn import relu

    x = placeholder((1, 33, 34, 48), "float32", name="x")
    pooled = pool2d_nhwc(x, kind, (3, 3), (2, 2), (1, 1, 1, 1), name="pool")
    out = relu(pooled) if kind == "max" else pooled
    dag = ComputeDAG([out])
    target = parse_target("llvm -mcpu=znver3 -num-cores=2")
    s = default_schedule(dag, target)
    stages = {st.name: st for st in s.stages}
    assert stages["pool_pad"].compute_at == ComputeAtKind.INLINED
    reduction = stages["pool" if kind == "max" else "pool_sum"]
    assert reduction.compute_at == ComputeAtKind.ITER
    assert s.stages[reduction.attach[0]].iters[0].annotation.name == "PARALLEL"
    rng = np.random.default_rng(0)
    data = rng.standard_normal((1, 33, 34, 48), dtype=np.float32)
    got = np.zeros([int(d) for d in out.shape], np.float32)
    build_module([lower(s, "k")], target, str(tmp_path / "k.so"))
    load_library(str(tmp_path / "k.so")).kernel("k")(data, got)
    fill = -np.inf if kind == "max" else np.nan
    padded = np.pad(data, ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=fill)
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(1, 2))[:, ::2, ::2]
    want = np.maximum(windows.max(axis=(-2, -1)), 0) if kind == "max" else np.nanmean(windows, axis=(-2, -1))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cpu", ["znver3", "znver4"])
def test_an_int8_stems_channel_pad_is_read_inside_the_conv_tiles(cpu, tmp_path):
    """An RGB int8 stem's input is padded to 4 channels for the dot products (`pad_conv_channels`). That
    pad is inlined into the conv's per-tile window pad, not run as a pass of its own over the image in
    4-byte vectors (MobileNetV2's int8 stem on Zen 5: 0.116 -> 0.054 ms at 1 thread). Bit for bit."""
    from aotc.graph.partition import extract_tasks, partition
    from aotc.graph.passes import optimize
    from aotc.schedule.state import ComputeAtKind

    from .test_dot_products import check_exact

    _, graph = _uint8_stem(20, 3, 3, 2, seed=0)
    (task,) = extract_tasks(partition(optimize(graph, dot_products=True)))
    target = parse_target(f"llvm -mcpu={cpu}")
    s = default_schedule(task.dag, target)
    pads = [st for st in s.stages if not st.is_placeholder and st.op.tag == "pad"]
    assert len(pads) == 2, [st.name for st in pads]  # the channel pad and the conv's window pad
    assert sorted(st.compute_at for st in pads) == sorted([ComputeAtKind.INLINED, ComputeAtKind.ITER])
    check_exact(task.dag, s, target, tmp_path, "k")
