"""Images as bytes, for providers that take no URLs (Anthropic's base64 `source` blocks): a
data URL is decoded; an http(s) URL is fetched by this process within a size and a time limit
(FAIRLANE_IMAGE_MAX_BYTES, FAIRLANE_IMAGE_FETCH_TIMEOUT_SECONDS), without following
redirects, and never from an address that is not public (tenants/addresses.py; unless
FAIRLANE_IMAGE_FETCH_ALLOW_PRIVATE): a client must not reach our own network through us. The
request goes to the address that was checked, and the address its connection reached is
checked once more. Whatever fails is the client's 400, saying why."""

from __future__ import annotations

import asyncio
import base64
import socket
from urllib.parse import urlsplit, urlunsplit

import httpx
from django.conf import settings

from routing.wire.messages import DATA_URL, IMAGE_TYPES
from tenants.addresses import address_public, peer_address
from tenants.errors import InvalidRequest


def _too_large(param: str) -> InvalidRequest:
    return InvalidRequest(
        f"An image is larger than the {settings.FAIRLANE_IMAGE_MAX_BYTES} "
        "bytes this model's backend takes.",
        param=param,
    )


def _not_public(host: str, param: str) -> InvalidRequest:
    return InvalidRequest(
        f"The image host {host!r} is not on a public address; such image URLs are not fetched.",
        param=param,
    )


async def _addresses(host: str, port: int, param: str) -> list[str]:
    """The host's addresses, each checked: the request goes to one of these, so a name that
    resolves elsewhere a moment later cannot send it inside (as alert webhooks do)."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        raise InvalidRequest(f"The image host {host!r} does not resolve.", param=param) from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not settings.FAIRLANE_IMAGE_FETCH_ALLOW_PRIVATE and not all(map(address_public, addresses)):
        raise _not_public(host, param)
    return addresses


async def _fetch(url: str, param: str) -> tuple[str, bytes]:
    limit = settings.FAIRLANE_IMAGE_MAX_BYTES
    parts = urlsplit(url)
    hostname = parts.hostname
    if not hostname:
        raise InvalidRequest("The image URL names no host.", param=param)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    address = (await _addresses(hostname, port, param))[0]
    literal = f"[{address}]" if ":" in address else address
    pinned = urlunsplit((parts.scheme, f"{literal}:{port}", parts.path or "/", parts.query, ""))
    host = hostname if parts.port is None else f"{hostname}:{parts.port}"
    # A client of its own, not the backends' pool: httpx's own transport honours the TLS name
    # of the pinned address (sni_hostname), and no proxy from the environment is used.
    async with (
        httpx.AsyncClient(trust_env=False, follow_redirects=False) as client,
        client.stream(
            "GET",
            pinned,
            headers={"host": host},
            extensions={"sni_hostname": hostname},
            timeout=settings.FAIRLANE_IMAGE_FETCH_TIMEOUT_SECONDS,
        ) as response,
    ):
        peer = peer_address(response)  # what was actually connected to
        if not (
            settings.FAIRLANE_IMAGE_FETCH_ALLOW_PRIVATE or peer is None or address_public(peer)
        ):
            raise _not_public(hostname, param)
        if response.is_redirect:
            raise InvalidRequest(
                "The image URL redirects; redirects are not followed.", param=param
            )
        if response.status_code != 200:
            raise InvalidRequest(
                f"The image URL answered HTTP {response.status_code}.", param=param
            )
        media = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if media not in IMAGE_TYPES:
            raise InvalidRequest(
                f"The image URL serves {media or 'no content type'!s}, not PNG, JPEG, GIF or WebP.",
                param=param,
            )
        if int(response.headers.get("content-length") or 0) > limit:
            raise _too_large(param)
        data = bytearray()
        async for piece in response.aiter_bytes():
            data += piece
            if len(data) > limit:
                raise _too_large(param)
    return media, bytes(data)


async def image_fetch(url: str, param: str) -> tuple[str, bytes]:
    """(media type, bytes) of an http(s) image, or InvalidRequest saying why not."""
    seconds = settings.FAIRLANE_IMAGE_FETCH_TIMEOUT_SECONDS
    try:
        async with asyncio.timeout(seconds):  # the whole fetch, however slowly it trickles
            return await _fetch(url, param)
    except TimeoutError:
        raise InvalidRequest(
            f"The image URL was not fetched within {seconds:g} s.", param=param
        ) from None
    except (httpx.HTTPError, ValueError) as exc:  # ValueError: a header it cannot send
        raise InvalidRequest(
            f"The image URL could not be fetched ({type(exc).__name__}).", param=param
        ) from None


async def image_source(url: str, param: str) -> dict:
    """Anthropic's `{"type": "base64", "media_type", "data"}` for an image URL."""
    match = DATA_URL.fullmatch(url)
    if match is not None:  # checked when parsed (routing/wire/messages.py)
        media, data = match.group(1), match.group(2)
        if len(data) * 3 // 4 > settings.FAIRLANE_IMAGE_MAX_BYTES:
            raise _too_large(param)
        return {"type": "base64", "media_type": media, "data": data}
    media, raw = await image_fetch(url, param)
    return {"type": "base64", "media_type": media, "data": base64.b64encode(raw).decode("ascii")}
