"""`pip install aotc` outside the checkout: the wheels declare what they need and carry the shipped records
(building both wheels and using them from a fresh venv takes about 5 s); a build whose validation has no
reference runtime says which extra to install, before any work."""

import email
import os
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import aotc.build
from aotc.api import compile
from aotc.cli import main
from aotc.hub.store import SHIPPED_STORE, shipped_store_dir, store_files
from aotc.validate import VALIDATE_EXTRA, ReferenceUnavailable, validate_package

from .onnx_util import IR_VERSION

ROOT = Path(__file__).resolve().parents[1]
PYTHON = Path(sys.executable)


def small_model(path: Path) -> Path:
    """y = relu(x @ w + b), x [1, 8]: small enough to build in seconds."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["z"])]
        + [helper.make_node("Relu", ["z"], ["y"])],
        "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    onnx.save(model, str(path))
    return path


# ----------------------------------------------------------------------------- no reference runtime


@pytest.fixture
def without_onnxruntime(monkeypatch):
    """This process as if onnxruntime were not installed (a None entry makes its import fail)."""
    monkeypatch.setitem(sys.modules, "onnxruntime", None)


def test_build_without_the_reference_runtime_fails_before_any_work(
    tmp_path, without_onnxruntime, monkeypatch
):
    def no_work(*_):
        raise AssertionError("the build loaded the model before checking for the reference runtime")

    monkeypatch.setattr(aotc.build, "load_model", no_work)
    out = tmp_path / "small.aotc"
    with pytest.raises(ReferenceUnavailable, match=r"onnxruntime.*pip install 'aotc\[validate\]'"):
        compile(small_model(tmp_path / "small.onnx"), "llvm", output=out, log=lambda _: None)
    assert not out.exists()


def test_cli_build_without_the_reference_runtime_names_the_extra(tmp_path, without_onnxruntime, capsys):
    model = small_model(tmp_path / "small.onnx")
    recipe = tmp_path / "small.yaml"
    recipe.write_text(f"model: {model}\ntarget: llvm\noutput: {tmp_path / 'small.aotc'}\n")
    assert main(["build", str(recipe)]) == 1
    err = capsys.readouterr().err
    assert VALIDATE_EXTRA in err and "validate: false" in err
    assert not (tmp_path / "small.aotc").exists()


def test_validate_without_the_reference_runtime_names_the_extra(tmp_path, without_onnxruntime):
    model = small_model(tmp_path / "small.onnx")
    package = compile(model, "llvm", output=tmp_path / "small.aotc", validate=False, log=lambda _: None)
    with pytest.raises(ReferenceUnavailable, match=r"pip install 'aotc\[validate\]'"):
        validate_package(package.path, model, {"x": ((1, 8), "float32")})


def test_build_with_validation_off_needs_no_reference_runtime(tmp_path, without_onnxruntime):
    out = tmp_path / "small.aotc"
    compile(small_model(tmp_path / "small.onnx"), "llvm", output=out, validate=False, log=lambda _: None)
    assert out.is_file()


# ----------------------------------------------------------------------------- packaging


def test_shipped_store_is_package_data(monkeypatch):
    monkeypatch.delenv("AOTC_SHIPPED_TOPHUB", raising=False)
    assert shipped_store_dir() == SHIPPED_STORE == ROOT / "aotc" / "tophub" and store_files(SHIPPED_STORE)
    assert not (ROOT / "tophub").exists(), "one location for the shipped records: aotc/tophub/"


# ----------------------------------------------------------------------------- wheels in a fresh venv


def call(*args, **kwargs) -> str:
    """Run a command; its stdout, or a failure that shows its output."""
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600, **kwargs)
    assert proc.returncode == 0, f"{' '.join(map(str, args))}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def build_sdist_and_wheel(project: Path, out: Path) -> tuple[Path, Path]:
    """The project's sdist, and its wheel built from that sdist (as pip installs an sdist), offline."""
    out.mkdir(parents=True, exist_ok=True)
    code = f"from setuptools import build_meta; print(build_meta.build_sdist({str(out)!r}))"
    name = call(PYTHON, "-c", code, cwd=project).split()[-1]
    sdist = out / name
    with tarfile.open(sdist) as tar:
        tar.extractall(out / "src", filter="data")
    source = out / "src" / name.removesuffix(".tar.gz")
    call(PYTHON, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", out, source)
    (wheel,) = out.glob(f"{name.split('-')[0]}-*.whl")
    return sdist, wheel


def wheel_metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return email.message_from_bytes(zf.read(meta))


def test_wheels_install_and_work_outside_the_checkout(tmp_path):
    """Both wheels into a fresh venv (no network: the third-party dependencies come from this venv's
    site-packages through a .pth file, aotc and aotc_runtime only from the wheels), then build, run,
    validate and list the shipped records from a directory outside the checkout."""
    wheels = tmp_path / "wheels"
    sdist, wheel = build_sdist_and_wheel(ROOT, wheels)
    runtime_sdist, runtime_wheel = build_sdist_and_wheel(ROOT / "runtime", wheels)

    meta = wheel_metadata(wheel)
    assert "aotc-runtime==0.1.0" in meta.get_all("Requires-Dist")
    assert "validate" in meta.get_all("Provides-Extra")
    assert [r for r in meta.get_all("Requires-Dist") if r.startswith("onnxruntime")] == [
        'onnxruntime>=1.18; extra == "validate"'
    ]
    runtime_needs = [r for r in wheel_metadata(runtime_wheel).get_all("Requires-Dist") if "extra ==" not in r]
    assert runtime_needs == ["numpy>=1.22"]
    shipped = sorted(p.name for p in store_files(SHIPPED_STORE))
    with zipfile.ZipFile(wheel) as zf:
        assert {f"aotc/tophub/{n}" for n in shipped} <= set(zf.namelist())
    with tarfile.open(sdist) as tar:
        names = set(tar.getnames())
    top = sdist.name.removesuffix(".tar.gz")
    assert {f"{top}/aotc/tophub/{n}" for n in shipped} | {f"{top}/README.md"} <= names

    venv = tmp_path / "venv"
    call(PYTHON, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    call(PYTHON, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", wheel, runtime_wheel)
    site = Path(call(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").strip())
    # Only after installing: pip would take the checkout's editable aotc for an installed one.
    (site / "project-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")

    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AOTC_", "PYTHON"))}
    env |= {"AOTC_HOME": str(tmp_path / "home"), "PATH": f"{venv / 'bin'}{os.pathsep}{env['PATH']}"}

    def aotc(*args: str) -> str:
        return call(venv / "bin" / "aotc", *args, cwd=work, env=env)

    where = "import aotc, aotc_runtime; print(aotc.__file__); print(aotc_runtime.__file__)"
    files = call(python, "-c", where, cwd=work, env=env).split()
    assert all(Path(f).is_relative_to(site) for f in files), files

    small_model(work / "small.onnx")
    (work / "small.yaml").write_text("model: small.onnx\ntarget: llvm\noutput: small.aotc\nvalidate: true\n")
    aotc("build", "small.yaml")
    np.save(work / "x.npy", np.ones((1, 8), np.float32))
    aotc("run", "small.aotc", "--input", "x=x.npy", "--output", "out")
    assert "ok" in aotc("validate", "small.aotc", "--model", "small.onnx")
    listing = aotc("hub", "ls").splitlines()
    shipped_line = listing.index(f"tophub:{site / 'aotc' / 'tophub'}")
    assert "workload(s)" in listing[shipped_line + 1], listing
