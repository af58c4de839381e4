"""A bare pass-through for `bench gateway --passthrough`: uvicorn and one aiohttp session
forwarding each request to the upstream as it came, no auth, no budgets, no ledger. It is the
ceiling any Python gateway on this machine can reach (and how far more processes can lift it
when the load, the upstream and the databases share the same cores):

    UPSTREAM=http://127.0.0.1:9000 python -m uvicorn routing.bench.passthrough:app --workers 2
"""

from __future__ import annotations

import os

import aiohttp

from routing.bench.upstream import body_read

UPSTREAM = os.environ.get("UPSTREAM", "http://127.0.0.1:9000")
_session: aiohttp.ClientSession | None = None


async def app(scope, receive, send) -> None:
    global _session
    if scope["type"] != "http":
        return
    body = await body_read(receive)
    if _session is None:
        _session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    async with _session.request(
        scope["method"],
        UPSTREAM + scope["path"],
        data=body,
        headers={"content-type": "application/json"},
    ) as response:
        await send(
            {
                "type": "http.response.start",
                "status": response.status,
                "headers": [
                    (
                        b"content-type",
                        response.headers.get("content-type", "application/json").encode(),
                    )
                ],
            }
        )
        async for chunk in response.content.iter_any():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})
