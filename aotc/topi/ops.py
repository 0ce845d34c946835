"""Registrations of the graph operators: pattern + tensor-expression compute for each.

Every compute takes the node's input tensors and attrs and returns one output op (single-output
operators only); attrs hold plain ints, floats, strings and tuples.
"""

from __future__ import annotations

from collections.abc import Callable

from aotc import te
from aotc.ir.expr import select
from aotc.te.tensor import Operation
from aotc.topi import elemwise, nn, transform, winograd
from aotc.topi.registry import OpPattern, register


def _register_unary(name: str, fn: Callable) -> None:
    @register(name, OpPattern.ELEMWISE)
    def compute(inputs, attrs):
        x = inputs[0]
        elemwise.check_operands(name, [x.dtype])
        return [te.compute(x.shape, lambda *i: fn(x[i], **attrs), name, tag="elemwise")]


def _register_broadcast(name: str, fn: Callable) -> None:
    @register(name, OpPattern.BROADCAST)
    def compute(inputs, attrs):
        elemwise.check_operands(name, [t.dtype for t in inputs])
        return [elemwise.map_inputs(inputs, fn, name)]


for _name, _fn in elemwise.UNARY.items():
    _register_unary(_name, _fn)
for _name, _fn in elemwise.BINARY.items():
    _register_broadcast(_name, _fn)
_register_broadcast("where", select)


def _with_bias(out: Operation, inputs, axis: int) -> list[Operation]:
    """`out` plus the optional bias input (inputs[2], one value per entry of `axis`)."""
    if len(inputs) < 3:
        return [out]
    return [nn.bias_add(out, inputs[2], axis=axis, name=f"{out.name}_bias")]


@register("conv2d", OpPattern.OUT_ELEMWISE_FUSABLE)
def _conv2d(inputs, attrs):
    """NCHW data, OIHW weight, optional bias [O]; attrs: strides, pads (t, l, b, r), dilations, groups."""
    data, weight = inputs[:2]
    groups = attrs.get("groups", 1)
    kw = dict(
        stride=attrs.get("strides", 1), padding=attrs.get("pads", 0), dilation=attrs.get("dilations", 1)
    )
    if groups == data.shape[1] and weight.shape[1] == 1 and groups > 1:
        return _with_bias(nn.depthwise_conv2d_nchw(data, weight, **kw), inputs, 1)
    return _with_bias(nn.conv2d_nchw(data, weight, groups=groups, **kw), inputs, 1)


@register("conv2d_winograd", OpPattern.OUT_ELEMWISE_FUSABLE)
def _conv2d_winograd(inputs, attrs):
    """NCHW data, Winograd-transformed weight [a, a, C, K], optional bias [K]; attrs: tile, pads."""
    out = winograd.conv2d_winograd(inputs[0], inputs[1], attrs["tile"], attrs.get("pads", (1, 1, 1, 1)))
    return _with_bias(out, inputs, 1)


@register("conv2d_winograd_nhwc", OpPattern.OUT_ELEMWISE_FUSABLE)
def _conv2d_winograd_nhwc(inputs, attrs):
    """conv2d_winograd on NHWC data."""
    pads = attrs.get("pads", (1, 1, 1, 1))
    out = winograd.conv2d_winograd(inputs[0], inputs[1], attrs["tile"], pads, "NHWC", "conv2d_winograd_nhwc")
    return _with_bias(out, inputs, 3)


@register("conv2d_transpose", OpPattern.OUT_ELEMWISE_FUSABLE)
def _conv2d_transpose(inputs, attrs):
    """NCHW data, weight [C, O / groups, KH, KW], optional bias [O];
    attrs: strides, pads, dilations, groups, output_padding."""
    out = nn.conv2d_transpose_nchw(
        inputs[0],
        inputs[1],
        stride=attrs.get("strides", 1),
        padding=attrs.get("pads", 0),
        dilation=attrs.get("dilations", 1),
        groups=attrs.get("groups", 1),
        output_padding=attrs.get("output_padding", 0),
    )
    return _with_bias(out, inputs, 1)


@register("matmul", OpPattern.OUT_ELEMWISE_FUSABLE)
def _matmul(inputs, attrs):
    """numpy.matmul semantics (batch broadcast, 1-D operands)."""
    return [nn.matmul(inputs[0], inputs[1])]


@register("dense", OpPattern.OUT_ELEMWISE_FUSABLE)
def _dense(inputs, attrs):
    """X [M, K], W [N, K], optional bias [N]."""
    return _with_bias(nn.dense(inputs[0], inputs[1]), inputs, 1)


def _register_pool(name: str, kind: str) -> None:
    @register(name, OpPattern.OUT_ELEMWISE_FUSABLE)
    def compute(inputs, attrs):
        """attrs: kernel, strides, pads (t, l, b, r), dilations, ceil_mode, count_include_pad (avg)."""
        return [
            nn.pool2d_nchw(
                inputs[0],
                kind,
                attrs["kernel"],
                stride=attrs.get("strides", 1),
                padding=attrs.get("pads", 0),
                count_include_pad=attrs.get("count_include_pad", False),
                dilation=attrs.get("dilations", 1),
                ceil_mode=attrs.get("ceil_mode", False),
                name=name,
            )
        ]


_register_pool("max_pool2d", "max")
_register_pool("avg_pool2d", "avg")


def _register_reduce(kind: str) -> None:
    @register(f"reduce_{kind}", OpPattern.COMM_REDUCE)
    def compute(inputs, attrs):
        """attrs: axes, keepdims."""
        return [nn.reduce(inputs[0], kind, attrs["axes"], attrs.get("keepdims", False), f"reduce_{kind}")]


for _kind in ("sum", "mean", "max", "min", "prod"):
    _register_reduce(_kind)


@register("softmax", OpPattern.COMM_REDUCE)
def _softmax(inputs, attrs):
    return [nn.softmax(inputs[0], attrs.get("axis", -1))]


@register("log_softmax", OpPattern.COMM_REDUCE)
def _log_softmax(inputs, attrs):
    return [nn.log_softmax(inputs[0], attrs.get("axis", -1))]


@register("layer_norm", OpPattern.COMM_REDUCE)
def _layer_norm(inputs, attrs):
    """x, scale, optional bias; attrs: axis, epsilon."""
    bias = inputs[2] if len(inputs) > 2 else None
    return [nn.layer_norm(inputs[0], inputs[1], bias, attrs.get("axis", -1), attrs.get("epsilon", 1e-5))]


@register("instance_norm", OpPattern.COMM_REDUCE)
def _instance_norm(inputs, attrs):
    """x, scale [C], bias [C]; attrs: epsilon."""
    return [nn.instance_norm(*inputs[:3], attrs.get("epsilon", 1e-5))]


@register("batch_norm", OpPattern.BROADCAST)
def _batch_norm(inputs, attrs):
    """x, scale, bias, mean, var (each [C], channel axis 1); attrs: epsilon."""
    return [nn.batch_norm(*inputs[:5], epsilon=attrs.get("epsilon", 1e-5))]


@register("reshape", OpPattern.INJECTIVE)
def _reshape(inputs, attrs):
    """attrs: shape (fully static)."""
    return [transform.reshape(inputs[0], attrs["shape"])]


@register("transpose", OpPattern.INJECTIVE)
def _transpose(inputs, attrs):
    return [transform.transpose(inputs[0], attrs["perm"])]


@register("concat", OpPattern.INJECTIVE)
def _concat(inputs, attrs):
    return [transform.concat(inputs, attrs["axis"])]


@register("strided_slice", OpPattern.INJECTIVE)
def _strided_slice(inputs, attrs):
    """attrs: begin, end, strides for every axis (numpy slice semantics)."""
    return [transform.strided_slice(inputs[0], attrs["begin"], attrs["end"], attrs["strides"])]


@register("take", OpPattern.INJECTIVE)
def _take(inputs, attrs):
    """data, int32/int64 indices; attrs: axis."""
    return [transform.take(inputs[0], inputs[1], attrs.get("axis", 0))]


@register("broadcast_to", OpPattern.BROADCAST)
def _broadcast_to(inputs, attrs):
    return [transform.broadcast_to(inputs[0], attrs["shape"])]


@register("pad", OpPattern.INJECTIVE)
def _pad(inputs, attrs):
    """attrs: before, after (per axis, negative crops), mode (constant/reflect/edge), value."""
    x = inputs[0]
    out = nn.pad(
        x, attrs["before"], attrs["after"], attrs.get("value", 0.0), mode=attrs.get("mode", "constant")
    )
    if out is x:
        out = te.compute(x.shape, lambda *i: x[i], "pad", tag="pad")
    return [out]


@register("window_columns", OpPattern.INJECTIVE)
def _window_columns(inputs, attrs):
    """attrs: taps, stride, out_width (nn.window_columns)."""
    return [nn.window_columns(inputs[0], int(attrs["taps"]), int(attrs["stride"]), int(attrs["out_width"]))]


@register("resize", OpPattern.INJECTIVE)
def _resize(inputs, attrs):
    """attrs: size, scales (per axis), mode, coordinate_transformation_mode, nearest_mode."""
    return [
        transform.resize(
            inputs[0],
            attrs["size"],
            attrs["scales"],
            attrs.get("mode", "nearest"),
            attrs.get("coordinate_transformation_mode", "half_pixel"),
            attrs.get("nearest_mode", "round_prefer_floor"),
        )
    ]


@register("gather_elements", OpPattern.INJECTIVE)
def _gather_elements(inputs, attrs):
    """data, int32/int64 indices of data's rank; attrs: axis."""
    return [transform.gather_elements(inputs[0], inputs[1], attrs.get("axis", 0))]


@register("trilu", OpPattern.INJECTIVE)
def _trilu(inputs, attrs):
    """attrs: k (the diagonal), upper."""
    return [transform.trilu(inputs[0], attrs.get("k", 0), attrs.get("upper", True))]


def _register_arg_reduce(kind: str) -> None:
    @register(f"arg{kind}", OpPattern.COMM_REDUCE)
    def compute(inputs, attrs):
        """attrs: axis, keepdims, select_last_index; an int64 result."""
        return [
            nn.arg_reduce(
                inputs[0],
                kind,
                attrs.get("axis", 0),
                attrs.get("keepdims", True),
                attrs.get("select_last_index", False),
                f"arg{kind}",
            )
        ]


for _kind in ("max", "min"):
    _register_arg_reduce(_kind)


@register("rms_norm", OpPattern.COMM_REDUCE)
def _rms_norm(inputs, attrs):
    """x, optional scale; attrs: axis, epsilon."""
    scale = inputs[1] if len(inputs) > 1 else None
    return [nn.rms_norm(inputs[0], scale, attrs.get("axis", -1), attrs.get("epsilon", 1e-5))]


def _cumulative(combiner: str) -> None:
    @register(f"cum{combiner}", OpPattern.COMM_REDUCE)
    def compute(inputs, attrs):
        """attrs: axis, exclusive, reverse."""
        flags = attrs.get("exclusive", False), attrs.get("reverse", False)
        return [nn.cumulative(inputs[0], attrs["axis"], combiner, *flags)]


for _combiner in nn.SCAN_COMBINERS:
    _cumulative(_combiner)


def _register_pool3d(name: str, kind: str) -> None:
    @register(name, OpPattern.OUT_ELEMWISE_FUSABLE)
    def compute(inputs, attrs):
        """NCDHW data; attrs: kernel, strides, pads (ONNX's: begins, then ends), dilations, ceil_mode,
        count_include_pad (avg)."""
        return [
            nn.pool_nd(
                inputs[0],
                kind,
                attrs["kernel"],
                attrs["strides"],
                attrs["pads"],
                attrs["dilations"],
                ceil_mode=attrs.get("ceil_mode", False),
                count_include_pad=attrs.get("count_include_pad", False),
                name=name,
            )
        ]


_register_pool3d("max_pool3d", "max")
_register_pool3d("avg_pool3d", "avg")


@register("conv3d", OpPattern.OUT_ELEMWISE_FUSABLE)
def _conv3d(inputs, attrs):
    """NCDHW data, weight [O, C / groups, KD, KH, KW], optional bias [O]; attrs: strides, pads (begins,
    then ends), dilations, groups."""
    data, weight = inputs[:2]
    out = nn.conv_nd(
        data, weight, attrs["strides"], attrs["pads"], attrs["dilations"], attrs.get("groups", 1), "conv3d"
    )
    return _with_bias(out, inputs, 1)


@register("conv3d_transpose", OpPattern.OUT_ELEMWISE_FUSABLE)
def _conv3d_transpose(inputs, attrs):
    """NCDHW data, weight [C, O / groups, KD, KH, KW], optional bias [O]; attrs: strides, pads, dilations,
    groups, output_padding."""
    out = nn.conv_transpose_nd(
        inputs[0],
        inputs[1],
        attrs["strides"],
        attrs["pads"],
        attrs["dilations"],
        attrs.get("groups", 1),
        attrs.get("output_padding"),
        "conv3d_transpose",
    )
    return _with_bias(out, inputs, 1)


@register("max_pool_indices", OpPattern.COMM_REDUCE)
def _max_pool_indices(inputs, attrs):
    """NC + spatial data and its max pooling; attrs: kernel, strides, pads (begins, then ends), dilations,
    storage_order. ONNX MaxPool's int64 Indices."""
    return [
        nn.max_pool_indices(
            inputs[0],
            inputs[1],
            attrs["kernel"],
            attrs["strides"],
            attrs["pads"],
            attrs["dilations"],
            attrs.get("storage_order", 0),
        )
    ]
