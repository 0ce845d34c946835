"""Graph-level rewrites before partitioning: identities, dead code, batch-norm folding, quantized
zero points folded into biases, per-channel requantization tables as constants, Winograd convolutions with their weights transformed at build time."""

from __future__ import annotations

import numpy as np

from aotc.graph.ir import Derivation, Graph, Node, TensorType, Value
from aotc.graph.layout import TO_NCHW, TO_NHWC, to_nhwc
from aotc.ir.dot import IntegerWinogradRule
from aotc.te.tensor import NARROW_WEIGHTS
from aotc.topi import winograd
from aotc.topi.nn import as_pads, as_pair
from aotc.topi.quantized import NARROW_BOUND, mac_zero_point, requantize_tables

IDENTITY_OPS = frozenset({"identity"})


# A Winograd conv streams (m + 2)^2 / 9 times the weight bytes of the direct conv (4x for F(4, 3)), once
# per call: past this many transformed bytes (ResNet's 512-channel stage: 37.7 MB) the weight traffic
# costs more than the multiplications saved.
WINOGRAD_MAX_WEIGHT_BYTES = 16 << 20
WINOGRAD_MIN_CHANNELS = 16
# conv op -> (its Winograd op, the permutation of its weight to OIHW, the data's channel axis)
_WINOGRAD_OPS = {
    "conv2d": ("conv2d_winograd", (0, 1, 2, 3), 1),
    "conv2d_nhwc": ("conv2d_winograd_nhwc", TO_NCHW, 3),  # OHWI weights
}


def optimize(
    graph: Graph,
    winograd: bool = True,
    nhwc: bool = True,
    dot_products: bool = True,
    same_sign_dots: bool = False,
    narrow_dots: bool = False,
    integer_winograd: IntegerWinogradRule | None = None,
) -> Graph:
    """The graph passes of a build. `dot_products`: the target has dot-product instructions
    (aotc.ir.dot.dot_forms), so quantized convs are padded to the depth they sum. `same_sign_dots`: they
    read factors of one signedness only (aotc.ir.dot.same_sign_only: AArch64 sdot/udot), so the input
    zero point fold keeps an input's factor of the weight's signedness. `narrow_dots`: one of them is exact
    only on weights within +-64 (AVX2's vpmaddubsw; aotc.ir.dot.has_narrow_forms), so the layers whose
    constant weights lie within that are marked (`mark_narrow_weights`). No pass after the marking may
    change a quantized layer's weight values: the mark vouches for them. `integer_winograd`: int8 3x3
    convs run as integer Winograd where its rule says (aotc.ir.dot.integer_winograd_rule), and
    `winograd`."""
    graph = remove_identities(graph)
    graph = fold_batch_norm(graph)
    if nhwc:
        graph = to_nhwc(eliminate_dead_code(graph))
    if dot_products:
        graph = window_columns_as_channels(graph)
        graph = pad_conv_channels(graph)
        graph = pad_depthwise_taps(graph)
    graph = fold_input_zero_point(graph, same_sign=same_sign_dots)
    if narrow_dots:
        graph = mark_narrow_weights(graph)
    graph = constant_requantize_tables(graph)
    if winograd:
        graph = winograd_convolutions(graph)
        if integer_winograd is not None:
            graph = integer_winograd_convolutions(graph, integer_winograd)
    graph = dense_to_matmul(graph)
    graph = eliminate_dead_code(graph)
    return materialize_outputs(graph)


def winograd_convolutions(graph: Graph, tile: int = 4) -> Graph:
    """Float 3x3 stride-1 convs with constant weights become Winograd F(tile, 3) convs, their weights
    transformed once here, where it pays: enough channels, and transformed weights small enough."""
    for node in graph.nodes:
        if not _winograd_fits(node, tile):
            continue
        weight = node.inputs[1]
        op, to_oihw, _ = _WINOGRAD_OPS[node.op]
        source = np.ascontiguousarray(weight.data.transpose(to_oihw))
        u = winograd.transform_weight(source, tile)
        transformed = Value(
            f"{weight.name}_winograd{tile}",
            TensorType(u.shape, weight.type.dtype),
            data=u,
            derivation=Derivation("winograd", source, tile),
        )
        node.op = op
        node.inputs = [node.inputs[0], transformed, *node.inputs[2:]]
        node.attrs = {"tile": tile, "pads": tuple(int(p) for p in node.attrs.get("pads", (0, 0, 0, 0)))}
    return graph


def integer_winograd_convolutions(graph: Graph, rule: IntegerWinogradRule) -> Graph:
    """Quantized 3x3 stride-1 convs with constant int8 weights (zero point 0) become integer Winograd
    convs (qnn.conv2d_winograd_nhwc) on int16 weights transformed here, where `rule` has them: F(4, 3)
    where their sums provably stay within its exact range, else F(2, 3) where they do within its wider
    one (aotc.topi.winograd)."""
    for node in graph.nodes:
        tile = _integer_winograd_tile(node, rule)
        if tile is None:
            continue
        weight = node.inputs[1]
        source = np.ascontiguousarray(weight.data.transpose(TO_NCHW))
        u = winograd.transform_weight(source, tile)
        transformed = Value(
            f"{weight.name}_winograd{tile}",
            TensorType(u.shape, "int16"),
            data=u,
            derivation=Derivation("winograd", source, tile),
        )
        node.op = "qnn.conv2d_winograd_nhwc"
        node.inputs = [node.inputs[0], transformed, *node.inputs[2:]]
        attrs = {k: v for k, v in node.attrs.items() if k not in ("strides", "dilations", NARROW_WEIGHTS)}
        node.attrs = attrs | {"tile": tile}
    return graph


# |x - m| for an 8-bit x and a `mac_zero_point` m (0 or +-128): a centered input's largest magnitude
_CENTERED_MAX = 255


def _integer_winograd_tile(node: Node, rule: IntegerWinogradRule) -> int | None:
    """The largest integer Winograd tile of `rule` for a quantized 3x3 stride-1 ungrouped conv (OHWI int8
    weights, zero point 0) with enough channels: one whose transformed weights are small enough, whose
    exact range holds every sum these weights can make (255 * max over output channels of sum |w|) and
    that cuts each output image into `rule.min_tiles` tiles or more; None if no tile does or the conv is
    not one."""
    if node.op != "qnn.conv2d_nhwc" or len(node.inputs) < 2 or not node.inputs[1].is_constant:
        return None
    x, weight = node.inputs[:2]
    if weight.type.dtype != "int8" or x.type.dtype not in ("int8", "uint8") or len(x.type.shape) != 4:
        return None
    k, kh, kw, c = weight.type.shape
    attrs = node.attrs
    ones = all(int(v) == 1 for key in ("strides", "dilations") for v in _as_tuple(attrs.get(key, 1)))
    if (
        (kh, kw) != (winograd.KERNEL,) * 2
        or not ones
        or c != x.type.shape[3]
        or any(_weight_zero_points(node))
    ):
        return None
    if min(c, k) < WINOGRAD_MIN_CHANNELS:
        return None
    largest_sum = _CENTERED_MAX * int(np.abs(weight.data.astype(np.int64)).reshape(k, -1).sum(axis=1).max())
    _, h, w, _ = node.outputs[0].type.shape
    for tile in rule.tiles:
        a = tile + winograd.KERNEL - 1
        tiles = -(-h // tile) * -(-w // tile)
        if (
            a * a * c * k * 2 <= WINOGRAD_MAX_WEIGHT_BYTES
            and largest_sum < winograd.integer_sum_limit(tile)
            and tiles >= rule.min_tiles
        ):
            return tile
    return None


def _winograd_fits(node: Node, tile: int) -> bool:
    """A float 3x3 stride-1 ungrouped conv2d (OIHW) or conv2d_nhwc (OHWI) worth the transform."""
    if node.op not in _WINOGRAD_OPS or len(node.inputs) < 2 or not node.inputs[1].is_constant:
        return False
    x, weight = node.inputs[:2]
    if x.type.dtype != "float32" or weight.type.dtype != "float32" or len(x.type.shape) != 4:
        return False
    _, to_oihw, channel_axis = _WINOGRAD_OPS[node.op]
    k, c, kh, kw = (weight.type.shape[a] for a in to_oihw)
    channels = x.type.shape[channel_axis]
    attrs = node.attrs
    ones = all(int(v) == 1 for key in ("strides", "dilations") for v in _as_tuple(attrs.get(key, 1)))
    if (kh, kw) != (winograd.KERNEL,) * 2 or not ones or int(attrs.get("groups", 1)) != 1:
        return False
    if len(_as_tuple(attrs.get("pads", 0))) != 4 or c != channels:
        return False
    a = tile + winograd.KERNEL - 1
    return min(c, k) >= WINOGRAD_MIN_CHANNELS and a * a * c * k * 4 <= WINOGRAD_MAX_WEIGHT_BYTES


def _as_tuple(v) -> tuple:
    return tuple(v) if isinstance(v, (tuple, list)) else (v,)


def dense_to_matmul(graph: Graph) -> Graph:
    """dense(x, W[N, K]) with a constant W becomes matmul(x, W^T), transposed once at build time.

    The kernel then reads the weight contiguously along the output axis it vectorizes.
    """
    nodes: list[Node] = []
    for node in graph.nodes:
        weight = node.inputs[1] if node.op == "dense" else None
        if weight is None or not weight.is_constant or len(weight.type.shape) != 2:
            nodes.append(node)
            continue
        wt = np.ascontiguousarray(weight.data.T)
        node.op = "matmul"
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        node.inputs = [
            node.inputs[0],
            Value(f"{weight.name}_t", TensorType(wt.shape, weight.type.dtype), data=wt),
        ]
        nodes.append(node)
        if bias is not None:
            out = node.outputs[0]
            mm = Value(f"{out.name}_matmul", out.type, producer=node)
            node.outputs = [mm]
            add = Node("add", [mm, bias], [out], name=f"{node.name}_bias")
            out.producer = add
            nodes.append(add)
    graph.nodes = nodes
    return graph


# The output-channel axis of each quantized weight layout (its other axes are summed).
_WEIGHT_CHANNEL_AXIS = {
    "qnn.conv2d_nhwc": 0,  # OHWI
    "qnn.depthwise_conv2d_nhwc": 3,  # 1HW(C*M)
    "qnn.dense": 0,  # [N, K]
}


def _weight_zero_points(node: Node) -> tuple[int, ...]:
    zps = node.attrs.get("weight_zero_points", (0,))
    return tuple(int(z) for z in (zps if isinstance(zps, (tuple, list)) else (zps,)))


def fold_input_zero_point(graph: Graph, same_sign: bool = False) -> Graph:
    """sum((x - zx) * w) = sum((x - m) * w) - (zx - m) * sum(w): with a constant weight whose zero point is
    0, the second term joins the int32 bias at build time. m is `mac_zero_point`: 0, so the kernel's
    multiply-accumulate skips one subtraction per product, or -128 for int8 convs (depthwise too) and
    dense layers, whose factor x + 128 is then a uint8 (what a dot-product instruction reads). Padding still
    reads zx, which the folded term cancels exactly. `same_sign`: m gives x the weight's signedness (0, or
    +-128 where the dtypes differ; sdot/udot read int8 x int8 or uint8 x uint8) and is recorded in the
    node's `mac_zero_point`."""
    for node in graph.nodes:
        axis = _WEIGHT_CHANNEL_AXIS.get(node.op)
        if axis is None or node.attrs.get("input_zero_point_in_bias") or len(node.inputs) < 2:
            continue
        weight = node.inputs[1]
        m = mac_zero_point(node.op, node.inputs[0].type.dtype, weight.type.dtype if same_sign else None)
        shift = int(node.attrs.get("input_zero_point", 0)) - m
        if shift == 0 or not weight.is_constant or any(_weight_zero_points(node)):
            continue
        channels = weight.type.shape[axis]
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        if bias is not None and (not bias.is_constant or bias.type.num_elements != channels):
            continue
        b0 = (
            bias.data.astype(np.int64).reshape(channels) if bias is not None else np.zeros(channels, np.int64)
        )
        folded = b0 - shift * weight.data.astype(np.int64).sum(
            axis=tuple(a for a in range(weight.data.ndim) if a != axis)
        )
        if folded.min() < np.iinfo(np.int32).min or folded.max() > np.iinfo(np.int32).max:
            continue
        name = f"{node.name or node.outputs[0].name}_bias_zp"
        node.inputs = [
            *node.inputs[:2],
            Value(name, TensorType((channels,), "int32"), data=folded.astype(np.int32)),
        ]
        # only a same-sign build records m: every other build's attrs (and workload keys) stay as they were
        node.attrs = {**node.attrs, "input_zero_point_in_bias": True}
        if same_sign:
            node.attrs["mac_zero_point"] = m
    return graph


def mark_narrow_weights(graph: Graph) -> Graph:
    """A quantized conv or dense layer whose constant int8 weight (zero point 0) lies within +-NARROW_BOUND
    gets NARROW_WEIGHTS: its products may then run on AVX2's vpmaddubsw, whose int16 pair sums cannot
    saturate (255 * 128 < 2**15). onnxruntime's `reduce_range` models (7-bit weights, its advice for x86
    without VNNI) are; full-range weights are not, and keep vpmaddwd. Only targets with such a form get
    the attr, so no other target's workload keys change (on those, a marked layer's key differs from its
    key before this mark existed: its earlier records no longer apply)."""
    for node in graph.nodes:
        if node.op not in _WEIGHT_CHANNEL_AXIS or len(node.inputs) < 2 or any(_weight_zero_points(node)):
            continue
        weight = node.inputs[1]
        if (
            weight.is_constant
            and weight.type.dtype == "int8"
            and np.all(np.abs(weight.data.astype(np.int16)) <= NARROW_BOUND)
        ):
            node.attrs = {**node.attrs, NARROW_WEIGHTS: True}
    return graph


DOT_DEPTH = 4  # input channels a dot-product instruction sums per lane (vpdpbusd; docs/int8.md)


def pad_conv_channels(graph: Graph) -> Graph:
    """A quantized conv whose input channels do not divide by DOT_DEPTH (an RGB stem: 3) gets zero weights
    for the missing channels and an input padded to match (with its zero point; any value would do, the
    weights there are 0), so it runs on dot-product instructions: the pad fuses into the conv's kernel.
    An input that an NCHW -> NHWC transpose makes is padded before it, where a channel is a plane."""
    nodes = []
    for node in graph.nodes:
        nodes.append(node)
        if node.op != "qnn.conv2d_nhwc" or len(node.inputs) < 2 or not node.inputs[1].is_constant:
            continue
        x, weight = node.inputs[:2]
        channels = x.type.shape[-1]
        if (
            weight.type.shape[3] != channels
            or channels % DOT_DEPTH == 0
            or x.type.dtype not in ("int8", "uint8")
        ):
            continue
        extra = -channels % DOT_DEPTH
        name = node.name or node.outputs[0].name
        zero_point = float(node.attrs.get("input_zero_point", 0))
        padded, added = _padded_nhwc(x, 3, 0, extra, zero_point, name, "channel", f"{name}_channels")
        w = np.pad(weight.data, ((0, 0),) * (weight.data.ndim - 1) + ((0, extra),))
        node.inputs = [
            padded,
            Value(f"{weight.name}_channels", TensorType(w.shape, weight.type.dtype), data=w),
            *node.inputs[2:],
        ]
        nodes[len(nodes) - 1 : len(nodes) - 1] = added
    graph.nodes = nodes
    return graph


def window_columns_as_channels(graph: Graph) -> Graph:
    """A quantized conv with few input channels (ResNet's 7x7 stride-2 RGB stem) whose window columns and
    channels together need fewer dot-product steps than its channels padded to DOT_DEPTH (7 x 3 = 21 values
    a window row: 24, 6 steps, against 7 x 4 = 28, 7) reads each window row as one run of channels: its
    input, padded along the width (with the input zero point; the NCHW planes where an NCHW -> NHWC
    transpose makes it), feeds a `window_columns` node that gathers each output column's window row, and
    the conv becomes a (KH x 1) conv over those; the taps beyond KW, which read real pixels, weigh the
    weights' zero point."""
    nodes = []
    for node in graph.nodes:
        taps = _window_column_taps(node)
        if taps is not None:
            x, weight = node.inputs[:2]
            top, left, bottom, _ = as_pads(node.attrs.get("pads", 0))
            stride_h, stride_w = as_pair(node.attrs.get("strides", 1))
            out_width = node.outputs[0].type.shape[2]
            right = max(0, stride_w * (out_width - 1) + taps - x.type.shape[2] - left)
            name = node.name or node.outputs[0].name
            zero_point = float(node.attrs.get("input_zero_point", 0))
            padded, added = _padded_nhwc(x, 2, left, right, zero_point, name, "width", f"{name}_rows")
            attrs = {"taps": taps, "stride": stride_w, "out_width": out_width}
            gather = Node("window_columns", [padded], [], attrs, name=f"{name}_window_columns")
            n, height, _, channels = padded.type.shape
            shape = (n, height, out_width, taps * channels)
            gather.outputs = [Value(f"{name}_columns", TensorType(shape, x.type.dtype), producer=gather)]
            # the extra taps read real pixels: they weigh the weights' zero point, so they add nothing
            w, w_zp = weight.data, _weight_zero_points(node)[0]
            w = np.pad(w, ((0, 0), (0, 0), (0, taps - w.shape[2]), (0, 0)), constant_values=w_zp)
            w = w.reshape(*w.shape[:2], 1, -1)
            node.inputs = [
                gather.outputs[0],
                Value(f"{weight.name}_columns", TensorType(w.shape, weight.type.dtype), data=w),
                *node.inputs[2:],
            ]
            dilation_h = as_pair(node.attrs.get("dilations", 1))[0]
            strides, pads, dilations = (stride_h, 1), (top, 0, bottom, 0), (dilation_h, 1)
            node.attrs = {**node.attrs, "strides": strides, "pads": pads, "dilations": dilations}
            nodes += [*added, gather]
        nodes.append(node)
    graph.nodes = nodes
    return graph


def _window_column_taps(node: Node) -> int | None:
    """The window width KWp that `window_columns_as_channels` gives `node`, or None where it does not pay."""
    if node.op != "qnn.conv2d_nhwc" or len(node.inputs) < 2 or not node.inputs[1].is_constant:
        return None
    x, weight = node.inputs[:2]
    if x.type.dtype not in ("int8", "uint8") or len(x.type.shape) != 4 or node.attrs.get("groups", 1) != 1:
        return None
    if len(set(_weight_zero_points(node))) != 1:  # the extra taps need one zero point to weigh
        return None
    channels, kw = x.type.shape[3], weight.type.shape[2]
    stride_w = as_pair(node.attrs.get("strides", 1))[1]
    if (
        channels % DOT_DEPTH == 0
        or weight.type.shape[3] != channels
        or as_pair(node.attrs.get("dilations", 1))[1] != 1
    ):
        return None
    taps = -(-kw // stride_w) * stride_w
    while (taps * channels) % DOT_DEPTH:
        taps += stride_w
    padded_channels = channels + -channels % DOT_DEPTH
    return taps if taps * channels < kw * padded_channels else None


def _padded_nhwc(
    x: Value, axis: int, before: int, after: int, value: float, prefix: str, what: str, out: str
) -> tuple[Value, list[Node]]:
    """NHWC `x` padded along `axis` with `value` (named `out`; the pad node `{prefix}_{what}_pad`), and the
    nodes added. Where an NCHW -> NHWC transpose makes `x`, the NCHW planes are padded and transposed
    again: one vectorized pass each, not a pass over pixels of a few channels."""
    source = x.producer
    if source is not None and source.op == "transpose" and tuple(source.attrs["perm"]) == TO_NHWC:
        planes = _pad(
            source.inputs[0], TO_NHWC[axis], before, after, value, f"{prefix}_{what}_pad", f"{prefix}_planes"
        )
        padded = _transposed(planes, TO_NHWC, out)
        return padded, [planes.producer, padded.producer]
    padded = _pad(x, axis, before, after, value, f"{prefix}_{what}_pad", out)
    return padded, [padded.producer]


def _pad(x: Value, axis: int, before: int, after: int, value: float, name: str, out: str) -> Value:
    """`x` with `before` and `after` entries of `value` around `axis` (named `out`), made by a new pad node."""
    ndim = len(x.type.shape)
    attrs = {
        "before": tuple(before if a == axis else 0 for a in range(ndim)),
        "after": tuple(after if a == axis else 0 for a in range(ndim)),
        "value": value,
    }
    pad = Node("pad", [x], [], attrs, name=name)
    shape = tuple(n + b + e for n, b, e in zip(x.type.shape, attrs["before"], attrs["after"]))
    pad.outputs = [Value(out, TensorType(shape, x.type.dtype), producer=pad)]
    return pad.outputs[0]


def _transposed(x: Value, perm: tuple[int, ...], name: str) -> Value:
    """`x` transposed by `perm`, made by a new transpose node."""
    node = Node("transpose", [x], [], {"perm": perm}, name=f"{name}_transpose")
    shape = tuple(x.type.shape[p] for p in perm)
    node.outputs = [Value(name, TensorType(shape, x.type.dtype), producer=node)]
    return node.outputs[0]


def pad_depthwise_taps(graph: Graph) -> Graph:
    """A quantized depthwise conv (multiplier 1) whose window rows are not a multiple of DOT_DEPTH taps
    (3x3) gets weights of zero (their zero point) for the missing taps and as many more columns of padding
    on the right (the output keeps its size; what the new taps read is multiplied by 0). A window row is
    then the dot product of each channel's lane: three vpdpbusd for a 3x3 window where the widening code
    multiplies nine times (MobileNetV2's depthwise convs on znver4: 1.4-2.1x faster)."""
    for node in graph.nodes:
        if node.op != "qnn.depthwise_conv2d_nhwc" or len(node.inputs) < 2 or not node.inputs[1].is_constant:
            continue
        x, weight = node.inputs[:2]
        taps = weight.type.shape[2]
        quantized = x.type.dtype in ("int8", "uint8")
        if taps % DOT_DEPTH == 0 or node.attrs.get("depth_multiplier", 1) != 1 or not quantized:
            continue
        extra = -taps % DOT_DEPTH
        top, left, bottom, right = as_pads(node.attrs.get("pads", 0))
        dilation = as_pair(node.attrs.get("dilations", 1))[1]
        w_zp = _weight_zero_points(node)[0]  # one for all channels (the qnn ops take no other)
        w = np.pad(weight.data, ((0, 0), (0, 0), (0, extra), (0, 0)), constant_values=w_zp)
        node.inputs = [
            x,
            Value(f"{weight.name}_taps", TensorType(w.shape, weight.type.dtype), data=w),
            *node.inputs[2:],
        ]
        node.attrs = {**node.attrs, "pads": (top, left, bottom, right + extra * dilation)}
    return graph


def constant_requantize_tables(graph: Graph) -> Graph:
    """Per-channel requantization constants of quantized convs and dense layers become constant inputs
    (`requantize_tables`): computed here once, where the kernel would otherwise rebuild them as select
    trees on every call. A layer without a bias gets a zero one, so the tables are inputs 3 onward."""
    for node in graph.nodes:
        if node.op not in _WEIGHT_CHANNEL_AXIS or node.attrs.get("requantize_tables") or len(node.inputs) < 2:
            continue
        if node.attrs.get("out_dtype") == "int32" or len(node.outputs) != 1:
            continue
        channels = node.outputs[0].type.shape[-1]
        tables = requantize_tables(node.op, node.attrs, channels, node.inputs[0].type.dtype)
        if not tables:
            continue
        name = node.name or node.outputs[0].name
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        if bias is None:
            bias = Value(f"{name}_bias", TensorType((channels,), "int32"), data=np.zeros(channels, np.int32))
        node.inputs = [
            *node.inputs[:2],
            bias,
            *(
                Value(f"{name}_requant{i}", TensorType(t.shape, str(t.dtype)), data=t)
                for i, t in enumerate(tables)
            ),
        ]
        node.attrs = {**node.attrs, "requantize_tables": True}
    return graph


def materialize_outputs(graph: Graph) -> Graph:
    """Model outputs that are constants, model inputs, or repeated get a copy node, so a kernel writes each
    (an empty one has nothing to write: no kernel, which would see a zero extent)."""
    seen: set[Value] = set()
    inputs = set(graph.inputs)
    outputs = []
    for v in graph.outputs:
        if v.type.num_elements and (v.is_constant or v in inputs or v in seen):
            node = Node("identity", [v], [], name=f"{v.name}_output_copy")
            copy = Value(v.name, v.type, producer=node)
            node.outputs = [copy]
            graph.nodes.append(node)
            v = copy
        seen.add(v)
        outputs.append(v)
    graph.outputs = outputs
    return graph


def fold_batch_norm(graph: Graph) -> Graph:
    """conv2d -> batch_norm with constant weights becomes one conv2d with scaled weights and a bias."""
    consumers = graph.consumers()
    outputs = set(graph.outputs)
    kept: list[Node] = []
    replaced: dict[Value, Value] = {}
    for node in graph.nodes:
        node.inputs = [replaced.get(v, v) for v in node.inputs]
        conv = _foldable_conv(node, consumers, outputs)
        if conv is None:
            kept.append(node)
            continue
        x, scale, bias, mean, var = node.inputs
        eps = float(node.attrs.get("epsilon", 1e-5))
        s = (scale.data.astype(np.float64) / np.sqrt(var.data.astype(np.float64) + eps)).astype(np.float64)
        weight = conv.inputs[1]
        w = (weight.data.astype(np.float64) * s.reshape(-1, *([1] * (weight.data.ndim - 1)))).astype(
            weight.type.dtype
        )
        b0 = conv.inputs[2].data.astype(np.float64) if len(conv.inputs) > 2 else 0.0
        b = ((b0 - mean.data.astype(np.float64)) * s + bias.data.astype(np.float64)).astype(weight.type.dtype)
        conv.inputs = [
            conv.inputs[0],
            Value(f"{weight.name}_bn", weight.type, data=w),
            Value(f"{node.name or 'bn'}_bias", TensorType(b.shape, weight.type.dtype), data=b),
        ]
        out = node.outputs[0]
        conv.outputs[0].name = out.name
        replaced[out] = conv.outputs[0]
    graph.nodes = kept
    graph.outputs = [replaced.get(v, v) for v in graph.outputs]
    return graph


def _foldable_conv(node: Node, consumers: dict[Value, list[Node]], outputs: set[Value]) -> Node | None:
    if node.op != "batch_norm" or len(node.inputs) != 5 or not all(v.is_constant for v in node.inputs[1:]):
        return None
    x = node.inputs[0]
    conv = x.producer
    if conv is None or conv.op != "conv2d" or x in outputs or len(consumers.get(x, [])) != 1:
        return None
    if not all(v.is_constant for v in conv.inputs[1:]) or not np.issubdtype(
        conv.inputs[1].data.dtype, np.floating
    ):
        return None
    channels = conv.inputs[1].type.shape[0]
    if any(v.type.num_elements != channels for v in node.inputs[1:]):
        return None
    return conv


def remove_identities(graph: Graph) -> Graph:
    """Bypass identity nodes whose output is not a model output."""
    alias: dict[Value, Value] = {}
    outputs = set(graph.outputs)
    kept: list[Node] = []
    for node in graph.nodes:
        node.inputs = [alias.get(v, v) for v in node.inputs]
        if node.op in IDENTITY_OPS and node.outputs[0] not in outputs:
            alias[node.outputs[0]] = node.inputs[0]
            continue
        kept.append(node)
    graph.nodes = kept
    return graph


def eliminate_dead_code(graph: Graph) -> Graph:
    live = {v for v in graph.outputs}
    kept: list[Node] = []
    for node in reversed(graph.nodes):
        if any(v in live for v in node.outputs):
            kept.append(node)
            live.update(node.inputs)
    graph.nodes = kept[::-1]
    return graph
