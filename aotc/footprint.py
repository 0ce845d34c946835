"""What loading a model costs: the time to load it and the memory the load and a first run add, each
measured in a fresh Python process (a process that has loaded it once has its pages, caches and
allocator warm), for an aotc package and for the peer runtime on the source model (onnxruntime, LiteRT).

`python -m aotc.footprint aotc|onnxruntime|litert PATH` is the child: it imports what the runtime needs,
then loads the model, runs it once on seeded random inputs, and prints one JSON line.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

RUNTIMES = ("aotc", "onnxruntime", "litert")
_TIMEOUT_S = 600


@dataclass(frozen=True)
class Footprint:
    """Median over fresh processes: load seconds, and the peak resident memory the load and the load
    plus one run added to a process that had imported the runtime (bytes)."""

    runtime: str
    file_bytes: int
    load_s: float
    rss_load: int
    rss_run: int

    def to_dict(self) -> dict:
        return {
            "runtime": self.runtime,
            "file_bytes": self.file_bytes,
            "load_ms": round(self.load_s * 1e3, 2),
            "rss_load_mb": round(self.rss_load / 2**20, 1),
            "rss_run_mb": round(self.rss_run / 2**20, 1),
        }


def measure_footprint(path: str | os.PathLike, runtime: str = "aotc", processes: int = 3) -> Footprint:
    """Load `path` with `runtime` in `processes` fresh processes, one after another; the medians."""
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
    rows = [_child(str(path), runtime) for _ in range(max(1, processes))]
    return Footprint(
        runtime,
        os.path.getsize(path),
        statistics.median(r["load_s"] for r in rows),
        int(statistics.median(r["rss_load"] for r in rows)),
        int(statistics.median(r["rss_run"] for r in rows)),
    )


def _child(path: str, runtime: str) -> dict:
    cmd = [sys.executable, "-m", "aotc.footprint", runtime, path]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_TIMEOUT_S)
    if proc.returncode != 0:
        tail = (proc.stderr.strip() or f"exit status {proc.returncode}").splitlines()[-1]
        raise RuntimeError(f"loading {path} with {runtime} in a fresh process failed: {tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _status_bytes(field: str) -> int | None:
    """A memory field of /proc/self/status (VmRSS, VmHWM) in bytes, or None where it cannot be read."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_peak() -> None:
    """Start the peak (VmHWM) afresh from the current resident size (Linux 4.0+: clear_refs 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _peak_rss() -> int:
    """This process's peak resident memory in bytes. VmHWM, not getrusage's ru_maxrss: that one carries
    the parent's peak across fork and exec, so a big parent hides the child's."""
    peak = _status_bytes("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _load_aotc(path: str):
    import aotc_runtime

    model = aotc_runtime.load(path)
    return lambda inputs: model.run(inputs), {t.name: (t.shape, t.dtype) for t in model.inputs}


def _load_onnxruntime(path: str):
    import onnxruntime as ort

    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    shapes = {
        i.name: (tuple(i.shape), i.type.removeprefix("tensor(").rstrip(")")) for i in session.get_inputs()
    }
    return lambda inputs: session.run(None, inputs), shapes


def _load_litert(path: str):
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=path)
    interp.allocate_tensors()
    details = interp.get_input_details()
    shapes = {d["name"]: (tuple(d["shape"]), d["dtype"].__name__) for d in details}

    def run(inputs):
        for d in details:
            interp.set_tensor(d["index"], inputs[d["name"]])
        interp.invoke()

    return run, shapes


def main(argv: list[str]) -> int:
    runtime, path = argv
    import numpy as np

    loader = {"aotc": _load_aotc, "onnxruntime": _load_onnxruntime, "litert": _load_litert}[runtime]
    if runtime == "aotc":
        import aotc_runtime  # noqa: F401 - imported before the baseline, as the peers' modules are
    elif runtime == "onnxruntime":
        import onnxruntime  # noqa: F401
    else:
        import ai_edge_litert.interpreter  # noqa: F401
    _reset_peak()  # the imports' own peak must not hide the load's
    base = _status_bytes("VmRSS") or _peak_rss()
    start = time.perf_counter()
    run, shapes = loader(path)
    load_s = time.perf_counter() - start
    rss_load = _peak_rss() - base
    rng = np.random.default_rng(0)
    inputs = {name: _random(rng, shape, dtype) for name, (shape, dtype) in shapes.items()}
    run(inputs)
    print(json.dumps({"load_s": load_s, "rss_load": rss_load, "rss_run": _peak_rss() - base}))
    return 0


def _random(rng, shape: tuple, dtype: str):
    import numpy as np

    shape = tuple(int(d) if isinstance(d, (int, np.integer)) and d > 0 else 1 for d in shape)
    dtype = {"float": "float32", "double": "float64"}.get(dtype, dtype)  # ONNX's names
    if np.issubdtype(np.dtype(dtype), np.integer):
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -100), min(info.max, 100), shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
