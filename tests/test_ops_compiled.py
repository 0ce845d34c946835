"""Every ONNX operator case of the frontend tests, compiled: aotc build -> aotc_runtime vs onnxruntime."""

import aotc_runtime
import numpy as np
import pytest

from aotc.build import build
from aotc.recipe import load_recipe

from .onnx_util import ATOL, RTOL, Input, random_feeds, run_onnxruntime, single_op_model
from .test_frontend_onnx import BROADCAST, CONV, ELEMENTWISE, LAYOUT, MATMUL, POOL_NORM_REDUCE, RESIZE

CASES = ELEMENTWISE + BROADCAST + CONV + MATMUL + POOL_NORM_REDUCE + LAYOUT + RESIZE


@pytest.mark.parametrize("op_type, operands, kw", CASES)
def test_compiled_operator_matches_onnxruntime(op_type, operands, kw, tmp_path):
    kw = dict(kw)
    rtol, atol = kw.pop("tol", (RTOL, ATOL))
    outputs = kw.pop("outputs", 1)
    opset = kw.pop("opset", 17)
    model = single_op_model(op_type, operands, outputs, opset, **kw)
    specs = {f"x{i}": op for i, op in enumerate(operands) if isinstance(op, Input)}
    feeds = random_feeds(model, specs)
    expected = run_onnxruntime(model, feeds)
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    shapes = "".join(f"  {k}: {{shape: {list(v.shape)}}}\n" for k, v in feeds.items())
    recipe = tmp_path / "m.yaml"
    recipe.write_text(
        "model: m.onnx\noutput: m.aotc\nvalidate: false\n" + (f"inputs:\n{shapes}" if shapes else "")
    )
    result = build(load_recipe(recipe), log=lambda _: None)
    got = aotc_runtime.load(str(result.package)).run(feeds)
    for out, ref in zip(model.graph.output, expected):
        value = got[out.name]
        assert value.shape == ref.shape and value.dtype == ref.dtype, out.name
        np.testing.assert_allclose(value, ref, rtol=rtol, atol=atol, err_msg=f"{op_type} {out.name}")
