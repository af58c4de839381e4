"""One request's walk as it holds money: what each route of the plan would be sent and cost
(its offers, computed before the walk), who pays, and the budget held, changed as the walk
moves between backends and released when none served it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from routing.backends import Call, Route
from routing.metrics import Outcome
from tenants.errors import DATABASE_TRANSIENT, ApplicationError, BudgetExhausted
from tenants.models import Agent, ApiKey, Tenant
from tenants.services.budgets import budget_reserve, budget_reserve_adjust
from workers.serving.jobs import Job
from workers.serving.runtime import Runtime
from workers.serving.settlement import settlement_release


@dataclass(frozen=True, slots=True)
class Offer:
    """What one route would be sent and cost, decided before the walk reads it."""

    route: Route
    job: Job  # the ledger's job; the local engine runs it as is
    call: Call | None  # what a remote backend is sent (None: the local engine)
    cost: int  # worst-case micro-cents, held before anything is sent
    # The local engine cannot take it now (queue full, no worker, model failed to load):
    # the walk skips it, counting why.
    refusal: ApplicationError | None = None
    brownout: str = ""  # the x-fairlane-brownout header the local engine's load set


@dataclass(frozen=True, slots=True)
class Offers:
    """One round of the walk: the plan's offers in order, and, when it has none because every
    candidate's circuit is open or cooling, how long until one is not."""

    offers: list[Offer]
    blocked_for: float = 0.0


@dataclass
class Attempt:
    """One request's walk: who pays and what has been reserved, in this process's runtime."""

    runtime: Runtime
    request_id: str
    tenant: Tenant
    agent: Agent
    api_key: ApiKey | None
    model: str = ""  # the model asked for: model-filtered budgets apply by it
    reserved: int | None = None  # micro-cents held now (None: no reservation yet)
    # The database failed while reserving: the hold may have committed, so release it too.
    maybe_reserved: bool = False
    errors: list[ApplicationError] = field(default_factory=list)
    budget_refusal: BudgetExhausted | None = None
    waits: list[float] = field(default_factory=list)
    # The first offer, prepared (budget held) in the admission's hop: (offer, None or why it
    # was refused, or the exception preparing it raised), taken by the walk's first try.
    prepared: tuple[Offer, Outcome | BaseException | None] | None = None
    reserved_at: float = 0.0  # when the budget was first held (epoch seconds): its "admitted"


def attempt_reserve(attempt: Attempt, amount: int) -> None:
    """Hold `amount` for this request (synchronous): a first reservation, or a change of the
    one held; BudgetExhausted leaves what was held."""
    if attempt.reserved is None:
        try:
            budget_reserve(
                tenant=attempt.tenant,
                agent=attempt.agent,
                amount_microcents=amount,
                request_id=attempt.request_id,
                api_key=attempt.api_key,
                model=attempt.model,
            )
        except DATABASE_TRANSIENT:
            attempt.maybe_reserved = True
            raise
        attempt.runtime.reservations.add(attempt.request_id)  # renewed while it runs
        attempt.reserved_at = time.time()
    elif amount != attempt.reserved:
        budget_reserve_adjust(
            tenant=attempt.tenant, request_id=attempt.request_id, amount_microcents=amount
        )
    attempt.reserved = amount


def attempt_release(attempt: Attempt) -> None:
    """Free the request's hold (it was never served), durably (workers/serving/settlement.py)."""
    if attempt.reserved is None and not attempt.maybe_reserved:
        return
    attempt.runtime.reservations.discard(attempt.request_id)
    settlement_release(
        attempt.runtime.outbox, request_id=attempt.request_id, tenant_id=attempt.tenant.pk
    )
    attempt.reserved, attempt.maybe_reserved = None, False
