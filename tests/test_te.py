import numpy as np
import pytest

from aotc import te
from aotc.te.reference import evaluate
from aotc.topi import nn


def _matmul_dag(m=16, n=12, k=8, a_name="A", b_name="B"):
    a = te.placeholder((m, k), name=a_name)
    b = te.placeholder((k, n), name=b_name)
    return te.ComputeDAG([nn.matmul(a, b)])


def test_topological_order_and_links():
    a = te.placeholder((4, 4), name="A")
    b = te.compute((4, 4), lambda i, j: a[i, j] * 2.0, name="B")
    c = te.compute((4, 4), lambda i, j: b[i, j] + a[i, j], name="C")
    dag = te.ComputeDAG([c])
    assert [op.name for op in dag.ops] == ["A", "B", "C"]
    assert dag.consumers[a] == [b, c]
    assert dag.producers[c] == [b, a]


def test_flop_count_matmul():
    assert _matmul_dag(16, 12, 8).flop_count == 2 * 16 * 12 * 8


def test_analysis_of_anchor_and_elementwise():
    x = te.placeholder((1, 8, 10, 10), name="x")
    w = te.placeholder((16, 8, 3, 3), name="w")
    conv = nn.conv2d_nchw(x, w, padding=1)
    out = nn.relu(conv)
    dag = te.ComputeDAG([out])
    pad = dag.ops[1]
    assert dag.analysis[conv].needs_multi_level_tiling
    assert not dag.analysis[out].needs_multi_level_tiling
    assert dag.analysis[out].is_output
    assert not dag.analysis[pad].is_strictly_inlineable  # has a branch
    assert dag.elementwise_match(conv, out)


def test_strictly_inlineable_and_expensive():
    x = te.placeholder((4, 8), name="x")
    add = te.compute((4, 8), lambda i, j: x[i, j] + 1.0, name="add")
    ex = te.compute((4, 8), lambda i, j: te.exp(add[i, j]), name="ex")
    tr = te.compute((8, 4), lambda i, j: ex[j, i], name="tr")
    dag = te.ComputeDAG([tr])
    assert dag.analysis[add].is_strictly_inlineable
    assert not dag.analysis[ex].is_strictly_inlineable
    assert dag.analysis[ex].has_expensive_op
    assert not dag.analysis[tr].is_strictly_inlineable  # output
    assert not dag.elementwise_match(ex, tr)  # transposed read


def test_fingerprint_ignores_names_but_not_shapes_or_dtypes():
    assert _matmul_dag().fingerprint == _matmul_dag(a_name="X", b_name="Y").fingerprint
    assert _matmul_dag().fingerprint != _matmul_dag(16, 12, 9).fingerprint
    a = te.placeholder((16, 8), "float64", name="A")
    b = te.placeholder((8, 12), "float64", name="B")
    assert te.ComputeDAG([nn.matmul(a, b)]).fingerprint != _matmul_dag().fingerprint


def _clamped_shift_dag(shift=1.0, low=0.0, offset=1, pad=-3.0, size=10):
    """out[i] = min(max(x[i + offset] * 2 + shift, low), 6), padded with `pad` past the end."""
    x = te.placeholder((size,), name="x")
    padded = te.compute(
        (size + 1,), lambda i: te.select(i < size, x[te.minimum(i, size - 1)], te.const(pad)), name="pad"
    )
    out = te.compute(
        (size,),
        lambda i: te.minimum(te.maximum(padded[i + offset] * 2.0 + shift, te.const(low)), te.const(6.0)),
        name="out",
    )
    return te.ComputeDAG([out])


def test_structure_key_leaves_out_value_constants_only():
    """Twins (other shift, bound, pad value) share a structure key and differ in fingerprint; a constant
    in an index or a loop bound is structure (another offset or size is another structure)."""
    base = _clamped_shift_dag()
    twin = _clamped_shift_dag(shift=-4.5, low=-2.0, pad=7.0)
    assert twin.fingerprint != base.fingerprint and twin.structure_key == base.structure_key
    assert len(base.structure_key) == 32 and base.structure_key != base.workload_key
    assert _clamped_shift_dag(offset=0).structure_key != base.structure_key
    assert _clamped_shift_dag(size=11).structure_key != base.structure_key
    assert _matmul_dag().structure_key == _matmul_dag(a_name="X").structure_key


def test_nested_reduction_is_rejected():
    x = te.placeholder((4, 4), name="x")
    k = te.reduce_axis(4, "k")
    with pytest.raises(te.TEError, match="outermost"):
        te.compute((4,), lambda i: te.sum(x[i, k.var], k) + 1.0, name="bad")


def test_dtype_mismatch_and_int_division_are_rejected():
    x = te.placeholder((4,), "int32", name="x")
    with pytest.raises(TypeError, match="dtypes differ"):
        te.compute((4,), lambda i: x[i] + 1.5)
    with pytest.raises(TypeError, match="floordiv"):
        te.compute((4,), lambda i: x[i] / x[i])


def test_reference_matches_numpy_for_matmul_and_conv():
    rng = np.random.default_rng(0)
    dag = _matmul_dag(5, 7, 3)
    a = rng.standard_normal((5, 3)).astype("float32")
    b = rng.standard_normal((3, 7)).astype("float32")
    (out,) = evaluate(dag, {"A": a, "B": b})
    np.testing.assert_allclose(out, a @ b, rtol=1e-5)

    x = te.placeholder((1, 2, 5, 5), name="x")
    w = te.placeholder((3, 2, 3, 3), name="w")
    dag = te.ComputeDAG([nn.conv2d_nchw(x, w, stride=2, padding=1)])
    xv = rng.standard_normal((1, 2, 5, 5)).astype("float32")
    wv = rng.standard_normal((3, 2, 3, 3)).astype("float32")
    (out,) = evaluate(dag, {"x": xv, "w": wv})
    padded = np.pad(xv, ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = np.zeros((1, 3, 3, 3), "float32")
    for f in range(3):
        for y in range(3):
            for z in range(3):
                ref[0, f, y, z] = np.sum(padded[0, :, 2 * y : 2 * y + 3, 2 * z : 2 * z + 3] * wv[f])
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
