"""Every registered graph operator compiles with the default schedule and matches the numpy reference."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from aotc.codegen.module import build_module, load_library
from aotc.graph.interpret import node_compute
from aotc.graph.ir import Node, TensorType
from aotc.schedule.lower import lower
from aotc.schedule.state import State
from aotc.target import host_target
from aotc.te.dag import ComputeDAG
from aotc.te.reference import evaluate
from aotc.topi.elemwise import BINARY, INTEGER_ONLY, UNARY
from aotc.topi.lowp import FORMATS
from aotc.topi.registry import registered_ops


def t(*shape: int, dtype: str = "float32") -> TensorType:
    return TensorType(shape, dtype)


X = t(2, 3, 6, 5)
WINDOW = {"strides": (2, 1), "pads": (1, 0, 1, 2), "dilations": (1, 2)}
X3 = t(1, 3, 4, 6, 5)
WINDOW3 = {"strides": (1, 2, 1), "pads": (1, 0, 1, 0, 1, 2), "dilations": (2, 1, 2)}
UNARY_ATTRS = {
    "leaky_relu": {"alpha": 0.1},
    "elu": {"alpha": 0.5},
    "clip": {"min": -0.5, "max": 0.5},
    "hard_sigmoid": {"alpha": 0.3, "beta": 0.4},
    "gelu": {"approximate": "tanh"},
    "cast": {"dtype": "int32"},
}
BOOL_OPS = {"logical_not", "logical_and", "logical_or"}

SAMPLES: dict[str, list[tuple[list[TensorType], dict]]] = {
    **{
        op: [([t(3, 7, dtype="bool" if op in BOOL_OPS else "float32")], UNARY_ATTRS.get(op, {}))]
        for op in UNARY
    },
    **{
        op: [
            (
                [
                    t(3, 1, 5, dtype="bool" if op in BOOL_OPS else "float32"),
                    t(4, 1, dtype="bool" if op in BOOL_OPS else "float32"),
                ],
                {},
            )
        ]
        for op in BINARY
        if op not in INTEGER_ONLY
    },
    **{
        op: [
            ([t(3, 1, 5, dtype="int8"), t(4, 1, dtype="int8")], {}),
            ([t(3, 4, dtype="uint32"), t(4, dtype="uint32")], {}),
        ]
        for op in INTEGER_ONLY - {"bitwise_not"}
    },
    "bitwise_not": [([t(3, 7, dtype="int16")], {}), ([t(3, 7, dtype="uint64")], {})],
    "divide": [([t(3, 4), t(4)], {}), ([t(3, 4, dtype="int32"), t(4, dtype="int32")], {})],
    **{
        op: [([t(3, 4), t(4)], {}), ([t(3, 4, dtype="int32"), t(4, dtype="int32")], {})]
        for op in ("mod", "fmod")
    },
    "where": [([t(3, 1, dtype="bool"), t(3, 4), t(4)], {})],
    "conv2d": [
        ([X, t(4, 3, 3, 3), t(4)], WINDOW),
        ([t(1, 4, 6, 6), t(6, 2, 3, 3)], {**WINDOW, "groups": 2}),
        ([t(1, 4, 6, 6), t(4, 1, 3, 3), t(4)], {"pads": (1, 1, 1, 1), "groups": 4}),
    ],
    "conv2d_winograd": [
        ([t(1, 3, 9, 7), t(4, 4, 3, 5), t(5)], {"tile": 2, "pads": (1, 1, 1, 1)}),
        ([t(2, 2, 6, 6), t(4, 4, 2, 3)], {"tile": 2, "pads": (0, 1, 1, 0)}),
    ],
    "conv2d_transpose": [
        ([t(1, 4, 4, 5), t(4, 3, 3, 3), t(6)], {**WINDOW, "groups": 2, "output_padding": (1, 0)})
    ],
    "matmul": [([t(3, 5), t(5, 4)], {}), ([t(2, 1, 3, 5), t(4, 5, 2)], {}), ([t(5), t(2, 5, 3)], {})],
    "dense": [([t(3, 5), t(4, 5), t(4)], {}), ([t(3, 5), t(4, 5)], {})],
    "max_pool2d": [([X], {"kernel": (3, 3), **WINDOW, "ceil_mode": True})],
    "avg_pool2d": [
        ([X], {"kernel": (3, 2), **WINDOW, "count_include_pad": False, "ceil_mode": True}),
        ([X], {"kernel": (2, 2), "strides": (2, 2), "count_include_pad": True}),
    ],
    "max_pool3d": [([X3], {"kernel": (2, 3, 3), **WINDOW3, "ceil_mode": True})],
    "max_pool_indices": [
        ([t(2, 3, 6, 5, dtype="int32"), t(2, 3, 3, 3, dtype="int32")], {"kernel": (3, 3), **WINDOW}),
        ([X3, t(1, 3, 3, 3, 4)], {"kernel": (2, 3, 3), **WINDOW3, "storage_order": 1}),
    ],
    "avg_pool3d": [
        ([X3], {"kernel": (3, 2, 2), **WINDOW3, "count_include_pad": False, "ceil_mode": True}),
        ([X3], {"kernel": (2, 2, 2), "strides": (2, 2, 2), "pads": (0,) * 6, "dilations": (1, 1, 1)}),
    ],
    "conv3d": [
        ([X3, t(4, 3, 2, 3, 3), t(4)], WINDOW3),
        ([t(1, 4, 3, 4, 4), t(6, 2, 2, 2, 3)], {**WINDOW3, "groups": 2}),
    ],
    "conv3d_transpose": [
        ([t(1, 4, 3, 4, 3), t(4, 3, 2, 3, 3), t(6)], {**WINDOW3, "groups": 2, "output_padding": (1, 0, 1)})
    ],
    **{
        f"reduce_{k}": [([X], {"axes": (1, 3), "keepdims": False}), ([t(4, 5)], {"axes": (0, 1)})]
        for k in ("sum", "mean", "max", "min", "prod")
    },
    "softmax": [([t(3, 7)], {"axis": 1})],
    "log_softmax": [([X], {"axis": 1})],
    "layer_norm": [([t(2, 3, 8), t(8), t(8)], {"axis": 2, "epsilon": 1e-5})],
    "instance_norm": [([X, t(3), t(3)], {"epsilon": 1e-5})],
    "batch_norm": [([X, t(3), t(3), t(3), t(3)], {"epsilon": 1e-5})],
    "reshape": [([X], {"shape": (6, 1, 30)}), ([X], {"shape": (3, 2, 10, 3)})],
    "transpose": [([X], {"perm": (0, 2, 3, 1)})],
    "concat": [([t(2, 3), t(2, 1), t(2, 4)], {"axis": 1})],
    "strided_slice": [([X], {"begin": (1, 2, 0, 4), "end": (2, -1, 6, 0), "strides": (1, -1, 2, -3)})],
    "take": [([X, t(2, 2, dtype="int64")], {"axis": 2}), ([t(10, 4), t(3, dtype="int32")], {"axis": 0})],
    "broadcast_to": [([t(3, 1)], {"shape": (2, 3, 4)})],
    "gather_elements": [
        ([t(3, 4), t(2, 4, dtype="int64")], {"axis": 0}),
        ([X, t(2, 3, 6, 2, dtype="int32")], {"axis": -1}),
    ],
    "trilu": [([t(2, 4, 5)], {"k": 1, "upper": False}), ([t(4, 3, dtype="int32")], {"k": -1, "upper": True})],
    **{
        op: [
            ([X], {"axis": 1, "keepdims": False}),
            ([t(4, 6, dtype="int32")], {"axis": 1, "keepdims": True, "select_last_index": True}),
        ]
        for op in ("argmax", "argmin")
    },
    "cumsum": [
        ([X], {"axis": 2}),
        ([t(4, 6, dtype="int32")], {"axis": 0, "exclusive": True, "reverse": True}),
    ],
    "cumprod": [
        ([X], {"axis": 3}),
        ([t(4, 6, dtype="int32")], {"axis": 0, "exclusive": True, "reverse": True}),
    ],
    "rms_norm": [([t(2, 3, 8), t(8)], {"axis": 2, "epsilon": 1e-5}), ([t(2, 3, 4)], {"axis": 0})],
    "pad": [
        ([X], {"before": (0, 0, 2, 1), "after": (0, 1, 1, 3), "mode": "constant", "value": 0.5}),
        ([X], {"before": (0, 0, 2, 1), "after": (0, 0, 1, 3), "mode": "reflect"}),
        ([X], {"before": (0, 0, 2, -1), "after": (0, 0, -1, 3), "mode": "edge"}),
    ],
    "window_columns": [
        ([t(1, 4, 9, 3)], {"taps": 4, "stride": 2, "out_width": 3}),
        ([t(2, 3, 7, 1, dtype="int32")], {"taps": 4, "stride": 1, "out_width": 4}),
    ],
    "resize": [
        ([X], {"size": (2, 3, 12, 7), "scales": (1.0, 1.0, 2.0, 1.4), "mode": "nearest"}),
        ([X], {"size": (2, 3, 3, 9), "scales": (1.0, 1.0, 0.5, 1.8), "mode": "linear"}),
    ],
    # index inputs hold -3..3 (see _inputs): the axes they index have extent 4 or more, so all are valid
    "topk_indices": [
        ([t(3, 6)], {"k": 3, "axis": 1, "largest": True}),
        ([t(5, 4, dtype="int32")], {"k": 2, "axis": 0, "largest": False}),
    ],
    "scatter_elements": [
        ([t(5, 4), t(3, 4, dtype="int64"), t(3, 4)], {"axis": 0, "reduction": "none"}),
        (
            [t(3, 6, dtype="int32"), t(2, 4, dtype="int32"), t(2, 4, dtype="int32")],
            {"axis": 1, "reduction": "add"},
        ),
        ([t(4, 5), t(3, 5, dtype="int64"), t(3, 5)], {"axis": 0, "reduction": "mul"}),
        ([t(2, 4), t(2, 3, dtype="int64"), t(2, 3)], {"axis": -1, "reduction": "max"}),
    ],
    "scatter_nd": [
        ([t(4, 5, 3), t(2, 3, 1, dtype="int64"), t(2, 3, 5, 3)], {"reduction": "none"}),
        ([t(4, 4, dtype="int32"), t(3, 2, dtype="int64"), t(3, dtype="int32")], {"reduction": "add"}),
        ([t(4, 5), t(2, 1, dtype="int64"), t(2, 5)], {"reduction": "mul"}),
        ([t(4, 5), t(1, 2, dtype="int64"), t(1)], {"reduction": "min"}),
    ],
    "gather_nd": [
        ([t(4, 5, 3), t(2, 2, dtype="int64")], {"batch_dims": 0}),
        ([t(2, 4, 5), t(2, 3, 1, dtype="int64")], {"batch_dims": 1}),
    ],
    "reverse_sequence": [
        ([t(5, 3, 2), t(3, dtype="int64")], {"batch_axis": 1, "time_axis": 0}),
        ([t(3, 6, dtype="int32"), t(3, dtype="int64")], {"batch_axis": 0, "time_axis": 1}),
    ],
    "einsum": [
        ([t(3, 4), t(4, 5)], {"terms": ("ij", "jk"), "output": "ik"}),
        ([t(2, 3, 4), t(2, 4, 5), t(5)], {"terms": ("0ij", "0jk", "k"), "output": "0i"}),
        ([t(4, 4)], {"terms": ("ii",), "output": ""}),
        ([t(3, 4, dtype="int32")], {"terms": ("ij",), "output": "ji"}),
    ],
    "col2im": [
        (
            [t(1, 8, 12)],
            {"image": (5, 4), "block": (2, 2), "dilations": (1, 1), "pads": (0,) * 4, "strides": (1, 1)},
        ),
        (
            [t(2, 6, 15)],
            {"image": (6, 5), "block": (2, 3), "dilations": (2, 1), "pads": (1, 0, 1, 2), "strides": (2, 1)},
        ),
        ([t(1, 6, 3)], {"image": (7,), "block": (3,), "dilations": (1,), "pads": (1, 0), "strides": (2,)}),
    ],
    # MaxPool's indices are flat over [N, C, *spatial]: -3..3 address plane (0, 0) or nothing
    "max_unpool": [
        ([t(1, 2, 3, 3), t(1, 2, 3, 3, dtype="int64")], {"shape": (1, 2, 6, 6)}),
        ([t(1, 1, 4), t(1, 1, 4, dtype="int64")], {"shape": (1, 1, 5)}),
    ],
    "tensor_scatter": [
        ([t(2, 6, 3), t(2, 2, 3), t(2, dtype="int64")], {"axis": 1, "circular": True}),
        ([t(2, 3, 5), t(2, 3, 2), t(2, dtype="int64")], {"axis": 2, "circular": False}),
        ([t(2, 4, 3, dtype="int32"), t(2, 3, 3, dtype="int32")], {"axis": 1, "circular": False}),
    ],
    # uint8 and uint16 inputs hold every bit pattern (see _inputs): NaNs, infinities, subnormals, sign bits
    "lowp_decode": [([t(8, 32, dtype=f.storage)], {"format": name}) for name, f in FORMATS.items()],
    "lowp_encode": [
        ([t(3, 7)], {"format": "bfloat16", "saturate": False, "round_mode": "up"}),
        ([t(3, 7)], {"format": "float8_e4m3fn", "saturate": True, "round_mode": "up"}),
        ([t(3, 7)], {"format": "float8_e5m2", "saturate": False, "round_mode": "up"}),
        ([t(3, 7, dtype="int32")], {"format": "float8_e4m3fnuz", "saturate": True, "round_mode": "up"}),
        ([t(3, 7, dtype="int32")], {"format": "float8_e5m2fnuz", "saturate": False, "round_mode": "up"}),
        ([t(3, 7)], {"format": "float4_e2m1fn", "saturate": False, "round_mode": "up"}),
        ([t(3, 7)], {"format": "float8_e8m0fnu", "saturate": True, "round_mode": "nearest"}),
        ([t(3, 7)], {"format": "float8_e8m0fnu", "saturate": False, "round_mode": "down"}),
        ([t(3, 7, dtype="int32")], {"format": "int4"}),
        ([t(3, 7)], {"format": "uint2", "saturate": False, "round_mode": "up"}),
    ],
    "bitcast": [
        ([t(3, 7)], {"dtype": "int32"}),
        ([t(3, 7, dtype="int64")], {"dtype": "float64"}),
        ([t(3, 7, dtype="uint8")], {"dtype": "int8"}),
        ([t(3, 7, dtype="uint16")], {"dtype": "float16"}),
    ],
    # the tap tables of Resize: int32 index [out, taps], weight [out, taps], outside [out]
    "resize_axis": [
        ([t(2, 3, 5, 4), t(7, 2, dtype="int32"), t(7, 2)], {"axis": 2, "weighted": True}),
        ([t(2, 3, 5, 4, dtype="int32"), t(6, 1, dtype="int32")], {"axis": 3, "weighted": False}),
        (
            [t(2, 5, 4), t(3, 4, dtype="int32"), t(3, 4), t(3, dtype="bool")],
            {"axis": 1, "weighted": True, "extrapolation_value": 0.5},
        ),
    ],
    # grid values lie in [0.1, 2): inside and outside the normalized [-1, 1]
    "grid_sample": [
        ([t(1, 2, 4, 5), t(1, 3, 2, 2)], {"mode": "linear", "padding_mode": "zeros", "align_corners": False}),
        (
            [t(1, 2, 4, 5, dtype="int32"), t(1, 3, 3, 2)],
            {"mode": "nearest", "padding_mode": "border", "align_corners": True},
        ),
        (
            [t(2, 1, 4, 4), t(2, 2, 3, 2)],
            {"mode": "cubic", "padding_mode": "reflection", "align_corners": False},
        ),
        ([t(1, 2, 5), t(1, 4, 1)], {"mode": "linear", "padding_mode": "reflection", "align_corners": True}),
        (
            [t(1, 1, 3, 4, 4), t(1, 2, 2, 2, 3)],
            {"mode": "linear", "padding_mode": "border", "align_corners": False},
        ),
    ],
    "affine_grid": [([t(2, 2, 3), t(4, 5, 3)], {}), ([t(1, 3, 4), t(2, 3, 4, 4)], {})],
    "roi_align": [
        (
            [t(2, 3, 6, 5), t(3, 4), t(3, dtype="int64")],
            {
                "output_size": (2, 3),
                "sampling": (2, 2),
                "spatial_scale": 2.0,
                "half_pixel": True,
                "mode": "avg",
            },
        ),
        (
            [t(2, 3, 6, 5), t(2, 4), t(2, dtype="int32")],
            {
                "output_size": (3, 2),
                "sampling": (1, 2),
                "spatial_scale": 1.0,
                "half_pixel": False,
                "mode": "max",
            },
        ),
    ],
    "deform_conv2d": [
        (
            [t(1, 4, 5, 5), t(6, 2, 3, 3), t(1, 36, 5, 5), t(6), t(1, 18, 5, 5)],
            {
                "strides": (1, 1),
                "pads": (1, 1),
                "dilations": (1, 1),
                "group": 2,
                "offset_group": 2,
                "has_bias": True,
                "has_mask": True,
            },
        ),
        (
            [t(1, 2, 5, 6), t(3, 2, 2, 2), t(1, 8, 2, 6)],
            {"strides": (2, 1), "pads": (0, 1), "dilations": (1, 2), "has_bias": False, "has_mask": False},
        ),
    ],
}


ATOL = {"conv2d_winograd": 1e-5}
"""Absolute tolerances other than 1e-6: Winograd's transforms round at the scale of the sums (about 50), so
an output that cancels to near 0 is off by an ulp of that."""


def _inputs(types: list[TensorType], rng: np.random.Generator) -> list[np.ndarray]:
    out = []
    for ty in types:
        if ty.dtype == "bool":
            out.append(rng.random(ty.shape) < 0.5)
        elif ty.dtype in ("uint8", "uint16"):
            out.append(rng.integers(0, np.iinfo(ty.dtype).max + 1, ty.shape).astype(ty.dtype))
        elif ty.dtype.startswith("int"):
            out.append(rng.choice([-3, -2, -1, 1, 2, 3], ty.shape).astype(ty.dtype))
        else:
            out.append(rng.uniform(0.1, 2.0, ty.shape).astype(ty.dtype))
    return out


def test_every_registered_op_has_a_sample():
    assert sorted(SAMPLES) == [
        op for op in registered_ops() if not op.startswith("qnn.") and not op.endswith("_nhwc")
    ]


def test_every_op_compiles_and_matches_the_reference(tmp_path):
    cases = []
    for op, samples in sorted(SAMPLES.items()):
        for i, (types, attrs) in enumerate(samples):
            placeholders, outs = node_compute(Node(op, [], [], attrs), types)
            dag = ComputeDAG(outs)
            # inputs seeded by the sample alone: a sample added elsewhere changes no other one's inputs
            rng = np.random.default_rng([zlib.crc32(op.encode()), i])
            args = dict(zip((p.name for p in placeholders), _inputs(types, rng)))
            cases.append((f"{op}_{i}", dag, args))
    funcs = [lower(State.initial(dag), name) for name, dag, _ in cases]
    library = load_library(build_module(funcs, host_target(), str(tmp_path / "ops.so")))
    for name, dag, args in cases:
        feed = {p.name: args[p.name] for p in dag.placeholders}
        (ref,) = evaluate(dag, feed)
        out = np.zeros(ref.shape, ref.dtype)
        library.kernel(name)(*feed.values(), out)
        atol = ATOL.get(name.rpartition("_")[0], 1e-6)
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=atol, err_msg=name)


@pytest.mark.parametrize("op", ["reshape", "transpose", "strided_slice", "take", "concat"])
def test_injective_ops_have_no_reductions(op):
    for types, attrs in SAMPLES[op]:
        _, (out,) = node_compute(Node(op, [], [], attrs), types)
        assert not ComputeDAG([out]).compute_ops[-1].reduce_axes


@pytest.mark.parametrize(
    "op, dtypes, message",
    [
        ("negative", ["bool"], "negative is not defined on bool operands"),
        ("relu", ["bool"], "relu is not defined on bool operands"),
        ("add", ["bool", "bool"], "add is not defined on bool operands"),
        ("maximum", ["bool", "bool"], "maximum is not defined on bool operands"),
        ("prelu", ["bool", "bool"], "prelu is not defined on bool operands"),
        ("logical_not", ["int8"], "logical_not needs bool operands, got int8"),
        ("logical_and", ["float32", "bool"], "logical_and needs bool operands"),
        ("where", ["int32", "float32", "float32"], "where needs a bool condition, got int32"),
        ("reduce_sum", ["bool"], "reduce_sum is not defined on bool tensors"),
        ("reduce_max", ["bool"], "reduce_max is not defined on bool tensors"),
        ("softmax", ["float32"], "softmax needs an input of rank 1 or more"),
        ("log_softmax", ["float32"], "log_softmax needs an input of rank 1 or more"),
    ],
)
def test_operands_an_op_is_not_defined_on_are_refused_when_the_graph_is_built(op, dtypes, message):
    """A ValueError (TEError) at type inference, which the frontends turn into a refusal naming the node:
    not a CodegenError of the kernel later (found by tests/test_onnx_fuzz.py)."""
    shape = () if "softmax" in op else (2, 3)
    attrs = {"axes": (0,), "keepdims": False} if op.startswith("reduce") else {}
    with pytest.raises(ValueError, match=message):
        node_compute(Node(op, [], [], attrs), [t(*shape, dtype=d) for d in dtypes])


@pytest.mark.parametrize("op", ["identity", "cast", "equal", "less", "greater_equal", "where"])
def test_bool_operands_stay_allowed_where_they_mean_something(op):
    dtypes = {"cast": ["bool"], "identity": ["bool"], "where": ["bool", "bool", "bool"]}.get(
        op, ["bool", "bool"]
    )
    attrs = {"dtype": "float32"} if op == "cast" else {}
    node_compute(Node(op, [], [], attrs), [t(2, 3, dtype=d) for d in dtypes])
