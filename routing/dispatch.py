"""Trying a request's offers (routing/attempts.py: what each route of the plan would be sent
and cost, computed before the walk, which routing/services/prepare.py drives): for one offer,
hold the budget its prices need, its circuit's permission and (on scarce backends) a lease,
then send, and report the outcome. A failure before the first token moves on to the next
offer; after it, the stream ends with an error event (never spliced from another model). Bad
input and content filters are surfaced, not retried elsewhere. When every offer failed, the
next round waits the longest wait a backend asked for (Retry-After) or a jittered backoff,
within FAIRLANE_RETRY_MAX_WAIT_SECONDS. Nothing here calls back into the services.

Remote answers are streamed and settled by routing/remote.py; the local engine settles its
own runs (workers/run_loops.py).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from django.conf import settings

from routing.attempts import Attempt, Offer, Offers, attempt_release, attempt_reserve
from routing.backend_store import backend_error_noted
from routing.backends import Route
from routing.breaker import breakers
from routing.errors import backend_error
from routing.leases import lease_acquire
from routing.metrics import ROUTE_ATTEMPTS, ROUTE_TTFT, Outcome
from routing.remote import remote_start
from routing.sync import db_call
from tenants.errors import (
    ApplicationError,
    BackendUnavailable,
    BudgetExhausted,
    CircuitOpen,
    error_class,
    error_from_code,
)
from workers.serving.events import Event, Failed
from workers.serving.jobs import Job
from workers.serving.runtime import Runtime

logger = logging.getLogger(__name__)


@dataclass
class Served:
    offer: Offer
    events: AsyncGenerator[Event, None]  # after Accepted

    @property
    def route(self) -> Route:
        return self.offer.route

    @property
    def job(self) -> Job:
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
    if (
        not _worth_retrying(attempt, offers)
        or rounds > settings.FAIRLANE_RETRIES
        or time.monotonic() + wait > deadline
    ):
        raise _final_error(attempt, offers)
    return wait


async def walk_abandon(attempt: Attempt) -> None:
    """The walk ends unserved: release the reservation."""
    await db_call(attempt_release)(attempt)


def walk_error(attempt: Attempt, exc: ApplicationError) -> ApplicationError:
    """The error the client sees when the walk ends unserved: it names the ledger's id,
    should the request have run anyway."""
    if "x-request-id" in exc.headers:
        return exc
    return exc.replace(headers={**exc.headers, "x-request-id": attempt.request_id})


def _worth_retrying(attempt: Attempt, offers: Offers) -> bool:
    if not offers.offers:
        return offers.blocked_for > 0
    return any(e.retryable for e in attempt.errors)


def _final_error(attempt: Attempt, offers: Offers) -> ApplicationError:
    if attempt.budget_refusal is not None and not attempt.errors:
        return attempt.budget_refusal
    if not offers.offers and offers.blocked_for > 0 and not attempt.errors:
        return CircuitOpen(
            "Every backend for this model is failing or asked us to wait; retry later.",
            retry_after=max(int(offers.blocked_for + 0.999), 1),
        )
    if attempt.errors:
        wait = max(attempt.waits, default=0.0)
        return attempt.errors[-1].replace(retry_after=max(int(wait + 0.999), 1))
    return BackendUnavailable("No backend can serve this request right now.", retry_after=5)


def _offer_prepare(attempt: Attempt, offer: Offer) -> Outcome | None:
    """Synchronous, in one hop: reserve the budget for the offer's worst case. None when it
    may be tried, else why not (the local engine refused it, or the budget cannot hold it)."""
    if offer.refusal is not None:  # the local queue is full (or no worker): spill over
        attempt.errors.append(offer.refusal)
        attempt.waits.append(float(offer.refusal.retry_after or 0))
        return Outcome.SKIPPED
    try:
        attempt_reserve(attempt, offer.cost)
    except BudgetExhausted as exc:  # paid backends drop out; cheaper ones may remain
        attempt.budget_refusal = attempt.budget_refusal or exc
        return Outcome.BUDGET
    return None


def offer_first_prepare(attempt: Attempt, offers: Offers) -> None:
    """Prepare the first offer now (synchronous: the admission's hop), so the walk's first
    try needs no hop of its own. What it raises is raised by the walk, which releases."""
    if offers.offers:
        offer = offers.offers[0]
        outcome: Outcome | BaseException | None
        try:
            outcome = _offer_prepare(attempt, offer)
        except Exception as exc:
            outcome = exc
        attempt.prepared = (offer, outcome)


async def offer_try(attempt: Attempt, offer: Offer) -> Served | None:
    """Serve the request on this offer: hold its budget (unless the admission did), take its
    circuit's permission and lease, and send; None when it cannot (why, in `attempt.errors`,
    `attempt.waits` and `attempt.budget_refusal`)."""
    route, runtime = offer.route, attempt.runtime
    name = route.backend.name
    runtime.breaker_publisher.loop.start()  # this process routes requests: publish its breakers
    prepared, attempt.prepared = attempt.prepared, None
    if prepared is not None and prepared[0] is offer:
        if isinstance(prepared[1], BaseException):
            raise prepared[1]
        refusal = prepared[1]
    else:
        refusal = (
            _offer_prepare(attempt, offer)
            if offer.refusal is not None  # no hold
            else await db_call(_offer_prepare)(attempt, offer)
        )
    if refusal is not None:
        ROUTE_ATTEMPTS.labels(name, refusal).inc()
        return None
    if not breakers.begin(name):
        ROUTE_ATTEMPTS.labels(name, Outcome.SKIPPED).inc()
        return None
    spec = route.backend
    has_lease = False
    try:
        if spec.lease_seconds:
            has_lease = await lease_acquire(
                runtime.leases,
                name,
                attempt.request_id,
                ttl=spec.lease_seconds,
                slots=spec.max_concurrency or 1,
                depth=spec.queue_depth,
                wait=settings.FAIRLANE_LEASE_WAIT_SECONDS,
            )
            if not has_lease:
                breakers.neutral(name)
                ROUTE_ATTEMPTS.labels(name, Outcome.LEASE).inc()
                breakers.end(name)
                return None
        started = time.monotonic()
        offer.job.timeline["admitted"] = attempt.reserved_at or time.time()
        if offer.call is None:
            served = Served(offer=offer, events=await _local(runtime, offer.job, name))
        else:
            offer.job.timeline.update(taken=time.time(), backend=name)
            served = Served(
                offer=offer,
                events=await remote_start(
                    runtime.outbox, route, offer.call, offer.job, started, attempt.reserved or 0
                ),
            )
    except BaseException as exc:
        # A failure of this backend's (an ApplicationError naming it) is the walk's to
        # handle; anything else (our own refusal, a cancellation) goes on up.
        backend_failure = (
            exc if isinstance(exc, ApplicationError) and exc.backend is not None else None
        )
        if backend_failure is None:
            breakers.neutral(name)
        breakers.end(name)
        if has_lease:
            await asyncio.to_thread(runtime.leases.release, name, attempt.request_id)
        if backend_failure is None:
            raise
        await backend_error_noted(name, f"{backend_failure.code}: {backend_failure.detail}")
        _failed(attempt, route, backend_failure)
        return None
    ttft = time.monotonic() - started
    ROUTE_TTFT.labels(name).observe(ttft)
    breakers.success(name, ttft * 1000)
    ROUTE_ATTEMPTS.labels(name, Outcome.OK).inc()
    # Started now, so that its clean-up (settlement, the backend's slot, the lease) runs even
    # if nobody ever reads it: asyncio closes a started async generator that is collected.
    guarded = _guarded(runtime, served.events, route, attempt.request_id, has_lease)
    try:
        first = await anext(guarded)
    except StopAsyncIteration:
        first = None
    served.events = _prepend(first, guarded)
    return served


async def _prepend(
    first: Event | None, rest: AsyncGenerator[Event, None]
) -> AsyncGenerator[Event, None]:
    try:
        if first is not None:
            yield first
        async for event in rest:
            yield event
    finally:
        await rest.aclose()


def _failed(attempt: Attempt, route: Route, exc: ApplicationError) -> None:
    """A backend failed before its first token: the client hears a surfaced error at once;
    any other is noted (the circuit, the wait it asked for) for the walk's next offer."""
    name = route.backend.name
    logger.info(
        "request %s: %s failed before its first token: %s (%s)",
        attempt.request_id,
        name,
        exc.code,
        exc.detail,
    )
    if exc.surfaced:
        breakers.neutral(name)
        ROUTE_ATTEMPTS.labels(name, Outcome.REFUSED).inc()
        raise exc
    if exc.backend_code == "service_unavailable":  # our own store failed, not the backend
        breakers.neutral(name)
        attempt.waits.append(exc.retry_after or 1.0)
        ROUTE_ATTEMPTS.labels(name, Outcome.FAILED).inc()
    elif exc.backend_code == "rate_limited":
        wait = exc.retry_after
        if wait is None:
            wait = settings.FAIRLANE_RETRY_BACKOFF_SECONDS
        breakers.cool(name, wait)  # nobody in this process sends to it before it said
        attempt.waits.append(wait)
        ROUTE_ATTEMPTS.labels(name, Outcome.RATE_LIMITED).inc()
    else:
        breakers.failure(name)
        if exc.retry_after:
            breakers.cool(name, exc.retry_after)
            attempt.waits.append(exc.retry_after)
        ROUTE_ATTEMPTS.labels(name, Outcome.FAILED).inc()
    attempt.errors.append(exc)
    return None


async def _guarded(
    runtime: Runtime,
    events: AsyncGenerator[Event, None],
    route: Route,
    request_id: str,
    has_lease: bool,
) -> AsyncGenerator[Event, None]:
    """The served events; keeps the lease renewed while they flow and frees the backend's
    slot (and lease) when they end, however they end."""
    name, spec = route.backend.name, route.backend
    renewed = time.monotonic()
    try:
        async for event in events:
            if has_lease and time.monotonic() - renewed > spec.lease_seconds / 3:
                renewed = time.monotonic()
                await asyncio.to_thread(
                    runtime.leases.renew, name, request_id, ttl=spec.lease_seconds
                )
            if isinstance(event, Failed) and not error_class(event.code).surfaced:
                breakers.failure(name)
            yield event
    finally:
        runtime.reservations.discard(request_id)  # settled (or being settled) by now
        breakers.end(name)
        if has_lease:
            await asyncio.to_thread(runtime.leases.release, name, request_id)


async def _local(runtime: Runtime, job: Job, name: str) -> AsyncGenerator[Event, None]:
    """The local engine: a refusal before `accepted` has already been settled by the run (the
    engine refused the input), so it is the client's answer, not a reason to fall through;
    the local engine is skipped earlier instead when its queue is full or no worker is up. A
    retryable error (the model failed to load; nothing ran or was settled) falls through."""
    events = runtime.dispatcher.events(job)
    match await anext(events):
        case Failed(retryable=True) as failed:  # nothing ran (its model failed to load)
            await events.aclose()
            raise backend_error(
                failed.code, failed.message, backend=name, retry_after=failed.retry_after
            )
        case Failed() as failed:
            await events.aclose()
            raise error_from_code(failed.code, failed.message, param=failed.param)
    return events
