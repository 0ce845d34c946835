"""aotc on an NVIDIA GPU next to PyTorch on the same GPU, in the same run: GEMM, ResNet-18, a BERT-style encoder.

    python benchmarks/gpu.py [--minutes 30] [--models gemm,resnet18,bert] [--batches 1,16] [--rounds 3] [--log F [--profile N]]

Needs an NVIDIA GPU, torch (`pip install torch==2.13.0`; keep pip from pulling another torch) and
`aotc[cuda]`; without a GPU it says so and exits with status 2, touching no GPU driver. Each model is
built by `aotc.compile(model, target="cuda -arch=sm_XX")`, the arch being the device's compute
capability, after tuning for `--minutes` per model (split evenly over its batch sizes; 0: untuned default
schedules), and run by `aotc.load(...)`: through `run_dlpack` on device tensors where the runtime has it,
into output tensors allocated once, else `run` on numpy arrays, whose times then include the host copies
both ways (marked `host`).

Peers, on the same inputs and weights: `gemm` (4096^3 fp32) against `torch.matmul`; `resnet18` (224x224)
and `bert` (BERT-base shapes: 12 layers, d_model 768, 12 heads, FF 3072, 128 tokens) from recipes/zoo
against PyTorch eager and `torch.compile` (default mode, one whole graph) of the same ONNX graph run op by
op with torch. TF32 is off everywhere (matmul and cuDNN), so every side computes in fp32. A latency is the
median of `--repeat` timed batches (torch.cuda.synchronize around perf_counter), the best such median
over `--rounds` rounds in which the runners take turns. Ratios are peer / aotc (> 1: aotc is faster).
Exit status: 0, 1 when aotc failed to build or run some model (its row says why), 2 without a GPU.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from zoo import onnx_models

NO_GPU = 2
DEVICE = "cuda"  # where torch runs; a constant so that a CPU smoke run of this script can change it
GEMM_N = 4096
BERT_BASE = {"seq": 128, "d_model": 768, "heads": 12, "ff": 3072, "layers": 12}
MODELS = ("gemm", "resnet18", "bert")


# ---- the models -----------------------------------------------------------------------------------


def gemm_model(n: int) -> onnx.ModelProto:
    """C = A @ B for two [n, n] float32 inputs."""
    a, b, c = (helper.make_tensor_value_info(x, TensorProto.FLOAT, [n, n]) for x in "ABC")
    graph = helper.make_graph([helper.make_node("MatMul", ["A", "B"], ["C"])], "gemm", [a, b], [c])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", onnx_models.OPSET)])
    model.ir_version = onnx_models.IR_VERSION
    return model


def zoo_model(name: str, batch: int) -> onnx.ModelProto:
    if name == "resnet18":
        return onnx_models.resnet18(batch=batch)
    if name == "bert":
        return onnx_models.transformer_encoder(batch=batch, **BERT_BASE)
    raise ValueError(f"unknown model {name!r}")


def torch_module(model: onnx.ModelProto, device: str):
    """`model` as a torch.nn.Module that runs its ONNX nodes one by one with torch ops (float initializers
    as buffers on `device`, integer ones as Python constants so that torch.compile sees static shapes)."""
    import torch
    import torch.nn.functional as F

    def conv(x, w, b=None, strides=(1, 1), pads=(0, 0, 0, 0), group=1, dilations=(1, 1), **_):
        top, left, bottom, right = pads
        if (top, left) != (bottom, right):
            x, top, left = F.pad(x, (left, right, top, bottom)), 0, 0
        return F.conv2d(x, w, b, tuple(strides), (top, left), tuple(dilations), group)

    def max_pool(x, kernel_shape, strides=(1, 1), pads=(0, 0, 0, 0), **_):
        if tuple(pads[:2]) != tuple(pads[2:]):
            raise ValueError(f"MaxPool with asymmetric pads {pads} is not supported here")
        return F.max_pool2d(x, tuple(kernel_shape), tuple(strides), tuple(pads[:2]))

    def gemm(a, b, c=None, alpha=1.0, beta=1.0, transA=0, transB=0):
        y = alpha * ((a.T if transA else a) @ (b.T if transB else b))
        return y if c is None else y + beta * c

    def reshape(x, shape, allowzero=0):
        dims = [x.shape[i] if d == 0 and not allowzero else int(d) for i, d in enumerate(shape)]
        return x.reshape(dims)

    def flatten(x, axis=1):
        return x.reshape(math.prod(x.shape[:axis]), -1)

    def layer_norm(x, scale, bias=None, axis=-1, epsilon=1e-5, **_):
        return F.layer_norm(x, x.shape[axis:], scale, bias, epsilon)

    ops: dict[str, Callable] = {
        "Add": torch.add,
        "Sub": torch.sub,
        "Mul": torch.mul,
        "Div": torch.div,
        "Relu": F.relu,
        "Erf": torch.erf,
        "MatMul": torch.matmul,
        "Gemm": gemm,
        "Conv": conv,
        "MaxPool": max_pool,
        "BatchNormalization": lambda x, s, b, m, v, epsilon=1e-5, **_: F.batch_norm(
            x, m, v, s, b, False, 0.0, epsilon
        ),
        "GlobalAveragePool": lambda x: x.mean(dim=(2, 3), keepdim=True),
        "Flatten": flatten,
        "Reshape": reshape,
        "Transpose": lambda x, perm: x.permute(*perm),
        "Softmax": lambda x, axis=-1: torch.softmax(x, axis),
        "LayerNormalization": layer_norm,
    }
    graph = model.graph
    missing = sorted({n.op_type for n in graph.node} - set(ops))
    if missing:
        raise ValueError(f"{graph.name}: no torch mapping for ONNX operators {', '.join(missing)}")

    class OnnxModule(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.constants: dict[str, object] = {}
            self.buffer_of: dict[str, str] = {}
            for i, init in enumerate(graph.initializer):
                array = numpy_helper.to_array(init)
                if np.issubdtype(array.dtype, np.floating):
                    self.register_buffer(f"w{i}", torch.from_numpy(array.copy()))
                    self.buffer_of[init.name] = f"w{i}"
                else:
                    self.constants[init.name] = tuple(int(v) for v in array.reshape(-1))
            known = set(self.constants) | set(self.buffer_of)
            self.inputs = [v.name for v in graph.input if v.name not in known]
            self.outputs = [v.name for v in graph.output]
            self.nodes = [
                (
                    ops[n.op_type],
                    list(n.input),
                    n.output[0],
                    {a.name: helper.get_attribute_value(a) for a in n.attribute},
                )
                for n in graph.node
            ]

        def forward(self, *xs):
            env = dict(self.constants) | dict(zip(self.inputs, xs))
            env |= {name: getattr(self, buf) for name, buf in self.buffer_of.items()}
            for fn, ins, out, attrs in self.nodes:
                env[out] = fn(*[env[i] if i else None for i in ins], **attrs)
            return tuple(env[o] for o in self.outputs)

    return OnnxModule().to(device).eval()


# ---- the GPU and the machine ----------------------------------------------------------------------


def probe_gpu() -> tuple[object | None, str]:
    """(torch, "") when torch is installed and sees a CUDA GPU, else (None, why). Only torch's own
    `torch.cuda.is_available()` is asked: nothing else touches the driver before a GPU is known."""
    try:
        import torch
    except ImportError:
        return None, "torch is not installed (pip install torch==2.13.0 on a machine with an NVIDIA GPU)"
    if not torch.cuda.is_available():
        return None, f"torch {torch.__version__} sees no CUDA GPU (no NVIDIA GPU or driver here)"
    return torch, ""


def device_line(torch) -> tuple[str, str]:
    """(the device in words, its arch as sm_XX)."""
    props = torch.cuda.get_device_properties(0)
    arch = f"sm_{props.major}{props.minor}"
    memory = props.total_memory / 2**30
    words = (
        f"{props.name} ({arch}, {props.multi_processor_count} SMs, {memory:.0f} GiB), "
        f"torch {torch.__version__}, CUDA {torch.version.cuda}"
    )
    return words, arch


def quiet_line() -> str:
    """How busy the machine is: the host's load average and the other processes on the GPUs."""
    load = "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return f"host {load}; nvidia-smi not found, other GPU users unknown"
    try:
        out = subprocess.run(
            [smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout
        util = subprocess.run(
            [smi, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.split()
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"host {load}; nvidia-smi failed ({e})"
    others = [
        line for line in out.splitlines() if line.strip() and line.split(",")[0].strip() != str(os.getpid())
    ]
    return f"host {load}; GPU utilisation {'/'.join(util) or '?'}%, {len(others)} other GPU processes"


# ---- timing ---------------------------------------------------------------------------------------


def median_ms(
    fn: Callable[[], object], sync: Callable[[], None], repeat: int, min_seconds: float = 0.3
) -> float:
    """Median milliseconds per call of `fn` over `repeat` batches of calls that together take about
    `min_seconds`, the device synchronized around each batch."""
    fn()
    sync()
    start = time.perf_counter()
    fn()
    sync()
    number = max(1, int(min_seconds / repeat / max(time.perf_counter() - start, 1e-6)))
    samples = []
    for _ in range(repeat):
        sync()
        start = time.perf_counter()
        for _ in range(number):
            fn()
        sync()
        samples.append((time.perf_counter() - start) / number)
    return statistics.median(samples) * 1e3


def best_of_rounds(runners: dict[str, Callable], sync, rounds: int, repeat: int) -> dict[str, float]:
    """The best median (ms) of each runner over `rounds` rounds in which the runners take turns."""
    for fn in runners.values():  # torch.compile compiles on its first call: all of that before any timing
        fn()
    sync()
    best = dict.fromkeys(runners, float("inf"))
    for _ in range(rounds):
        for name, fn in runners.items():
            best[name] = min(best[name], median_ms(fn, sync, repeat))
    return best


# ---- aotc -----------------------------------------------------------------------------------------


@dataclass
class AotcRun:
    """A loaded aotc package's call on the benchmark's inputs, and how its data travels."""

    call: Callable[[], list]  # outputs as torch tensors on the GPU
    via: str  # "dlpack" (device tensors in and out) or "host" (numpy in and out: host copies timed)
    build_s: float
    model: object = None  # the loaded package (aotc_runtime)


def aotc_run(torch, path: Path, target: str, inputs: dict, seconds: float, records: Path, args):
    """Compile the ONNX model at `path` for `target` after tuning it for `seconds` (0: untuned), load it,
    and return how to call it on `inputs` (name -> CUDA tensor), called once. Through DLPack, the outputs
    are tensors allocated once, as a serving loop would (torch's outputs come from its caching allocator)."""
    import aotc

    tuning = (
        aotc.TuningOptions(trials=0)
        if seconds <= 0
        else aotc.TuningOptions(deadline=seconds, records=records)
    )
    start = time.perf_counter()
    package = aotc.compile(
        path, target=target, tuning=tuning, validate=args.validate, log=build_log(args, path)
    )
    model = aotc.load(str(package.path))
    build_s = time.perf_counter() - start
    if hasattr(model, "run_dlpack"):
        device = next(iter(inputs.values())).device
        outputs = {
            t.name: torch.empty(t.shape, dtype=getattr(torch, np.dtype(t.dtype).name), device=device)
            for t in model.outputs
        }

        def call() -> list:
            outs = model.run_dlpack(inputs, outputs)
            outs = outs.values() if isinstance(outs, dict) else outs
            return [o if isinstance(o, torch.Tensor) else torch.from_dlpack(o) for o in outs]

        run = AotcRun(call, "dlpack", build_s, model)
    else:
        host = {name: t.cpu().numpy() for name, t in inputs.items()}
        device = next(iter(inputs.values())).device

        def call_host() -> list:
            return [torch.from_numpy(o).to(device) for o in model.run(host).values()]

        run = AotcRun(call_host, "host", build_s, model)
    run.call()  # a package that builds but fails to run fails here, as a row of the table
    return run


def records_path(args, workdir: Path, name: str) -> Path:
    """Where the tuning records of model `name` go: `--records` (kept) or the run's temporary directory."""
    folder = args.records or workdir
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{name}.jsonl"


def build_log(args, path: Path) -> Callable[[str], None]:
    """Where a build's messages go: appended to `--log`, each line marked with the model's file, or nowhere."""
    if args.log is None:
        return lambda _: None

    def write(message: str) -> None:
        with open(args.log, "a") as f:
            f.write(f"{time.strftime('%H:%M:%S')} {path.stem}: {message}\n")

    return write


def log_profile(args, label: str, run: AotcRun) -> None:
    """With --profile N and --log: the package's N costliest tasks on the device (each call timed in
    place, summed per task), appended to the log."""
    if not args.profile or args.log is None:
        return
    per_task: dict[str, list] = {}
    for t in run.model.profile(repeat=5, warmup=1):
        row = per_task.setdefault(t.task or t.kernel, [0.0, 0, 0])
        row[0] += t.median_ms
        row[1] += 1
        row[2] += t.flops
    total = sum(ms for ms, _, _ in per_task.values())
    lines = [f"profile {label}: {total:.3f} ms in {sum(n for _, n, _ in per_task.values())} calls"]
    for task, (ms, n, flops) in sorted(per_task.items(), key=lambda kv: -kv[1][0])[: args.profile]:
        rate = f"{flops / ms / 1e6:9.1f} GFLOP/s" if flops else " " * 17
        lines.append(f"  {ms:8.3f} ms {100 * ms / total:5.1f}%  {n:3d} calls  {rate}  {task}")
    with open(args.log, "a") as f:
        f.write("\n".join(lines) + "\n")


def rel_error(got, ref) -> float:
    """max |got - ref| / max |ref|."""
    ref = ref.double()
    return float((got.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


# ---- main -----------------------------------------------------------------------------------------


HEADER = (
    f"{'model':<10} {'batch':>5}  {'aotc ms':>9} {'via':<6}  {'eager ms':>9} {'eager/aotc':>10}  "
    f"{'compile ms':>10} {'compile/aotc':>12}  {'rel err':>8}  {'build s':>8}"
)


def row(name, batch, aotc_ms, via, eager_ms, compiled_ms, err, build_s, note="") -> str:
    def ms(v):
        return f"{v:9.3f}" if v is not None else f"{'-':>9}"

    def ratio(peer, width):
        return f"{peer / aotc_ms:{width - 1}.2f}x" if peer is not None and aotc_ms else f"{'-':>{width}}"

    compiled = f"{compiled_ms:10.3f}" if compiled_ms is not None else f"{'-':>10}"
    error = f"{err:8.1e}" if err is not None else f"{'-':>8}"
    build = f"{build_s:8.1f}" if build_s is not None else f"{'-':>8}"
    line = (
        f"{name:<10} {batch:>5}  {ms(aotc_ms)} {via:<6}  {ms(eager_ms)} {ratio(eager_ms, 10)}  "
        f"{compiled} {ratio(compiled_ms, 12)}  {error}  {build}"
    )
    return f"{line}  {note}" if note else line


def bench_gemm(torch, target: str, workdir: Path, seconds: float, args) -> tuple[str, bool]:
    """One row: a 4096^3 fp32 GEMM by aotc (tuned `seconds`) and torch.matmul."""
    path = onnx_models.save(gemm_model(GEMM_N), workdir / "gemm.onnx")
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    inputs = {n: torch.rand(GEMM_N, GEMM_N, device=DEVICE, generator=gen) * 2 - 1 for n in "AB"}
    runners = {"eager": lambda: torch.matmul(inputs["A"], inputs["B"])}
    flops = 2.0 * GEMM_N**3
    try:
        ours = aotc_run(torch, path, target, inputs, seconds, records_path(args, workdir, "gemm"), args)
    except Exception as e:  # a failed build is a row of the table, not the end of the benchmark
        ms = best_of_rounds(runners, torch.cuda.synchronize, args.rounds, args.repeat)
        note = f"torch.matmul {flops / ms['eager'] / 1e9:.1f} TFLOP/s; aotc failed: {first_line(e)}"
        return row("gemm", "-", None, "-", ms["eager"], None, None, None, note), False
    runners["aotc"] = ours.call
    ms = best_of_rounds(runners, torch.cuda.synchronize, args.rounds, args.repeat)
    err = rel_error(ours.call()[0], runners["eager"]())
    log_profile(args, "gemm", ours)
    note = f"TFLOP/s: aotc {flops / ms['aotc'] / 1e9:.1f}, torch.matmul {flops / ms['eager'] / 1e9:.1f}"
    return row("gemm", "-", ms["aotc"], ours.via, ms["eager"], None, err, ours.build_s, note), True


def bench_model(
    torch, name: str, batch: int, target: str, workdir: Path, seconds: float, args
) -> tuple[str, bool]:
    """One row: `name` at `batch` by aotc (tuned `seconds`), PyTorch eager and torch.compile."""
    model = zoo_model(name, batch)
    path = onnx_models.save(model, workdir / f"{name}_b{batch}.onnx")
    module = torch_module(model, DEVICE)
    compiled = torch.compile(module, fullgraph=True)  # one graph, or an error: never a silent eager fallback
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in model.graph.input}
    inputs = {n: torch.rand(*shape, device=DEVICE, generator=gen) for n, shape in shapes.items()}
    xs = tuple(inputs.values())
    with torch.no_grad():
        runners = {"eager": lambda: module(*xs), "compile": lambda: compiled(*xs)}
        try:
            ours = aotc_run(torch, path, target, inputs, seconds, records_path(args, workdir, name), args)
        except Exception as e:  # a failed build is a row of the table, not the end of the benchmark
            ms = best_of_rounds(runners, torch.cuda.synchronize, args.rounds, args.repeat)
            note = f"aotc failed: {first_line(e)}"
            return row(name, batch, None, "-", ms["eager"], ms["compile"], None, None, note), False
        runners["aotc"] = ours.call
        ms = best_of_rounds(runners, torch.cuda.synchronize, args.rounds, args.repeat)
        err = rel_error(ours.call()[0], runners["eager"]()[0])
        log_profile(args, f"{name} batch {batch}", ours)
    return row(name, batch, ms["aotc"], ours.via, ms["eager"], ms["compile"], err, ours.build_s), True


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--minutes", type=float, default=30.0, help="tuning budget per model (default 30; 0: untuned)"
    )
    ap.add_argument(
        "--models", default=",".join(MODELS), help=f"comma-separated subset of {', '.join(MODELS)}"
    )
    ap.add_argument("--batches", default="1,16", help="batch sizes of resnet18 and bert (default 1,16)")
    ap.add_argument(
        "--rounds", type=int, default=3, help="rounds in which the runners take turns (default 3)"
    )
    ap.add_argument("--repeat", type=int, default=20, help="timed batches per median (default 20)")
    ap.add_argument(
        "--records",
        type=Path,
        help="keep the tuning records (one MODEL.jsonl each) in this directory (default: temporary)",
    )
    ap.add_argument("--log", type=Path, help="append each build's messages (tuning progress) to this file")
    ap.add_argument(
        "--profile", type=int, default=0, help="with --log: log each package's N costliest tasks on the GPU"
    )
    ap.add_argument(
        "--no-validate", dest="validate", action="store_false", help="skip onnxruntime validation"
    )
    args = ap.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        ap.error(f"unknown models: {', '.join(unknown)}; known: {', '.join(MODELS)}")
    try:
        batches = [int(b) for b in args.batches.split(",") if b]
    except ValueError:
        ap.error(f"--batches must be comma-separated integers, got {args.batches!r}")
    if not batches or min(batches) < 1 or args.minutes < 0 or args.rounds < 1 or args.repeat < 1:
        ap.error("--batches must be positive, --minutes >= 0, --rounds and --repeat >= 1")

    torch, why = probe_gpu()
    if torch is None:
        print(f"benchmarks/gpu.py needs an NVIDIA GPU: {why}", file=sys.stderr)
        return NO_GPU
    # fp32 on every side: TF32 would round the inputs of torch's matmuls and convolutions to 10 bits
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    device, arch = device_line(torch)
    target = f"cuda -arch={arch}"
    print(f"device: {device}; aotc target: {target}")
    print(f"before: {quiet_line()}")
    print(HEADER, flush=True)
    all_ok = True
    with tempfile.TemporaryDirectory(prefix="aotc-gpu-bench-") as tmp:
        workdir = Path(tmp)
        for name in models:
            if name == "gemm":
                results = [bench_gemm(torch, target, workdir, args.minutes * 60, args)]
            else:
                seconds = args.minutes * 60 / len(batches)
                results = (bench_model(torch, name, b, target, workdir, seconds, args) for b in batches)
            for line, ok in results:
                print(line, flush=True)
                all_ok &= ok
    print(f"after: {quiet_line()}")
    tuned = (
        f"tuned {args.minutes:g} min per model (split over its batch sizes)" if args.minutes else "untuned"
    )
    print(
        f"all on {device}. ratio = peer ms / aotc ms (> 1: aotc is faster); aotc {tuned}; via host: aotc "
        "times include copying inputs and outputs through host memory; rel err = max|aotc - eager| / "
        "max|eager|; build s includes tuning and validation"
    )
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
