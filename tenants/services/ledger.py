"""Settlement: charge a request's actual cost, free the rest of its hold, and write its one
ledger row, exactly once per request id.

No path charges past a limit. A settlement normally finds its hold in place, and its cost
within it. When the hold is gone (nobody renewed it: its API process stalled or the database
was unreachable for longer than FAIRLANE_RESERVATION_TTL_SECONDS, and the beat released it) or
the cost exceeds it (a provider's price moved), the windows may no longer have the room: it
charges at most what is left, and the ledger row records the rest as `unbilled_microcents`,
with a warning and a metric for the operator.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from tenants.errors import NotFound
from tenants.metrics import SETTLEMENTS_CAPPED, UNBILLED
from tenants.models import BudgetWindow, Reservation, Tenant, UsageRecord
from tenants.services import budget_sql
from tenants.services.alerts import budget_alerts_evaluate
from tenants.services.budgets import amount_clean, reservation_lock

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Usage:
    """What a finished (or cut) request used, as the backend reported it."""

    backend: str = ""
    model: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    latency_ms: int = 0
    status: str = UsageRecord.Status.OK
    trace_id: str = ""
    model_version: str = ""
    timeline: dict | None = None  # {step: epoch seconds, ...}: routing/trace.py


def _charge_within_limits(*, reservation: Reservation, cost: int) -> int:
    """Free the reservation's hold and charge what its windows have room for (at most `cost`)
    in the windows it was made in (not today's, when it was reserved before midnight).
    Returns the charge. The windows are locked in the order holds lock them (SQLite, the
    only database this path runs on, locks the whole database for the transaction)."""
    held = reservation.amount_microcents if reservation.status == Reservation.Status.HELD else 0
    ids = reservation.window_ids()
    windows = {
        w.pk: w
        for w in BudgetWindow.objects.select_for_update(of=("self",))
        .select_related("budget")
        .filter(pk__in=ids)
    }
    charge = cost
    for window in (windows[i] for i in ids if i in windows):
        room = (
            window.budget.limit_microcents
            - window.spent_microcents
            - (window.reserved_microcents - held)
        )
        charge = max(min(charge, room), 0)
    for window_id in (i for i in ids if i in windows):
        if held or charge:
            BudgetWindow.objects.filter(pk=window_id).update(
                reserved_microcents=F("reserved_microcents") - held,
                spent_microcents=F("spent_microcents") + charge,
            )
    return charge


def budget_settle(
    *,
    tenant: Tenant,
    request_id: str,
    cost_microcents: int,
    usage: Usage,
    now: datetime | None = None,
) -> UsageRecord:
    """Charge a request's actual cost, free the rest of its reservation, and write its one
    ledger row. Idempotent: settling again returns the first row and charges nothing. What
    the budget had no room for is recorded as unbilled, never charged past the limit."""
    cost = amount_clean(cost_microcents, param="cost_microcents")
    now = now or timezone.now()
    if budget_sql.enabled():
        return _settle_sql(tenant=tenant, request_id=request_id, cost=cost, usage=usage, now=now)
    with transaction.atomic():
        reservation = reservation_lock(tenant=tenant, request_id=request_id)
        if reservation.status == Reservation.Status.SETTLED:
            return UsageRecord.objects.get(request_id=request_id)
        charge = _charge_within_limits(reservation=reservation, cost=cost)
        _charged(
            tenant=tenant,
            request_id=request_id,
            cost=cost,
            charge=charge,
            held=reservation.amount_microcents,
            prior=reservation.status,
            window_ids=tuple(reservation.window_ids()),
        )
        reservation.status = Reservation.Status.SETTLED
        reservation.closed_at = now
        reservation.save(update_fields=["status", "closed_at"])
        return UsageRecord.objects.create(
            request_id=request_id,
            agent_id=reservation.agent_id,
            api_key_id=reservation.api_key_id,
            **_row(tenant, usage, cost, charge, now),
        )


def _row(tenant: Tenant, usage: Usage, cost: int, charge: int, now: datetime) -> dict:
    return {
        "tenant": tenant,
        "backend": usage.backend,
        "model": usage.model,
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cached_tokens": usage.cached_tokens,
        "cost_microcents": charge,
        "unbilled_microcents": cost - charge,
        "latency_ms": usage.latency_ms,
        "status": usage.status,
        "created_at": now,
        "trace_id": usage.trace_id,
        "model_version": usage.model_version,
        "timeline": usage.timeline or {},
    }


def _settle_sql(
    *, tenant: Tenant, request_id: str, cost: int, usage: Usage, now: datetime
) -> UsageRecord:
    done = budget_sql.settle(
        request_id=request_id, tenant_id=tenant.pk, cost=cost, usage=usage, now=now
    )
    if done.outcome == "missing":
        raise NotFound(f"No reservation for request {request_id}.")
    if done.outcome == "settled":
        return UsageRecord.objects.get(request_id=request_id)
    if done.agent_id is None:  # a reservation always names its agent
        raise IntegrityError(f"the settlement of {request_id} returned no agent")
    _charged(
        tenant=tenant,
        request_id=request_id,
        cost=cost,
        charge=done.charge,
        held=done.held,
        prior=done.prior,
        window_ids=done.window_ids(),
        spent_after=done.spent_after(),
    )
    return UsageRecord(
        id=done.usage_id,
        request_id=request_id,
        agent_id=done.agent_id,
        api_key_id=done.api_key_id,
        **_row(tenant, usage, cost, done.charge, now),
    )


def _charged(
    *,
    tenant: Tenant,
    request_id: str,
    cost: int,
    charge: int,
    held: int,
    prior: str,
    window_ids: tuple,
    spent_after: dict | None = None,
) -> None:
    """What follows a charge: the alert rules (once committed) and, when the budget had no
    room for all of it, the operator's warning."""
    budget_alerts_evaluate(
        tenant=tenant, charge=charge, window_ids=window_ids, spent_after=spent_after
    )
    if charge < cost:
        SETTLEMENTS_CAPPED.inc()
        UNBILLED.inc(cost - charge)
        logger.warning(
            "request %s: cost %d micro-cents, but its budget had room for %d "
            "(its hold of %d was %s); %d left unbilled",
            request_id,
            cost,
            charge,
            held,
            prior,
            cost - charge,
        )
