"""Deterministic example TFLite models (tests, benchmarks and the recipes' models), written from a small
Python description with the `tflite` package's flatbuffer builders. LiteRT (`ai-edge-litert`, a test
extra) is imported only to calibrate int8 models and to run models as the oracle.

    mb = ModelBuilder()
    x = mb.input((1, 8, 8, 3))
    w = mb.const(np.ones((4, 3, 3, 3), np.float32))
    y = mb.op("CONV_2D", [x, w, -1], options=("Conv2DOptions", {"Padding": SAME, "StrideH": 1, ...}))
    mb.output(y)
    data = mb.build()        # bytes; shapes of op outputs left as None are filled in by LiteRT

Tensors are indices; -1 is an absent optional input. Options are (table name, {Field: value}) with the
schema's CamelCase field names; list values become int32 vectors (ReshapeOptions NewShape...).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import flatbuffers
import numpy as np
import tflite
from tflite.utils import BUILTIN_OPCODE2NAME

from .onnx_models import MOBILENET_V2_STAGES

OPCODES = {name: code for code, name in BUILTIN_OPCODE2NAME.items()}

TENSOR_TYPES = {
    "float32": tflite.TensorType.FLOAT32,
    "float16": tflite.TensorType.FLOAT16,
    "int32": tflite.TensorType.INT32,
    "uint8": tflite.TensorType.UINT8,
    "int64": tflite.TensorType.INT64,
    "bool": tflite.TensorType.BOOL,
    "int16": tflite.TensorType.INT16,
    "int8": tflite.TensorType.INT8,
}

SAME, VALID = tflite.Padding.SAME, tflite.Padding.VALID
ACT = {
    "NONE": tflite.ActivationFunctionType.NONE,
    "RELU": tflite.ActivationFunctionType.RELU,
    "RELU_N1_TO_1": tflite.ActivationFunctionType.RELU_N1_TO_1,
    "RELU6": tflite.ActivationFunctionType.RELU6,
    "TANH": tflite.ActivationFunctionType.TANH,
    "SIGN_BIT": tflite.ActivationFunctionType.SIGN_BIT,
}


@dataclass
class Quant:
    """Quantization of a tensor: one scale/zero point (per tensor) or one per entry of `axis`."""

    scale: Sequence[float]
    zero_point: Sequence[int]
    axis: int = 0

    def __post_init__(self):
        self.scale = [float(s) for s in np.atleast_1d(self.scale)]
        self.zero_point = [int(z) for z in np.atleast_1d(self.zero_point)]


@dataclass
class _Tensor:
    name: str
    shape: tuple[int, ...] | None
    dtype: str
    data: np.ndarray | None = None
    quant: Quant | None = None
    rank_hint: int = 1


@dataclass
class _Op:
    opcode: int
    inputs: list[int]
    outputs: list[int]
    options: tuple[str, dict[str, Any]] | None = None


@dataclass
class ModelBuilder:
    tensors: list[_Tensor] = field(default_factory=list)
    ops: list[_Op] = field(default_factory=list)
    opcodes: list[tuple[int, str]] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)

    def tensor(
        self, shape: Sequence[int] | None, dtype: str = "float32", name: str = "", quant: Quant | None = None
    ) -> int:
        index = len(self.tensors)
        shape = None if shape is None else tuple(int(s) for s in shape)
        self.tensors.append(_Tensor(name or f"t{index}", shape, dtype, None, quant))
        return index

    def input(
        self, shape: Sequence[int], dtype: str = "float32", name: str = "", quant: Quant | None = None
    ) -> int:
        t = self.tensor(shape, dtype, name or f"input{len(self.inputs)}", quant)
        self.inputs.append(t)
        return t

    def const(self, data: np.ndarray, name: str = "", quant: Quant | None = None, dtype: str = "") -> int:
        data = np.ascontiguousarray(data, dtype=dtype or None)
        t = self.tensor(data.shape, str(data.dtype), name or f"const{len(self.tensors)}", quant)
        self.tensors[t].data = data
        return t

    def output(self, *tensors: int) -> None:
        self.outputs.extend(tensors)

    def op(
        self,
        name: str,
        inputs: Sequence[int],
        options: tuple[str, dict[str, Any]] | None = None,
        *,
        outputs: Sequence[int] | None = None,
        num_outputs: int = 1,
        dtype: str = "float32",
        quant: Quant | None = None,
        custom_code: str = "",
        out_name: str = "",
    ) -> int | list[int]:
        """Append an operator; makes `num_outputs` output tensors (shape filled in by build) unless given."""
        code = OPCODES[name]
        key = (code, custom_code)
        if key not in self.opcodes:
            self.opcodes.append(key)
        if outputs is None:
            outputs = [self.tensor(None, dtype, quant=quant) for _ in range(num_outputs)]
            known = [self.tensors[t].shape for t in inputs if t >= 0 and self.tensors[t].shape is not None]
            for t in outputs:
                self.tensors[t].rank_hint = max(len(known[0]) if known else 1, 1)
            if out_name:
                self.tensors[outputs[0]].name = out_name
        self.ops.append(_Op(self.opcodes.index(key), list(inputs), list(outputs), options))
        return outputs[0] if len(outputs) == 1 else list(outputs)

    def build(self, subgraphs: int = 1) -> bytes:
        """The model's flatbuffer; op outputs without a shape get the shapes LiteRT infers for them."""
        if any(t.shape is None for t in self.tensors):
            self._infer_shapes()
        return self.serialize(subgraphs)

    def _infer_shapes(self) -> None:
        from ai_edge_litert.interpreter import Interpreter, OpResolverType

        interp = Interpreter(
            model_content=self.serialize(1),
            experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
        )
        interp.allocate_tensors()
        for detail in interp.get_tensor_details():
            if detail["index"] >= len(self.tensors):
                continue  # the interpreter's scratch tensors
            t = self.tensors[detail["index"]]
            if t.shape is None:
                t.shape = tuple(int(s) for s in detail["shape"])

    def serialize(self, subgraphs: int = 1) -> bytes:
        b = flatbuffers.Builder(1024)
        buffer_of = {
            i: k + 1 for k, i in enumerate(i for i, t in enumerate(self.tensors) if t.data is not None)
        }
        contents = [b""] + [self.tensors[i].data.tobytes() for i in buffer_of]
        buffers = [_buffer(b, data) for data in contents]
        tensors = [self._tensor(b, t, buffer_of.get(i, 0)) for i, t in enumerate(self.tensors)]
        ops = [self._operator(b, op) for op in self.ops]
        graphs = [self._subgraph(b, tensors, ops, i) for i in range(subgraphs)]
        codes = []
        for code, custom in self.opcodes:
            custom_off = b.CreateString(custom) if custom else None
            tflite.OperatorCodeStart(b)
            tflite.OperatorCodeAddDeprecatedBuiltinCode(b, min(code, 127))
            tflite.OperatorCodeAddBuiltinCode(b, code)
            tflite.OperatorCodeAddVersion(b, 1)
            if custom_off is not None:
                tflite.OperatorCodeAddCustomCode(b, custom_off)
            codes.append(tflite.OperatorCodeEnd(b))
        description = b.CreateString("aotc test model")
        codes_vec = _offsets(b, tflite.ModelStartOperatorCodesVector, codes)
        graphs_vec = _offsets(b, tflite.ModelStartSubgraphsVector, graphs)
        buffers_vec = _offsets(b, tflite.ModelStartBuffersVector, buffers)
        tflite.ModelStart(b)
        tflite.ModelAddVersion(b, 3)
        tflite.ModelAddOperatorCodes(b, codes_vec)
        tflite.ModelAddSubgraphs(b, graphs_vec)
        tflite.ModelAddDescription(b, description)
        tflite.ModelAddBuffers(b, buffers_vec)
        b.Finish(tflite.ModelEnd(b), file_identifier=b"TFL3")
        return bytes(b.Output())

    def _tensor(self, b: flatbuffers.Builder, t: _Tensor, buffer: int) -> int:
        name = b.CreateString(t.name)
        shape = t.shape if t.shape is not None else (1,) * t.rank_hint
        shape_vec = b.CreateNumpyVector(np.asarray(shape, np.int32))
        quant = _quantization(b, t.quant) if t.quant is not None else None
        tflite.TensorStart(b)
        tflite.TensorAddShape(b, shape_vec)
        tflite.TensorAddType(b, TENSOR_TYPES[t.dtype])
        tflite.TensorAddBuffer(b, buffer)
        tflite.TensorAddName(b, name)
        if quant is not None:
            tflite.TensorAddQuantization(b, quant)
        return tflite.TensorEnd(b)

    def _operator(self, b: flatbuffers.Builder, op: _Op) -> int:
        ins = b.CreateNumpyVector(np.asarray(op.inputs, np.int32))
        outs = b.CreateNumpyVector(np.asarray(op.outputs, np.int32))
        options = _options(b, *op.options) if op.options else None
        tflite.OperatorStart(b)
        tflite.OperatorAddOpcodeIndex(b, op.opcode)
        tflite.OperatorAddInputs(b, ins)
        tflite.OperatorAddOutputs(b, outs)
        if options is not None:
            tflite.OperatorAddBuiltinOptionsType(b, getattr(tflite.BuiltinOptions, op.options[0]))
            tflite.OperatorAddBuiltinOptions(b, options)
        return tflite.OperatorEnd(b)

    def _subgraph(self, b: flatbuffers.Builder, tensors: list[int], ops: list[int], index: int) -> int:
        tensors_vec = _offsets(b, tflite.SubGraphStartTensorsVector, tensors)
        ops_vec = _offsets(b, tflite.SubGraphStartOperatorsVector, ops)
        ins = b.CreateNumpyVector(np.asarray(self.inputs, np.int32))
        outs = b.CreateNumpyVector(np.asarray(self.outputs, np.int32))
        name = b.CreateString(f"main{index}" if index else "main")
        tflite.SubGraphStart(b)
        tflite.SubGraphAddTensors(b, tensors_vec)
        tflite.SubGraphAddInputs(b, ins)
        tflite.SubGraphAddOutputs(b, outs)
        tflite.SubGraphAddOperators(b, ops_vec)
        tflite.SubGraphAddName(b, name)
        return tflite.SubGraphEnd(b)


def _buffer(b: flatbuffers.Builder, data: bytes) -> int:
    vec = None
    if data:
        b.StartVector(1, len(data), 16)
        b.head -= len(data)
        b.Bytes[b.head : b.head + len(data)] = data
        vec = b.EndVector()
    tflite.BufferStart(b)
    if vec is not None:
        tflite.BufferAddData(b, vec)
    return tflite.BufferEnd(b)


def _offsets(b: flatbuffers.Builder, start, offsets: list[int]) -> int:
    start(b, len(offsets))
    for off in reversed(offsets):
        b.PrependUOffsetTRelative(off)
    return b.EndVector()


def _quantization(b: flatbuffers.Builder, q: Quant) -> int:
    scale = b.CreateNumpyVector(np.asarray(q.scale, np.float32))
    zero = b.CreateNumpyVector(np.asarray(q.zero_point, np.int64))
    tflite.QuantizationParametersStart(b)
    tflite.QuantizationParametersAddScale(b, scale)
    tflite.QuantizationParametersAddZeroPoint(b, zero)
    tflite.QuantizationParametersAddQuantizedDimension(b, q.axis)
    return tflite.QuantizationParametersEnd(b)


def _options(b: flatbuffers.Builder, table: str, fields: dict[str, Any]) -> int:
    vectors = {}
    for key, value in fields.items():
        if isinstance(value, list | tuple):
            vectors[key] = b.CreateNumpyVector(np.asarray(value, np.int32))
    getattr(tflite, f"{table}Start")(b)
    for key, value in fields.items():
        adder = getattr(tflite, f"{table}Add{key}")
        adder(b, vectors.get(key, value))
    return getattr(tflite, f"{table}End")(b)


# --- post-training quantization of a float description -----------------------------------------------

WEIGHT_AXIS = {"CONV_2D": 0, "DEPTHWISE_CONV_2D": 3, "FULLY_CONNECTED": 0}
"""Operators whose input 1 is a weight (symmetric int8, per channel along this axis) and input 2 a bias."""

SAME_AS_INPUT = {
    "RESHAPE",
    "SQUEEZE",
    "EXPAND_DIMS",
    "TRANSPOSE",
    "MAX_POOL_2D",
    "AVERAGE_POOL_2D",
    "SLICE",
    "STRIDED_SLICE",
    "GATHER",
    "SPLIT",
    "PAD",
    "PADV2",
    "RESIZE_NEAREST_NEIGHBOR",
}
"""Operators whose int8 output keeps the input's scale and zero point (TFLite moves raw values)."""

FIXED_OUTPUT = {"LOGISTIC": (1 / 256, -128), "SOFTMAX": (1 / 256, -128), "TANH": (1 / 128, 0)}


def quantized(
    mb: ModelBuilder, calibration: list[list[np.ndarray]], per_channel: bool = True, io: str = "int8"
) -> ModelBuilder:
    """An int8 copy of float model `mb` with parameters from the ranges seen on `calibration` inputs.

    Weights are symmetric int8 (per output channel when `per_channel`; FULLY_CONNECTED per tensor),
    biases int32 at input scale x weight scale, activations asymmetric int8. `io="float"` keeps float
    inputs and outputs with QUANTIZE / DEQUANTIZE operators at the edges.
    """
    ranges = calibrate(mb, calibration)
    q = copy.deepcopy(mb)
    names = {i: BUILTIN_OPCODE2NAME[code] for i, (code, _) in enumerate(q.opcodes)}

    def activation_quant(t: int) -> Quant:
        low, high = ranges[t]
        return quant_of(low, high)

    for t in q.inputs:
        q.tensors[t].quant = activation_quant(t)
    weights, biases = {}, {}
    for op in q.ops:
        name = names[op.opcode]
        if name in WEIGHT_AXIS:
            weights[op.inputs[1]] = WEIGHT_AXIS[name] if per_channel and name != "FULLY_CONNECTED" else None
            if len(op.inputs) > 2 and op.inputs[2] >= 0:
                biases[op.inputs[2]] = (op.inputs[0], op.inputs[1])
        for out in op.outputs:
            if q.tensors[out].dtype != "float32":
                continue
            if name in SAME_AS_INPUT:
                source = op.inputs[1] if name == "SPLIT" else op.inputs[0]
                q.tensors[out].quant = q.tensors[source].quant
            elif name in FIXED_OUTPUT:
                q.tensors[out].quant = Quant([FIXED_OUTPUT[name][0]], [FIXED_OUTPUT[name][1]])
            else:
                q.tensors[out].quant = activation_quant(out)
        if name == "PADV2" and len(op.inputs) > 2:
            q.tensors[op.inputs[2]].quant = q.tensors[op.inputs[0]].quant
    for op in q.ops:
        if names[op.opcode] == "CONCATENATION":  # int8 CONCATENATION needs one scale for all its tensors
            tensors = [*op.inputs, *op.outputs]
            shared = quant_of(min(ranges[t][0] for t in tensors), max(ranges[t][1] for t in tensors))
            for t in tensors:
                q.tensors[t].quant.scale, q.tensors[t].quant.zero_point = shared.scale, shared.zero_point
    for t, axis in weights.items():
        tensor = q.tensors[t]
        tensor.data, tensor.quant = symmetric_weights(tensor.data, axis)
        tensor.dtype = "int8"
    for t, (x, w) in biases.items():
        tensor = q.tensors[t]
        scales = np.asarray(q.tensors[x].quant.scale) * np.asarray(q.tensors[w].quant.scale)
        tensor.data = np.round(tensor.data / scales).astype(np.int32)
        tensor.quant = Quant(scales, [0] * len(scales), 0)
        tensor.dtype = "int32"
    for i, tensor in enumerate(q.tensors):
        if tensor.dtype != "float32":
            continue
        if tensor.data is not None:
            if tensor.quant is None:
                tensor.quant = quant_of(float(tensor.data.min()), float(tensor.data.max()))
            tensor.data = quantize(tensor.data, tensor.quant.scale[0], tensor.quant.zero_point[0])
        elif tensor.quant is None:
            tensor.quant = activation_quant(i)
        tensor.dtype = "int8"
    if io == "float":
        _float_edges(q)
    return q


def _float_edges(q: ModelBuilder) -> None:
    """Float inputs and outputs around the int8 model: QUANTIZE after each input, DEQUANTIZE before outputs."""
    inputs, outputs = [], []
    edge_ops = []
    for t in q.inputs:
        f = q.tensor(q.tensors[t].shape, "float32", q.tensors[t].name + "_float")
        edge_ops.append(("QUANTIZE", f, t))
        inputs.append(f)
    body = q.ops
    q.ops = []
    for _, f, t in edge_ops:
        q.op("QUANTIZE", [f], outputs=[t])
    q.ops.extend(body)
    for t in q.outputs:
        f = q.tensor(q.tensors[t].shape, "float32", q.tensors[t].name + "_float")
        q.op("DEQUANTIZE", [t], outputs=[f])
        outputs.append(f)
    q.inputs, q.outputs = inputs, outputs


def calibrate(mb: ModelBuilder, calibration: list[list[np.ndarray]]) -> dict[int, tuple[float, float]]:
    """(min, max) of every float tensor of `mb` over runs of LiteRT on the calibration inputs."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    interp = Interpreter(
        model_content=mb.build(),
        experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
        experimental_preserve_all_tensors=True,
    )
    interp.allocate_tensors()
    ranges: dict[int, tuple[float, float]] = {}
    for inputs in calibration:
        for t, v in zip(mb.inputs, inputs):
            interp.set_tensor(t, np.asarray(v, np.float32))
        interp.invoke()
        for t, tensor in enumerate(mb.tensors):
            if tensor.dtype != "float32":
                continue
            v = interp.get_tensor(t)
            low, high = ranges.get(t, (0.0, 0.0))
            ranges[t] = (min(low, float(v.min())), max(high, float(v.max())))
    return ranges


# --- helpers for test models ----------------------------------------------------------------------------


def quantize(x: np.ndarray, scale: float, zero_point: int, dtype: str = "int8") -> np.ndarray:
    info = np.iinfo(dtype)
    return np.clip(np.round(x / scale) + zero_point, info.min, info.max).astype(dtype)


def quant_of(low: float, high: float, dtype: str = "int8") -> Quant:
    """Asymmetric per-tensor parameters covering [low, high] (with 0 exactly representable)."""
    info = np.iinfo(dtype)
    low, high = min(low, 0.0), max(high, 0.0, low + 1e-3)
    scale = (high - low) / (info.max - info.min)
    zero = int(np.clip(round(info.min - low / scale), info.min, info.max))
    return Quant([scale], [zero])


def symmetric_weights(w: np.ndarray, axis: int | None) -> tuple[np.ndarray, Quant]:
    """int8 weights with symmetric scales: one per tensor (axis None) or one per entry of `axis`."""
    if axis is None:
        scale = np.array([max(float(np.abs(w).max()), 1e-8) / 127.0])
        q = np.clip(np.round(w / scale[0]), -127, 127).astype(np.int8)
        return q, Quant(scale, [0], 0)
    moved = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)
    scale = np.maximum(np.abs(moved).max(axis=1), 1e-8) / 127.0
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.clip(np.round(w / scale.reshape(shape)), -127, 127).astype(np.int8)
    return q, Quant(scale, [0] * len(scale), axis)


def run_litert(
    data: bytes, inputs: dict[str, np.ndarray] | list[np.ndarray], xnnpack: bool = True
) -> dict[str, np.ndarray]:
    """The LiteRT interpreter's outputs (by tensor name) on `inputs` (by name, or in input order);
    `xnnpack=False` runs TFLite's builtin kernels without the default XNNPACK delegate."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    resolver = OpResolverType.AUTO if xnnpack else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    interp = Interpreter(model_content=data, num_threads=1, experimental_op_resolver_type=resolver)
    interp.allocate_tensors()
    details = interp.get_input_details()
    values = inputs if isinstance(inputs, list) else [inputs[d["name"]] for d in details]
    for d, v in zip(details, values):
        interp.set_tensor(d["index"], np.asarray(v, d["dtype"]))
    interp.invoke()
    return {d["name"]: interp.get_tensor(d["index"]).copy() for d in interp.get_output_details()}


def conv_options(padding=SAME, stride=(1, 1), dilation=(1, 1), act="NONE") -> tuple[str, dict]:
    return (
        "Conv2DOptions",
        {
            "Padding": padding,
            "StrideH": stride[0],
            "StrideW": stride[1],
            "DilationHFactor": dilation[0],
            "DilationWFactor": dilation[1],
            "FusedActivationFunction": ACT[act],
        },
    )


def depthwise_options(padding=SAME, stride=(1, 1), dilation=(1, 1), multiplier=1, act="NONE"):
    table, fields = conv_options(padding, stride, dilation, act)
    return ("DepthwiseConv2DOptions", fields | {"DepthMultiplier": multiplier})


def pool_options(kernel=(2, 2), padding=SAME, stride=(2, 2), act="NONE") -> tuple[str, dict]:
    return (
        "Pool2DOptions",
        {
            "Padding": padding,
            "StrideH": stride[0],
            "StrideW": stride[1],
            "FilterHeight": kernel[0],
            "FilterWidth": kernel[1],
            "FusedActivationFunction": ACT[act],
        },
    )


def act_options(table: str, act: str = "NONE", **fields) -> tuple[str, dict]:
    return (table, {"FusedActivationFunction": ACT[act], **fields})


# --- example models ---------------------------------------------------------------------------------------


def _weights(rng: np.random.Generator, *shape: int, fan_in: int) -> np.ndarray:
    return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)


def _conv(
    mb: ModelBuilder,
    rng,
    x: int,
    cin: int,
    cout: int,
    k: int = 1,
    stride: int = 1,
    act: str = "RELU6",
    gain: float = 1.0,
) -> int:
    w = mb.const(_weights(rng, cout, k, k, cin, fan_in=k * k * cin) * np.float32(gain))
    b = mb.const((rng.standard_normal(cout) * 0.1).astype(np.float32))
    return mb.op("CONV_2D", [x, w, b], conv_options(SAME, (stride, stride), act=act))


def _depthwise(mb: ModelBuilder, rng, x: int, c: int, stride: int) -> int:
    w = mb.const(_weights(rng, 1, 3, 3, c, fan_in=9))
    b = mb.const((rng.standard_normal(c) * 0.1).astype(np.float32))
    return mb.op("DEPTHWISE_CONV_2D", [x, w, b], depthwise_options(SAME, (stride, stride), act="RELU6"))


def _dense(mb: ModelBuilder, rng, x: int, k: int, n: int, act: str = "NONE", keep: bool = False) -> int:
    w = mb.const(_weights(rng, n, k, fan_in=k))
    b = mb.const((rng.standard_normal(n) * 0.1).astype(np.float32))
    return mb.op("FULLY_CONNECTED", [x, w, b], act_options("FullyConnectedOptions", act, KeepNumDims=keep))


BLOCKS = ((16, 1, 4), (24, 2, 4), (24, 1, 4), (32, 2, 4), (32, 1, 4))
"""(output channels, stride, expansion) of each inverted residual block."""


def mobilenet_blocks(
    size: int = 32, classes: int = 10, seed: int = 0, blocks: int = len(BLOCKS)
) -> ModelBuilder:
    """A MobileNetV2-style stack: stem conv, inverted residual blocks (expand 1x1, depthwise 3x3, linear
    project 1x1, residual ADD), 1x1 head, global MEAN, FULLY_CONNECTED, SOFTMAX."""
    rng = np.random.default_rng(seed)
    mb = ModelBuilder()
    x = mb.input((1, size, size, 3), name="image")
    y = _conv(mb, rng, x, 3, 16, k=3, stride=2)
    channels = 16
    for cout, stride, expand in BLOCKS[:blocks]:
        h = _conv(mb, rng, y, channels, channels * expand)
        h = _depthwise(mb, rng, h, channels * expand, stride)
        h = _conv(mb, rng, h, channels * expand, cout, act="NONE")
        if stride == 1 and cout == channels:
            h = mb.op("ADD", [y, h], act_options("AddOptions"))
        y, channels = h, cout
    y = _conv(mb, rng, y, channels, 64)
    y = mb.op("MEAN", [y, mb.const(np.array([1, 2], np.int32))], ("ReducerOptions", {"KeepDims": False}))
    y = _dense(mb, rng, y, 64, classes)
    mb.output(mb.op("SOFTMAX", [y], ("SoftmaxOptions", {"Beta": 1.0}), out_name="probabilities"))
    mb.build()
    return mb


def _make_divisible(v: float, divisor: int = 8) -> int:
    """Channels rounded to a multiple of `divisor`, never below 90% of `v` (the MobileNetV2 reference's
    rule, as onnx_models.mobilenet_v2 rounds them)."""
    rounded = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * v else rounded


def mobilenet_v2(
    size: int = 224, classes: int = 1000, width_mult: float = 1.0, seed: int = 0
) -> ModelBuilder:
    """MobileNetV2 (the reference architecture, onnx_models.MOBILENET_V2_STAGES): 3x3/2 stem conv with
    RELU6, inverted residual stages (t, c, n, s) of blocks expand 1x1 + RELU6 (none when t == 1), depthwise
    3x3 + RELU6, linear project 1x1, residual ADD where stride 1 keeps the channels; 1x1 conv to 1280 +
    RELU6, global MEAN, FULLY_CONNECTED to `classes`, SOFTMAX. The linear projections are drawn at 1/sqrt(2)
    of the He scale (no activation follows them), those feeding a residual ADD at 1/2, so activations stay
    O(1) through the 17 blocks (std 0.3 to 2 on uniform [-1, 1) images, few at the RELU6 bound)."""
    rng = np.random.default_rng(seed)
    mb = ModelBuilder()
    x = mb.input((1, size, size, 3), name="image")
    channels = _make_divisible(32 * width_mult)
    y = _conv(mb, rng, x, 3, channels, k=3, stride=2)
    for expand, c, repeats, first_stride in MOBILENET_V2_STAGES:
        cout = _make_divisible(c * width_mult)
        for i in range(repeats):
            stride = first_stride if i == 0 else 1
            residual = stride == 1 and cout == channels
            hidden = channels * expand
            h = y if expand == 1 else _conv(mb, rng, y, channels, hidden)
            h = _depthwise(mb, rng, h, hidden, stride)
            h = _conv(mb, rng, h, hidden, cout, act="NONE", gain=0.5 if residual else 0.5**0.5)
            if residual:
                h = mb.op("ADD", [y, h], act_options("AddOptions"))
            y, channels = h, cout
    last = _make_divisible(1280 * max(1.0, width_mult))
    y = _conv(mb, rng, y, channels, last)
    y = mb.op("MEAN", [y, mb.const(np.array([1, 2], np.int32))], ("ReducerOptions", {"KeepDims": False}))
    y = _dense(mb, rng, y, last, classes)
    mb.output(mb.op("SOFTMAX", [y], ("SoftmaxOptions", {"Beta": 1.0}), out_name="probabilities"))
    mb.build()
    return mb


def small_cnn(size: int = 16, classes: int = 10, seed: int = 1) -> ModelBuilder:
    """conv-relu, max pool, conv-relu, average pool, flatten, two FULLY_CONNECTED, SOFTMAX."""
    rng = np.random.default_rng(seed)
    mb = ModelBuilder()
    x = mb.input((1, size, size, 3), name="image")
    y = _conv(mb, rng, x, 3, 8, k=3, act="RELU")
    y = mb.op("MAX_POOL_2D", [y], pool_options((2, 2), VALID, (2, 2)))
    y = _conv(mb, rng, y, 8, 16, k=3, act="RELU")
    y = mb.op("AVERAGE_POOL_2D", [y], pool_options((2, 2), VALID, (2, 2)))
    flat = 16 * (size // 4) ** 2
    y = mb.op("RESHAPE", [y, mb.const(np.array([1, flat], np.int32))])
    y = _dense(mb, rng, y, flat, 32, act="RELU")
    y = _dense(mb, rng, y, 32, classes)
    mb.output(mb.op("SOFTMAX", [y], ("SoftmaxOptions", {"Beta": 1.0})))
    mb.build()
    return mb


def _layer_norm(mb: ModelBuilder, rng, x: int, d: int) -> int:
    axis = mb.const(np.array([-1], np.int32))
    mean = mb.op("MEAN", [x, axis], ("ReducerOptions", {"KeepDims": True}))
    var = mb.op(
        "MEAN", [mb.op("SQUARED_DIFFERENCE", [x, mean]), axis], ("ReducerOptions", {"KeepDims": True})
    )
    inv = mb.op(
        "RSQRT", [mb.op("ADD", [var, mb.const(np.array([1e-5], np.float32))], act_options("AddOptions"))]
    )
    centered = mb.op("SUB", [x, mean], act_options("SubOptions"))
    gamma = mb.const((1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32))
    beta = mb.const((0.1 * rng.standard_normal(d)).astype(np.float32))
    y = mb.op("MUL", [centered, inv], act_options("MulOptions"))
    y = mb.op("MUL", [y, gamma], act_options("MulOptions"))
    return mb.op("ADD", [y, beta], act_options("AddOptions"))


def transformer_block(seq: int = 8, d: int = 32, heads: int = 4, seed: int = 2) -> ModelBuilder:
    """Pre-norm encoder block: layer norm, multi-head self-attention (BATCH_MATMUL, SOFTMAX), residual,
    layer norm, GELU feed-forward, residual."""
    rng = np.random.default_rng(seed)
    hd = d // heads
    mb = ModelBuilder()
    x = mb.input((1, seq, d), name="tokens")
    h = _layer_norm(mb, rng, x, d)

    def project_heads(v: int) -> int:
        v = mb.op("RESHAPE", [v, mb.const(np.array([1, seq, heads, hd], np.int32))])
        return mb.op("TRANSPOSE", [v, mb.const(np.array([0, 2, 1, 3], np.int32))])

    q, k, v = (project_heads(_dense(mb, rng, h, d, d, keep=True)) for _ in range(3))
    scores = mb.op("BATCH_MATMUL", [q, k], ("BatchMatMulOptions", {"AdjX": False, "AdjY": True}))
    scores = mb.op("MUL", [scores, mb.const(np.array([hd**-0.5], np.float32))], act_options("MulOptions"))
    attn = mb.op("SOFTMAX", [scores], ("SoftmaxOptions", {"Beta": 1.0}))
    ctx = mb.op("BATCH_MATMUL", [attn, v], ("BatchMatMulOptions", {"AdjX": False, "AdjY": False}))
    ctx = mb.op("TRANSPOSE", [ctx, mb.const(np.array([0, 2, 1, 3], np.int32))])
    ctx = mb.op("RESHAPE", [ctx, mb.const(np.array([1, seq, d], np.int32))])
    x = mb.op("ADD", [x, _dense(mb, rng, ctx, d, d, keep=True)], act_options("AddOptions"))
    h = _layer_norm(mb, rng, x, d)
    h = mb.op("GELU", [_dense(mb, rng, h, d, 2 * d, keep=True)], ("GeluOptions", {"Approximate": False}))
    mb.output(mb.op("ADD", [x, _dense(mb, rng, h, 2 * d, d, keep=True)], act_options("AddOptions")))
    mb.build()
    return mb


def int8_model(mb: ModelBuilder, per_channel: bool = True, io: str = "int8", seed: int = 100) -> ModelBuilder:
    """The int8 form of float model `mb`, calibrated on 8 seeded uniform [-1, 1) inputs."""
    rng = np.random.default_rng(seed)
    calibration = [
        [rng.uniform(-1, 1, mb.tensors[t].shape).astype(np.float32) for t in mb.inputs] for _ in range(8)
    ]
    q = quantized(mb, calibration, per_channel=per_channel, io=io)
    q.build()
    return q
