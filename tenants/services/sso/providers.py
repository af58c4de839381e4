"""The identity providers of FAIRLANE_OIDC_PROVIDERS, and what each one's discovery document
says (`<issuer>/.well-known/openid-configuration`, read once an hour per process). A document
whose `issuer` is not the configured issuer exactly is refused (OpenID Connect Discovery 4.3):
a provider must not be able to speak for another."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import requests
from django.conf import settings

DISCOVERY_SECONDS = 3600
REQUIRED = ("issuer", "authorization_endpoint", "token_endpoint", "jwks_uri")


class ProviderUnavailable(Exception):
    """The provider's discovery document could not be read, or does not hold."""


@dataclass(frozen=True, slots=True)
class Provider:
    id: str
    name: str
    issuer: str
    client_id: str
    client_secret: str
    scopes: str
    groups_claim: str
    sign_algo: str
    pkce: bool
    rules: tuple[tuple[str, str, str, str], ...]  # (kind, value, tenant slug, role or "ops")


def providers() -> dict[str, Provider]:
    return {
        pid: Provider(
            id=pid,
            name=c["name"],
            issuer=c["issuer"],
            client_id=c["client_id"],
            client_secret=c["client_secret"],
            scopes=c["scopes"],
            groups_claim=c["groups_claim"],
            sign_algo=c["sign_algo"],
            pkce=c["pkce"],
            rules=tuple(tuple(r) for r in c["rules"]),
        )
        for pid, c in settings.FAIRLANE_OIDC_PROVIDERS.items()
    }


def provider_get(provider_id) -> Provider | None:
    return providers().get(provider_id) if provider_id else None


_lock = threading.Lock()
_documents: dict[str, tuple[float, dict]] = {}


def discovery(provider: Provider) -> dict:
    with _lock:
        cached = _documents.get(provider.issuer)
    if cached is not None and cached[0] > time.monotonic():
        return cached[1]
    url = provider.issuer.rstrip("/") + "/.well-known/openid-configuration"
    try:
        response = requests.get(url, timeout=settings.FAIRLANE_OIDC_TIMEOUT_SECONDS)
        response.raise_for_status()
        document = response.json()
    except (requests.RequestException, ValueError) as exc:
        raise ProviderUnavailable(
            f"{provider.id}: discovery failed: {type(exc).__name__}"
        ) from None
    if not isinstance(document, dict) or any(not document.get(k) for k in REQUIRED):
        raise ProviderUnavailable(f"{provider.id}: discovery document lacks {REQUIRED}")
    if document["issuer"] != provider.issuer:
        raise ProviderUnavailable(
            f"{provider.id}: discovery names issuer {document['issuer']!r}, not {provider.issuer!r}"
        )
    with _lock:
        _documents[provider.issuer] = (time.monotonic() + DISCOVERY_SECONDS, document)
    return document


def discovery_forget() -> None:
    with _lock:
        _documents.clear()
