"""Provider credentials, never stored or logged in plain text.

A backend either names where its secret lives (`env:NAME`, read from the process environment
when used) or holds it encrypted with Fernet (AES-128-CBC + HMAC-SHA256) under a key derived
from FAIRLANE_CREDENTIALS_KEY (default: SECRET_KEY). A database dump holds only ciphertext.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import os

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings

from tenants.errors import BackendUnavailable, InvalidRequest

ENV_PREFIX = "env:"


def _fernet() -> Fernet:
    secret = settings.FAIRLANE_CREDENTIALS_KEY.encode()
    return Fernet(
        base64.urlsafe_b64encode(hashlib.sha256(b"fairlane-credentials:" + secret).digest())
    )


def credential_encrypt(plain: str) -> str:
    return _fernet().encrypt(plain.encode()).decode()


def credential_ref_check(ref: str) -> None:
    if ref and not (ref.startswith(ENV_PREFIX) and len(ref) > len(ENV_PREFIX)):
        raise InvalidRequest(
            "credential_ref must look like env:VARIABLE_NAME.", param="credential_ref"
        )


@functools.lru_cache(maxsize=256)
def _decrypted(encrypted: str, key: str) -> str:
    """Decrypting costs more than the rest of sending a request: each ciphertext is decrypted
    once per process (and again if FAIRLANE_CREDENTIALS_KEY changes)."""
    return _fernet().decrypt(encrypted.encode()).decode()


def credential_resolve(*, ref: str, encrypted: str, backend: str) -> str:
    """The plain secret, for the request being sent; '' when the backend needs none."""
    if encrypted:
        try:
            return _decrypted(encrypted, settings.FAIRLANE_CREDENTIALS_KEY)
        except InvalidToken:
            raise BackendUnavailable(
                f"The credential of backend {backend} cannot be "
                "decrypted (was FAIRLANE_CREDENTIALS_KEY changed?)."
            ) from None
    if ref:
        value = os.environ.get(ref.removeprefix(ENV_PREFIX), "")
        if not value:
            raise BackendUnavailable(f"Backend {backend}'s credential ({ref}) is not set.")
        return value
    return ""
