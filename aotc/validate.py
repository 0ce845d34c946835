"""Compare a package with the reference runtime on seeded random inputs: onnxruntime for ONNX models, the
LiteRT interpreter for TFLite ones.

A float output's element passes when |got - ref| <= atol + rtol * |ref| + scale_rtol * rms(ref), where
rms(ref) is the root mean square of the whole reference output (its finite values). The scale term admits
the rounding a reordered sum makes (Winograd transforms, blocked reductions, another vector width), which
grows with the magnitude of the values summed, not with each element's own value: an element near zero in
an output of scale 5 may differ by far more than rtol of itself. It is still 1e-4 of the scale, while a
wrong kernel (a shifted tap, a missed channel) is wrong by about 1e-2 of it or more. NaN must match NaN and
an infinity the same infinity.

int8/uint8 (quantized) outputs are compared in units of the last place: within 1 LSB on at least 99.9% of
the values and never more than 2 LSB. So is a float output that a dequantization writes (an ONNX
DequantizeLinear, a QDQ model's usual last node, or a TFLite DEQUANTIZE), in units of that node's scale:
its values lie on that grid, and one rounding of a requantization that falls the other way moves them a
whole step, far beyond the float tolerance.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from aotc.frontend.batch import run_by_sample
from aotc.frontend.options import DEFAULT_REQUANTIZE
from aotc.topi.lowp import FORMATS

RTOL = 1e-4
"""Relative to each reference element."""
ATOL = 1e-5
"""Absolute floor: what an all-zero (or tiny) output may differ by."""
SCALE_RTOL = 1e-4
"""Relative to the reference output's root mean square."""
LSB_SHARE = 0.999
"""Share of a quantized output's values that must be within 1 LSB of the reference."""
LSB_MAX = 2
"""No quantized output value may be further than this many LSB from the reference."""
QUANTIZED_DTYPES = ("int8", "uint8")


REFERENCE_MODULES = {".onnx": "onnxruntime", ".tflite": "ai_edge_litert"}
"""The module that computes the reference outputs, per model suffix (both come with `aotc[validate]`)."""
VALIDATE_EXTRA = "pip install 'aotc[validate]'"


class ReferenceUnavailable(RuntimeError):
    """The reference runtime a validation needs is not installed; the message says how to install it."""


class ReferenceRejectedInputs(RuntimeError):
    """The reference runtime refused validation's random inputs (a model that reads an input as indices
    or sizes): the package cannot be checked on them; the message says what to do instead."""


def reference_rejected(model: str | Path, runtime: str, err: Exception) -> ReferenceRejectedInputs:
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return ReferenceRejectedInputs(
        f"{runtime} cannot run {model} on validation's random inputs (integers 0 to 3, floats in [-1, 1)): "
        f"{first}. The model reads some input as indices or sizes; check the package on inputs of your own "
        "(or turn validation off: `validate: false` in the recipe, --no-validate)"
    )


def require_reference(model: str | Path) -> None:
    """Raise ReferenceUnavailable unless `model`'s reference runtime can be imported. A build calls it
    before any work: validation is on by default, and a missing oracle found after tuning wastes it."""
    module = REFERENCE_MODULES.get(Path(model).suffix.lower())
    if module is not None and importlib.util.find_spec(module) is None:
        raise reference_unavailable(model, module)


def reference_unavailable(model: str | Path, module: str) -> ReferenceUnavailable:
    return ReferenceUnavailable(
        f"validating against {model} needs {module}, which is not installed: {VALIDATE_EXTRA} "
        "(or turn validation off: `validate: false` in the recipe)"
    )


class ValidationError(RuntimeError):
    """The package's outputs differ from the reference beyond tolerance."""

    def __init__(self, message: str, report: list[dict]):
        super().__init__(message)
        self.report = report


def random_inputs(specs: Mapping[str, tuple[tuple[int, ...], str]], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, (shape, dtype) in specs.items():
        fmt = FORMATS.get(np.dtype(dtype).name)
        if fmt is not None:  # an ml_dtypes type (bfloat16, float8, int4...): values it holds exactly
            values = rng.uniform(-1.0, 1.0, shape) if fmt.kind == "float" else rng.integers(0, 2, shape)
            out[name] = values.astype(np.float32).astype(np.dtype(dtype))
        elif np.issubdtype(np.dtype(dtype), np.floating):
            out[name] = rng.uniform(-1.0, 1.0, shape).astype(dtype)
        elif dtype == "bool":
            out[name] = rng.integers(0, 2, shape).astype(bool)
        elif dtype in QUANTIZED_DTYPES:
            info = np.iinfo(dtype)
            out[name] = rng.integers(info.min, info.max + 1, shape).astype(dtype)
        else:
            out[name] = rng.integers(0, 4, shape).astype(dtype)
    return out


def _has_low_precision_io(graph) -> bool:
    """Whether an ONNX graph's inputs or outputs include a low-precision or sub-byte element type."""
    import onnx

    for vi in [*graph.input, *graph.output]:
        code = vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else 0
        try:
            name = onnx.helper.tensor_dtype_to_np_dtype(code).name if code else ""
        except (KeyError, ValueError, TypeError):
            continue
        if name in FORMATS:
            return True
    return False


INTEGER_PRODUCT_OPS = frozenset({"QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger"})
"""ONNX operators whose 8-bit products onnxruntime computes on its u8s8 kernels."""


def onnxruntime_saturates(graph, host_features: frozenset[str] | None = None) -> str | None:
    """Where onnxruntime's integer products would not be those of the ONNX `graph` (a GraphProto) on this
    CPU (`host_features`: the host's, else these CPU features): on x86 without VNNI its
    u8s8 kernel adds pairs of products in int16 with saturation (vpmaddubsw), off by up to 98 LSB on 8-bit
    weights. "qoperator": the model names such operators (ONNX's own; com.microsoft ones only onnxruntime
    runs, so such a model keeps it); "qdq": its optimizer would fuse the model's DequantizeLinear /
    QuantizeLinear groups into them; None: it computes exactly (a CPU with VNNI, no quantized operators)."""
    if host_features is None:
        from aotc.target import cpu_features, host_target

        host = host_target()
        if host.isa != "x86_64":
            return None
        host_features = frozenset(cpu_features(host))
    if host_features & {"avx512vnni", "avxvnni"}:
        return None
    ops = {(n.domain or "", n.op_type) for n in graph.node}
    if any(domain == "com.microsoft" for domain, _ in ops):
        return None  # its QGemm, QLinearAdd...: only onnxruntime runs them, saturating or not
    if any(op in INTEGER_PRODUCT_OPS for _, op in ops):
        return "qoperator"
    return "qdq" if ("", "DequantizeLinear") in ops else None


def reference_outputs(
    model: Path, inputs: Mapping[str, np.ndarray], requantize: str = DEFAULT_REQUANTIZE
) -> dict[str, np.ndarray]:
    """onnxruntime's outputs, or LiteRT's with the kernels whose int8 arithmetic `requantize` (the
    build's) follows: float, the default XNNPACK delegate; fixed_point, TFLite's builtin kernels. Where
    onnxruntime's integer products saturate on this CPU (`onnxruntime_saturates`), a QDQ model runs
    without onnxruntime's graph optimizations (each DequantizeLinear, float operator and QuantizeLinear as
    the model writes it) and a model of quantized operators on ONNX's reference evaluator."""
    suffix = Path(model).suffix.lower()
    if suffix == ".tflite":
        return litert_outputs(model, inputs, xnnpack=requantize == "float")
    if suffix != ".onnx":
        raise ValueError(f"{model}: no reference runtime for {suffix!r} models")
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    saturates = onnxruntime_saturates(graph)
    if _has_low_precision_io(graph) or saturates == "qoperator":
        # onnxruntime's Python API takes and returns no ml_dtypes arrays (bfloat16, float8, int4...), and
        # its integer products may saturate here: ONNX's own reference evaluator, which defines these
        # types' and operators' semantics, runs the model instead
        from onnx.reference import ReferenceEvaluator

        evaluator = ReferenceEvaluator(str(model))
        declared = {
            i.name: [d.dim_value if d.HasField("dim_value") else None for d in i.type.tensor_type.shape.dim]
            for i in graph.input
        }
        try:
            return run_by_sample(
                lambda feeds: dict(zip(evaluator.output_names, evaluator.run(None, feeds))), inputs, declared
            )
        except (ValueError, IndexError, TypeError) as err:  # what its numpy kernels raise on bad indices
            raise reference_rejected(model, "ONNX's reference evaluator", err) from err
    try:
        import onnxruntime as ort
    except ModuleNotFoundError as err:
        if err.name != "onnxruntime":  # installed but broken: its own error says more
            raise
        raise reference_unavailable(model, err.name) from None

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    if saturates == "qdq":
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    declared = {i.name: i.shape for i in sess.get_inputs()}  # a re-batched model runs sample by sample
    try:
        return run_by_sample(lambda feeds: dict(zip(names, sess.run(names, feeds))), inputs, declared)
    except Exception as err:
        # onnxruntime's own error types (InvalidArgument, Fail, ...): its kernels refused the inputs
        if type(err).__module__.startswith("onnxruntime"):
            raise reference_rejected(model, "onnxruntime", err) from err
        raise


def litert_outputs(model: Path, inputs: Mapping[str, np.ndarray], xnnpack: bool) -> dict[str, np.ndarray]:
    """Outputs of the LiteRT interpreter on one thread: with its default XNNPACK delegate (as users run it;
    int8 convs requantize in float32), or with TFLite's builtin kernels alone (fixed-point arithmetic)."""
    try:
        from ai_edge_litert.interpreter import Interpreter, OpResolverType
    except ModuleNotFoundError as err:
        if err.name != "ai_edge_litert":  # installed but broken: its own error says more
            raise
        raise reference_unavailable(model, err.name) from None

    interp = Interpreter(
        model_path=str(model),
        num_threads=1,
        experimental_op_resolver_type=(
            OpResolverType.AUTO if xnnpack else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
        ),
    )
    details = interp.get_input_details()
    missing = sorted({d["name"] for d in details} - set(inputs))
    if missing:
        raise ValueError(f"{model}: no values for inputs {missing}")

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        for d in details:
            value = np.asarray(feeds[d["name"]], d["dtype"])
            if tuple(d["shape"]) != value.shape:
                interp.resize_tensor_input(d["index"], value.shape)
        interp.allocate_tensors()
        for d in details:
            interp.set_tensor(d["index"], np.asarray(feeds[d["name"]], d["dtype"]))
        interp.invoke()
        return {d["name"]: interp.get_tensor(d["index"]).copy() for d in interp.get_output_details()}

    # a re-batched model runs sample by sample (-1 in a shape signature is a dynamic dimension)
    declared = {d["name"]: [int(s) if s >= 0 else None for s in d["shape_signature"]] for d in details}
    return run_by_sample(run, inputs, declared)


def lsb_histogram(got: np.ndarray, ref: np.ndarray, step: float | None = None) -> dict[int, int]:
    """How many values differ by 0, 1, 2... units in the last place (`step`: of float values on that grid)."""
    if step is None:
        diff = np.abs(got.astype(np.int64) - ref.astype(np.int64)).reshape(-1)
    else:
        diff = np.rint(np.abs(got.astype(np.float64) - ref.astype(np.float64)) / step).astype(np.int64)
    return {k: int(n) for k, n in enumerate(np.bincount(diff.reshape(-1))) if n}


def lsb_row(name: str, hist: dict[int, int], size: int) -> dict:
    """The LSB rule's verdict on an output's histogram."""
    within_one = hist.get(0, 0) + hist.get(1, 0)
    max_lsb = max(hist, default=0)
    ok = max_lsb <= LSB_MAX and within_one >= LSB_SHARE * size
    return {"output": name, "ok": ok, "max_lsb": max_lsb, "lsb_histogram": hist}


def dequantized_outputs(model: str | Path) -> dict[str, float]:
    """The outputs that a dequantization writes (an ONNX DequantizeLinear, a TFLite DEQUANTIZE), with the
    step of their grid: the scale (the largest, where there is one per channel)."""
    suffix = Path(model).suffix.lower()
    if suffix == ".tflite":
        return _tflite_dequantized_outputs(model)
    if suffix != ".onnx":
        return {}
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(model), load_external_data=False).graph
    consts = {t.name: t for t in graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            consts[node.output[0]] = node.attribute[0].t
    writers = {out: node for node in graph.node for out in node.output}
    # scales numpy_helper reads as their values (a bfloat16 one would come back as its raw bits)
    float_scales = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE)
    scales = {}
    for out in graph.output:
        node = writers.get(out.name)
        if node is None or node.op_type != "DequantizeLinear" or node.domain not in ("", "ai.onnx"):
            continue
        scale = consts.get(node.input[1]) if len(node.input) >= 2 else None
        if scale is not None and scale.data_type in float_scales:
            scales[out.name] = numpy_helper.to_array(scale)
    return _grid_steps(scales)


def _tflite_dequantized_outputs(model: str | Path) -> dict[str, float]:
    from aotc.frontend.tflite import read_tflite

    graph = read_tflite(model)
    writers = {out: op for op in graph.operators for out in op.outputs}
    scales = {}
    for index in graph.outputs:
        op = writers.get(index)
        if op is None or op.code != "DEQUANTIZE":
            continue
        quant = graph.tensors[op.inputs[0]].quant
        if quant is not None:
            scales[graph.tensors[index].name] = np.asarray(quant.scales)
    return _grid_steps(scales)


def _grid_steps(scales: Mapping[str, np.ndarray]) -> dict[str, float]:
    steps = {}
    for name, scale in scales.items():
        scale = np.asarray(scale, np.float64)
        if scale.size and np.all(np.isfinite(scale)) and scale.max() > 0:
            steps[name] = float(scale.max())
    return steps


def compare(
    actual: Mapping[str, np.ndarray],
    expected: Mapping[str, np.ndarray],
    rtol: float,
    atol: float,
    scale_rtol: float = SCALE_RTOL,
    steps: Mapping[str, float] | None = None,
) -> list[dict]:
    """One row per output: quantized ones in LSB, float ones by the rule in the module docstring; `steps`
    names the float outputs compared in LSB of that step (`dequantized_outputs`)."""
    steps = steps or {}
    report = []
    for name, ref in expected.items():
        got = np.asarray(actual[name])
        ref = np.asarray(ref)
        if got.shape != ref.shape:
            report.append(
                {"output": name, "ok": False, "error": f"shape {got.shape} vs reference {ref.shape}"}
            )
            continue
        if ref.dtype.name in QUANTIZED_DTYPES and got.dtype == ref.dtype:
            report.append(lsb_row(name, lsb_histogram(got, ref), ref.size))
            continue
        step = steps.get(name)
        if step is not None and np.isfinite(got).all() and np.isfinite(ref).all():
            row = lsb_row(name, lsb_histogram(got, ref, step), ref.size)
            report.append({**row, "step": step})
            continue
        report.append({"output": name, **compare_float(got, ref, rtol, atol, scale_rtol)})
    return report


def compare_float(got: np.ndarray, ref: np.ndarray, rtol: float, atol: float, scale_rtol: float) -> dict:
    """ok, the scale, the largest differences and the element furthest beyond its tolerance."""
    got64, ref64 = got.astype(np.float64), ref.astype(np.float64)
    finite = ref64[np.isfinite(ref64)]
    rms = float(np.sqrt(np.mean(np.square(finite)))) if finite.size else 0.0
    # Equal values (the same infinity included) and NaN against NaN pass whatever the tolerance.
    same = (got64 == ref64) | (np.isnan(got64) & np.isnan(ref64))
    with np.errstate(invalid="ignore"):
        diff = np.where(same, 0.0, np.abs(got64 - ref64))
        diff = np.where(np.isnan(diff), np.inf, diff)
        rel = diff / np.maximum(np.abs(ref64), 1e-12)
    allowed = atol + rtol * np.where(np.isfinite(ref64), np.abs(ref64), 0.0) + scale_rtol * rms
    over = diff > allowed
    row = {
        "ok": not bool(over.any()),
        "shape": list(ref.shape),
        "rms": rms,
        "allowed_abs": atol + scale_rtol * rms,
        "max_abs": float(diff.max()) if diff.size else 0.0,
        "max_rel": float(np.nanmax(rel)) if diff.size else 0.0,
        "over": int(over.sum()),
    }
    if diff.size:
        excess = np.divide(diff, allowed, out=np.where(diff > 0, np.inf, 0.0), where=allowed > 0)
        worst = np.unravel_index(int(np.argmax(excess)), ref.shape)
        row["worst"] = {
            "index": [int(i) for i in worst],
            "got": float(got64[worst]),
            "ref": float(ref64[worst]),
            "allowed": float(allowed[worst]),
        }
    return row


def validate_package(
    package: str | Path,
    model: str | Path,
    input_shapes: Mapping[str, tuple[tuple[int, ...], str]],
    seed: int = 0,
    rtol: float = RTOL,
    atol: float = ATOL,
    scale_rtol: float = SCALE_RTOL,
    compiled=None,
    requantize: str = DEFAULT_REQUANTIZE,
) -> list[dict]:
    """Run both on the same inputs; raise ValidationError naming each output that differs.
    `compiled` is the package already loaded (under the caller's signature policy), else it is loaded;
    `requantize` is the build's (it picks LiteRT's kernels, `reference_outputs`)."""
    import aotc_runtime

    require_reference(model)
    inputs = random_inputs(input_shapes, seed)
    if compiled is None:
        compiled = aotc_runtime.load(str(package))
    actual = compiled.run(inputs)
    expected = reference_outputs(Path(model), inputs, requantize)
    report = compare(actual, expected, rtol, atol, scale_rtol, dequantized_outputs(model))
    bad = [r for r in report if not r["ok"]]
    if bad:
        lines = [format_report_row(r) for r in bad]
        raise ValidationError(
            f"{package} differs from {model} on random inputs (seed {seed}). Float outputs: "
            f"|got - ref| <= {atol:g} + {rtol:g}*|ref| + {scale_rtol:g}*rms(ref) per element; quantized "
            f"(and dequantized, in units of their scale): within 1 LSB on {LSB_SHARE:.1%}, never over "
            f"{LSB_MAX} LSB:\n" + "\n".join(lines),
            report,
        )
    return report


def format_report_row(r: dict) -> str:
    if "variant" in r:  # a package of several batch sizes: each size validated on its own
        return format_report_row({k: v for k, v in r.items() if k != "variant"}).replace(
            "  ", f"  [{r['variant']}] ", 1
        )
    if "error" in r:
        return f"  {r['output']}: {r['error']}"
    status = "ok" if r["ok"] else "MISMATCH"
    if "max_lsb" in r:
        hist = ", ".join(f"{k} LSB: {n}" for k, n in sorted(r["lsb_histogram"].items()))
        unit = f" of its dequantization scale {r['step']:.4g}" if "step" in r else ""
        return f"  {r['output']}: max |diff| {r['max_lsb']} LSB{unit} ({hist})  {status}"
    line = (
        f"  {r['output']}: max abs {r['max_abs']:.3g}, max rel {r['max_rel']:.3g}, "
        f"rms(ref) {r['rms']:.3g}  {status}"
    )
    if r["ok"] or "worst" not in r:
        return line
    w = r["worst"]
    index = ", ".join(map(str, w["index"]))
    return (
        f"{line}\n    {r['over']} of {int(np.prod(r['shape']))} elements beyond tolerance; worst at "
        f"[{index}]: got {w['got']:.7g}, reference {w['ref']:.7g}, |diff| {abs(w['got'] - w['ref']):.3g} "
        f"> allowed {w['allowed']:.3g}"
    )
