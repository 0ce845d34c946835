"""Per-store program features: layout, hand-checked values on small loop nests, determinism."""

import numpy as np
import pytest

from aotc import te
from aotc.ir.expr import Buffer, Load, Var, const
from aotc.ir.stmt import Allocate, BufferStore, For, ForKind, PrimFunc, Seq, walk_stmts
from aotc.schedule.default import default_schedule
from aotc.schedule.lower import lower
from aotc.schedule.state import State
from aotc.search.features import (
    FEATURE_NAMES,
    LOG_SCALED,
    N_FEATURES,
    OFF_ALLOC,
    OFF_BUFFERS,
    OFF_CURVE,
    OFF_GPU,
    OFF_OUTER,
    OFF_PARALLEL,
    OFF_UNROLL,
    OFF_VEC,
    clear_feature_cache,
    extract_features,
    log2p,
    state_features,
)
from aotc.target import host_target
from aotc.topi import nn

from .random_schedules import random_state


def _gemm(n=64):
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    return te.ComputeDAG([nn.matmul(a, b)])


def _conv():
    x = te.placeholder((1, 8, 12, 12), name="x")
    w = te.placeholder((8, 8, 3, 3), name="w")
    return te.ComputeDAG([nn.relu(nn.conv2d_nchw(x, w, padding=1))])


def _value(row, name):
    """The unscaled value of a log-scaled feature, snapped to an integer within float32 precision."""
    v = float(row[FEATURE_NAMES.index(name)])
    x = float(np.sign(v) * (2.0 ** abs(v) - 1.0))
    return round(x) if abs(x - round(x)) <= 1e-5 * max(1.0, abs(x)) else x


def _onehot(row, prefix):
    names = [n for n in FEATURE_NAMES if n.startswith(prefix)]
    hot = [n[len(prefix) :] for n in names if row[FEATURE_NAMES.index(n)] == 1.0]
    assert len(hot) == 1, (prefix, hot)
    return hot[0]


def _buffer_slot(row, nbytes):
    """Slot of the buffer whose `bytes` is `nbytes` (unique in these nests)."""
    for b in range(5):
        if np.isclose(_value(row, f"B{b}.bytes"), nbytes, rtol=1e-4):
            return b
    raise AssertionError(f"no buffer with {nbytes} bytes")


def _loop(var, extent, kind, body):
    return For(var, const(extent), extent, kind, body)


def test_layout_has_164_unique_names_and_group_offsets():
    assert len(FEATURE_NAMES) == N_FEATURES == 164
    assert len(set(FEATURE_NAMES)) == 164
    assert FEATURE_NAMES[0] == "float_mad" and FEATURE_NAMES[OFF_VEC] == "vec_num"
    assert FEATURE_NAMES[OFF_UNROLL] == "unroll_num" and FEATURE_NAMES[OFF_PARALLEL] == "parallel_num"
    assert FEATURE_NAMES[OFF_GPU] == "is_gpu" and FEATURE_NAMES[OFF_BUFFERS] == "B0.acc_type.read"
    assert FEATURE_NAMES[OFF_CURVE] == "arith_intensity_curve_0"
    assert FEATURE_NAMES[OFF_ALLOC] == "alloc_size" and FEATURE_NAMES[OFF_OUTER] == "outer_prod"
    assert FEATURE_NAMES[-1] == "auto_unroll_max_step"
    assert not LOG_SCALED[FEATURE_NAMES.index("vec_type.inner_spatial")]
    assert LOG_SCALED[FEATURE_NAMES.index("B0.bytes")]


def test_log2p():
    np.testing.assert_allclose(log2p([0.0, 1.0, 3.0, -3.0, 1023.0]), [0.0, 1.0, 2.0, -2.0, 10.0])


@pytest.mark.parametrize("make", [_gemm, _conv])
@pytest.mark.parametrize("seed", range(8))
def test_one_row_per_store(make, seed):
    dag = make()
    state = default_schedule(dag, host_target()) if seed == 0 else random_state(dag, seed)
    func = lower(state)
    feats = extract_features(func)
    n_stores = sum(isinstance(s, BufferStore) for s in walk_stmts(func.body))
    assert feats.shape == (n_stores, 164) and feats.dtype == np.float32
    assert np.isfinite(feats).all()


def _elementwise_nest():
    """for i in 0..16 parallel: for j in 0..8 vectorized: C[i, j] = A[i, j] * B[i, j] + 1."""
    a = Buffer("A", "float32", (16, 8), "param")
    b = Buffer("B", "float32", (16, 8), "param")
    c = Buffer("C", "float32", (16, 8), "param")
    i, j = Var("i"), Var("j")
    value = Load(a, (i, j)) * Load(b, (i, j)) + 1.0
    body = _loop(i, 16, ForKind.PARALLEL, _loop(j, 8, ForKind.VECTORIZED, BufferStore(c, value, (i, j))))
    return PrimFunc("k", (a, b, c), body)


def test_elementwise_nest_values():
    (row,) = extract_features(_elementwise_nest())
    assert _value(row, "float_mul") == 128 and _value(row, "float_addsub") == 128
    assert _value(row, "float_mad") == 128 and _value(row, "float_divmod") == 0
    assert _value(row, "vec_num") == 1 and _value(row, "vec_prod") == 8 and _value(row, "vec_len") == 8
    assert _onehot(row, "vec_type.") == "inner_spatial"
    assert _value(row, "parallel_num") == 1 and _value(row, "parallel_len") == 16
    assert _onehot(row, "parallel_type.") == "outer_spatial"
    assert _onehot(row, "unroll_type.") == "none" and _value(row, "unroll_num") == 0
    assert _value(row, "is_gpu") == 0
    assert _value(row, "outer_prod") == 128 and _value(row, "num_loops") == 2
    for b in range(3):
        assert _value(row, f"B{b}.bytes") == 128 * 4
        assert _value(row, f"B{b}.unique_bytes") == 128 * 4
        assert _value(row, f"B{b}.stride") == 1
        assert row[FEATURE_NAMES.index(f"B{b}.reuse_type.no_reuse")] == 1.0
    writes = [row[FEATURE_NAMES.index(f"B{b}.acc_type.write")] for b in range(3)]
    assert sorted(writes) == [0.0, 0.0, 1.0]
    assert _value(row, "B3.bytes") == 0 and row[FEATURE_NAMES.index("B3.acc_type.read")] == 0
    assert _value(row, "alloc_size") == 128 * 4


def _matmul_nest(kind_j=ForKind.VECTORIZED, kind_k=ForKind.SERIAL):
    """C[i, j] += A[i, k] * B[k, j] over i (parallel) / k / j, with a local accumulator per i."""
    a = Buffer("A", "float32", (32, 16), "param")
    b = Buffer("B", "float32", (16, 8), "param")
    c = Buffer("C", "float32", (32, 8), "param")
    acc = Buffer("acc", "float32", (8,), "local")
    i, j, k, j2 = Var("i"), Var("j"), Var("k"), Var("j2")
    init = _loop(j, 8, kind_j, BufferStore(acc, const(0.0, "float32"), (j,)))
    update_value = Load(acc, (j,)) + Load(a, (i, k)) * Load(b, (k, j))
    update = _loop(k, 16, kind_k, _loop(j, 8, kind_j, BufferStore(acc, update_value, (j,))))
    write = _loop(j2, 8, ForKind.SERIAL, BufferStore(c, Load(acc, (j2,)), (i, j2)))
    body = _loop(i, 32, ForKind.PARALLEL, Allocate(acc, Seq((init, update, write))))
    return PrimFunc("k", (a, b, c), body)


def test_matmul_nest_update_row():
    init, update, write = extract_features(_matmul_nest())
    assert _value(update, "float_mul") == 32 * 16 * 8 and _value(update, "float_addsub") == 32 * 16 * 8
    assert _value(update, "int_mul") == 0
    assert _onehot(update, "vec_type.") == "inner_spatial"
    assert _onehot(update, "parallel_type.") == "outer_spatial"
    a_slot = _buffer_slot(update, 32 * 16 * 8 * 4)
    assert _value(update, f"B{a_slot}.bytes") == 4096 * 4
    slots = {_onehot(update, f"B{s}.acc_type."): s for s in range(3) if _value(update, f"B{s}.bytes") > 0}
    assert set(slots) == {"read", "read_write"}
    acc_slot = slots["read_write"]
    assert _value(update, f"B{acc_slot}.unique_bytes") == 8 * 4
    assert _value(update, f"B{acc_slot}.stride") == 1
    # A[i, k] does not vary with the innermost loop j: reused 8 times there.
    reads = [s for s in range(3) if _onehot(update, f"B{s}.acc_type.") == "read"]
    a_reuse = [s for s in reads if _value(update, f"B{s}.stride") == 0]
    assert len(a_reuse) == 1
    s = a_reuse[0]
    assert _onehot(update, f"B{s}.reuse_type.") == "loop_multiple_read"
    assert _value(update, f"B{s}.reuse_ct") == 8
    assert _value(update, f"B{s}.unique_bytes") == 32 * 16 * 4
    assert _value(update, "alloc_size") == 8 * 4 and _value(update, "alloc_outer_prod") == 32
    assert _value(update, "outer_prod") == 4096 and _value(update, "num_loops") == 3
    assert _value(init, "float_mul") == 0 and _onehot(init, "vec_type.") == "inner_spatial"
    assert _onehot(write, "vec_type.") == "none"


def test_unrolled_reduce_loop_is_inner_reduce():
    (_, update, _) = extract_features(_matmul_nest(kind_j=ForKind.SERIAL, kind_k=ForKind.UNROLLED))
    assert _onehot(update, "unroll_type.") == "inner_reduce"
    assert _value(update, "unroll_len") == 16 and _value(update, "unroll_num") == 1
    assert _onehot(update, "vec_type.") == "none"


def test_positions_middle_outer_and_mixed():
    a = Buffer("A", "float32", (4, 6, 8, 10), "param")
    c = Buffer("C", "float32", (4, 6, 8), "param")
    i, j, k, r = Var("i"), Var("j"), Var("k"), Var("r")
    body = BufferStore(c, Load(c, (i, j, k)) + Load(a, (i, j, k, r)), (i, j, k))
    nest = _loop(
        i,
        4,
        ForKind.SERIAL,
        _loop(j, 6, ForKind.PARALLEL, _loop(r, 10, ForKind.UNROLLED, _loop(k, 8, ForKind.VECTORIZED, body))),
    )
    (row,) = extract_features(PrimFunc("k", (a, c), nest))
    assert _onehot(row, "parallel_type.") == "middle_spatial"
    assert _onehot(row, "unroll_type.") == "inner_reduce"
    assert _onehot(row, "vec_type.") == "inner_spatial"
    f = Var("f")
    fused = BufferStore(c, Load(c, (0, 0, f // 10)) + Load(a, (0, 0, f // 10, f % 10)), (0, 0, f // 10))
    (row,) = extract_features(PrimFunc("k", (a, c), _loop(f, 80, ForKind.UNROLLED, fused)))
    assert _onehot(row, "unroll_type.") == "mixed"
    g = Var("g")
    both = BufferStore(c, Load(a, (0, g // 8, g % 8, 0)), (0, g // 8, g % 8))
    (row,) = extract_features(PrimFunc("k", (a, c), _loop(g, 48, ForKind.PARALLEL, both)))
    assert _onehot(row, "parallel_type.") == "inner_spatial"


def test_gpu_binding_lengths():
    c = Buffer("C", "float32", (64, 32), "param")
    bx, tx = Var("bx"), Var("tx")
    store = BufferStore(c, const(1.0, "float32"), (bx, tx))
    inner = For(tx, const(32), 32, ForKind.THREAD_BINDING, store, "threadIdx.x")
    (row,) = extract_features(
        PrimFunc("k", (c,), For(bx, const(64), 64, ForKind.THREAD_BINDING, inner, "blockIdx.x"))
    )
    assert row[FEATURE_NAMES.index("is_gpu")] == 1.0
    assert _value(row, "blockIdx_x_len") == 64 and _value(row, "threadIdx_x_len") == 32
    assert _value(row, "threadIdx_y_len") == 1


def test_auto_unroll_from_state_and_determinism():
    dag = _gemm()
    state = default_schedule(dag, host_target())
    clear_feature_cache()
    feats = state_features(state)
    assert state_features(state) is feats
    again = extract_features(
        lower(state, "other"), {st.op.name: st.auto_unroll_max_step for st in state.stages}
    )
    np.testing.assert_array_equal(feats, again)
    steps = sorted({_value(r, "auto_unroll_max_step") for r in feats})
    assert 64 in steps
    np.testing.assert_array_equal(extract_features(lower(state)), extract_features(lower(state)))


def test_state_that_does_not_lower_gives_no_rows():
    dag = _gemm()
    sketch = State.initial(dag).split(2, 0, [None])
    assert state_features(sketch).shape == (0, 164)


def test_intensity_curve_rises_with_tiling():
    (row,) = [r for r in extract_features(_matmul_nest()) if r[0] > 0]
    curve = row[OFF_CURVE : OFF_CURVE + 10]
    assert (curve > 0).all() and np.all(np.diff(curve) >= -1e-6)
