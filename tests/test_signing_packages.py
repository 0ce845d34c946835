"""Signed packages and bundles end to end: `write_package(sign_key=)` / `aotc build --sign`, the
runtime's policy in `aotc_runtime.load`, `aotc inspect`, and `aotc hub export --sign` / `hub import`."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import aotc_runtime
import numpy as np
import pytest
from aotc_runtime import PackageError, SignatureError

from aotc.cli import main
from aotc.hub import BundleError, read_bundle
from aotc.hub.bundle import export_bundle
from aotc.hub.store import TargetKey
from aotc.package import describe_package, write_package
from aotc.signing import generate_keypair
from tests.test_package import SHAPE, tiny_spec
from tests.test_package_trust import rezip
from tests.test_records_fuzz import SKX, measured

pytest.importorskip("cryptography")


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    root = tmp_path_factory.mktemp("keys")
    team = generate_keypair(root / "team.pem")
    other = generate_keypair(root / "other.pem")
    return {"team": team[0], "team_pub": team[1], "other": other[0], "other_pub": other[1]}


@pytest.fixture(scope="module")
def packages(tmp_path_factory, keys):
    root = tmp_path_factory.mktemp("signed")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AOTC_RUNTIME_CACHE", str(root / "cache"))
        signed, unsigned = str(root / "signed.aotc"), str(root / "unsigned.aotc")
        write_package(tiny_spec(), signed, sign_key=keys["team"])
        write_package(tiny_spec(), unsigned)
        yield {"signed": signed, "unsigned": unsigned, "root": root}


@pytest.fixture(autouse=True)
def no_policy_env(monkeypatch, packages):
    monkeypatch.delenv("AOTC_TRUSTED_KEYS", raising=False)
    monkeypatch.delenv("AOTC_REQUIRE_SIGNATURE", raising=False)
    monkeypatch.setenv("AOTC_RUNTIME_CACHE", str(packages["root"] / "cache"))


def run_once(path: str, **policy) -> np.ndarray:
    x = np.ones(SHAPE, np.float32)
    return next(iter(aotc_runtime.load(path, **policy).run({"x": x}).values()))


def test_signed_package_loads_with_its_key_and_is_refused_with_another(packages, keys):
    want = run_once(packages["unsigned"])
    got = run_once(packages["signed"], trusted_keys=[keys["team_pub"]], require_signature=True)
    np.testing.assert_array_equal(got, want)
    with pytest.raises(SignatureError, match="untrusted signature .*not among the trusted keys"):
        aotc_runtime.load(packages["signed"], trusted_keys=[keys["other_pub"]])


def test_require_signature_refuses_unsigned_and_env_sets_the_policy(packages, keys, monkeypatch):
    run_once(packages["unsigned"])  # unsigned loads by default
    with pytest.raises(PackageError, match="not signed and a signature is required"):
        aotc_runtime.load(packages["unsigned"], require_signature=True)
    monkeypatch.setenv("AOTC_REQUIRE_SIGNATURE", "1")
    monkeypatch.setenv("AOTC_TRUSTED_KEYS", str(keys["team_pub"]))
    with pytest.raises(PackageError, match="not signed"):
        aotc_runtime.load(packages["unsigned"])
    run_once(packages["signed"])


def test_a_swapped_library_with_recomputed_checksums_is_refused_when_signatures_matter(
    packages, keys, tmp_path
):
    """The tester replaced lib/model.so and recomputed its checksum: the manifest then changes, so the
    signature over its digest no longer verifies."""
    with zipfile.ZipFile(packages["signed"]) as zf:
        lib = bytearray(zf.read("lib/model.so"))
    lib[-1] ^= 0xFF  # past every section the runtime checks: only the signature can notice
    swapped = rezip(
        packages["signed"], str(tmp_path / "swapped.aotc"), members={"lib/model.so": bytes(lib)}, rehash=True
    )
    with pytest.raises(SignatureError, match="invalid signature.*covers digest"):
        aotc_runtime.load(swapped, trusted_keys=[keys["team_pub"]])
    with pytest.raises(SignatureError, match="invalid signature"):
        aotc_runtime.load(swapped)  # an invalid signature is refused even with no policy
    with zipfile.ZipFile(swapped) as zin, zipfile.ZipFile(tmp_path / "stripped.aotc", "w") as zout:
        for info in zin.infolist():
            if info.filename != "signature.json":
                zout.writestr(info.filename, zin.read(info))
    with pytest.raises(SignatureError, match="not signed and trusted keys were given"):
        aotc_runtime.load(str(tmp_path / "stripped.aotc"), trusted_keys=[keys["team_pub"]])


def test_a_forged_signature_block_is_invalid(packages, keys, tmp_path):
    with zipfile.ZipFile(packages["signed"]) as zf:
        block = json.loads(zf.read("signature.json"))
        manifest = zf.read("manifest.json")
    block["signature"] = ("0" if block["signature"][0] != "0" else "1") + block["signature"][1:]
    assert block["digest"] == "sha256:" + hashlib.sha256(manifest).hexdigest()
    forged = str(tmp_path / "forged.aotc")
    with zipfile.ZipFile(packages["signed"]) as zin, zipfile.ZipFile(forged, "w") as zout:
        for info in zin.infolist():
            data = json.dumps(block).encode() if info.filename == "signature.json" else zin.read(info)
            zout.writestr(info.filename, data)
    with pytest.raises(SignatureError, match="does not verify"):
        aotc_runtime.load(forged, trusted_keys=[keys["team_pub"]])
    assert "INVALID" in describe_package(forged)
    assert main(["inspect", forged]) == 1  # shown in full, but not "ok" for a script


def test_inspect_names_the_signature_state(packages, keys, capsys):
    assert "none (unsigned)" in describe_package(packages["unsigned"])
    assert "integrity only" in describe_package(packages["signed"])
    text = describe_package(packages["signed"], trusted_keys=[str(keys["team_pub"])])
    assert "verified" in text and "(trusted)" in text
    assert main(["inspect", packages["signed"], "--trusted-key", str(keys["other_pub"])]) == 0
    assert "NOT among the trusted keys" in capsys.readouterr().out


def test_build_with_an_unusable_key_fails_before_any_work(tmp_path, keys, capsys):
    model = Path(__file__).resolve().parents[1] / "recipes" / "models" / "mlp.onnx"
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"model: {model}\ninputs:\n  input: {{shape: [1, 64], dtype: float32}}\n"
        f"target: llvm\noutput: {tmp_path / 'mlp.aotc'}\n"
    )
    assert main(["build", str(recipe), "--sign", str(tmp_path / "nokey.pem")]) == 2
    assert "cannot read it" in capsys.readouterr().err
    assert main(["build", str(recipe), "--sign", str(keys["team_pub"])]) == 2
    assert "is a public key" in capsys.readouterr().err
    assert not (tmp_path / "mlp.aotc").exists()
    assert main(["build", str(recipe), "--sign", str(keys["team"])]) == 0
    assert "signature     valid" in describe_package(str(tmp_path / "mlp.aotc"))


# ----------------------------------------------------------------------------- bundles


def signed_bundle(tmp_path, key) -> str:
    out = str(tmp_path / "team.tophub")
    export_bundle([measured(3e-5, 2)], TargetKey.of(SKX), out, sign_key=key)
    return out


def test_bundle_signature_is_checked_on_import(tmp_path, keys):
    path = signed_bundle(tmp_path, keys["team"])
    bundle = read_bundle(path, trusted_keys=[keys["team_pub"]], require_signature=True)
    assert bundle.signature.startswith("verified") and len(bundle.records) == 1
    with pytest.raises(BundleError, match="untrusted signature"):
        read_bundle(path, trusted_keys=[keys["other_pub"]])
    store = tmp_path / "store"
    rc = main(["hub", "import", path, "--store", str(store), "--trusted-key", str(keys["other_pub"])])
    assert rc == 1 and not store.exists()
    assert main(["hub", "import", path, "--store", str(store), "--trusted-key", str(keys["team_pub"])]) == 0


def test_a_bundle_edited_after_signing_is_refused(tmp_path, keys):
    path = signed_bundle(tmp_path, keys["team"])
    with zipfile.ZipFile(path) as zf:
        data = {i.filename: zf.read(i) for i in zf.infolist()}
    manifest = json.loads(data["manifest.json"])
    manifest["exported_by"] = "someone else"  # a consistent bundle, but not the one signed
    data["manifest.json"] = json.dumps(manifest).encode()
    edited = str(tmp_path / "edited.tophub")
    with zipfile.ZipFile(edited, "w") as zf:
        for name, blob in data.items():
            zf.writestr(name, blob)
    with pytest.raises(BundleError, match="invalid signature"):
        read_bundle(edited)


def test_unsigned_bundles_are_refused_when_signatures_are_required(tmp_path, keys, monkeypatch):
    path = str(tmp_path / "plain.tophub")
    export_bundle([measured(3e-5, 2)], TargetKey.of(SKX), path)
    assert read_bundle(path).signature == "unsigned"
    monkeypatch.setenv("AOTC_REQUIRE_SIGNATURE", "1")
    with pytest.raises(BundleError, match="not signed"):
        read_bundle(path)
