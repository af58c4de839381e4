"""httpx's client API over aiohttp's connection pool and HTTP/1.1 parser.

Every remote call goes through httpx (routing/backends/__init__.py), but httpcore's pure-Python
HTTP/1.1 parser costs several times the CPU per streamed answer of aiohttp's C parser, a large
share of a gateway request's CPU (docs/benchmarks.md). LiteLLM makes the same choice (its
aiohttp transport for httpx). This transport keeps httpx's requests, responses, timeouts and
exceptions, so adapters and their error handling do not change: timeouts raise
httpx.TimeoutException subclasses, everything else from the connection an
httpx.TransportError."""

from __future__ import annotations

import contextlib
import ssl
from urllib.request import getproxies

import aiohttp
import certifi
import httpx


def _timeout(request: httpx.Request) -> aiohttp.ClientTimeout:
    timeout = request.extensions.get("timeout") or {}
    return aiohttp.ClientTimeout(
        total=None, sock_connect=timeout.get("connect"), sock_read=timeout.get("read")
    )


@contextlib.contextmanager
def _reading(request: httpx.Request):
    """aiohttp's errors while a body is read, as httpx's."""
    try:
        yield
    except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
        raise httpx.ReadTimeout(str(exc) or "read timed out", request=request) from exc
    except aiohttp.ClientError as exc:
        raise httpx.ReadError(str(exc) or type(exc).__name__, request=request) from exc


class _Body(httpx.AsyncByteStream):
    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request) -> None:
        self.response, self.request = response, request

    async def __aiter__(self):
        with _reading(self.request):
            async for chunk in self.response.content.iter_any():
                yield chunk

    async def read_all(self) -> bytes:
        """The whole body in one piece."""
        with _reading(self.request):
            return await self.response.read()

    async def aclose(self) -> None:
        # Read to the end: the connection goes back to the pool. Left mid-way (the client
        # went away): drop the connection, so the upstream sees the disconnect and stops.
        if self.response.content.at_eof():
            self.response.release()
        else:
            self.response.close()


class AiohttpTransport(httpx.AsyncBaseTransport):
    """One aiohttp session (created in the loop that first sends; asyncio objects belong to
    their loop, as routing.backends.http_client's clients do)."""

    def __init__(self, *, limit: int = 4096, limit_per_host: int = 0) -> None:
        self.limit, self.limit_per_host = limit, limit_per_host
        self._session: aiohttp.ClientSession | None = None

    def _session_get(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self.limit,
                limit_per_host=self.limit_per_host,
                ssl=ssl.create_default_context(cafile=certifi.where()),
            )
            # httpx decodes content-encoding itself; proxies from the environment as httpx.
            # aiohttp reads the environment (and ~/.netrc) again on every request when it
            # trusts it: only when a proxy is set at all.
            self._session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,
                trust_env=bool(getproxies()),
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        session = self._session_get()
        try:
            response = await session.request(
                request.method,
                str(request.url),
                data=await request.aread(),
                headers=list(request.headers.multi_items()),
                allow_redirects=False,
                timeout=_timeout(request),
                skip_auto_headers=("Content-Type",),
            )
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise httpx.ConnectTimeout(str(exc) or "timed out", request=request) from exc
        except aiohttp.ClientConnectorError as exc:
            raise httpx.ConnectError(str(exc), request=request) from exc
        except aiohttp.ClientError as exc:
            raise httpx.RemoteProtocolError(
                str(exc) or type(exc).__name__, request=request
            ) from exc
        return httpx.Response(
            response.status,
            headers=list(response.raw_headers),
            stream=_Body(response, request),
            request=request,
        )

    async def handle_whole(self, request: httpx.Request) -> httpx.Response:
        """handle_async_request, with the body read in one piece (the response is not a
        stream: httpx decodes its content-encoding as it builds it)."""
        response = await self.handle_async_request(request)
        body = response.stream
        assert isinstance(body, _Body)  # this transport's own
        try:
            raw = await body.read_all()
        finally:
            await body.aclose()
        return httpx.Response(
            response.status_code, headers=response.headers, content=raw, request=request
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    def abandon(self) -> None:
        """Close the sockets of a session whose event loop has closed (a test's, or a
        command's): nothing can await there any more, so this is synchronous."""
        session, self._session = self._session, None
        if session is None or session.closed:
            return
        connector = session.connector
        session.detach()
        if connector is not None:
            # close() is a coroutine, and its loop is gone: the synchronous part of it, which
            # closes the transports (aiohttp's own __del__ calls the same).
            connector._close(abort_ssl=True)


async def post_whole(
    client: httpx.AsyncClient,
    url: httpx.URL,
    *,
    content: bytes,
    headers: dict[str, str],
    timeout: httpx.Timeout,
) -> httpx.Response:
    """`client.post(...)` read to the end, sent straight to this module's transport when it is
    the one that serves `url` (a proxy from the environment mounts another, which keeps the
    client's path). The client's own request building, auth and redirect flows and chunked
    reading of the body were a tenth of a gateway request's CPU with the GIL held (py-spy,
    16 clients), and a provider call uses none of them: the request is the same (the
    client's default headers, then the call's), and so are the errors."""
    transport = client._transport_for_url(url)
    if not isinstance(transport, AiohttpTransport):
        return await client.post(url, content=content, headers=headers, timeout=timeout)
    merged = client.headers.copy()
    merged.update(headers)
    request = httpx.Request(
        "POST", url, headers=merged, content=content, extensions={"timeout": timeout.as_dict()}
    )
    return await transport.handle_whole(request)
