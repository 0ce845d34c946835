"""Measurer: valid candidates are timed, and wrong, crashing, hanging or invalid ones become error results."""

import dataclasses
import os

import pytest

from aotc import te
from aotc.ir.expr import Load, Var, const
from aotc.ir.stmt import BufferStore, For, ForKind, PrimFunc, Seq
from aotc.schedule.lower import lower
from aotc.schedule.state import Annotation, State
from aotc.schedule.steps import AnnotationStep
from aotc.schedule.tiling import follow_tiling, multi_level_tile
from aotc.search.common import ErrorCode
from aotc.search.measure import MeasureError, MeasureOptions, Measurer
from aotc.target import host_target, parse_target
from aotc.topi import nn

from .random_schedules import random_state

FAST = {"min_repeat_ms": 2.0, "repeat": 2, "n_build_workers": 2}


def matmul_relu(n: int = 32, relu: bool = True) -> te.ComputeDAG:
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    c = nn.matmul(a, b)
    return te.ComputeDAG([nn.relu(c) if relu else c])


def tiled_state(dag: te.ComputeDAG) -> State:
    """Ansor's CPU sketch for matmul + relu: SSRSRS tiles, relu fused at the second level, parallel."""
    s = State.initial(dag)
    op = s.stages[2].op
    (i, j), k = (a.name for a in op.axes), op.reduce_axes[0].name
    s, spatial = multi_level_tile(s, 2, "SSRSRS", {i: [1, 2, 4], j: [1, 1, 8], k: [8]})
    s, at = follow_tiling(s, 3, spatial, 2)
    s = s.compute_at(2, 3, at).fuse(3, [0, 1]).parallel(3, 0)
    return s.vectorize(2, len(s.stages[2].iters) - 1)


def naive_func(dag: te.ComputeDAG) -> PrimFunc:
    return lower(State.initial(dag), "f")


def crash_func(dag: te.ComputeDAG) -> PrimFunc:
    """Stores 128 GiB past the output: the runner process segfaults."""
    f = naive_func(dag)
    far = BufferStore(f.params[-1], const(1.0, "float32"), (const(1 << 30), const(0)))
    return dataclasses.replace(f, body=far)


def hang_func(dag: te.ComputeDAG) -> PrimFunc:
    """A 2**62-iteration float recurrence that LLVM cannot fold: never finishes."""
    f = naive_func(dag)
    out = f.params[-1]
    i = Var("i")
    acc = Load(out, (const(0), const(0)))
    step = BufferStore(out, acc * const(1.0000001, "float32") + const(0.5, "float32"), (const(0), const(0)))
    loop = For(i, const(1 << 62), 1 << 62, ForKind.SERIAL, step)
    return dataclasses.replace(f, body=loop)


def write_input_func(dag: te.ComputeDAG) -> PrimFunc:
    """Writes into input A (read-only in the runner), then computes the right answer."""
    f = naive_func(dag)
    poke = BufferStore(f.params[0], const(0.0, "float32"), (const(0), const(0)))
    return dataclasses.replace(f, body=Seq((poke, f.body)))


@pytest.fixture(scope="module")
def dag():
    return matmul_relu()


@pytest.fixture(scope="module")
def measurer(dag):
    with Measurer(dag, host_target(), MeasureOptions(timeout=3.0, **FAST)) as m:
        yield m


def test_valid_states_are_timed(dag, measurer):
    states = [State.initial(dag), tiled_state(dag)] + [random_state(dag, seed) for seed in range(6)]
    results = measurer.measure(states)
    assert [r.error for r in results] == [ErrorCode.NO_ERROR] * len(states), [r.error_msg for r in results]
    for r in results:
        assert len(r.costs) == 2 and all(c > 0 for c in r.costs)
        assert r.build_seconds > 0 and r.run_seconds > 0
    batch = measurer.last_batch
    assert batch.candidates == len(states)
    assert sum(r.build_seconds for r in results) == pytest.approx(batch.build_seconds)
    assert sum(r.run_seconds for r in results) <= batch.run_seconds


def test_candidates_slower_than_the_cutoff_get_one_checked_run(dag, measurer):
    states = [tiled_state(dag), random_state(dag, 1)]
    results = measurer.measure(states, cutoff_seconds=0.0)
    assert all(r.error == ErrorCode.NO_ERROR and len(r.costs) == 1 for r in results)
    assert all(len(r.costs) == 2 for r in measurer.measure(states, cutoff_seconds=1e9))


def test_invalid_steps_are_instantiation_errors_in_order(dag, measurer):
    bad_stage = dataclasses.replace(State.initial(dag), steps=(AnnotationStep(9, 0, Annotation.PARALLEL),))
    sketch = State.initial(dag).split(2, 0, [None])
    other_dag = State.initial(matmul_relu(16))
    results = measurer.measure([State.initial(dag), bad_stage, sketch, other_dag, tiled_state(dag)])
    errors = [r.error for r in results]
    assert errors == [
        ErrorCode.NO_ERROR,
        ErrorCode.INSTANTIATION_ERROR,
        ErrorCode.INSTANTIATION_ERROR,
        ErrorCode.INSTANTIATION_ERROR,
        ErrorCode.NO_ERROR,
    ]
    assert "stage 9 out of range" in results[1].error_msg
    assert "undefined split lengths" in results[2].error_msg
    assert "belongs to" in results[3].error_msg
    assert results[1].costs == [] and results[1].mean_cost == 1e10


def test_wrong_kernels_are_caught(dag, measurer):
    no_relu = naive_func(matmul_relu(relu=False))
    writes_nothing = dataclasses.replace(naive_func(dag), body=Seq(()))
    results = measurer.measure_funcs([no_relu, writes_nothing, naive_func(dag)])
    assert [r.error for r in results] == [ErrorCode.WRONG_ANSWER, ErrorCode.WRONG_ANSWER, ErrorCode.NO_ERROR]
    assert (
        "output relu: " in results[0].error_msg and "differ from the naive schedule" in results[0].error_msg
    )
    assert f"{32 * 32} of {32 * 32} elements differ" in results[1].error_msg


def test_crash_and_hang_are_isolated(dag, measurer):
    results = measurer.measure_funcs(
        [crash_func(dag), naive_func(dag), hang_func(dag), write_input_func(dag)]
    )
    assert [r.error for r in results] == [
        ErrorCode.RUNTIME_DEVICE,
        ErrorCode.NO_ERROR,
        ErrorCode.RUN_TIMEOUT,
        ErrorCode.RUNTIME_DEVICE,
    ], [r.error_msg for r in results]
    assert "SIGSEGV" in results[0].error_msg
    assert "within 3 s" in results[2].error_msg
    after = measurer.measure([tiled_state(dag), State.initial(dag)])
    assert all(r.ok for r in after)


def test_signature_mismatch_and_codegen_error(dag, measurer):
    other_shape = naive_func(matmul_relu(16))
    f = naive_func(dag)
    twice = dataclasses.replace(f, params=(f.params[0], f.params[0], f.params[2]))
    results = measurer.measure_funcs([other_shape, twice])
    assert [r.error for r in results] == [ErrorCode.COMPILE_DEVICE, ErrorCode.COMPILE_HOST]
    assert "differ from the task's" in results[0].error_msg
    assert "same buffer twice" in results[1].error_msg


def test_build_timeout_restarts_the_builder(dag):
    """An 8192-term expression takes LLVM seconds to compile (about 2.5 s here); the limit is 1 s."""
    f = naive_func(dag)
    a = f.params[0]
    terms = [
        Load(a, (const(i % 32), const(i // 32 % 32))) * const(1.0 + i, "float32") for i in range(1 << 13)
    ]
    while len(terms) > 1:
        terms = [x + y for x, y in zip(terms[::2], terms[1::2])]
    huge = dataclasses.replace(f, body=BufferStore(f.params[-1], terms[0], (const(0), const(0))))
    opts = MeasureOptions(build_timeout=1.0, **{**FAST, "n_build_workers": 1})
    with Measurer(dag, host_target(), opts) as m:
        results = m.measure_funcs([huge, naive_func(dag)])
    assert [r.error for r in results] == [ErrorCode.BUILD_TIMEOUT, ErrorCode.NO_ERROR]


def test_flush_cache_fixed_number_and_no_check(dag):
    opts = MeasureOptions(flush_cache=True, number=2, repeat=3, check_correctness=False, n_build_workers=1)
    with Measurer(dag, host_target(), opts) as m:
        results = m.measure_funcs([naive_func(matmul_relu(relu=False))])
        results += m.measure([tiled_state(dag)])
    assert all(r.ok and len(r.costs) == 3 for r in results)


def test_closed_measurer_and_bad_arguments(dag, monkeypatch):
    import shutil

    from aotc import emulator

    with pytest.raises(ValueError, match="repeat"):
        MeasureOptions(repeat=0)
    which = shutil.which
    monkeypatch.setattr(emulator.shutil, "which", lambda name: None if name == "qemu-arm" else which(name))
    # qemu-arm is named among what is missing (a host without the apt packages also lacks the cross gcc)
    with pytest.raises(
        ValueError, match="cannot run on this .* qemu-arm(, [^ ]+)* is missing .*apt-get install qemu-user"
    ):
        Measurer(dag, parse_target("llvm -mtriple=armv7a-linux-gnueabihf"))
    m = Measurer(dag, host_target(), MeasureOptions(n_build_workers=1))
    m.close()
    with pytest.raises(MeasureError, match="closed"):
        m.measure([State.initial(dag)])


def marking_runner_main(conn, env, setup):
    """A runner of one's own (as a remote device's would be): this CPU's, leaving a mark of its setup."""
    from aotc.search.timing import runner_main

    with open(os.environ["AOTC_TEST_RUNNER_MARK"], "a") as f:
        f.write(f"{setup.target} {setup.n_inputs} {os.path.basename(setup.reference)}\n")
    runner_main(conn, env, setup)


def test_a_runner_of_ones_own_plugs_in(dag, tmp_path, monkeypatch):
    """`MeasureOptions.runner` replaces the runner: candidates are checked and timed by it."""
    monkeypatch.setenv("AOTC_TEST_RUNNER_MARK", str(tmp_path / "mark"))
    options = MeasureOptions(runner=marking_runner_main, **FAST)
    with Measurer(dag, host_target(), options) as m:
        ok, wrong = m.measure_funcs([naive_func(dag), write_input_func(dag)])
        (tiled,) = m.measure([tiled_state(dag)])
    assert ok.error == ErrorCode.NO_ERROR and len(ok.costs) == 2
    assert tiled.error == ErrorCode.NO_ERROR
    assert wrong.error != ErrorCode.NO_ERROR
    marks = (tmp_path / "mark").read_text().splitlines()  # again after the input write killed it
    assert marks and all(m.startswith(f"{host_target()} 2 ") for m in marks)
