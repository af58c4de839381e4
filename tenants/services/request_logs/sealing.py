"""Request log content encrypted at rest with Fernet (AES-128-CBC and HMAC-SHA256, from the
`cryptography` package). MultiFernet over FAIRLANE_REQUEST_LOG_KEYS: the first key encrypts,
every key decrypts, and `content_reseal` re-encrypts a token under the first key (rotation)."""

from __future__ import annotations

import base64
import json
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


def derived_key(secret: str) -> bytes:
    """The key used when no FAIRLANE_REQUEST_LOG_KEYS is set: derived from SECRET_KEY."""
    raw = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=None, info=b"fairlane request logs"
    ).derive(secret.encode())
    return base64.urlsafe_b64encode(raw)


@lru_cache(maxsize=4)
def _fernet(keys: tuple[str, ...], secret: str) -> MultiFernet:
    try:
        fernets = [Fernet(key.encode()) for key in keys] or [Fernet(derived_key(secret))]
    except ValueError as exc:
        raise ImproperlyConfigured(
            "FAIRLANE_REQUEST_LOG_KEYS: each key must be 32 url-safe base64-encoded bytes "
            "(Fernet.generate_key())."
        ) from exc
    return MultiFernet(fernets)


def fernet() -> MultiFernet:
    return _fernet(tuple(settings.FAIRLANE_REQUEST_LOG_KEYS), settings.SECRET_KEY)


def content_seal(content: dict) -> bytes:
    return fernet().encrypt(json.dumps(content, ensure_ascii=False).encode())


def content_open(token: bytes | memoryview) -> dict:
    """The content back; raises InvalidToken when no configured key opens it."""
    return json.loads(fernet().decrypt(bytes(token)))


def content_reseal(token: bytes | memoryview) -> bytes:
    """The same content under the first key (rotation)."""
    return fernet().rotate(bytes(token))


__all__ = ["InvalidToken", "content_open", "content_reseal", "content_seal", "derived_key"]
