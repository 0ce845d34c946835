"""The untuned schedule of a task: what a build compiles where no record exists, and each task's first
candidate in a tuning. A CPU's is aotc.schedule.default's; a GPU's is the best of the tiling heuristic's
programs that the GPU codegen accepts within the target's limits, else the untiled schedule
(aotc.schedule.default_gpu), which every GPU runs.
"""

from __future__ import annotations

from aotc.schedule.default import default_schedule
from aotc.schedule.default_gpu import tiled_gpu_candidates, untiled_gpu_schedule
from aotc.schedule.lower import lower
from aotc.schedule.state import ScheduleError, State
from aotc.target import Target
from aotc.te.dag import ComputeDAG


def untuned_schedule(dag: ComputeDAG, target: Target) -> State:
    if not target.is_gpu:
        return default_schedule(dag, target)
    for state in tiled_gpu_candidates(dag, target):
        if gpu_program_error(state, target) is None:
            return state
    return untiled_gpu_schedule(dag, target)


def gpu_program_error(state: State, target: Target) -> str | None:
    """Why `state` does not lower, or the GPU codegen refuses its program for `target`; None if valid."""
    from aotc.codegen.gpu import GPUCodegenError, emit_gpu

    try:
        emit_gpu(lower(state, "untuned"), target)
    except (ScheduleError, GPUCodegenError) as err:
        return str(err)
    return None
