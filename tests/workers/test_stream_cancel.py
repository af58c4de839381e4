"""A request whose client leaves while it waits for its stream is cancelled at once, not at its
first-event timeout: redis-py's asyncio client can lose a cancellation that lands as an XREAD
returns (CI saw two queued requests cancelled by a test run on to the 300-second default), so
the API side's read loop honours the cancellation itself (workers/transport.py)."""

import asyncio
import random
import uuid

import redis.asyncio

from workers.transport import redis_stream_events

READERS = 300


async def test_every_cancelled_stream_read_ends_within_a_read(settings):
    settings.FAIRLANE_FIRST_EVENT_TIMEOUT_SECONDS = 30  # a lost cancel would wait this long
    clients = [redis.asyncio.Redis.from_url(settings.REDIS_URL) for _ in range(READERS)]

    async def read(client):
        # Short reads: many of them return while the cancellation lands, the race in question.
        async for _ in redis_stream_events(client, f"nobody-{uuid.uuid4().hex}", block_ms=5):
            raise AssertionError("no worker writes to this stream")

    rng = random.Random(7)
    tasks = [asyncio.create_task(read(c)) for c in clients]
    try:

        async def cancel_later(task):
            await asyncio.sleep(rng.uniform(0.05, 1.0))
            task.cancel()

        await asyncio.gather(*(cancel_later(t) for t in tasks))
        done, pending = await asyncio.wait(tasks, timeout=10)
        assert not pending, f"{len(pending)} of {READERS} reads went on after their cancellation"
        assert all(t.cancelled() for t in done)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(c.aclose() for c in clients))
