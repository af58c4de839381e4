"""One request's walk as it holds money: who pays, what each route is sent, and the budget
held for it, changed as the walk moves between backends and released when none served it."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from routing.backends import Route
from routing.holds import holds
from tenants.errors import ApplicationError, BudgetExhausted
from tenants.models import Agent, ApiKey, Tenant
from tenants.services.budgets import budget_reserve, budget_reserve_adjust
from workers.jobs import GenerationJob
from workers.outbox import TRANSIENT, Settlement, settle_durably


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
    # The first route, prepared (budget held) in the admission's hop: (route, "" or why it
    # was refused, or the exception preparing it raised), taken by the walk's first try.
    prepared: tuple[Route, str | BaseException] | None = None
    held_at: float = 0.0  # when the budget was first held (epoch seconds): its "admitted"


def attempt_hold(attempt: Attempt, amount: int) -> None:
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
        attempt.held_at = time.time()
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
