"""The audit log's checkpoints signed with the platform's Ed25519 key, the one that signs
models (FAIRLANE_AUDIT_SIGNING_KEY, by default the development key): tenants keeps the log and
may not import this package, so the signing and the checking are handed to it from here."""

from __future__ import annotations

import logging
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings

from tenants.models import AuditCheckpoint
from tenants.services.audit import audit_checkpoint_write, checkpoint_parts
from workers.artifacts.keys import KeyProblem, key_id, private_ensure, private_load
from workers.artifacts.trust import dev_key_path, trusted_keys

logger = logging.getLogger(__name__)


def audit_signing_key() -> Ed25519PrivateKey | None:
    """FAIRLANE_AUDIT_SIGNING_KEY's key; unset, the development key (created if missing, as
    presets do); none in production until one is set."""
    configured = settings.FAIRLANE_AUDIT_SIGNING_KEY
    if configured:
        return private_load(Path(configured))
    path = dev_key_path()
    return private_ensure(path) if path else None


def audit_checkpoint_sign() -> AuditCheckpoint | None:
    """Sign every chain's head now; None (and a warning) when no key is configured."""
    try:
        key = audit_signing_key()
    except KeyProblem as exc:
        logger.error("audit checkpoint not signed: %s", exc)
        return None
    if key is None:
        logger.warning("audit checkpoint not signed: set FAIRLANE_AUDIT_SIGNING_KEY")
        return None
    public_id = key_id(key.public_key())
    return audit_checkpoint_write(sign=lambda payload: (public_id, key.sign(payload)))


def audit_checkpoint_valid(checkpoint: AuditCheckpoint) -> bool:
    """Whether a trusted key (the model-signing trust list) made the checkpoint's signature."""
    key = trusted_keys().get(checkpoint.key_id)
    if key is None:
        return False
    payload, signature = checkpoint_parts(checkpoint)
    try:
        key.verify(signature, payload)
    except (InvalidSignature, ValueError):
        return False
    return True
