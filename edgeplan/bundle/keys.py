"""ed25519 signing keys: generation, loading, key ids, signatures (cryptography + standard library only).

A key id is ``ed25519:<first 16 hex digits of sha256(raw public key)>``; manifests carry it, so devices pick
the public key to check with and keys can rotate (trust the new one, sign with it, drop the old one).
The private key comes from a file or from ``EDGEPLAN_SIGNING_KEY`` (the PEM text itself, or a path to it),
never from params.yaml.
"""
from __future__ import annotations

import base64
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from edgeplan.errors import BundleVerificationError, SigningKeyError

ENV = "EDGEPLAN_SIGNING_KEY"


def key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "ed25519:" + hashlib.sha256(raw).hexdigest()[:16]


@dataclass(frozen=True)
class SigningKey:
    key: Ed25519PrivateKey
    key_id: str
    source: str  # where it was read from (for messages; never the key itself)

    def sign(self, payload: bytes) -> str:
        return base64.b64encode(self.key.sign(payload)).decode()

    @property
    def public(self) -> Ed25519PublicKey:
        return self.key.public_key()


def generate(out_dir: Path) -> tuple[str, Path, Path]:
    """A new key pair in ``out_dir``: ``<id>.key`` (private, mode 0600) and ``<id>.pub``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    private = Ed25519PrivateKey.generate()
    kid = key_id(private.public_key())
    name = kid.replace(":", "-")
    key_path, pub_path = out_dir / f"{name}.key", out_dir / f"{name}.pub"
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    pub_path.write_bytes(private.public_key().public_bytes(serialization.Encoding.PEM,
                                                           serialization.PublicFormat.SubjectPublicKeyInfo))
    return kid, key_path, pub_path


def load_signing_key(path: str | Path | None = None) -> SigningKey:
    """The private key from ``path``, else from ``$EDGEPLAN_SIGNING_KEY`` (PEM text or a path)."""
    if path is not None:
        source = str(path)
        try:
            pem = Path(path).read_bytes()
        except OSError as e:
            raise SigningKeyError(f"signing key {path}: cannot read it ({e.strerror}); make one with "
                                  "`edgeplan keys generate`") from None
    else:
        value = os.environ.get(ENV)
        if not value:
            raise SigningKeyError(f"no signing key: pass --key FILE or set {ENV} (the PEM text or a path); "
                                  "make one with `edgeplan keys generate`")
        if value.lstrip().startswith("-----BEGIN"):
            source, pem = f"${ENV}", value.encode()
        else:
            return load_signing_key(value)
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as e:
        raise SigningKeyError(f"signing key {source}: not an unencrypted PEM private key ({e})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningKeyError(f"signing key {source}: a {type(key).__name__}, edgeplan signs with ed25519 only")
    return SigningKey(key, key_id(key.public_key()), source)


def load_public_key(path: str | Path) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(Path(path).read_bytes())
    except (OSError, ValueError) as e:
        raise SigningKeyError(f"public key {path}: cannot load it ({e})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise SigningKeyError(f"public key {path}: not ed25519")
    return key


def load_trusted(paths) -> dict[str, Ed25519PublicKey]:
    """Trusted public keys by key id, from ``.pub`` files or directories of them."""
    out = {}
    for p in paths:
        p = Path(p)
        files = sorted(p.glob("*.pub")) if p.is_dir() else [p]
        for f in files:
            key = load_public_key(f)
            out[key_id(key)] = key
    return out


def verify(trusted: dict[str, Ed25519PublicKey], kid: str, payload: bytes, signature: str, what: str) -> None:
    """Raise BundleVerificationError unless ``signature`` over ``payload`` is by trusted key ``kid``."""
    if not isinstance(kid, str) or not isinstance(signature, str):
        raise BundleVerificationError(f"{what}: key_id and signature must be strings")
    key = trusted.get(kid)
    if key is None:
        raise BundleVerificationError(f"{what}: signed by key {kid!r}, which is not trusted here "
                                      f"(trusted: {', '.join(sorted(trusted)) or 'none'})")
    try:
        key.verify(base64.b64decode(signature, validate=True), payload)
    except (InvalidSignature, ValueError):
        raise BundleVerificationError(f"{what}: the signature does not match its content (tampered, or "
                                      f"signed by another key claiming id {kid})") from None
