"""Text form of a State, in the spirit of Ansor's `State::ToStr`."""

from __future__ import annotations

from aotc.schedule.state import Annotation, ComputeAtKind, State

_ANN = {
    Annotation.NONE: "for",
    Annotation.UNROLL: "unroll",
    Annotation.VECTORIZE: "vectorize",
    Annotation.PARALLEL: "parallel",
}


def state_str(state: State) -> str:
    lines: list[str] = []
    for i, st in enumerate(state.stages):
        if st.is_placeholder:
            lines.append(f"Placeholder: {st.name}")
            continue
        if st.compute_at == ComputeAtKind.INLINED:
            lines.append(f"{st.name} = ... (inlined)")
            continue
        where = ""
        if st.attach is not None:
            tid, uid = st.attach
            target = state.stages[tid]
            where = f" @ {target.name}.{target.iters[target.position(uid)].name}"
        extras = f" auto_unroll_max_step={st.auto_unroll_max_step}" if st.auto_unroll_max_step else ""
        lines.append(f"stage {i} {st.name}{where}{extras}:")
        for it in st.iters:
            kind = _ANN.get(it.annotation, it.annotation.name.lower())
            extent = "?" if it.extent is None else str(it.extent)
            lines.append(f"  {kind} {it.name} ({it.kind.name.lower()}) in 0..{extent}")
    return "\n".join(lines)
