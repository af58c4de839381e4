"""Getting a request's events from wherever it runs to the API process that streams them.

Distributed: the API puts the request on its model's fair queue (workers/fairqueue); the
worker that takes it appends events to a per-request Redis stream (`fl:gen:<id>`); the API
reads it from its last id, so events written before it started reading are not lost (unlike
pub/sub). Cancellation goes the other way: a key the worker checks before starting, and a
pub/sub message that reaches the worker already running it.

Embedded: the run happens in the ASGI process; the engine thread hands outputs to the event
loop directly.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import redis
import redis.asyncio
from django.conf import settings

from tenants.errors import BackendUnavailable, Timeout
from workers.fairqueue import FairQueue
from workers.events import Done, Embedding, Event, Failed, Tokens, event_decode, event_encode
from workers.generation import LostOwnership, generation_run_async
from workers.jobs import GenerationJob
from workers.host import LOAD_FAILED_MESSAGE, ModelLoadFailed, host_get
from workers.runs import generation_cancel

logger = logging.getLogger(__name__)

CANCEL_CHANNEL = "fl:cancel"
STREAM_TTL_SECONDS = 3600


def load_failed_event(exc: ModelLoadFailed) -> Failed:
    """The first and only event of a request whose model could not be loaded: retryable, so
    the API tries its next backend; nothing ran, so nothing is settled."""
    return Failed(code="backend_unavailable", message=LOAD_FAILED_MESSAGE, retryable=True,
                  retry_after=max(int(exc.retry_in + 0.999), 1))


def stream_key(request_id: str) -> str:
    return f"fl:gen:{request_id}"


def cancel_key(request_id: str) -> str:
    return f"fl:cancel:{request_id}"


def redis_sync() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


# Append to a request's stream only while this worker owns the request (the fence): a worker
# whose claim lapsed (it was slow, or its bytes were still in flight when it died) can no
# longer write after the next worker claimed the request. KEYS: stream, owner; ARGV: worker,
# event, ttl.
_FENCED_XADD = """
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
redis.call('XADD', KEYS[1], '*', 'e', ARGV[2])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
return 1
"""
# Claim a request (its new owner) and read what earlier owners wrote, in one step.
_CLAIM = """
redis.call('SET', KEYS[2], ARGV[1], 'EX', tonumber(ARGV[2]))
return redis.call('XRANGE', KEYS[1], '-', '+')
"""


def owner_key(request_id: str) -> str:
    """Hashes to the same Redis Cluster slot as the request's stream (its whole name is the
    tag), so one script can fence it."""
    return "{" + stream_key(request_id) + "}:owner"


class RedisStreamEmit:
    """Worker side: append each event to the request's stream; with an `owner`, only while
    that worker owns the request (see `claim`)."""

    def __init__(self, client: redis.Redis, request_id: str, owner: str = "") -> None:
        self.client = client
        self.key = stream_key(request_id)
        self.owner_key = owner_key(request_id)
        self.owner = owner

    def __call__(self, event: Event) -> None:
        if self.owner:
            if not self.client.eval(_FENCED_XADD, 2, self.key, self.owner_key, self.owner,
                                    event_encode(event), STREAM_TTL_SECONDS):
                raise LostOwnership(self.key)
            return
        pipe = self.client.pipeline(transaction=False)
        pipe.xadd(self.key, {"e": event_encode(event)})
        pipe.expire(self.key, STREAM_TTL_SECONDS)
        pipe.execute()

    def claim(self) -> list[Event]:
        """Own the request from now on, and the events earlier owners already wrote (a
        request resumed after its worker died); nothing they still send lands after this."""
        entries = self.client.eval(_CLAIM, 2, self.key, self.owner_key, self.owner,
                                   STREAM_TTL_SECONDS)
        return [event_decode(dict(zip(fields[::2], fields[1::2]))[b"e"]) for _, fields in entries]

    def existing(self) -> list[Event]:
        """Events an earlier attempt at this request already wrote (a redelivered task)."""
        return [event_decode(fields[b"e"]) for _, fields in self.client.xrange(self.key)]


def cancel_request(client: redis.Redis, request_id: str) -> None:
    """Ask whichever worker has (or will get) this request to abort it."""
    client.set(cancel_key(request_id), 1, ex=STREAM_TTL_SECONDS)
    client.publish(CANCEL_CHANNEL, request_id)


def is_cancel_requested(client: redis.Redis, request_id: str) -> bool:
    return bool(client.exists(cancel_key(request_id)))


class StreamTimeout(Timeout):
    pass


class StreamLost(BackendUnavailable):
    """Redis failed under a request's stream (restarted, unreachable): what was streamed is
    settled, the rest of the stream is gone."""

    default_message = "The request's stream was interrupted; retry it."


async def redis_stream_events(client: redis.asyncio.Redis, request_id: str) -> AsyncIterator[Event]:
    """API side: the request's events in order until the terminal one. Raises StreamTimeout if
    no event comes for too long (no worker took it, or the worker died)."""
    key, last_id = stream_key(request_id), "0-0"
    first_deadline = settings.FAIRLANE_FIRST_EVENT_TIMEOUT_SECONDS
    idle_deadline = settings.FAIRLANE_STREAM_IDLE_TIMEOUT_SECONDS
    last_event, has_started = time.monotonic(), False
    while True:
        try:
            reply = await client.xread({key: last_id}, block=1000, count=256)
        except redis.RedisError as exc:
            raise StreamLost(retry_after=2) from exc
        if not reply:
            limit = idle_deadline if has_started else first_deadline
            if time.monotonic() - last_event > limit:
                raise StreamTimeout("No worker answered in time." if not has_started
                                    else "The worker stopped sending tokens.")
            continue
        last_event = time.monotonic()
        for entry_id, fields in reply[0][1]:
            last_id = entry_id
            event = event_decode(fields[b"e"])
            has_started = has_started or isinstance(event, Tokens | Embedding | Failed)
            yield event
            if isinstance(event, Done):
                return


class EmbeddedDispatcher:
    """Runs requests on this process's engines; their outputs arrive on the event loop."""

    async def events(self, job: GenerationJob) -> AsyncIterator[Event]:
        try:
            engine = await asyncio.to_thread(host_get().load, job.model_info)
        except ModelLoadFailed as exc:  # nothing ran: the walk falls through, or answers 503
            yield load_failed_event(exc)
            return
        async for event in generation_run_async(job, engine, backend="embedded"):
            yield event

    def cancel(self, request_id: str) -> None:
        generation_cancel(request_id)


def queue_for(client: redis.Redis, model: str) -> FairQueue:
    """The fair queue of one model, shared by every API process and GPU worker."""
    return FairQueue(client, settings.FAIRLANE_QUEUE_NAMESPACE + model,
                     claim_seconds=settings.FAIRLANE_CLAIM_SECONDS,
                     min_share_standard=settings.FAIRLANE_MIN_SHARE_STANDARD,
                     min_share_bulk=settings.FAIRLANE_MIN_SHARE_BULK)


class QueueDispatcher:
    """Puts requests on their model's fair queue for the GPU workers, and reads their events
    back from Redis."""

    def __init__(self) -> None:
        self.sync_client = redis_sync()

    async def events(self, job: GenerationJob) -> AsyncIterator[Event]:
        queue = queue_for(self.sync_client, job.model["name"])
        try:
            await asyncio.to_thread(self._enqueue, queue, job)
        except redis.RedisError:  # nothing queued: the walk falls through, or answers 503
            logger.warning("request %s: the queue is unreachable", job.request_id,
                           exc_info=True)
            yield Failed(code="service_unavailable", retryable=True, retry_after=2,
                         message="The request queue is unreachable; retry shortly.")
            return
        # A client per request: asyncio connections belong to the loop that made them.
        client = redis.asyncio.Redis.from_url(settings.REDIS_URL)
        is_done = has_events = False
        try:
            async for event in redis_stream_events(client, job.request_id):
                is_done, has_events = isinstance(event, Done), True
                yield event
        except StreamLost:
            if has_events:
                raise  # settled from what was streamed (routing.services.answers)
            logger.warning("request %s: Redis failed before a worker took it", job.request_id)
            yield Failed(code="service_unavailable", retryable=True, retry_after=2,
                         message="The request queue failed; retry shortly.")
        finally:
            if not is_done:
                self.cancel(job.request_id)
            await client.aclose()

    def _enqueue(self, queue: FairQueue, job: GenerationJob) -> None:
        # An earlier round of this request's walk may have left events (a refusal): start clean.
        self.sync_client.delete(stream_key(job.request_id))
        job.timeline["queued"] = time.time()
        queue.enqueue(id=job.request_id, tenant=str(job.tenant_id), lane=job.lane,
                      weight=job.weight, cost=sum(len(p) for p in job.prompts),
                      payload=job.to_dict())

    def cancel(self, request_id: str) -> None:
        try:
            cancel_request(self.sync_client, request_id)
        except redis.RedisError:  # Redis is gone: so is the worker's way to hear it
            logger.warning("request %s: cancel not sent (Redis)", request_id, exc_info=True)

