"""Images as bytes, for providers that take no URLs (Anthropic's base64 `source` blocks): a
data URL is decoded; an http(s) URL is fetched by this process within a size and a time limit
(FAIRLANE_IMAGE_MAX_BYTES, FAIRLANE_IMAGE_FETCH_TIMEOUT_SECONDS), without following
redirects, and never from a private, loopback or link-local address (unless
FAIRLANE_IMAGE_FETCH_PRIVATE): a client must not reach our own network through us. Whatever
fails is the client's 400, saying why."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
from urllib.parse import urlsplit

import httpx
from django.conf import settings

from routing.wire.messages import DATA_URL, IMAGE_TYPES
from tenants.errors import InvalidRequest


def _too_large(param: str) -> InvalidRequest:
    return InvalidRequest(f"An image is larger than the {settings.FAIRLANE_IMAGE_MAX_BYTES} "
                          "bytes this model's backend takes.", param=param)


async def _public_only(url: str, param: str) -> None:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(parts.hostname, port)
    except OSError:
        raise InvalidRequest(f"The image host {parts.hostname!r} does not resolve.",
                             param=param) from None
    for info in infos:
        address = ipaddress.ip_address(info[4][0])
        if not address.is_global or address.is_multicast:
            raise InvalidRequest("Image URLs on private, loopback or link-local addresses are "
                                 "not fetched.", param=param)


async def _fetch(client: httpx.AsyncClient, url: str, param: str) -> tuple[str, bytes]:
    limit = settings.FAIRLANE_IMAGE_MAX_BYTES
    async with client.stream("GET", url, follow_redirects=False,
                             timeout=settings.FAIRLANE_IMAGE_FETCH_TIMEOUT_SECONDS) as response:
        if response.is_redirect:
            raise InvalidRequest("The image URL redirects; redirects are not followed.",
                                 param=param)
        if response.status_code != 200:
            raise InvalidRequest(f"The image URL answered HTTP {response.status_code}.",
                                 param=param)
        media = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if media not in IMAGE_TYPES:
            raise InvalidRequest(f"The image URL serves {media or 'no content type'!s}, not "
                                 "PNG, JPEG, GIF or WebP.", param=param)
        if int(response.headers.get("content-length") or 0) > limit:
            raise _too_large(param)
        data = bytearray()
        async for piece in response.aiter_bytes():
            data += piece
            if len(data) > limit:
                raise _too_large(param)
    return media, bytes(data)


async def image_fetch(client: httpx.AsyncClient, url: str, param: str) -> tuple[str, bytes]:
    """(media type, bytes) of an http(s) image, or InvalidRequest saying why not."""
    if not settings.FAIRLANE_IMAGE_FETCH_PRIVATE:
        await _public_only(url, param)
    seconds = settings.FAIRLANE_IMAGE_FETCH_TIMEOUT_SECONDS
    try:
        async with asyncio.timeout(seconds):  # the whole fetch, however slowly it trickles
            return await _fetch(client, url, param)
    except TimeoutError:
        raise InvalidRequest(f"The image URL was not fetched within {seconds:g} s.",
                             param=param) from None
    except httpx.HTTPError as exc:
        raise InvalidRequest(f"The image URL could not be fetched ({type(exc).__name__}).",
                             param=param) from None


async def image_source(client: httpx.AsyncClient, url: str, param: str) -> dict:
    """Anthropic's `{"type": "base64", "media_type", "data"}` for an image URL."""
    match = DATA_URL.fullmatch(url)
    if match is not None:  # checked when parsed (routing/wire/messages.py)
        media, data = match.group(1), match.group(2)
        if len(data) * 3 // 4 > settings.FAIRLANE_IMAGE_MAX_BYTES:
            raise _too_large(param)
        return {"type": "base64", "media_type": media, "data": data}
    media, raw = await image_fetch(client, url, param)
    return {"type": "base64", "media_type": media,
            "data": base64.b64encode(raw).decode("ascii")}
