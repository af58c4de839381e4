"""/v1's event loop gets FAIRLANE_API_THREADS threads for its blocking calls (holds and
settlements wait on the database there), not asyncio's cores + 4: under load more of them can
wait at once, and group commit batches as many as are waiting."""

import asyncio
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


@pytest.mark.parametrize(("threads", "together"), [(16, True), (0, False)])
async def test_the_api_loop_has_the_configured_threads(settings, threads, together):
    # 12 > asyncio's default of min(32, cores + 4) on this 2-core machine, <= 16
    calls = 12
    if threads == 0 and min(32, (__import__("os").cpu_count() or 1) + 4) >= calls:
        pytest.skip("asyncio's own default is large enough on this machine to hold them all")
    assert await waiting_at_once(ApiASGIHandler(), settings, threads, calls) is together
