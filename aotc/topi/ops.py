"""Registrations of the graph operators: pattern + tensor-expression compute for each."""

from __future__ import annotations

from aotc.topi import nn
from aotc.topi.registry import OpPattern, register


@register("conv2d", OpPattern.OUT_ELEMWISE_FUSABLE)
def _conv2d(inputs, attrs):
    """NCHW data, OIHW weight; attrs: strides, pads (t, l, b, r), dilations, groups."""
    data, weight = inputs[:2]
    groups = attrs.get("groups", 1)
    kw = dict(
        stride=attrs.get("strides", 1), padding=attrs.get("pads", 0), dilation=attrs.get("dilations", 1)
    )
    if groups == data.shape[1] and weight.shape[1] == 1 and groups > 1:
        return [nn.depthwise_conv2d_nchw(data, weight, **kw)]
    return [nn.conv2d_nchw(data, weight, groups=groups, **kw)]


@register("matmul", OpPattern.OUT_ELEMWISE_FUSABLE)
def _matmul(inputs, attrs):
    return [nn.matmul(inputs[0], inputs[1])]


@register("relu", OpPattern.ELEMWISE)
def _relu(inputs, attrs):
    return [nn.relu(inputs[0])]
