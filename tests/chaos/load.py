"""Clients for the chaos tests: many streamed chat completions at once, each recorded as the
client saw it (status, request id, chunks, the error chunk if any, [DONE])."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx

from tests.servers import AsgiServer


@dataclass
class Outcome:
    status: int = 0
    request_id: str = ""
    retry_after: str | None = None
    chunks: list[dict] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)
    has_done: bool = False
    failure: str = ""  # a transport failure (the connection was cut without [DONE])

    @property
    def completion_tokens(self) -> int | None:
        usage = next((c["usage"] for c in reversed(self.chunks) if c.get("usage")), None)
        return usage["completion_tokens"] if usage else None

    def is_clean(self) -> bool:
        """Completed, or ended with exactly one error chunk; or refused before it started."""
        if self.status != 200:
            return bool(self.errors) and self.failure == ""
        if not self.has_done or self.failure or len(self.errors) > 1:
            return False
        if not self.errors:
            return True
        after = self.chunks[self.chunks.index(self.errors[0]) + 1 :]
        return all(not c.get("choices") for c in after)  # at most the usage chunk follows


async def stream(
    client: httpx.AsyncClient, key: str, body: dict, started: list | None = None
) -> Outcome:
    """One streamed request; appended to `started` when its first chunk arrives."""
    outcome = Outcome()
    try:
        async with client.stream(
            "POST",
            "/v1/chat/completions",
            json={**body, "stream": True},
            headers={"Authorization": f"Bearer {key}"},
        ) as response:
            outcome.status = response.status_code
            outcome.request_id = response.headers.get("x-request-id", "")
            outcome.retry_after = response.headers.get("retry-after")
            if response.status_code != 200:
                outcome.errors.append(json.loads(await response.aread()))
                return outcome
            async for line in response.aiter_lines():
                if line == "data: [DONE]":
                    outcome.has_done = True
                elif line.startswith("data: "):
                    chunk = json.loads(line[6:])
                    outcome.chunks.append(chunk)
                    if started is not None and len(outcome.chunks) == 2:
                        started.append(outcome)
                    if "error" in chunk:
                        outcome.errors.append(chunk)
    except httpx.HTTPError as exc:
        outcome.failure = f"{type(exc).__name__}: {exc}"
    return outcome


async def storm(
    url: str, key: str, body: dict, count: int, started: list | None = None
) -> list[Outcome]:
    limits = httpx.Limits(max_connections=count + 16, max_keepalive_connections=count)
    async with httpx.AsyncClient(base_url=url, timeout=180, limits=limits) as client:
        return list(
            await asyncio.gather(*(stream(client, key, body, started) for _ in range(count)))
        )


async def clients_run(
    count: int, request: Callable[[httpx.AsyncClient, int, int], Awaitable[None]], stop
) -> None:
    """`count` clients, each calling `request(http, client number, i)` for i = 0, 1, ... until
    `stop` is set; a request whose connection was cut (the server killed) is followed by the
    next one a moment later, once the server is back."""

    async def one(n: int) -> None:
        async with httpx.AsyncClient(timeout=30) as http:
            i = 0
            while not stop.is_set():
                try:
                    await request(http, n, i)
                except httpx.TransportError:
                    await asyncio.sleep(0.05)
                i += 1

    await asyncio.gather(*(one(n) for n in range(count)))


async def api_restarted(servers: list[AsgiServer], env: dict) -> None:
    """SIGKILL the last of `servers` (mid-request, as it may be) and start another."""
    os.killpg(servers[-1].proc.pid, signal.SIGKILL)
    servers.append(await asyncio.to_thread(AsgiServer, env))


async def until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met in {timeout:.0f} s")
        await asyncio.sleep(0.05)


def warm_up(url: str, key: str, body: dict, timeout: float = 120) -> None:
    """Until one request is served end to end (the worker has loaded its models)."""

    async def go():
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            deadline = time.monotonic() + timeout
            while True:
                outcome = await stream(client, key, {**body, "max_tokens": 2})
                if outcome.status == 200 and outcome.has_done:
                    return
                assert time.monotonic() < deadline, outcome
                await asyncio.sleep(0.5)

    asyncio.run(go())
