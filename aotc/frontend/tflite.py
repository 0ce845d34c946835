"""TFLite frontend: a .tflite flatbuffer -> a Graph of registered operators, NHWC layout kept as stored.

The file is read eagerly into plain records (`TfModel`: tensors with their weights and quantization,
operators with their options) so that a truncated or corrupt file fails here, naming the file; the
operator converters live in `aotc.frontend.tflite_ops`. Every node output's type comes from the tensor
expression of its operator and is checked against the type the file declares.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tflite
from tflite.utils import BUILTIN_OPCODE2NAME

from aotc.frontend.batch import MODEL_BATCH, BatchTracker, rebatch_size
from aotc.frontend.errors import (
    ConversionError,
    DynamicShapeError,
    InputShapeError,
    ModelLoadError,
    UnsupportedOperatorError,
)
from aotc.frontend.folding import live_nodes, typed_node
from aotc.frontend.options import DEFAULT_REQUANTIZE, REQUANTIZE_CHOICES
from aotc.graph.ir import Graph, Node, TensorType, Value
from aotc.ir.expr import DTYPES, unique_name

__all__ = [
    "QuantParams",
    "TfModel",
    "TfOperator",
    "TfTensor",
    "load_tflite",
    "read_tflite",
    "supported_operators",
]

InputShapes = Mapping[str, tuple[Sequence[int] | None, str | None]]

_TENSOR_DTYPES = {
    tflite.TensorType.FLOAT32: "float32",
    tflite.TensorType.FLOAT16: "float16",
    tflite.TensorType.FLOAT64: "float64",
    tflite.TensorType.INT32: "int32",
    tflite.TensorType.UINT8: "uint8",
    tflite.TensorType.INT64: "int64",
    tflite.TensorType.BOOL: "bool",
    tflite.TensorType.INT16: "int16",
    tflite.TensorType.INT8: "int8",
    tflite.TensorType.UINT16: "uint16",
    tflite.TensorType.UINT32: "uint32",
}
_TYPE_NAMES = {v: k for k, v in vars(tflite.TensorType).items() if not k.startswith("_")}
_OPTION_TABLES = {v: k for k, v in vars(tflite.BuiltinOptions).items() if not k.startswith("_")}
_CUSTOM = 32


@dataclass(frozen=True)
class QuantParams:
    """Affine quantization real = scale * (q - zero_point): one entry per tensor, or one per `axis` entry."""

    scales: tuple[float, ...]
    zero_points: tuple[int, ...]
    axis: int = 0

    @property
    def per_tensor(self) -> bool:
        return len(self.scales) == 1

    @property
    def scale(self) -> float:
        return self.scales[0]

    @property
    def zero_point(self) -> int:
        return self.zero_points[0]


@dataclass
class TfTensor:
    index: int
    name: str
    shape: tuple[int, ...]
    signature: tuple[int, ...] | None
    dtype: str
    data: np.ndarray | None
    quant: QuantParams | None


@dataclass
class TfOperator:
    index: int
    code: str
    """The builtin operator's name (CONV_2D...), or CUSTOM(name) for a custom one."""
    inputs: list[int]
    outputs: list[int]
    options: Any
    """The operator's builtin options table (a `tflite.*Options` object), None when absent."""

    @property
    def label(self) -> str:
        return f"#{self.index}"

    def opt(self, field: str, default: Any = None) -> Any:
        """The value of a field of the builtin options, or `default` when the op carries no options."""
        return default if self.options is None else getattr(self.options, field)()


@dataclass
class TfModel:
    source: str
    tensors: list[TfTensor]
    operators: list[TfOperator]
    inputs: list[int]
    outputs: list[int]
    name: str


def load_tflite(
    path_or_bytes: str | os.PathLike | bytes,
    input_shapes: InputShapes | None = None,
    requantize: str = DEFAULT_REQUANTIZE,
) -> Graph:
    """Read a .tflite model into a Graph.

    `input_shapes` maps an input tensor's name to `(shape, dtype)`; a None shape keeps the model's, and a
    given shape may change only the dimensions the model's shape signature leaves dynamic (-1).
    `requantize` is one of REQUANTIZE_CHOICES (DEFAULT_REQUANTIZE says what each means).
    """
    from aotc.frontend.tflite_ops import CONVERTERS

    if requantize not in REQUANTIZE_CHOICES:
        raise ValueError(f"requantize must be one of {', '.join(REQUANTIZE_CHOICES)}, got {requantize!r}")
    model = read_tflite(path_or_bytes)
    missing: dict[str, list[str]] = {}
    for op in model.operators:
        if op.code not in CONVERTERS:
            missing.setdefault(op.code, []).append(_op_label(model, op))
    if missing:
        raise UnsupportedOperatorError(model.source, missing)
    conv = Converter(model, requantize)
    inputs = conv.bind_inputs(dict(input_shapes or {}))
    for op in model.operators:
        conv.convert(op, CONVERTERS[op.code])
    outputs = [conv.value(t) for t in model.outputs]
    graph = Graph(inputs, outputs, live_nodes(conv.nodes, outputs), model.name)
    graph.verify()
    return graph


def supported_operators() -> list[str]:
    from aotc.frontend.tflite_ops import CONVERTERS

    return sorted(CONVERTERS)


# --- reading the flatbuffer ------------------------------------------------------------------------------


def read_tflite(path_or_bytes: str | os.PathLike | bytes) -> TfModel:
    """The model's single subgraph as plain records; ModelLoadError (naming the file) if it is not one."""
    raw = isinstance(path_or_bytes, bytes | bytearray)
    source = "<bytes>" if raw else os.fspath(path_or_bytes)
    if raw:
        data = bytes(path_or_bytes)
    else:
        if not os.path.isfile(source):
            raise ModelLoadError(f"{source}: no such model file")
        with open(source, "rb") as f:
            data = f.read()
    if len(data) < 8 or data[4:8] != b"TFL3":
        raise ModelLoadError(f"{source}: not a TFLite model (no TFL3 file identifier; {len(data)} bytes)")
    try:
        model = tflite.Model.GetRootAs(data, 0)
        count = model.SubgraphsLength()
        if count != 1:
            raise ModelLoadError(
                f"{source}: the model has {count} subgraphs; aotc reads models with exactly one "
                f"(control flow such as WHILE/IF that calls other subgraphs is not supported)"
            )
        return _read_model(model, source)
    except ModelLoadError:
        raise
    except Exception as e:  # flatbuffers raises assorted types (struct.error, IndexError...) on bad data
        raise ModelLoadError(
            f"{source}: not a valid TFLite flatbuffer, truncated or corrupt ({type(e).__name__}: {e})"
        ) from e


def _read_model(model: tflite.Model, source: str) -> TfModel:
    graph = model.Subgraphs(0)
    codes = [_opcode_name(model.OperatorCodes(i)) for i in range(model.OperatorCodesLength())]
    buffers = model.BuffersLength()
    tensors = [
        _read_tensor(model, graph.Tensors(i), i, buffers, source) for i in range(graph.TensorsLength())
    ]
    count = len(tensors)

    def indices(values: np.ndarray, what: str, optional: bool = False) -> list[int]:
        out = [int(v) for v in values]
        low = -1 if optional else 0
        if any(not low <= v < count for v in out):
            raise ModelLoadError(f"{source}: {what} refers to a tensor outside 0..{count - 1}: {out}")
        return out

    operators = []
    for i in range(graph.OperatorsLength()):
        op = graph.Operators(i)
        code_index = op.OpcodeIndex()
        if not 0 <= code_index < len(codes):
            raise ModelLoadError(f"{source}: operator #{i} has opcode index {code_index} out of range")
        operators.append(
            TfOperator(
                i,
                codes[code_index],
                indices(op.InputsAsNumpy() if op.InputsLength() else [], f"operator #{i}", optional=True),
                indices(op.OutputsAsNumpy() if op.OutputsLength() else [], f"operator #{i}"),
                _options(op),
            )
        )
    name = graph.Name().decode() if graph.Name() else ""
    if not name or name == "main":
        name = os.path.splitext(os.path.basename(source))[0] if source != "<bytes>" else "model"
    return TfModel(
        source,
        tensors,
        operators,
        indices(graph.InputsAsNumpy() if graph.InputsLength() else [], "the subgraph's inputs"),
        indices(graph.OutputsAsNumpy() if graph.OutputsLength() else [], "the subgraph's outputs"),
        name,
    )


def _opcode_name(code: tflite.OperatorCode) -> str:
    builtin = max(code.DeprecatedBuiltinCode(), code.BuiltinCode())
    if builtin == _CUSTOM:
        custom = code.CustomCode()
        return f"CUSTOM({custom.decode() if custom else '?'})"
    return BUILTIN_OPCODE2NAME.get(builtin, f"BUILTIN_{builtin}")


def _read_tensor(model: tflite.Model, t: tflite.Tensor, index: int, buffers: int, source: str) -> TfTensor:
    name = t.Name().decode() if t.Name() else f"tensor{index}"
    type_code = t.Type()
    dtype = _TENSOR_DTYPES.get(type_code)
    shape = tuple(int(s) for s in t.ShapeAsNumpy()) if t.ShapeLength() else ()
    signature = tuple(int(s) for s in t.ShapeSignatureAsNumpy()) if t.ShapeSignatureLength() else None
    if t.Sparsity() is not None:
        raise ModelLoadError(f"{source}: tensor {name} is sparse; sparse weights are not supported")
    data = None
    buffer_index = t.Buffer()
    if not 0 <= buffer_index < buffers:
        raise ModelLoadError(f"{source}: tensor {name} refers to buffer {buffer_index} of {buffers}")
    buffer = model.Buffers(buffer_index)
    if buffer_index and buffer.Offset() > 1:
        raise ModelLoadError(f"{source}: tensor {name} keeps its data outside the flatbuffer (not supported)")
    if buffer_index and buffer.DataLength():
        if dtype is None:
            raise ModelLoadError(
                f"{source}: constant tensor {name} has unsupported type {_TYPE_NAMES.get(type_code, type_code)}"
            )
        raw = buffer.DataAsNumpy().tobytes()
        size = math.prod(shape) * np.dtype(dtype).itemsize
        if len(raw) != size:
            raise ModelLoadError(
                f"{source}: tensor {name} {list(shape)} {dtype} needs {size} bytes, its buffer holds {len(raw)}"
            )
        data = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype).reshape(shape)
    return TfTensor(
        index,
        name,
        shape,
        signature,
        dtype or _TYPE_NAMES.get(type_code, str(type_code)),
        data,
        _read_quant(t.Quantization()),
    )


def _read_quant(q: tflite.QuantizationParameters | None) -> QuantParams | None:
    if q is None or not q.ScaleLength():
        return None
    scales = tuple(float(s) for s in q.ScaleAsNumpy())
    zeros = tuple(int(z) for z in q.ZeroPointAsNumpy()) if q.ZeroPointLength() else (0,) * len(scales)
    if len(zeros) == 1 and len(scales) > 1:
        zeros = zeros * len(scales)
    return QuantParams(scales, zeros, int(q.QuantizedDimension()))


def _options(op: tflite.Operator) -> Any:
    kind = op.BuiltinOptionsType()
    table = op.BuiltinOptions()
    if not kind or table is None or kind not in _OPTION_TABLES:
        return None
    options = getattr(tflite, _OPTION_TABLES[kind])()
    options.Init(table.Bytes, table.Pos)
    return options


def _op_label(model: TfModel, op: TfOperator) -> str:
    outs = [model.tensors[t].name for t in op.outputs]
    return f"#{op.index} -> {', '.join(outs)}" if outs else f"#{op.index}"


# --- building the graph ----------------------------------------------------------------------------------


class Converter:
    """The state of one conversion: the Value of each TFLite tensor so far and the nodes emitted."""

    def __init__(self, model: TfModel, requantize: str = DEFAULT_REQUANTIZE):
        self.model = model
        self.requantize = requantize
        self.source = model.source
        self.values: dict[int, Value] = {}
        self.nodes: list[Node] = []
        self.value_names: set[str] = set()
        self.node_names: set[str] = set()
        self.op: TfOperator | None = None
        self.shapes_overridden = False
        self.batch = BatchTracker(self.source)

    # -- errors and tensors --

    def fail(self, msg: str) -> ConversionError:
        op = self.op
        where = f"operator {_op_label(self.model, op)} ({op.code})" if op else "graph"
        return ConversionError(f"{self.source}: {where}: {msg}{self.batch.note() if op else ''}")

    def tensor(self, index: int) -> TfTensor:
        return self.model.tensors[index]

    def input_tensor(self, i: int) -> TfTensor | None:
        """The op's input `i` as a tensor record (None when absent)."""
        ins = self.op.inputs
        return self.tensor(ins[i]) if i < len(ins) and ins[i] >= 0 else None

    def quant(self, index: int) -> QuantParams:
        """Quantization of a tensor that must have it."""
        t = self.tensor(index)
        if t.quant is None:
            raise self.fail(f"tensor {t.name} ({t.dtype}) has no quantization parameters")
        return t.quant

    def value(self, index: int) -> Value:
        if index in self.values:
            return self.values[index]
        t = self.tensor(index)
        if t.data is None:
            raise self.fail(f"tensor {t.name} is read before any operator writes it")
        if t.dtype not in DTYPES:
            raise self.fail(f"constant tensor {t.name} has unsupported type {t.dtype}")
        v = Value(unique_name(t.name, self.value_names), TensorType(t.shape, t.dtype), data=t.data)
        self.values[index] = v
        return v

    def input(self, i: int) -> Value | None:
        """The Value of the op's input `i` (None when absent)."""
        ins = self.op.inputs
        return self.value(ins[i]) if i < len(ins) and ins[i] >= 0 else None

    def const_input(self, i: int, what: str) -> np.ndarray | None:
        """The data of the op's input `i`, which must be a constant (it fixes shapes or attributes)."""
        t = self.input_tensor(i)
        if t is None:
            return None
        v = self.value(t.index)
        if not v.is_constant:
            raise self.fail(
                f"input {i} ({what}, tensor {t.name}) must be a constant; it is computed at run time"
            )
        return v.data

    # -- inputs and operators --

    def bind_inputs(self, shapes: dict[str, Any]) -> list[Value]:
        by_name = {self.tensor(i).name: i for i in self.model.inputs}
        unknown = sorted(set(shapes) - set(by_name))
        if unknown:
            raise InputShapeError(
                f"{self.source}: input_shapes names unknown inputs {unknown}; inputs: {', '.join(by_name)}"
            )
        inputs = []
        for index in self.model.inputs:
            t = self.tensor(index)
            if t.dtype not in DTYPES:
                raise ConversionError(f"{self.source}: input {t.name} has unsupported type {t.dtype}")
            shape = self._input_shape(t, shapes.get(t.name))
            v = Value(unique_name(t.name, self.value_names), TensorType(shape, t.dtype))
            self.values[index] = v
            inputs.append(v)
        return inputs

    def _input_shape(self, t: TfTensor, given: Any) -> tuple[int, ...]:
        shape, dtype = _split_given(t.name, given) if given is not None else (None, None)
        if dtype is not None and dtype != t.dtype:
            raise InputShapeError(
                f"{self.source}: input {t.name} is {t.dtype} in the model; input_shapes gives {dtype}"
            )
        signature = t.signature if t.signature is not None else t.shape
        # a 0 in the shape signature is a fixed zero-size dimension (-1 is the dynamic one); without a
        # signature, older converters wrote 0 for an unknown batch, so it stays "dynamic" below
        if t.signature is not None and any(s == 0 for s in t.signature):
            raise InputShapeError(
                f"{self.source}: input '{t.name}' {list(signature)} has a zero-size dimension; aotc "
                "compiles tensors with at least one element"
            )
        if shape is None:
            if any(s < 1 for s in t.shape):
                dims = "[" + ", ".join("?" if s < 1 else str(s) for s in signature) + "]"
                raise DynamicShapeError(
                    f"{self.source}: input '{t.name}' {dims} has a dynamic dimension; aotc compiles static "
                    f"shapes: set `inputs: {{{t.name}: {{shape: [...]}}}}` in the recipe"
                )
            return t.shape
        dims = [s if s >= 0 else None for s in signature]
        rebatched = rebatch_size(dims, shape)
        if rebatched is not None:
            self.batch.add(t.name, rebatched)
        elif len(shape) != len(signature) or any(s >= 0 and s != g for s, g in zip(signature, shape)):
            hint = ""
            if signature and len(shape) == len(signature) and signature[0] >= 0 and signature[0] != shape[0]:
                hint = f"; only a leading (batch) dimension of {MODEL_BATCH} can be changed"
            raise InputShapeError(
                f"{self.source}: input {t.name}: given shape {list(shape)} contradicts the model's "
                f"{['?' if s < 0 else s for s in signature]}{hint}"
            )
        if shape != t.shape:
            self.shapes_overridden = True
        return shape

    def convert(self, op: TfOperator, fn) -> None:
        self.op = op
        for i in op.inputs:
            if i >= 0 and i not in self.values and self.tensor(i).data is None:
                raise self.fail(f"input tensor {self.tensor(i).name} is not written by an earlier operator")
        results = fn(self, op)
        if len(results) != len(op.outputs):
            raise self.fail(f"made {len(results)} outputs for {len(op.outputs)} output tensors")
        for index, v in zip(op.outputs, results):
            self._check_output(index, v)
            self.values[index] = v
        self.op = None

    def _check_output(self, index: int, v: Value) -> None:
        t = self.tensor(index)
        if v.type.dtype != t.dtype:
            raise self.fail(f"output {t.name}: the model declares {t.dtype}, the conversion gives {v.type}")
        if not self.shapes_overridden and t.shape and v.type.shape != t.shape:
            raise self.fail(
                f"output {t.name}: the model declares shape {list(t.shape)}, the conversion gives {v.type}"
            )

    def emit(
        self, op: str, inputs: Sequence[Value], attrs: dict | None = None, out: int | None = None
    ) -> Value:
        """A node of graph op `op` (or its value as a constant when every input is constant).

        `out` is the TFLite tensor the node computes; None names a fresh intermediate.
        """
        try:
            node, ttype, data = typed_node(op, list(inputs), attrs)
        except ValueError as e:
            raise self.fail(str(e)) from e
        base = self.tensor(out).name if out is not None else f"{self._op_name()}/{op}"
        name = unique_name(base, self.value_names)
        if data is not None:
            return Value(name, TensorType(tuple(data.shape), str(data.dtype)), data=data)
        node.name = unique_name(f"{self._op_name()}" if out is not None else base, self.node_names)
        v = Value(name, ttype, producer=node)
        node.outputs.append(v)
        self.nodes.append(node)
        return v

    def constant(self, data: Any, hint: str, dtype: str | None = None) -> Value:
        name = unique_name(f"{self._op_name()}/{hint}", self.value_names)
        data = np.asarray(data, dtype)
        return Value(name, TensorType(tuple(int(s) for s in data.shape), str(data.dtype)), data=data)

    def _op_name(self) -> str:
        op = self.op
        outs = [self.tensor(t).name for t in op.outputs]
        return outs[0] if outs else f"{op.code.lower()}_{op.index}"


def _split_given(name: str, given: Any) -> tuple[tuple[int, ...] | None, str | None]:
    try:
        shape, dtype = given
        shape = None if shape is None else tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise InputShapeError(
            f"input_shapes[{name!r}] must be (shape, dtype or None), got {given!r}"
        ) from None
    if shape is not None and any(s < 1 for s in shape):
        raise InputShapeError(f"input_shapes[{name!r}]: shape {list(shape)} has a non-positive extent")
    if dtype is not None and dtype not in DTYPES:
        raise InputShapeError(f"input_shapes[{name!r}]: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    return shape, dtype
