"""Trying a request's offers (routing/attempts.py: what each route of the plan would be sent
and cost, computed before the walk, which routing/services/prepare.py drives): for one offer,
hold the budget its prices need, its circuit's permission and (on scarce backends) a lease,
then send, and report the outcome. A failure before the first token moves on to the next
offer; after it, the stream ends with an error event (never spliced from another model). Bad
input and content filters are surfaced, not retried elsewhere. When every offer failed, the
next round waits the longest wait a backend asked for (Retry-After) or a jittered backoff,
within FAIRLANE_RETRY_MAX_WAIT_SECONDS. Nothing here calls back into the services.

Remote answers are streamed and settled by routing/remote.py; the local engine settles its
own runs (workers/generation.py).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from django.conf import settings

from routing.attempts import Attempt, Offer, Offers, attempt_hold, attempt_release
from routing.backends import Route, UpstreamError
from routing.breaker import breakers
from routing.leases import lease_acquire, leases_get
from routing.metrics import ROUTE_ATTEMPTS, ROUTE_TTFT
from routing.errors import SURFACED, client_error
from routing.holds import holds
from routing.backend_store import backend_error_noted
from routing.remote import remote_start
from routing.sync import db_call
from tenants.errors import (
    ApplicationError, BackendUnavailable, BudgetExhausted, CircuitOpen, error_from_code,
)
from workers.events import Event, Failed
from workers.jobs import GenerationJob
from workers.modes import mode_get

logger = logging.getLogger(__name__)


@dataclass
class Served:
    offer: Offer
    events: AsyncIterator[Event]  # after Accepted

    @property
    def route(self) -> Route:
        return self.offer.route

    @property
    def job(self) -> GenerationJob:
        return self.offer.job


def round_wait(attempt: Attempt, offers: Offers, rounds: int, deadline: float) -> float:
    """Seconds to wait before the next round after `rounds` failed ones: a jittered backoff,
    no sooner than the first backend may be asked again (Retry-After); raises the error the
    client should see when another round is not worth it or would pass the deadline."""
    wait = offers.blocked_for if not offers.offers else 0.0
    if offers.offers:
        base = settings.FAIRLANE_RETRY_BACKOFF_SECONDS * 2 ** (rounds - 1)
        wait = random.uniform(base / 2, base)
        wait = max(wait, min(breakers.blocked_for(o.route.backend.name) for o in offers.offers))
    if (not _worth_retrying(attempt, offers) or rounds > settings.FAIRLANE_RETRIES
            or time.monotonic() + wait > deadline):
        raise _final_error(attempt, offers)
    return wait


async def walk_abandon(attempt: Attempt, exc: BaseException) -> None:
    """The walk ends unserved: release the hold; the error names the ledger's id, should the
    request have run anyway."""
    await db_call(attempt_release)(attempt)
    if isinstance(exc, ApplicationError):
        exc.headers.setdefault("x-request-id", attempt.request_id)


def _worth_retrying(attempt: Attempt, offers: Offers) -> bool:
    if not offers.offers:
        return offers.blocked_for > 0
    return any(e.retryable for e in attempt.errors)


def _final_error(attempt: Attempt, offers: Offers) -> ApplicationError:
    if attempt.budget_refusal is not None and not attempt.errors:
        return attempt.budget_refusal
    if not offers.offers and offers.blocked_for > 0 and not attempt.errors:
        return CircuitOpen("Every backend for this model is failing or asked us to wait; "
                           "retry later.", retry_after=max(int(offers.blocked_for + 0.999), 1))
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


def _offer_prepare(attempt: Attempt, offer: Offer) -> str:
    """Synchronous, in one hop: hold the budget for the offer's worst case. "" when it may be
    tried, else why not (the local engine refused it, or the budget cannot hold it)."""
    if offer.refusal is not None:  # the local queue is full (or no worker): spill over
        attempt.errors.append(offer.refusal)
        attempt.waits.append(float(offer.refusal.retry_after or 0))
        return "skipped"
    try:
        attempt_hold(attempt, offer.cost)
    except BudgetExhausted as exc:  # paid backends drop out; cheaper ones may remain
        attempt.budget_refusal = attempt.budget_refusal or exc
        return "budget"
    return ""


def offer_first_prepare(attempt: Attempt, offers: Offers) -> None:
    """Prepare the first offer now (synchronous: the admission's hop), so the walk's first
    try needs no hop of its own. What it raises is raised by the walk, which releases."""
    if offers.offers:
        offer = offers.offers[0]
        try:
            outcome = _offer_prepare(attempt, offer)
        except Exception as exc:  # noqa: BLE001 - handed to the walk as is
            outcome = exc
        attempt.prepared = (offer, outcome)


async def offer_try(attempt: Attempt, offer: Offer) -> Served | None:
    """Serve the request on this offer: hold its budget (unless the admission did), take its
    circuit's permission and lease, and send; None when it cannot (why, in `attempt.errors`,
    `attempt.waits` and `attempt.budget_refusal`)."""
    route = offer.route
    name = route.backend.name
    prepared, attempt.prepared = attempt.prepared, None
    if prepared is not None and prepared[0] is offer:
        if isinstance(prepared[1], BaseException):
            raise prepared[1]
        refusal = prepared[1]
    else:
        refusal = (_offer_prepare(attempt, offer) if offer.refusal is not None  # no hold
                   else await db_call(_offer_prepare)(attempt, offer))
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
        offer.job.timeline["admitted"] = attempt.held_at or time.time()
        if offer.call is None:
            served = Served(offer=offer, events=await _local(offer.job))
        else:
            offer.job.timeline.update(taken=time.time(), backend=name)
            served = Served(offer=offer, events=await remote_start(
                route, offer.call, offer.job, started, attempt.reserved or 0))
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


async def _prepend(first: Event | None, rest: AsyncIterator[Event]) -> AsyncIterator[Event]:
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


async def _guarded(events: AsyncIterator[Event], route: Route, request_id: str,
                   has_lease: bool) -> AsyncIterator[Event]:
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
            if isinstance(event, Failed) and event.code not in SURFACED:
                breakers.failure(name)
            yield event
    finally:
        holds.discard(request_id)  # settled (or being settled) by now
        breakers.end(name)
        if has_lease:
            await asyncio.to_thread(leases_get().release, name, request_id)


async def _local(job: GenerationJob) -> AsyncIterator[Event]:
    """The local engine: a refusal before `accepted` has already been settled by the run (the
    engine refused the input), so it is the client's answer, not a reason to fall through;
    the local engine is skipped earlier instead when its queue is full or no worker is up. A
    retryable error (the model failed to load; nothing ran or was settled) falls through."""
    events = mode_get().dispatcher.events(job)
    match await anext(events):
        case Failed(retryable=True) as failed:  # nothing ran (its model failed to load)
            await events.aclose()
            raise UpstreamError(failed.code, failed.message, retry_after=failed.retry_after)
        case Failed() as failed:
            await events.aclose()
            raise error_from_code(failed.code, failed.message, param=failed.param)
    return events
