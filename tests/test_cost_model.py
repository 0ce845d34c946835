"""The XGBoost cost model: ranking of measured schedules, warm-up, failures, persistence, metrics."""

import json
import os
import random
import statistics
import time

import numpy as np
import pytest

from aotc import te
from aotc.codegen.module import build_module, load_library
from aotc.schedule.default import default_schedule
from aotc.schedule.lower import infer_bound, lower
from aotc.schedule.state import IterKind, State
from aotc.schedule.tiling import follow_tiling, multi_level_tile
from aotc.search.common import ErrorCode, MeasureResult
from aotc.search.cost_model import (
    XGBCostModel,
    normalized_labels,
    pack,
    pack_sum_objective,
    pairwise_accuracy,
    recall_at_k,
)
from aotc.search.features import N_FEATURES, state_features
from aotc.target import host_target
from aotc.topi import nn

from .random_schedules import random_state


def _gemm():
    a = te.placeholder((128, 128), name="A")
    b = te.placeholder((128, 128), name="B")
    return te.ComputeDAG([nn.matmul(a, b)])


def _conv():
    x = te.placeholder((1, 32, 28, 28), name="x")
    w = te.placeholder((32, 32, 3, 3), name="w")
    return te.ComputeDAG([nn.conv2d_nchw(x, w, padding=1)])


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def _spatial_lengths(extent, rng):
    """Three inner tile lengths whose product divides `extent`."""
    while True:
        lengths = [rng.choice(_divisors(extent)[:4]), rng.choice(_divisors(extent)[:4])]
        lengths.append(rng.choice([d for d in _divisors(extent) if d <= 32]))
        if extent % int(np.prod(lengths)) == 0:
            return lengths


def _tiled_state(dag, rng):
    """An Ansor-like sketch (cache_write, SSRSRS tiles, compute_at) with random tiles and annotations."""
    s = State.initial(dag)
    sid = s.stage_id(dag.compute_ops[-1].name)
    s = s.cache_write(sid)
    local, out = sid, sid + 1
    op = s.stages[local].op
    lengths = {a.name: _spatial_lengths(a.extent, rng) for a in op.axes}
    lengths.update({a.name: [rng.choice(_divisors(a.extent))] for a in op.reduce_axes})
    s, spatial = multi_level_tile(s, local, "SSRSRS", lengths)
    s, at = follow_tiling(s, out, spatial, 2)
    s = s.compute_at(local, out, at)
    if rng.random() < 0.7:
        n_fused = rng.randint(1, len(spatial))
        if n_fused > 1:
            s = s.fuse(out, list(range(n_fused)))
        s = s.parallel(out, 0)
    if rng.random() < 0.7:
        bound = infer_bound(s)
        for st in (out, local):
            last = bound.stages[st].iters[-1]
            if last.kind == IterKind.SPATIAL and last.extent <= 64:
                s = s.vectorize(st, len(s.stages[st].iters) - 1)
    return s.pragma(local, 0, f"auto_unroll_max_step${rng.choice([0, 16, 64])}")


def _fixture_states(dag, n, seed):
    rng = random.Random(seed)
    states = [State.initial(dag), default_schedule(dag, host_target())]
    i = 0
    while len(states) < n:
        i += 1
        if i % 3:
            states.append(_tiled_state(dag, rng))
            continue
        s = random_state(dag, 1000 * seed + i)
        if max(st.auto_unroll_max_step for st in s.stages) <= 64:
            states.append(s)
    return states


def _seconds(run):
    """Median of 5 timings, each repeating the kernel for at least a millisecond."""
    start = time.perf_counter()
    run()
    once = time.perf_counter() - start
    reps = max(1, int(1e-3 / max(once, 1e-7)))
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(reps):
            run()
        times.append((time.perf_counter() - start) / reps)
    return statistics.median(times)


def _measure(dag, states, path):
    funcs = [lower(s, f"k{i}") for i, s in enumerate(states)]
    lib = load_library(build_module(funcs, host_target(), path))
    lib.set_num_threads(1)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(p.shape).astype(p.dtype) for p in dag.placeholders]
    outputs = [np.zeros(o.shape, o.dtype) for o in dag.outputs]
    return [_seconds(lib.kernel(f"k{i}").prepare(*inputs, *outputs)) for i in range(len(states))]


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """{workload key: (states, feature matrices, seconds)} for a GEMM and a conv."""
    tmp = tmp_path_factory.mktemp("cost-model")
    out = {}
    for name, make, n in (("gemm", _gemm, 72), ("conv", _conv, 60)):
        dag = make()
        states = _fixture_states(dag, n, seed=1)
        costs = _measure(dag, states, str(tmp / f"{name}.so"))
        out[dag.workload_key] = (dag, states, [state_features(s) for s in states], costs)
    return out


def _split(n, rng):
    idx = rng.permutation(n)
    cut = int(0.7 * n)
    return idx[:cut], idx[cut:]


def test_fixture_spans_a_wide_range(records):
    for _, _, feats, costs in records.values():
        assert max(costs) / min(costs) >= 10
        assert all(len(f) for f in feats)


def test_ranks_held_out_states_better_than_random(records):
    """Pairwise accuracy on held-out 30% (within each task), averaged over five random splits."""
    accuracies = []
    for split_seed in range(5):
        rng = np.random.default_rng(split_seed)
        model = XGBCostModel(num_warmup_sample=0, seed=split_seed)
        held_out = []
        for key, (_, _, feats, costs) in records.items():
            train, test = _split(len(feats), rng)
            model.add_training_data(key, [feats[i] for i in train], [costs[i] for i in train])
            held_out.append(([feats[i] for i in test], [costs[i] for i in test]))
        model.fit()
        per_task = [pairwise_accuracy(model.predict_features(f), c) for f, c in held_out]
        accuracies.append(float(np.mean(per_task)))
    assert np.mean(accuracies) > 0.7, accuracies


def test_update_and_predict_through_the_protocol(records):
    model = XGBCostModel(num_warmup_sample=10)
    for dag, states, _, costs in records.values():
        results = [MeasureResult([c]) for c in costs]
        results[3] = MeasureResult([], ErrorCode.RUNTIME_DEVICE)
        model.update(dag, states, results)
    assert model.booster is not None and model.trained_on == model.num_programs
    dag, states, _, costs = next(iter(records.values()))
    scores = model.predict(dag, states)
    assert scores.shape == (len(states),) and np.isfinite(scores).all()
    assert pairwise_accuracy(scores, costs) > 0.7  # seen data


def test_save_load_round_trip(records, tmp_path):
    model = XGBCostModel(num_warmup_sample=0)
    for key, (_, _, feats, costs) in records.items():
        model.add_training_data(key, feats, costs)
    dag, states, feats, _ = next(iter(records.values()))
    before = model.predict(dag, states)
    path = str(tmp_path / "model.json")
    model.save(path)
    with open(path) as fh:
        assert json.load(fh)["learner"]
    assert os.path.exists(path + ".meta.json")
    loaded = XGBCostModel()
    loaded.load(path)
    np.testing.assert_allclose(loaded.predict(dag, states), before, rtol=1e-6, atol=1e-7)
    loaded.add_training_data(dag.workload_key, feats[:5], [1.0] * 5)
    assert loaded.booster is not None and loaded.trained_on == 0  # too little new data to retrain


def test_warm_up_gives_random_scores(records):
    dag, states, feats, costs = next(iter(records.values()))
    model = XGBCostModel(num_warmup_sample=64, seed=5)
    model.add_training_data(dag.workload_key, feats[:20], costs[:20])
    assert model.booster is None
    a, b = model.predict(dag, states[:10]), model.predict(dag, states[:10])
    assert ((a >= 0) & (a < 1)).all() and not np.array_equal(a, b)


def test_failed_lowering_scores_minus_infinity(records):
    dag, states, feats, costs = next(iter(records.values()))
    sketch = State.initial(dag).split(2, 0, [None])
    untrained = XGBCostModel()
    assert untrained.predict(dag, [sketch, states[0]])[0] == -np.inf
    model = XGBCostModel(num_warmup_sample=0)
    model.add_training_data(dag.workload_key, feats, costs)
    scores = model.predict(dag, [states[0], sketch])
    assert np.isfinite(scores[0]) and scores[1] == -np.inf


def test_adaptive_retraining_waits_for_twenty_percent_more_data():
    rng = np.random.default_rng(0)

    def programs(n):
        feats = [rng.random((2, N_FEATURES), dtype=np.float32) for _ in range(n)]
        return feats, [float(f[:, 0].sum()) + 0.1 for f in feats]

    model = XGBCostModel(num_warmup_sample=0, max_rounds=5)
    model.add_training_data("t", *programs(600))
    assert model.trained_on == 600
    model.add_training_data("t", *programs(100))
    assert model.trained_on == 600
    model.add_training_data("t", *programs(30))
    assert model.trained_on == 730


def test_labels_and_pack_sum_objective():
    np.testing.assert_allclose(normalized_labels([2.0, 1.0, 4.0, 1e10, np.inf]), [0.5, 1.0, 0.25, 0.0, 0.0])
    packed = pack([np.ones((2, N_FEATURES)), np.ones((1, N_FEATURES))])
    assert packed.pack_ids.tolist() == [0, 0, 1] and packed.n_packs == 2
    labels = np.array([0.5, 0.5, 1.0])
    grad, hess = pack_sum_objective(packed.pack_ids, labels, labels)(np.array([0.1, 0.2, 0.4]), None)
    np.testing.assert_allclose(grad, [(0.3 - 0.5) * 0.5, (0.3 - 0.5) * 0.5, (0.4 - 1.0) * 1.0])
    np.testing.assert_allclose(hess, labels)


def test_ranking_metrics():
    costs = [1.0, 2.0, 3.0, 4.0]
    assert pairwise_accuracy([4, 3, 2, 1], costs) == 1.0
    assert pairwise_accuracy([1, 2, 3, 4], costs) == 0.0
    assert pairwise_accuracy([1, 1, 1, 1], costs) == 0.5
    assert recall_at_k([4, 3, 2, 1], costs, 2) == 1.0
    assert recall_at_k([1, 2, 3, 4], costs, 2) == 0.0
    assert recall_at_k([4, 1, 3, 2], costs, 2) == 0.5


def test_warm_start_adds_every_group_then_trains_once(monkeypatch):
    dag = _gemm()
    states = _fixture_states(dag, 8, seed=2)
    costs = [1e-3 * (i + 1) for i in range(len(states))]
    model = XGBCostModel(num_warmup_sample=4, nthread=1)
    fits = []
    monkeypatch.setattr(model, "fit", lambda: fits.append(model.num_programs))
    added = model.warm_start([("a", states[:4], costs[:4]), ("b", states[4:], costs[4:])])
    assert added == model.num_programs == len(states)
    assert set(model.tasks) == {"a", "b"} and model.num_warmup_sample == 4
    assert fits == [len(states)]  # once, with every group in it
