"""Making signatures: Ed25519 key pairs in OpenSSL's PEM forms, and signature blocks over a digest.

The block's layout, the signed message and verification live in `aotc_runtime.signing`, so a
device checks exactly what was signed here. Needs `cryptography` (`pip install 'aotc-runtime[sign]'`).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from aotc_runtime.signing import (
    ALGORITHM,
    INSTALL_HINT,
    SIGNATURE_FORMAT,
    SIGNATURE_VERSION,
    key_id,
    signed_message,
)

__all__ = ["SigningError", "generate_keypair", "public_key_path", "sign_digest", "signing_key_id"]


MAX_KEY_BYTES = 64 << 10


class SigningError(ValueError):
    """A private key that cannot be used for signing; the message names the file and why."""


def public_key_path(private_key: str | os.PathLike) -> Path:
    """Where `generate_keypair` puts the public half: the private key's path with suffix `.pub`."""
    return Path(private_key).with_suffix(".pub")


def generate_keypair(path: str | os.PathLike) -> tuple[Path, Path, str]:
    """Write a new Ed25519 private key to `path` (PKCS#8 PEM, mode 0600, never over an existing file)
    and its public key beside it (`.pub`, SubjectPublicKeyInfo PEM); returns both paths and the key id."""
    ed25519, serialization = _crypto()
    private = Path(path)
    public = public_key_path(private)
    if private == public:
        raise SigningError(f"{private}: name the private key something other than *.pub (e.g. key.pem)")
    if public.exists():
        # it may be a key someone trusts (a directory of *.pub): never replace it with another
        raise SigningError(f"{public}: already exists; not overwriting a public key (choose another name)")
    key = ed25519.Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public_key = key.public_key()
    public_pem = public_key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    _write_new(private, private_pem, 0o600)
    _write_new(public, public_pem, 0o644)
    return private, public, key_id(raw)


def signing_key_id(key_path: str | os.PathLike) -> str:
    """The key id of the Ed25519 private key in `key_path`; a SigningError if it cannot sign (checked
    before a build spends time, so a bad key never fails it at the end)."""
    key = _load_private_key(Path(key_path))
    _, serialization = _crypto()
    return key_id(key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))


def sign_digest(key_path: str | os.PathLike, digest_hex: str, purpose: str) -> dict:
    """The signature block (see `aotc_runtime.signing`) of `digest_hex` (sha256, hex) for `purpose`
    ("package" or "bundle"), signed with the Ed25519 private key in the PEM file `key_path`."""
    message = signed_message(purpose, digest_hex)
    key = _load_private_key(Path(key_path))
    _, serialization = _crypto()
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return {
        "format": SIGNATURE_FORMAT,
        "version": SIGNATURE_VERSION,
        "algorithm": ALGORITHM,
        "purpose": purpose,
        "digest": f"sha256:{digest_hex}",
        "key_id": key_id(raw),
        "public_key": raw.hex(),
        "signature": key.sign(message).hex(),
    }


def _load_private_key(path: Path):
    ed25519, serialization = _crypto()
    try:
        with open(path, "rb") as f:
            pem = f.read(MAX_KEY_BYTES)
    except OSError as err:
        raise SigningError(f"signing key {path}: cannot read it ({err.strerror})") from None
    if b"PUBLIC KEY-----" in pem and b"PRIVATE KEY-----" not in pem:
        raise SigningError(f"signing key {path}: is a public key; signing needs the private key")
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except TypeError:
        raise SigningError(f"signing key {path}: is encrypted; give an unencrypted PEM key") from None
    except ValueError as err:
        raise SigningError(f"signing key {path}: not a PEM private key ({err})") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise SigningError(
            f"signing key {path}: not an Ed25519 key (make one with `openssl genpkey -algorithm ed25519`)"
        )
    return key


def _crypto():
    """The `cryptography` modules signing needs, imported only when a key is made or used."""
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise SigningError(f"signing needs the 'cryptography' package: {INSTALL_HINT}") from None
    return ed25519, serialization


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Write `data` to a temporary file and link it to `path` in one step; an existing file is kept."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise SigningError(f"{path}: already exists; not overwriting a key") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
