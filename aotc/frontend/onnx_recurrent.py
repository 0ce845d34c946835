"""ONNX frontend: Recurrent and control-flow operators (RNN, GRU, LSTM, Scan, If, Loop) with static trip counts.

All of them are unrolled at conversion into existing graph ops: RNN, GRU and LSTM over the (static) sequence
length, one dense product and a few element-wise ops per step and direction; Scan and Loop by converting their
body once per iteration with its inputs bound to the values of that iteration (`convert_subgraph`); If by
converting the branch its condition, folded at build time, selects.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx

from aotc.frontend.onnx import OnnxConverter, OnnxNode, converts, onnx_axis
from aotc.graph.ir import Value

VERSIONS: dict[str, tuple[int, ...]] = {
    # RNN/GRU/LSTM-7 dropped output_sequence (Y is output whenever it is named); 14: layout (batch first);
    # 22: bfloat16 (refused as a type). No version changes the equations.
    "RNN": (7, 14, 22),
    "GRU": (7, 14, 22),
    "LSTM": (7, 14, 22),
    # 8: a leading batch axis on every input and output, and sequence_lens (refused unless every length is
    #    the full one); 9: no batch axis, scan_input/output_axes and _directions; 11: negative axes;
    # 16 to 25: more element types only.
    "Scan": (8, 9, 11, 16, 19, 21, 23, 24, 25),
    # 11: the branches' outputs may differ in shape; 13 and 16: sequence and optional outputs (refused
    # here: not tensors); later versions: more element types only.
    "If": (1, 11, 13, 16, 19, 21, 23, 24, 25),
    # 11: reworded (the body's inputs and outputs are distinct variables: the same semantics); 13 and 16:
    # sequence and optional loop-carried values (refused: not tensors); later versions: more types only.
    "Loop": (1, 11, 13, 16, 19, 21, 23, 24, 25),
}
"""ONNX operator -> the versions of it that this module converts (merged into aotc.frontend.onnx.VERSIONS)."""

LOOP_UNROLL_LIMIT = 4096
"""The most iterations a Loop is unrolled to: one whose condition stays true past it is refused."""


# --- shape helpers --------------------------------------------------------------------------------------------


def _cut(cv: OnnxConverter, x: Value, axis: int, start: int, stop: int, out: str | None = None) -> Value:
    """x[..., start:stop, ...] along `axis`."""
    shape = x.type.shape
    if (start, stop) == (0, shape[axis]) and out is None:
        return x
    begin = tuple(start if d == axis else 0 for d in range(len(shape)))
    end = tuple(stop if d == axis else s for d, s in enumerate(shape))
    return cv.emit("strided_slice", [x], {"begin": begin, "end": end, "strides": (1,) * len(shape)}, out)


def _reshape(cv: OnnxConverter, x: Value, shape: Sequence[int], out: str | None = None) -> Value:
    shape = tuple(int(s) for s in shape)
    if shape == x.type.shape and out is None:
        return x
    return cv.emit("reshape", [x], {"shape": shape}, out)


def _index(cv: OnnxConverter, x: Value, axis: int, i: int) -> Value:
    """x[..., i, ...] along `axis`, that axis dropped."""
    shape = x.type.shape
    return _reshape(cv, _cut(cv, x, axis, i, i + 1), shape[:axis] + shape[axis + 1 :])


def _stack(cv: OnnxConverter, parts: Sequence[Value], axis: int, out: str | None = None) -> Value:
    """The parts (of one type) stacked along a new axis `axis`."""
    shape = parts[0].type.shape
    grown = [_reshape(cv, p, (*shape[:axis], 1, *shape[axis:])) for p in parts]
    if len(grown) == 1:
        return cv.emit("identity", grown, out=out) if out is not None else grown[0]
    return cv.emit("concat", grown, {"axis": axis}, out)


def _out(n: OnnxNode, i: int) -> str | None:
    """The name of output `i` of `n`, None when it is absent or left empty."""
    return n.outputs[i] if i < len(n.outputs) and n.outputs[i] else None


# --- RNN, GRU, LSTM -------------------------------------------------------------------------------------------

_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_DEFAULT_ACTIVATIONS = {"RNN": ("Tanh",), "GRU": ("Sigmoid", "Tanh"), "LSTM": ("Sigmoid", "Tanh", "Tanh")}
_ACTIVATIONS: dict[str, tuple[bool, bool, float | None, float | None]] = {
    # lower-case name -> (takes alpha, takes beta, default alpha, default beta); no default: it must be given
    "relu": (False, False, None, None),
    "tanh": (False, False, None, None),
    "sigmoid": (False, False, None, None),
    "softsign": (False, False, None, None),
    "softplus": (False, False, None, None),
    "affine": (True, True, None, None),
    "leakyrelu": (True, False, 0.01, None),
    # ThresholdedRelu's operator default is 1.0, but onnxruntime's recurrent kernels read another: refused
    "thresholdedrelu": (True, False, None, None),
    "scaledtanh": (True, True, None, None),
    "hardsigmoid": (True, True, 0.2, 0.5),
    "elu": (True, False, 1.0, None),
}
Activation = tuple[str, float | None, float | None]


def _activations(cv: OnnxConverter, n: OnnxNode, directions: int) -> list[list[Activation]]:
    """Each direction's activation functions (f; f, g; f, g, h), with their alpha and beta. As onnxruntime
    reads them, activation_alpha and activation_beta are consumed in the order of the functions, each value
    by the next function that takes one; a function without one takes its ONNX operator's default (Affine,
    ScaledTanh and ThresholdedRelu have none that onnxruntime agrees on: theirs must be given)."""
    per = len(_DEFAULT_ACTIVATIONS[n.op_type])
    names = n.attr("activations")
    if names is None:
        names = list(_DEFAULT_ACTIVATIONS[n.op_type]) * directions
    if len(names) != per * directions:
        raise cv.fail(f"{len(names)} activations; {n.op_type} takes {per} per direction ({per * directions})")
    alphas, betas = list(n.attr("activation_alpha", [])), list(n.attr("activation_beta", []))
    chosen: list[Activation] = []
    for name in names:
        key = name.lower()
        if key not in _ACTIVATIONS:
            raise cv.fail(f"activation {name!r} is not one of {', '.join(_ACTIVATIONS)} (case-insensitive)")
        takes_alpha, takes_beta, alpha, beta = _ACTIVATIONS[key]
        if takes_alpha and alphas:
            alpha = float(alphas.pop(0))
        if takes_beta and betas:
            beta = float(betas.pop(0))
        if (takes_alpha and alpha is None) or (takes_beta and beta is None):
            raise cv.fail(f"activation {name} needs activation_alpha and activation_beta values")
        chosen.append((key, alpha, beta))
    if alphas or betas:
        raise cv.fail(
            f"activation_alpha/activation_beta have {len(alphas)}/{len(betas)} values more than the "
            f"activations {names} take"
        )
    return [chosen[d * per : (d + 1) * per] for d in range(directions)]


def _activate(cv: OnnxConverter, fn: Activation, x: Value) -> Value:
    name, alpha, beta = fn
    dtype = x.type.dtype

    def const(value: float, hint: str) -> Value:
        return cv.constant(value, hint, dtype)

    if name in ("relu", "tanh", "sigmoid", "softplus"):
        return cv.emit(name, [x])
    if name == "affine":
        return cv.emit("add", [cv.emit("multiply", [x, const(alpha, "alpha")]), const(beta, "beta")])
    if name == "leakyrelu":
        return cv.emit("leaky_relu", [x], {"alpha": alpha})
    if name == "thresholdedrelu":
        above = cv.emit("greater", [x, const(alpha, "alpha")])
        return cv.emit("where", [above, x, const(0, "zero")])
    if name == "scaledtanh":
        return cv.emit(
            "multiply",
            [cv.emit("tanh", [cv.emit("multiply", [x, const(beta, "beta")])]), const(alpha, "alpha")],
        )
    if name == "hardsigmoid":
        return cv.emit("hard_sigmoid", [x], {"alpha": alpha, "beta": beta})
    if name == "elu":
        return cv.emit("elu", [x], {"alpha": alpha})
    # softsign
    return cv.emit("divide", [x, cv.emit("add", [const(1, "one"), cv.emit("abs", [x])])])


@converts("RNN", "GRU", "LSTM")
def _recurrent(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """Unrolled over the sequence: per step and direction, the gates' pre-activations are the input's
    projection (one dense product over all steps, with both biases) plus the previous hidden state's
    (one dense product), clipped to [-clip, clip] when clip is set, then activated, as ONNX's equations
    write them. With sequence_lens, a step at or past a sequence's length leaves its state as it was and
    writes zeros to Y (the lengths may be fed at run time: the masks are computed from them)."""
    kind = n.op_type
    x, w, r = n.inputs[:3]
    b, lens, h0, c0, peep = (n.input(i) for i in range(3, 8))
    dtype = x.type.dtype
    if dtype not in ("float32", "float64"):
        raise cv.fail(f"{kind} is computed on float32 and float64 tensors here, got {dtype}")
    for i, v in ((1, w), (2, r), (3, b), (5, h0), (6, c0), (7, peep)):
        if v is not None and v.type.dtype != dtype:
            raise cv.fail(f"input {i} ({v.name}) is {v.type.dtype}; X is {dtype}")
    layout = n.attr("layout", 0)
    if layout not in (0, 1) or len(x.type.shape) != 3:
        raise cv.fail(f"X must be 3-D and layout 0 or 1, got {x.type} and layout {layout}")
    if layout:
        x = cv.emit("transpose", [x], {"perm": (1, 0, 2)})
    steps, batch, size = x.type.shape
    if not steps * batch * size:
        raise cv.fail(f"X {x.type} is empty; aotc compiles tensors with at least one element")
    direction = n.attr("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise cv.fail(f"direction must be forward, reverse or bidirectional, got {direction!r}")
    reverse = [False, True] if direction == "bidirectional" else [direction == "reverse"]
    dirs, gates = len(reverse), _GATES[kind]
    hidden = r.type.shape[-1] if len(r.type.shape) == 3 else 0
    if n.attr("hidden_size", hidden) != hidden:
        raise cv.fail(f"hidden_size {n.attr('hidden_size')} disagrees with R {r.type}")
    expected = {
        1: (w, (dirs, gates * hidden, size)),
        2: (r, (dirs, gates * hidden, hidden)),
        3: (b, (dirs, 2 * gates * hidden)),
        5: (h0, (batch, dirs, hidden) if layout else (dirs, batch, hidden)),
        6: (c0, (batch, dirs, hidden) if layout else (dirs, batch, hidden)),
        7: (peep, (dirs, 3 * hidden)),
    }
    for i, (v, shape) in expected.items():
        if v is not None and v.type.shape != shape:
            raise cv.fail(
                f"input {i} ({v.name}) is {v.type}; {kind} with X {x.type} needs shape {list(shape)}"
            )
    if kind != "LSTM" and c0 is not None:
        raise cv.fail("initial_c is an LSTM input")
    clip = n.attr("clip")
    if clip is not None and not clip > 0:
        raise cv.fail(f"clip must be positive, got {clip}")
    masks = _step_masks(cv, n, lens, steps, batch)
    acts = _activations(cv, n, dirs)
    h0, c0 = (
        cv.emit("transpose", [v], {"perm": (1, 0, 2)}) if layout and v is not None else v for v in (h0, c0)
    )
    flat = _reshape(cv, x, (steps * batch, size))
    zeros = cv.constant(np.zeros((batch, hidden), dtype), "zeros")
    ys, hs, cs = [], [], []
    for d, backward in enumerate(reverse):
        cell = _Cell(cv, n, d, w, r, b, peep, hidden, clip, acts[d])
        proj = _reshape(cv, cell.project(flat), (steps, batch, gates * hidden))
        h = _index(cv, h0, 0, d) if h0 is not None else zeros
        c = _index(cv, c0, 0, d) if c0 is not None else zeros
        outs: list[Value | None] = [None] * steps
        for t in reversed(range(steps)) if backward else range(steps):
            h_new, c_new = cell.step(_index(cv, proj, 0, t), h, c)
            if masks is None:
                h, c, outs[t] = h_new, c_new, h_new
            else:
                outs[t] = _select(cv, masks[t], h_new, zeros)
                h = _select(cv, masks[t], h_new, h)
                c = _select(cv, masks[t], c_new, c) if kind == "LSTM" else c
        if masks is not None:
            # as onnxruntime gives them, the final states of an empty sequence are zeros (not the initial ones)
            h, c = _select(cv, masks[-1], h, zeros), _select(cv, masks[-1], c, zeros)
        ys.append(_stack(cv, outs, 0))
        hs.append(h)
        cs.append(c)
    y = _stack_directions(cv, ys, 1, (2, 0, 1, 3) if layout else None, _out(n, 0))
    results = [y, _stack_directions(cv, hs, 0, (1, 0, 2) if layout else None, _out(n, 1))]
    if kind == "LSTM":
        results.append(_stack_directions(cv, cs, 0, (1, 0, 2) if layout else None, _out(n, 2)))
    return results


def _select(cv: OnnxConverter, mask: Value, a: Value, b: Value) -> Value:
    """where(mask, a, b), or a or b itself when a constant mask picks it everywhere."""
    if mask.is_constant and (mask.data.all() or not mask.data.any()):
        return a if mask.data.all() else b
    return cv.emit("where", [mask, a, b])


def _stack_directions(
    cv: OnnxConverter, parts: list[Value], axis: int, perm: tuple[int, ...] | None, out: str | None
) -> Value:
    """Each direction's result stacked on the num_directions axis, then transposed for layout 1."""
    if perm is None:
        return _stack(cv, parts, axis, out)
    return cv.emit("transpose", [_stack(cv, parts, axis)], {"perm": perm}, out)


def _step_masks(
    cv: OnnxConverter, n: OnnxNode, lens: Value | None, steps: int, batch: int
) -> list[Value] | None:
    """Per step, [batch, 1] booleans: whether the step is within each sequence, then whether each sequence
    is not empty; None when every sequence is whole."""
    if lens is None:
        return None
    if lens.type.dtype != "int32" or lens.type.shape != (batch,):
        raise cv.fail(f"sequence_lens must be int32 of shape [{batch}], got {lens.type}")
    if lens.is_constant:
        values = lens.data.reshape(-1)
        if np.any(values < 0) or np.any(values > steps):
            # onnxruntime rejects lengths past the sequence (fed at run time, such a length counts as the
            # whole sequence here)
            raise cv.fail(f"sequence_lens {values.tolist()} must be in [0, {steps}] (the sequence length)")
        if np.all(values == steps):
            return None
    column = _reshape(cv, lens, (batch, 1))
    return [cv.emit("less", [cv.constant(t, "step", "int32"), column]) for t in [*range(steps), 0]]


class _Cell:
    """One direction's weights and the equations of one step of an RNN, GRU or LSTM."""

    def __init__(
        self,
        cv: OnnxConverter,
        n: OnnxNode,
        d: int,
        w: Value,
        r: Value,
        b: Value | None,
        peep: Value | None,
        hidden: int,
        clip: float | None,
        acts: list[Activation],
    ):
        self.cv, self.kind, self.hidden, self.clip, self.acts = cv, n.op_type, hidden, clip, acts
        gh = _GATES[n.op_type] * hidden
        self.w = _index(cv, w, 0, d)
        self.r = _index(cv, r, 0, d)
        self.linear_before_reset = self.kind == "GRU" and n.attr("linear_before_reset", 0) != 0
        self.bias = self.recurrent_bias = None
        if b is not None:
            bias = _index(cv, b, 0, d)
            wb, rb = _cut(cv, bias, 0, 0, gh), _cut(cv, bias, 0, gh, 2 * gh)
            if self.linear_before_reset:
                # Rbh is added to H R_h^T before the reset gate scales it: it stays out of the input's bias
                self.recurrent_bias = _cut(cv, rb, 0, 2 * hidden, gh)
                rb = cv.emit(
                    "concat",
                    [_cut(cv, rb, 0, 0, 2 * hidden), cv.constant(np.zeros(hidden, rb.type.dtype), "zeros")],
                    {"axis": 0},
                )
            self.bias = cv.emit("add", [wb, rb])
        self.peep = None
        if peep is not None:
            p = _index(cv, peep, 0, d)
            self.peep = [_cut(cv, p, 0, k * hidden, (k + 1) * hidden) for k in range(3)]  # i, o, f
        self.input_forget = self.kind == "LSTM" and n.attr("input_forget", 0) != 0

    def project(self, x: Value) -> Value:
        """X W^T + Wb + Rb for every step at once ([steps * batch, gates * hidden])."""
        return self.cv.emit("dense", [x, self.w] + ([self.bias] if self.bias is not None else []))

    def gate(self, v: Value, k: int) -> Value:
        return _cut(self.cv, v, 1, k * self.hidden, (k + 1) * self.hidden)

    def act(self, i: int, v: Value) -> Value:
        if self.clip is not None:
            v = self.cv.emit("clip", [v], {"min": -self.clip, "max": self.clip})
        return _activate(self.cv, self.acts[i], v)

    def step(self, xw: Value, h: Value, c: Value) -> tuple[Value, Value]:
        """The next hidden state (and cell state; the previous one for RNN and GRU) from the input's
        projection at this step and the previous states."""
        cv, hidden = self.cv, self.hidden
        if self.kind == "RNN":
            return self.act(0, cv.emit("add", [xw, cv.emit("dense", [h, self.r])])), c
        if self.kind == "GRU":
            rz = cv.emit("dense", [h, _cut(cv, self.r, 0, 0, 2 * hidden)])
            z = self.act(0, cv.emit("add", [self.gate(xw, 0), self.gate(rz, 0)]))
            reset = self.act(0, cv.emit("add", [self.gate(xw, 1), self.gate(rz, 1)]))
            rh = _cut(cv, self.r, 0, 2 * hidden, 3 * hidden)
            if self.linear_before_reset:
                bias = [self.recurrent_bias] if self.recurrent_bias is not None else []
                recurrent = cv.emit("multiply", [reset, cv.emit("dense", [h, rh, *bias])])
            else:
                recurrent = cv.emit("dense", [cv.emit("multiply", [reset, h]), rh])
            candidate = self.act(1, cv.emit("add", [self.gate(xw, 2), recurrent]))
            one = cv.constant(1, "one", h.type.dtype)
            kept = cv.emit("multiply", [z, h])
            return cv.emit("add", [cv.emit("multiply", [cv.emit("subtract", [one, z]), candidate]), kept]), c
        pre = cv.emit("add", [xw, cv.emit("dense", [h, self.r])])
        i, o, f, g = (self.gate(pre, k) for k in range(4))
        if self.peep is not None:
            i = cv.emit("add", [i, cv.emit("multiply", [self.peep[0], c])])
            f = cv.emit("add", [f, cv.emit("multiply", [self.peep[2], c])])
        i = self.act(0, i)
        if self.input_forget:
            f = cv.emit("subtract", [cv.constant(1, "one", h.type.dtype), i])
        else:
            f = self.act(0, f)
        c_new = cv.emit("add", [cv.emit("multiply", [f, c]), cv.emit("multiply", [i, self.act(1, g)])])
        if self.peep is not None:
            o = cv.emit("add", [o, cv.emit("multiply", [self.peep[1], c_new])])
        o = self.act(0, o)
        return cv.emit("multiply", [o, _activate(cv, self.acts[2], c_new)]), c_new


# --- Scan, If, Loop ------------------------------------------------------------------------------------------


def _body(cv: OnnxConverter, n: OnnxNode, key: str) -> onnx.GraphProto:
    graph = n.attr(key)
    if not isinstance(graph, onnx.GraphProto):
        raise cv.fail(f"needs the graph attribute {key}")
    return graph


@converts("Scan")
def _scan(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """The body converted once per step of the scan axis (its extent, static, is the trip count): the state
    values carried from step to step, each scan input's slice at the step (from the end for direction 1),
    each scan output's slices stacked along its axis (in reverse order for direction 1). Scan-8 has a batch
    axis 0 on every input and output: the scan is unrolled for each batch element."""
    body = _body(cv, n, "body")
    m = n.attr("num_scan_inputs")
    if n.older_than(9):
        return _scan8(cv, n, body, m)
    values = list(n.inputs)
    if m is None or not 1 <= m <= len(values) or any(v is None for v in values):
        raise cv.fail(f"num_scan_inputs {m} for {len(values)} inputs (none of them omitted)")
    states, scans = values[: len(values) - m], values[len(values) - m :]
    k = len(body.output) - len(states)
    in_axes = n.attr("scan_input_axes", [0] * m)
    out_axes = n.attr("scan_output_axes", [0] * k)
    in_dirs = n.attr("scan_input_directions", [0] * m)
    out_dirs = n.attr("scan_output_directions", [0] * k)
    if (len(in_axes), len(in_dirs), len(out_axes), len(out_dirs)) != (m, m, k, k):
        raise cv.fail(f"scan_input_axes/directions need {m} values and scan_output_axes/directions {k}")
    if n.older_than(11) and any(a < 0 for a in [*in_axes, *out_axes]):
        raise cv.fail_version("negative scan axes are defined from Scan-11")
    if any(not v.type.shape for v in scans):
        raise cv.fail(f"scan inputs {[str(v.type) for v in scans]} need a scan axis (rank 1 or more)")
    in_axes = [onnx_axis(cv, a, len(v.type.shape)) for a, v in zip(in_axes, scans)]
    return _unroll_scan(cv, n, body, states, scans, in_axes, in_dirs, out_axes, out_dirs, "body")


def _scan8(cv: OnnxConverter, n: OnnxNode, body: onnx.GraphProto, m: int | None) -> list[Value]:
    """Scan-8: input 0 is sequence_lens, then states [batch, ...] and scan inputs [batch, sequence, ...];
    the outputs have the batch axis too (scan outputs [batch, sequence, ...])."""
    values = list(n.inputs[1:])
    if m is None or not 1 <= m <= len(values) or any(v is None for v in values):
        raise cv.fail(f"num_scan_inputs {m} for {len(values)} state and scan inputs (none of them omitted)")
    if any(len(v.type.shape) < 1 + (i >= len(values) - m) for i, v in enumerate(values)):
        raise cv.fail_version("every input needs the batch axis 0 (and scan inputs a sequence axis 1)")
    batch = values[0].type.shape[0]
    if batch < 1:
        raise cv.fail_version("the batch axis is empty, which aotc does not compile")
    if any(v.type.shape[0] != batch for v in values):
        raise cv.fail_version(f"inputs {[str(v.type) for v in values]} disagree on the batch axis 0")
    steps = values[-1].type.shape[1]
    lens = cv.const_input(n, 0, "sequence_lens")
    if lens is not None and np.any(lens != steps):
        raise cv.fail_version(
            f"sequence_lens {lens.tolist()}: sequences shorter than the scan axis ({steps}) are not supported"
        )
    dirs = n.attr("directions", [0] * m)
    k = len(body.output) - (len(values) - m)
    if len(dirs) != m:
        raise cv.fail_version(f"directions needs {m} values, got {len(dirs)}")
    per_batch = []
    for i in range(batch):
        sliced = [_index(cv, v, 0, i) for v in values]
        states, scans = sliced[: len(values) - m], sliced[len(values) - m :]
        tag = f"body[{i}]"  # then [step]: body[batch][step]
        per_batch.append(_unroll_scan(cv, n, body, states, scans, [0] * m, dirs, [0] * k, [0] * k, tag))
    return [_stack(cv, [outs[j] for outs in per_batch], 0, _out(n, j)) for j in range(len(per_batch[0]))]


def _unroll_scan(
    cv: OnnxConverter,
    n: OnnxNode,
    body: onnx.GraphProto,
    states: list[Value],
    scans: list[Value],
    in_axes: Sequence[int],
    in_dirs: Sequence[int],
    out_axes: Sequence[int],
    out_dirs: Sequence[int],
    tag: str,
) -> list[Value]:
    """The final states and the stacked scan outputs of the body run over the scan axis."""
    if any(d not in (0, 1) for d in [*in_dirs, *out_dirs]):
        raise cv.fail(f"scan directions must be 0 or 1, got {list(in_dirs)} and {list(out_dirs)}")
    extents = {v.type.shape[a] for v, a in zip(scans, in_axes)}
    if len(extents) != 1:
        raise cv.fail(f"the scan inputs {[str(v.type) for v in scans]} disagree on the scan axis's extent")
    steps = extents.pop()
    if steps < 1:
        raise cv.fail("the scan axis is empty: no iteration, empty scan outputs, which aotc does not compile")
    collected: list[list[Value]] = [[] for _ in out_axes]
    for t in range(steps):
        sliced = [_index(cv, v, a, steps - 1 - t if d else t) for v, a, d in zip(scans, in_axes, in_dirs)]
        results = cv.convert_subgraph(body, [*states, *sliced], f"{tag}[{t}]")
        if len(results) != len(states) + len(out_axes):
            raise cv.fail(f"the body has {len(results)} outputs, not {len(states)} states + {len(out_axes)}")
        for old, new in zip(states, results):
            # unrolled, a state may change its shape from step to step (not its element type)
            if old.type.dtype != new.type.dtype:
                raise cv.fail(f"a state of type {old.type} becomes {new.type} in step {t}: it must keep it")
        states = results[: len(states)]
        for parts, v in zip(collected, results[len(states) :]):
            if parts and parts[0].type != v.type:
                raise cv.fail(f"scan output slices of types {parts[0].type} and {v.type} do not stack")
            parts.append(v)
    outs = []
    for j, (parts, axis, d) in enumerate(zip(collected, out_axes, out_dirs)):
        axis = onnx_axis(cv, axis, len(parts[0].type.shape) + 1)
        outs.append(_stack(cv, parts[::-1] if d else parts, axis, _out(n, len(states) + j)))
    return [*states, *outs]


@converts("If")
def _if(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """The branch the condition selects, inlined: the condition must be known at build time."""
    cond = n.inputs[0]
    if cond.type.num_elements != 1 or cond.type.dtype != "bool":
        raise cv.fail(f"cond must be one bool, got {cond.type}")
    if not cond.is_constant:
        raise cv.run_time_value_error(n, 0, "cond", "aotc compiles the branch it selects, not both")
    branch = "then_branch" if bool(cond.data.reshape(-1)[0]) else "else_branch"
    return cv.convert_subgraph(_body(cv, n, branch), [], branch)


@converts("Loop")
def _loop(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """Unrolled: the trip count M and the condition must be known at build time, and so must the body's
    condition after each iteration; the loop-carried values go from one iteration to the next, and each
    scan output's values of all iterations are stacked along a new axis 0."""
    body = _body(cv, n, "body")
    trip = cv.const_input(n, 0, "M")
    cond = cv.const_input(n, 1, "cond")
    if trip is not None and trip.size != 1 or cond is not None and cond.size != 1:
        raise cv.fail("M and cond must be single values")
    limit = int(trip.reshape(-1)[0]) if trip is not None else None
    going = bool(cond.reshape(-1)[0]) if cond is not None else True
    carried = list(n.inputs[2:])
    if any(v is None for v in carried):
        raise cv.fail("a loop-carried input is omitted")
    k = len(body.output) - 1 - len(carried)
    if k < 0:
        raise cv.fail(
            f"the body has {len(body.output)} outputs: cond and {len(carried)} loop-carried values needed"
        )
    collected: list[list[Value]] = [[] for _ in range(k)]
    i = 0
    while going and (limit is None or i < limit):
        if i >= LOOP_UNROLL_LIMIT:
            raise cv.fail(
                f"the loop runs for more than {LOOP_UNROLL_LIMIT} iterations, the most aotc unrolls"
            )
        inputs = [cv.constant(np.int64(i), "iteration"), cv.constant(np.bool_(going), "cond"), *carried]
        results = cv.convert_subgraph(body, inputs, f"body[{i}]")
        if not results[0].is_constant or results[0].type.num_elements != 1:
            raise cv.fail(
                f"the body's condition after iteration {i} is computed at run time; aotc unrolls a loop only "
                "when it is known at build time"
            )
        going = bool(results[0].data.reshape(-1)[0])
        for old, new in zip(carried, results[1 : 1 + len(carried)]):
            # unrolled, a value may change its shape from iteration to iteration (not its element type)
            if old.type.dtype != new.type.dtype:
                raise cv.fail(f"a loop-carried value of type {old.type} becomes {new.type} in iteration {i}")
        carried = results[1 : 1 + len(carried)]
        for parts, v in zip(collected, results[1 + len(carried) :]):
            if parts and parts[0].type != v.type:
                raise cv.fail(f"scan output values of types {parts[0].type} and {v.type} do not stack")
            parts.append(v)
        i += 1
    if k and i == 0:
        raise cv.fail("the loop runs no iteration: its scan outputs are empty, which aotc does not compile")
    outs = [_stack(cv, parts, 0, _out(n, len(carried) + j)) for j, parts in enumerate(collected)]
    return [*carried, *outs]
