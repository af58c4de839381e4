"""Walking a request's fall-through chain: for each backend in the plan, hold the budget its
prices need, its circuit's permission and (on scarce backends) a lease, then send. A failure
before the first token moves on to the next backend; after it, the stream ends with an error
event (never spliced from another model). Bad input and content filters are surfaced, not
retried elsewhere. When every backend failed, the walk is retried after the longest wait a
backend asked for (Retry-After) or a jittered backoff, within FAIRLANE_RETRY_MAX_WAIT_SECONDS.

Remote answers are settled here, from the provider's usage (its final chunk), or counted
locally when it sent none; the local engine settles its own runs (workers/generation.py).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from channels.db import database_sync_to_async
from django.conf import settings

from routing.backends import Call, Route, UpstreamError, backend_embed, backend_stream
from routing.backends.base import estimate_tokens
from routing.breaker import breakers
from routing.leases import lease_acquire, leases_get
from routing.metrics import ROUTE_ATTEMPTS, ROUTE_TTFT
from tenants.errors import (
    ApplicationError, BackendUnavailable, BudgetExhausted, CircuitOpen, error_from_code,
)
from tenants.models import Agent, ApiKey, Tenant, UsageRecord
from tenants.services.budgets import budget_release, budget_reserve, budget_reserve_adjust
from workers.generation import GenerationJob, generation_settle
from workers.registry import usage_cost
from workers.transport import dispatcher_get

logger = logging.getLogger(__name__)
SURFACED = {"invalid_request", "context_length_exceeded", "content_filtered"}


@dataclass
class Attempt:
    """One request's walk: who pays, what each route is sent, what has been held."""

    request_id: str
    tenant: Tenant
    agent: Agent
    api_key: ApiKey | None
    # Per route: the job a local engine runs (token prompts), or the call a remote one gets.
    job_for: callable
    call_for: callable
    cost_for: callable  # route -> worst-case micro-cents
    local_ready: callable = lambda route, has_next: None  # raises to skip the local engine
    reserved: int | None = None  # micro-cents held now (None: no reservation yet)
    errors: list[ApplicationError] = field(default_factory=list)
    budget_refusal: BudgetExhausted | None = None
    waits: list[float] = field(default_factory=list)


@dataclass
class Served:
    route: Route
    job: GenerationJob
    events: AsyncIterator[dict]  # after "accepted"


def _hold(attempt: Attempt, amount: int) -> None:
    """Hold `amount` for this request (synchronous): a first reservation, or a change of the
    one held; BudgetExhausted leaves what was held."""
    if attempt.reserved is None:
        budget_reserve(tenant=attempt.tenant, agent=attempt.agent, amount_microcents=amount,
                       request_id=attempt.request_id, api_key=attempt.api_key)
    elif amount != attempt.reserved:
        budget_reserve_adjust(tenant=attempt.tenant, request_id=attempt.request_id,
                              amount_microcents=amount)
    attempt.reserved = amount


def attempt_release(attempt: Attempt) -> None:
    if attempt.reserved is not None:
        budget_release(tenant=attempt.tenant, request_id=attempt.request_id)
        attempt.reserved = None


async def routes_walk(attempt: Attempt, plan_for, plan=None) -> Served:
    """Serve the request on the first backend of the plan that can (`plan`, or a fresh one
    from `plan_for()`); raises the error the client should see when none could (its
    reservation released). Later rounds plan again: circuits and waits have changed."""
    deadline = time.monotonic() + settings.FAIRLANE_RETRY_MAX_WAIT_SECONDS
    rounds = 0
    try:
        while True:
            if plan is None:
                plan = await database_sync_to_async(plan_for)()
            for index, route in enumerate(plan.routes):
                has_next = index + 1 < len(plan.routes)
                served = await _try_route(attempt, route, has_next)
                if served is not None:
                    return served
            rounds += 1
            wait = plan.blocked_for if not plan.routes else 0.0
            if plan.routes:
                base = settings.FAIRLANE_RETRY_BACKOFF_SECONDS * 2 ** (rounds - 1)
                wait = random.uniform(base / 2, base)  # jittered exponential backoff
                # ... but no sooner than the first of them may be asked again (Retry-After).
                wait = max(wait, min(breakers.blocked_for(r.backend.name) for r in plan.routes))
            if (not _worth_retrying(attempt, plan) or rounds > settings.FAIRLANE_RETRIES
                    or time.monotonic() + wait > deadline):
                raise _final_error(attempt, plan)
            await asyncio.sleep(wait)
            plan = None
    except BaseException:
        await database_sync_to_async(attempt_release)(attempt)
        raise


def _worth_retrying(attempt: Attempt, plan) -> bool:
    if not plan.routes:
        return plan.blocked_for > 0
    return any(getattr(e, "retryable", False) for e in attempt.errors)


def _final_error(attempt: Attempt, plan) -> ApplicationError:
    if attempt.budget_refusal is not None and not attempt.errors:
        return attempt.budget_refusal
    if not plan.routes and plan.blocked_for > 0 and not attempt.errors:
        return CircuitOpen("Every backend for this model is failing or asked us to wait; "
                           "retry later.", retry_after=max(int(plan.blocked_for + 0.999), 1))
    if attempt.errors:
        last = attempt.errors[-1]
        wait = max(attempt.waits, default=0.0)
        last.retry_after = max(int(wait + 0.999), 1)
        return last
    return BackendUnavailable("No backend can serve this request right now.", retry_after=5)


def _upstream_error(exc: UpstreamError, route: Route) -> ApplicationError:
    code = exc.code if exc.code in SURFACED else ("timeout" if exc.code == "timeout"
                                                  else "backend_unavailable")
    error = error_from_code(code, f"{route.backend.name}: {exc.message}"
                            if code not in SURFACED else exc.message)
    error.retryable = exc.fall_through
    return error


def _route_prepare(attempt: Attempt, route: Route, has_next: bool) -> str:
    """Synchronous, in one hop: is the local engine ready (its queue not full, a worker up),
    and can the budget hold this backend's worst case? "" when it may be tried, else why
    not."""
    if route.backend.is_local:
        try:
            attempt.local_ready(route, has_next)
        except ApplicationError as exc:  # the local queue is full (or no worker): spill over
            attempt.errors.append(exc)
            attempt.waits.append(float(exc.retry_after or 0))
            return "skipped"
    try:
        _hold(attempt, attempt.cost_for(route))
    except BudgetExhausted as exc:  # paid backends drop out; cheaper ones may remain
        attempt.budget_refusal = attempt.budget_refusal or exc
        return "budget"
    return ""


async def _try_route(attempt: Attempt, route: Route, has_next: bool) -> Served | None:
    name = route.backend.name
    refusal = await database_sync_to_async(_route_prepare)(attempt, route, has_next)
    if refusal:
        ROUTE_ATTEMPTS.labels(name, refusal).inc()
        return None
    if not breakers.begin(name):
        ROUTE_ATTEMPTS.labels(name, "skipped").inc()
        return None
    spec = route.backend
    has_lease = False
    try:
        if spec.lease_seconds:
            has_lease = await lease_acquire(name, attempt.request_id, ttl=spec.lease_seconds,
                                            slots=spec.max_concurrency or 1,
                                            depth=spec.queue_depth,
                                            wait=settings.FAIRLANE_LEASE_WAIT_SECONDS)
            if not has_lease:
                breakers.neutral(name)
                ROUTE_ATTEMPTS.labels(name, "lease").inc()
                breakers.end(name)
                return None
        started = time.monotonic()
        if spec.is_local:
            served = await _local(attempt, route)
        else:
            served = await _remote(attempt, route, started)
    except UpstreamError as exc:
        breakers.end(name)
        if has_lease:
            await asyncio.to_thread(leases_get().release, name, attempt.request_id)
        return _failed(attempt, route, exc)
    except BaseException:
        breakers.neutral(name)
        breakers.end(name)
        if has_lease:
            await asyncio.to_thread(leases_get().release, name, attempt.request_id)
        raise
    ttft = time.monotonic() - started
    ROUTE_TTFT.labels(name).observe(ttft)
    breakers.success(name, ttft * 1000)
    ROUTE_ATTEMPTS.labels(name, "ok").inc()
    # Started now, so that its clean-up (settlement, the backend's slot, the lease) runs even
    # if nobody ever reads it: asyncio closes a started async generator that is collected.
    guarded = _guarded(served.events, route, attempt.request_id, has_lease)
    try:
        first = await anext(guarded)
    except StopAsyncIteration:
        first = None
    served.events = _prepend(first, guarded)
    return served


async def _prepend(first: dict | None, rest: AsyncIterator[dict]) -> AsyncIterator[dict]:
    try:
        if first is not None:
            yield first
        async for event in rest:
            yield event
    finally:
        await rest.aclose()


def _failed(attempt: Attempt, route: Route, exc: UpstreamError) -> None:
    name = route.backend.name
    logger.info("request %s: %s failed before its first token: %s (%s)", attempt.request_id,
                name, exc.code, exc.message)
    if exc.code in SURFACED:
        breakers.neutral(name)
        ROUTE_ATTEMPTS.labels(name, "refused").inc()
        raise _upstream_error(exc, route)
    if exc.code == "rate_limited":
        wait = exc.retry_after
        if wait is None:
            wait = settings.FAIRLANE_RETRY_BACKOFF_SECONDS
        breakers.cool(name, wait)  # nobody in this process sends to it before it said
        attempt.waits.append(wait)
        ROUTE_ATTEMPTS.labels(name, "rate_limited").inc()
    else:
        breakers.failure(name)
        if exc.retry_after:
            breakers.cool(name, exc.retry_after)
            attempt.waits.append(exc.retry_after)
        ROUTE_ATTEMPTS.labels(name, "failed").inc()
    attempt.errors.append(_upstream_error(exc, route))
    return None


async def _guarded(events: AsyncIterator[dict], route: Route, request_id: str,
                   has_lease: bool) -> AsyncIterator[dict]:
    """The served events; keeps the lease renewed while they flow and frees the backend's
    slot (and lease) when they end, however they end."""
    name, spec = route.backend.name, route.backend
    renewed = time.monotonic()
    try:
        async for event in events:
            if has_lease and time.monotonic() - renewed > spec.lease_seconds / 3:
                renewed = time.monotonic()
                await asyncio.to_thread(leases_get().renew, name, request_id,
                                        ttl=spec.lease_seconds)
            if event["type"] == "error" and event.get("code") not in SURFACED:
                breakers.failure(name)
            yield event
    finally:
        breakers.end(name)
        if has_lease:
            await asyncio.to_thread(leases_get().release, name, request_id)


async def _local(attempt: Attempt, route: Route) -> Served:
    """The local engine: a refusal before `accepted` has already been settled by the run (the
    engine refused the input), so it is the client's answer, not a reason to fall through;
    the local engine is skipped earlier instead when its queue is full or no worker is up."""
    job = attempt.job_for(route)
    events = dispatcher_get().events(job)
    first = await anext(events)
    if first["type"] == "error":
        await events.aclose()
        raise error_from_code(first["code"], first["message"], param=first.get("param"))
    return Served(route=route, job=job, events=events)


async def _remote(attempt: Attempt, route: Route, started: float) -> Served:
    call = attempt.call_for(route)
    job = attempt.job_for(route)
    if call.kind == "embed":
        result = await backend_embed(route, call.inputs)
        return Served(route=route, job=job, events=_embedded_events(job, route, call, result,
                                                                    started))
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
    return Served(route=route, job=job,
                  events=_remote_events(job, route, call, stream, head, started,
                                        attempt.reserved or 0))


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
        status = UsageRecord.Status.ERROR
        code = exc.code if exc.code in SURFACED or exc.code == "timeout" else "backend_unavailable"
        tail.append({"type": "error", "code": code, "param": None,
                     "message": f"The backend failed after the answer started: {exc.message}"})
    except (asyncio.CancelledError, GeneratorExit):
        status = UsageRecord.Status.CANCELLED
        raise
    finally:
        await stream.aclose()
        counted = _usage(usage, call, tokens)
        latency = int((time.monotonic() - started) * 1000)
        await asyncio.shield(asyncio.ensure_future(asyncio.to_thread(
            _remote_settle, job, route, counted, status, latency, tail.append, reserved)))
    for event in tail:
        yield event


async def _embedded_events(job: GenerationJob, route: Route, call: Call, result: dict,
                           started: float) -> AsyncIterator[dict]:
    for index, b64 in sorted(result["vectors"].items()):
        yield {"type": "embedding", "index": index, "b64": b64}
    prompt = result["prompt_tokens"] or sum(
        estimate_tokens(i) if isinstance(i, str) else len(i) for i in call.inputs)
    usage = {"prompt_tokens": prompt, "completion_tokens": 0, "cached_tokens": 0}
    tail: list[dict] = []
    await asyncio.to_thread(_remote_settle, job, route, {**usage, "total_tokens": prompt},
                            UsageRecord.Status.OK, int((time.monotonic() - started) * 1000),
                            tail.append)
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
