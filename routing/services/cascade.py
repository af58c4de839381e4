"""The agent's cascade: models cheapest first, each tier but the last asked whole (not
streamed) with log-probabilities; its answer is returned when its mean token log-probability
reaches the agent's threshold, else the next tier is asked. Every tier's call is its own
ledger row, so escalations are paid for honestly.

A tier that cannot answer this request (no backend supports it, e.g. Anthropic gives no
log-probabilities and /v1/completions gets none from remote servers; its context is too short;
its backends are down) escalates to the next tier. Budgets: a cascade never pays more because
the budget could not cover less. A tier refused for budget ends the cascade, since every later
tier is pricier: the answer of an earlier tier that fell short of the threshold is returned
(already paid for; `x-fairlane-cascade` says `escalation=budget`), and with none the client
gets the 429. A rate limit is the caller's, the same on every tier: it is answered at once.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator

from routing.admission import Caller
from routing.services.answers import Started, events_to_end
from tenants.errors import ApplicationError, BudgetExhausted, RateLimited
from tenants.models import UsageRecord
from workers.serving.events import Done, Event, Failed, Tokens
from workers.serving.runtime import Runtime

logger = logging.getLogger(__name__)


async def cascade_run(
    runtime: Runtime,
    caller: Caller,
    endpoint: str,
    request,
    tiers: list[str],
    threshold: float,
    *,
    start,
) -> Started:
    """Answer from the first confident tier, escalating as described above. `start` runs one
    tier's request (admission, routes walk) as generation does."""
    fallback: Started | None = None
    for tier in tiers[:-1]:
        try:
            scored = await _tier_try(runtime, caller, endpoint, request, tier, threshold, start)
        except BudgetExhausted:
            if fallback is not None:
                return _with_budget_note(fallback)
            raise
        if scored is not None:
            confident, replay = scored
            if confident:
                return replay
            fallback = replay
    last = dataclasses.replace(request, model=tiers[-1])
    try:
        generation, served = await start(runtime, caller, endpoint, last)
    except BudgetExhausted:
        if fallback is not None:
            return _with_budget_note(fallback)
        raise
    return generation.started(served)


def _with_budget_note(replay: Started) -> Started:
    replay.cascade += "; escalation=budget"
    return replay


async def _tier_try(
    runtime: Runtime, caller: Caller, endpoint: str, request, tier: str, threshold: float, start
) -> tuple[bool, Started] | None:
    """Ask a cheaper tier, whole, with log-probabilities: (whether its mean log-probability
    reaches the threshold, its answer to replay); None when it could not answer."""
    sampling = request.sampling
    if sampling.logprobs is None:
        sampling = dataclasses.replace(sampling, logprobs=0)
    try:
        generation, served = await start(
            runtime,
            caller,
            endpoint,
            dataclasses.replace(request, model=tier, stream=False, sampling=sampling),
        )
    except (BudgetExhausted, RateLimited):
        raise
    except ApplicationError as exc:  # this tier cannot answer this request: escalate
        logger.info(
            "cascade tier %s cannot answer (%s: %s); escalating", tier, exc.code, exc.message
        )
        return None
    started = generation.started(served)
    events = [event async for event in events_to_end(started)]
    logprobs = [lp for e in events if isinstance(e, Tokens) for lp in (e.logprobs or ())]
    done = next((e for e in events if isinstance(e, Done)), None)
    if (
        not logprobs
        or done is None
        or done.status != UsageRecord.Status.OK
        or any(isinstance(e, Failed) for e in events)
    ):
        return None
    mean = sum(logprobs) / len(logprobs)
    logger.info(
        "request %s: cascade tier %s mean logprob %.3f (threshold %.3f)",
        generation.request_id,
        tier,
        mean,
        threshold,
    )
    replay = generation.started(
        served, replay=True, wants_logprobs=request.sampling.logprobs is not None
    )
    replay.stream, replay.include_usage = request.stream, request.include_usage
    replay.events = _replayed(events)
    replay.cascade = f"{tier}; mean_logprob={mean:.4f}"
    return mean >= threshold, replay


async def _replayed(events: list[Event]) -> AsyncIterator[Event]:
    for event in events:
        yield event
