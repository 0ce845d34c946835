"""GPU packages (issue 16): aotc.package writes opencl and cuda packages, aotc_runtime verifies them as
strictly as CPU packages and runs them on an OpenCL device (PoCL on the CPU here) or an NVIDIA GPU.

Packages are built the way aotc.build does (partition, one schedule per task, lower, package_spec) from
the untuned GPU schedule (aotc.search.untuned.untuned_schedule: tiled where a stage has reuse, else one
thread per output point, the rest inlined). Tests skip, naming what is missing, without an OpenCL
platform or a CUDA compiler; the `gpu` tests run a CUDA package on a real GPU and skip where a
subprocess probe finds no driver or device.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable

import aotc_runtime
import numpy as np
import onnx
import pytest
from aotc_runtime import GPUModel, GPUUnavailable, PackageError, SignatureError, load, verify_package
from aotc_runtime.gpu import KDL_CPU, DeviceArray, DeviceBuffer, dlpack_view
from aotc_runtime.package import read_package
from aotc_runtime.plan import encode_plan

from aotc.codegen.cuda_compiler import cuda_compiler_name
from aotc.codegen.gpu import opencl_device
from aotc.execution_plan import kernel_symbol, merge_tasks, package_spec
from aotc.frontend.onnx import load_onnx
from aotc.graph.partition import extract_tasks, partition
from aotc.graph.passes import optimize
from aotc.package import describe_package, write_package
from aotc.schedule.lower import lower
from aotc.search.untuned import untuned_schedule
from aotc.signing import generate_keypair
from aotc.target import parse_target
from recipes.zoo.onnx_models import small_cnn

RTOL, ATOL = 1e-4, 1e-5
SIZE = 8  # input images SIZE x SIZE: a few thousand threads per kernel
EM_CUDA = 190

needs_opencl = pytest.mark.skipif(
    opencl_device() is None,
    reason="no OpenCL platform (pip install pyopencl; apt-get install pocl-opencl-icd)",
)
needs_cuda_compiler = pytest.mark.skipif(
    cuda_compiler_name() is None, reason="neither NVRTC (pip install 'aotc[cuda]') nor nvcc is available"
)


# ----------------------------------------------------------------------------- building packages


def gpu_package(path, target: str, batches=(1,), name: str = "cnn", sign_key=None) -> str:
    """The small CNN (conv+bn+relu, maxpool, conv+bn+relu, global pool, dense) as a GPU package with one
    variant per batch size, built as aotc.build builds packages (untuned schedules)."""
    model = path.parent / f"{name}.onnx"
    onnx.save(small_cnn(batch=batches[0], size=SIZE), model)
    variants = []
    for b in batches:
        graph = optimize(load_onnx(str(model), input_shapes={"input": ((b, 3, SIZE, SIZE), "float32")}))
        variants.append((graph, partition(graph)))
    tasks = merge_tasks([extract_tasks(groups) for _, groups in variants])
    t = parse_target(target)
    funcs = [lower(untuned_schedule(task.dag, t), kernel_symbol(i, task)) for i, task in enumerate(tasks)]
    sources = [{"schedule": "default"} for _ in tasks]
    spec = package_spec(name, variants, tasks, funcs, t, sources, [{} for _ in tasks])
    write_package(spec, str(path), sign_key=sign_key)
    return str(path)


def reference(batch: int, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(
        small_cnn(batch=batch, size=SIZE).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, {"input": x})[0]


def inputs(batch: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 3, SIZE, SIZE)).astype(np.float32)


@pytest.fixture(scope="module")
def opencl_pkg(tmp_path_factory) -> str:
    """An opencl package at batch sizes 1 and 2."""
    return gpu_package(tmp_path_factory.mktemp("gpu") / "cnn_cl.aotc", "opencl", batches=(1, 2))


@pytest.fixture(scope="module")
def opencl_model(opencl_pkg):
    if opencl_device() is None:
        pytest.skip("no OpenCL platform (pip install pyopencl; apt-get install pocl-opencl-icd)")
    model = load(opencl_pkg)
    yield model
    model.close()


@pytest.fixture(scope="module")
def cuda_pkg(tmp_path_factory) -> str:
    if cuda_compiler_name() is None:
        pytest.skip("neither NVRTC (pip install 'aotc[cuda]') nor nvcc is available")
    return gpu_package(tmp_path_factory.mktemp("gpu") / "cnn_cu.aotc", "cuda -arch=sm_90")


# ----------------------------------------------------------------------------- package format


def test_opencl_package_holds_plan_and_source(opencl_pkg):
    with zipfile.ZipFile(opencl_pkg) as zf:
        names = set(zf.namelist())
        plan = json.loads(zf.read("plan.json"))
        source = zf.read("kernels.cl").decode()
    assert names == {"manifest.json", "plan.json", "kernels.cl", "weights.bin"}
    assert plan["plan_version"] == 2 and [v["inputs"][0]["shape"][0] for v in plan["variants"]] == [1, 2]
    for kernel in plan["kernels"]:
        for launch in kernel["gpu"]["launches"]:
            block = "AOTC_BLOCK({}, {}, {})".format(*launch["block"])
            assert f"__global__ void {block} {launch['kernel']}(" in source
    checked = verify_package(opencl_pkg)
    assert checked.manifest["target"] == "opencl" and checked.plan.gpu


def test_inspect_shows_launch_shapes(opencl_pkg):
    text = describe_package(opencl_pkg)
    assert "manifest matches plan.json" in text
    assert "launch k0_" in text and "grid [" in text and "x block [128, 1, 1]" in text
    assert "kernels.cl" in text


def test_cpu_reader_refuses_a_gpu_package(opencl_pkg):
    with pytest.raises(PackageError, match="opencl GPU kernels.*aotc_runtime.load"):
        read_package(opencl_pkg)


@needs_cuda_compiler
def test_cuda_package_holds_cubin_for_the_arch_and_ptx(cuda_pkg):
    """Written on a machine without a GPU: the cubin's ELF header says sm_90, the PTX targets it."""
    with zipfile.ZipFile(cuda_pkg) as zf:
        names = set(zf.namelist())
        cubin, ptx, source = zf.read("kernels.cubin"), zf.read("kernels.ptx").decode(), zf.read("kernels.cu")
    assert names == {
        "manifest.json",
        "plan.json",
        "kernels.cubin",
        "kernels.ptx",
        "kernels.cu",
        "weights.bin",
    }
    assert cubin[:4] == b"\x7fELF" and int.from_bytes(cubin[18:20], "little") == EM_CUDA
    assert (int.from_bytes(cubin[48:52], "little") >> 8) & 0xFF == 90
    assert ".target sm_90" in ptx
    assert b'extern "C"' in source
    assert verify_package(cuda_pkg).manifest["target"] == "cuda -arch=sm_90"


def test_signed_gpu_package_and_signature_policy(opencl_pkg, tmp_path):
    """Signing works unchanged; the policy is applied before any device is opened."""
    private, public, kid = generate_keypair(tmp_path / "team.pem")
    signed = gpu_package(tmp_path / "signed.aotc", "opencl", sign_key=private)
    assert f"valid, key {kid}" in describe_package(signed)
    with pytest.raises(SignatureError):
        load(opencl_pkg, require_signature=True)
    other = generate_keypair(tmp_path / "other.pem")[1]
    with pytest.raises(SignatureError):
        load(signed, trusted_keys=[other])
    if opencl_device() is not None:
        model = load(signed, trusted_keys=[public], require_signature=True)
        assert model.run([inputs(1)])["output"].shape == (1, 10)
        model.close()


# ----------------------------------------------------------------------------- tampering


def rewrite(
    src: str, dst, plan_change: Callable[[dict], None] | None = None, members: dict | None = None
) -> str:
    """A copy of the package with plan.json changed by `plan_change` (the manifest updated to match it,
    as a consistent forgery would) and/or members replaced without updating the manifest."""
    with zipfile.ZipFile(src) as zf:
        data = {n: zf.read(n) for n in zf.namelist()}
    if plan_change is not None:
        plan = json.loads(data["plan.json"])
        plan_change(plan)
        manifest = json.loads(data["manifest.json"])
        raw = encode_plan(plan)
        manifest["members"]["plan.json"] = {"sha256": hashlib.sha256(raw).hexdigest(), "size": len(raw)}
        for k, p in zip(manifest["kernels"], plan["kernels"]):
            k["gpu"] = p["gpu"]
        if "variants" in plan:
            for mv, pv in zip(manifest["variants"], plan["variants"]):
                mv.update(pv)
            manifest["execution_plan"] = plan["variants"][0]["execution_plan"]
        else:
            manifest["execution_plan"] = plan["execution_plan"]
        data["plan.json"], data["manifest.json"] = raw, json.dumps(manifest).encode()
    data.update(members or {})
    with zipfile.ZipFile(dst, "w") as zf:
        for name, blob in data.items():
            zf.writestr(name, blob)
    return str(dst)


def _launch(plan: dict) -> dict:
    return plan["kernels"][0]["gpu"]["launches"][0]


def _first_arg(plan: dict) -> dict:
    return plan["variants"][0]["execution_plan"][0]["args"][0]


def test_tampered_members_are_refused(opencl_pkg, tmp_path):
    with zipfile.ZipFile(opencl_pkg) as zf:
        plan, source = zf.read("plan.json"), zf.read("kernels.cl")
    for member, blob in (
        ("plan.json", plan.replace(b'"block":[128', b'"block":[64')),
        ("kernels.cl", source + b" "),
    ):
        bad = rewrite(opencl_pkg, tmp_path / "bad.aotc", members={member: blob})
        with pytest.raises(PackageError, match=f"member {member} is corrupted"):
            verify_package(bad)
        with pytest.raises(PackageError, match=member):
            load(bad)  # refused before any device is opened


def test_manifest_must_equal_the_plan(opencl_pkg, tmp_path):
    with zipfile.ZipFile(opencl_pkg) as zf:
        manifest = json.loads(zf.read("manifest.json"))
    manifest["kernels"][0]["gpu"]["launches"][0]["grid"][0] += 1
    bad = rewrite(opencl_pkg, tmp_path / "bad.aotc", members={"manifest.json": json.dumps(manifest).encode()})
    with pytest.raises(PackageError, match=r"kernels\[0\].gpu.launches\[0\].grid"):
        verify_package(bad)


def _set(path: Callable[[dict], dict], key: str, value) -> Callable[[dict], None]:
    return lambda plan: path(plan).__setitem__(key, value)


@pytest.mark.parametrize(
    "change, message",
    [
        (_set(_launch, "block", [0, 1, 1]), r"block \[0, 1, 1\] must be 3 ints from 1"),
        (_set(_launch, "block", [128, 1]), "must be 3 ints"),
        (_set(_launch, "block", [64, 32, 1]), "2048 threads, more than 1024"),
        (_set(_launch, "grid", [2**31, 1, 1]), "grid .* must be 3 ints from 1 to 2147483647"),
        (_set(_launch, "grid", [1.0, 1, 1]), "grid .* must be 3 ints"),
        (_set(_launch, "args", [0, 99]), r"args \[0, 99\] index past"),
        (_set(_launch, "shared_bytes", -1), "shared_bytes -1 is not a byte count"),
        (_set(_launch, "kernel", "k1_pool2d_nhwc"), "names the GPU kernel k1_pool2d_nhwc twice"),
        (_set(lambda p: p["kernels"][0]["gpu"], "launches", []), "launches is empty"),
        (_set(lambda p: p["kernels"][0]["gpu"]["params"][0], "nbytes", 4), "params differ"),
        (_set(_first_arg, "offset", 2), "offset 2 is not a multiple of float32's size"),
        (_set(_first_arg, "offset", 1 << 20), r"covers bytes \[1048576"),
    ],
)
def test_bad_launches_and_arguments_are_refused(opencl_pkg, tmp_path, change, message):
    bad = rewrite(opencl_pkg, tmp_path / "bad.aotc", plan_change=change)
    with pytest.raises(PackageError, match=message):
        verify_package(bad)
    with pytest.raises(PackageError, match=message):
        load(bad)


def test_a_forged_but_consistent_package_still_verifies(opencl_pkg, tmp_path):
    """The rewrite helper itself keeps packages valid: the refusals above are the changes' doing."""
    same = rewrite(opencl_pkg, tmp_path / "same.aotc", plan_change=lambda plan: None)
    assert verify_package(same).plan.gpu


# ----------------------------------------------------------------------------- running on OpenCL


@needs_opencl
@pytest.mark.parametrize("batch", [1, 2])
def test_opencl_package_matches_onnxruntime(opencl_model, batch):
    x = inputs(batch, seed=batch)
    out = opencl_model.run({"input": x})
    assert list(out) == ["output"] and out["output"].shape == (batch, 10)
    np.testing.assert_allclose(out["output"], reference(batch, x), rtol=RTOL, atol=ATOL)


@needs_opencl
def test_opencl_run_fills_outputs_and_checks_inputs(opencl_model):
    assert isinstance(opencl_model, GPUModel) and opencl_model.device.kind == "opencl"
    x = inputs(1)
    given = np.full((1, 10), np.nan, np.float32)
    out = opencl_model.run([x], outputs={"output": given})
    assert out["output"] is given
    np.testing.assert_allclose(given, reference(1, x), rtol=RTOL, atol=ATOL)
    with pytest.raises(ValueError, match=r"no variant .* input\[3, 3, 8, 8\]"):
        opencl_model.run({"input": inputs(3)})
    with pytest.raises(ValueError, match="expected dtype float32, got float64"):
        opencl_model.run({"input": x.astype(np.float64)})
    with pytest.raises(ValueError, match="missing input 'input'"):
        opencl_model.run({})
    with pytest.raises(TypeError, match="run_dlpack needs a CUDA package"):
        opencl_model.run_dlpack([x])


@needs_opencl
def test_opencl_profile_times_every_call(opencl_model):
    times = opencl_model.profile(repeat=2, warmup=1)
    assert [t.kernel for t in times] == [c.kernel for c in opencl_model.variants[0].calls]
    assert all(t.median_ms > 0 and t.flops > 0 for t in times)


@needs_opencl
def test_opencl_model_benchmarks_like_a_cpu_model(opencl_model):
    from aotc_runtime.bench import Budget, benchmark

    result = benchmark(opencl_model, budget=Budget(runs=3), warmup=Budget(runs=1))
    assert result.threads == 1 and len(result.latencies_ms) == 3


@needs_opencl
def test_opencl_device_choice_by_environment(opencl_pkg, monkeypatch):
    monkeypatch.setenv("AOTC_OPENCL_DEVICE", "99")
    with pytest.raises(GPUUnavailable, match="no OpenCL device 99; the devices are 0: "):
        load(opencl_pkg)
    monkeypatch.setenv("AOTC_OPENCL_DEVICE", "first")
    with pytest.raises(GPUUnavailable, match="AOTC_OPENCL_DEVICE must be a device index"):
        load(opencl_pkg)


# ----------------------------------------------------------------------------- DLPack on the host

# the DLPack structs are the same for every device: numpy (a CPU consumer and producer) checks them


def test_device_array_exports_through_dlpack():
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    freed: list[int] = []
    exported = DeviceArray(
        None,
        DeviceBuffer(host.ctypes.data, host.nbytes),
        (3, 4),
        np.float32,
        KDL_CPU,
        0,
        lambda: freed.append(1),
    )
    taken = np.from_dlpack(exported)
    del exported
    assert freed == []  # the consumer's view keeps the buffer
    np.testing.assert_array_equal(taken, host)
    del taken
    import gc

    gc.collect()
    assert freed == [1]


def test_dlpack_view_reads_shape_dtype_and_layout():
    a = np.zeros((2, 3, 4), np.float32)
    view = dlpack_view(a)
    assert (view.shape, view.dtype, view.contiguous, view.device) == (
        (2, 3, 4),
        np.float32,
        True,
        (KDL_CPU, 0),
    )
    assert view.data_ptr == a.ctypes.data
    sliced = dlpack_view(a[:, 1:])
    assert not sliced.contiguous and sliced.data_ptr == a.ctypes.data + 4 * 4
    assert dlpack_view(np.zeros(5, bool)).dtype == np.bool_
    with pytest.raises(TypeError, match="expected a DLPack tensor"):
        dlpack_view([1, 2])


# ----------------------------------------------------------------------------- CUDA without a GPU

_PROBE = (
    "from cuda.bindings import driver as d\n"
    "try:\n    r = d.cuInit(0)[0]\nexcept Exception:\n    print('no-driver'); raise SystemExit\n"
    "print('ok' if r == d.CUresult.CUDA_SUCCESS and d.cuDeviceGetCount()[1] > 0 else 'no-device')\n"
)


def cuda_probe() -> str:
    """'ok' where a CUDA GPU answers, else why not; in a subprocess (the driver may hang or fail)."""
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "the CUDA driver probe hung"
    return proc.stdout.strip() or f"the probe failed: {proc.stderr.strip()[-200:]}"


@needs_cuda_compiler
def test_cuda_package_without_a_gpu_is_gpu_unavailable(cuda_pkg):
    """Where no driver is found, load names what is missing (in a subprocess: the driver may hang)."""
    if cuda_probe() == "ok":
        pytest.skip("a CUDA GPU is present: the gpu tests run this package")
    code = (
        "import aotc_runtime, sys\n"
        "try:\n    aotc_runtime.load(sys.argv[1])\n"
        "except aotc_runtime.GPUUnavailable as e:\n    print('unavailable:', e)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, cuda_pkg], capture_output=True, text=True, timeout=60)
    assert proc.stdout.startswith("unavailable:"), proc.stdout + proc.stderr
    assert "NVIDIA" in proc.stdout


# ----------------------------------------------------------------------------- CUDA on a GPU


@pytest.fixture(scope="module")
def cuda_model(cuda_pkg):
    why = cuda_probe()
    if why != "ok":
        pytest.skip(f"no CUDA GPU ({why})")
    model = load(cuda_pkg)
    yield model
    model.close()


@pytest.mark.gpu
def test_cuda_package_matches_onnxruntime_on_a_gpu(cuda_model):
    assert cuda_model.device.kind == "cuda"
    x = inputs(1, seed=3)
    out = cuda_model.run({"input": x})
    np.testing.assert_allclose(out["output"], reference(1, x), rtol=RTOL, atol=ATOL)
    assert all(t.median_ms > 0 for t in cuda_model.profile(repeat=3, warmup=1))


@pytest.mark.gpu
def test_cuda_run_dlpack_on_a_gpu(cuda_model):
    x = inputs(1, seed=4)
    want = reference(1, x)
    torch = pytest.importorskip("torch", reason="torch (a DLPack producer on the GPU) is not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    tx = torch.from_numpy(x).cuda()
    out = cuda_model.run_dlpack({"input": tx})["output"]
    np.testing.assert_allclose(out.numpy(), want, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(torch.from_dlpack(out).cpu().numpy(), want, rtol=RTOL, atol=ATOL)
    given = torch.empty((1, 10), device="cuda")
    assert cuda_model.run_dlpack([tx], outputs={"output": given})["output"] is given
    np.testing.assert_allclose(given.cpu().numpy(), want, rtol=RTOL, atol=ATOL)
    with pytest.raises(ValueError, match="C-contiguous"):
        cuda_model.run_dlpack([tx.transpose(2, 3)])


def test_runtime_imports_no_gpu_library_until_a_device_opens():
    """aotc_runtime imports numpy only: pyopencl and cuda.bindings load when a device is opened."""
    code = "import aotc_runtime, sys; print(sorted(m for m in sys.modules if m.startswith(('pyopencl', 'cuda'))))"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=os.environ
    )
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr


# ----------------------------------------------------------------------------- CUDA through a fake driver


class FakeDriver:
    """Just enough of cuda.bindings.driver to load and run a package without a GPU: memory is host
    memory, and each launch is recorded with its kernel parameters read back from the pointer array."""

    class CUresult:
        CUDA_SUCCESS = 0

    class CUdevice_attribute:
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = "major"
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = "minor"
        CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = "threads"

    class CUstream_flags:
        CU_STREAM_NON_BLOCKING = 1

    class CUstreamCaptureMode:
        CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1

    def __init__(self, cc: tuple[int, int]) -> None:
        self.attributes = {"major": cc[0], "minor": cc[1], "threads": 1024}
        self.memory: dict[int, np.ndarray] = {}
        self.images: list[bytes] = []
        self.launches: list[tuple] = []
        self.capturing: list[tuple] | None = None  # launches recorded into a graph, not run
        self.graphs: list[list[tuple]] = []

    def __getattr__(self, name: str):
        return lambda *args: (0,)  # every other call succeeds and returns nothing

    def cuDeviceGetCount(self):
        return 0, 1

    def cuDeviceGet(self, index):
        return 0, index

    def cuDeviceGetName(self, length, dev):
        return 0, b"Fake GPU\0"

    def cuDeviceGetAttribute(self, attr, dev):
        return 0, self.attributes[attr]

    def cuMemAlloc(self, nbytes):
        block = np.zeros(nbytes, np.uint8)
        self.memory[block.ctypes.data] = block
        return 0, block.ctypes.data

    def cuModuleLoadData(self, image):
        self.images.append(bytes(image))
        return 0, "module"

    def cuModuleGetFunction(self, module, name):
        return 0, name.decode()

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        n = 2 * len(self.current_args[fn])
        pointers = np.ctypeslib.as_array((ctypes.c_uint64 * n).from_address(params))
        values = [ctypes.c_uint64.from_address(int(p)).value for p in pointers]
        launch = (fn, (gx, gy, gz), (bx, by, bz), list(zip(values[::2], values[1::2])))
        (self.launches if self.capturing is None else self.capturing).append(launch)
        return (0,)

    def cuStreamBeginCapture(self, stream, mode):
        self.capturing = []
        return (0,)

    def cuStreamEndCapture(self, stream):
        graph, self.capturing = self.capturing, None
        return 0, graph

    def cuGraphInstantiate(self, graph, flags):
        self.graphs.append(list(graph))
        return 0, len(self.graphs) - 1

    def cuGraphLaunch(self, graph, stream):
        self.launches.extend(self.graphs[graph])
        return (0,)


@pytest.mark.parametrize("cc, image", [((9, 0), "cubin"), ((10, 0), "ptx"), ((8, 0), None)])
def test_cuda_model_through_a_fake_driver(cuda_pkg, monkeypatch, cc, image):
    """Without a GPU: the cubin on the package's arch, the NUL-terminated PTX on a newer GPU, a clear
    refusal on an older one; launches in plan order, each buffer argument a (pointer, element offset)."""
    import cuda.bindings

    fake = FakeDriver(cc)
    monkeypatch.setattr(cuda.bindings, "driver", fake)
    if image is None:
        with pytest.raises(aotc_runtime.GPUError, match="built for sm_90, but Fake GPU is sm_80"):
            load(cuda_pkg)
        return
    model = load(cuda_pkg)
    with zipfile.ZipFile(cuda_pkg) as zf:
        want = zf.read(f"kernels.{image}")
    assert fake.images == [want if image == "cubin" else want + b"\0"]
    launches = [launch for call in model.variants[0].launches for launch in call]
    fake.current_args = {name: args for name, _, _, args in launches}
    for _ in range(3):  # launched, then recorded as a graph, then the graph replayed
        model.run([inputs(1)])
    assert len(fake.graphs) == 1
    assert [launch[:3] for launch in fake.launches] == [launch[:3] for launch in launches] * 3
    weights = next(iter(fake.memory))  # the first allocation: the weights, uploaded at load
    for (_, _, _, passed), (_, _, _, planned) in zip(fake.launches, launches):
        assert len(passed) == len(planned)
        assert all(ptr in fake.memory and offset >= 0 for ptr, offset in passed)
    assert any(ptr == weights for _, _, _, passed in fake.launches for ptr, _ in passed)
    model.close()
