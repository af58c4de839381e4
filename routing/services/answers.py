"""A request the backend has accepted (`Started`), and its events as OpenAI objects: chunks
for a stream, one object otherwise. The rate-limit slot is given back when the events end."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from channels.db import database_sync_to_async

from routing.metrics import TokenTimer
from routing.ratelimit import Admitted, limiter_get
from routing.wire.render import ChatFormat, Chunk, ErrorChunk, Rendered, UsageChunk
from tenants.errors import ApplicationError, error_from_code
from tenants.models import UsageRecord
from workers.events import Done, Event, Failed, Finish, Tokens
from workers.jobs import GenerationJob
from workers.settlement import generation_settle_partial
from workers.transport import StreamLost, StreamTimeout
from workers.versions import version_tag

logger = logging.getLogger(__name__)


@dataclass
class Started:
    """A request the engine has accepted, with the formatter for its answer."""

    job: GenerationJob
    format: ChatFormat | None
    events: AsyncIterator[Event]
    stream: bool
    include_usage: bool
    admitted: Admitted | None  # None: nothing to give back (a replayed cascade answer)
    brownout: str = ""  # the x-fairlane-brownout header, when the brownout changed the request
    backend: str = ""  # the backend serving it (x-fairlane-backend)
    cascade: str = ""  # the tier that answered and its confidence (x-fairlane-cascade)


def event_error(event: Failed) -> ApplicationError:
    return error_from_code(event.code, event.message, param=event.param)


async def events_to_end(started: Started) -> AsyncIterator[Event]:
    """The run's events; if its worker goes silent (or Redis fails under the stream), end it
    here with an error, charging what was streamed (settlement is idempotent, so a late worker
    cannot charge twice)."""
    seen: list[Event] = []
    timer = TokenTimer(model=started.job.model["name"], backend=started.backend,
                       version=version_tag(started.job.model))
    try:
        async for event in started.events:
            seen.append(event)
            timer.see(event)  # time to first token, time per output token
            yield event
    except (StreamTimeout, StreamLost) as exc:  # its worker went silent, or Redis failed
        logger.warning("request %s: %s", started.job.request_id, exc.message)
        closing: list[Event] = []
        await database_sync_to_async(generation_settle_partial)(started.job, seen, backend="api",
                                                                emit=closing.append)
        for event in closing:
            if isinstance(event, Failed):
                event = replace(event, code=exc.code, message=exc.message)
            seen.append(event)
            yield event
    finally:
        timer.done()
        # The request's rate-limit slot is free again, and its unused tokens go back.
        if started.admitted is not None:
            limiter_get().release(started.admitted, tokens_used=_tokens_used(seen))


def _tokens_used(events: list[Event]) -> int:
    for event in events:
        if isinstance(event, Done):
            return event.usage.prompt_tokens + event.usage.completion_tokens
    return sum(len(e.token_ids) for e in events if isinstance(e, Tokens))


async def started_chunks(started: Started) -> AsyncIterator[Rendered]:
    """The chunks of a streamed answer; an error after the first token ends the stream (never
    a splice from elsewhere)."""
    fmt, usage_too = started.format, started.include_usage
    for chunk in fmt.opening(usage_too):
        yield Chunk(chunk)
    async for event in events_to_end(started):
        match event:
            # Tokens that end mid-character carry no text yet; skip them unless their
            # logprobs were asked for (the text follows with the next token).
            case Tokens() if event.text or event.tool_calls or fmt.wants_logprobs:
                yield Chunk(fmt.token_chunk(event, usage_too))
            case Tokens():
                fmt.choices[event.choice].token_ids += event.token_ids
            case Finish():
                yield Chunk(fmt.finish_chunk(event, usage_too))
            case Failed():
                yield ErrorChunk(event_error(event))
            case Done(usage=usage) if usage_too:
                yield UsageChunk(fmt.usage_chunk(usage))


async def started_collect(started: Started) -> dict:
    """The whole answer as one object, or the run's error."""
    error = None
    async for event in events_to_end(started):
        match event:
            case Failed():
                error = event_error(event)
            case Done() if error is not None:
                raise error
            case Done(status=UsageRecord.Status.CANCELLED):
                raise ApplicationError("The request was cancelled.")
            case Done(usage=usage):
                return started.format.response(usage)
            case Tokens() | Finish():
                started.format.absorb(event)
    raise ApplicationError("The request ended without a result.")
