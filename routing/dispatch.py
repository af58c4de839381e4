"""Walking a request's fall-through chain: for each backend in the plan, hold the budget its
prices need, its circuit's permission and (on scarce backends) a lease, then send. A failure
before the first token moves on to the next backend; after it, the stream ends with an error
event (never spliced from another model). Bad input and content filters are surfaced, not
retried elsewhere. When every backend failed, the walk is retried after the longest wait a
backend asked for (Retry-After) or a jittered backoff, within FAIRLANE_RETRY_MAX_WAIT_SECONDS.

Remote answers are streamed and settled by routing/remote.py; the local engine settles its
own runs (workers/generation.py).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from channels.db import database_sync_to_async
from django.conf import settings

from routing.backends import Route, UpstreamError
from routing.breaker import breakers
from routing.leases import lease_acquire, leases_get
from routing.metrics import ROUTE_ATTEMPTS, ROUTE_TTFT
from routing.errors import SURFACED, client_error
from routing.holds import holds
from routing.registry import backend_error_noted
from routing.remote import remote_start
from tenants.errors import (
    ApplicationError, BackendUnavailable, BudgetExhausted, CircuitOpen, error_from_code,
)
from tenants.models import Agent, ApiKey, Tenant
from tenants.services.budgets import budget_reserve, budget_reserve_adjust
from workers.generation import GenerationJob
from workers.outbox import TRANSIENT, Settlement, settle_durably
from workers.transport import dispatcher_get

logger = logging.getLogger(__name__)


@dataclass
class Attempt:
    """One request's walk: who pays, what each route is sent, what has been held."""

    request_id: str
    tenant: Tenant
    agent: Agent
    api_key: ApiKey | None
    # Per route: the job a local engine runs (token prompts), or the call a remote one gets.
    job_for: Callable[[Route], GenerationJob]
    call_for: Callable[[Route], object]  # routing.backends.Call
    cost_for: Callable[[Route], int]  # worst-case micro-cents
    local_ready: Callable[[Route, bool], None]  # raises to skip the local engine
    reserved: int | None = None  # micro-cents held now (None: no reservation yet)
    # The database failed while reserving: the hold may have committed, so release it too.
    maybe_reserved: bool = False
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
        try:
            budget_reserve(tenant=attempt.tenant, agent=attempt.agent,
                           amount_microcents=amount, request_id=attempt.request_id,
                           api_key=attempt.api_key)
        except TRANSIENT:
            attempt.maybe_reserved = True
            raise
        holds.add(attempt.request_id)  # renewed for as long as the request runs
    elif amount != attempt.reserved:
        budget_reserve_adjust(tenant=attempt.tenant, request_id=attempt.request_id,
                              amount_microcents=amount)
    attempt.reserved = amount


def attempt_release(attempt: Attempt) -> None:
    """Free the request's hold (it was never served). Durable like a settlement: when the
    database does not answer, the release waits in the outbox, so no hold outlives its
    request."""
    if attempt.reserved is None and not attempt.maybe_reserved:
        return
    holds.discard(attempt.request_id)
    settle_durably(Settlement(request_id=attempt.request_id, tenant_id=attempt.tenant.pk,
                              cost_microcents=0, usage={}, at=time.time(), release=True))
    attempt.reserved, attempt.maybe_reserved = None, False


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
    except BaseException as exc:
        await database_sync_to_async(attempt_release)(attempt)
        if isinstance(exc, ApplicationError):  # the ledger's id, should it have run anyway
            exc.headers.setdefault("x-request-id", attempt.request_id)
        raise


def _worth_retrying(attempt: Attempt, plan) -> bool:
    if not plan.routes:
        return plan.blocked_for > 0
    return any(e.retryable for e in attempt.errors)


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


def _upstream_error(exc: UpstreamError) -> ApplicationError:
    code = exc.code if exc.code in SURFACED | {"timeout", "service_unavailable"} \
        else "backend_unavailable"
    return client_error(code, retryable=exc.fall_through)


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
            job = attempt.job_for(route)
            served = Served(route=route, job=job, events=await remote_start(
                route, attempt.call_for(route), job, started, attempt.reserved or 0))
    except UpstreamError as exc:
        breakers.end(name)
        if has_lease:
            await asyncio.to_thread(leases_get().release, name, attempt.request_id)
        await backend_error_noted(name, f"{exc.code}: {exc.message}")
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
        raise _upstream_error(exc)
    if exc.code == "service_unavailable":  # our own store failed, not the backend
        breakers.neutral(name)
        attempt.waits.append(exc.retry_after or 1.0)
        ROUTE_ATTEMPTS.labels(name, "failed").inc()
    elif exc.code == "rate_limited":
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
    attempt.errors.append(_upstream_error(exc))
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
        holds.discard(request_id)  # settled (or being settled) by now
        breakers.end(name)
        if has_lease:
            await asyncio.to_thread(leases_get().release, name, request_id)


async def _local(attempt: Attempt, route: Route) -> Served:
    """The local engine: a refusal before `accepted` has already been settled by the run (the
    engine refused the input), so it is the client's answer, not a reason to fall through;
    the local engine is skipped earlier instead when its queue is full or no worker is up. A
    retryable error (the model failed to load; nothing ran or was settled) falls through."""
    job = attempt.job_for(route)
    events = dispatcher_get().events(job)
    first = await anext(events)
    if first["type"] == "error":
        await events.aclose()
        if first.get("retryable"):  # nothing ran (its model failed to load): fall through
            raise UpstreamError(first["code"], first["message"],
                                retry_after=first.get("retry_after"))
        raise error_from_code(first["code"], first["message"], param=first.get("param"))
    return Served(route=route, job=job, events=events)
