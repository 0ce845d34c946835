"""The validation rule: loose enough for the rounding of a reordered sum (Winograd), strict enough that a
kernel with one tap off by one element fails, and a mismatch message that says where and by how much."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from aotc.build import build
from aotc.cli import main
from aotc.recipe import load_recipe
from aotc.topi import winograd
from aotc.validate import (
    ATOL,
    RTOL,
    ValidationError,
    compare,
    dequantized_outputs,
    format_report_row,
    onnxruntime_saturates,
    validate_package,
)

from .onnx_util import IR_VERSION


def _conv(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Direct valid 3x3 correlation in float64: x [C, H+2, W+2], w [O, C, 3, 3] -> [O, H, W]."""
    h, wd = x.shape[1] - 2, x.shape[2] - 2
    out = np.zeros((w.shape[0], h, wd))
    for i in range(3):
        for j in range(3):
            out += np.einsum("oc,chw->ohw", w[:, :, i, j], x[:, i : i + h, j : j + wd])
    return out


def _winograd_f43(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The same correlation as F(4, 3) Winograd, every step rounded to float32 as a kernel's would be."""
    at, g, bt = (np.asarray(a, np.float32) for a in winograd.matrices(4))
    x, w = x.astype(np.float32), w.astype(np.float32)
    tiles = (x.shape[1] - 2) // 4
    d = np.stack([x[:, 4 * a : 4 * a + 6, 4 * b : 4 * b + 6] for a in range(tiles) for b in range(tiles)])
    u = np.einsum("ai,ocij,bj->abco", g, w, g)
    v = np.einsum("ai,ncij,bj->nabc", bt, d, bt)
    y = np.einsum("ia,nabo,jb->noij", at, np.einsum("abco,nabc->nabo", u, v), at)
    return y.reshape(tiles, tiles, -1, 4, 4).transpose(2, 0, 3, 1, 4).reshape(-1, 4 * tiles, 4 * tiles)


def _layer(channels: int = 64, size: int = 16, gain: float = 4.0, seed: int = 0):
    """Inputs in [-1, 1] and weights that give outputs of RMS about `gain`, like test_winograd's net (5.4)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (channels, size + 2, size + 2)).astype(np.float32)
    w = (rng.standard_normal((32, channels, 3, 3)) * gain / np.sqrt(3 * channels)).astype(np.float32)
    return x, w


def _check(got: np.ndarray, ref: np.ndarray, scale_rtol: float | None = None) -> dict:
    kw = {} if scale_rtol is None else {"scale_rtol": scale_rtol}
    (row,) = compare({"y": got}, {"y": ref.astype(np.float32)}, RTOL, ATOL, **kw)
    return row


@pytest.mark.parametrize("channels", [16, 256])
def test_winograd_rounding_passes(channels):
    x, w = _layer(channels)
    ref, got = _conv(x, w), _winograd_f43(x, w)
    row = _check(got, ref)
    assert row["ok"], format_report_row({"output": "y", **row})
    # The per-element rule alone rejects it: near-zero outputs differ by more than atol + rtol of themselves.
    assert not _check(got, ref, scale_rtol=0.0)["ok"]
    # ...and the scale term leaves room: the largest difference is well inside it.
    assert row["max_abs"] < 0.25 * row["allowed_abs"]


def _shift_one_tap(w: np.ndarray) -> np.ndarray:
    """One output channel reads one input channel's centre tap one column to the right."""
    bad = w.copy()
    bad[5, 7, 1, 2] += bad[5, 7, 1, 1]
    bad[5, 7, 1, 1] = 0
    return bad


@pytest.mark.parametrize(
    "plant",
    [
        pytest.param(lambda x, w: _conv(x, np.roll(w, 1)), id="weights-shifted-by-one-element"),
        pytest.param(lambda x, w: _conv(np.roll(x, -1, axis=2), w), id="reads-x[i+1]"),
        pytest.param(lambda x, w: _conv(x, _shift_one_tap(w)), id="one-tap-of-one-channel-off-by-one"),
    ],
)
@pytest.mark.parametrize("channels", [16, 256])
def test_a_kernel_with_a_tap_off_by_one_fails(plant, channels):
    x, w = _layer(channels)
    ref = _conv(x, w)
    row = _check(plant(x, w).astype(np.float32), ref)
    assert not row["ok"]
    assert row["max_abs"] > 10 * row["allowed_abs"]


def test_nan_must_match_nan_and_infinities_themselves():
    ref = np.array([np.nan, np.inf, -np.inf, 1.0], np.float32)
    assert _check(ref.copy(), ref)["ok"]
    for i, value in enumerate([0.0, np.nan, np.inf, np.nan]):
        got = ref.copy()
        got[i] = value
        row = _check(got, ref)
        assert not row["ok"] and row["worst"]["index"] == [i], (i, row)


def test_an_all_zero_output_keeps_the_absolute_floor():
    ref = np.zeros((4, 4), np.float32)
    assert _check(ref + 0.5 * ATOL, ref)["ok"]
    assert not _check(ref + 2 * ATOL, ref)["ok"]


def test_mismatch_row_names_scale_worst_element_and_values():
    ref = np.linspace(-3, 3, 24, dtype=np.float32).reshape(2, 3, 4)
    got = ref.copy()
    got[1, 2, 3] += 0.01
    got[0, 1, 1] += 0.002
    row = _check(got, ref)
    assert not row["ok"] and row["over"] == 2 and row["worst"]["index"] == [1, 2, 3]
    text = format_report_row({"output": "y", **row})
    assert "MISMATCH" in text and "rms(ref) 1.8" in text and "2 of 24 elements" in text
    assert "[1, 2, 3]: got 3.01, reference 3" in text and "allowed" in text


def _conv_model(weight: np.ndarray) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, weight.shape[1], 10, 10])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    graph = helper.make_graph([node], "conv", [x], [y], [numpy_helper.from_array(weight, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)


def test_package_against_a_model_with_a_shifted_tap_is_exit_code_3(tmp_path, capsys):
    _, w = _layer(16)
    (tmp_path / "good.onnx").write_bytes(_conv_model(w).SerializeToString())
    (tmp_path / "bad.onnx").write_bytes(_conv_model(_shift_one_tap(w)).SerializeToString())
    recipe = tmp_path / "good.yaml"
    recipe.write_text("model: good.onnx\noutput: good.aotc\nvalidate: true\ntuning: {tophub: none}\n")
    package = build(load_recipe(recipe), log=lambda _: None).package
    shapes = {"x": ((1, 16, 10, 10), "float32")}
    assert all(r["ok"] for r in validate_package(package, tmp_path / "good.onnx", shapes))
    with pytest.raises(ValidationError, match=r"rms\(ref\)") as err:
        validate_package(package, tmp_path / "bad.onnx", shapes)
    message = str(err.value)
    assert "1e-05 + 0.0001*|ref| + 0.0001*rms(ref)" in message and "worst at [0, 5, " in message
    capsys.readouterr()
    assert main(["validate", str(package), "--model", str(tmp_path / "bad.onnx")]) == 3
    assert "MISMATCH" in capsys.readouterr().err


def test_a_variant_row_names_its_batch_size():
    from aotc.validate import format_report_row

    row = {"output": "y", "ok": True, "max_abs": 1e-7, "max_rel": 1e-6, "rms": 0.3}
    assert format_report_row({**row, "variant": "x[4, 64]"}) == "  [x[4, 64]] " + format_report_row(row)[2:]


def test_onnxruntime_saturates_only_on_x86_without_vnni(tmp_path):
    """onnxruntime's u8s8 kernel adds product pairs in int16 with saturation where the CPU lacks VNNI: a QDQ
    model then runs unfused, a model of ONNX's quantized operators on ONNX's reference evaluator."""
    from recipes.zoo import onnx_models as zoo

    qdq = zoo.quantize(zoo.residual_block(), tmp_path / "qdq.onnx", True, "uint8", reduce_range=False)
    qop = zoo.quantize(
        zoo.residual_block(), tmp_path / "qop.onnx", True, "uint8", "QOperator", reduce_range=False
    )
    x = tmp_path / "float.onnx"
    zoo.save(zoo.residual_block(), x)
    avx2, vnni = frozenset({"avx2"}), frozenset({"avx2", "avx512vnni"})
    qdq, qop, x = (onnx.load(str(p)).graph for p in (qdq, qop, x))
    assert onnxruntime_saturates(qdq, avx2) == "qdq" and onnxruntime_saturates(qdq, vnni) is None
    assert onnxruntime_saturates(x, avx2) is None
    assert (
        onnxruntime_saturates(qop, avx2) is None
    )  # QOperator quantize_static uses com.microsoft's QLinearAdd


@pytest.mark.parametrize("reference", ["host", "unfused"])
def test_a_full_range_qdq_model_validates_on_every_x86_class(tmp_path, monkeypatch, reference):
    """quantize_static's default 8-bit weights (no reduce_range): the build's validation passes on a CPU
    without VNNI too (Zen 3 failed it: onnxruntime, not the package, was up to 98 LSB off); `unfused`
    forces that reference on any CPU."""
    import aotc
    from recipes.zoo import onnx_models as zoo

    if reference == "unfused":
        monkeypatch.setattr("aotc.validate.onnxruntime_saturates", lambda graph: "qdq")
    model = zoo.resnet18(width=8, size=32, classes=10)
    path = zoo.quantize(model, tmp_path / "resnet.onnx", True, "uint8", reduce_range=False)
    package = aotc.compile(str(path), output=tmp_path / "resnet.aotc", validate=True, log=lambda _: None)
    rows = package.result.validation
    assert rows and all(r["ok"] for r in rows), rows


def test_quantized_operators_take_the_reference_evaluator_where_onnxruntime_saturates(tmp_path, monkeypatch):
    """A QLinearConv with full-range weights: with onnxruntime's saturation assumed (as on Zen 3), the
    reference is ONNX's evaluator, equal to the exact integer arithmetic of aotc's graph evaluator."""
    from aotc.frontend.onnx import load_onnx
    from aotc.graph.interpret import run_graph
    from aotc.validate import reference_outputs

    rng = np.random.default_rng(0)
    inits = {
        "sx": np.float32(0.05),
        "zx": np.uint8(100),
        "w": np.where(rng.random((6, 4, 3, 3)) < 0.5, -128, 127).astype(np.int8),
        "sw": np.float32(0.01),
        "zw": np.int8(0),
        "sy": np.float32(2.0),
        "zy": np.uint8(128),
    }
    node = helper.make_node("QLinearConv", ["x", *inits], ["y"], pads=[1, 1, 1, 1])
    graph = helper.make_graph(
        [node],
        "qlinear_conv",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 4, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 6, 5, 5])],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    path = tmp_path / "qlinear_conv.onnx"
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION), path
    )
    assert onnxruntime_saturates(onnx.load(str(path)).graph, frozenset({"avx2"})) == "qoperator"
    monkeypatch.setattr("aotc.validate.onnxruntime_saturates", lambda graph: "qoperator")
    x = {"x": rng.integers(200, 256, (1, 4, 5, 5)).astype(np.uint8)}  # large pairs: 255 * 127 * 2 > 2**15
    np.testing.assert_array_equal(reference_outputs(path, x)["y"], run_graph(load_onnx(str(path)), x)["y"])


def _dequantize_model(path, scale: np.ndarray) -> None:
    """x -> QuantizeLinear -> DequantizeLinear (per tensor, or per channel along axis 1) -> y; also z = Relu(x)."""
    zero = np.full(scale.shape, 128, np.uint8)
    inits = [numpy_helper.from_array(scale.astype(np.float32), "s"), numpy_helper.from_array(zero, "zp")]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], axis=1),
        helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"], axis=1),
        helper.make_node("Relu", ["x"], ["z"]),
    ]
    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes,
        "qdq",
        [value("x", TensorProto.FLOAT, [1, 2, 4])],
        [value("y", TensorProto.FLOAT, [1, 2, 4]), value("z", TensorProto.FLOAT, [1, 2, 4])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    onnx.save(model, path)


def test_a_dequantized_output_is_compared_in_steps_of_its_scale(tmp_path):
    """A QDQ model's float output lies on its DequantizeLinear's grid: a requantization that rounds the
    other way somewhere upstream moves values by a whole step, which the float rule refuses (a QDQ
    ResNet-18 failed its build on Zen 3 so); within 1 step on 99.9% and never 3 steps off passes."""
    per_tensor, per_channel = tmp_path / "t.onnx", tmp_path / "c.onnx"
    _dequantize_model(per_tensor, np.array(0.05))
    _dequantize_model(per_channel, np.array([0.01, 0.04]))
    assert dequantized_outputs(per_tensor) == {"y": pytest.approx(0.05)}
    assert dequantized_outputs(per_channel) == {"y": pytest.approx(0.04)}
    assert dequantized_outputs(tmp_path / "m.pb") == {}

    steps = dequantized_outputs(per_tensor)
    ref = np.round(np.random.default_rng(0).uniform(-5, 5, 4000) / 0.05).astype(np.float32) * np.float32(0.05)
    got = ref.copy()
    got[::7] += np.float32(0.05)  # one step off on 1 in 7
    (row,) = compare({"y": got}, {"y": ref}, RTOL, ATOL, steps=steps)
    assert row["ok"] and row["max_lsb"] == 1 and row["lsb_histogram"][1] == len(got[::7]), row
    assert "1 LSB of its dequantization scale 0.05" in format_report_row(row)
    assert not compare({"y": got}, {"y": ref}, RTOL, ATOL)[0]["ok"]  # the float rule would refuse it
    got[7] += np.float32(0.1)  # one value 3 steps off
    (row,) = compare({"y": got}, {"y": ref}, RTOL, ATOL, steps=steps)
    assert not row["ok"] and row["max_lsb"] == 3
    nan = ref.copy()
    nan[0] = np.nan  # not on any grid: the float rule decides
    assert "max_abs" in compare({"y": nan}, {"y": ref}, RTOL, ATOL, steps=steps)[0]


def test_a_tflite_dequantize_output_is_compared_in_steps_of_its_scale(tmp_path):
    """An int8 TFLite model with float outputs ends in DEQUANTIZE: its output's step is the scale of the
    int8 tensor it reads, and the build's validation uses it."""
    import aotc
    from recipes.zoo import tflite_models as zoo

    q = zoo.int8_model(zoo.small_cnn(), io="float")
    path = tmp_path / "float_io.tflite"
    path.write_bytes(q.build())
    (output,) = (q.tensors[t].name for t in q.outputs)
    (read,) = (t for t in q.tensors if t.name + "_float" == output)  # the int8 tensor DEQUANTIZE reads
    scale = read.quant.scale[0]
    assert dequantized_outputs(path) == {output: pytest.approx(scale)}
    package = aotc.compile(str(path), output=tmp_path / "float_io.aotc", validate=True, log=lambda _: None)
    rows = package.result.validation
    assert [r.get("step") for r in rows] == [pytest.approx(scale)] and all(r["ok"] for r in rows), rows
