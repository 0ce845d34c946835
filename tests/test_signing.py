"""Ed25519 signatures of packages and bundles: keys, blocks, verification and the loading policy."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys

import pytest
from aotc_runtime.signing import (
    SignatureError,
    SignatureStatus,
    check_signature,
    enforce,
    key_id,
    load_trusted_keys,
    verify_signature,
)

from aotc.signing import SigningError, generate_keypair, sign_digest

pytest.importorskip("cryptography")

DIGEST = hashlib.sha256(b'{"format": "aotc-package"}').hexdigest()
OTHER_DIGEST = hashlib.sha256(b"another manifest").hexdigest()


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """Two key pairs: (private path, public path, key id) each."""
    d = tmp_path_factory.mktemp("keys")
    return generate_keypair(d / "alice.pem"), generate_keypair(d / "mallory.pem")


@pytest.fixture(scope="module")
def alice_block(keys):
    return sign_digest(keys[0][0], DIGEST, "package")


def trusted(*pairs):
    return load_trusted_keys([p[1] for p in pairs])


# ----------------------------------------------------------------------------- keys


def test_generate_keypair_writes_a_private_key_only_its_owner_reads_and_never_overwrites(tmp_path):
    private, public, kid = generate_keypair(tmp_path / "key.pem")
    assert public == tmp_path / "key.pub"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert private.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert list(load_trusted_keys([public])) == [kid]
    before = private.read_bytes()
    with pytest.raises(SigningError, match="already exists"):
        generate_keypair(private)
    assert private.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["key.pem", "key.pub"]


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_keys_made_by_openssl_sign_and_verify(tmp_path):
    key, pub = tmp_path / "key.pem", tmp_path / "key.pub"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", key], check=True)
    subprocess.run(["openssl", "pkey", "-in", key, "-pubout", "-out", pub], check=True)
    block = sign_digest(key, DIGEST, "package")
    status = verify_signature(json.dumps(block), DIGEST, "package", load_trusted_keys([pub]))
    assert status.state == "verified" and status.key_id == block["key_id"]


def test_trusted_keys_come_from_files_directories_and_the_environment(keys, tmp_path, monkeypatch):
    (alice_priv, alice_pub, alice_id), (_, mallory_pub, mallory_id) = keys
    directory = tmp_path / "trusted"
    directory.mkdir()
    shutil.copy(mallory_pub, directory / "m.pub")
    (directory / "notes.txt").write_text("ignored: not a .pub")
    assert set(load_trusted_keys([alice_pub, directory])) == {alice_id, mallory_id}
    monkeypatch.setenv("AOTC_TRUSTED_KEYS", os.pathsep.join([str(directory), "", str(alice_pub)]))
    assert set(load_trusted_keys(None)) == {alice_id, mallory_id}
    monkeypatch.setenv("AOTC_TRUSTED_KEYS", "")
    assert load_trusted_keys(None) == {}


@pytest.mark.parametrize(
    "content, why",
    [
        (None, "no such file"),
        ("private", "that is a private key"),
        ("-----BEGIN PUBLIC KEY-----\n!!!!\n-----END PUBLIC KEY-----\n", "not valid base64"),
        ("rsa", "not an Ed25519 public key"),
        ("empty-dir", "holds no"),
    ],
)
def test_a_bad_trusted_key_is_an_error_naming_it(keys, tmp_path, content, why):
    path = tmp_path / "bad.pub"
    if content == "private":
        shutil.copy(keys[0][0], path)
    elif content == "rsa":
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        pub = rsa.generate_private_key(public_exponent=65537, key_size=1024).public_key()
        path.write_bytes(
            pub.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )
    elif content == "empty-dir":
        path.mkdir()
    elif content is not None:
        path.write_text(content)
    with pytest.raises(SignatureError, match=why) as err:
        load_trusted_keys([path])
    assert str(path) in str(err.value)


# ----------------------------------------------------------------------------- verification


def test_a_signature_by_a_trusted_key_verifies(keys, alice_block):
    alice = keys[0]
    assert alice_block["key_id"] == alice[2] == key_id(bytes.fromhex(alice_block["public_key"]))
    status = verify_signature(json.dumps(alice_block).encode(), DIGEST, "package", trusted(alice))
    assert status == SignatureStatus("verified", alice[2], status.message, True)
    assert verify_signature(alice_block, DIGEST, "package", trusted(*keys)).state == "verified"


def test_a_valid_signature_by_another_key_is_untrusted(keys, alice_block):
    status = verify_signature(alice_block, DIGEST, "package", trusted(keys[1]))
    assert (status.state, status.key_id, status.trusted_keys_given) == ("untrusted-key", keys[0][2], True)
    alone = verify_signature(alice_block, DIGEST, "package", None)
    assert (alone.state, alone.trusted_keys_given) == ("untrusted-key", False)


def test_a_signature_of_another_digest_or_purpose_is_invalid(keys, alice_block):
    keyset = trusted(*keys)
    status = verify_signature(alice_block, OTHER_DIGEST, "package", keyset)
    assert status.state == "invalid" and "digest" in status.message
    # A block rewritten to name the actual digest still carries the old signature.
    forged = dict(alice_block, digest=f"sha256:{OTHER_DIGEST}")
    assert verify_signature(forged, OTHER_DIGEST, "package", keyset).state == "invalid"
    # A package's signature is no bundle's, even over the same digest.
    as_bundle = verify_signature(alice_block, DIGEST, "bundle", keyset)
    assert as_bundle.state == "invalid" and "'package'" in as_bundle.message
    assert verify_signature(dict(alice_block, purpose="bundle"), DIGEST, "bundle", keyset).state == "invalid"


def test_a_key_swapped_into_the_block_does_not_verify(keys, alice_block):
    mallory_raw = load_trusted_keys([keys[1][1]])[keys[1][2]]
    swapped = dict(alice_block, public_key=mallory_raw.hex(), key_id=keys[1][2])
    assert verify_signature(swapped, DIGEST, "package", trusted(*keys)).state == "invalid"


def flip_last_hex(text: str) -> str:
    return text[:-1] + ("0" if text[-1] != "0" else "1")


MALFORMED = {
    "not json": b"{not json",
    "not utf-8": b"\xff\xfe{}",
    "a list": b"[]",
    "null fields": json.dumps({k: None for k in ("format", "version", "algorithm")}).encode(),
    "huge": b" " * (1 << 20),
}


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: MALFORMED["not json"],
        lambda b: MALFORMED["not utf-8"],
        lambda b: MALFORMED["a list"],
        lambda b: MALFORMED["null fields"],
        lambda b: MALFORMED["huge"],
        lambda b: dict(b, format="other"),
        lambda b: dict(b, version="1"),
        lambda b: dict(b, version=True),
        lambda b: dict(b, algorithm="rsa"),
        lambda b: dict(b, signature=b["signature"][:-2]),
        lambda b: dict(b, signature=flip_last_hex(b["signature"])),
        lambda b: dict(b, signature="zz" * 64),
        lambda b: dict(b, public_key=b["public_key"][:-2]),
        lambda b: dict(b, public_key=1234),
        lambda b: dict(b, key_id="0" * 16),
        lambda b: {k: v for k, v in b.items() if k != "digest"},
        lambda b: dict(b, digest=b["digest"].upper()),
    ],
)
def test_a_malformed_block_is_invalid_not_an_exception(keys, alice_block, mutate):
    status = verify_signature(mutate(alice_block), DIGEST, "package", trusted(*keys))
    assert status.state == "invalid" and status.message
    with pytest.raises(SignatureError, match="model.aotc: refused, invalid signature"):
        enforce(status, False, "model.aotc")


def test_an_absent_block_is_unsigned(keys):
    assert verify_signature(None, DIGEST, "package", trusted(*keys)).state == "unsigned"


# ----------------------------------------------------------------------------- policy

ACCEPT, REFUSE = "accept", "refuse"


@pytest.mark.parametrize(
    "state, require, trusted_given, expected",
    [
        ("unsigned", False, False, ACCEPT),
        ("unsigned", False, True, REFUSE),  # trusted keys given: stripping the signature must not pass
        ("unsigned", True, True, REFUSE),
        ("verified", True, True, ACCEPT),
        ("untrusted-key", False, False, ACCEPT),
        ("untrusted-key", False, True, REFUSE),
        ("untrusted-key", True, False, REFUSE),
        ("invalid", False, False, REFUSE),
    ],
)
def test_policy(state, require, trusted_given, expected):
    status = SignatureStatus(state, "0123456789abcdef" if state != "unsigned" else None, "why", trusted_given)
    if expected == ACCEPT:
        assert enforce(status, require, "m.aotc") is status
    else:
        with pytest.raises(SignatureError, match="^m.aotc: refused") as err:
            enforce(status, require, "m.aotc")
        if status.key_id:
            assert status.key_id in str(err.value)


def test_require_signature_from_the_environment(monkeypatch):
    unsigned = SignatureStatus("unsigned")
    monkeypatch.setenv("AOTC_REQUIRE_SIGNATURE", "1")
    with pytest.raises(SignatureError, match="not signed"):
        enforce(unsigned, None, "m.aotc")
    assert enforce(unsigned, False, "m.aotc") is unsigned
    monkeypatch.setenv("AOTC_REQUIRE_SIGNATURE", "0")
    assert enforce(unsigned, None, "m.aotc") is unsigned


def test_check_signature_loads_keys_verifies_and_enforces(keys, alice_block, monkeypatch):
    (_, alice_pub, alice_id), (_, mallory_pub, _) = keys
    block = json.dumps(alice_block)
    status = check_signature(block, DIGEST, "package", "m.aotc", [alice_pub], require_signature=True)
    assert status.state == "verified" and status.key_id == alice_id
    with pytest.raises(SignatureError, match=f"m.aotc: refused, untrusted signature \\(key {alice_id}\\)"):
        check_signature(block, DIGEST, "package", "m.aotc", [mallory_pub])
    monkeypatch.setenv("AOTC_TRUSTED_KEYS", str(alice_pub))
    assert check_signature(block, DIGEST, "package", "m.aotc").state == "verified"


def test_without_cryptography_a_signature_cannot_be_made_or_checked_but_unsigned_loads(
    keys, alice_block, monkeypatch
):
    for name in list(sys.modules):
        if name == "cryptography" or name.startswith("cryptography."):
            monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "cryptography", None)
    hint = r"pip install 'aotc-runtime\[sign\]'"
    assert check_signature(None, DIGEST, "package", "m.aotc", {}).state == "unsigned"
    with pytest.raises(SignatureError, match=f"m.aotc: .*{hint}"):
        check_signature(alice_block, DIGEST, "package", "m.aotc", [keys[0][1]])
    with pytest.raises(SigningError, match=hint):
        sign_digest(keys[0][0], DIGEST, "package")


@pytest.mark.parametrize("value", ["2", "y", "enable", "required"])
def test_a_misspelt_require_signature_fails_closed(value, monkeypatch):
    monkeypatch.setenv("AOTC_REQUIRE_SIGNATURE", value)
    with pytest.raises(SignatureError, match="AOTC_REQUIRE_SIGNATURE"):
        check_signature(None, DIGEST, "package", "m.aotc", {})


def test_keygen_never_replaces_an_existing_public_key(tmp_path):
    trusted = tmp_path / "c.pub"
    trusted.write_text("someone's trusted key")
    with pytest.raises(SigningError, match="not overwriting a public key"):
        generate_keypair(tmp_path / "c.pem")
    assert trusted.read_text() == "someone's trusted key" and not (tmp_path / "c.pem").exists()
