"""Fusion into subgraphs: which nodes share a kernel (the numerics of fused models are checked against
onnxruntime in test_build and test_models)."""

from __future__ import annotations

import numpy as np
from onnx import helper

from aotc.frontend.onnx import load_onnx
from aotc.graph.partition import partition
from aotc.graph.passes import optimize
from tests.onnx_util import Input, make_graph_model


def _ffn(extra_nodes=(), outputs=("y",)):
    """x @ w1 + b1 -> GELU (x * 0.5 * (1 + erf(x / sqrt 2)), which reads t twice) -> @ w2."""
    rng = np.random.default_rng(0)
    consts = {
        "w1": rng.standard_normal((8, 16)).astype(np.float32),
        "b1": rng.standard_normal(16).astype(np.float32),
        "w2": rng.standard_normal((16, 8)).astype(np.float32),
        "half": np.array(0.5, np.float32),
        "sqrt2": np.array(np.sqrt(2.0), np.float32),
        "one": np.array(1.0, np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["t"]),
        helper.make_node("Mul", ["t", "half"], ["a"]),
        helper.make_node("Div", ["t", "sqrt2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["f"]),
        helper.make_node("Mul", ["a", "f"], ["g"]),
        helper.make_node("MatMul", ["g", "w2"], ["y"]),
        *extra_nodes,
    ]
    model = make_graph_model(nodes, {"x": Input((4, 8))}, list(outputs), consts)
    return [[n.op for n in g.nodes] for g in partition(optimize(load_onnx(model.SerializeToString())))]


def test_gelu_fuses_into_the_matmul_whose_output_it_reads_twice():
    first, second = _ffn()
    assert first[:2] == ["matmul", "add"] and "erf" in first
    assert second == ["matmul"]


def test_gelu_stays_out_when_its_input_is_read_elsewhere():
    """t is also a model output: it must be written, so the GELU group does not become internal to the
    first matmul's kernel and fuses into the next matmul as before."""
    groups = _ffn(outputs=("y", "t"))
    assert ["matmul", "add"] in groups
    assert any(g[-1] == "matmul" and "erf" in g for g in groups)


def test_gelu_stays_out_when_another_kernel_reads_its_input():
    groups = _ffn([helper.make_node("Add", ["t", "t"], ["u"])], outputs=("y", "u"))
    assert not any(g[0] == "matmul" and "erf" in g and g[-1] != "matmul" for g in groups)
