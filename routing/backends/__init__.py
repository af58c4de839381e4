"""Backend adapters: one protocol over every kind (capabilities and prices on the Route, a
cheap health probe, a streamed call; leases in routing/leases.py). Remote calls share one
httpx.AsyncClient per event loop (pooled connections; asyncio clients belong to their loop)."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
from collections.abc import AsyncIterator

import httpx

from routing.backends import anthropic, openai_format
from routing.backends.aio import AiohttpTransport
from routing.backends.anthropic import anthropic_stream
from routing.backends.base import BackendSpec, Call, Route, UpstreamError, models_probe
from routing.backends.openai_format import OPENAI_KINDS, openai_embed, openai_stream
from routing.credentials import credential_resolve
from tenants.errors import ApplicationError
from workers.events import RemoteEvent

# Per event loop: (client, transport); a closed loop's are dropped when the next is made.
_clients: dict = {}


class _NoCookies(httpx.Cookies):
    """The shared client keeps no cookies: what one tenant's upstream response set must never
    ride on another tenant's call (and parsing them cost ~2 % of a gateway request's CPU)."""

    def extract_cookies(self, response: httpx.Response) -> None:
        pass


def http_client() -> httpx.AsyncClient:
    """This loop's client: httpx's API over aiohttp's pool and parser (routing/backends/aio.py)."""
    loop = asyncio.get_running_loop()
    client, _ = _clients.get(loop, (None, None))
    if client is None or client.is_closed:
        _abandon(closed_only=True)
        transport = AiohttpTransport(limit=4096)
        client = httpx.AsyncClient(transport=transport)
        client._cookies = _NoCookies()  # the constructor copies whatever jar it is given
        _clients[loop] = (client, transport)
    return client


@atexit.register
def _abandon(closed_only: bool = False) -> None:
    """Close the connections of clients whose loop has closed (all of them at exit)."""
    for loop in [loop for loop in _clients if loop.is_closed() or not closed_only]:
        _clients.pop(loop)[1].abandon()


def _timeout(spec: BackendSpec) -> httpx.Timeout:
    return httpx.Timeout(spec.timeout_seconds, connect=min(spec.timeout_seconds, 5.0))


def _secret(spec: BackendSpec) -> str:
    try:
        return credential_resolve(ref=spec.credential_ref, encrypted=spec.credential_encrypted,
                                  backend=spec.name)
    except ApplicationError as exc:
        raise UpstreamError("backend_unavailable", exc.message) from None


@contextlib.contextmanager
def _upstream_errors(spec: BackendSpec):
    """Anything httpx raises, as an UpstreamError. ValueError covers what it raises before
    sending: a credential not valid in a header (UnicodeEncodeError), a malformed URL."""
    try:
        yield
    except httpx.TimeoutException as exc:
        raise UpstreamError("timeout", f"{spec.name}: {type(exc).__name__}") from None
    except (httpx.HTTPError, httpx.InvalidURL, ValueError) as exc:
        raise UpstreamError("backend_unavailable", f"{spec.name}: {type(exc).__name__}") from None


async def backend_stream(route: Route, call: Call) -> AsyncIterator[RemoteEvent]:
    """A remote backend's answer as platform events (Tokens, Finish, Reported). Any failure,
    connection errors and timeouts included, is an UpstreamError."""
    spec = route.backend
    if spec.kind in OPENAI_KINDS:
        stream = openai_stream
    elif spec.kind == "anthropic":
        stream = anthropic_stream
    else:
        raise UpstreamError("backend_unavailable", f"{spec.name}: no remote adapter for "
                                                   f"kind {spec.kind}")
    with _upstream_errors(spec):
        async for event in stream(http_client(), spec, call, _secret(spec), _timeout(spec)):
            yield event


async def backend_probe(spec: BackendSpec) -> None:
    """Raises UpstreamError unless the backend answers a free request (its model list)."""
    headers = (anthropic.headers if spec.kind == "anthropic" else openai_format.headers)(
        _secret(spec))
    with _upstream_errors(spec):
        await models_probe(http_client(), spec.base_url, headers, _timeout(spec))


async def backend_embed(route: Route, inputs: list) -> dict:
    spec = route.backend
    with _upstream_errors(spec):
        return await openai_embed(http_client(), spec, route.upstream, inputs, _secret(spec),
                                  _timeout(spec))


__all__ = ["BackendSpec", "Call", "Route", "UpstreamError", "backend_embed", "backend_probe",
           "backend_stream", "http_client"]
