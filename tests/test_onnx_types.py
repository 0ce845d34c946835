"""Element types checked against each operator's schema before conversion (aotc.frontend.onnx_schema): a
node on types ONNX does not define it on (Neg on uint8, MatMul on int8), which onnxruntime rejects too, is a
clean refusal naming the node, the operator's version, the operand and the types allowed."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from aotc.frontend.errors import ConversionError
from aotc.frontend.onnx import load_onnx
from aotc.frontend.onnx_schema import declared_types, signature, tensor_type, type_problem
from aotc.onnx_backend import REFUSALS
from tests.onnx_util import Input, make_graph_model, random_feeds, run_onnxruntime, single_op_model


def refusal(model: onnx.ModelProto) -> str:
    """load_onnx's refusal of `model`: a ConversionError (one of REFUSALS), its message returned."""
    with pytest.raises(ConversionError) as e:
        load_onnx(model.SerializeToString())
    assert isinstance(e.value, REFUSALS)
    return str(e.value)


def rejected_by_onnxruntime(model: onnx.ModelProto) -> bool:
    try:
        run_onnxruntime(model, random_feeds(model))
    except Exception as e:  # onnxruntime's own error types
        return "Type Error" in str(e)
    return False


def test_neg_on_uint8_is_refused_naming_the_allowed_types():
    model = single_op_model("Neg", [Input((2, 3), "uint8")], opset=13)
    assert rejected_by_onnxruntime(model)
    message = refusal(model)
    assert "node neg_node (Neg)" in message
    assert "input 0 (X, value x0) is tensor(uint8)" in message
    assert "type constraint T of Neg-13 (opset 13) does not allow" in message
    assert "tensor(float), tensor(float16), tensor(int16), tensor(int32)" in message


def test_matmul_on_int8_is_refused():
    model = single_op_model("MatMul", [Input((2, 3), "int8"), Input((3, 4), "int8")], opset=13)
    assert rejected_by_onnxruntime(model)
    message = refusal(model)
    assert "node matmul_node (MatMul)" in message and "MatMul-13 (opset 13)" in message
    assert "input 0 (A, value x0) is tensor(int8)" in message and "tensor(uint64)" in message


def test_operands_of_one_constraint_must_share_a_type():
    model = single_op_model("Add", [Input((2, 3)), Input((2, 3), "int32")], opset=14)
    assert rejected_by_onnxruntime(model)
    message = refusal(model)
    assert "input 1 (B, value x1) is tensor(int32) but input 0 (A, value x0) is tensor(float)" in message
    assert "Add-14 (opset 14) takes one type for both (type constraint T)" in message


def test_a_fixed_type_input_and_an_initializer():
    """Reshape's shape is tensor(int64) itself (no constraint); an int32 initializer there is refused."""
    model = single_op_model("Reshape", [Input((2, 3)), np.asarray([3, 2], np.int32)], opset=14)
    message = refusal(model)
    assert "input 1 (shape, value c1) is tensor(int32), which Reshape-14 (opset 14) does not allow" in message
    assert "(it allows tensor(int64))" in message


def test_a_value_the_converter_typed():
    """The Neg reads Cast's output, typed by the converter, not declared anywhere."""
    nodes = [
        helper.make_node("Cast", ["x"], ["u"], name="cast", to=TensorProto.UINT16),
        helper.make_node("Neg", ["u"], ["y"], name="neg"),
    ]
    message = refusal(make_graph_model(nodes, {"x": Input((4,))}, ["y"], opset=19))
    assert "node neg (Neg)" in message and "input 0 (X, value u) is tensor(uint16)" in message


def test_a_declared_output_type_against_the_schema():
    """Shape's output is tensor(int64); a graph output declared float is refused, naming the output."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Shape", ["x"], ["y"], name="shape")], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    message = refusal(model)
    assert "output 0 (shape, value y) is tensor(float), which type constraint T1 of Shape-15" in message


def test_declared_outputs_follow_an_input_given_another_dtype():
    """input_shapes may make a float16 model's input float32: its outputs, declared float16, follow."""
    x, y = (helper.make_tensor_value_info(name, TensorProto.FLOAT16, [2, 3]) for name in "xy")
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    graph = load_onnx(model.SerializeToString(), {"x": ((2, 3), "float32")})
    assert graph.outputs[0].type.dtype == "float32"


def test_in_a_subgraph():
    """An If branch's nodes are checked as the main graph's are."""
    branch = [helper.make_node("Neg", ["x"], ["b"], name="neg")]
    out = helper.make_empty_tensor_value_info("b")
    then, other = (helper.make_graph(branch, name, [], [out]) for name in ("then", "else"))
    node = helper.make_node("If", ["c"], ["y"], name="if", then_branch=then, else_branch=other)
    model = make_graph_model([node], {"x": Input((3,), "uint8")}, ["y"], {"c": np.asarray(True)}, opset=17)
    message = refusal(model)
    assert "(Neg)" in message and "is tensor(uint8)" in message and "Neg-13 (opset 17)" in message


def test_valid_types_still_load():
    for model in (
        single_op_model("Neg", [Input((2, 3), "int8")], opset=13),
        single_op_model("Concat", [Input((2,), "int64"), np.asarray([1, 2], np.int64)], axis=0),
        single_op_model("Where", [Input((2,), "bool"), Input((2,), "int32"), Input((2,), "int32")]),
    ):
        load_onnx(model.SerializeToString())


def test_variadics_homogeneous_and_heterogeneous():
    """Concat's inputs share T; Loop's carried values (a heterogeneous variadic) each have their own."""
    concat = helper.make_node("Concat", ["a", "b", "c"], ["y"], axis=0)
    types = {"a": "tensor(float)", "b": "tensor(float)", "c": "tensor(int32)"}
    problem = type_problem(concat, 13, types, {})
    assert problem.startswith("input 2 (inputs, value c) is tensor(int32) but input 0 (inputs, value a)")
    loop = helper.make_node("Loop", ["m", "", "f", "i"], ["f2", "i2"])
    types = {"m": "tensor(int64)", "f": "tensor(float)", "i": "tensor(int32)"}
    assert type_problem(loop, 17, types, {"f2": "tensor(float)", "i2": "tensor(int32)"}) is None
    assert "input 0 (M, value m) is tensor(int32)" in type_problem(
        loop, 17, {**types, "m": "tensor(int32)"}, {}
    )


def test_domains_onnx_has_no_schemas_of_are_skipped():
    node = helper.make_node("QLinearAdd", ["a"], ["y"], domain="com.microsoft")
    assert signature("QLinearAdd", "com.microsoft", 1) is None
    assert type_problem(node, 1, {"a": "tensor(float)"}, {}) is None
    assert type_problem(helper.make_node("Neg", ["a"], ["y"]), None, {"a": "tensor(uint8)"}, {}) is None


def test_signatures_are_cached():
    signature.cache_clear()
    for _ in range(3):
        signature("Relu", "", 14)
    info = signature.cache_info()
    assert (info.misses, info.hits) == (1, 2)


def test_element_type_strings():
    assert tensor_type("float32") == "tensor(float)" and tensor_type("float64") == "tensor(double)"
    assert tensor_type("bool") == "tensor(bool)" and tensor_type("bfloat16") == "tensor(bfloat16)"
    assert tensor_type("float8_e4m3fn") == "tensor(float8e4m3fn)"
    assert tensor_type("float4_e2m1fn") == "tensor(float4e2m1)"
    assert tensor_type("no such type") is None
    y = helper.make_tensor_value_info("y", TensorProto.INT4, [2])
    graph = helper.make_graph([], "g", [], [y, helper.make_empty_tensor_value_info("z")])
    assert declared_types(graph) == {"y": "tensor(int4)"}
