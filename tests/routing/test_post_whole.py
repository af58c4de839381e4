"""A whole answer's call goes straight to the aiohttp transport (routing.backends.aio.post_whole):
the same request as httpx's client would send, its body decoded, and httpx's errors."""

import asyncio
import gzip
import json

import httpx
import pytest
from aiohttp import web

from routing.backends import http_client
from routing.backends.aio import post_whole

BODY = json.dumps({"choices": [{"message": {"content": "hello"}}]}).encode()


@pytest.fixture
async def server():
    """A real HTTP server on 127.0.0.1: /echo answers with what it was sent, /gzip with a
    gzip-encoded body, /stall sends half a body and stops."""

    async def echo(request: web.Request) -> web.Response:
        return web.json_response(
            {"headers": dict(request.headers), "body": (await request.read()).decode()}
        )

    async def gzipped(request: web.Request) -> web.Response:
        return web.Response(
            body=gzip.compress(BODY),
            headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
        )

    async def stall(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Length": str(len(BODY))})
        await response.prepare(request)
        await response.write(BODY[:10])
        await asyncio.sleep(5)
        return response

    app = web.Application()
    app.router.add_post("/echo", echo)
    app.router.add_post("/gzip", gzipped)
    app.router.add_post("/stall", stall)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_a_whole_answer_is_the_request_httpx_would_send_and_its_decoded_body(server):
    client = http_client()
    response = await post_whole(
        client,
        httpx.URL(server + "/echo"),
        content=b'{"a": 1}',
        headers={"Authorization": "Bearer sk-x", "Content-Type": "application/json"},
        timeout=httpx.Timeout(5),
    )
    sent = response.json()
    assert response.status_code == 200 and sent["body"] == '{"a": 1}'
    # The client's default headers, then the call's.
    assert sent["headers"]["User-Agent"] == client.headers["user-agent"]
    assert sent["headers"]["Accept-Encoding"] == client.headers["accept-encoding"]
    assert sent["headers"]["Authorization"] == "Bearer sk-x"
    assert sent["headers"]["Content-Type"] == "application/json"

    response = await post_whole(
        client, httpx.URL(server + "/gzip"), content=b"{}", headers={}, timeout=httpx.Timeout(5)
    )
    assert response.content == BODY and response.json()["choices"][0]["message"]["content"]


async def test_a_body_that_stalls_is_httpx_read_timeout(server):
    with pytest.raises(httpx.ReadTimeout):
        await post_whole(
            http_client(),
            httpx.URL(server + "/stall"),
            content=b"{}",
            headers={},
            timeout=httpx.Timeout(0.5),
        )
    # The connection it left is not handed to the next call: that one is answered whole.
    response = await post_whole(
        http_client(),
        httpx.URL(server + "/gzip"),
        content=b"{}",
        headers={},
        timeout=httpx.Timeout(5),
    )
    assert response.content == BODY


async def test_another_transport_keeps_the_clients_own_path():
    """A client whose transport is not aiohttp's (as where a proxy mounts its own) is used as
    it is."""
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=BODY)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        response = await post_whole(
            client,
            httpx.URL("http://upstream.test/v1/x"),
            content=b"{}",
            headers={"X-Y": "z"},
            timeout=httpx.Timeout(5),
        )
    assert response.content == BODY and seen[0].headers["x-y"] == "z"
