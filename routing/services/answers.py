"""A request the backend has accepted (`Started`), and its events as OpenAI objects: chunks
for a stream, one object otherwise. The rate-limit slot is given back when the events end."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from channels.db import database_sync_to_async

from routing.metrics import TokenTimer
from routing.ratelimit import Admitted, limiter_get
from routing.wire.render import ChatFormat
from tenants.errors import ApplicationError, error_body_for, error_from_code
from tenants.models import UsageRecord
from workers.generation import GenerationJob, generation_settle_partial
from workers.transport import StreamLost, StreamTimeout

logger = logging.getLogger(__name__)


@dataclass
class Started:
    """A request the engine has accepted, with the formatter for its answer."""

    job: GenerationJob
    format: ChatFormat | None
    events: AsyncIterator[dict]
    stream: bool
    include_usage: bool
    admitted: Admitted | None  # None: nothing to give back (a replayed cascade answer)
    brownout: str = ""  # the x-fairlane-brownout header, when the brownout changed the request
    backend: str = ""  # the backend serving it (x-fairlane-backend)
    cascade: str = ""  # the tier that answered and its confidence (x-fairlane-cascade)


def event_error(event: dict) -> ApplicationError:
    return error_from_code(event["code"], event["message"], param=event.get("param"))


async def events_to_end(started: Started) -> AsyncIterator[dict]:
    """The run's events; if its worker goes silent (or Redis fails under the stream), end it
    here with an error, charging what was streamed (settlement is idempotent, so a late worker
    cannot charge twice)."""
    seen: list[dict] = []
    timer = TokenTimer(model=started.job.model["name"], backend=started.backend)
    try:
        async for event in started.events:
            seen.append(event)
            timer.see(event)  # time to first token, time per output token
            yield event
    except (StreamTimeout, StreamLost) as exc:  # its worker went silent, or Redis failed
        logger.warning("request %s: %s", started.job.request_id, exc.message)
        closing: list[dict] = []
        await database_sync_to_async(generation_settle_partial)(started.job, seen, backend="api",
                                                                emit=closing.append)
        for event in closing:
            seen.append(event)
            if event["type"] == "error":
                event.update(code=exc.code, message=exc.message)
            yield event
    finally:
        timer.done()
        # The request's rate-limit slot is free again, and its unused tokens go back.
        if started.admitted is not None:
            limiter_get().release(started.admitted, tokens_used=_tokens_used(seen))


def _tokens_used(events: list[dict]) -> int:
    for event in events:
        if event["type"] == "done":
            return event["usage"]["prompt_tokens"] + event["usage"]["completion_tokens"]
    return sum(len(e["token_ids"]) for e in events if e["type"] == "token")


async def started_chunks(started: Started) -> AsyncIterator[dict]:
    """Chunk objects for a streamed answer; an error after the first token ends the stream
    with an `{"error": ...}` object (never a splice from elsewhere)."""
    fmt, usage_too = started.format, started.include_usage
    for chunk in fmt.opening(usage_too):
        yield chunk
    async for event in events_to_end(started):
        kind = event["type"]
        if kind == "token":
            # Tokens that end mid-character carry no text yet; skip them unless their
            # logprobs were asked for (the text follows with the next token).
            if event["text"] or fmt.wants_logprobs:
                yield fmt.token_chunk(event, usage_too)
            else:
                fmt.choices[event["choice"]].token_ids += event["token_ids"]
        elif kind == "finish":
            yield fmt.finish_chunk(event, usage_too)
        elif kind == "error":
            yield error_body_for(event_error(event))
        elif kind == "done" and usage_too:
            yield fmt.usage_chunk(event["usage"])


async def started_collect(started: Started) -> dict:
    """The whole answer as one object, or the run's error."""
    error = None
    async for event in events_to_end(started):
        if event["type"] == "error":
            error = event_error(event)
        elif event["type"] == "done":
            if error is not None:
                raise error
            if event["status"] == UsageRecord.Status.CANCELLED:
                raise ApplicationError("The request was cancelled.")
            return started.format.response(event["usage"])
        else:
            started.format.absorb(event)
    raise ApplicationError("The request ended without a result.")
