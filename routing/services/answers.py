"""A request the backend has accepted (`Started`), and its events as OpenAI objects: chunks
for a stream, one object otherwise. The rate-limit slot is given back when the events end."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from channels.db import database_sync_to_async

from routing.metrics import TokenTimer
from routing.ratelimit import Admitted
from routing.services.request_logs import request_log_capture
from routing.wire.render import ChatFormat, Chunk, Rendered, UsageChunk
from tenants.errors import ApplicationError, error_from_code
from tenants.models import UsageRecord
from workers.serving.errors import StreamLost, StreamTimeout
from workers.serving.events import Done, Event, Failed, Finish, Tokens, TokenUsage
from workers.serving.jobs import Job
from workers.serving.runtime import Runtime
from workers.serving.settlement import generation_settle_partial
from workers.serving.versions import version_tag

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class Started:
    """A request the engine has accepted, with the formatter for its answer."""

    runtime: Runtime
    job: Job
    format: ChatFormat | None
    events: AsyncIterator[Event]
    stream: bool
    include_usage: bool
    admitted: Admitted | None  # None: nothing to give back (a replayed cascade answer)
    brownout: str = ""  # the x-fairlane-brownout header, when the brownout changed the request
    demoted: str = ""  # the x-fairlane-demoted header, when a soft budget level demoted it
    backend: str = ""  # the backend serving it (x-fairlane-backend)
    cascade: str = ""  # the tier that answered and its confidence (x-fairlane-cascade)
    log_input: dict | None = None  # what it asked, for its tenant's request log (when kept)

    @property
    def formatter(self) -> ChatFormat:
        """The answer's formatter (only an embedding, answered whole elsewhere, has none)."""
        if self.format is None:
            raise TypeError(f"request {self.job.request_id} has no answer to format")
        return self.format


def event_error(event: Failed) -> ApplicationError:
    return error_from_code(event.code, event.message, param=event.param)


async def events_to_end(started: Started) -> AsyncIterator[Event]:
    """The run's events; if its worker goes silent (or Redis fails under the stream), end it
    here with an error, charging what was streamed (settlement is idempotent, so a late worker
    cannot charge twice)."""
    seen: list[Event] = []
    timer = TokenTimer(
        model=started.job.model["name"],
        backend=started.backend,
        version=version_tag(started.job.model),
    )
    try:
        async for event in started.events:
            seen.append(event)
            timer.see(event)  # time to first token, time per output token
            yield event
    except (StreamTimeout, StreamLost) as exc:  # its worker went silent, or Redis failed
        logger.warning("request %s: %s", started.job.request_id, exc.message)
        closing: list[Event] = []
        await database_sync_to_async(generation_settle_partial)(
            started.runtime.outbox, started.job, seen, backend="api", emit=closing.append
        )
        for event in closing:
            if isinstance(event, Failed):
                event = replace(event, code=exc.code, message=exc.message)
            seen.append(event)
            yield event
    finally:
        timer.done()
        # The request's rate-limit slot is free again, and its unused tokens go back.
        if started.admitted is not None:
            started.runtime.limiter.release(started.admitted, tokens_used=_tokens_used(seen))
        request_log_capture(job=started.job, asked=started.log_input, events=seen)


def _tokens_used(events: list[Event]) -> int:
    for event in events:
        if isinstance(event, Done):
            return event.usage.prompt_tokens + event.usage.completion_tokens
    return sum(len(e.token_ids) for e in events if isinstance(e, Tokens))


async def started_chunks(started: Started) -> AsyncIterator[Rendered]:
    """The chunks of a streamed answer; an error after the first token ends the stream (never
    a splice from elsewhere)."""
    fmt, usage_too = started.formatter, started.include_usage
    for chunk in fmt.opening(usage_too):
        yield Chunk(chunk)
    async for event in events_to_end(started):
        match event:
            # Tokens that end mid-character carry no text yet; skip them unless their
            # logprobs were asked for (the text follows with the next token).
            case Tokens() if event.text or event.tool_calls or fmt.wants_logprobs:
                yield Chunk(fmt.token_chunk(event, usage_too))
            case Tokens():
                fmt.choices[event.choice].token_ids.extend(event.token_ids)
            case Finish():
                yield Chunk(fmt.finish_chunk(event, usage_too))
            case Failed():
                yield event_error(event)
            case Done(usage=usage) if usage_too:
                yield UsageChunk(fmt.usage_chunk(usage))


async def events_collect(
    started: Started,
    absorb: Callable[[Tokens | Finish], object],
    result: Callable[[TokenUsage], T],
) -> T:
    """A whole answer's events fed to `absorb` (each front door's renderer), and `result` of
    its usage; or the run's error, or its cancellation, raised."""
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
                return result(usage)
            case Tokens() | Finish():
                absorb(event)
    raise ApplicationError("The request ended without a result.")


def started_collect(started: Started) -> Awaitable[dict]:
    """The whole answer as one object, or the run's error (no frame of its own on the
    answer's path: `manage.py bench hops` counts them)."""
    fmt = started.formatter
    return events_collect(started, fmt.absorb, fmt.response)
