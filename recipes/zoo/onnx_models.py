"""Deterministic example ONNX models built with `onnx.helper`: MLP, small CNN, ResNet-18, MobileNetV2, transformer.

Weights come from `np.random.default_rng(seed)` with He/Xavier scales and mild batch-norm statistics, so
activations stay O(1) and a given set of arguments always gives byte-identical models.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from aotc.files import write_atomic

OPSET = 17
IR_VERSION = 8


class _Builder:
    """Collects nodes and float32 initializers with unique names, drawing weights from one seeded rng."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.counts: dict[str, int] = {}

    def unique(self, prefix: str) -> str:
        n = self.counts.get(prefix, 0)
        self.counts[prefix] = n + 1
        return f"{prefix}_{n}"

    def const(self, name: str, value: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def normal(self, name: str, shape: Sequence[int], std: float) -> str:
        return self.const(name, (self.rng.standard_normal(shape) * std).astype(np.float32))

    def uniform(self, name: str, shape: Sequence[int], low: float, high: float) -> str:
        return self.const(name, self.rng.uniform(low, high, shape).astype(np.float32))

    def op(self, op_type: str, inputs: Sequence[str], prefix: str = "", output: str = "", **attrs) -> str:
        """Add one node named `<prefix>_<n>`; its output value carries the node's name unless given."""
        name = self.unique(prefix or op_type.lower())
        out = output or name
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=name, **attrs))
        return out

    def model(
        self, name: str, inputs: list[onnx.ValueInfoProto], output: onnx.ValueInfoProto
    ) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, [output], initializer=self.initializers)
        # The producer name predates the move to recipes/zoo; it stays so committed models keep their bytes.
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="aotc.models"
        )
        model.ir_version = IR_VERSION
        return model

    def conv(
        self, x: str, cin: int, cout: int, k: int, stride: int = 1, group: int = 1, bias: bool = False
    ) -> str:
        """Conv with He-initialised weights and `same`-style padding k // 2."""
        name = self.unique("conv")
        w = self.normal(f"{name}.weight", (cout, cin // group, k, k), math.sqrt(2.0 / (cin // group * k * k)))
        ins = [x, w]
        if bias:
            ins.append(self.uniform(f"{name}.bias", (cout,), -0.1, 0.1))
        pads = [k // 2] * 4
        self.nodes.append(
            helper.make_node(
                "Conv",
                ins,
                [name],
                name=name,
                kernel_shape=[k, k],
                strides=[stride] * 2,
                pads=pads,
                group=group,
            )
        )
        return name

    def batch_norm(self, x: str, c: int, gain: float = 1.0) -> str:
        """Inference BatchNormalization with statistics close to what a conv on O(1) inputs produces."""
        name = self.unique("bn")
        scale = self.uniform(f"{name}.scale", (c,), 0.5 * gain, 1.0 * gain)
        bias = self.uniform(f"{name}.bias", (c,), -0.1, 0.1)
        mean = self.uniform(f"{name}.mean", (c,), -0.1, 0.1)
        var = self.uniform(f"{name}.var", (c,), 1.0, 2.0)
        self.nodes.append(
            helper.make_node(
                "BatchNormalization", [x, scale, bias, mean, var], [name], name=name, epsilon=1e-5
            )
        )
        return name

    def gemm(self, x: str, fin: int, fout: int, gain: float = 2.0) -> str:
        """Gemm(x, W^T) + b with W of shape [fout, fin]."""
        name = self.unique("gemm")
        w = self.normal(f"{name}.weight", (fout, fin), math.sqrt(gain / fin))
        b = self.uniform(f"{name}.bias", (fout,), -0.1, 0.1)
        self.nodes.append(helper.make_node("Gemm", [x, w, b], [name], name=name, transB=1))
        return name

    def matmul_add(self, x: str, fin: int, fout: int, gain: float = 1.0) -> str:
        """MatMul(x, W) + b with W of shape [fin, fout]."""
        name = self.unique("linear")
        w = self.normal(f"{name}.weight", (fin, fout), math.sqrt(gain / fin))
        b = self.uniform(f"{name}.bias", (fout,), -0.1, 0.1)
        return self.op("Add", [self.op("MatMul", [x, w]), b])


def _float_input(name: str, shape: Sequence[int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def _classifier_head(b: _Builder, x: str, channels: int, classes: int, batch: int) -> onnx.ValueInfoProto:
    """GlobalAveragePool, Flatten, Gemm to logits named `output`."""
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])], axis=1)
    name = b.unique("gemm")
    w = b.normal(f"{name}.weight", (classes, channels), math.sqrt(1.0 / channels))
    bias = b.uniform(f"{name}.bias", (classes,), -0.1, 0.1)
    b.nodes.append(helper.make_node("Gemm", [x, w, bias], ["output"], name=name, transB=1))
    return _float_input("output", (batch, classes))


def mlp(
    batch: int = 1, features: int = 64, hidden: Sequence[int] = (128, 64), classes: int = 10, seed: int = 0
) -> onnx.ModelProto:
    """Gemm + Relu layers, then a Gemm to `classes` and Softmax."""
    b = _Builder(seed)
    x, width = "input", features
    for h in hidden:
        x = b.op("Relu", [b.gemm(x, width, h)])
        width = h
    logits = b.gemm(x, width, classes, gain=1.0)
    b.op("Softmax", [logits], output="output", axis=-1)
    return b.model(
        "mlp", [_float_input("input", (batch, features))], _float_input("output", (batch, classes))
    )


def small_cnn(batch: int = 1, size: int = 32, seed: int = 0) -> onnx.ModelProto:
    """Two Conv3x3 + BatchNorm + Relu blocks around a 2x2 MaxPool, then a classifier head to 10 classes."""
    b = _Builder(seed)
    x = b.op("Relu", [b.batch_norm(b.conv("input", 3, 16, 3), 16)])
    x = b.op("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
    x = b.op("Relu", [b.batch_norm(b.conv(x, 16, 32, 3), 32)])
    out = _classifier_head(b, x, 32, 10, batch)
    return b.model("small_cnn", [_float_input("input", (batch, 3, size, size))], out)


def _basic_block(b: _Builder, x: str, cin: int, cout: int, stride: int) -> str:
    y = b.op("Relu", [b.batch_norm(b.conv(x, cin, cout, 3, stride), cout)])
    y = b.batch_norm(b.conv(y, cout, cout, 3), cout, gain=0.5)
    if stride != 1 or cin != cout:
        x = b.batch_norm(b.conv(x, cin, cout, 1, stride), cout)
    return b.op("Relu", [b.op("Add", [y, x])])


def resnet18(
    batch: int = 1, size: int = 224, classes: int = 1000, width: int = 64, seed: int = 0
) -> onnx.ModelProto:
    """ResNet-18: 7x7/2 stem + 3x3/2 max-pool, 4 stages of 2 BasicBlocks (width, 2w, 4w, 8w channels), head."""
    b = _Builder(seed)
    x = b.op("Relu", [b.batch_norm(b.conv("input", 3, width, 7, 2), width)])
    x = b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = width
    for stage in range(4):
        cout = width * 2**stage
        for block in range(2):
            x = _basic_block(b, x, cin, cout, 2 if stage > 0 and block == 0 else 1)
            cin = cout
    out = _classifier_head(b, x, cin, classes, batch)
    return b.model("resnet18", [_float_input("input", (batch, 3, size, size))], out)


MOBILENET_V2_STAGES = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
)
MOBILENET_V2_STAGES += ((6, 320, 1, 1),)


def _make_divisible(v: float, divisor: int = 8) -> int:
    """Round channels to a multiple of `divisor`, never below 90% of `v` (as in the MobileNetV2 reference)."""
    rounded = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * v else rounded


def _relu6(b: _Builder, x: str) -> str:
    return b.op("Clip", [x, "relu6.min", "relu6.max"], prefix="relu6")


def _inverted_residual(b: _Builder, x: str, cin: int, cout: int, stride: int, expand: int) -> str:
    hidden = cin * expand
    y = x
    if expand != 1:
        y = _relu6(b, b.batch_norm(b.conv(y, cin, hidden, 1), hidden))
    y = _relu6(b, b.batch_norm(b.conv(y, hidden, hidden, 3, stride, group=hidden), hidden))
    y = b.batch_norm(b.conv(y, hidden, cout, 1), cout, gain=0.5 if stride == 1 and cin == cout else 1.0)
    return b.op("Add", [y, x]) if stride == 1 and cin == cout else y


def mobilenet_v2(
    batch: int = 1, size: int = 224, classes: int = 1000, width_mult: float = 1.0, seed: int = 0
) -> onnx.ModelProto:
    """MobileNetV2: 3x3/2 stem, inverted residual stages (t, c, n, s), 1x1 conv to 1280, head."""
    b = _Builder(seed)
    b.const("relu6.min", np.array(0.0, np.float32))
    b.const("relu6.max", np.array(6.0, np.float32))
    cin = _make_divisible(32 * width_mult)
    x = _relu6(b, b.batch_norm(b.conv("input", 3, cin, 3, 2), cin))
    for t, c, n, s in MOBILENET_V2_STAGES:
        cout = _make_divisible(c * width_mult)
        for i in range(n):
            x = _inverted_residual(b, x, cin, cout, s if i == 0 else 1, t)
            cin = cout
    last = _make_divisible(1280 * max(1.0, width_mult))
    x = _relu6(b, b.batch_norm(b.conv(x, cin, last, 1), last))
    out = _classifier_head(b, x, last, classes, batch)
    return b.model("mobilenet_v2", [_float_input("input", (batch, 3, size, size))], out)


def _split_heads(b: _Builder, x: str, shape: str, perm: Sequence[int]) -> str:
    return b.op("Transpose", [b.op("Reshape", [x, shape])], perm=list(perm))


def _attention(b: _Builder, x: str, d_model: int, heads: int, dh: int) -> str:
    """Multi-head self-attention with Q, K, V and output projections; K is transposed to [b, h, dh, seq]."""
    name = b.unique("attention")
    q, k, v = (b.op("MatMul", [x, b.normal(f"{name}.{n}", (d_model, d_model), d_model**-0.5)]) for n in "qkv")
    q = _split_heads(b, q, "heads_shape", (0, 2, 1, 3))
    k = _split_heads(b, k, "heads_shape", (0, 2, 3, 1))
    v = _split_heads(b, v, "heads_shape", (0, 2, 1, 3))
    scores = b.op("Div", [b.op("MatMul", [q, k]), "sqrt_dh"])
    ctx = b.op("MatMul", [b.op("Softmax", [scores], axis=-1), v])
    ctx = b.op("Reshape", [b.op("Transpose", [ctx], perm=[0, 2, 1, 3]), "model_shape"])
    return b.matmul_add(ctx, d_model, d_model)


def _gelu(b: _Builder, x: str) -> str:
    """GELU as x * 0.5 * (1 + erf(x / sqrt(2)))."""
    erf = b.op("Erf", [b.op("Div", [x, "sqrt2"])])
    return b.op("Mul", [b.op("Mul", [x, "half"]), b.op("Add", [erf, "one"])])


def _layer_norm(b: _Builder, x: str, d_model: int, output: str = "") -> str:
    name = b.unique("ln")
    scale = b.uniform(f"{name}.scale", (d_model,), 0.8, 1.2)
    bias = b.uniform(f"{name}.bias", (d_model,), -0.1, 0.1)
    return b.op(
        "LayerNormalization", [x, scale, bias], prefix="layernorm", output=output, axis=-1, epsilon=1e-5
    )


def transformer_encoder(
    batch: int = 1,
    seq: int = 16,
    d_model: int = 64,
    heads: int = 4,
    ff: int = 128,
    layers: int = 2,
    seed: int = 0,
) -> onnx.ModelProto:
    """Post-norm transformer encoder layers (self-attention, FF with erf GELU) on `x` [batch, seq, d_model]."""
    if d_model % heads:
        raise ValueError(f"d_model={d_model} is not divisible by heads={heads}")
    dh = d_model // heads
    b = _Builder(seed)
    b.const("heads_shape", np.array([batch, seq, heads, dh], np.int64))
    b.const("model_shape", np.array([batch, seq, d_model], np.int64))
    for name, value in (("sqrt_dh", math.sqrt(dh)), ("sqrt2", math.sqrt(2.0)), ("half", 0.5), ("one", 1.0)):
        b.const(name, np.array(value, np.float32))
    x = "x"
    for layer in range(layers):
        last = "output" if layer == layers - 1 else ""
        x = _layer_norm(b, b.op("Add", [x, _attention(b, x, d_model, heads, dh)]), d_model)
        y = b.matmul_add(_gelu(b, b.matmul_add(x, d_model, ff, gain=2.0)), ff, d_model)
        x = _layer_norm(b, b.op("Add", [x, y]), d_model, output=last)
    shape = (batch, seq, d_model)
    return b.model("transformer_encoder", [_float_input("x", shape)], _float_input("output", shape))


# --- small float models for post-training quantization (onnxruntime.quantization) ------------------------


def residual_block(batch: int = 1, channels: int = 8, size: int = 8, seed: int = 0) -> onnx.ModelProto:
    """A 3x3 Conv + Relu stem, a ResNet basic block without batch norm (Conv3x3 + Relu, Conv3x3, Add of
    the block's input, Relu), then a 1x1 stride-2 Conv to twice the channels, the output."""
    b = _Builder(seed)
    x = b.op("Relu", [b.conv("input", 3, channels, 3, bias=True)])
    y = b.conv(b.op("Relu", [b.conv(x, channels, channels, 3, bias=True)]), channels, channels, 3)
    x = b.op("Relu", [b.op("Add", [y, x])])
    y = b.conv(x, channels, 2 * channels, 1, stride=2, bias=True)
    out = _float_input(y, (batch, 2 * channels, size // 2, size // 2))
    return b.model("residual_block", [_float_input("input", (batch, 3, size, size))], out)


def pooled_stem(
    batch: int = 1, channels: int = 8, size: int = 8, seed: int = 0, kernel: int = 3, stride: int = 1
) -> onnx.ModelProto:
    """ResNet's stem in small: a 3x3 (`kernel`, `stride`) Conv + Relu, a 3x3 stride-2 MaxPool padded by 1,
    then a 1x1 Conv to twice the channels + Relu as `output`."""
    b = _Builder(seed)
    x = b.op("Relu", [b.conv("input", 3, channels, kernel, stride=stride, bias=True)])
    x = b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    b.op("Relu", [b.conv(x, channels, 2 * channels, 1, bias=True)], output="output")
    side = size // stride // 2
    out = _float_input("output", (batch, 2 * channels, side, side))
    return b.model("pooled_stem", [_float_input("input", (batch, 3, size, size))], out)


def depthwise_separable(batch: int = 1, channels: int = 8, size: int = 8, seed: int = 0) -> onnx.ModelProto:
    """A MobileNet pair after a 3x3 stride-2 stem: depthwise 3x3 + Relu6, pointwise 1x1 + Relu6 as `output`."""
    b = _Builder(seed)
    b.const("relu6.min", np.array(0.0, np.float32))
    b.const("relu6.max", np.array(6.0, np.float32))
    x = _relu6(b, b.conv("input", 3, channels, 3, stride=2, bias=True))
    x = _relu6(b, b.conv(x, channels, channels, 3, group=channels, bias=True))
    y = b.conv(x, channels, 2 * channels, 1, bias=True)
    b.op("Clip", [y, "relu6.min", "relu6.max"], output="output")
    out = _float_input("output", (batch, 2 * channels, size // 2, size // 2))
    return b.model("depthwise_separable", [_float_input("input", (batch, 3, size, size))], out)


def dense_head(
    batch: int = 2, features: int = 32, hidden: int = 24, classes: int = 10, seed: int = 0
) -> onnx.ModelProto:
    """MatMul + bias Add + Relu, then Gemm (transB) to `classes` logits as `output`."""
    b = _Builder(seed)
    x = b.op("Relu", [b.matmul_add("input", features, hidden, gain=2.0)])
    name = b.unique("gemm")
    w = b.normal(f"{name}.weight", (classes, hidden), math.sqrt(1.0 / hidden))
    bias = b.uniform(f"{name}.bias", (classes,), -0.1, 0.1)
    b.nodes.append(helper.make_node("Gemm", [x, w, bias], ["output"], name=name, transB=1))
    out = _float_input("output", (batch, classes))
    return b.model("dense_head", [_float_input("input", (batch, features))], out)


def quantize(
    model: onnx.ModelProto,
    path: str | Path,
    per_channel: bool,
    activations: str = "uint8",
    quant_format: str = "QDQ",
    samples: int = 4,
    seed: int = 0,
    reduce_range: bool = True,
) -> Path:
    """`model` quantized by onnxruntime's `quantize_static` (`quant_format` QDQ or QOperator, int8 weights,
    `activations` int8 or uint8), calibrated on `samples` seeded standard-normal inputs, written to `path`.
    `reduce_range` (the default) quantizes weights to 7 bits, as onnxruntime advises for x86 CPUs without
    VNNI: there its u8s8 kernel adds pairs of products in int16 with saturation, and with 8-bit weights its
    result differs from the exact one (Zen 3: up to 98 LSB on the tests' models), which no comparison with
    it could survive. With 7-bit weights onnxruntime is exact on every x86 class."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    rng = np.random.default_rng(seed)
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in model.graph.input}
    batches = [
        {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()} for _ in range(samples)
    ]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter(batches)

        def get_next(self) -> dict | None:
            return next(self.batches, None)

    path = Path(path)
    source = path.with_suffix(".float.onnx")
    save(model, source)
    quantize_static(
        str(source),
        str(path),
        Reader(),
        quant_format=QuantFormat[quant_format],
        per_channel=per_channel,
        activation_type=QuantType.QInt8 if activations == "int8" else QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        reduce_range=reduce_range,
    )
    return path


EXAMPLES: dict[str, Callable[[], onnx.ModelProto]] = {
    "mlp": lambda: mlp(seed=0),
    "small_cnn": lambda: small_cnn(seed=0),
    "resnet18": lambda: resnet18(seed=0),
    "mobilenet_v2": lambda: mobilenet_v2(seed=0),
    "transformer": lambda: transformer_encoder(seed=0),
}
"""The example models of `recipes/`, by file stem, with their fixed seeds."""


def save(model: onnx.ModelProto, path: str | Path) -> Path:
    """Write `model` to `path` atomically (a temporary file in the same directory, then a rename)."""
    path = Path(path)
    write_atomic(path, model.SerializeToString())
    return path
