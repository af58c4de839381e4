"""Webhooks: where they may point, how they are signed, and how one is sent.

- Only http(s) URLs, and no address that is not public (tenants/addresses.py: loopback,
  private, link-local, carrier-grade NAT, multicast, reserved, and IPv4 inside IPv6) unless
  FAIRLANE_ALERT_WEBHOOK_ALLOW_PRIVATE: the name is resolved and every address it has is
  checked, when the URL is saved and again at each delivery; the request goes to an address
  that was checked (so a name that resolves elsewhere a moment later cannot redirect it), and
  the address its connection reached is checked once more. Redirects are not followed.
- Signed like Standard Webhooks (https://www.standardwebhooks.com): headers `webhook-id`
  (the delivery's id, the same on every retry), `webhook-timestamp` (Unix seconds) and
  `webhook-signature: v1,<base64 HMAC-SHA256 over "<id>.<timestamp>.<body>">`, keyed by the
  destination's secret (`whsec_<base64>`, shown once when the destination is added).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
from cryptography.fernet import Fernet
from django.conf import settings

from tenants.addresses import address_public, peer_address
from tenants.errors import InvalidRequest

SECRET_PREFIX = "whsec_"
NOT_PUBLIC = (
    "The webhook host {host!r} is not on a public address; operators can allow "
    "private addresses with FAIRLANE_ALERT_WEBHOOK_ALLOW_PRIVATE."
)
USER_AGENT = "Fairlane-Webhooks/1"


@dataclass(frozen=True, slots=True)
class Target:
    """A webhook URL resolved to the addresses it may be sent to."""

    scheme: str
    host: str
    port: int
    path: str  # with the query string
    addresses: tuple[str, ...]


def webhook_target(url: str) -> Target:
    """The URL's parts and addresses; InvalidRequest (param `target`) when it may not be used."""
    if not isinstance(url, str) or len(url) > 2000:
        raise InvalidRequest(
            "The webhook URL must be a string of at most 2000 characters.", param="target"
        )
    parts = urlsplit(url.strip())
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise InvalidRequest(
            "The webhook URL must start with http:// or https:// and name a host.", param="target"
        )
    if parts.username or parts.password:
        raise InvalidRequest(
            "Put no credentials in the webhook URL; requests are signed.", param="target"
        )
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        infos = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
    except (ValueError, OSError):
        raise InvalidRequest(
            f"The webhook host {parts.hostname!r} could not be resolved.", param="target"
        ) from None
    addresses = tuple(dict.fromkeys(str(info[4][0]) for info in infos))
    if not settings.FAIRLANE_ALERT_WEBHOOK_ALLOW_PRIVATE and not all(
        map(address_public, addresses)
    ):
        # Which address is not said: the answer would map our network for the asker.
        raise InvalidRequest(NOT_PUBLIC.format(host=parts.hostname), param="target")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Target(parts.scheme, parts.hostname, port, path, addresses)


def secret_new() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def _fernet() -> Fernet:
    key = settings.FAIRLANE_CREDENTIALS_KEY.encode()
    return Fernet(base64.urlsafe_b64encode(hashlib.sha256(b"fairlane-webhooks:" + key).digest()))


def secret_encrypt(secret: str) -> str:
    return _fernet().encrypt(secret.encode()).decode()


def secret_decrypt(token: str) -> str:
    return _fernet().decrypt(token.encode()).decode()


def signature(*, secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def webhook_post(
    *, url: str, body: bytes, secret: str, msg_id: str, timestamp: int, timeout: float
) -> int:
    """POST the body to the first address of the URL that answers; its HTTP status.
    Raises InvalidRequest (refused target) or httpx.HTTPError (no answer)."""
    target = webhook_target(url)  # checked again: the name may resolve elsewhere now
    default_port = {"http": 80, "https": 443}[target.scheme]
    host_header = target.host if target.port == default_port else f"{target.host}:{target.port}"
    headers = {
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        "host": host_header,
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(
            secret=secret, msg_id=msg_id, timestamp=timestamp, body=body
        ),
    }
    error: httpx.HTTPError | None = None
    with httpx.Client(timeout=timeout, follow_redirects=False, trust_env=False) as client:
        for address in target.addresses:
            literal = f"[{address}]" if ":" in address else address
            try:
                with client.stream(
                    "POST",
                    f"{target.scheme}://{literal}:{target.port}{target.path}",
                    content=body,
                    headers=headers,
                    extensions={"sni_hostname": target.host},
                ) as response:
                    peer = peer_address(response)  # what was actually connected to
                    if not (
                        settings.FAIRLANE_ALERT_WEBHOOK_ALLOW_PRIVATE
                        or peer is None
                        or address_public(peer)
                    ):
                        raise InvalidRequest(NOT_PUBLIC.format(host=target.host), param="target")
                    response.read()
                    return response.status_code
            except httpx.HTTPError as exc:
                error = exc
    raise error or httpx.ConnectError("no address")
