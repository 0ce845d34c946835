import json

import pytest

from aotc import te
from aotc.ir.printer import func_str
from aotc.schedule.lower import infer_bound, lower
from aotc.schedule.state import ScheduleError, State
from aotc.schedule.steps import replay, steps_from_json, steps_to_json
from aotc.topi import nn

from .random_schedules import random_state


def _structure(state):
    return [
        (st.op.name, st.iters, st.relations, st.compute_at, st.attach, st.auto_unroll_max_step)
        for st in state.stages
    ]


def _dense_relu():
    a = te.placeholder((33, 20), name="A")
    w = te.placeholder((17, 20), name="W")
    return te.ComputeDAG([nn.relu(nn.dense(a, w))])


def _conv():
    x = te.placeholder((1, 4, 9, 9), name="x")
    w = te.placeholder((6, 2, 3, 3), name="w")
    return te.ComputeDAG([nn.conv2d_nchw(x, w, stride=2, padding=1, groups=2)])


@pytest.mark.parametrize("seed", range(40))
def test_random_state_json_round_trip_and_replay(seed):
    dag = _dense_relu() if seed % 2 else _conv()
    state = random_state(dag, seed)
    text = json.dumps(steps_to_json(state.steps))
    steps = steps_from_json(json.loads(text))
    assert json.dumps(steps_to_json(steps)) == text
    again = replay(dag, steps)
    assert _structure(again) == _structure(state)
    assert str(again) == str(state)
    assert func_str(lower(again)) == func_str(lower(state))


def test_replay_on_a_fresh_dag_gives_identical_loop_text():
    state = random_state(_conv(), 7)
    records = json.loads(json.dumps(steps_to_json(state.steps)))
    fresh = replay(_conv(), steps_from_json(records))
    assert func_str(lower(fresh)) == func_str(lower(state))


def test_split_records_extent_and_infer_bound_fills_compute_at_extents():
    dag = _dense_relu()
    s = State.initial(dag).cache_write(2)
    s = s.split(3, 0, [8]).split(3, 2, [4]).reorder(3, [0, 2, 1, 3])
    s = s.compute_at(2, 3, 1)
    assert all(it.extent is None for it in s.stages[2].iters)
    filled = infer_bound(s)
    assert [it.extent for it in filled.stages[2].iters] == [8, 4, 20]
    assert s.steps[0].to_record() == ["CHW", 2, "local"]
    assert s.steps[1].to_record() == ["SP", 3, 0, 33, [8], 1]


def test_fuse_then_split_tracks_attach_point():
    dag = _dense_relu()
    s = State.initial(dag)
    s = s.fuse(3, [0, 1]).split(3, 0, [16])
    s = s.compute_at(2, 3, 0)
    s2 = s.split(3, 0, [2])
    target = s2.stages[3]
    attach_iter = target.iters[target.position(s2.stages[2].attach[1])]
    assert attach_iter.name == "ax0@ax1.0.1"


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda s: s.split(7, 0, [2]), "stage 7 out of range"),
        (lambda s: s.split(3, 5, [2]), "iterator 5 out of range"),
        (lambda s: s.split(0, 0, [2]), "placeholder"),
        (lambda s: s.split(3, 0, [0]), "positive integers"),
        (lambda s: s.reorder(3, [0, 0]), "permutation"),
        (lambda s: s.fuse(2, [0, 2]), "consecutive"),
        (lambda s: s.compute_at(2, 2, 0), "not a consumer"),
        (lambda s: s.compute_at(3, 2, 0), "must stay at root"),
        (lambda s: s.compute_inline(2), "reduction"),
        (lambda s: s.compute_inline(3), "output"),
        (lambda s: s.parallel(2, 2), "reduce iterator"),
        (lambda s: s.rfactor(2, 0, 0), "not a reduction iterator"),
        (lambda s: s.pragma(2, 0, "auto_unroll_max_step$x"), "auto_unroll_max_step"),
        (lambda s: s.follow_split(3, 0, 0, 2), "not a split step"),
    ],
)
def test_invalid_steps_raise_schedule_error_naming_the_step(make, message):
    s = State.initial(_dense_relu())
    with pytest.raises(ScheduleError, match=message):
        make(s)


def test_malformed_records_are_rejected():
    with pytest.raises(ScheduleError):
        steps_from_json([["XX", 1]])
    with pytest.raises(ScheduleError):
        steps_from_json([["SP", 1, "a"]])


def test_sketch_with_undefined_lengths_cannot_be_lowered():
    s = State.initial(_dense_relu()).split(2, 0, [None])
    assert not s.concrete
    with pytest.raises(ScheduleError, match="undefined"):
        lower(s)


def test_follow_split_reuses_lengths():
    s = State.initial(_dense_relu())
    s = s.split(3, 0, [4, 2])
    assert [it.extent for it in s.follow_split(2, 0, 0, 1).stages[2].iters[:2]] == [5, 8]
    assert [it.extent for it in s.follow_split(2, 0, 0, 2).stages[2].iters[:3]] == [5, 4, 2]
    assert [it.extent for it in s.follow_split(2, 0, 0, 3).stages[2].iters[:4]] == [5, 4, 2, 1]
    s = s.follow_fused_split(2, 1, [0], 1, True)
    assert [it.extent for it in s.stages[2].iters[:3]] == [33, 9, 2]


_RECORD_SCRIPT = """
import json, sys
sys.path.insert(0, {root!r})
from tests.random_schedules import random_state
from tests.test_schedule import _conv
from aotc.schedule.steps import steps_to_json
from aotc.schedule.lower import lower
from aotc.ir.printer import func_str
state = random_state(_conv(), 11)
print(json.dumps({{"steps": steps_to_json(state.steps), "text": func_str(lower(state))}}))
"""


def test_a_record_from_another_process_replays_to_the_same_loop_text():
    import pathlib
    import subprocess
    import sys

    root = str(pathlib.Path(__file__).parent.parent)
    out = subprocess.run(
        [sys.executable, "-c", _RECORD_SCRIPT.format(root=root)], capture_output=True, text=True, check=True
    )
    recorded = json.loads(out.stdout)
    state = replay(_conv(), steps_from_json(recorded["steps"]))
    assert func_str(lower(state)) == recorded["text"]
