"""Ed25519 signatures over a package's (or a tophub bundle's) digest, and the policy that checks them.

A signature block is JSON: {"format": "aotc-signature", "version": 1, "algorithm": "ed25519",
"purpose": "package" | "bundle", "digest": "sha256:<hex>", "key_id", "public_key" (hex of the raw 32
bytes), "signature" (hex)}. The signed message is b"aotc-signature-v1\\0" + purpose + b"\\0" + the raw
digest, so a package signature can never pass as a bundle's. A package's digest is the sha256 of its
manifest.json, which lists the sha256 of every other member. Verification needs the `cryptography`
package (`pip install 'aotc-runtime[sign]'`), imported only when a signature is actually checked.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from aotc_runtime.package import SIGNATURE as SIGNATURE_MEMBER
from aotc_runtime.package import PackageError

__all__ = [
    "PURPOSES",
    "SIGNATURE_FORMAT",
    "SIGNATURE_MEMBER",
    "SIGNATURE_VERSION",
    "SignatureError",
    "SignatureStatus",
    "check_signature",
    "enforce",
    "key_id",
    "load_trusted_keys",
    "parse_public_key",
    "require_signature_default",
    "signed_message",
    "verify_signature",
]

SIGNATURE_FORMAT = "aotc-signature"
SIGNATURE_VERSION = 1
PURPOSES = ("package", "bundle")
ALGORITHM = "ed25519"
TRUSTED_KEYS_ENV = "AOTC_TRUSTED_KEYS"
REQUIRE_SIGNATURE_ENV = "AOTC_REQUIRE_SIGNATURE"
INSTALL_HINT = "pip install 'aotc-runtime[sign]'"
MESSAGE_PREFIX = b"aotc-signature-v1\0"
# DER SubjectPublicKeyInfo of an Ed25519 key (RFC 8410) is this fixed prefix and the raw 32 bytes.
ED25519_SPKI_PREFIX = bytes.fromhex("302a300506032b6570032100")
MAX_BLOCK_BYTES = 64 << 10

STATES = ("unsigned", "verified", "untrusted-key", "invalid")
HEX_DIGEST = re.compile(r"[0-9a-f]{64}")


class SignatureError(PackageError):
    """A signature that is refused (invalid, untrusted or missing where required), or one that
    cannot be checked; the message names the file, the key id and why. A PackageError, so one
    `except PackageError` covers every reason a package (or bundle) is refused."""


@dataclass(frozen=True)
class SignatureStatus:
    """What verification found. `trusted_keys_given` says whether the key was checked against a
    trusted set (a valid signature with none given proves integrity only, so it is "untrusted-key")."""

    state: str
    key_id: str | None = None
    message: str = ""
    trusted_keys_given: bool = False


def key_id(public_key: bytes) -> str:
    """First 16 hex digits of the sha256 of a raw 32-byte Ed25519 public key."""
    return hashlib.sha256(public_key).hexdigest()[:16]


def signed_message(purpose: str, digest_hex: str) -> bytes:
    """The bytes an Ed25519 signature covers: a domain tag, the purpose and the raw digest."""
    if purpose not in PURPOSES:
        raise ValueError(f"signature purpose {purpose!r} is not one of {', '.join(PURPOSES)}")
    if not isinstance(digest_hex, str) or not HEX_DIGEST.fullmatch(digest_hex):
        raise ValueError(f"digest {digest_hex!r} is not 64 lowercase hex digits of a sha256")
    return MESSAGE_PREFIX + purpose.encode() + b"\0" + bytes.fromhex(digest_hex)


# ----------------------------------------------------------------------------- trusted keys


def parse_public_key(pem: bytes, where: str) -> bytes:
    """The raw 32 bytes of an Ed25519 public key in OpenSSL's PEM form (`openssl pkey -pubout`)."""
    text = pem.decode("ascii", "replace")
    match = re.search(r"-----BEGIN PUBLIC KEY-----(.*?)-----END PUBLIC KEY-----", text, re.S)
    if match is None:
        hint = " (that is a private key; pass its .pub)" if "PRIVATE KEY-----" in text else ""
        raise SignatureError(f"trusted key {where}: not a PEM public key{hint}")
    try:
        der = base64.b64decode("".join(match.group(1).split()), validate=True)
    except (binascii.Error, ValueError):
        raise SignatureError(f"trusted key {where}: its PEM body is not valid base64") from None
    if len(der) != len(ED25519_SPKI_PREFIX) + 32 or not der.startswith(ED25519_SPKI_PREFIX):
        raise SignatureError(f"trusted key {where}: not an Ed25519 public key")
    return der[len(ED25519_SPKI_PREFIX) :]


def load_trusted_keys(paths: Iterable[str | os.PathLike] | None = None) -> dict[str, bytes]:
    """Key id -> raw public key, from PEM files and directories of `*.pub` files; None reads the
    os.pathsep-separated `AOTC_TRUSTED_KEYS` (unset or empty: no trusted keys)."""
    if paths is None:
        paths = [p for p in os.environ.get(TRUSTED_KEYS_ENV, "").split(os.pathsep) if p]
    elif isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    keys: dict[str, bytes] = {}
    for entry in paths:
        entry = os.fspath(entry)
        if os.path.isdir(entry):
            files = sorted(os.path.join(entry, n) for n in os.listdir(entry) if n.endswith(".pub"))
            if not files:
                raise SignatureError(f"trusted keys directory {entry}: holds no *.pub key files")
        elif os.path.exists(entry):
            files = [entry]
        else:
            raise SignatureError(f"trusted key {entry}: no such file or directory")
        for file in files:
            try:
                with open(file, "rb") as f:
                    pem = f.read(MAX_BLOCK_BYTES)
            except OSError as err:
                raise SignatureError(f"trusted key {file}: cannot read it ({err.strerror})") from None
            raw = parse_public_key(pem, file)
            keys[key_id(raw)] = raw
    return keys


# ----------------------------------------------------------------------------- verification


def verify_signature(
    block: bytes | str | Mapping | None,
    digest_hex: str,
    purpose: str,
    trusted_keys: Mapping[str, bytes] | None = None,
) -> SignatureStatus:
    """Check a signature block against the digest of the bytes it is meant to cover.

    `block` is the block's JSON text or its parsed dict (None: unsigned); `trusted_keys` maps key id
    to raw public key (see `load_trusted_keys`). A malformed block is "invalid", never an exception;
    only a missing `cryptography` raises (SignatureError, with the install command).
    """
    message = signed_message(purpose, digest_hex)
    trusted = dict(trusted_keys or {})
    given = bool(trusted)
    if block is None:
        return SignatureStatus("unsigned", None, "not signed", given)
    parsed = _parse_block(block, digest_hex, purpose)
    if isinstance(parsed, str):
        return SignatureStatus("invalid", None, parsed, given)
    kid, public_key, signature = parsed
    if not _ed25519_valid(public_key, signature, message):
        return SignatureStatus("invalid", kid, f"the signature by key {kid} does not verify", given)
    if trusted.get(kid) == public_key:
        return SignatureStatus("verified", kid, f"signed by trusted key {kid}", given)
    why = "is not among the trusted keys" if given else "is valid, but no trusted keys were given"
    return SignatureStatus("untrusted-key", kid, f"the signature by key {kid} {why}", given)


def _parse_block(
    block: bytes | str | Mapping, digest_hex: str, purpose: str
) -> tuple[str, bytes, bytes] | str:
    """(key id, public key, signature) of a well-formed block for this digest and purpose, else why not."""
    if isinstance(block, (bytes, bytearray, memoryview, str)):
        if len(block) > MAX_BLOCK_BYTES:
            return f"the signature block is {len(block)} bytes, more than {MAX_BLOCK_BYTES}"
        try:
            block = json.loads(bytes(block) if not isinstance(block, str) else block)
        except (ValueError, UnicodeDecodeError) as err:
            return f"the signature block is not valid JSON ({err})"
    if not isinstance(block, Mapping):
        return "the signature block is not a JSON object"
    expected = {"format": SIGNATURE_FORMAT, "version": SIGNATURE_VERSION, "algorithm": ALGORITHM}
    for field, value in expected.items():
        if block.get(field) != value or type(block.get(field)) is not type(value):
            return f"the signature block's {field} is {block.get(field)!r}, expected {value!r}"
    fields = {}
    for field in ("purpose", "digest", "key_id", "public_key", "signature"):
        if not isinstance(block.get(field), str):
            return f"the signature block's {field} is missing or not a string"
        fields[field] = block[field]
    if fields["purpose"] != purpose:
        return f"the signature is for a {fields['purpose']!r}, this is a {purpose!r}"
    if fields["digest"] != f"sha256:{digest_hex}":
        return f"the signature covers digest {fields['digest'][:23]}..., this file's is sha256:{digest_hex[:16]}..."
    public_key = _hex_field(fields["public_key"], 32)
    signature = _hex_field(fields["signature"], 64)
    if public_key is None:
        return "the signature block's public_key is not 64 hex digits"
    if signature is None:
        return "the signature block's signature is not 128 hex digits"
    kid = key_id(public_key)
    if fields["key_id"] != kid:
        return f"the signature block's key_id {fields['key_id']!r} is not its public key's ({kid})"
    return kid, public_key, signature


def _hex_field(text: str, nbytes: int) -> bytes | None:
    if not re.fullmatch(rf"[0-9a-fA-F]{{{2 * nbytes}}}", text):
        return None
    return bytes.fromhex(text)


def _ed25519_valid(public_key: bytes, signature: bytes, message: bytes) -> bool:
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    except ImportError:
        raise SignatureError(
            f"checking a signature needs the 'cryptography' package: {INSTALL_HINT}"
        ) from None
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


# ----------------------------------------------------------------------------- policy


def require_signature_default() -> bool:
    """`AOTC_REQUIRE_SIGNATURE`: 1/true/yes/on or 0/false/no/off/empty (any case); any other value is
    a SignatureError, since reading a misspelt policy as "not required" would fail open."""
    value = os.environ.get(REQUIRE_SIGNATURE_ENV, "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise SignatureError(
        f"{REQUIRE_SIGNATURE_ENV}={os.environ[REQUIRE_SIGNATURE_ENV]!r}: expected 1/true/yes/on or 0/false/no/off"
    )


def enforce(status: SignatureStatus, require_signature: bool | None, what: str) -> SignatureStatus:
    """Return `status` if policy accepts it, else raise SignatureError naming `what`, the key and why.

    An invalid signature is always refused; unsigned is refused when signatures are required or
    trusted keys were given (naming the keys to trust means the package must come from one of them:
    stripping the signature must not get past them); a valid signature by a key outside the trusted
    set is refused when signatures are required or trusted keys were given. None for `require_signature` reads `AOTC_REQUIRE_SIGNATURE`.
    """
    if status.state not in STATES:
        raise ValueError(f"unknown signature state {status.state!r}")
    required = require_signature_default() if require_signature is None else require_signature
    key = f" (key {status.key_id})" if status.key_id else ""
    if status.state == "invalid":
        raise SignatureError(f"{what}: refused, invalid signature{key}: {status.message}")
    if status.state == "unsigned" and (required or status.trusted_keys_given):
        why = "a signature is required" if required else "trusted keys were given"
        raise SignatureError(f"{what}: refused, it is not signed and {why}")
    if status.state == "untrusted-key" and (required or status.trusted_keys_given):
        raise SignatureError(f"{what}: refused, untrusted signature{key}: {status.message}")
    return status


def check_signature(
    block: bytes | str | Mapping | None,
    digest_hex: str,
    purpose: str,
    what: str,
    trusted_keys: Iterable[str | os.PathLike] | Mapping[str, bytes] | None = None,
    require_signature: bool | None = None,
) -> SignatureStatus:
    """Load the trusted keys (paths, a mapping from `load_trusted_keys`, or None: the environment),
    verify `block` and enforce the policy; every refusal is a SignatureError naming `what`."""
    keys = trusted_keys if isinstance(trusted_keys, Mapping) else load_trusted_keys(trusted_keys)
    try:
        status = verify_signature(block, digest_hex, purpose, keys)
    except SignatureError as err:
        raise SignatureError(f"{what}: {err}") from None
    return enforce(status, require_signature, what)
