"""The runtime's dispatchers: how a request for the local engine pool is run and its events
come back. Embedded: on this process's engines, their outputs arriving on the event loop.
Distributed: on the model's fair queue for the GPU workers, its events read back from its
Redis stream (workers/transport.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Callable

import redis
import redis.asyncio

from workers.fairqueue import FairQueue
from workers.fairqueue.local import LocalQueue
from workers.host import EngineHost, ModelLoadFailed, load_failed_event
from workers.run_loops import run_on_loop
from workers.serving.errors import StreamLost
from workers.serving.events import Done, Event, Failed
from workers.serving.jobs import Job
from workers.serving.outbox import Outbox
from workers.transport import cancel_request, queue_for, redis_stream_events, stream_key

logger = logging.getLogger(__name__)


class EmbeddedDispatcher:
    """Runs requests on this process's engines; their outputs arrive on the event loop."""

    def __init__(self, *, host: EngineHost, outbox: Outbox, local_queue: LocalQueue) -> None:
        self.host, self.outbox, self.local_queue = host, outbox, local_queue

    async def events(self, job: Job) -> AsyncGenerator[Event, None]:
        try:
            engine = await asyncio.to_thread(self.host.load, job.model_info)
        except ModelLoadFailed as exc:  # nothing ran: the walk falls through, or answers 503
            yield load_failed_event(exc)
            return
        async for event in run_on_loop(
            job,
            engine,
            backend="embedded",
            outbox=self.outbox,
            runs=self.host.runs,
            local_queue=self.local_queue,
        ):
            yield event

    def cancel(self, request_id: str) -> None:
        self.host.runs.cancel(request_id)


class QueueDispatcher:
    """Puts requests on their model's fair queue for the GPU workers, and reads their events
    back from Redis."""

    def __init__(
        self, client: redis.Redis, async_client: Callable[[], redis.asyncio.Redis]
    ) -> None:
        self.sync_client = client
        self.async_client = async_client  # a new one per request (see events)

    async def events(self, job: Job) -> AsyncGenerator[Event, None]:
        queue = queue_for(self.sync_client, job.model["name"])
        try:
            await asyncio.to_thread(self._enqueue, queue, job)
        except redis.RedisError:  # nothing queued: the walk falls through, or answers 503
            logger.warning("request %s: the queue is unreachable", job.request_id, exc_info=True)
            yield Failed(
                code="service_unavailable",
                retryable=True,
                retry_after=2,
                message="The request queue is unreachable; retry shortly.",
            )
            return
        # A client per request: asyncio connections belong to the loop that made them.
        client = self.async_client()
        is_done = has_events = False
        try:
            async for event in redis_stream_events(client, job.request_id):
                is_done, has_events = isinstance(event, Done), True
                yield event
        except StreamLost:
            if has_events:
                raise  # settled from what was streamed (routing.services.answers)
            logger.warning("request %s: Redis failed before a worker took it", job.request_id)
            yield Failed(
                code="service_unavailable",
                retryable=True,
                retry_after=2,
                message="The request queue failed; retry shortly.",
            )
        finally:
            if not is_done:
                self.cancel(job.request_id)
            await client.aclose()

    def _enqueue(self, queue: FairQueue, job: Job) -> None:
        # An earlier round of this request's walk may have left events (a refusal): start clean.
        self.sync_client.delete(stream_key(job.request_id))
        job.timeline["queued"] = time.time()
        queue.enqueue(
            id=job.request_id,
            tenant=str(job.tenant_id),
            lane=job.lane,
            weight=job.weight,
            cost=sum(len(p) for p in job.prompts),
            payload=job.to_dict(),
        )

    def cancel(self, request_id: str) -> None:
        try:
            cancel_request(self.sync_client, request_id)
        except redis.RedisError:  # Redis is gone: so is the worker's way to hear it
            logger.warning("request %s: cancel not sent (Redis)", request_id, exc_info=True)
