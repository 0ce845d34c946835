"""A package is checked completely before its code runs: the manifest must match the plan the kernel
library carries in its `.aotc_plan` section, that plan must be self-consistent, and the library's own
defined symbols are the only ones called. Hostile packages run in a child process (tests.package_runner)."""

from __future__ import annotations

import hashlib
import json
import re
import zipfile

import aotc_runtime
import aotc_runtime.package as rtpackage
import numpy as np
import pytest
from aotc_runtime import PackageError

from aotc.package import describe_package, write_package
from tests.package_runner import PackageRunner, fingerprint
from tests.test_package import SHAPE, tiny_spec


@pytest.fixture(scope="module")
def cache_env(tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("runtime-cache"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AOTC_RUNTIME_CACHE", cache)
        yield {"AOTC_RUNTIME_CACHE": cache}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, cache_env):
    """(package path, inputs .npz path, the fingerprint of its outputs)."""
    root = tmp_path_factory.mktemp("trust")
    path = str(root / "tiny.aotc")
    write_package(tiny_spec(), path)
    x = np.random.default_rng(1).standard_normal(SHAPE).astype("float32")
    inputs = str(root / "inputs.npz")
    np.savez(inputs, x=x)
    return path, inputs, fingerprint(aotc_runtime.load(path).run({"x": x}))


@pytest.fixture(scope="module")
def runner(cache_env):
    with PackageRunner(env=cache_env) as r:
        yield r


def rezip(src: str, dst: str, edit=None, members: dict | None = None, extra=(), rehash: bool = False) -> str:
    """Copy package `src` to `dst` with `edit(manifest)` applied to its manifest, member bytes replaced
    by `members` (their manifest sha256/size updated when `rehash`) and `extra` (name, bytes) appended."""
    members = members or {}
    with zipfile.ZipFile(src) as zin:
        manifest = json.loads(zin.read("manifest.json"))
        data = {i.filename: members.get(i.filename, zin.read(i)) for i in zin.infolist()}
    if rehash:
        for name in members:
            manifest["members"][name] = {
                "sha256": hashlib.sha256(members[name]).hexdigest(),
                "size": len(members[name]),
            }
    if edit is not None:
        edit(manifest)
    data["manifest.json"] = json.dumps(manifest, indent=2).encode()
    with zipfile.ZipFile(dst, "w") as zout:
        for name, blob in list(data.items()) + list(extra):
            zout.writestr(name, blob)
    return dst


def setter(*path_and_value):
    *keys, value = path_and_value

    def edit(m: dict) -> None:
        for k in keys[:-1]:
            m = m[k]
        m[keys[-1]] = value

    return edit


# ----------------------------------------------------------------------------- the tester's cases


TESTER_CASES = {
    "output shape": (
        setter("outputs", 0, "shape", [1, 1]),
        r"manifest.json outputs\[0\].shape is \[1, 1\] but the kernel library was compiled for \[4, 8\]",
    ),
    "workspace 0": (
        setter("memory_plan", "workspace_bytes", 0),
        r"manifest.json memory_plan.workspace_bytes is 0 but the kernel library was compiled for 192",
    ),
    "input shape": (setter("inputs", 0, "shape", [4, 9]), r"manifest.json inputs\[0\].shape is \[4, 9\]"),
    "input dtype": (
        setter("inputs", 0, "dtype", "float64"),
        r"manifest.json inputs\[0\].dtype is \"float64\"",
    ),
    "plan offset": (
        setter("execution_plan", 1, "args", 0, "offset", 1 << 40),
        r"manifest.json execution_plan\[1\].args\[0\].offset is 1099511627776 but the kernel library was compiled for 64",
    ),
    "entry abort": (
        setter("entry", "abort"),
        r"manifest.json entry is \"abort\" but the kernel library was compiled for \"aotc_run\"",
    ),
    "weights nbytes": (setter("weights", "nbytes", 1 << 20), r"manifest.json weights.nbytes is 1048576 but"),
    "kernel renamed": (
        setter("execution_plan", 0, "kernel", "free"),
        r"execution_plan\[0\].kernel is \"free\"",
    ),
}


@pytest.mark.parametrize("case", sorted(TESTER_CASES))
def test_a_manifest_that_lies_is_refused_before_any_code_runs(tiny, runner, tmp_path, case):
    path, inputs, _ = tiny
    edit, message = TESTER_CASES[case]
    bad = rezip(path, str(tmp_path / "bad.aotc"), edit)
    report = runner.attempt(bad, inputs)
    assert report["status"] == "PackageError", report
    assert "bad.aotc" in report["message"]
    assert re.search(message, report["message"]), report["message"]


@pytest.mark.parametrize("case", sorted(TESTER_CASES))
def test_inspect_does_not_call_a_lying_package_intact(tiny, tmp_path, case):
    path, _, _ = tiny
    bad = rezip(path, str(tmp_path / "bad.aotc"), TESTER_CASES[case][0])
    with pytest.raises(PackageError, match=TESTER_CASES[case][1]):
        describe_package(bad)


def test_an_unmodified_package_runs_in_the_child_as_in_process(tiny, runner):
    path, inputs, expected = tiny
    report = runner.attempt(path, inputs)
    assert report == {"status": "ok", "outputs": expected, "profiled": expected}


def test_informational_fields_may_change(tiny, runner, tmp_path):
    path, inputs, expected = tiny

    def edit(m: dict) -> None:
        m["name"] = "renamed"
        m["provenance"]["model"] = "other.onnx"
        m["kernels"][0]["task"] = "something else"

    report = runner.attempt(rezip(path, str(tmp_path / "ok.aotc"), edit), inputs)
    assert report["status"] == "ok" and report["outputs"] == expected


# ----------------------------------------------------------------------------- format version, digest, members


def test_format_1_is_refused_with_a_rebuild_hint(tiny, tmp_path):
    path, _, _ = tiny
    old = rezip(path, str(tmp_path / "old.aotc"), setter("format_version", 1))
    with pytest.raises(
        PackageError, match="old.aotc: package format 1 predates plan checks; rebuild it with this aotc"
    ):
        aotc_runtime.load(old)
    assert aotc_runtime.FORMAT_VERSION == 2


def test_digest_is_the_sha256_of_manifest_json(tiny):
    path, _, _ = tiny
    with zipfile.ZipFile(path) as zf:
        expected = hashlib.sha256(zf.read("manifest.json")).hexdigest()
    assert aotc_runtime.verify_package(path).digest == expected
    assert rtpackage.read_package(path).digest == expected
    assert f"digest        sha256:{expected}" in describe_package(path)


def test_signature_json_is_the_one_unlisted_member_allowed(tiny, tmp_path):
    path, _, _ = tiny
    signed = rezip(path, str(tmp_path / "signed.aotc"), extra=[("signature.json", b'{"anything": 1}')])
    assert aotc_runtime.verify_package(signed).signature == b'{"anything": 1}'
    assert aotc_runtime.verify_package(path).signature is None
    assert "signature     none (unsigned)" in describe_package(path)
    other = rezip(path, str(tmp_path / "other.aotc"), extra=[("signature.txt", b"x")])
    with pytest.raises(PackageError, match="member signature.txt is not listed"):
        aotc_runtime.verify_package(other)
