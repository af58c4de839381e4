"""Ed25519 keys for model manifests: generated, loaded from PEM files (ours or `openssl genpkey
-algorithm ed25519`), written as text (`ed25519:<base64 of the 32-byte key>`), and identified
by the sha256 of the raw public key (`sha256:<hex>`, the key id). No Django here."""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

TEXT_PREFIX = "ed25519:"


class KeyProblem(ValueError):
    """A key that cannot be read or is not Ed25519."""


def raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(key: Ed25519PublicKey) -> str:
    """The key's identity everywhere (settings, registry, signatures, logs)."""
    return "sha256:" + hashlib.sha256(raw_public(key)).hexdigest()


def public_text(key: Ed25519PublicKey) -> str:
    return TEXT_PREFIX + base64.b64encode(raw_public(key)).decode()


def public_parse(text: str) -> Ed25519PublicKey:
    """`ed25519:<base64>` or a PEM SubjectPublicKeyInfo block."""
    text = text.strip()
    if text.startswith(TEXT_PREFIX):
        try:
            raw = base64.b64decode(text.removeprefix(TEXT_PREFIX), validate=True)
            return Ed25519PublicKey.from_public_bytes(raw)
        except (binascii.Error, ValueError):
            raise KeyProblem(
                "not an Ed25519 public key: expected ed25519:<base64 of 32 bytes>"
            ) from None
    if text.startswith("-----BEGIN PUBLIC KEY-----"):
        try:
            key = serialization.load_pem_public_key(text.encode())
        except ValueError:
            raise KeyProblem("unreadable PEM public key") from None
        if not isinstance(key, Ed25519PublicKey):
            raise KeyProblem("the PEM public key is not Ed25519")
        return key
    raise KeyProblem("a public key is `ed25519:<base64>` or a PEM block (BEGIN PUBLIC KEY)")


def public_load(entry: str) -> Ed25519PublicKey:
    """A trusted-key entry: the key itself as text, or the path of a file holding it."""
    entry = entry.strip()
    if entry.startswith((TEXT_PREFIX, "-----BEGIN")):
        return public_parse(entry)
    try:
        return public_parse(Path(entry).read_text())
    except OSError as exc:
        raise KeyProblem(f"cannot read public key file {entry}: {exc.strerror}") from None


def private_load(path: str | Path) -> Ed25519PrivateKey:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise KeyProblem(f"cannot read signing key {path}: {exc.strerror}") from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise KeyProblem(f"{path} is not an unencrypted PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyProblem(f"{path} is not an Ed25519 key")
    return key


def private_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def private_write(path: str | Path, key: Ed25519PrivateKey, *, exist_ok: bool = False) -> bool:
    """Write a private key readable by its owner only. Several processes may race to create the
    same key: the first wins (an atomic link), the others keep what it wrote. Returns whether
    this call wrote it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(private_pem(key))
        try:
            os.link(staging, path)
        except FileExistsError:
            if not exist_ok:
                raise
            return False
        return True
    finally:
        staging.unlink(missing_ok=True)


def private_ensure(path: str | Path) -> Ed25519PrivateKey:
    """The key at `path`, generated there first if missing."""
    path = Path(path)
    if not path.exists():
        private_write(path, Ed25519PrivateKey.generate(), exist_ok=True)
    return private_load(path)
