"""ONNX frontend: an .onnx model -> a Graph of registered operators with static shapes and folded constants.

Every node output's type comes from the tensor expression of its operator (`infer_types`); a node whose
inputs are all constants is evaluated on the spot and becomes a constant.

Opsets: a node's operator version is the newest one its model's default-domain opset imports
(`onnx.defs.get_schema(op, opset).since_version`), and every version current at some opset from OPSET_MIN
(7) to the newest the installed onnx defines is handled as its changelog says (`VERSIONS`); the converters
read the version where semantics differ (attributes that became inputs, Softmax's 2-D coercion, ...).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from aotc.frontend.batch import MODEL_BATCH, BatchTracker, rebatch_size
from aotc.frontend.errors import (
    ConversionError,
    DynamicShapeError,
    FrontendError,
    InputShapeError,
    ModelLoadError,
    UnsupportedOperatorError,
    UnsupportedOpsetError,
)
from aotc.frontend.folding import live_nodes, typed_node
from aotc.frontend.onnx_schema import declared_types, tensor_type, type_problem
from aotc.graph.interpret import infer_types
from aotc.graph.ir import Graph, Node, TensorType, Value
from aotc.ir.expr import DTYPES, unique_name
from aotc.topi.elemwise import broadcast_shape
from aotc.topi.lowp import FORMATS as LOWP_FORMATS
from aotc.topi.registry import OpPattern, get_op

__all__ = [
    "FLOAT16_ACCUMULATES_IN_FLOAT32",
    "OPSET_MAX",
    "OPSET_MIN",
    "VERSIONS",
    "ConvWindow",
    "OnnxConverter",
    "OnnxNode",
    "RunTimeValueError",
    "CONSTANTS_KEY",
    "attr_value",
    "constant_arrays",
    "conv_window",
    "converts",
    "load_onnx",
    "onnx_axis",
    "specialized_model",
    "supported_operators",
]

OPSET_MIN = 7
"""The oldest opset whose operator versions are all handled; an older model converts when each of its nodes
has a version that is still current at OPSET_MIN (Not-1 or Conv-1, say), and is refused node by node
otherwise."""
OPSET_MAX = onnx.defs.onnx_opset_version()
"""The newest opset the installed onnx defines: a newer model cannot be read against its schemas."""

FLOAT16_ACCUMULATES_IN_FLOAT32 = frozenset(
    {
        "conv2d",
        "conv2d_transpose",
        "matmul",
        "dense",
        "avg_pool2d",
        "conv3d",
        "conv3d_transpose",
        "avg_pool3d",
        "reduce_sum",
        "reduce_mean",
        "softmax",
        "log_softmax",
        "layer_norm",
        "instance_norm",
    }
)
"""Graph ops that sum over many elements: on float16 operands the frontend emits them in float32 between
casts (inputs widened, the result rounded to float16 once), as onnxruntime and ONNX's reference compute
them. Accumulated in float16, each partial sum would round: a depthwise convolution of 4 taps was 3 ulp
off (issue 19). A float16 constant operand folds to float32. (Softmax on float16 is emitted as its ONNX
function body instead, each step a float16 tensor: `_softmax_op`.)"""

InputShapes = Mapping[str, tuple[Sequence[int], str | None]]

_DTYPES = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.INT16: "int16",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.UINT8: "uint8",
    onnx.TensorProto.UINT16: "uint16",
    onnx.TensorProto.UINT32: "uint32",
    onnx.TensorProto.UINT64: "uint64",
    onnx.TensorProto.BOOL: "bool",
}


_LOWP_TYPES = {
    getattr(onnx.TensorProto, onnx_name): fmt
    for onnx_name, fmt in (
        ("BFLOAT16", "bfloat16"),
        ("FLOAT8E4M3FN", "float8_e4m3fn"),
        ("FLOAT8E4M3FNUZ", "float8_e4m3fnuz"),
        ("FLOAT8E5M2", "float8_e5m2"),
        ("FLOAT8E5M2FNUZ", "float8_e5m2fnuz"),
        ("UINT4", "uint4"),
        ("INT4", "int4"),
        ("FLOAT4E2M1", "float4_e2m1fn"),
        ("FLOAT8E8M0", "float8_e8m0fnu"),
        ("UINT2", "uint2"),
        ("INT2", "int2"),
    )
    if hasattr(onnx.TensorProto, onnx_name)
}
"""ONNX's low-precision and sub-byte element types -> their format (aotc.topi.lowp.FORMATS, ml_dtypes'
names): the graph carries such a tensor as its storage bits, and the converter tags it with its format
(`OnnxConverter.formats`); only the operators aotc.frontend.onnx_lowp lists read it."""

_UNSUPPORTED_TYPES = (
    "aotc compiles float16/32/64, int8 to int64, uint8 to uint64 and bool tensors (and bfloat16, float8, "
    "float4, int4 and int2 ones in Cast, CastLike, QuantizeLinear, DequantizeLinear and data movement)"
)


def _elem_type_name(elem_type: int) -> str:
    """An ONNX element type's name and number (FLOAT8E4M3FN (17)), or just the number if onnx has no name."""
    try:
        return f"{onnx.TensorProto.DataType.Name(elem_type)} ({elem_type})"
    except ValueError:
        return str(elem_type)


CONSTANTS_KEY = "constants"
"""The recipe key (and `aotc.compile` argument) that gives graph inputs values fixed at build time."""


class RunTimeValueError(ConversionError):
    """A node needs the value of an input at compile time (axes, pads, shapes, ...) that the model computes
    or feeds at run time. `value` names that input's value; `inputs` are the graph inputs it derives from
    (empty when none does): given in the recipe's `constants`, they make it a constant."""

    def __init__(self, message: str, value: str, inputs: Sequence[str]):
        super().__init__(message)
        self.value = value
        self.inputs = tuple(inputs)


def load_onnx(
    path_or_bytes: str | os.PathLike | bytes,
    input_shapes: InputShapes | None = None,
    constants: Mapping[str, Any] | None = None,
) -> Graph:
    """Read an ONNX model into a Graph.

    `input_shapes` maps a graph input's name to `(shape, dtype)` (dtype None keeps the model's); it must
    fix every dimension the model leaves dynamic. `constants` maps graph inputs to values fixed at build
    time (the recipe's `constants`): a numpy array of the input's dtype, or numbers / nested lists of them
    (converted to its dtype where that is exact); those inputs are then constants, not package inputs.
    """
    model, source = _read(path_or_bytes)
    opset = _check_opset(model, source)
    _check_operators(model.graph, source)
    _check_versions(model.graph, opset, source)
    conv = OnnxConverter(model.graph, source, opset)
    conv.bind_constants(constant_arrays(model.graph, constants or {}, source, input_shapes or {}))
    inputs = conv.bind_inputs(dict(input_shapes or {}))
    for i, proto in enumerate(model.graph.node):
        conv.convert(proto, i)
    outputs = [conv.values[o.name] for o in model.graph.output]
    graph = Graph(inputs, outputs, live_nodes(conv.nodes, outputs), model.graph.name or _stem(source))
    graph.elements = {v.name: conv.formats[v.name] for v in inputs + outputs if v.name in conv.formats}
    graph.verify()
    return graph


def constant_arrays(
    graph: onnx.GraphProto,
    constants: Mapping[str, Any],
    source: str,
    input_shapes: Mapping[str, Any] | None = None,
) -> dict[str, np.ndarray]:
    """`constants` (graph input -> value) checked against the model and converted to each input's dtype:
    a name that is not a graph input fed at run time, a numpy array of another dtype, numbers that the
    input's dtype does not hold exactly, or a shape the model's does not allow is an InputShapeError
    naming the input and the key."""
    initialized = {t.name for t in graph.initializer}
    runtime = {vi.name: vi for vi in graph.input if vi.name not in initialized}
    out = {}
    for name, given in constants.items():
        key = f"{CONSTANTS_KEY}.{name}"
        if name not in runtime:
            what = "an initializer (a weight)" if name in initialized else "not a graph input"
            raise InputShapeError(
                f"{source}: {key}: {name!r} is {what}; the model's run-time inputs are "
                f"{', '.join(runtime) or 'none'}"
            )
        if name in (input_shapes or {}):
            raise InputShapeError(f"{source}: {key}: input {name} is given both a shape (inputs) and a value")
        vi = runtime[name]
        dims = _model_dims(vi, source)
        elem_type = vi.type.tensor_type.elem_type
        dtype = _DTYPES[elem_type] if elem_type in _DTYPES else _LOWP_TYPES[elem_type]
        array = _constant_array(given, dtype, f"{source}: {key}")
        if dims is not None and (
            len(dims) != array.ndim or any(isinstance(d, int) and d != s for d, s in zip(dims, array.shape))
        ):
            raise InputShapeError(
                f"{source}: {key}: a value of shape {list(array.shape)} for input {name}, whose shape in the "
                f"model is {_dims_str(dims)}"
            )
        out[name] = array
    return out


def _constant_array(given: Any, dtype: str, where: str) -> np.ndarray:
    """`given` as an array of `dtype`: a numpy array must have it; numbers and lists are converted when
    every value survives the conversion (1 for an int64 input, not 1.5; 0/1 or true/false for bool)."""
    if isinstance(given, np.ndarray):
        if str(given.dtype) != dtype:
            raise InputShapeError(f"{where}: an array of dtype {given.dtype}; the input is {dtype}")
        return given
    try:
        raw = np.asarray(given)
    except (TypeError, ValueError) as e:
        raise InputShapeError(f"{where}: not a number or a (rectangular) list of numbers: {e}") from None
    if raw.dtype.kind not in "biuf":
        raise InputShapeError(f"{where}: expected numbers (or a .npy file), got {given!r}")
    with np.errstate(all="ignore"):
        array = raw.astype(dtype)
        exact = np.array_equal(array.astype(raw.dtype), raw, equal_nan=raw.dtype.kind == "f")
    if not exact or (dtype == "bool" and not np.isin(raw, (0, 1)).all()):
        raise InputShapeError(
            f"{where}: {raw.tolist()} is not exactly representable as {dtype}, the input's dtype"
        )
    return array


def specialized_model(path_or_bytes: str | os.PathLike | bytes, constants: Mapping[str, Any]) -> bytes:
    """The model with the graph inputs `constants` names turned into initializers of those values (checked
    and converted as load_onnx does): what onnxruntime runs to check a package built with constants."""
    model, source = _read(path_or_bytes)
    arrays = constant_arrays(model.graph, constants, source)
    kept = [vi for vi in model.graph.input if vi.name not in arrays]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    model.graph.initializer.extend(numpy_helper.from_array(a, name) for name, a in arrays.items())
    return model.SerializeToString()


def supported_operators() -> list[str]:
    return sorted(_CONVERTERS)


def _read(path_or_bytes: str | os.PathLike | bytes) -> tuple[onnx.ModelProto, str]:
    raw = isinstance(path_or_bytes, bytes | bytearray)
    source = "<bytes>" if raw else os.fspath(path_or_bytes)
    if not raw and not os.path.isfile(source):
        raise ModelLoadError(f"{source}: no such model file")
    try:
        model = onnx.load_model_from_string(bytes(path_or_bytes)) if raw else onnx.load(source)
    except Exception as e:  # protobuf raises assorted types on corrupt input
        raise ModelLoadError(f"{source}: not a valid ONNX model ({type(e).__name__}: {e})") from e
    if not model.graph.node and not model.graph.output:
        raise ModelLoadError(f"{source}: not a valid ONNX model (the file holds no graph)")
    return model, source


def _stem(source: str) -> str:
    return os.path.splitext(os.path.basename(source))[0] if source != "<bytes>" else "model"


def _check_opset(model: onnx.ModelProto, source: str) -> int:
    """The model's default-domain opset, which the installed onnx must define; other domains that aotc
    maps operators of must be imported at the version it maps."""
    imported = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    if "" not in imported:
        raise UnsupportedOpsetError(f"{source}: the model imports no version of the default ONNX opset")
    version = imported[""]
    if version > OPSET_MAX:
        raise UnsupportedOpsetError(
            f"{source}: opset {version} is newer than the installed onnx {onnx.__version__} defines "
            f"(up to opset {OPSET_MAX}); aotc maps opsets {OPSET_MIN} to {OPSET_MAX}"
        )
    if version < 1:
        raise UnsupportedOpsetError(f"{source}: opset {version} does not exist")
    for domain in sorted({p.domain for p in model.graph.node} - {"", "ai.onnx"}):
        if domain not in imported:
            raise UnsupportedOpsetError(
                f"{source}: nodes of domain {domain} but the model imports no opset of it"
            )
        if domain in _DOMAIN_VERSIONS and imported[domain] != _DOMAIN_VERSIONS[domain]:
            raise UnsupportedOpsetError(
                f"{source}: opset {imported[domain]} of domain {domain} is not supported "
                f"(aotc maps version {_DOMAIN_VERSIONS[domain]})"
            )
    return version


_DOMAIN_VERSIONS = {"com.microsoft": 1, "ai.onnx.preview": 1}
"""Other domains aotc maps operators of (onnxruntime's contrib operators, ONNX's preview FlexAttention),
and their one version."""


@functools.cache
def _schema(op_type: str, opset: int) -> onnx.defs.OpSchema | None:
    """The default-domain schema of `op_type` that opset `opset` imports, None if it defines none."""
    try:
        return onnx.defs.get_schema(op_type, opset, "")
    except onnx.defs.SchemaError:
        return None


def _operator_version(op_type: str, opset: int) -> int | None:
    """The version of default-domain operator `op_type` in opset `opset` (its schema's since_version)."""
    schema = _schema(op_type, opset)
    return schema.since_version if schema is not None else None


def _version_problem(proto: onnx.NodeProto, opset: int) -> str | None:
    """Why a default-domain node's operator version is not handled, or None."""
    op, schema = proto.op_type, _schema(proto.op_type, opset)
    if schema is None:
        first = min((s.since_version for s in _schemas(op)), default=None)
        since = f" (it is defined from opset {first})" if first is not None and first > opset else ""
        return f"{op} is not defined in opset {opset}{since}"
    version, handled = schema.since_version, VERSIONS.get(op, ())
    at = f"{op}-{version} (the version opset {opset} imports)"
    if schema.deprecated:
        return f"{at} is deprecated; aotc does not convert it"
    if version not in handled:
        if handled and version < handled[0]:
            return f"{at} is older than {op}-{handled[0]}, the version of opset {OPSET_MIN}, the oldest aotc maps"
        return f"{at} is not a version aotc handles ({', '.join(f'{op}-{v}' for v in handled)})"
    return None


@functools.cache
def _schemas(op_type: str) -> tuple[onnx.defs.OpSchema, ...]:
    return tuple(s for s in onnx.defs.get_all_schemas_with_history() if s.name == op_type and s.domain == "")


def _check_versions(graph: onnx.GraphProto, opset: int, source: str) -> None:
    """Every default-domain node has an operator version aotc handles (VERSIONS), only attributes that
    version defines and no more inputs or outputs than it takes: a converter reads attributes by name, so
    one from another version (axes on a Squeeze-13, say) must not slip through as if it were valid."""
    unsupported, invalid = [], []
    for i, proto in enumerate(graph.node):
        if proto.domain not in ("", "ai.onnx"):
            continue
        where = f"node {_node_name(proto, i)} ({proto.op_type})"
        problem = _version_problem(proto, opset)
        if problem is not None:
            unsupported.append(f"{where}: {problem}")
            continue
        schema = _schema(proto.op_type, opset)
        name = f"{proto.op_type}-{schema.since_version} (opset {opset})"
        unknown = [a.name for a in proto.attribute if a.name not in schema.attributes]
        if unknown:
            invalid.append(f"{where}: attribute {', '.join(unknown)} is not defined for {name}")
        if len(proto.input) > schema.max_input or len(proto.output) > schema.max_output:
            invalid.append(
                f"{where}: {len(proto.input)} inputs and {len(proto.output)} outputs; {name} takes at most "
                f"{schema.max_input} and {schema.max_output}"
            )
    if unsupported:
        raise UnsupportedOpsetError(f"{source}: " + "; ".join(unsupported))
    if invalid:
        raise ConversionError(f"{source}: " + "; ".join(invalid))


def _op_key(proto: onnx.NodeProto) -> str:
    return proto.op_type if proto.domain in ("", "ai.onnx") else f"{proto.domain}.{proto.op_type}"


def _node_name(proto: onnx.NodeProto, index: int) -> str:
    return proto.name or f"{proto.op_type}_{index}"


def _check_operators(graph: onnx.GraphProto, source: str) -> None:
    missing: dict[str, list[str]] = {}
    for i, proto in enumerate(graph.node):
        key = _op_key(proto)
        if key not in _CONVERTERS:
            missing.setdefault(key, []).append(_node_name(proto, i))
    if missing:
        raise UnsupportedOperatorError(source, missing)


@dataclass
class OnnxNode:
    name: str
    op_type: str
    inputs: list[Value | None]
    attrs: dict[str, Any]
    outputs: list[str]
    version: int | None = None
    """The operator's version (its schema's since_version); None: the newest (a node built by hand)."""

    def input(self, i: int) -> Value | None:
        return self.inputs[i] if i < len(self.inputs) else None

    def older_than(self, version: int) -> bool:
        """Whether the node's operator version predates `version` (where semantics changed)."""
        return self.version is not None and self.version < version

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)


def attr_value(a: onnx.AttributeProto) -> Any:
    v = onnx.helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [s.decode() for s in v]
    return v


class OnnxConverter:
    def __init__(self, graph: onnx.GraphProto, source: str, opset: int = OPSET_MAX):
        self.graph = graph
        self.source = source
        self.opset = opset
        self.values: dict[str, Value] = {}
        self.nodes: list[Node] = []
        self.formats: dict[str, str] = {}
        """Values of a low-precision or sub-byte element type (their graph dtype is its storage) -> its
        format (aotc.topi.lowp.FORMATS)."""
        self.output_names = {o.name for o in graph.output}
        self.used = _referenced_names(graph) | self.output_names  # subgraphs' reads of outer values too
        self.value_names = {o for p in graph.node for o in p.output} | {i.name for i in graph.input}
        self.value_names |= {t.name for t in graph.initializer}
        self.declared_types = declared_types(graph)
        """Values whose element type the graph declares (outputs, value_info) -> its type string."""
        self.node_names: set[str] = set()
        self.node: OnnxNode | None = None
        self.batch = BatchTracker(source)
        for t in graph.initializer:
            self.values[t.name] = self._constant_value(t.name, numpy_helper.to_array(t))

    def fail_version(self, msg: str) -> ConversionError:
        """A ConversionError for what this version of the node's operator means and aotc does not map."""
        n = self.node
        return self.fail(f"{n.op_type}-{n.version} (opset {self.opset}): {msg}")

    def fail(self, msg: str) -> ConversionError:
        n = self.node
        where = f"node {n.name} ({n.op_type})" if n else "graph"
        return ConversionError(f"{self.source}: {where}: {msg}{self.batch.note() if n else ''}")

    def bind_constants(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Graph inputs given values at build time (`constant_arrays`): constants from now on."""
        for name, array in arrays.items():
            self.values[name] = self._constant_value(name, array)

    def bind_inputs(self, shapes: dict[str, Any]) -> list[Value]:
        runtime = [vi for vi in self.graph.input if vi.name not in self.values]
        unknown = sorted(set(shapes) - {vi.name for vi in runtime})
        if unknown:
            names = ", ".join(vi.name for vi in runtime)
            raise InputShapeError(
                f"{self.source}: input_shapes names unknown inputs {unknown}; inputs: {names}"
            )
        problems, inputs = [], []
        for vi in runtime:
            dims, given = _model_dims(vi, self.source), shapes.get(vi.name)
            if given is None and not _is_static(dims):
                problems.append((vi.name, dims))
                continue
            v = Value(vi.name, _input_type(vi, dims, given, self.source, self.batch))
            fmt = _LOWP_TYPES.get(vi.type.tensor_type.elem_type)
            if fmt is not None:
                if given is not None and given[1] is not None:
                    raise InputShapeError(f"input_shapes[{vi.name!r}]: the dtype of a {fmt} input is fixed")
                self.formats[vi.name] = fmt
            # a zero-size input has one value (nothing): the package takes it, and nodes read it as that
            # constant, so that no kernel sees a zero extent
            empty = v.type.num_elements == 0
            self.values[vi.name] = (
                self._constant_value(v.name, np.zeros(v.type.shape, v.type.dtype)) if empty else v
            )
            inputs.append(v)
        if problems:
            described = "; ".join(_describe_dynamic(name, dims) for name, dims in problems)
            example = ", ".join(f"{name}: {{shape: {_shape_template(dims)}}}" for name, dims in problems)
            raise DynamicShapeError(
                f"{self.source}: {described}. aotc compiles static shapes: set "
                f"`inputs: {{name: {{shape: [...]}}}}` in the recipe (input_shapes= for load_onnx), "
                f"here `inputs: {{{example}}}` with each ? filled in"
            )
        return inputs

    def convert(self, proto: onnx.NodeProto, index: int) -> None:
        name = _node_name(proto, index)
        missing = [v for v in proto.input if v and v not in self.values]
        if missing:
            raise ConversionError(
                f"{self.source}: node {name} ({proto.op_type}): inputs {missing} are not defined before it"
            )
        default_domain = proto.domain in ("", "ai.onnx")
        self.node = OnnxNode(
            name,
            proto.op_type,
            [self.values[v] if v else None for v in proto.input],
            {a.name: attr_value(a) for a in proto.attribute},
            list(proto.output),
            _operator_version(proto.op_type, self.opset) if default_domain else None,
        )
        # element types the operator's schema does not allow are refused before a converter, written for
        # the types ONNX defines, computes something for them
        version = self.opset if default_domain else _DOMAIN_VERSIONS.get(proto.domain)
        types = {v: self.element_type(v) for v in proto.input if v}
        problem = type_problem(proto, version, types, self.declared_types)
        if problem is not None:
            raise self.fail(problem)
        check = _VERSION_CHECKS.get(_op_key(proto))
        if check is not None:
            check(self, self.node)
        # a low-precision input: refused unless the operator reads its format (or only moves its bits)
        moved = onnx_lowp.check_inputs(self, self.node)
        # bfloat16 inputs of an element-wise operator: its converter computes on them decoded to float32
        wide = onnx_lowp.widened(self, self.node)
        try:
            results = _CONVERTERS[_op_key(proto)](self, wide)
            if wide is not self.node:
                results = onnx_lowp.narrowed(self, self.node, wide, results)
        except (ArithmeticError, ValueError, IndexError, KeyError) as e:
            # converters were written for operands with elements; where one's arithmetic does not hold for
            # an empty operand (a division by its size, say) that is a refusal, not an internal error
            empty = [v for v in self.node.inputs if v is not None and v.type.num_elements == 0]
            if not empty:
                raise
            results = self._empty_outputs(proto)  # what ONNX's own shape inference says, where all empty
            if results is None and isinstance(e, FrontendError):
                raise
            if results is None:
                raise self.fail(
                    f"input {empty[0].name} ({empty[0].type}) has no elements, which this converter does "
                    f"not handle ({type(e).__name__}: {e})"
                ) from e
        for i, out in enumerate(proto.output):
            if not out:
                continue
            if i >= len(results):
                if out in self.used:
                    raise self.fail(f"output {i} ({out}) is not supported")
                continue
            v = results[i]
            if moved is not None and i == 0:
                self.formats[v.name] = moved
            if out in self.output_names and v.name != out:
                v = self.emit("identity", [v], out=out)
                if results[i].name in self.formats:
                    self.formats[v.name] = self.formats[results[i].name]
            if v.name in self.formats:  # under its ONNX name too (an Identity's output is its input's value)
                self.formats[out] = self.formats[v.name]
            self.values[out] = v
        self.node = None

    def element_type(self, name: str) -> str | None:
        """The ONNX type string of ONNX value `name` ("tensor(float)"; its format's for a low-precision one,
        which `formats` keys by the graph value's name)."""
        v = self.values[name]
        return tensor_type(self.formats.get(v.name) or v.type.dtype)

    def _empty_outputs(self, proto: onnx.NodeProto) -> list[Value | None] | None:
        """The outputs of default-domain node `proto`, which has an input with no elements and which its
        converter refused, as empty constants where ONNX's shape inference (the operator's own schema, the
        constant inputs' values known) gives every output a static shape with no elements: such an output
        has one value, nothing, whatever the operator computes. None where it does not."""
        if proto.domain not in ("", "ai.onnx") or any(name in self.formats for name in proto.input):
            return None  # (a low-precision input is stored as the bits of another type)
        inputs, known = [], []
        for name in dict.fromkeys(n for n in proto.input if n):
            v = self.values[name]
            elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(v.type.dtype))
            inputs.append(onnx.helper.make_tensor_value_info(name, elem, list(v.type.shape)))
            if v.is_constant:
                known.append(numpy_helper.from_array(np.asarray(v.data), name))
        outputs = [onnx.helper.make_empty_tensor_value_info(o) for o in proto.output if o]
        graph = onnx.helper.make_graph([proto], "node", inputs, outputs, known)
        model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", self.opset)])
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
        except Exception:  # onnx raises its own error types for a node its inference rejects
            return None
        types = {vi.name: vi.type for vi in [*inferred.graph.output, *inferred.graph.value_info]}
        results: list[Value | None] = []
        for name in proto.output:
            t = types.get(name)
            tt = t.tensor_type if t is not None and t.HasField("tensor_type") else None
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim] if tt else None
            if not name:
                results.append(None)
            elif tt is None or tt.elem_type not in _DTYPES or None in dims or math.prod(dims) != 0:
                return None
            else:
                results.append(self._constant_value(name, np.zeros(dims, _DTYPES[tt.elem_type])))
        return results

    def emit(
        self, op: str, inputs: Sequence[Value], attrs: dict | None = None, out: str | None = None
    ) -> Value:
        """A node of graph op `op` (or, when every input is constant, its value as a constant).

        `out` is the ONNX name of the value; None makes a fresh name for an intermediate.
        """
        if op in FLOAT16_ACCUMULATES_IN_FLOAT32 and any(
            v is not None and v.type.dtype == "float16" for v in inputs
        ):
            wide = [
                self.emit("cast", [v], {"dtype": "float32"})
                if v is not None and v.type.dtype == "float16"
                else v
                for v in inputs
            ]
            return self.emit("cast", [self.emit(op, wide, attrs)], {"dtype": "float16"}, out)
        n = self.node
        if any(v is not None and v.type.num_elements == 0 for v in inputs):
            return self._zero_size(op, list(inputs), attrs, out)
        try:
            node, ttype, data = typed_node(op, list(inputs), attrs)
        except ValueError as e:
            raise self.fail(str(e)) from e
        name = out or unique_name(f"{n.name}/{op}", self.value_names)
        if data is not None:
            return self._constant_value(name, data)
        node.name = unique_name(n.name if out else f"{n.name}/{op}", self.node_names)
        v = Value(name, ttype, producer=node)
        node.outputs.append(v)
        self.nodes.append(node)
        return v

    def _zero_size(self, op: str, inputs: list[Value | None], attrs: dict | None, out: str | None) -> Value:
        """Graph op `op` on an operand with no elements, as a constant: no kernel sees a zero extent.

        The result's type comes from the op's tensor expression over the operands with each zero extent
        made 1 (a probe), its shape from the op's shape rule (`_zero_size_shape`). An empty result is
        known (nothing); a non-empty one is a reduction over an empty set (its identity) or refused."""
        described = ", ".join(str(v.type) for v in inputs if v is not None)
        name = out or unique_name(f"{self.node.name}/{op}", self.value_names)
        if op == "reshape" and math.prod(attrs["shape"]) == 0:  # no tensor expression has a zero extent
            return self._constant_value(name, np.zeros(attrs["shape"], inputs[0].type.dtype))
        probe = [None if v is None else Value(v.name, _at_least_one(v.type)) for v in inputs]
        try:
            (probed,) = infer_types(Node(op, probe, [], dict(attrs or {})))
        except (ValueError, TypeError, KeyError, IndexError) as e:
            raise self.fail(f"cannot build graph op {op} on {described}: {e}") from e
        shape = _zero_size_shape(op, dict(attrs or {}), inputs, probe, probed.shape)
        if shape is None:
            raise self.fail(f"graph op {op} on {described}, an operand with no elements, is not supported")
        if math.prod(shape) == 0:
            return self._constant_value(name, np.zeros(shape, probed.dtype))
        fill = _empty_reduction(op, probed.dtype)
        if fill is None:
            raise self.fail(
                f"graph op {op} on {described} gives {probed.dtype}{list(shape)} from an operand with no "
                "elements; aotc folds only empty results and sums, products, maxima and minima over "
                "empty sets"
            )
        return self._constant_value(name, np.full(shape, fill, probed.dtype))

    def constant(self, data: Any, hint: str, dtype: str | None = None, out: str | None = None) -> Value:
        """A constant made by the frontend: the value of ONNX output `out`, or an operand named after `hint`."""
        name = out or unique_name(f"{self.node.name}/{hint}", self.value_names)
        return self._constant_value(name, np.asarray(data, dtype))

    def const_input(self, n: OnnxNode, i: int, what: str) -> np.ndarray | None:
        """The value of optional input `i`, which must be a constant (it sets an attribute): one fed or
        computed at run time is refused with a RunTimeValueError naming the graph inputs it derives from,
        which the recipe's `constants` can fix."""
        v = n.input(i)
        if v is None:
            return None
        if not v.is_constant:
            raise self.run_time_value_error(n, i, what, "aotc needs its value at compile time")
        if v.name in self.formats:  # a low-precision constant's bits, read as its ml_dtypes type
            return v.data.view(np.dtype(self.formats[v.name]))
        return v.data

    def run_time_value_error(self, n: OnnxNode, i: int, what: str, why: str) -> RunTimeValueError:
        """The error for input `i` of node `n` (spec name `what`), which must be a constant (`why`) but is fed
        or computed at run time: it names the graph inputs the value derives from, which the recipe's
        `constants` can fix."""
        v = n.inputs[i]
        sources = _graph_inputs_of(v)
        if sources == [v.name]:
            how = f"it is graph input {v.name}, fed at run time"
        elif sources:
            how = f"it is computed at run time from graph input{'s' if len(sources) > 1 else ''} {', '.join(sources)}"
        else:
            how = "it is computed at run time"
        example = ", ".join(f"{s}: [...]" for s in sources) or "name: [...]"
        return RunTimeValueError(
            f"{self.source}: node {n.name} ({n.op_type}): input {i} ({what}, value {v.name}) must be a "
            f"constant: {why}, but {how}; give "
            f"{'it' if len(sources) <= 1 else 'them'} in the recipe's `{CONSTANTS_KEY}` "
            f"({CONSTANTS_KEY}: {{{example}}}, a value or a .npy file; aotc.compile(..., "
            f"{CONSTANTS_KEY}=...)){self.batch.note()}",
            v.name,
            sources,
        )

    def convert_subgraph(self, graph: onnx.GraphProto, inputs: Sequence[Value], tag: str) -> list[Value]:
        """The outputs of subgraph `graph` of the current node (a Scan or Loop body, an If branch), converted
        into this graph with its inputs bound to `inputs` and this graph's values in scope. `tag` names this
        conversion of it (`body[2]`: one per unrolled iteration) in errors and in its values' names, which are
        fresh each time."""
        n = self.node
        source = f"{self.source}: node {n.name} ({n.op_type}) {tag}"
        if len(inputs) != len(graph.input):
            raise self.fail(f"{tag} takes {len(graph.input)} inputs, given {len(inputs)}")
        _check_operators(graph, source)
        _check_versions(graph, self.opset, source)
        defined = _defined_names(graph)
        base, k = f"{n.name}/{tag}/", 0
        prefix = base
        while any(prefix + name in self.value_names for name in defined):
            k += 1
            prefix = f"{base}{k}/"
        body = onnx.GraphProto()
        body.CopyFrom(graph)
        _prefix_names(body, {name: prefix + name for name in defined}, prefix)
        sub = OnnxConverter(body, source, self.opset)
        sub.values = {**self.values, **sub.values}  # outer values in scope; the body's initializers shadow
        self.value_names |= sub.value_names
        sub.value_names, sub.node_names, sub.nodes = self.value_names, self.node_names, self.nodes
        sub.batch = self.batch
        sub.formats = self.formats  # low-precision values' formats, read and set inside too
        sub.output_names = set()  # the outputs are read from sub.values: no identity copies
        for vi, given, v in zip(body.input, graph.input, inputs):
            kind = vi.type.WhichOneof("value")
            if kind not in (None, "tensor_type"):
                raise self.fail(f"{tag} input {given.name} is a {kind}, not a tensor")
            elem = vi.type.tensor_type.elem_type
            if elem and _DTYPES.get(elem) != v.type.dtype:
                raise self.fail(
                    f"{tag} input {given.name} is {_elem_type_name(elem)}, bound to {v.name} of type {v.type}"
                )
            sub.values[vi.name] = v
        for i, proto in enumerate(body.node):
            sub.convert(proto, i)
        missing = [given.name for o, given in zip(body.output, graph.output) if o.name not in sub.values]
        if missing:
            raise self.fail(f"{tag} outputs {missing} are not defined")
        return [sub.values[o.name] for o in body.output]

    def _constant_value(self, name: str, data: np.ndarray) -> Value:
        data = np.asarray(data)
        if data.dtype.name in LOWP_FORMATS:  # an ml_dtypes array (numpy_helper's): its bits, tagged
            self.formats[name] = data.dtype.name
            data = data.view(LOWP_FORMATS[data.dtype.name].storage)
        dtype = "bool" if data.dtype == np.bool_ else str(data.dtype)
        if dtype not in DTYPES:
            raise self.fail(
                f"constant {name} has unsupported element type {data.dtype}; {_UNSUPPORTED_TYPES}"
            )
        return Value(name, TensorType(tuple(int(s) for s in data.shape), dtype), data=data)


_SAME_SHAPE_OPS = frozenset(
    {"trilu", "softmax", "log_softmax", "cumsum", "layer_norm", "instance_norm", "rms_norm", "batch_norm"}
)
"""Graph ops whose result has the shape of their first operand (the others are per-channel parameters)."""


def _zero_size_shape(
    op: str,
    attrs: dict[str, Any],
    inputs: Sequence[Value | None],
    probe: Sequence[Value | None],
    probed: tuple[int, ...],
) -> tuple[int, ...] | None:
    """The shape of graph op `op`'s result on `inputs`, one of which has a zero extent, by the op's shape
    rule; None where aotc knows no rule. `probe` are the inputs with each zero extent made 1 and `probed`
    the shape the op's tensor expression gives them: a rule applies only where it gives that too."""
    shapes = [v.type.shape for v in inputs if v is not None]
    probes = [v.type.shape for v in probe if v is not None]

    def rule(given: list[tuple[int, ...]]) -> tuple[int, ...] | None:
        first = given[0]
        if op in _SAME_SHAPE_OPS:
            return first
        pattern = get_op(op).pattern
        if pattern in (OpPattern.ELEMWISE, OpPattern.BROADCAST) and op not in ("broadcast_to", "prelu"):
            try:
                return tuple(np.broadcast_shapes(*given))
            except ValueError:
                return None
        if op in ("reduce_sum", "reduce_max", "reduce_min", "reduce_mean", "reduce_prod"):
            axes = {a % max(len(first), 1) for a in attrs["axes"]}
            if attrs.get("keepdims", False):
                return tuple(1 if d in axes else s for d, s in enumerate(first))
            return tuple(s for d, s in enumerate(first) if d not in axes)
        if op == "transpose":
            return tuple(first[p] for p in attrs["perm"])
        if op == "reshape":
            return tuple(attrs["shape"]) if math.prod(attrs["shape"]) == math.prod(first) else None
        if op == "concat":
            axis = attrs["axis"] % len(first)
            return (*first[:axis], sum(s[axis] for s in given), *first[axis + 1 :])
        return None

    # the rule must agree with the tensor expression where every extent is at least 1
    if rule(probes) != tuple(probed):
        return None
    return rule(shapes)


def _at_least_one(t: TensorType) -> TensorType:
    """`t` with each zero extent made 1."""
    return TensorType(tuple(max(s, 1) for s in t.shape), t.dtype)


def _empty_reduction(op: str, dtype: str) -> Any:
    """The value of reduction `op` over an empty set (its identity), None where it has none (a mean)."""
    info = np.finfo(dtype) if np.dtype(dtype).kind == "f" else np.iinfo(dtype) if dtype != "bool" else None
    if op == "reduce_sum":
        return 0
    if op == "reduce_prod":
        return 1
    if op in ("reduce_max", "reduce_min") and info is not None:
        floating = np.dtype(dtype).kind == "f"
        if op == "reduce_max":
            return -np.inf if floating else info.min
        return np.inf if floating else info.max
    return None


def _model_dims(vi: onnx.ValueInfoProto, source: str) -> list[int | str | None] | None:
    """The model's dims of graph input `vi`: ints (0 for a zero-size dimension), symbolic names, None for
    unknown; None if rank unknown."""
    if not vi.type.HasField("tensor_type"):
        raise ConversionError(f"{source}: input {vi.name} is not a tensor")
    tt = vi.type.tensor_type
    if tt.elem_type not in _DTYPES and tt.elem_type not in _LOWP_TYPES:
        raise ConversionError(
            f"{source}: input {vi.name} has unsupported element type {_elem_type_name(tt.elem_type)}; "
            + _UNSUPPORTED_TYPES
        )
    if not tt.HasField("shape"):
        return None
    dims = [d.dim_value if d.dim_value > 0 else (d.dim_param or None) for d in tt.shape.dim]
    # a dim_value of 0 that the model sets is a zero-size dimension, not an unknown one
    zero = {i for i, d in enumerate(tt.shape.dim) if d.WhichOneof("value") == "dim_value" and not d.dim_value}
    return [0 if i in zero else d for i, d in enumerate(dims)]


def _is_static(dims: list[int | str | None] | None) -> bool:
    return dims is not None and all(isinstance(d, int) for d in dims)


def _describe_dynamic(name: str, dims: list[int | str | None] | None) -> str:
    if dims is None:
        return f"input '{name}' has no shape (rank unknown)"
    dynamic = [
        f"{d} ('{p}')" if p else f"{d} (unnamed)" for d, p in enumerate(dims) if not isinstance(p, int)
    ]
    return f"input '{name}' {_dims_str(dims)} has dynamic dimension {', '.join(dynamic)}"


def _shape_template(dims: list[int | str | None] | None) -> str:
    if dims is None:
        return "[...]"
    return "[" + ", ".join(str(d) if isinstance(d, int) else "?" for d in dims) + "]"


def _input_type(
    vi: onnx.ValueInfoProto, dims: list | None, given: Any, source: str, batch: BatchTracker
) -> TensorType:
    elem_type = vi.type.tensor_type.elem_type
    dtype = _DTYPES[elem_type] if elem_type in _DTYPES else LOWP_FORMATS[_LOWP_TYPES[elem_type]].storage
    if given is None:
        return TensorType(tuple(dims), dtype)
    shape, given_dtype = _split_given(vi.name, given)
    rebatched = rebatch_size(dims, shape) if dims is not None else None
    if rebatched is not None:
        batch.add(vi.name, rebatched)
    elif dims is not None and (
        len(dims) != len(shape) or any(isinstance(d, int) and d != s for d, s in zip(dims, shape))
    ):
        hint = ""
        if dims and len(dims) == len(shape) and isinstance(dims[0], int) and dims[0] != shape[0]:
            hint = f"; only a leading (batch) dimension of {MODEL_BATCH} can be changed"
        raise InputShapeError(
            f"{source}: input {vi.name}: given shape {list(shape)} contradicts the model's "
            f"{_dims_str(dims)}{hint}"
        )
    return TensorType(shape, given_dtype or dtype)


def _split_given(name: str, given: Any) -> tuple[tuple[int, ...], str | None]:
    try:
        shape, dtype = given
        shape = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise InputShapeError(
            f"input_shapes[{name!r}] must be (shape, dtype or None), got {given!r}"
        ) from None
    if any(s < 1 for s in shape):
        raise InputShapeError(f"input_shapes[{name!r}]: shape {list(shape)} has a non-positive extent")
    if dtype is not None and dtype not in DTYPES:
        raise InputShapeError(f"input_shapes[{name!r}]: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    return shape, dtype


def _dims_str(dims: Sequence[int | str | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _subgraphs(proto: onnx.NodeProto) -> list[onnx.GraphProto]:
    return [a.g for a in proto.attribute if a.type == onnx.AttributeProto.GRAPH] + [
        g for a in proto.attribute if a.type == onnx.AttributeProto.GRAPHS for g in a.graphs
    ]


def _referenced_names(graph: onnx.GraphProto) -> set[str]:
    """The names the nodes of `graph` and of its subgraphs (at any depth) read."""
    names = set()
    for p in graph.node:
        names.update(p.input)
        for g in _subgraphs(p):
            names |= _referenced_names(g) | {o.name for o in g.output}
    return names


def _defined_names(graph: onnx.GraphProto) -> set[str]:
    """The names `graph` and its subgraphs (at any depth) define: inputs, initializers, node outputs."""
    names = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    for p in graph.node:
        names.update(o for o in p.output if o)
        for g in _subgraphs(p):
            names |= _defined_names(g)
    return names


def _prefix_names(graph: onnx.GraphProto, renamed: Mapping[str, str], prefix: str) -> None:
    """Rename, in place, the values `renamed` maps wherever `graph` and its subgraphs define or read them
    (the names they read from outer scopes stay), and prefix its node names."""
    for vi in [*graph.input, *graph.output, *graph.value_info]:
        vi.name = renamed.get(vi.name, vi.name)
    for t in graph.initializer:
        t.name = renamed.get(t.name, t.name)
    for i, p in enumerate(graph.node):
        p.name = prefix + _node_name(p, i)
        p.input[:] = [renamed.get(v, v) for v in p.input]
        p.output[:] = [renamed.get(v, v) for v in p.output]
        for g in _subgraphs(p):
            _prefix_names(g, renamed, prefix)


def _graph_inputs_of(value: Value) -> list[str]:
    """The graph inputs a value computed at run time derives from, in the order they are found."""
    found: dict[str, None] = {}
    seen: set[int] = set()
    todo = [value]
    while todo:
        v = todo.pop()
        if v is None or v.is_constant or id(v) in seen:
            continue
        seen.add(id(v))
        if v.producer is None:
            found[v.name] = None
        else:
            todo.extend(reversed(v.producer.inputs))
    return list(found)


# ---------------------------------------------------------------------------------------------------------
# Converters: one function per ONNX operator (or family), returning the values of the node's outputs.

_CONVERTERS: dict[str, Callable[[OnnxConverter, OnnxNode], list[Value]]] = {}

VERSIONS: dict[str, tuple[int, ...]] = {
    # Every version of each converted default-domain operator that is current at some opset from OPSET_MIN
    # to the newest of onnx 1.23 (28), each read in its changelog (onnx.defs schemas and docs) against the
    # converter. Most versions only add element types (which the converters and the graph check), optional
    # outputs aotc refuses when used, or negative axes; the ones whose semantics differ are noted and
    # handled. A version missing here (older than opset 7's, or from a later onnx) is refused.
    "Abs": (6, 13),
    "Add": (7, 13, 14),  # 7: numpy broadcasting (6 had broadcast/axis attributes)
    "And": (7,),
    "ArgMax": (1, 11, 12, 13),  # 11: negative axis; 12: select_last_index
    "ArgMin": (1, 11, 12, 13),  # 11: negative axis; 12: select_last_index
    "AveragePool": (7, 10, 11, 19, 22),  # 7: count_include_pad; 10: ceil_mode; 19: dilations
    "BatchNormalization": (7, 9, 14, 15),  # 7: spatial (0 refused); 14: training_mode (1 refused)
    "BitShift": (11, 28),  # 28: signed types; negative or too wide shifts give the sign fill (11: undefined)
    "Cast": (6, 9, 13, 19, 21, 23, 24, 25, 28),  # 19+: saturate, round_mode only for float8/4 (refused)
    "CastLike": (15, 19, 21, 23, 24, 25),  # Cast to input 1's type; saturate/round_mode as Cast's
    "Ceil": (6, 13),
    "Clip": (6, 11, 12, 13),  # 6: min/max attributes; 11: inputs
    "Concat": (4, 11, 13),
    "Constant": (1, 9, 11, 12, 13, 19, 21, 23, 24, 25),  # 11: sparse_value (refused); 12: value_*
    "ConstantOfShape": (9, 20, 21, 23, 24, 25),
    "Conv": (1, 11, 22),  # 11 only reworded auto_pad (the version converter: compatible)
    "CumSum": (11, 14),  # 14: float16, bfloat16 (refused as a type)
    "ConvInteger": (10,),
    "ConvTranspose": (1, 11, 22),  # 1 splits derived odd padding the other way round: refused
    "DequantizeLinear": (10, 13, 19, 21, 23, 24, 25, 28),  # 10: per tensor; 13: axis; 23: output_dtype
    "Div": (7, 13, 14),
    "Dropout": (7, 10, 12, 13, 22),  # 7/10: mask of type T / undefined in inference (refused when used)
    "Elu": (6, 22),
    "Equal": (7, 11, 13, 19),
    "Erf": (9, 13),  # 9 allowed integer inputs (refused: float only)
    "Exp": (6, 13),
    "Expand": (8, 13),
    "Flatten": (1, 9, 11, 13, 21, 23, 24, 25),
    "Floor": (6, 13),
    "Gather": (1, 11, 13),
    "GatherElements": (11, 13),
    "Gelu": (20,),
    "Gemm": (7, 9, 11, 13),  # 7: unidirectional broadcasting of C; 11: C optional
    "GlobalAveragePool": (1, 22),
    "GlobalMaxPool": (1, 22),
    "Greater": (7, 9, 13),
    "GreaterOrEqual": (12, 16),
    "Hardmax": (1, 11, 13),  # before 13: over the input coerced to 2-D at axis (default 1)
    "HardSigmoid": (6, 22),
    "HardSwish": (14, 22),
    "Identity": (1, 13, 14, 16, 19, 21, 23, 24, 25),
    "InstanceNormalization": (6, 22),
    "LayerNormalization": (17,),  # Mean and InvStdDev outputs in float32 for float16 inputs (stash_type 1)
    "LeakyRelu": (6, 16),
    "Less": (7, 9, 13),
    "LessOrEqual": (12, 16),
    "Log": (6, 13),
    "LogSoftmax": (1, 11, 13),  # before 13: over the input coerced to 2-D at axis (default 1)
    "LpNormalization": (1, 22),
    "MatMul": (1, 9, 13),
    "MatMulInteger": (10,),
    "Max": (6, 8, 12, 13),  # 6: equal shapes (broadcasting is the superset)
    "MaxPool": (1, 8, 10, 11, 12, 22),  # 8: storage_order, Indices (refused when used); 10: ceil_mode
    "Mean": (6, 8, 13),
    "Min": (6, 8, 12, 13),
    "Mod": (10, 13, 28),  # before 28: fmod=0 integers only (floats refused); 28: floats floor too
    "Mul": (7, 13, 14),
    "NegativeLogLikelihoodLoss": (12, 13, 22),  # 13: bfloat16 (refused as a type); 22: no change
    "Neg": (6, 13),
    "Not": (1,),
    "OneHot": (9, 11, 28),  # 9: negative indices undefined (11 counts them from the end)
    "Or": (7,),
    "PRelu": (7, 9, 16),
    "Pad": (2, 11, 13, 18, 19, 21, 23, 24, 25),  # 2: pads/value attributes; 11: inputs; 18: axes; 19: wrap
    "Pow": (7, 12, 13, 15),
    "QLinearConv": (10,),
    "QLinearMatMul": (10, 21),
    "QuantizeLinear": (10, 13, 19, 21, 23, 24, 25, 28),  # 10: per tensor; 13: axis; 21: output_dtype
    "RMSNormalization": (23,),  # stash_type 1 only (float16 computed in float32)
    "Range": (11, 27),  # 27: stash_type (float16 computed in float32)
    "Reciprocal": (6, 13),
    "ReduceMax": (1, 11, 12, 13, 18, 20),  # before 18: axes attribute
    "ReduceL1": (1, 11, 13, 18),  # before 18: axes attribute
    "ReduceL2": (1, 11, 13, 18),  # before 18: axes attribute
    "ReduceLogSumExp": (1, 11, 13, 18, 28),  # before 18: axes attribute; 28: float types only
    "ReduceMean": (1, 11, 13, 18),  # before 18: axes attribute
    "ReduceMin": (1, 11, 12, 13, 18, 20),  # before 18: axes attribute
    "ReduceSum": (1, 11, 13),  # before 13: axes attribute
    "ReduceSumSquare": (1, 11, 13, 18),  # before 18: axes attribute
    "Relu": (6, 13, 14),
    "Reshape": (5, 13, 14, 19, 21, 23, 24, 25),  # 14: allowzero
    "Resize": (10, 11, 13, 18, 19),  # 10: asymmetric, scales input 1; 11: roi/scales/sizes; 18: axes
    "Round": (11, 22),
    "Shape": (1, 13, 15, 19, 21, 23, 24, 25),  # 15: start/end
    "Sigmoid": (6, 13),
    "Size": (1, 13, 19, 21, 23, 24, 25),
    "Slice": (1, 10, 11, 13),  # 1: starts/ends/axes attributes; 10: inputs and steps
    "Softmax": (1, 11, 13),  # before 13: over the input coerced to 2-D at axis (default 1)
    "SoftmaxCrossEntropyLoss": (12, 13),  # 13: bfloat16 (refused as a type)
    "Softplus": (1, 22),
    "Split": (2, 11, 13, 18),  # before 13: split attribute; before 18: equal parts must divide
    "Sqrt": (6, 13),
    "Squeeze": (1, 11, 13, 21, 23, 24, 25),  # before 13: axes attribute
    "Sub": (7, 13, 14),
    "Sum": (6, 8, 13),
    "Tanh": (6, 13),
    "Transpose": (1, 13, 21, 23, 24, 25),
    "Trilu": (14,),
    "Unsqueeze": (1, 11, 13, 21, 23, 24, 25),  # before 13: axes attribute
    "Upsample": (7, 9),  # 7: scales attribute; 9: input; 10: deprecated (Resize)
    "Where": (9, 16),
    "Xor": (7,),
}
"""ONNX operator -> the versions of it that aotc converts."""

_VERSION_CHECKS: dict[str, Callable[[OnnxConverter, OnnxNode], None]] = {}
"""ONNX operator -> a check run before its converter, for version semantics that a converter registered
elsewhere (onnx_quant) does not read."""


def converts(*op_types: str):
    def wrap(fn):
        for op_type in op_types:
            _CONVERTERS[op_type] = fn
        return fn

    return wrap


_ELEMENTWISE: dict[str, tuple[str, dict[str, Any]]] = {
    "Neg": ("negative", {}),
    "Abs": ("abs", {}),
    "Exp": ("exp", {}),
    "Log": ("log", {}),
    "Sqrt": ("sqrt", {}),
    "Reciprocal": ("reciprocal", {}),
    "Erf": ("erf", {}),
    "Tanh": ("tanh", {}),
    "Sigmoid": ("sigmoid", {}),
    "Floor": ("floor", {}),
    "Ceil": ("ceil", {}),
    "Round": ("round", {}),
    "Not": ("logical_not", {}),
    "Relu": ("relu", {}),
    "Softplus": ("softplus", {}),
    "HardSwish": ("hard_swish", {}),
    "LeakyRelu": ("leaky_relu", {"alpha": 0.01}),
    "Elu": ("elu", {"alpha": 1.0}),
    "HardSigmoid": ("hard_sigmoid", {"alpha": 0.2, "beta": 0.5}),
    "Gelu": ("gelu", {"approximate": "none"}),
    "Add": ("add", {}),
    "Sub": ("subtract", {}),
    "Mul": ("multiply", {}),
    "Div": ("divide", {}),
    "Pow": ("power", {}),
    "Equal": ("equal", {}),
    "Less": ("less", {}),
    "LessOrEqual": ("less_equal", {}),
    "Greater": ("greater", {}),
    "GreaterOrEqual": ("greater_equal", {}),
    "And": ("logical_and", {}),
    "Or": ("logical_or", {}),
    "PRelu": ("prelu", {}),
    "Where": ("where", {}),
}
"""ONNX op -> (graph op, its attrs with ONNX defaults) for ops that map one to one on all inputs."""


@converts(*_ELEMENTWISE)
def _elementwise(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    op, defaults = _ELEMENTWISE[n.op_type]
    attrs = {k: n.attr(k, d) for k, d in defaults.items()}
    return [cv.emit(op, n.inputs, attrs, n.outputs[0])]


@converts("Max", "Min", "Sum", "Mean")
def _variadic(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    op = {"Max": "maximum", "Min": "minimum", "Sum": "add", "Mean": "add"}[n.op_type]
    acc = n.inputs[0]
    last = n.outputs[0] if n.op_type != "Mean" else None
    for i, v in enumerate(n.inputs[1:], 2):
        acc = cv.emit(op, [acc, v], out=last if i == len(n.inputs) else None)
    if n.op_type == "Mean":
        count = cv.constant(len(n.inputs), "count", acc.type.dtype)
        acc = cv.emit("divide", [acc, count], out=n.outputs[0])
    return [acc]


@converts("Identity", "Dropout")
def _identity(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    x = n.inputs[0]
    training = cv.const_input(n, 2, "training_mode") if n.op_type == "Dropout" else None
    if training is not None and training.item():
        raise cv.fail("training_mode must be false for inference")
    if len(n.outputs) > 1 and n.outputs[1]:
        if n.older_than(12):
            # Dropout-7's mask has the input's type, and no spec before 12 says what it holds in inference
            # (onnxruntime's opset 7-11 kernel writes zeros, 12's ones)
            raise cv.fail_version("its mask output is not defined in inference before Dropout-12")
        return [x, cv.constant(np.ones(x.type.shape, bool), "mask", out=n.outputs[1])]
    return [x]


@converts("Cast", "CastLike")
def _cast(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """Cast to `to`, CastLike to the element type of input 1 (whose values it does not read). A cast from
    or to a low-precision or sub-byte type (where `saturate` and `round_mode` apply) is onnx_lowp's."""
    x = n.inputs[0]
    if n.op_type == "CastLike":
        dtype = cv.formats.get(n.inputs[1].name, n.inputs[1].type.dtype)
    else:
        to = n.attr("to")
        dtype = _LOWP_TYPES.get(to)
        if to not in _DTYPES and dtype is None:
            raise cv.fail(f"cannot cast to element type {_elem_type_name(to)}; {_UNSUPPORTED_TYPES}")
        dtype = dtype or _DTYPES[to]
    if dtype in LOWP_FORMATS or x.name in cv.formats:
        return [onnx_lowp.cast(cv, n, x, dtype)]
    if dtype == x.type.dtype:
        return [x]
    return [cv.emit("cast", [x], {"dtype": dtype}, n.outputs[0])]


@converts("Mod")
def _mod(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """fmod=0: the floor modulo, the divisor's sign (np.mod); fmod=1: C's fmod, the dividend's sign
    (np.fmod). Before Mod-28, fmod=0 is defined on integers only (and fmod=1 on floats, but onnxruntime and
    Mod-28 read it on integers as the truncated remainder, as aotc does)."""
    a, b = n.inputs
    fmod = n.attr("fmod", 0)
    if fmod not in (0, 1):
        raise cv.fail(f"fmod must be 0 or 1, got {fmod}")
    dtype = a.type.dtype
    if dtype == "bool" or b.type.dtype == "bool":
        raise cv.fail("Mod is not defined on bool tensors")
    if fmod == 0 and dtype.startswith("float") and n.older_than(28):
        raise cv.fail_version(
            f"fmod=0 on {dtype} inputs is invalid: this version defines it on integers only (set fmod=1 for "
            "C's fmod; Mod-28 defines a floor modulo of floats)"
        )
    return [cv.emit("fmod" if fmod else "mod", [a, b], out=n.outputs[0])]


@converts("Clip")
def _clip(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """Absent bounds are numeric_limits::lowest() and max(), which clip infinities to finite values (as
    onnxruntime does): float32's for Clip-6's float attributes, the input type's for Clip-11's inputs."""
    x = n.inputs[0]
    if n.older_than(11):
        big = float(np.finfo(np.float32).max)
        attrs = {"min": n.attr("min", -big), "max": n.attr("max", big)}
        return [cv.emit("clip", [x], attrs, n.outputs[0])]
    lo_v, hi_v = n.input(1), n.input(2)
    if any(v is not None and not v.is_constant for v in (lo_v, hi_v)):
        return [_clip_run_time(cv, n, x, lo_v, hi_v)]
    lo, hi = cv.const_input(n, 1, "min"), cv.const_input(n, 2, "max")
    limits = np.finfo(x.type.dtype) if x.type.dtype.startswith("float") else None
    attrs = {
        "min": lo.item() if lo is not None else None if limits is None else float(limits.min),
        "max": hi.item() if hi is not None else None if limits is None else float(limits.max),
    }
    return [cv.emit("clip", [x], attrs, n.outputs[0])]


def _clip_run_time(cv: OnnxConverter, n: OnnxNode, x: Value, lo: Value | None, hi: Value | None) -> Value:
    """Clip-11+ with a bound fed or computed at run time: min(max(x, lo), hi) with the bounds as kernel
    inputs (scalars that broadcast), so min > max gives max, as the operator says. An absent bound is no
    bound here: numeric_limits' one only differs on infinite inputs (the constant path keeps it)."""
    for i, v in ((1, lo), (2, hi)):
        if v is not None and (v.type.shape not in ((), (1,)) or v.type.dtype != x.type.dtype):
            raise cv.fail(f"input {i} ({v.name}) must be a scalar of the input's type, got {v.type}")
    y = x
    if lo is not None:
        y = cv.emit("maximum", [y, _scalar(cv, lo)], out=n.outputs[0] if hi is None else None)
    if hi is not None:
        y = cv.emit("minimum", [y, _scalar(cv, hi)], out=n.outputs[0])
    return y


def _scalar(cv: OnnxConverter, v: Value) -> Value:
    """A one-element value as a 0-d one (so it broadcasts without raising the rank of a 0-d operand)."""
    return v if v.type.shape == () else cv.emit("reshape", [v], {"shape": ()})


@converts("Softmax", "LogSoftmax")
def _softmax(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    x = n.inputs[0]
    shape = x.type.shape
    op = "softmax" if n.op_type == "Softmax" else "log_softmax"
    if not n.older_than(13):
        axis = onnx_axis(cv, n.attr("axis", -1), len(shape))
        return [_softmax_op(cv, op, x, axis, n.outputs[0])]
    # Softmax-1/11: over the input coerced to 2-D, [prod(shape[:axis]), prod(shape[axis:])] (axis default 1)
    axis = onnx_axis(cv, n.attr("axis", 1), len(shape)) if shape else 0
    if axis >= len(shape) - 1:  # the 2-D rows are the last axis: the same as softmax over it
        return [_softmax_op(cv, op, x, max(len(shape) - 1, 0), n.outputs[0])]
    rows = cv.emit("reshape", [x], {"shape": (math.prod(shape[:axis]), math.prod(shape[axis:]))})
    return [cv.emit("reshape", [_softmax_op(cv, op, rows, 1)], {"shape": shape}, n.outputs[0])]


def _softmax_op(cv: OnnxConverter, op: str, x: Value, axis: int, out: str | None = None) -> Value:
    """Graph op `op` (softmax or log_softmax) of `x` along `axis`. A float16 Softmax is ONNX's function body
    of Softmax-13 op by op, each result a float16 tensor: x - max, its exp (rounded to float16), their sum
    (accumulated in float32), the quotient, as ONNX's reference computes it and its conformance tests expect
    (one float32 softmax rounded once differs from that by up to 2 ulp: issue 19). A float16 LogSoftmax is
    computed in float32 and rounded once (FLOAT16_ACCUMULATES_IN_FLOAT32): ONNX's reference takes the log of
    the float16 softmax instead of its function body, and both are ~10 ulp off at large negative outputs."""
    if op != "softmax" or x.type.dtype != "float16" or not x.type.shape:
        return cv.emit(op, [x], {"axis": axis}, out)
    reduced = {"axes": (axis,), "keepdims": True}
    exps = cv.emit("exp", [cv.emit("subtract", [x, cv.emit("reduce_max", [x], reduced)])])
    return cv.emit("divide", [exps, cv.emit("reduce_sum", [exps], reduced)], out=out)


def onnx_axis(cv: OnnxConverter, axis: int, ndim: int) -> int:
    if not -ndim <= axis < max(ndim, 1):
        raise cv.fail(f"axis {axis} is out of range for rank {ndim}")
    return axis % max(ndim, 1)


def _axes(cv: OnnxConverter, n: OnnxNode, ndim: int) -> list[int] | None:
    """Axes from input 1 (newer opsets) or the `axes` attribute (older ones); None if neither."""
    given = cv.const_input(n, 1, "axes")
    axes = given.reshape(-1).tolist() if given is not None else n.attr("axes")
    if axes is None:
        return None
    return [onnx_axis(cv, int(a), ndim) for a in axes]


# --- convolution, matrix products, pooling ------------------------------------------------------------------


def _split_pads(totals: Sequence[int], auto_pad: str) -> list[int]:
    """ONNX pads [begin..., end...] from each axis's total padding; SAME_UPPER puts the odd one at the end."""
    begin = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in totals]
    return begin + [t - b for t, b in zip(totals, begin)]


def _window_pads(cv: OnnxConverter, n: OnnxNode, sizes, kernel, strides, dilations) -> list[int]:
    """ONNX pads of a sliding window, resolving auto_pad."""
    rank = len(sizes)
    auto_pad = n.attr("auto_pad", "NOTSET")
    if auto_pad == "NOTSET":
        return list(n.attr("pads", [0] * 2 * rank))
    if auto_pad == "VALID":
        return [0] * 2 * rank
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        raise cv.fail(f"unknown auto_pad {auto_pad!r}")
    totals = [
        max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
        for size, k, s, d in zip(sizes, kernel, strides, dilations)
    ]
    return _split_pads(totals, auto_pad)


def _transposed_pads(cv: OnnxConverter, n: OnnxNode, sizes, kernel, strides, dilations) -> list[int]:
    """ONNX pads of a ConvTranspose, from pads, auto_pad or output_shape."""
    rank = len(sizes)
    output_shape = n.attr("output_shape")
    auto_pad = n.attr("auto_pad", "NOTSET")
    if output_shape is None and auto_pad in ("NOTSET", "VALID"):
        return list(n.attr("pads", [0] * 2 * rank)) if auto_pad == "NOTSET" else [0] * 2 * rank
    targets = output_shape[-rank:] if output_shape is not None else [s * st for s, st in zip(sizes, strides)]
    out_pad = n.attr("output_padding", [0] * rank)
    totals = [
        s * (size - 1) + op + (k - 1) * d + 1 - target
        for size, k, s, d, op, target in zip(sizes, kernel, strides, dilations, out_pad, targets)
    ]
    if n.older_than(11) and any(t % 2 for t in totals):
        # ConvTranspose-1's text puts the odd element on the other side than 11's (and the version
        # converter calls them compatible): which one a model meant is not certain
        raise cv.fail_version(
            f"derived padding {totals} is odd, and ConvTranspose-1 splits it the other way round from "
            "ConvTranspose-11"
        )
    return _split_pads(totals, auto_pad)


@dataclass
class ConvWindow:
    """Sliding-window attributes of a Conv/ConvTranspose/Pool node as 2-D ones (1-D lifted to H=1), or as
    3-D ones (`rank` 3: the graph's 3-D window ops, whose pads are ONNX's too)."""

    attrs: dict[str, tuple[int, ...]]
    lifted: bool
    rank: int = 2


def conv_window(
    cv: OnnxConverter, n: OnnxNode, x: Value, kernel: Sequence[int], transposed: bool = False
) -> ConvWindow:
    rank = len(x.type.shape) - 2
    if rank not in (1, 2, 3):
        raise cv.fail(f"only 1-D, 2-D and 3-D windows are supported, got a {rank}-D input {x.type}")
    if len(kernel) != rank:
        raise cv.fail(f"a {len(kernel)}-D kernel {list(kernel)} on the {rank}-D input {x.type}")
    sizes = x.type.shape[2:]
    strides = list(n.attr("strides", [1] * rank))
    dilations = list(n.attr("dilations", [1] * rank))
    pad_fn = _transposed_pads if transposed else _window_pads
    pads = pad_fn(cv, n, sizes, kernel, strides, dilations)
    attrs = {"kernel": kernel, "strides": strides, "dilations": dilations, "pads": pads}
    if transposed:
        attrs["output_padding"] = n.attr("output_padding", [0] * rank)
    attrs = {k: tuple(int(e) for e in v) for k, v in attrs.items()}
    lengths = {"pads": 2 * rank}
    wrong = [k for k, v in attrs.items() if len(v) != lengths.get(k, rank)]
    if wrong:
        raise cv.fail(f"{wrong[0]} {list(attrs[wrong[0]])} does not fit the {rank}-D input {x.type}")
    if min(attrs["strides"]) < 1 or min(attrs["dilations"]) < 1 or min(attrs["kernel"]) < 1:
        raise cv.fail(f"kernel, strides and dilations must be positive, got {attrs}")
    return ConvWindow(_lift_attrs(attrs) if rank == 1 else attrs, rank == 1, max(rank, 2))


def _lift_attrs(attrs: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """1-D window attrs as 2-D ones over [1, L]."""
    lifted = {k: (1, *v) for k, v in attrs.items()}
    lifted["pads"] = (0, attrs["pads"][0], 0, attrs["pads"][1])
    if "output_padding" in attrs:
        lifted["output_padding"] = (0, *attrs["output_padding"])
    return lifted


def _lift(cv: OnnxConverter, v: Value) -> Value:
    """A 1-D window operand [N, C, L] as [N, C, 1, L]."""
    s = v.type.shape
    return cv.emit("reshape", [v], {"shape": (*s[:2], 1, *s[2:])})


def _windowed(
    cv: OnnxConverter, n: OnnxNode, op: str, inputs: list[Value], attrs: dict, w: ConvWindow
) -> Value:
    """Emit a 2-D window op (`op`), lifting 1-D operands to 2-D and the result back, or its 3-D twin."""
    if w.rank == 3:
        op = op.replace("2d", "3d")  # conv3d, conv3d_transpose, max_pool3d, avg_pool3d
    if not w.lifted:
        return cv.emit(op, inputs, attrs, n.outputs[0])
    lifted = [_lift(cv, v) if len(v.type.shape) == 3 else v for v in inputs]
    out = cv.emit(op, lifted, attrs)
    s = out.type.shape
    return cv.emit("reshape", [out], {"shape": (*s[:2], s[3])}, n.outputs[0])


@converts("Conv", "ConvTranspose")
def _conv(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    x, weight, bias = n.input(0), n.input(1), n.input(2)
    transposed = n.op_type == "ConvTranspose"
    w = conv_window(cv, n, x, weight.type.shape[2:], transposed)
    attrs = {k: v for k, v in w.attrs.items() if k != "kernel"} | {"groups": n.attr("group", 1)}
    inputs = [x, weight] + ([bias] if bias is not None else [])
    return [_windowed(cv, n, "conv2d_transpose" if transposed else "conv2d", inputs, attrs, w)]


@converts("MaxPool", "AveragePool")
def _pool(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    x = n.inputs[0]
    if n.attr("kernel_shape") is None:
        raise cv.fail("needs kernel_shape")
    w = conv_window(cv, n, x, n.attr("kernel_shape"))
    attrs: dict[str, Any] = {**w.attrs, "ceil_mode": bool(n.attr("ceil_mode", 0))}
    if n.op_type == "AveragePool":
        attrs["count_include_pad"] = bool(n.attr("count_include_pad", 0))
    op = "max_pool2d" if n.op_type == "MaxPool" else "avg_pool2d"
    y = _windowed(cv, n, op, [x], attrs, w)
    if n.op_type != "MaxPool" or len(n.outputs) < 2 or not n.outputs[1]:
        return [y]
    # Indices: where each window's maximum lies in the flattened input (storage_order 1: column-major)
    order = n.attr("storage_order", 0)
    if order not in (0, 1):
        raise cv.fail(f"storage_order={order} is not 0 or 1")
    index_attrs = {k: w.attrs[k] for k in ("kernel", "strides", "pads", "dilations")}
    index_attrs["storage_order"] = order
    if not w.lifted:
        return [y, cv.emit("max_pool_indices", [x, y], index_attrs, n.outputs[1])]
    # a 1-D window lifted to [N, C, 1, L]: its row-major and column-major numbers are the 1-D ones
    lifted = cv.emit("max_pool_indices", [_lift(cv, x), _lift(cv, y)], index_attrs)
    return [y, cv.emit("reshape", [lifted], {"shape": y.type.shape}, n.outputs[1])]


@converts("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    x = n.inputs[0]
    op = "reduce_mean" if n.op_type == "GlobalAveragePool" else "reduce_max"
    axes = tuple(range(2, len(x.type.shape)))
    return [cv.emit(op, [x], {"axes": axes, "keepdims": True}, n.outputs[0])]


@converts("MatMul")
def _matmul(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    return [cv.emit("matmul", n.inputs[:2], out=n.outputs[0])]


@converts("Gemm")
def _gemm(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """alpha * A' B' + beta * C as dense(A', B'') with B'' in [N, K] layout, C as its bias when 1-D."""
    a, b, c = n.input(0), n.input(1), n.input(2)
    alpha, beta = n.attr("alpha", 1.0), n.attr("beta", 1.0)
    if n.attr("transA", 0):
        a = cv.emit("transpose", [a], {"perm": (1, 0)})
    if not n.attr("transB", 0):
        b = cv.emit("transpose", [b], {"perm": (1, 0)})
    if alpha != 1.0:
        b = cv.emit("multiply", [b, cv.constant(alpha, "alpha", b.type.dtype)])
    if c is not None and beta != 1.0:
        c = cv.emit("multiply", [c, cv.constant(beta, "beta", c.type.dtype)])
    units = b.type.shape[0]
    if c is None or beta == 0.0:
        return [cv.emit("dense", [a, b], out=n.outputs[0])]
    if c.type.shape in ((units,), (1, units)):
        if c.type.shape != (units,):
            c = cv.emit("reshape", [c], {"shape": (units,)})
        return [cv.emit("dense", [a, b, c], out=n.outputs[0])]
    return [cv.emit("add", [cv.emit("dense", [a, b]), c], out=n.outputs[0])]


# --- normalization and reductions ---------------------------------------------------------------------------


@converts("BatchNormalization")
def _batch_norm(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    if n.attr("training_mode", 0):
        raise cv.fail("training_mode=1 is not supported (inference only)")
    if not n.attr("spatial", 1):
        # BatchNormalization-7's spatial=0: statistics per element of [C, D1, ...], not per channel
        raise cv.fail_version("spatial=0 (statistics per element, not per channel) is not supported")
    return [cv.emit("batch_norm", n.inputs[:5], {"epsilon": n.attr("epsilon", 1e-5)}, n.outputs[0])]


@converts("LayerNormalization")
def _layer_norm(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """Y, and when used, Mean and InvStdDev (1 / sqrt(variance + epsilon)) over axes [axis, ndim), of shape
    [d0, ..., d(axis-1), 1, ..., 1]; computed in float32 for float16 inputs (stash_type 1, the only one
    aotc computes), and of that type, as the schema's U."""
    x = n.inputs[0]
    ndim = len(x.type.shape)
    axis = onnx_axis(cv, n.attr("axis", -1), ndim)
    epsilon = n.attr("epsilon", 1e-5)
    inputs = [v for v in n.inputs[:3] if v is not None]
    y = cv.emit("layer_norm", inputs, {"axis": axis, "epsilon": epsilon}, n.outputs[0])
    wanted = [i for i in (1, 2) if i < len(n.outputs) and n.outputs[i] in cv.used]
    if not wanted:
        return [y]
    if n.attr("stash_type", 1) != 1:
        raise cv.fail(
            f"stash_type={n.attr('stash_type')} is not supported with outputs Mean or InvStdDev (1)"
        )
    wide = cv.emit("cast", [x], {"dtype": "float32"}) if x.type.dtype == "float16" else x
    reduced = {"axes": tuple(range(axis, ndim)), "keepdims": True}
    mean = cv.emit("reduce_mean", [wide], reduced, n.outputs[1] if 1 in wanted else None)
    if 2 not in wanted:
        return [y, mean]
    centered = cv.emit("subtract", [wide, mean])
    var = cv.emit("reduce_mean", [cv.emit("multiply", [centered, centered])], reduced)
    eps = cv.constant(epsilon, "epsilon", wide.type.dtype)
    one = cv.constant(1.0, "one", wide.type.dtype)
    std = cv.emit("sqrt", [cv.emit("add", [var, eps])])
    return [y, mean, cv.emit("divide", [one, std], out=n.outputs[2])]


@converts("RMSNormalization")
def _rms_norm(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """X / sqrt(mean(X * X) + epsilon) over axes [axis, ndim), times Scale. stash_type 1 (the default, the
    only one aotc computes): a float16 X is normalized in float32 and rounded, then scaled in float16, as
    the function body casts back before its Mul."""
    x, scale = n.inputs[:2]
    dtype = x.type.dtype
    if not dtype.startswith("float"):
        raise cv.fail(f"RMSNormalization is defined on float tensors, got {dtype}")
    if scale.type.dtype != dtype:
        raise cv.fail(f"a scale of type {scale.type.dtype} for an input of type {dtype} is not supported")
    if n.attr("stash_type", 1) != 1:
        raise cv.fail(f"stash_type={n.attr('stash_type')} is not supported (1: float32)")
    attrs = {"axis": onnx_axis(cv, n.attr("axis", -1), len(x.type.shape)), "epsilon": n.attr("epsilon", 1e-5)}
    try:
        broadcast_shape(x.type.shape, scale.type.shape)
    except ValueError as e:
        raise cv.fail(f"scale {scale.type} does not broadcast to the input {x.type}: {e}") from e
    if dtype != "float16":
        return [cv.emit("rms_norm", [x, scale], attrs, n.outputs[0])]
    wide = cv.emit("rms_norm", [cv.emit("cast", [x], {"dtype": "float32"})], attrs)
    return [cv.emit("multiply", [cv.emit("cast", [wide], {"dtype": "float16"}), scale], out=n.outputs[0])]


@converts("InstanceNormalization")
def _instance_norm(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    return [cv.emit("instance_norm", n.inputs[:3], {"epsilon": n.attr("epsilon", 1e-5)}, n.outputs[0])]


_REDUCE = {
    "ReduceMean": "reduce_mean",
    "ReduceSum": "reduce_sum",
    "ReduceMax": "reduce_max",
    "ReduceMin": "reduce_min",
}


_COMPOSITE_REDUCE = ("ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp")
"""Reductions made of graph ops: sum(|x|), sqrt(sum(x * x)), sum(x * x), max + log(sum(exp(x - max)))."""


@converts(*_REDUCE, *_COMPOSITE_REDUCE)
def _reduce(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    x = n.inputs[0]
    ndim = len(x.type.shape)
    axes = _axes(cv, n, ndim)
    if not axes:
        if n.attr("noop_with_empty_axes", 0):
            if n.op_type in _COMPOSITE_REDUCE:
                raise cv.fail("noop_with_empty_axes with no axes is not supported")
            return [x]
        axes = list(range(ndim))
    attrs = {"axes": tuple(sorted(set(axes))), "keepdims": bool(n.attr("keepdims", 1))}
    if n.op_type in _COMPOSITE_REDUCE:
        return [_composite_reduce(cv, n, x, attrs)]
    if x.type.dtype == "bool" and n.op_type in ("ReduceMax", "ReduceMin"):
        # ReduceMax/Min-20 on bool (any / all): over 0/1 bytes, which the codegen orders
        wide = cv.emit("cast", [x], {"dtype": "uint8"})
        return [
            cv.emit("cast", [cv.emit(_REDUCE[n.op_type], [wide], attrs)], {"dtype": "bool"}, n.outputs[0])
        ]
    return [cv.emit(_REDUCE[n.op_type], [x], attrs, n.outputs[0])]


def _composite_reduce(cv: OnnxConverter, n: OnnxNode, x: Value, attrs: dict) -> Value:
    dtype = x.type.dtype
    floats_only = n.op_type in ("ReduceL2", "ReduceLogSumExp")
    if dtype == "bool" or (floats_only and not dtype.startswith("float")):
        kinds = "float" if floats_only else "numeric"
        raise cv.fail(f"{n.op_type} is computed on {kinds} tensors here, got {dtype}")
    out = n.outputs[0]
    if n.op_type == "ReduceL1":
        magnitudes = x if dtype.startswith("uint") else cv.emit("abs", [x])
        return cv.emit("reduce_sum", [magnitudes], attrs, out)
    if n.op_type != "ReduceLogSumExp":
        squares = cv.emit("multiply", [x, x])
        if n.op_type == "ReduceSumSquare":
            return cv.emit("reduce_sum", [squares], attrs, out)
        return cv.emit("sqrt", [cv.emit("reduce_sum", [squares], attrs)], out=out)
    # max + log(sum(exp(x - max))): no overflow of exp for large inputs
    peak = cv.emit("reduce_max", [x], {**attrs, "keepdims": True})
    sums = cv.emit("reduce_sum", [cv.emit("exp", [cv.emit("subtract", [x, peak])])], attrs)
    top = peak if attrs["keepdims"] else cv.emit("reshape", [peak], {"shape": sums.type.shape})
    return cv.emit("add", [cv.emit("log", [sums]), top], out=out)


@converts("CumSum")
def _cumsum(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """Cumulative sums along `axis` (input 1, a scalar needed at compile time), `exclusive` leaving out each
    element itself, `reverse` summing from the end."""
    x = n.inputs[0]
    if x.type.dtype == "bool" or not x.type.shape:
        raise cv.fail(f"CumSum needs a numeric tensor of rank 1 or more, got {x.type}")
    axis = cv.const_input(n, 1, "axis")
    if axis is None or axis.size != 1:
        raise cv.fail("axis must be one value")
    attrs = {
        "axis": onnx_axis(cv, int(axis.item()), len(x.type.shape)),
        "exclusive": bool(n.attr("exclusive", 0)),
        "reverse": bool(n.attr("reverse", 0)),
    }
    return [cv.emit("cumsum", [x], attrs, n.outputs[0])]


@converts("Hardmax")
def _hardmax(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """1 at the first greatest element along `axis`, 0 elsewhere (before Hardmax-13 over the input coerced
    to 2-D at `axis`, default 1, as Softmax's versions): the one-hot of ArgMax."""
    x = n.inputs[0]
    shape = x.type.shape
    if not x.type.dtype.startswith("float") or not shape:
        raise cv.fail(f"Hardmax needs a float tensor of rank 1 or more, got {x.type}")
    rows = x
    if n.older_than(13):
        axis = onnx_axis(cv, n.attr("axis", 1), len(shape))
        if axis < len(shape) - 1:
            rows = cv.emit("reshape", [x], {"shape": (math.prod(shape[:axis]), math.prod(shape[axis:]))})
        axis = len(rows.type.shape) - 1
    else:
        axis = onnx_axis(cv, n.attr("axis", -1), len(shape))
    best = cv.emit("argmax", [rows], {"axis": axis, "keepdims": True, "select_last_index": False})
    extent = rows.type.shape[axis]
    iota = np.arange(extent, dtype=np.int64).reshape(
        [extent if d == axis else 1 for d in range(len(rows.type.shape))]
    )
    hot = cv.emit("equal", [best, cv.constant(iota, "iota")])
    out = n.outputs[0] if rows is x else None
    y = cv.emit("cast", [hot], {"dtype": x.type.dtype}, out)
    return [y if rows is x else cv.emit("reshape", [y], {"shape": shape}, n.outputs[0])]


@converts("OneHot")
def _one_hot(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """values[1] where a (new) axis `axis` of extent `depth` (input 1, needed at compile time) equals the
    index, values[0] elsewhere; negative indices count from the end (an index still out of range matches
    nothing); float indices are truncated."""
    indices, values = n.inputs[0], n.inputs[2]
    if indices.type.dtype == "bool":
        raise cv.fail("indices must be numeric, got bool")
    depth = cv.const_input(n, 1, "depth")
    if depth.size != 1 or not depth.reshape(-1)[0] >= 1:
        raise cv.fail(f"depth must be one value of at least 1, got {depth.reshape(-1).tolist()}")
    depth = int(depth.reshape(-1)[0])
    if values.type.num_elements != 2 or len(values.type.shape) != 1:
        raise cv.fail(f"values must be [off_value, on_value], got {values.type}")
    rank = len(indices.type.shape) + 1
    axis = onnx_axis(cv, n.attr("axis", -1), rank)
    index = cv.emit("cast", [indices], {"dtype": "int64"}) if indices.type.dtype != "int64" else indices
    negative = cv.emit("less", [index, cv.constant(0, "zero", "int64")])
    index = cv.emit("where", [negative, cv.emit("add", [index, cv.constant(depth, "depth", "int64")]), index])
    shape = indices.type.shape
    index = cv.emit("reshape", [index], {"shape": (*shape[:axis], 1, *shape[axis:])})
    iota = np.arange(depth, dtype=np.int64).reshape([depth if d == axis else 1 for d in range(rank)])
    hot = cv.emit("equal", [index, cv.constant(iota, "iota")])
    off, on = (_scalar(cv, _slice(cv, values, {0: range(i, i + 1)}, None)) for i in (0, 1))
    return [cv.emit("where", [hot, on, off], out=n.outputs[0])]


@converts("LpNormalization")
def _lp_norm(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """x divided by its L1 (p=1) or L2 (p=2) norm along `axis` (0 where that norm is 0)."""
    x = n.inputs[0]
    if not x.type.dtype.startswith("float") or not x.type.shape:
        raise cv.fail(f"LpNormalization needs a float tensor of rank 1 or more, got {x.type}")
    p = n.attr("p", 2)
    if p not in (1, 2):
        raise cv.fail(f"p must be 1 or 2, got {p}")
    axis = onnx_axis(cv, n.attr("axis", -1), len(x.type.shape))
    reduced = {"axes": (axis,), "keepdims": True}
    if p == 1:
        norm = cv.emit("reduce_sum", [cv.emit("abs", [x])], reduced)
    else:
        norm = cv.emit("sqrt", [cv.emit("reduce_sum", [cv.emit("multiply", [x, x])], reduced)])
    # a zero norm means zeros along the axis, which stay 0 (not 0 / 0), as onnxruntime and the reference give
    zero = cv.emit("equal", [norm, cv.constant(0, "zero", x.type.dtype)])
    norm = cv.emit("where", [zero, cv.constant(1, "one", x.type.dtype), norm])
    return [cv.emit("divide", [x, norm], out=n.outputs[0])]


@converts("Xor")
def _xor(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    a, b = n.inputs[:2]
    if a.type.dtype != "bool" or b.type.dtype != "bool":
        raise cv.fail(f"Xor needs bool operands, got {a.type.dtype} and {b.type.dtype}")
    return [cv.emit("logical_not", [cv.emit("equal", [a, b])], out=n.outputs[0])]


@converts("ArgMax", "ArgMin")
def _arg_reduce(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """The int64 index of the first (select_last_index: the last) greatest or smallest element along
    `axis` (default 0), the axis kept with extent 1 unless keepdims=0."""
    x = n.inputs[0]
    if x.type.dtype == "bool":
        raise cv.fail(f"{n.op_type} is not defined on bool tensors")
    if not x.type.shape:
        raise cv.fail(f"{n.op_type} needs an input of rank 1 or more, got {x.type}")
    attrs = {
        "axis": onnx_axis(cv, n.attr("axis", 0), len(x.type.shape)),
        "keepdims": bool(n.attr("keepdims", 1)),
        "select_last_index": bool(n.attr("select_last_index", 0)),
    }
    return [cv.emit(n.op_type.lower(), [x], attrs, n.outputs[0])]


_REDUCTIONS = ("none", "sum", "mean")


@converts("NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss")
def _loss(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """loss[n, d...] = -input[n, target[n, d...], d...] * weight[target] (0 where target is ignore_index),
    then reduced: none, sum, or mean (the sum over the sum of the weights of the targets not ignored, their
    count without weights). SoftmaxCrossEntropyLoss is that loss of log_softmax(scores) along axis 1,
    which is also its optional output log_prob. A target that is neither a class nor ignore_index is
    undefined (here it reads the nearest class)."""
    x, target, weight = n.input(0), n.input(1), n.input(2)
    shape = x.type.shape
    reduction = n.attr("reduction", "mean")
    if reduction not in _REDUCTIONS:
        raise cv.fail(f"reduction must be one of {', '.join(_REDUCTIONS)}, got {reduction!r}")
    if not x.type.dtype.startswith("float"):
        raise cv.fail(f"{n.op_type} is defined on float tensors, got {x.type.dtype}")
    if target.type.dtype not in ("int32", "int64"):
        raise cv.fail(f"the target must be int32 or int64, got {target.type.dtype}")
    if len(shape) < 2 or target.type.shape != (shape[0], *shape[2:]):
        raise cv.fail(
            f"a target {target.type} for an input {x.type}: it must have the input's shape without axis 1"
        )
    if weight is not None and (weight.type.shape != (shape[1],) or weight.type.dtype != x.type.dtype):
        raise cv.fail(f"the weight {weight.type} must be one {x.type.dtype} per class ({shape[1]})")
    log_prob = None
    if n.op_type == "SoftmaxCrossEntropyLoss":
        out = n.outputs[1] if len(n.outputs) > 1 and n.outputs[1] else None
        log_prob = x = _softmax_op(cv, "log_softmax", x, 1, out)
    dtype = x.type.dtype
    index = cv.emit("reshape", [target], {"shape": (shape[0], 1, *shape[2:])})
    picked = cv.emit("gather_elements", [x, index], {"axis": 1})
    loss = cv.emit("negative", [cv.emit("reshape", [picked], {"shape": target.type.shape})])
    ignore = n.attr("ignore_index")
    kept = None
    if ignore is not None:
        kept = cv.emit(
            "logical_not",
            [cv.emit("equal", [target, cv.constant(ignore, "ignore_index", target.type.dtype)])],
        )
    zero = cv.constant(0, "zero", dtype)
    weights = None
    if weight is not None:
        weights = cv.emit("take", [weight, target], {"axis": 0})
        if kept is not None:
            weights = cv.emit("where", [kept, weights, zero])
        loss = cv.emit("multiply", [loss, weights])
    elif kept is not None:
        weights = cv.emit("cast", [kept], {"dtype": dtype})
    if kept is not None:
        loss = cv.emit("where", [kept, loss, zero])
    out = n.outputs[0]
    if reduction == "none":
        return [loss, log_prob] if log_prob is not None else [loss]
    everything = {"axes": tuple(range(len(target.type.shape))), "keepdims": False}
    if reduction == "sum":
        total = cv.emit("reduce_sum", [loss], everything, out)
    elif weights is None:
        total = cv.emit("reduce_mean", [loss], everything, out)
    else:
        total = cv.emit(
            "divide",
            [cv.emit("reduce_sum", [loss], everything), cv.emit("reduce_sum", [weights], everything)],
            out=out,
        )
    return [total, log_prob] if log_prob is not None else [total]


# --- shapes, layout, indexing -------------------------------------------------------------------------------


def _reshape(cv: OnnxConverter, x: Value, shape: Sequence[int], out: str) -> Value:
    shape = tuple(int(s) for s in shape)
    if shape == x.type.shape:
        return x
    return cv.emit("reshape", [x], {"shape": shape}, out)


@converts("Reshape")
def _reshape_op(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    x = n.inputs[0]
    spec = cv.const_input(n, 1, "shape")
    if spec is None:
        raise cv.fail("needs the shape input")
    shape = [int(s) for s in spec.tolist()]
    if not n.attr("allowzero", 0):
        shape = [x.type.shape[d] if s == 0 else s for d, s in enumerate(shape)]
    if not x.is_constant:
        shape = cv.batch.reshape_target(shape, x.type.shape)
    empty_to_empty = x.type.num_elements == 0 and -1 not in shape  # allowzero's literal 0 extent
    if (0 in shape and not empty_to_empty) or shape.count(-1) > 1 or any(s < -1 for s in shape):
        raise cv.fail(f"cannot reshape {x.type} to {spec.tolist()}")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        shape[shape.index(-1)] = x.type.num_elements // known if known else 0
    if math.prod(shape) != x.type.num_elements:
        raise cv.fail(f"cannot reshape {x.type} to {spec.tolist()}")
    return [_reshape(cv, x, shape, n.outputs[0])]


@converts("Flatten")
def _flatten(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    x = n.inputs[0]
    shape = x.type.shape
    axis = n.attr("axis", 1)
    axis = axis + len(shape) if axis < 0 else axis
    return [_reshape(cv, x, (math.prod(shape[:axis]), math.prod(shape[axis:])), n.outputs[0])]


@converts("Squeeze")
def _squeeze(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    x = n.inputs[0]
    shape = x.type.shape
    axes = _axes(cv, n, len(shape))
    axes = [d for d, s in enumerate(shape) if s == 1] if axes is None else axes
    if any(shape[a] != 1 for a in axes):
        raise cv.fail(f"cannot squeeze axes {axes} of {x.type}: their extents are not 1")
    return [_reshape(cv, x, [s for d, s in enumerate(shape) if d not in axes], n.outputs[0])]


@converts("Unsqueeze")
def _unsqueeze(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    x = n.inputs[0]
    given = cv.const_input(n, 1, "axes")
    raw = given.reshape(-1).tolist() if given is not None else n.attr("axes")
    if raw is None:
        raise cv.fail("needs axes")
    ndim = len(x.type.shape) + len(raw)
    axes = {onnx_axis(cv, int(a), ndim) for a in raw}
    dims = iter(x.type.shape)
    return [_reshape(cv, x, [1 if d in axes else next(dims) for d in range(ndim)], n.outputs[0])]


@converts("Transpose")
def _transpose(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    x = n.inputs[0]
    ndim = len(x.type.shape)
    perm = tuple(n.attr("perm", range(ndim - 1, -1, -1)))
    if perm == tuple(range(ndim)):
        return [x]
    return [cv.emit("transpose", [x], {"perm": perm}, n.outputs[0])]


@converts("Concat")
def _concat(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    parts = [v for v in n.inputs if v is not None and v.type.num_elements > 0]
    if not parts:
        raise cv.fail("all inputs are empty")
    if len(parts) == 1:
        return parts
    axis = onnx_axis(cv, n.attr("axis"), len(parts[0].type.shape))
    return [cv.emit("concat", parts, {"axis": axis}, n.outputs[0])]


def _slice(cv: OnnxConverter, x: Value, ranges: dict[int, range], out: str | None) -> Value:
    """x restricted to `ranges` (axis -> picked indices); other axes whole."""
    full = [ranges.get(d, range(s)) for d, s in enumerate(x.type.shape)]
    if all(r == range(s) for r, s in zip(full, x.type.shape)):
        return x
    if any(len(r) == 0 for r in full):  # an empty slice is known (nothing): a constant, no kernel
        return cv.constant(np.zeros([len(r) for r in full], x.type.dtype), "slice", out=out)
    attrs = {
        "begin": tuple(r.start for r in full),
        "end": tuple(r.stop for r in full),
        "strides": tuple(r.step for r in full),
    }
    return cv.emit("strided_slice", [x], attrs, out)


@converts("Slice")
def _slice_op(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    x = n.inputs[0]
    shape = x.type.shape
    if n.older_than(10):  # Slice-1: attributes, step 1
        starts, ends, axes, steps = n.attr("starts"), n.attr("ends"), n.attr("axes"), None
        if starts is None or ends is None or len(starts) != len(ends):
            raise cv.fail_version("needs starts and ends of one length")
    else:
        starts, ends = cv.const_input(n, 1, "starts"), cv.const_input(n, 2, "ends")
        axes = cv.const_input(n, 3, "axes")
        steps = cv.const_input(n, 4, "steps")
    axes = list(range(len(starts))) if axes is None else [onnx_axis(cv, int(a), len(shape)) for a in axes]
    steps = [1] * len(axes) if steps is None else [int(s) for s in steps]
    if 0 in steps:
        raise cv.fail("slice steps must be nonzero")
    ranges = {a: _slice_range(int(b), int(e), s, shape[a]) for a, b, e, s in zip(axes, starts, ends, steps)}
    return [_slice(cv, x, ranges, n.outputs[0])]


def _slice_range(start: int, end: int, step: int, extent: int) -> range:
    """The indices ONNX's Slice picks on an axis: negative start and end count from the end, then start is
    clamped into [0, extent] ([0, extent - 1] stepping backwards) and end into [0, extent] ([-1, extent - 1]).
    Stepping backwards from a start below -extent, that picks index 0 (ONNX's text, shape inference and
    onnxruntime), where Python's slice.indices, and so numpy and ONNX's reference evaluator, pick nothing."""
    start += extent if start < 0 else 0
    end += extent if end < 0 else 0
    if step > 0:
        return range(min(max(start, 0), extent), min(max(end, 0), extent), step)
    return range(min(max(start, 0), extent - 1), min(max(end, -1), extent - 1), step)


@converts("Split")
def _split(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    x = n.inputs[0]
    axis = onnx_axis(cv, n.attr("axis", 0), len(x.type.shape))
    extent = x.type.shape[axis]
    given = cv.const_input(n, 1, "split")
    if given is None and n.attr("split") is not None:
        given = np.asarray(n.attr("split"))
    if given is not None:
        sizes = [int(s) for s in given]
    else:
        parts = n.attr("num_outputs", len(n.outputs))
        if n.older_than(18) and extent % parts:
            # before Split-18 the parts are equal; 18's num_outputs lets the last one be smaller
            raise cv.fail_version(f"axis {axis} of {x.type} does not split into {parts} equal parts")
        chunk = -(-extent // parts)
        sizes = [min(chunk, extent - i * chunk) for i in range(parts)]
    if sum(sizes) != extent or min(sizes) < 0:
        raise cv.fail(f"split sizes {sizes} do not partition axis {axis} of {x.type}")
    outs, start = [], 0
    for size, name in zip(sizes, n.outputs):
        outs.append(_slice(cv, x, {axis: range(start, start + size)}, name or None))
        start += size
    return outs


@converts("Gather")
def _gather(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    data, indices = n.inputs[:2]
    if indices.type.dtype not in ("int32", "int64"):
        raise cv.fail(f"indices must be int32 or int64, got {indices.type.dtype}")
    axis = onnx_axis(cv, n.attr("axis", 0), len(data.type.shape))
    return [cv.emit("take", [data, indices], {"axis": axis}, n.outputs[0])]


@converts("GatherElements")
def _gather_elements(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    data, indices = n.inputs[:2]
    if indices.type.dtype not in ("int32", "int64"):
        raise cv.fail(f"indices must be int32 or int64, got {indices.type.dtype}")
    ndim = len(data.type.shape)
    if not ndim or len(indices.type.shape) != ndim:
        raise cv.fail(f"indices {indices.type} must have the rank of data {data.type} (at least 1)")
    axis = onnx_axis(cv, n.attr("axis", 0), ndim)
    return [cv.emit("gather_elements", [data, indices], {"axis": axis}, n.outputs[0])]


@converts("Trilu")
def _trilu(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """The upper (upper=1, the default) or lower triangle of the last two axes from the k-th diagonal (input
    1, a scalar, default 0); the other elements are 0. A k fed at run time is a kernel input."""
    x = n.inputs[0]
    if len(x.type.shape) < 2:
        raise cv.fail(f"Trilu needs an input of rank 2 or more, got {x.type}")
    upper = bool(n.attr("upper", 1))
    k_value = n.input(1)
    if k_value is not None and k_value.type.num_elements != 1:
        raise cv.fail(f"k must be a scalar, got {k_value.type}")
    if k_value is not None and not k_value.is_constant:
        # keep (i, j) where j - i >= k (upper) or <= k (lower): the offsets are a build-time constant
        rows, cols = x.type.shape[-2:]
        offsets = np.arange(cols, dtype=np.int64)[None, :] - np.arange(rows, dtype=np.int64)[:, None]
        k = _scalar(cv, k_value)
        if k.type.dtype != "int64":
            k = cv.emit("cast", [k], {"dtype": "int64"})
        keep = cv.emit(
            "greater_equal" if upper else "less_equal", [cv.constant(offsets, "diagonal_offsets"), k]
        )
        zero = cv.constant(np.zeros((), x.type.dtype), "zero")
        return [cv.emit("where", [keep, x, zero], out=n.outputs[0])]
    k = cv.const_input(n, 1, "k")
    attrs = {"k": int(k.item()) if k is not None else 0, "upper": upper}
    return [cv.emit("trilu", [x], attrs, n.outputs[0])]


@converts("BitShift")
def _bitshift(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    """BitShift-28's semantics on every version (11 defines only unsigned types and leaves shifts of the
    width or more undefined): a right shift of a signed type is arithmetic; a shift that is negative or not
    smaller than the width gives the sign fill alone (-1 for a right shift of a negative X, else 0)."""
    x, y = n.inputs[:2]
    direction = n.attr("direction")
    if direction not in ("LEFT", "RIGHT"):
        raise cv.fail(f"direction must be LEFT or RIGHT, got {direction!r}")
    for v in (x, y):
        if v.type.dtype not in DTYPES or not v.type.dtype.startswith(("int", "uint")):
            raise cv.fail(f"BitShift is defined on integer tensors, got {v.name} of type {v.type.dtype}")
    if x.type.dtype != y.type.dtype:
        raise cv.fail(f"X and Y must have one type, got {x.type.dtype} and {y.type.dtype}")
    op = "left_shift" if direction == "LEFT" else "right_shift"
    return [cv.emit(op, [x, y], out=n.outputs[0])]


@converts("Expand")
def _expand(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    x = n.inputs[0]
    spec = cv.const_input(n, 1, "shape")
    try:
        shape = broadcast_shape(x.type.shape, [int(s) for s in spec])
    except ValueError as e:
        raise cv.fail(str(e)) from e
    if shape == x.type.shape:
        return [x]
    return [cv.emit("broadcast_to", [x], {"shape": shape}, n.outputs[0])]


@converts("Pad")
def _pad(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    x = n.inputs[0]
    ndim = len(x.type.shape)
    if n.older_than(11):  # Pad-2: pads and a float value as attributes
        pads, value, axes = n.attr("pads"), np.asarray(n.attr("value", 0.0), x.type.dtype), None
        if pads is None:
            raise cv.fail_version("needs pads")
    else:
        pads = cv.const_input(n, 1, "pads")
        fed = n.input(2)
        value = None if fed is not None and not fed.is_constant else cv.const_input(n, 2, "constant_value")
        axes = cv.const_input(n, 3, "axes")
    axes = list(range(ndim)) if axes is None else [onnx_axis(cv, int(a), ndim) for a in axes]
    if len(pads) != 2 * len(axes):
        raise cv.fail(f"{len(pads)} pads for {len(axes)} axes; Pad takes two per axis")
    mode = n.attr("mode", "constant")
    if mode not in ("constant", "reflect", "edge", "wrap") or (mode == "wrap" and n.older_than(19)):
        raise cv.fail_version(f"pad mode {mode!r} is not supported (constant, reflect, edge; Pad-19: wrap)")
    before, after = [0] * ndim, [0] * ndim
    for i, a in enumerate(axes):
        before[a], after[a] = int(pads[i]), int(pads[i + len(axes)])
    if not any(before) and not any(after):
        return [x]
    if mode == "wrap":
        return [onnx_indexing.wrap_pad(cv, x, before, after, n.outputs[0])]
    attrs = {
        "before": tuple(before),
        "after": tuple(after),
        "mode": mode,
        "value": 0 if value is None or value.size == 0 else value.item(),
    }
    fed = None if n.older_than(11) else n.input(2)
    if mode != "constant" or fed is None or fed.is_constant:
        return [cv.emit("pad", [x], attrs, n.outputs[0])]
    # a constant_value fed at run time: a kernel input, written where a constant mask says the padding is
    if fed.type.num_elements != 1 or fed.type.dtype != x.type.dtype:
        raise cv.fail(f"input 2 ({fed.name}) must be one value of the input's type, got {fed.type}")
    padded = cv.emit("pad", [x], attrs)
    inside = np.zeros(padded.type.shape, bool)
    inside[tuple(slice(max(b, 0), b + s) for b, s in zip(before, x.type.shape))] = True
    mask = cv.constant(inside, "inside")
    return [cv.emit("where", [mask, padded, _scalar(cv, fed)], out=n.outputs[0])]


_TRANSFORMATIONS = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


@converts("Resize", "Upsample")
def _resize(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    x = n.inputs[0]
    shape = x.type.shape
    mode = n.attr("mode", "nearest")
    legacy = n.op_type == "Upsample" or n.older_than(11)
    if mode not in ("nearest", "linear") and (legacy or mode != "cubic"):
        # cubic is Resize-11's (Upsample and Resize-10 define nearest and linear)
        raise cv.fail(f"mode {mode!r} is not supported (nearest, linear{'' if legacy else ', cubic'})")
    if legacy:
        return [_legacy_resize(cv, n, x, mode)]
    ctm = n.attr("coordinate_transformation_mode", "half_pixel")
    if mode == "cubic" or ctm == "tf_crop_and_resize" or n.attr("antialias", 0):
        # indices and weights that aotc's resize does not compute: per-axis tables (onnx_sampling)
        return [onnx_sampling.resize_by_taps(cv, n, x, mode, ctm)]
    if ctm not in _TRANSFORMATIONS or (ctm == "half_pixel_symmetric" and n.older_than(19)):
        # tf_half_pixel_for_nn (Resize-11 only); half_pixel_symmetric is Resize-19's
        raise cv.fail_version(f"coordinate_transformation_mode {ctm!r} is not supported")
    nearest_mode = n.attr("nearest_mode", "round_prefer_floor")
    if nearest_mode not in _NEAREST_MODES:
        raise cv.fail(f"nearest_mode {nearest_mode!r} is not one of {', '.join(_NEAREST_MODES)}")
    axes = [onnx_axis(cv, int(a), len(shape)) for a in n.attr("axes", range(len(shape)))]
    scales, sizes = cv.const_input(n, 2, "scales"), cv.const_input(n, 3, "sizes")
    size, scale = list(shape), [1.0] * len(shape)
    if sizes is not None and sizes.size:
        policy = n.attr("keep_aspect_ratio_policy", "stretch")
        ratios = [np.float32(s) / np.float32(shape[a]) for a, s in zip(axes, sizes)]
        if policy != "stretch":
            common = min(ratios) if policy == "not_larger" else max(ratios)
            ratios = [common] * len(axes)
            sizes = [round(float(common) * shape[a]) for a in axes]
        for a, s, r in zip(axes, sizes, ratios):
            size[a], scale[a] = int(s), float(r)
    elif scales is not None and scales.size:
        for a, s in zip(axes, scales.astype(np.float32)):
            length = s * np.float32(shape[a])  # ONNX's length_resized, which the output's extent floors
            size[a], scale[a] = int(np.floor(length)), float(s)
            if length != size[a] and (
                ctm == "align_corners" or (ctm == "pytorch_half_pixel" and size[a] == 1)
            ):
                # these modes read length_resized itself (pytorch_half_pixel: whether it is > 1), not the
                # extent, which aotc's resize takes: per-axis tables compute it (onnx_sampling)
                return [onnx_sampling.resize_by_taps(cv, n, x, mode, ctm)]
    else:
        raise cv.fail("needs scales or sizes")
    if tuple(size) == shape and all(s == 1.0 for s in scale):
        return [x]
    attrs = {
        "size": tuple(size),
        "scales": tuple(scale),
        "mode": mode,
        "coordinate_transformation_mode": ctm,
        "nearest_mode": nearest_mode,
    }
    return [cv.emit("resize", [x], attrs, n.outputs[0])]


def _legacy_resize(cv: OnnxConverter, n: OnnxNode, x: Value, mode: str) -> Value:
    """Upsample-7/9 and Resize-10: scales only (an attribute before Upsample-9, else input 1). These
    versions name no coordinate transformation; as onnxruntime runs them (and Resize-11 can say it), an
    output index i reads the input at i / scale (asymmetric), and nearest takes floor of that when
    upsampling and ceil when downsampling, the same on every axis that is resized here."""
    shape = x.type.shape
    given = (
        n.attr("scales") if n.op_type == "Upsample" and n.older_than(9) else cv.const_input(n, 1, "scales")
    )
    if given is None:
        raise cv.fail_version("needs scales")
    scales = np.asarray(given, np.float32).reshape(-1)
    if scales.size != len(shape) or not np.all(np.isfinite(scales)) or np.any(scales <= 0):
        raise cv.fail_version(f"scales {scales.tolist()} must be one positive number per axis of {x.type}")
    if n.op_type == "Upsample" and np.any(scales < 1):
        raise cv.fail_version(f"Upsample scales must be at least 1, got {scales.tolist()}")
    nearest_mode = "floor" if np.all(scales >= 1) else "ceil" if np.all(scales <= 1) else None
    if mode == "nearest" and nearest_mode is None:
        raise cv.fail_version(
            f"scales {scales.tolist()} enlarge some axes and shrink others, which round differently"
        )
    size = tuple(int(np.floor(s * np.float32(d))) for s, d in zip(scales, shape))
    if size == shape and np.all(scales == 1):
        return x
    attrs = {
        "size": size,
        "scales": tuple(float(s) for s in scales),
        "mode": mode,
        "coordinate_transformation_mode": "asymmetric",
        "nearest_mode": nearest_mode or "floor",
    }
    return cv.emit("resize", [x], attrs, n.outputs[0])


# --- ops that always fold to constants ----------------------------------------------------------------------


@converts("Shape")
def _shape(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    shape = n.inputs[0].type.shape
    start, end = n.attr("start", 0), n.attr("end", len(shape))
    return [cv.constant(np.array(shape[start:end], np.int64), "shape", out=n.outputs[0])]


@converts("Size")
def _size(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    return [cv.constant(np.array(n.inputs[0].type.num_elements, np.int64), "size", out=n.outputs[0])]


@converts("Constant")
def _constant(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    (key, value), *rest = n.attrs.items() if n.attrs else [(None, None)]
    if rest or key not in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        raise cv.fail(f"unsupported constant attributes {sorted(n.attrs)}")
    if key == "value":
        return [cv.constant(numpy_helper.to_array(value), "value", out=n.outputs[0])]
    dtype = "float32" if key.startswith("value_float") else "int64"
    return [cv.constant(value, "value", dtype, out=n.outputs[0])]


@converts("ConstantOfShape")
def _constant_of_shape(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    shape = cv.const_input(n, 0, "shape")
    value = n.attr("value")
    fill = numpy_helper.to_array(value).reshape(-1) if value is not None else np.zeros(1, np.float32)
    return [cv.constant(np.full([int(s) for s in shape], fill[0], fill.dtype), "value", out=n.outputs[0])]


@converts("Range")
def _range(cv: OnnxConverter, n: OnnxNode) -> list[Value]:
    start, limit, delta = (cv.const_input(n, i, what) for i, what in enumerate(("start", "limit", "delta")))
    dtype = start.dtype  # ml_dtypes' bfloat16 for a bfloat16 start (const_input reads its bits as such)
    count = max(math.ceil((limit.item() - start.item()) / delta.item()), 0)
    if str(start.dtype) in ("float16", "bfloat16"):  # Range-27's new types
        if n.attr("stash_type", 1) != onnx.TensorProto.FLOAT:
            raise cv.fail_version(f"stash_type={n.attr('stash_type')} is not supported (1: float32)")
        # stash_type 1 (the default): start and delta cast to float32, the values computed there
        start, delta = start.astype(np.float32), delta.astype(np.float32)
    values = (start + np.arange(count, dtype=start.dtype) * delta).astype(dtype)
    return [cv.constant(values, "range", out=n.outputs[0])]


# --- version semantics of operators converted in onnx_quant -------------------------------------------------


def _check_quantize_version(cv: OnnxConverter, n: OnnxNode) -> None:
    """QuantizeLinear/DequantizeLinear: what their versions add that onnx_quant's converters do not read."""
    scale = n.input(1)
    if n.older_than(13) and scale is not None and scale.type.num_elements != 1:
        # 10 quantizes per tensor only (13 added axis, which onnx_quant defaults to 1)
        raise cv.fail_version(f"scale {scale.name} must be a scalar, got {scale.type}")
    if n.op_type == "DequantizeLinear" and n.attr("output_dtype", 0) not in (0, onnx.TensorProto.FLOAT):
        # DequantizeLinear-23: the output type (else the scale's, float32 here)
        raise cv.fail_version(f"output_dtype={n.attr('output_dtype')} is not supported (float32)")
    if n.op_type == "QuantizeLinear" and n.attr("precision", 0) not in (0, onnx.TensorProto.FLOAT):
        # QuantizeLinear-23: the precision of x / scale (else the scale's, float32 here)
        raise cv.fail_version(f"precision={n.attr('precision')} is not supported (float32)")


_VERSION_CHECKS["QuantizeLinear"] = _VERSION_CHECKS["DequantizeLinear"] = _check_quantize_version


# Operator families converted in modules of their own. They build on this module's converter API, so they
# are imported once it is defined, and each registers its converters with `converts`. The quantized
# operators' versions are listed in VERSIONS above; every other family owns its VERSIONS, merged here.
from aotc.frontend import (  # noqa: E402, F401
    onnx_attention,
    onnx_indexing,
    onnx_lowp,
    onnx_math,
    onnx_misc,
    onnx_nn,
    onnx_quant,
    onnx_recurrent,
    onnx_sampling,
)

for _family in (
    onnx_attention,
    onnx_indexing,
    onnx_lowp,
    onnx_math,
    onnx_misc,
    onnx_nn,
    onnx_recurrent,
    onnx_sampling,
):
    VERSIONS.update(_family.VERSIONS)
