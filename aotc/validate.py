"""Compare a package with the reference runtime (onnxruntime for ONNX) on seeded random inputs."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

RTOL = 1e-4
ATOL = 1e-5


class ValidationError(RuntimeError):
    """The package's outputs differ from the reference beyond tolerance."""

    def __init__(self, message: str, report: list[dict]):
        super().__init__(message)
        self.report = report


def random_inputs(specs: Mapping[str, tuple[tuple[int, ...], str]], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, (shape, dtype) in specs.items():
        if np.issubdtype(np.dtype(dtype), np.floating):
            out[name] = rng.uniform(-1.0, 1.0, shape).astype(dtype)
        elif dtype == "bool":
            out[name] = rng.integers(0, 2, shape).astype(bool)
        else:
            out[name] = rng.integers(0, 4, shape).astype(dtype)
    return out


def reference_outputs(model: Path, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    suffix = Path(model).suffix.lower()
    if suffix != ".onnx":
        raise ValueError(f"{model}: no reference runtime for {suffix!r} models")
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, dict(inputs))))


def compare(
    actual: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray], rtol: float, atol: float
) -> list[dict]:
    report = []
    for name, ref in expected.items():
        got = np.asarray(actual[name])
        ref = np.asarray(ref)
        if got.shape != ref.shape:
            report.append(
                {"output": name, "ok": False, "error": f"shape {got.shape} vs reference {ref.shape}"}
            )
            continue
        diff = np.abs(got.astype(np.float64) - ref.astype(np.float64))
        scale = np.abs(ref.astype(np.float64))
        max_abs = float(diff.max()) if diff.size else 0.0
        max_rel = float((diff / np.maximum(scale, 1e-12)).max()) if diff.size else 0.0
        ok = bool(np.all(diff <= atol + rtol * scale)) and bool(np.array_equal(np.isnan(got), np.isnan(ref)))
        report.append({"output": name, "ok": ok, "max_abs": max_abs, "max_rel": max_rel})
    return report


def validate_package(
    package: str | Path,
    model: str | Path,
    input_shapes: Mapping[str, tuple[tuple[int, ...], str]],
    seed: int = 0,
    rtol: float = RTOL,
    atol: float = ATOL,
) -> list[dict]:
    """Run both on the same inputs; raise ValidationError naming each output that differs."""
    import aotc_runtime

    inputs = random_inputs(input_shapes, seed)
    compiled = aotc_runtime.load(str(package))
    actual = compiled.run(inputs)
    report = compare(actual, reference_outputs(Path(model), inputs), rtol, atol)
    bad = [r for r in report if not r["ok"]]
    if bad:
        lines = [format_report_row(r) for r in bad]
        raise ValidationError(
            f"{package} differs from {model} (rtol {rtol}, atol {atol}):\n" + "\n".join(lines), report
        )
    return report


def format_report_row(r: dict) -> str:
    if "error" in r:
        return f"  {r['output']}: {r['error']}"
    status = "ok" if r["ok"] else "MISMATCH"
    return f"  {r['output']}: max abs {r['max_abs']:.3g}, max rel {r['max_rel']:.3g}  {status}"
