"""The keys trusted to sign models: FAIRLANE_TRUSTED_KEYS, the registry's TrustedKey rows, and
the local development key (FAIRLANE_DEV_SIGNING_KEY) when there is one."""

from __future__ import annotations

import logging
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from django.conf import settings

from workers.artifacts.keys import KeyProblem, key_id, private_ensure, private_load, public_load
from workers.artifacts.models import TrustedKey

logger = logging.getLogger(__name__)


def dev_key_path() -> Path | None:
    value = settings.FAIRLANE_DEV_SIGNING_KEY
    return Path(value) if value else None


def dev_key_ensure() -> Ed25519PrivateKey | None:
    """The development signing key, created on first use; None when switched off."""
    path = dev_key_path()
    return private_ensure(path) if path else None


def dev_key_get() -> Ed25519PrivateKey | None:
    """The development key if it exists (never created here)."""
    path = dev_key_path()
    if path is None or not path.exists():
        return None
    try:
        return private_load(path)
    except KeyProblem:
        logger.exception("the development signing key at %s is unreadable", path)
        return None


def trusted_keys() -> dict[str, Ed25519PublicKey]:
    """Key id -> public key, read fresh on each call (a load is rare; a key added in the admin
    counts at the next one)."""
    keys: dict[str, Ed25519PublicKey] = {}
    for entry in settings.FAIRLANE_TRUSTED_KEYS:
        try:
            key = public_load(entry)
        except KeyProblem as exc:  # one bad entry must not distrust the others
            logger.error("FAIRLANE_TRUSTED_KEYS: %s", exc)
            continue
        keys[key_id(key)] = key
    for row in TrustedKey.objects.filter(is_active=True):
        try:
            key = public_load(row.public_key)
        except KeyProblem as exc:
            logger.error("trusted key %s: %s", row.name, exc)
            continue
        keys[key_id(key)] = key
    dev = dev_key_get()
    if dev is not None:
        keys[key_id(dev.public_key())] = dev.public_key()
    return keys
