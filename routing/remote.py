"""Remote backends' answers as the platform's events: nothing reaches the client before the
first token (so a failure until then can fall through), and every answer is settled once, from
the provider's usage where it reported it, counted here where it did not."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator
from dataclasses import replace
from typing import Any

from django.conf import settings

from routing.backend_store import backend_error_noted
from routing.backends import Call, Route, backend_embed, backend_stream
from routing.backends.base import estimate_tokens
from routing.errors import backend_error, backend_error_mid_stream
from routing.wire.messages import message_images, message_text
from tenants.errors import ApplicationError
from tenants.models import UsageRecord
from workers.serving.catalog import usage_cost
from workers.serving.events import (
    Embedding,
    Event,
    Failed,
    Finish,
    RemoteEvent,
    Reported,
    Tokens,
    TokenUsage,
)
from workers.serving.jobs import Job
from workers.serving.outbox import Outbox
from workers.serving.settlement import Emit, generation_settle, settlement_track
from workers.serving.trace import Span, span_start

logger = logging.getLogger(__name__)


async def remote_start(
    outbox: Outbox, route: Route, call: Call, job: Job, started: float, reserved: int
) -> AsyncGenerator[Event, None]:
    """Send the call and wait for its first token (a failure before it raises
    the backend's error, for the next backend); the answer's events, settled when they end."""
    if call.endpoint == "embed":
        result = await backend_embed(route, call.inputs)
        return _embedding_events(outbox, job, route, call, result, started)
    span = span_start(
        "fairlane.upstream",
        parent=job.trace,
        kind="client",
        backend=route.backend.name,
        model=route.upstream,
    )
    # A backend of our own continues the trace under this span (openai_format.call_headers).
    stream = backend_stream(route, replace(call, traceparent=span.trace.traceparent))
    head: list[RemoteEvent] = []
    try:
        async for event in stream:  # nothing is sent to the client before the first token
            head.append(event)
            if isinstance(event, Tokens | Finish):
                job.timeline.setdefault("first_token", time.time())
                break
        else:
            raise backend_error(
                "backend_unavailable", "the backend answered nothing", backend=route.backend.name
            )
    except BaseException as exc:
        await stream.aclose()
        span.fail(getattr(exc, "message", type(exc).__name__))
        span.end()
        raise
    return _remote_events(outbox, job, route, call, stream, head, started, reserved, span)


async def _remote_events(
    outbox: Outbox,
    job: Job,
    route: Route,
    call: Call,
    stream: AsyncGenerator[RemoteEvent, None],
    head: list[RemoteEvent],
    started: float,
    reserved: int,
    span: Span,
) -> AsyncGenerator[Event, None]:
    """A remote answer as the engine's events, settled once at the end (also when the client
    leaves or the stream is cut: what was streamed is charged)."""
    timeline = job.timeline
    usage: Reported | None = None
    tokens: list[Tokens] = []
    status = UsageRecord.Status.OK
    tail: list[Event] = []

    async def all_events() -> AsyncGenerator[RemoteEvent, None]:
        for event in head:
            yield event
        async for event in stream:
            yield event

    try:
        async for event in all_events():
            match event:
                case Reported():  # the latest report wins
                    usage = event
                    continue
                case Tokens():
                    tokens.append(event)
                    timeline["last_token"] = now = time.time()
                    timeline.setdefault("first_token", now)
            yield event
    except ApplicationError as exc:
        if exc.backend is None:
            raise
        logger.warning(
            "request %s: %s failed mid-stream: %s", job.request_id, route.backend.name, exc.detail
        )
        await backend_error_noted(route.backend.name, f"mid-stream {exc.code}: {exc.detail}")
        status = UsageRecord.Status.ERROR
        told = backend_error_mid_stream(exc)
        tail.append(Failed(code=told.code, message=told.message))
    except (asyncio.CancelledError, GeneratorExit):
        status = UsageRecord.Status.CANCELLED
        raise
    finally:
        await stream.aclose()
        if status == UsageRecord.Status.ERROR:
            span.fail("the stream failed")
        span.end()
        counted = _usage(usage, call, tokens)
        # A reported cost counts once the provider reported the completion it is for.
        cost_usd = usage.cost_usd if usage is not None and usage.completion_tokens else None
        latency = int((time.monotonic() - started) * 1000)
        await asyncio.shield(
            settlement_track(
                asyncio.to_thread(
                    _remote_settle,
                    outbox,
                    job,
                    route,
                    counted,
                    status,
                    latency,
                    tail.append,
                    reserved,
                    cost_usd,
                )
            )
        )
    for ending in tail:
        yield ending


async def _embedding_events(
    outbox: Outbox, job: Job, route: Route, call: Call, result: dict[str, Any], started: float
) -> AsyncGenerator[Event, None]:
    """The vectors the backend returned, settled before the first is handed on (the work is
    done, whether or not the client stays for it)."""
    prompt = result["prompt_tokens"] or sum(
        estimate_tokens(i) if isinstance(i, str) else len(i) for i in call.inputs
    )
    usage = TokenUsage(prompt_tokens=prompt)
    tail: list[Event] = []
    await asyncio.to_thread(
        _remote_settle,
        outbox,
        job,
        route,
        usage,
        UsageRecord.Status.OK,
        int((time.monotonic() - started) * 1000),
        tail.append,
    )
    for index, b64 in sorted(result["vectors"].items()):
        yield Embedding(index=index, b64=b64)
    for event in tail:
        yield event


def _usage(reported: Reported | None, call: Call, tokens: list[Tokens]) -> TokenUsage:
    """The provider's usage, as far as it reported it (Anthropic reports the prompt when the
    stream starts, the completion at its end); what it did not report is counted here, so a
    real answer is never charged zero."""
    reported = reported or Reported()
    prompt, completion = reported.prompt_tokens, reported.completion_tokens
    cached, writes = reported.cached_tokens, reported.cache_write_tokens
    if not prompt:
        prompts = call.prompt if isinstance(call.prompt, list) else [call.prompt]
        if prompts and isinstance(prompts[0], int):
            prompts = [prompts]
        prompt = sum(len(p) if isinstance(p, list) else estimate_tokens(p) for p in prompts)
        prompt += sum(estimate_tokens(message_text(m)) + 4 for m in call.messages)
        # Tools and schemas as their JSON; images at their worst case (never zero).
        prompt += (
            estimate_tokens(json.dumps([call.tool_use.tools, call.tool_use.response_format]))
            if (call.tool_use.tools or call.tool_use.response_format)
            else 0
        )
        prompt += settings.FAIRLANE_IMAGE_WORST_TOKENS * sum(
            len(message_images(m)) for m in call.messages
        )
        cached = writes = 0
    if not completion and tokens:
        text = "".join(
            e.text + "".join((c.name or "") + c.arguments for c in e.tool_calls) for e in tokens
        )
        completion = max(len(tokens), estimate_tokens(text))
    return TokenUsage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_tokens=cached,
        cache_write_tokens=writes,
    )


def _remote_settle(
    outbox: Outbox,
    job: Job,
    route: Route,
    usage: TokenUsage,
    status: str,
    latency: int,
    emit: Emit,
    reserved: int | None = None,
    cost_usd: float | None = None,
) -> None:
    cost = usage_cost(
        route.info,
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        cached_tokens=usage.cached_tokens,
        cache_write_tokens=usage.cache_write_tokens,
    )
    if cost_usd is not None:  # OpenRouter says what it charged us
        cost = -(-int(round(cost_usd * 1e8 * 1000)) // 1000)
        if reserved is not None and cost > reserved:
            # Its price moved above the table we reserved by: the budget's promise holds,
            # and the operator hears of it.
            logger.warning(
                "request %s: %s reported cost %d micro-cents over the %d reserved; "
                "charging the reservation (update its prices)",
                job.request_id,
                route.backend.name,
                cost,
                reserved,
            )
            cost = reserved
    generation_settle(
        outbox,
        job,
        usage,
        status=status,
        backend=route.backend.name,
        latency_ms=latency,
        emit=emit,
        cost_microcents=cost,
    )
