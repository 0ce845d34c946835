"""Scans along an axis: the cumulative product (ONNX CumProd; the cumulative sum is nn.cumsum)."""

from __future__ import annotations

from aotc import te
from aotc.ir.expr import const, select
from aotc.te.tensor import Operation
from aotc.topi.registry import OpPattern, register


def cumprod(x: Operation, axis: int, exclusive: bool = False, reverse: bool = False) -> Operation:
    """ONNX CumProd along `axis`: out[.., i, ..] = the product of x[.., k, ..] over k <= i (k < i when
    `exclusive`; k >= i, k > i when `reverse`), one product reduction over the whole axis with the other
    factors 1 (as nn.cumsum does with 0)."""
    if x.dtype == "bool":
        raise te.TEError("cumprod is not defined on bool tensors")
    if not x.ndim:
        raise te.TEError("cumprod needs an input of rank 1 or more, got a 0-d tensor")
    axis %= x.ndim
    k = te.reduce_axis(x.shape[axis], "k")
    one = const(1, x.dtype)

    def body(*i):
        at, here = k.var, i[axis]
        if reverse:
            keep = at > here if exclusive else at >= here
        else:
            keep = at < here if exclusive else at <= here
        return te.prod(select(keep, x[(*i[:axis], at, *i[axis + 1 :])], one), k)

    return te.compute(x.shape, body, "cumprod", tag="cumprod")


@register("cumprod", OpPattern.COMM_REDUCE)
def _cumprod(inputs, attrs):
    """attrs: axis, exclusive, reverse."""
    return [cumprod(inputs[0], attrs["axis"], attrs.get("exclusive", False), attrs.get("reverse", False))]
