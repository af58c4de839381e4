"""Backend adapters: one protocol over every kind (capabilities and prices on the Route, a
cheap health probe, a streamed call; leases in routing/leases.py). Remote calls share one
httpx.AsyncClient per event loop (pooled connections; asyncio clients belong to their loop)."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
from collections.abc import AsyncGenerator

import httpx

from routing.backends import anthropic, openai_format
from routing.backends.aio import AiohttpTransport
from routing.backends.anthropic import anthropic_stream
from routing.backends.base import BackendSpec, Call, Route, models_probe
from routing.backends.openai_format import OPENAI_KINDS, openai_embed, openai_stream
from routing.credentials import credential_resolve
from routing.errors import backend_error
from routing.models import BackendKind
from tenants.errors import ApplicationError
from workers.serving.events import RemoteEvent

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
        return credential_resolve(
            ref=spec.credential_ref, encrypted=spec.credential_encrypted, backend=spec.name
        )
    except ApplicationError as exc:
        raise backend_error("backend_unavailable", exc.message, backend=spec.name) from None


@contextlib.contextmanager
def _upstream_errors(spec: BackendSpec):
    """Anything httpx raises, as the backend's error. ValueError covers what it raises before
    sending: a credential not valid in a header (UnicodeEncodeError), a malformed URL."""
    try:
        yield
    except httpx.TimeoutException as exc:
        raise backend_error("timeout", type(exc).__name__, backend=spec.name) from None
    except (httpx.HTTPError, httpx.InvalidURL, ValueError) as exc:
        raise backend_error("backend_unavailable", type(exc).__name__, backend=spec.name) from None


async def backend_stream(route: Route, call: Call) -> AsyncGenerator[RemoteEvent, None]:
    """A remote backend's answer as platform events (Tokens, Finish, Reported). Any failure,
    connection errors and timeouts included, is the backend's error (routing/errors.py)."""
    spec = route.backend
    if spec.kind in OPENAI_KINDS:
        stream = openai_stream
    elif spec.kind == BackendKind.ANTHROPIC:
        stream = anthropic_stream
    else:
        raise backend_error(
            "backend_unavailable", f"no remote adapter for kind {spec.kind}", backend=spec.name
        )
    with _upstream_errors(spec):
        async for event in stream(http_client(), spec, call, _secret(spec), _timeout(spec)):
            yield event


async def backend_probe(spec: BackendSpec) -> None:
    """Raises the backend's error unless it answers a free request (its model list)."""
    headers = (anthropic.headers if spec.kind == BackendKind.ANTHROPIC else openai_format.headers)(
        _secret(spec)
    )
    with _upstream_errors(spec):
        await models_probe(http_client(), spec.base_url, headers, _timeout(spec), backend=spec.name)


async def backend_embed(route: Route, inputs: list) -> dict:
    spec = route.backend
    with _upstream_errors(spec):
        return await openai_embed(
            http_client(), spec, route.upstream, inputs, _secret(spec), _timeout(spec)
        )


__all__ = [
    "BackendSpec",
    "Call",
    "Route",
    "backend_embed",
    "backend_probe",
    "backend_stream",
    "http_client",
]
