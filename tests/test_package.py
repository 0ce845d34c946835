"""Package writer and entry function: layout, manifest, validation, atomic writes, inspection."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import zipfile
from dataclasses import replace

import numpy as np
import pytest
from aotc_runtime import PackageError

import aotc.package as package
from aotc import te
from aotc.codegen.entry import BufferRef, KernelCall, build_entry_ir
from aotc.codegen.llvm import compile_to_object, link_shared
from aotc.ir.expr import Buffer, Load, Var, const
from aotc.ir.stmt import Allocate, BufferStore, For, ForKind, PrimFunc, seq
from aotc.package import IOSpec, PackageSpec, describe_package, layout_weights, weight_refs, write_package
from aotc.schedule.lower import lower
from aotc.schedule.state import State
from aotc.target import parse_target

HOST = parse_target("llvm")
SHAPE = (4, 8)
NBYTES = 4 * 8 * 4


def elementwise_kernel(name: str, fn, arity: int, shape=SHAPE, dtype="float32") -> PrimFunc:
    """A PrimFunc lowered from a TE compute: params are `arity` placeholders, then the output."""
    phs = [te.placeholder(shape, dtype, f"p{i}") for i in range(arity)]
    out = te.compute(shape, lambda i, j: fn(*(p[i, j] for p in phs)), name)
    return lower(State.initial(te.ComputeDAG([out])), name)


def failing_kernel(name: str = "k_fail", n: int = 8) -> PrimFunc:
    """A kernel whose heap allocation (1 EiB, used by a parallel loop so it is not elided) fails."""
    a, b = Buffer("a", "float32", (n,)), Buffer("b", "float32", (n,))
    big = Buffer("big", "float32", (1 << 58,), scope="global")
    i = Var("i")
    body = Allocate(
        big,
        seq(
            For(i, const(n), n, ForKind.PARALLEL, BufferStore(big, Load(a, (i,)), (i * 1000,))),
            For(i, const(n), n, ForKind.SERIAL, BufferStore(b, Load(big, (i * 1000,)), (i,))),
        ),
    )
    return PrimFunc(name, (a, b), body)


def tiny_weights() -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [("bias", np.arange(3, dtype="float32")), ("w", rng.standard_normal(SHAPE).astype("float32"))]


def tiny_spec(name: str = "tiny", **overrides) -> PackageSpec:
    """y = relu(x + w): `k_add` writes the workspace, `k_relu` reads it and writes the output."""
    weights = tiny_weights()
    refs = weight_refs(weights)
    scratch = BufferRef("workspace", offset=64, nbytes=NBYTES)
    calls = [
        KernelCall("k_add", (BufferRef("input", 0), refs["w"], scratch)),
        KernelCall("k_relu", (scratch, BufferRef("output", 0))),
    ]
    fields = dict(
        name=name,
        target=HOST,
        inputs=[IOSpec("x", SHAPE, "float32")],
        outputs=[IOSpec("y", SHAPE, "float32")],
        kernels=[
            elementwise_kernel("k_add", lambda a, b: a + b, 2),
            elementwise_kernel("k_relu", lambda a: te.maximum(a, 0.0), 1),
        ],
        calls=calls,
        weights=weights,
        workspace_bytes=64 + NBYTES,
        memory_plan=[{"tensor": "add_out", "offset": 64, "nbytes": NBYTES}],
        kernel_info=[
            {"task": "add", "workload_key": "abc123", "schedule": "split i\nparallel i.0"},
            {"task": "relu", "workload_key": "def456"},
        ],
        provenance={"model": "tiny.onnx", "recipe": "tiny.yaml"},
    )
    fields.update(overrides)
    return PackageSpec(**fields)


def tiny_reference(x: np.ndarray) -> np.ndarray:
    return np.maximum(x + dict(tiny_weights())["w"], 0)


@pytest.fixture(scope="module")
def tiny_package(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("pkg") / "tiny.aotc")
    return path, write_package(tiny_spec(), path)


# ----------------------------------------------------------------------------- weights layout


def test_layout_weights_is_aligned_and_in_order():
    weights = [("a", np.zeros(3, "float32")), ("b", np.zeros((2, 64), "int8")), ("c", np.zeros(1, "float64"))]
    assert layout_weights(weights) == {"a": 0, "b": 64, "c": 192}
    refs = weight_refs(weights)
    assert refs["b"] == BufferRef("weight", offset=64, nbytes=128)


def test_layout_weights_rejects_duplicates():
    with pytest.raises(ValueError, match="'a' appears twice"):
        layout_weights([("a", np.zeros(1)), ("a", np.zeros(1))])


# ----------------------------------------------------------------------------- written package


def test_package_members_and_manifest(tiny_package):
    path, manifest = tiny_package
    with zipfile.ZipFile(path) as zf:
        assert sorted(zf.namelist()) == ["lib/model.so", "manifest.json", "weights.bin"]
        assert zf.getinfo("lib/model.so").compress_type == zipfile.ZIP_STORED
        assert zf.getinfo("weights.bin").compress_type == zipfile.ZIP_STORED
        assert zf.getinfo("manifest.json").compress_type == zipfile.ZIP_STORED
        assert json.loads(zf.read("manifest.json")) == manifest
        for name, entry in manifest["members"].items():
            data = zf.read(name)
            assert entry == {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        blob = zf.read("weights.bin")
    assert manifest["format"] == "aotc-package" and manifest["format_version"] == 2
    assert manifest["target"] == str(HOST) and manifest["triple"] == HOST.triple
    assert manifest["entry"] == "aotc_run"
    assert manifest["inputs"] == [{"name": "x", "shape": [4, 8], "dtype": "float32"}]
    for t in manifest["weights"]["tensors"]:
        assert t["offset"] % 64 == 0
        data = np.frombuffer(blob, t["dtype"], count=t["nbytes"] // 4, offset=t["offset"]).reshape(t["shape"])
        np.testing.assert_array_equal(data, dict(tiny_weights())[t["name"]])


def test_manifest_carries_plan_kernels_and_provenance(tiny_package):
    _, manifest = tiny_package
    spec = tiny_spec()
    # each argument's nbytes is what its kernel param was compiled for, whatever the spec said
    sized = [KernelCall(c.symbol, [replace(a, nbytes=NBYTES) for a in c.args]) for c in spec.calls]
    assert [KernelCall.from_json(c) for c in manifest["execution_plan"]] == sized
    assert [k["symbol"] for k in manifest["kernels"]] == ["k_add", "k_relu"]
    assert manifest["kernels"][0]["workload_key"] == "abc123"
    assert manifest["kernels"][1]["params"][0] == {"name": "p0", "shape": [4, 8], "dtype": "float32"}
    assert manifest["memory_plan"]["workspace_bytes"] == 64 + NBYTES
    assert manifest["memory_plan"]["buffers"] == spec.memory_plan
    prov = manifest["provenance"]
    assert prov["model"] == "tiny.onnx" and prov["aotc_version"] and prov["created_utc"].endswith("Z")


def test_big_endian_weights_are_stored_little_endian(tmp_path):
    w = np.arange(32, dtype=">f4").reshape(SHAPE)
    spec = tiny_spec(weights=[("bias", np.zeros(3, "float32")), ("w", w)])
    path = str(tmp_path / "be.aotc")
    manifest = write_package(spec, path)
    with zipfile.ZipFile(path) as zf:
        blob = zf.read("weights.bin")
    assert manifest["weights"]["tensors"][1]["dtype"] == "float32"
    np.testing.assert_array_equal(np.frombuffer(blob, "<f4", count=32, offset=64), np.arange(32))


def test_describe_package(tiny_package):
    path, _ = tiny_package
    text = describe_package(path)
    for needle in ("tiny", "integrity     ok", "x  float32  [4, 8]", "k_add", "workload_key: abc123"):
        assert needle in text
    assert "      parallel i.0" in text
    assert "lib/model.so" in text and "weights.bin" in text
    assert "model: tiny.onnx" in text and "aotc_version" in text


def test_describe_refuses_a_corrupted_package_unless_told_not_to_verify(tiny_package, tmp_path):
    path, _ = tiny_package
    bad = str(tmp_path / "bad.aotc")
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(bad, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            dst.writestr(info, data[:-1] + b"\0" if info.filename == "weights.bin" else data)
    with pytest.raises(PackageError, match=r"bad.aotc: member weights.bin is corrupted \(sha256 mismatch\)"):
        describe_package(bad)
    assert "integrity     not checked" in describe_package(bad, verify=False)


# ----------------------------------------------------------------------------- validation


def _bad_calls(spec: PackageSpec, kind: str) -> None:
    scratch = BufferRef("workspace", offset=64)
    if kind == "unknown kernel":
        spec.calls[0] = KernelCall("k_nope", spec.calls[0].args)
    elif kind == "arg count":
        spec.calls[1] = KernelCall("k_relu", (scratch,))
    elif kind == "weight bounds":
        spec.calls[0] = KernelCall("k_add", (BufferRef("input"), BufferRef("weight", offset=128), scratch))
    elif kind == "workspace bounds":
        spec.calls[1] = KernelCall("k_relu", (BufferRef("workspace", offset=128), BufferRef("output")))
    elif kind == "input index":
        spec.calls[0] = KernelCall("k_add", (BufferRef("input", 1), BufferRef("weight", offset=64), scratch))
    elif kind == "output unwritten":
        spec.outputs.append(IOSpec("z", SHAPE, "float32"))
    elif kind == "dtype":
        spec.inputs[0] = IOSpec("x", SHAPE, "float64")
    elif kind == "misaligned":
        spec.calls[1] = KernelCall("k_relu", (BufferRef("workspace", offset=66), BufferRef("output")))


@pytest.mark.parametrize(
    "kind, message",
    [
        ("unknown kernel", "no kernel named 'k_nope'"),
        ("arg count", r"1 arguments for a kernel of 2 params"),
        ("weight bounds", r"bytes \[128, 256\) lie outside the weights blob \(192 bytes\)"),
        ("workspace bounds", r"bytes \[128, 256\) lie outside the workspace \(192 bytes\)"),
        ("input index", "input index 1 is out of range"),
        ("output unwritten", "output 'z' is passed to no kernel"),
        ("dtype", "kernel expects float32, input 'x' is float64"),
        ("misaligned", "offset 66 is not a multiple"),
    ],
)
def test_write_package_rejects_inconsistent_plans(tmp_path, kind, message):
    spec = tiny_spec()
    _bad_calls(spec, kind)
    with pytest.raises(ValueError, match=message):
        write_package(spec, str(tmp_path / "x.aotc"))
    assert os.listdir(tmp_path) == []


def test_write_package_rejects_bad_metadata(tmp_path):
    with pytest.raises(ValueError, match="kernel_info has 1 entries for 2 kernels"):
        write_package(tiny_spec(kernel_info=[{}]), str(tmp_path / "x.aotc"))
    with pytest.raises(ValueError, match="provenance is not JSON-serializable"):
        write_package(tiny_spec(provenance={"x": object()}), str(tmp_path / "x.aotc"))
    with pytest.raises(ValueError, match="input/output name 'x' appears twice"):
        write_package(tiny_spec(outputs=[IOSpec("x", SHAPE, "float32")]), str(tmp_path / "x.aotc"))


# ----------------------------------------------------------------------------- atomic writes


def test_failed_link_leaves_nothing_behind(tmp_path, monkeypatch):
    def broken_link(objects, out_path, arch=None):
        raise RuntimeError("linker exploded")

    monkeypatch.setattr(package, "link_shared", broken_link)
    with pytest.raises(RuntimeError, match="linker exploded"):
        write_package(tiny_spec(), str(tmp_path / "tiny.aotc"))
    assert os.listdir(tmp_path) == []


def test_failure_mid_zip_keeps_the_old_file_and_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "tiny.aotc"
    path.write_bytes(b"previous package")

    def broken_manifest(*args):
        raise OSError("disk full")

    monkeypatch.setattr(package, "_manifest", broken_manifest)
    with pytest.raises(OSError, match="disk full"):
        write_package(tiny_spec(), str(path))
    assert os.listdir(tmp_path) == ["tiny.aotc"] and path.read_bytes() == b"previous package"


# ----------------------------------------------------------------------------- entry function


MARK_AND_FAIL_IR = """
define i32 @k_mark(ptr %args) {
  %p = load ptr, ptr %args
  %q.slot = getelementptr ptr, ptr %args, i64 1
  %q = load ptr, ptr %q.slot
  %v = load i32, ptr %p
  %w = add i32 %v, 1
  store i32 %w, ptr %q
  ret i32 0
}
define i32 @k_fail(ptr %args) {
  ret i32 7
}
"""


def test_entry_calls_in_order_and_stops_at_the_first_failure(tmp_path):
    i32 = 4
    calls = [
        KernelCall("k_mark", (BufferRef("input", 1), BufferRef("workspace", offset=8))),
        KernelCall("k_mark", (BufferRef("workspace", offset=8), BufferRef("output", 0, offset=4))),
        KernelCall("k_mark", (BufferRef("weight", offset=64), BufferRef("output", 0))),
        KernelCall("k_fail", ()),
        KernelCall("k_mark", (BufferRef("input", 0), BufferRef("output", 0))),
    ]
    entry_ir = build_entry_ir(calls, HOST, num_inputs=2, num_outputs=1)
    assert entry_ir.count('declare i32 @"k_mark"(ptr)') == 1
    objects = [compile_to_object(MARK_AND_FAIL_IR, HOST), compile_to_object(entry_ir, HOST)]
    so = str(tmp_path / "entry.so")
    link_shared(objects, so)
    run = ctypes.CDLL(so).aotc_run
    run.restype = ctypes.c_int32
    x0, x1 = np.array([100], "int32"), np.array([10], "int32")
    weights = np.zeros(32, "int32")
    weights[64 // i32] = 41
    workspace, out = np.zeros(4, "int32"), np.zeros(2, "int32")
    ptrs = (ctypes.c_void_p * 2)(x0.ctypes.data, x1.ctypes.data)
    outs = (ctypes.c_void_p * 1)(out.ctypes.data)
    assert run(ptrs, outs, ctypes.c_void_p(weights.ctypes.data), ctypes.c_void_p(workspace.ctypes.data)) == 7
    assert workspace[2] == 11 and out.tolist() == [42, 12]


def test_entry_rejects_bad_references():
    with pytest.raises(ValueError, match="output index 1 is out of range"):
        build_entry_ir([KernelCall("k", (BufferRef("output", 1),))], HOST, 1, 1)
    with pytest.raises(ValueError, match="not a usable C identifier"):
        build_entry_ir([KernelCall("aotc_run", ())], HOST, 1, 1)
    with pytest.raises(ValueError, match="buffer kind 'stack'"):
        BufferRef("stack")
