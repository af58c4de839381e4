"""Getting a request's events from the GPU worker that runs it to the API process that
streams them (the distributed mode; workers/dispatch.py sends them).

The API puts the request on its model's fair queue (workers/fairqueue); the worker that takes
it appends events to a per-request Redis stream (`fl:gen:<id>`); the API reads it from its last
id, so events written before it started reading are not lost (unlike pub/sub). Cancellation
goes the other way: a key the worker checks before starting, and a pub/sub message that
reaches the worker already running it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import redis
import redis.asyncio
from django.conf import settings

from workers.fairqueue import FairQueue
from workers.serving.errors import StreamLost, StreamTimeout
from workers.serving.events import (
    Done,
    Embedding,
    Event,
    Failed,
    Tokens,
    event_decode,
    event_encode,
)

logger = logging.getLogger(__name__)

CANCEL_CHANNEL = "fl:cancel"
STREAM_TTL_SECONDS = 3600


def stream_key(request_id: str) -> str:
    return f"fl:gen:{request_id}"


def cancel_key(request_id: str) -> str:
    return f"fl:cancel:{request_id}"


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


class LostOwnership(Exception):
    """Another worker took this request over (this one's claim lapsed): stop at once, and
    leave its settlement to the new owner."""


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
        """Raises LostOwnership (another worker owns the request now), or StreamLost when Redis
        fails (the API settles what it received and answers 503)."""
        try:
            self._append(event)
        except redis.RedisError as exc:
            raise StreamLost(retry_after=2) from exc

    def _append(self, event: Event) -> None:
        if self.owner:
            if not self.client.eval(
                _FENCED_XADD,
                2,
                self.key,
                self.owner_key,
                self.owner,
                event_encode(event),
                STREAM_TTL_SECONDS,
            ):
                raise LostOwnership(self.key)
            return
        pipe = self.client.pipeline(transaction=False)
        pipe.xadd(self.key, {"e": event_encode(event)})
        pipe.expire(self.key, STREAM_TTL_SECONDS)
        pipe.execute()

    def claim(self) -> list[Event]:
        """Own the request from now on, and the events earlier owners already wrote (a
        request resumed after its worker died); nothing they still send lands after this."""
        entries = self.client.eval(
            _CLAIM, 2, self.key, self.owner_key, self.owner, STREAM_TTL_SECONDS
        )
        return [
            event_decode(dict(zip(fields[::2], fields[1::2], strict=True))[b"e"])
            for _, fields in entries
        ]

    def existing(self) -> list[Event]:
        """Events an earlier attempt at this request already wrote (a redelivered task)."""
        return [event_decode(fields[b"e"]) for _, fields in self.client.xrange(self.key)]


def cancel_request(client: redis.Redis, request_id: str) -> None:
    """Ask whichever worker has (or will get) this request to abort it."""
    client.set(cancel_key(request_id), 1, ex=STREAM_TTL_SECONDS)
    client.publish(CANCEL_CHANNEL, request_id)


def is_cancel_requested(client: redis.Redis, request_id: str) -> bool:
    return bool(client.exists(cancel_key(request_id)))


async def redis_stream_events(
    client: redis.asyncio.Redis, request_id: str, *, block_ms: int = 1000
) -> AsyncIterator[Event]:
    """API side: the request's events in order until the terminal one. Raises StreamTimeout if
    no event comes for too long (no worker took it, or the worker died). Each read waits at
    most `block_ms`."""
    key, last_id = stream_key(request_id), "0-0"
    first_deadline = settings.FAIRLANE_FIRST_EVENT_TIMEOUT_SECONDS
    idle_deadline = settings.FAIRLANE_STREAM_IDLE_TIMEOUT_SECONDS
    last_event, has_started = time.monotonic(), False
    task = asyncio.current_task()
    while True:
        try:
            reply = await client.xread({key: last_id}, block=block_ms, count=256)
        except redis.RedisError as exc:
            raise StreamLost(retry_after=2) from exc
        except Exception as exc:
            # Whatever else the client raises while Redis goes away (CI saw requests answered
            # 500 at the moment Redis was killed, from this call): the stream is lost all the
            # same, which the walk answers 503 or settles from what was streamed.
            logger.warning("request %s: reading its stream failed", request_id, exc_info=True)
            raise StreamLost(retry_after=2) from exc
        if task is not None and task.cancelling():
            # The client left (or a drain cut the request), but redis-py's asyncio client can
            # lose the cancellation when it lands as a read returns (about 1 in 100 cancels of
            # this loop, measured with redis 8.1.0): the read returns as if nothing happened,
            # and the request would wait for its first-event timeout (300 s) holding its
            # budget and its place. Honour it here, at most one read late.
            raise asyncio.CancelledError
        if not reply:
            limit = idle_deadline if has_started else first_deadline
            if time.monotonic() - last_event > limit:
                raise StreamTimeout(
                    "No worker answered in time."
                    if not has_started
                    else "The worker stopped sending tokens."
                )
            continue
        last_event = time.monotonic()
        for entry_id, fields in reply[0][1]:
            last_id = entry_id
            event = event_decode(fields[b"e"])
            has_started = has_started or isinstance(event, Tokens | Embedding | Failed)
            yield event
            if isinstance(event, Done):
                return


def queue_for(client: redis.Redis, model: str) -> FairQueue:
    """The fair queue of one model, shared by every API process and GPU worker."""
    return FairQueue(
        client,
        settings.FAIRLANE_QUEUE_NAMESPACE + model,
        claim_seconds=settings.FAIRLANE_CLAIM_SECONDS,
        min_share_standard=settings.FAIRLANE_MIN_SHARE_STANDARD,
        min_share_bulk=settings.FAIRLANE_MIN_SHARE_BULK,
    )
