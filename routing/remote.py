"""Remote backends' answers as the platform's events: nothing reaches the client before the
first token (so a failure until then can fall through), and every answer is settled once, from
the provider's usage where it reported it, counted here where it did not."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from routing.backends import Call, Route, UpstreamError, backend_embed, backend_stream
from routing.backends.base import estimate_tokens
from routing.errors import CLIENT_MESSAGES, MID_STREAM, SURFACED
from routing.registry import backend_error_noted
from tenants.models import UsageRecord
from workers.generation import GenerationJob, generation_settle, settlement_track
from workers.registry import usage_cost

logger = logging.getLogger(__name__)


async def remote_start(route: Route, call: Call, job: GenerationJob, started: float,
                       reserved: int) -> AsyncIterator[dict]:
    """Send the call and wait for its first token (a failure before it raises
    UpstreamError, for the next backend); the answer's events, settled when they end."""
    if call.kind == "embed":
        result = await backend_embed(route, call.inputs)
        return _embedded_events(job, route, call, result, started)
    stream = backend_stream(route, call)
    head: list[dict] = []
    try:
        async for event in stream:  # nothing is sent to the client before the first token
            head.append(event)
            if event["type"] in {"token", "finish"}:
                break
        else:
            raise UpstreamError("backend_unavailable", "the backend answered nothing")
    except BaseException:
        await stream.aclose()
        raise
    return _remote_events(job, route, call, stream, head, started, reserved)


async def _remote_events(job: GenerationJob, route: Route, call: Call,
                         stream: AsyncIterator[dict], head: list[dict], started: float,
                         reserved: int) -> AsyncIterator[dict]:
    """A remote answer as the engine's events, settled once at the end (also when the client
    leaves or the stream is cut: what was streamed is charged)."""
    usage: dict | None = None
    tokens: list[dict] = []
    status, tail = UsageRecord.Status.OK, []

    async def all_events():
        for event in head:
            yield event
        async for event in stream:
            yield event

    try:
        async for event in all_events():
            if event["type"] == "usage":  # the latest report wins
                usage = event
                continue
            if event["type"] == "token":
                tokens.append(event)
            yield event
    except UpstreamError as exc:
        logger.warning("request %s: %s failed mid-stream: %s", job.request_id,
                       route.backend.name, exc.message)
        await backend_error_noted(route.backend.name, f"mid-stream {exc.code}: {exc.message}")
        status = UsageRecord.Status.ERROR
        code = exc.code if exc.code in SURFACED or exc.code == "timeout" else "backend_unavailable"
        tail.append({"type": "error", "code": code, "param": None,
                     "message": CLIENT_MESSAGES[code] if code in SURFACED else MID_STREAM})
    except (asyncio.CancelledError, GeneratorExit):
        status = UsageRecord.Status.CANCELLED
        raise
    finally:
        await stream.aclose()
        counted = _usage(usage, call, tokens)
        latency = int((time.monotonic() - started) * 1000)
        await asyncio.shield(settlement_track(asyncio.to_thread(
            _remote_settle, job, route, counted, status, latency, tail.append, reserved)))
    for event in tail:
        yield event


async def _embedded_events(job: GenerationJob, route: Route, call: Call, result: dict,
                           started: float) -> AsyncIterator[dict]:
    """The vectors the backend returned, settled before the first is handed on (the work is
    done, whether or not the client stays for it)."""
    prompt = result["prompt_tokens"] or sum(
        estimate_tokens(i) if isinstance(i, str) else len(i) for i in call.inputs)
    usage = {"prompt_tokens": prompt, "completion_tokens": 0, "cached_tokens": 0,
             "total_tokens": prompt}
    tail: list[dict] = []
    await asyncio.to_thread(_remote_settle, job, route, usage, UsageRecord.Status.OK,
                            int((time.monotonic() - started) * 1000), tail.append)
    for index, b64 in sorted(result["vectors"].items()):
        yield {"type": "embedding", "index": index, "b64": b64}
    for event in tail:
        yield event


def _usage(reported: dict | None, call: Call, tokens: list[dict]) -> dict:
    """The provider's usage, as far as it reported it (Anthropic reports the prompt when the
    stream starts, the completion at its end); what it did not report is counted here, so a
    real answer is never charged zero."""
    reported = reported or {}
    usage = {"prompt_tokens": reported.get("prompt_tokens", 0),
             "completion_tokens": reported.get("completion_tokens", 0),
             "cached_tokens": reported.get("cached_tokens", 0)}
    if "cost_usd" in reported and usage["completion_tokens"]:
        usage["cost_usd"] = reported["cost_usd"]
    if not usage["prompt_tokens"]:
        prompts = call.prompt if isinstance(call.prompt, list) else [call.prompt]
        if prompts and isinstance(prompts[0], int):
            prompts = [prompts]
        usage["prompt_tokens"] = sum(len(p) if isinstance(p, list) else estimate_tokens(p)
                                     for p in prompts)
        usage["prompt_tokens"] += sum(estimate_tokens(m["content"]) + 4 for m in call.messages)
        usage["cached_tokens"] = 0
    if not usage["completion_tokens"] and tokens:
        text = "".join(e["text"] for e in tokens)
        usage["completion_tokens"] = max(len(tokens), estimate_tokens(text))
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return usage


def _remote_settle(job: GenerationJob, route: Route, usage: dict, status: str, latency: int,
                   emit, reserved: int | None = None) -> None:
    cost = usage_cost(route.info, prompt_tokens=usage["prompt_tokens"],
                      completion_tokens=usage["completion_tokens"],
                      cached_tokens=usage["cached_tokens"])
    if "cost_usd" in usage:  # OpenRouter says what it charged us
        cost = -(-int(round(usage["cost_usd"] * 1e8 * 1000)) // 1000)
        if reserved is not None and cost > reserved:
            # Its price moved above the table we reserved by: the budget's promise holds,
            # and the operator hears of it.
            logger.warning("request %s: %s reported cost %d micro-cents over the %d reserved; "
                           "charging the reservation (update its prices)", job.request_id,
                           route.backend.name, cost, reserved)
            cost = reserved
    plain = {k: usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens",
                                   "cached_tokens")}
    generation_settle(job, plain, status=status, backend=route.backend.name, latency_ms=latency,
                      emit=emit, cost_microcents=cost)
