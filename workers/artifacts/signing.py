"""Signing a model directory: its manifest (see manifest.py) and a detached Ed25519 signature
over the manifest's exact bytes, in a small JSON file that names the key:

    {"algorithm": "ed25519", "keyid": "sha256:<hex>", "public_key": "ed25519:<b64>",
     "sig": "<base64 of the 64-byte signature>"}

The public key rides along so a verifier can say who signed a model it does not trust; trust
itself comes only from the verifier's own list of keys."""

from __future__ import annotations

import base64
import os
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from workers.artifacts.keys import key_id, public_text
from workers.artifacts.manifest import (
    MANIFEST_NAME,
    SIGNATURE_NAME,
    canonical,
    manifest_digest,
    statement_build,
)


def signature_document(key: Ed25519PrivateKey, manifest: bytes) -> dict:
    public = key.public_key()
    return {
        "algorithm": "ed25519",
        "keyid": key_id(public),
        "public_key": public_text(public),
        "sig": base64.b64encode(key.sign(manifest)).decode(),
    }


def _write_atomic(path: Path, data: bytes) -> None:
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    staging.write_bytes(data)
    os.replace(staging, path)


def model_sign(
    root: str | Path, key: Ed25519PrivateKey, *, name: str, version: str, source: str, license: str
) -> tuple[str, str]:
    """Write the manifest of `root` as it is now, and its signature. Returns (manifest digest,
    signer key id). Ed25519 is deterministic, so signing the same files with the same key twice
    writes the same bytes: processes racing to sign one directory agree."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"{root} is not a directory")
    manifest = canonical(
        statement_build(root, name=name, version=version, source=source, license=license)
    )
    signature = signature_document(key, manifest)
    # The signature goes second: a reader that sees the new manifest with the old signature
    # refuses (and retries later) rather than trusting a mismatched pair.
    _write_atomic(root / MANIFEST_NAME, manifest)
    _write_atomic(root / SIGNATURE_NAME, canonical(signature))
    return manifest_digest(manifest), signature["keyid"]
