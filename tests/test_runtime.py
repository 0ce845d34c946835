"""aotc_runtime: loading, verification and running of packages written by aotc.package."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import struct
import subprocess
import sys
import zipfile

import aotc_runtime
import aotc_runtime.package as rtpackage
import numpy as np
import pytest
from aotc_runtime import PackageError

from aotc.codegen.entry import BufferRef, KernelCall
from aotc.ir.expr import Buffer, Load, Var, const
from aotc.ir.stmt import BufferStore, For, ForKind, PrimFunc, seq
from aotc.package import IOSpec, PackageSpec, write_package
from tests.concurrency import failures_in_threads
from tests.test_package import HOST, SHAPE, failing_kernel, tiny_reference, tiny_spec

RUNTIME_DIR = pathlib.Path(__file__).parent.parent / "runtime"


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AOTC_RUNTIME_CACHE", str(tmp_path_factory.mktemp("runtime-cache")))
        yield


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("rt") / "tiny.aotc")
    write_package(tiny_spec(), path)
    return path


@pytest.fixture(scope="module")
def tiny_model(tiny_path):
    return aotc_runtime.load(tiny_path)


def x_input(seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(SHAPE).astype("float32")


# ----------------------------------------------------------------------------- running


def test_run_matches_numpy(tiny_model):
    x = x_input()
    y = tiny_model.run({"x": x})["y"]
    np.testing.assert_allclose(y, tiny_reference(x), rtol=1e-6)
    np.testing.assert_allclose(tiny_model.run([x])["y"], y)
    assert tiny_model.run([x])["y"] is not y


def test_run_command_writes_outputs_or_says_why_not(tiny_path, tmp_path):
    """`python -m aotc_runtime run`, what an emulated device's Python runs: outputs to an .npz, or exit 1
    with the runtime's reason (here a missing input)."""
    x = x_input()
    np.savez(tmp_path / "in.npz", x=x)
    env = {**os.environ, "PYTHONPATH": str(RUNTIME_DIR)}
    cmd = [
        sys.executable,
        "-m",
        "aotc_runtime",
        "run",
        tiny_path,
        str(tmp_path / "in.npz"),
        str(tmp_path / "out.npz"),
    ]
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    with np.load(tmp_path / "out.npz") as out:
        np.testing.assert_allclose(out["y"], tiny_reference(x), rtol=1e-6)
    np.savez(tmp_path / "in.npz", z=x)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert (
        proc.returncode == 1 and proc.stderr.startswith("error: ") and "unknown input 'z'" in proc.stderr
    ), proc.stderr


def test_model_description(tiny_model):
    assert tiny_model.inputs == [aotc_runtime.TensorInfo("x", (4, 8), np.dtype("float32"))]
    assert [t.name for t in tiny_model.outputs] == ["y"]
    assert tiny_model.manifest["name"] == "tiny"
    assert "tiny" in repr(tiny_model) and "x: float32[4, 8]" in repr(tiny_model)


def increment_kernel(n: int = 16) -> PrimFunc:
    """x[i] += 1; y[i] = x[i]: it writes its input, so a caller can see whether it got the user's array."""
    x, y = Buffer("x", "float32", (n,)), Buffer("y", "float32", (n,))
    i = Var("i")
    body = For(
        i,
        const(n),
        n,
        ForKind.SERIAL,
        seq(BufferStore(x, Load(x, (i,)) + 1.0, (i,)), BufferStore(y, Load(x, (i,)), (i,))),
    )
    return PrimFunc("k_inc", (x, y), body)


def single_kernel_package(tmp_path, kernel: PrimFunc, n: int, name: str) -> str:
    path = str(tmp_path / f"{name}.aotc")
    spec = PackageSpec(
        name=name,
        target=HOST,
        inputs=[IOSpec("x", (n,), "float32")],
        outputs=[IOSpec("y", (n,), "float32")],
        kernels=[kernel],
        calls=[KernelCall(kernel.name, (BufferRef("input", 0), BufferRef("output", 0)))],
    )
    write_package(spec, path)
    return path


def test_contiguous_inputs_are_not_copied(tmp_path):
    model = aotc_runtime.load(single_kernel_package(tmp_path, increment_kernel(), 16, "inc"))
    x = np.arange(16, dtype="float32")
    y = model.run({"x": x})["y"]
    np.testing.assert_array_equal(x, np.arange(16) + 1)
    np.testing.assert_array_equal(y, x)
    base = np.arange(32, dtype="float32")
    strided = base[::2]
    y = model.run([strided])["y"]
    np.testing.assert_array_equal(base, np.arange(32))
    np.testing.assert_array_equal(y, np.arange(0, 32, 2) + 1)


def test_preallocated_outputs_are_filled_in_place(tiny_model):
    x = x_input()
    out = np.full(SHAPE, np.nan, "float32")
    result = tiny_model.run({"x": x}, outputs={"y": out})
    assert result["y"] is out
    np.testing.assert_allclose(out, tiny_reference(x), rtol=1e-6)


@pytest.mark.parametrize(
    "outputs, error, message",
    [
        ({"z": np.zeros(SHAPE, "float32")}, ValueError, "unknown output 'z'; expected outputs: y"),
        ({"y": np.zeros(SHAPE, "float64")}, ValueError, "output 'y': expected dtype float32, got float64"),
        ({"y": np.zeros((8, 4), "float32").T}, ValueError, "must be C-contiguous"),
    ],
)
def test_bad_preallocated_outputs(tiny_model, outputs, error, message):
    with pytest.raises(error, match=message):
        tiny_model.run({"x": x_input()}, outputs=outputs)


def test_output_overlapping_an_input_is_refused(tiny_model):
    x = x_input()
    with pytest.raises(ValueError, match="output 'y' overlaps 'x'"):
        tiny_model.run({"x": x}, outputs={"y": x})


@pytest.mark.parametrize(
    "feeds, error, message",
    [
        ({"x": np.zeros((4, 7), "float32")}, ValueError, r"input 'x': expected shape \(4, 8\), got \(4, 7\)"),
        ({"x": np.zeros(SHAPE, "float64")}, ValueError, "input 'x': expected dtype float32, got float64"),
        ({"input": np.zeros(SHAPE, "float32")}, ValueError, "unknown input 'input'; expected inputs: x"),
        ({}, ValueError, "missing input 'x'; expected inputs: x"),
        ({"x": np.zeros(SHAPE, "float32"), "z": 1}, ValueError, "unknown input 'z'"),
        ([], ValueError, r"expected 1 inputs \(x\), got 0"),
        ({"x": [[0.0] * 8] * 4}, TypeError, "input 'x': expected a numpy.ndarray, got list"),
        (np.zeros(SHAPE, "float32"), TypeError, "inputs must be a dict"),
    ],
)
def test_bad_inputs_are_refused(tiny_model, feeds, error, message):
    with pytest.raises(error, match=message):
        tiny_model.run(feeds)


def test_kernel_failure_raises_runtime_error(tmp_path):
    model = aotc_runtime.load(single_kernel_package(tmp_path, failing_kernel(n=8), 8, "fails"))
    with pytest.raises(RuntimeError, match="failed with status 1"):
        model.run([np.zeros(8, "float32")])


def test_concurrent_runs_are_correct(tiny_model):
    def check(seed: int) -> bool:
        inputs = [x_input(seed * 100 + k) for k in range(30)]
        return all(np.allclose(tiny_model.run([x])["y"], tiny_reference(x)) for x in inputs)

    assert failures_in_threads(check, 4) == []


def test_num_threads(tiny_path):
    model = aotc_runtime.load(tiny_path, num_threads=1)
    assert model.num_threads == 1
    model.num_threads = 2
    assert model.num_threads == 2
    for bad in (0, -1, 1.5, True, len(os.sched_getaffinity(0)) + 1, 100000):
        with pytest.raises(ValueError, match="num_threads must be an int from 1 to"):
            model.num_threads = bad


def test_num_threads_is_per_model_and_per_call(tiny_path):
    """Two models of one package share its kernel library; each keeps its own team (it was one
    setting per library), and a call may ask for its own."""
    first = aotc_runtime.load(tiny_path, num_threads=1)
    second = aotc_runtime.load(tiny_path, num_threads=2)
    assert (first.num_threads, second.num_threads) == (1, 2)
    x = x_input(7)
    for model in (first, second):
        np.testing.assert_allclose(
            model.run([x], num_threads=1)["y"], tiny_reference(x), rtol=1e-5, atol=1e-6
        )
    assert (first.num_threads, second.num_threads) == (1, 2)
    with pytest.raises(ValueError, match="num_threads"):
        first.run([x], num_threads=len(os.sched_getaffinity(0)) + 1)


def test_benchmark(tiny_model):
    stats = tiny_model.benchmark(repeat=3, number=5, warmup=1)
    assert stats["repeat"] == 3 and stats["number"] == 5
    assert 0 < stats["min_ms"] <= stats["median_ms"] <= stats["max_ms"]
    auto = tiny_model.benchmark(inputs={"x": x_input()}, repeat=2, min_repeat_ms=1.0)
    assert auto["number"] >= 1 and auto["mean_ms"] > 0


def test_profile_times_each_call_and_computes_what_run_computes(tiny_model):
    x = x_input(3)
    y = np.full(SHAPE, np.nan, np.float32)
    calls = tiny_model.profile({"x": x}, outputs={"y": y}, repeat=4, warmup=1)
    np.testing.assert_allclose(y, tiny_reference(x), rtol=1e-6)
    assert [(c.index, c.kernel, c.task) for c in calls] == [(0, "k_add", "add"), (1, "k_relu", "relu")]
    assert all(0 < c.min_ms <= c.median_ms and c.alone_ms is None for c in calls)
    seeded = np.full(SHAPE, np.nan, np.float32)
    tiny_model.profile(outputs={"y": seeded}, repeat=1, warmup=0, seed=5)
    np.testing.assert_allclose(seeded, tiny_reference(tiny_model.random_inputs(5)[0]), rtol=1e-6)


def test_profile_alone_times_each_call_back_to_back_and_still_computes_the_outputs(tiny_model):
    x = x_input(4)
    y = np.full(SHAPE, np.nan, np.float32)
    calls = tiny_model.profile({"x": x}, outputs={"y": y}, repeat=3, warmup=1, alone=True)
    np.testing.assert_allclose(y, tiny_reference(x), rtol=1e-6)
    assert all(c.alone_ms is not None and c.alone_ms > 0 for c in calls)


def test_profile_reports_a_failing_kernel(tmp_path):
    model = aotc_runtime.load(single_kernel_package(tmp_path, failing_kernel(n=8), 8, "fails"))
    with pytest.raises(RuntimeError, match="failed with status 1"):
        model.profile(repeat=1, warmup=0)


# ----------------------------------------------------------------------------- library cache


def test_library_is_cached_by_sha256_and_repaired(tiny_path, tmp_path, monkeypatch):
    monkeypatch.setenv("AOTC_RUNTIME_CACHE", str(tmp_path))
    sha = aotc_runtime.read_manifest(tiny_path)["members"]["lib/model.so"]["sha256"]
    cached = tmp_path / f"{sha}.so"
    cached.write_bytes(b"garbage left by someone else")
    model = aotc_runtime.load(tiny_path)
    assert sorted(os.listdir(tmp_path)) == [cached.name]
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == sha
    x = x_input()
    np.testing.assert_allclose(model.run([x])["y"], tiny_reference(x), rtol=1e-6)
    stamp = cached.stat().st_mtime_ns
    aotc_runtime.load(tiny_path)
    assert cached.stat().st_mtime_ns == stamp


# ----------------------------------------------------------------------------- refusing bad files


def rewrite(src: str, dst: str, members: dict | None = None, manifest: dict | None = None, drop=()) -> str:
    """Copy package `src` to `dst`, replacing member data and manifest keys (zip CRCs stay valid)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            if info.filename in drop:
                continue
            data = zin.read(info)
            if info.filename == "manifest.json" and manifest:
                data = json.dumps({**json.loads(data), **manifest}).encode()
            data = (members or {}).get(info.filename, data)
            zout.writestr(info, data)
    return dst


def flip_byte_in_place(path: str, member: str, at: int = 100) -> None:
    """Change one byte of a stored member's data inside the zip file itself (its CRC no longer matches)."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(member)
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = struct.unpack("<HH", f.read(4))
        f.seek(info.header_offset + 30 + name_len + extra_len + at)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_flipped_byte_fails_the_zip_crc(tiny_path, tmp_path):
    bad = tmp_path / "bad.aotc"
    bad.write_bytes(pathlib.Path(tiny_path).read_bytes())
    flip_byte_in_place(str(bad), "lib/model.so")
    with pytest.raises(
        PackageError, match=r"bad.aotc: member lib/model.so is corrupted \(zip CRC mismatch\)"
    ):
        aotc_runtime.load(str(bad))


def test_changed_member_fails_the_sha256(tiny_path, tmp_path):
    with zipfile.ZipFile(tiny_path) as zf:
        lib = bytearray(zf.read("lib/model.so"))
    lib[100] ^= 0xFF
    bad = rewrite(tiny_path, str(tmp_path / "bad.aotc"), members={"lib/model.so": bytes(lib)})
    with pytest.raises(PackageError, match=r"member lib/model.so is corrupted \(sha256 mismatch\)"):
        aotc_runtime.load(bad)
    with pytest.raises(PackageError, match="sha256 mismatch"):
        aotc_runtime.verify_package(bad)


def test_truncated_file(tiny_path, tmp_path):
    data = pathlib.Path(tiny_path).read_bytes()
    bad = tmp_path / "cut.aotc"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(PackageError, match=r"cut.aotc is truncated or damaged"):
        aotc_runtime.load(str(bad))


def test_not_a_zip(tmp_path):
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"\x08\x07\x12\x07pytorch" * 10)
    with pytest.raises(PackageError, match=r"model.onnx is not an aotc package \(not a zip file\)"):
        aotc_runtime.load(str(bad))
    assert issubclass(PackageError, ValueError)


def test_foreign_zip(tmp_path):
    bad = str(tmp_path / "other.zip")
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("readme.txt", "hello")
    with pytest.raises(PackageError, match=r"other.zip is not an aotc package \(foreign file"):
        aotc_runtime.load(bad)
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("manifest.json", json.dumps({"format": "something-else"}))
    with pytest.raises(PackageError, match="foreign file: manifest.json has format 'something-else'"):
        aotc_runtime.load(bad)


def test_newer_format_version(tiny_path, tmp_path):
    bad = rewrite(tiny_path, str(tmp_path / "new.aotc"), manifest={"format_version": 3})
    message = r"package format version 3 is newer than this runtime supports \(2\); upgrade aotc-runtime"
    with pytest.raises(PackageError, match=message):
        aotc_runtime.load(bad)


def test_missing_and_unlisted_members(tiny_path, tmp_path):
    bad = rewrite(tiny_path, str(tmp_path / "missing.aotc"), drop=("weights.bin",))
    with pytest.raises(PackageError, match="member weights.bin is missing"):
        aotc_runtime.load(bad)
    extra = rewrite(tiny_path, str(tmp_path / "extra.aotc"))
    with zipfile.ZipFile(extra, "a") as zf:
        zf.writestr("payload.sh", "echo hi")
    with pytest.raises(PackageError, match="member payload.sh is not listed"):
        aotc_runtime.load(extra)


def test_a_manifest_claiming_another_architecture_is_refused(tiny_path, tmp_path):
    other = "aarch64-unknown-linux-gnu" if rtpackage.host_arch() != "aarch64" else "x86_64-unknown-linux-gnu"
    bad = rewrite(tiny_path, str(tmp_path / "arm.aotc"), manifest={"triple": other})
    with pytest.raises(
        PackageError, match=rf"arm.aotc: its kernel library is {rtpackage.host_arch()} code but"
    ):
        aotc_runtime.load(bad)


def test_missing_cpu_features_are_refused(tiny_path, monkeypatch):
    requires = aotc_runtime.read_manifest(tiny_path)["requires"]
    if not requires:
        pytest.skip("the host target uses no CPU extension")
    monkeypatch.setattr(rtpackage, "_host_cpu_flags", lambda: set())
    with pytest.raises(
        PackageError, match=f"needs CPU features this host lacks: {', '.join(requires)} \\(target"
    ):
        aotc_runtime.load(tiny_path)
    monkeypatch.setattr(rtpackage, "_host_cpu_flags", lambda: None)
    with pytest.raises(PackageError, match=r"this host's cannot be read"):
        aotc_runtime.load(tiny_path)


def test_unknown_cpu_features_are_refused(tiny_path, monkeypatch):
    requires = aotc_runtime.read_manifest(tiny_path)["requires"]
    if not requires:
        pytest.skip("the host target uses no CPU extension")
    arch = rtpackage.host_arch()
    older = {k: v for k, v in rtpackage.CPU_FLAGS[arch].items() if k != requires[0]}
    monkeypatch.setitem(rtpackage.CPU_FLAGS, arch, older)
    with pytest.raises(
        PackageError, match=f"requires CPU features this runtime does not know for {arch}: {requires[0]} "
    ):
        aotc_runtime.load(tiny_path)


def test_missing_file_is_a_plain_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        aotc_runtime.load(str(tmp_path / "nope.aotc"))


# ----------------------------------------------------------------------------- independence


def test_runtime_imports_nothing_from_aotc():
    for source in (RUNTIME_DIR / "aotc_runtime").glob("*.py"):
        for line in source.read_text().splitlines():
            words = line.split()
            if words[:1] in (["import"], ["from"]) and len(words) > 1:
                assert words[1].split(".")[0] != "aotc", f"{source.name}: {line}"
    code = "import sys, aotc_runtime; print(sorted(m for m in sys.modules if m.split('.')[0] == 'aotc'))"
    env = {**os.environ, "PYTHONPATH": str(RUNTIME_DIR)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "[]"


def test_random_inputs_of_a_scalar_bool_are_arrays(tmp_path):
    """A 0-d bool input's random value is a 0-d array, which run() takes (a numpy bool scalar was refused,
    and every build of such a model failed timing its package; found by the ONNX fuzz test)."""
    import onnx
    from onnx import TensorProto, helper

    import aotc

    graph = helper.make_graph(
        [helper.make_node("Not", ["x"], ["y"])],
        "not",
        [helper.make_tensor_value_info("x", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.BOOL, [])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "not.onnx")
    package = aotc.compile(tmp_path / "not.onnx", output=tmp_path / "not.aotc")
    loaded = aotc_runtime.load(str(package.path))
    (x,) = loaded.random_inputs(0)
    assert isinstance(x, np.ndarray) and x.shape == () and x.dtype == np.bool_
    assert loaded.run({"x": x})["y"] == ~x
