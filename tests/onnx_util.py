"""Build tiny ONNX models with onnx.helper and compare aotc's import of them with onnxruntime."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from aotc.frontend.onnx import load_onnx
from aotc.graph.interpret import run_graph

RTOL, ATOL = 1e-4, 1e-5
IR_VERSION = 10


@dataclass(frozen=True)
class Input:
    """A runtime graph input; random values are drawn uniformly from [low, high)."""

    shape: tuple[int | str, ...]
    dtype: str = "float32"
    low: float = -2.0
    high: float = 2.0


Operand = Input | np.ndarray | None
"""A node operand: a runtime input, a constant (initializer), or None for an omitted optional input."""


def tensor_type(dtype: str) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def make_graph_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: dict[str, Input],
    outputs: Sequence[str],
    initializers: dict[str, np.ndarray] | None = None,
    opset: int = 17,
) -> onnx.ModelProto:
    graph = helper.make_graph(
        list(nodes),
        "test",
        [helper.make_tensor_value_info(k, tensor_type(v.dtype), list(v.shape)) for k, v in inputs.items()],
        [helper.make_empty_tensor_value_info(o) for o in outputs],
        [numpy_helper.from_array(np.asarray(a), k) for k, a in (initializers or {}).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION)
    return model


def single_op_model(
    op_type: str, operands: Sequence[Operand], outputs: int = 1, opset: int = 17, **attrs
) -> onnx.ModelProto:
    """A model of one `op_type` node; operand i is named x{i} (runtime) or c{i} (constant)."""
    names, inputs, inits = [], {}, {}
    for i, op in enumerate(operands):
        if op is None:
            names.append("")
        elif isinstance(op, Input):
            names.append(f"x{i}")
            inputs[f"x{i}"] = op
        else:
            names.append(f"c{i}")
            inits[f"c{i}"] = op
    outs = [f"y{i}" for i in range(outputs)]
    node = helper.make_node(op_type, names, outs, name=f"{op_type.lower()}_node", **attrs)
    return make_graph_model([node], inputs, outs, inits, opset)


def random_feeds(model: onnx.ModelProto, specs: dict[str, Input] | None = None, seed: int = 0) -> dict:
    """Seeded random values for the model's runtime inputs (shapes from `specs` where dynamic)."""
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        spec = (specs or {}).get(vi.name)
        dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        shape = spec.shape if spec else tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
        low, high = (spec.low, spec.high) if spec else (-2.0, 2.0)
        feeds[vi.name] = random_array(rng, shape, dtype, low, high)
    return feeds


def weight_ints(rng: np.random.Generator, dtype: str, shape) -> np.ndarray:
    """8-bit weights that onnxruntime multiplies exactly on every x86 class: int8 in [-64, 64), uint8 in
    [0, 128). On CPUs without VNNI (Zen 3, AVX2) its kernel multiplies an unsigned by a signed byte and adds
    pairs of products in int16 with saturation, so full-range weights make its own result wrong there (its
    quantizer's `reduce_range` is the same cure); a pair stays below 2**15 when the unsigned byte is below 128
    or the signed one within 64. Full-range weights are checked against numpy (tests/test_dot_products.py)."""
    low = -64 if dtype == "int8" else 0
    return rng.integers(low, low + 128, shape).astype(dtype)


def random_array(rng: np.random.Generator, shape, dtype, low: float = -2.0, high: float = 2.0) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        return rng.integers(int(low), int(high), shape).astype(dtype)
    return rng.uniform(low, high, shape).astype(dtype)


def run_onnxruntime(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    import onnxruntime

    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def reference_outputs(model: onnx.ModelProto, feeds: dict, evaluator: bool = False) -> list[np.ndarray]:
    """onnxruntime's outputs, or ONNX's reference evaluator's (where `evaluator`, or where onnxruntime cannot
    load the model)."""
    if not evaluator:
        try:
            return run_onnxruntime(model, feeds)
        except Exception:  # onnxruntime raises its own types for an opset or type it has no kernel for
            pass
    return ReferenceEvaluator(model).run(None, feeds)


def assert_outputs_match(
    got: dict,
    model: onnx.ModelProto,
    expected: Sequence[np.ndarray],
    tol: dict[str, tuple[float, float]] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """`got` (by output name) equals `expected` (in the model's output order) in shape and dtype; integer
    and bool values exactly, floats within (rtol, atol): `tol`'s entry for the dtype name, else (RTOL,
    ATOL), with an explicit `rtol` or `atol` overriding either."""
    for out, ref in zip(model.graph.output, expected):
        value = np.asarray(got[out.name])
        assert value.shape == ref.shape and value.dtype == ref.dtype, (out.name, value.dtype, value.shape)
        if ref.dtype.kind in "biu":
            np.testing.assert_array_equal(value, ref, err_msg=out.name)
        else:
            dtype_rtol, dtype_atol = (tol or {}).get(str(ref.dtype), (RTOL, ATOL))
            np.testing.assert_allclose(
                value,
                ref,
                rtol=dtype_rtol if rtol is None else rtol,
                atol=dtype_atol if atol is None else atol,
                err_msg=out.name,
            )


def op_model(op_type: str, operands: Sequence[Operand], outputs: int = 1, opset: int = 17, **attrs):
    """A `single_op_model` and seeded random feeds for its runtime inputs."""
    model = single_op_model(op_type, operands, outputs, opset, **attrs)
    specs = {f"x{i}": op for i, op in enumerate(operands) if isinstance(op, Input)}
    return model, random_feeds(model, specs)


def case(op_type, operands, *, id, **kw):
    """A pytest.param of (op_type, operands, kw); `kw` holds opset, outputs and the like and the node's
    attributes."""
    return pytest.param(op_type, operands, kw, id=id)


def check_model(
    model: onnx.ModelProto,
    feeds: dict | None = None,
    rtol: float = RTOL,
    atol: float = ATOL,
    input_shapes: dict | None = None,
    seed: int = 0,
):
    """Run `model` with onnxruntime and with load_onnx + run_graph; outputs must match in shape, dtype and
    value. Returns the Graph."""
    feeds = random_feeds(model, seed=seed) if feeds is None else feeds
    expected = run_onnxruntime(model, feeds)
    graph = load_onnx(model.SerializeToString(), input_shapes)
    got = run_graph(graph, feeds)
    for out, ref in zip(model.graph.output, expected):
        value = np.asarray(got[out.name])
        assert value.shape == ref.shape, f"{out.name}: shape {value.shape} != onnxruntime's {ref.shape}"
        assert value.dtype == ref.dtype, f"{out.name}: dtype {value.dtype} != onnxruntime's {ref.dtype}"
        np.testing.assert_allclose(value, ref, rtol=rtol, atol=atol, err_msg=out.name)
    return graph


def check_op(
    op_type: str, operands: Sequence[Operand], outputs: int = 1, opset: int = 17, tol=(RTOL, ATOL), **attrs
):
    """Build a single-op model, run it both ways on seeded random inputs, compare; returns the Graph."""
    model = single_op_model(op_type, operands, outputs, opset, **attrs)
    specs = {f"x{i}": op for i, op in enumerate(operands) if isinstance(op, Input)}
    return check_model(model, random_feeds(model, specs), rtol=tol[0], atol=tol[1])


def built_package(
    model: onnx.ModelProto, folder: Path, name: str = "m", target: str | None = None, **options
) -> Path:
    """`model` saved as `folder/<name>.onnx` and built by aotc.compile, unvalidated, into
    `folder/<name>.aotc` (for `target`, else the host); its path. `options` go to aotc.compile."""
    import aotc

    path = folder / f"{name}.onnx"
    path.write_bytes(model.SerializeToString())
    targets = () if target is None else (target,)
    package = aotc.compile(
        str(path), *targets, validate=False, output=folder / f"{name}.aotc", log=lambda _: None, **options
    )
    return package.path
