"""Presets signed at creation by the local development key. A preset is generated from its
seed, so a directory that is not signed by this deployment's key (made before signing existed,
or by another key, or whose signature was removed) is generated again and signed, never
blessed as found; a signed one whose files were changed afterwards is refused at load."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from workers.artifacts.keys import key_id
from workers.artifacts.manifest import MANIFEST_NAME, SIGNATURE_NAME
from workers.artifacts.signing import model_sign
from workers.artifacts.trust import dev_key_ensure
from workers.engine import ensure_preset, preset_create
from workers.engine.presets import PRESET_FORMAT_VERSION

PRESET_LICENSE = "NOASSERTION"  # seeded random weights made on this machine
_known_signed: set[tuple[str, str]] = set()


def preset_predicate(preset: str, seed: int) -> dict:
    return {
        "name": preset,
        "version": f"seed{seed}-format{PRESET_FORMAT_VERSION}",
        "source": f"preset:{preset}@{seed}",
        "license": PRESET_LICENSE,
    }


def preset_signed_dir(preset: str, root: Path, *, seed: int = 0) -> Path:
    """`root/<preset>-seed<seed>`, generated and signed by the development key where needed;
    without a development key, the plain preset."""
    key = dev_key_ensure()
    if key is None:
        return ensure_preset(preset, root, seed=seed)
    path = Path(root) / f"{preset}-seed{seed}"
    predicate = preset_predicate(preset, seed)
    if (str(path), key_id(key.public_key())) in _known_signed:
        return path
    if not _is_signed_by(path, key, predicate):
        _create_signed(path, key, preset=preset, seed=seed, predicate=predicate)
    _known_signed.add((str(path), key_id(key.public_key())))
    return path


def _is_signed_by(path: Path, key: Ed25519PrivateKey, predicate: dict) -> bool:
    """Whether the manifest there is this key's and describes this preset (the files' hashes
    are the load's check)."""
    try:
        manifest = (path / MANIFEST_NAME).read_bytes()
        signature = json.loads((path / SIGNATURE_NAME).read_bytes())
        if signature.get("keyid") != key_id(key.public_key()):
            return False
        key.public_key().verify(base64.b64decode(signature["sig"]), manifest)
        return json.loads(manifest)["predicate"] == predicate
    except (OSError, ValueError, KeyError, TypeError, InvalidSignature):
        return False


def _create_signed(
    path: Path, key: Ed25519PrivateKey, *, preset: str, seed: int, predicate: dict
) -> None:
    """Generate, sign, then move into place; racing processes agree on the bytes (seeded
    weights, deterministic signatures), so whichever lands is the same model."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        made = staging / "model"
        preset_create(preset, made, seed=seed)
        model_sign(made, key, **predicate)
        for _ in range(5):
            try:
                os.rename(made, path)  # fails while a directory is there
                return
            except OSError:
                if _is_signed_by(path, key, predicate):
                    return  # another process got there first
                with contextlib.suppress(FileNotFoundError):
                    os.rename(path, path.parent / f".{path.name}-old-{uuid.uuid4().hex[:8]}")
        raise RuntimeError(f"could not place the signed preset at {path}")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        for old in path.parent.glob(f".{path.name}-old-*"):
            shutil.rmtree(old, ignore_errors=True)
