"""/v1's event loop gets FAIRLANE_API_THREADS threads for its blocking calls (holds and
settlements wait on the database there), not asyncio's cores + 4: under load more of them can
wait at once, and group commit batches as many as are waiting."""

import asyncio
import os
import threading

import httpx
import pytest

from api_handler import ApiASGIHandler


async def waiting_at_once(app, settings, threads: int, calls: int) -> bool:
    """After one /v1 request, can `calls` blocking calls wait on the loop's pool together?"""
    settings.FAIRLANE_API_THREADS = threads
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        answer = await client.get("/v1/models")  # no key: refused before any database work
    assert answer.status_code == 401 and answer.json()["error"]["message"]
    barrier = threading.Barrier(calls, timeout=3)

    def wait() -> bool:
        try:
            barrier.wait()
            return True
        except threading.BrokenBarrierError:
            return False

    return all(await asyncio.gather(*(asyncio.to_thread(wait) for _ in range(calls))))


# One more call than asyncio's own pool holds (min(32, cores + 4)) on whatever machine this is.
CALLS = min(32, (os.cpu_count() or 1) + 4) + 1


@pytest.mark.parametrize(("threads", "together"), [(CALLS, True), (0, False)])
async def test_the_api_loop_has_the_configured_threads(settings, threads, together):
    assert await waiting_at_once(ApiASGIHandler(), settings, threads, CALLS) is together
