"""The recurrent and control-flow ONNX operators (aotc.frontend.onnx_recurrent: RNN, GRU, LSTM, Scan, If,
Loop, unrolled at conversion) against onnxruntime: each model is imported and run op by op with aotc's graph
interpreter. Tolerances: RTOL 1e-4, ATOL 1e-5 (onnxruntime's recurrent kernels use approximations of
sigmoid and tanh, within about 1e-6 of numpy's); Scan, If and Loop bodies of adds and products 1e-6."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from aotc.frontend.errors import ConversionError
from aotc.frontend.onnx import RunTimeValueError, load_onnx
from aotc.graph.interpret import run_graph

from .onnx_util import (
    ATOL,
    RTOL,
    Input,
    check_model,
    make_graph_model,
    random_feeds,
    run_onnxruntime,
    tensor_type,
)

T, B, I, H = 3, 2, 4, 3
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
EXACT = (1e-6, 1e-6)


def recurrent(op: str, opset: int = 22, layout: int = 0, direction: str = "forward", optional=(), **attrs):
    """One `op` node on X [T, B, I] (layout 1: [B, T, I]) with W, R and the named optional inputs (B,
    sequence_lens, initial_h, initial_c, P) all fed at run time; every output named."""
    dirs = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    state = (B, dirs, H) if layout else (dirs, B, H)
    shapes = {
        "X": (B, T, I) if layout else (T, B, I),
        "W": (dirs, g * H, I),
        "R": (dirs, g * H, H),
        "B": (dirs, 2 * g * H),
        "sequence_lens": (B,),
        "initial_h": state,
        "initial_c": state,
        "P": (dirs, 3 * H),
    }
    order = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]
    names = [k if k in ("X", "W", "R") or k in optional else "" for k in order]
    while not names[-1]:
        names.pop()
    inputs = {
        k: Input(shapes[k], "int32", 1, T + 1) if k == "sequence_lens" else Input(shapes[k])
        for k in names
        if k
    }
    outs = ["Y", "Y_h", "Y_c"][: 3 if op == "LSTM" else 2]
    if layout:
        attrs["layout"] = layout
    node = helper.make_node(op, names, outs, name="node", hidden_size=H, direction=direction, **attrs)
    return make_graph_model([node], inputs, outs, opset=opset)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize(
    ("direction", "layout", "opset"),
    [("forward", 0, 7), ("reverse", 1, 14), ("bidirectional", 0, 22), ("bidirectional", 1, 22)],
)
def test_directions_layouts_initial_states(op, direction, layout, opset):
    optional = ("B", "initial_h", "initial_c") if op == "LSTM" else ("B", "initial_h")
    if not layout:
        check_model(recurrent(op, opset, layout, direction, optional))
        return
    # onnxruntime runs layout 0 only: the batch-first model must equal it on transposed operands
    m = recurrent(op, opset, layout, direction, optional)
    feeds = random_feeds(m)
    moved = {k: np.swapaxes(v, 0, 1) if k in ("X", "initial_h", "initial_c") else v for k, v in feeds.items()}
    expected = run_onnxruntime(recurrent(op, opset, 0, direction, optional), moved)
    got = run_graph(load_onnx(m.SerializeToString()), feeds)
    for name, ref in zip(["Y", "Y_h", "Y_c"], expected):
        ref = np.transpose(ref, (2, 0, 1, 3)) if name == "Y" else np.swapaxes(ref, 0, 1)
        np.testing.assert_allclose(got[name], ref, rtol=RTOL, atol=ATOL, err_msg=name)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_defaults_without_optional_inputs(op):
    check_model(recurrent(op))


@pytest.mark.parametrize("linear_before_reset", [0, 1])
def test_gru_linear_before_reset_and_clip(linear_before_reset):
    m = recurrent("GRU", direction="bidirectional", optional=("B",), linear_before_reset=linear_before_reset)
    check_model(m)
    check_model(recurrent("GRU", optional=("B",), linear_before_reset=linear_before_reset, clip=0.5))


@pytest.mark.parametrize(
    ("op", "activations", "alpha", "beta"),
    [
        ("RNN", ["Relu", "Softsign"], None, None),
        ("RNN", ["Elu", "Softplus"], [0.5], None),
        ("GRU", ["HardSigmoid", "LeakyRelu"], [0.3, 0.2], [0.4]),
        ("GRU", ["ThresholdedRelu", "ScaledTanh"], [0.1, 0.8], [1.5]),
        ("LSTM", ["HardSigmoid", "LeakyRelu", "Affine"], [0.3, 0.2, 0.7], [0.4, 0.1]),
        ("LSTM", ["Sigmoid", "Elu", "Tanh"], None, None),
    ],
)
def test_activations_alpha_beta(op, activations, alpha, beta):
    """RNN bidirectional (one function per direction), GRU and LSTM forward."""
    direction = "bidirectional" if op == "RNN" else "forward"
    attrs = {"activations": activations}
    if alpha is not None:
        attrs["activation_alpha"] = alpha
    if beta is not None:
        attrs["activation_beta"] = beta
    check_model(recurrent(op, direction=direction, optional=("B",), **attrs))


def test_lstm_peepholes_input_forget_clip():
    full = ("B", "initial_h", "initial_c", "P")
    check_model(recurrent("LSTM", direction="bidirectional", optional=full))
    check_model(recurrent("LSTM", optional=full, input_forget=1, clip=0.4))


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_sequence_lens_fed_at_run_time(direction):
    """Per-sequence lengths (0 to T) fed at run time: the steps past a length are masked."""
    m = recurrent("LSTM", direction=direction, optional=("B", "sequence_lens", "initial_h", "initial_c"))
    feeds = random_feeds(m)
    for lens in ([2, 3], [1, 0]):
        feeds["sequence_lens"] = np.array(lens, np.int32)
        check_model(m, feeds)


def test_sequence_lens_constant():
    """Constant lengths: masks that fold; all of them whole: no masks at all."""
    m = recurrent("GRU", direction="reverse", optional=("B", "sequence_lens", "initial_h"))
    del m.graph.input[4]
    for lens in ([2, 1], [0, T], [T, T]):
        del m.graph.initializer[:]
        m.graph.initializer.append(onnx.numpy_helper.from_array(np.array(lens, np.int32), "sequence_lens"))
        check_model(m)


def scan_model(opset: int, body_nodes, body_in, body_out, states, scans, outs, **attrs):
    """A Scan node over graph inputs `states` + `scans` (name -> shape), float32, body of `body_nodes`."""
    body = helper.make_graph(
        body_nodes,
        "body",
        [helper.make_tensor_value_info(k, onnx.TensorProto.FLOAT, None) for k in body_in],
        [helper.make_tensor_value_info(k, onnx.TensorProto.FLOAT, None) for k in body_out],
    )
    inputs = {k: Input(s) for k, s in {**states, **scans}.items()}
    names = ([""] if opset == 8 else []) + list(inputs)
    node = helper.make_node("Scan", names, outs, name="scan", body=body, num_scan_inputs=len(scans), **attrs)
    return make_graph_model([node], inputs, outs, opset=opset)


SUM_BODY = (
    [
        helper.make_node("Add", ["s_in", "x"], ["s_out"]),
        helper.make_node("Mul", ["p_in", "x"], ["p_out"]),
        helper.make_node("Sub", ["s_out", "p_out"], ["d"]),
    ],
    ["s_in", "p_in", "x"],
    ["s_out", "p_out", "d"],
)


def test_scan9_axes_and_directions():
    states = {"s": (4, 2), "p": (4, 2)}
    m = scan_model(9, *SUM_BODY, states, {"xs": (4, 5, 2)}, ["S", "P", "D"], scan_input_axes=[1])
    check_model(m, rtol=EXACT[0], atol=EXACT[1])
    m = scan_model(
        16,
        *SUM_BODY,
        states,
        {"xs": (4, 2, 3)},
        ["S", "P", "D"],
        scan_input_axes=[-1],
        scan_input_directions=[1],
        scan_output_axes=[-1],
        scan_output_directions=[1],
    )
    check_model(m, rtol=EXACT[0], atol=EXACT[1])


def test_scan8_batch():
    m = scan_model(
        8, *SUM_BODY, {"s": (2, 3), "p": (2, 3)}, {"xs": (2, 4, 3)}, ["S", "P", "D"], directions=[1]
    )
    check_model(m, rtol=EXACT[0], atol=EXACT[1])


def branch(name: str, value: float, outer: str) -> onnx.GraphProto:
    """A branch that adds `value` to the outer value `outer`."""
    nodes = [
        helper.make_node(
            "Constant", [], [f"{name}_c"], value=helper.make_tensor("v", onnx.TensorProto.FLOAT, [], [value])
        ),
        helper.make_node("Add", [outer, f"{name}_c"], [f"{name}_out"]),
    ]
    return helper.make_graph(
        nodes, name, [], [helper.make_tensor_value_info(f"{name}_out", onnx.TensorProto.FLOAT, None)]
    )


def if_model(cond: bool | None) -> onnx.ModelProto:
    node = helper.make_node(
        "If",
        ["cond"],
        ["y"],
        name="if",
        then_branch=branch("then", 1.0, "x"),
        else_branch=branch("else", -1.0, "x"),
    )
    inputs = {"x": Input((2, 3))}
    inits = {}
    if cond is None:
        inputs["cond"] = Input((), "bool")
    else:
        inits["cond"] = np.array(cond)
    return make_graph_model([node], inputs, ["y"], inits, opset=13)


@pytest.mark.parametrize("cond", [True, False])
def test_if_constant_condition(cond):
    check_model(if_model(cond), rtol=EXACT[0], atol=EXACT[1])


def loop_model(trip: int | None, cond: bool | None) -> onnx.ModelProto:
    """Loop carrying a running sum of x * i, its values as a scan output; the body's condition i < 3."""
    body = helper.make_graph(
        [
            helper.make_node("Cast", ["i"], ["i_f"], to=onnx.TensorProto.FLOAT),
            helper.make_node("Mul", ["x", "i_f"], ["xi"]),
            helper.make_node("Add", ["acc_in", "xi"], ["acc_out"]),
            helper.make_node("Identity", ["acc_out"], ["scan"]),
            helper.make_node(
                "Constant", [], ["three"], value=helper.make_tensor("t", onnx.TensorProto.INT64, [], [3])
            ),
            helper.make_node("Less", ["i", "three"], ["go"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", onnx.TensorProto.INT64, []),
            helper.make_tensor_value_info("c", onnx.TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_in", onnx.TensorProto.FLOAT, None),
        ],
        [
            helper.make_tensor_value_info(k, t, None)
            for k, t in (("go", onnx.TensorProto.BOOL), ("acc_out", 1), ("scan", 1))
        ],
    )
    node = helper.make_node(
        "Loop",
        ["M" if trip is not None else "", "cond" if cond is not None else "", "acc"],
        ["A", "S"],
        name="loop",
        body=body,
    )
    inits = {}
    if trip is not None:
        inits["M"] = np.array(trip, np.int64)
    if cond is not None:
        inits["cond"] = np.array(cond)
    return make_graph_model([node], {"x": Input((2,)), "acc": Input((2,))}, ["A", "S"], inits, opset=16)


@pytest.mark.parametrize(("trip", "cond"), [(2, True), (10, None), (None, True)])
def test_loop_unrolled(trip, cond):
    check_model(loop_model(trip, cond), rtol=EXACT[0], atol=EXACT[1])


def test_refusals_are_clean():
    """A condition or trip count fed at run time names the `constants` that fix it; the rest name the node."""
    with pytest.raises(RunTimeValueError, match=r"node if \(If\): input 0 \(cond.*constants"):
        load_onnx(if_model(None).SerializeToString())
    m = loop_model(2, True)
    m.graph.input.append(helper.make_tensor_value_info("M", onnx.TensorProto.INT64, []))
    del m.graph.initializer[0]
    with pytest.raises(RunTimeValueError, match=r"node loop \(Loop\): input 0 \(M"):
        load_onnx(m.SerializeToString())
    with pytest.raises(ConversionError, match=r"node node \(GRU\): activation ThresholdedRelu needs"):
        load_onnx(recurrent("GRU", activations=["ThresholdedRelu", "Tanh"]).SerializeToString())
    half = recurrent("RNN")
    for vi in half.graph.input:
        vi.type.tensor_type.elem_type = tensor_type("float16")
    with pytest.raises(ConversionError, match=r"node node \(RNN\): RNN is computed on float32 and float64"):
        load_onnx(half.SerializeToString())


def test_if_branch_with_scalar_axes():
    """ONNX's AffineGrid function body: an If branch unsqueezes with 0-d axes, read as one axis."""
    one = helper.make_tensor("one", onnx.TensorProto.INT64, [], [1])
    then = helper.make_graph(
        [
            helper.make_node("Constant", [], ["axis"], value=one),
            helper.make_node("Unsqueeze", ["x", "axis"], ["u"]),
        ],
        "then",
        [],
        [helper.make_tensor_value_info("u", onnx.TensorProto.FLOAT, None)],
    )
    other = helper.make_graph(
        [helper.make_node("Unsqueeze", ["x", "axes"], ["v"])],
        "else",
        [],
        [helper.make_tensor_value_info("v", onnx.TensorProto.FLOAT, None)],
    )
    node = helper.make_node("If", ["cond"], ["y"], name="if", then_branch=then, else_branch=other)
    inits = {"cond": np.array(True), "axes": np.array([1], np.int64)}
    check_model(make_graph_model([node], {"x": Input((2, 3))}, ["y"], inits, opset=13), rtol=0, atol=0)


def test_loop_carried_value_that_grows():
    """Unrolled, a loop-carried value may change its shape from one iteration to the next."""
    body = helper.make_graph(
        [
            helper.make_node("Concat", ["acc_in", "x"], ["acc_out"], axis=0),
            helper.make_node("Identity", ["c"], ["go"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", onnx.TensorProto.INT64, []),
            helper.make_tensor_value_info("c", onnx.TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_in", onnx.TensorProto.FLOAT, None),
        ],
        [
            helper.make_tensor_value_info("go", onnx.TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_out", onnx.TensorProto.FLOAT, None),
        ],
    )
    node = helper.make_node("Loop", ["M", "", "acc"], ["A"], name="loop", body=body)
    inputs = {"x": Input((2,)), "acc": Input((1,))}
    m = make_graph_model([node], inputs, ["A"], {"M": np.array(3, np.int64)}, opset=13)
    check_model(m, rtol=0, atol=0)


def loop_with_run_time_condition() -> onnx.ModelProto:
    """A body whose condition reads x: not known at build time."""
    body = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["acc_in"], ["total"], keepdims=0),
            helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("z", 1, [], [0.0])),
            helper.make_node("Less", ["total", "zero"], ["go"]),
            helper.make_node("Add", ["acc_in", "x"], ["acc_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", onnx.TensorProto.INT64, []),
            helper.make_tensor_value_info("c", onnx.TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_in", onnx.TensorProto.FLOAT, None),
        ],
        [
            helper.make_tensor_value_info(k, t, None)
            for k, t in (("go", onnx.TensorProto.BOOL), ("acc_out", 1))
        ],
    )
    node = helper.make_node("Loop", ["M", "", "acc"], ["A"], name="loop", body=body)
    inputs = {"x": Input((2,)), "acc": Input((2,))}
    return make_graph_model([node], inputs, ["A"], {"M": np.array(3, np.int64)}, opset=13)


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: recurrent("LSTM", activations=["Sigmoid", "Tanh"]), "2 activations; LSTM takes 3"),
        (lambda: recurrent("RNN", activations=["Swish"]), "activation 'Swish' is not one of"),
        (lambda: recurrent("GRU", clip=-1.0), "clip must be positive"),
        (lambda: recurrent("LSTM", activations=["Affine", "Tanh", "Tanh"]), "Affine needs activation_alpha"),
        (loop_with_run_time_condition, r"node loop \(Loop\): the body's condition after iteration 0"),
        (
            lambda: scan_model(9, *SUM_BODY, {"s": (2,), "p": (2,)}, {"xs": ()}, ["S", "P", "D"]),
            "need a scan axis",
        ),
    ],
)
def test_malformed_or_unsupported_cases_refused(build, match):
    with pytest.raises(ConversionError, match=match):
        load_onnx(build().SerializeToString())
