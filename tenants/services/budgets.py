"""Budgets: reserve a request's worst-case cost before it is sent, settle its actual cost after.

The invariant: in every window, spent + reserved never exceeds the limit, however many API
processes reserve at once. Each hold is one conditional UPDATE
(`reserved = reserved + c WHERE spent + reserved + c <= limit`), which PostgreSQL re-checks on
the latest row version after waiting for the row lock, and which SQLite serialises with
IMMEDIATE transactions. The agent's window is always locked before the tenant's, so two
requests never wait on each other in opposite orders.
"""

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from tenants.errors import BudgetExhausted, InvalidRequest, NotFound
from tenants.models import (
    MAX_MICROCENTS, Agent, ApiKey, Budget, BudgetWindow, Period, Reservation, Tenant, UsageRecord,
)
from tenants.services.validation import save_validated
from tenants.windows import window_bounds

logger = logging.getLogger(__name__)


def _amount_clean(value, *, param: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_MICROCENTS:
        raise InvalidRequest(f"{param} must be an integer from 0 to {MAX_MICROCENTS}.",
                             param=param)
    return value


def budget_create(*, tenant: Tenant, agent: Agent | None, limit_microcents: int,
                  period: str = Period.DAILY) -> Budget:
    if agent is not None and agent.tenant_id != tenant.id:
        raise InvalidRequest("agent does not belong to this tenant.", param="agent")
    if Budget.objects.filter(tenant=tenant, agent=agent).exists():
        raise InvalidRequest("This owner already has a budget; change it instead.",
                             param="agent")
    budget = Budget(tenant=tenant, agent=agent, period=period,
                    limit_microcents=_amount_clean(limit_microcents, param="limit_microcents"))
    return save_validated(budget, unique_param="agent")


def budget_update(*, budget: Budget, **fields) -> Budget:
    for field, value in fields.items():
        if field == "limit_microcents":
            value = _amount_clean(value, param=field)
        elif field != "period":
            raise InvalidRequest(f"{field} cannot be changed.", param=field)
        setattr(budget, field, value)
    return save_validated(budget)


def budget_delete(*, budget: Budget) -> None:
    budget.delete()


def budget_window_current(*, budget: Budget, now: datetime) -> BudgetWindow:
    """The budget's window containing `now`, created on first use."""
    start, end = window_bounds(period=budget.period, tz_name=budget.tenant.timezone, now=now)
    window, _ = BudgetWindow.objects.get_or_create(budget=budget, start=start,
                                                   defaults={"end": end})
    return window


def _window_hold(*, budget: Budget, amount: int, now: datetime, owner: str) -> BudgetWindow:
    window = budget_window_current(budget=budget, now=now)
    held = BudgetWindow.objects.filter(
        pk=window.pk,
        reserved_microcents__lte=budget.limit_microcents - amount - F("spent_microcents"),
    ).update(reserved_microcents=F("reserved_microcents") + amount)
    if not held:
        raise BudgetExhausted(
            f"The {owner} {budget.period} budget cannot cover this request's worst-case cost; "
            f"it resets at {window.end.isoformat()}.",
            retry_after=int((window.end - now).total_seconds()) + 1,
        )
    return window


def _budgets_for(*, tenant: Tenant, agent: Agent) -> tuple[Budget | None, Budget | None]:
    budgets = {b.agent_id: b for b in Budget.objects.select_related("tenant").filter(
        Q(agent__isnull=True) | Q(agent=agent), tenant=tenant)}
    return budgets.get(agent.pk), budgets.get(None)


def budget_reserve(*, tenant: Tenant, agent: Agent, amount_microcents: int, request_id: str,
                   api_key: ApiKey | None = None, now: datetime | None = None) -> Reservation:
    """Hold a request's worst-case cost against the agent's and the tenant's current windows,
    both or neither. Raises BudgetExhausted (with Retry-After until the window resets)."""
    if agent.tenant_id != tenant.id:
        raise InvalidRequest("agent does not belong to this tenant.", param="agent")
    amount = _amount_clean(amount_microcents, param="amount_microcents")
    now = now or timezone.now()
    agent_budget, tenant_budget = _budgets_for(tenant=tenant, agent=agent)
    try:
        with transaction.atomic():
            agent_window = tenant_window = None
            if agent_budget is not None:
                agent_window = _window_hold(budget=agent_budget, amount=amount, now=now,
                                            owner="agent's")
            if tenant_budget is not None:
                tenant_window = _window_hold(budget=tenant_budget, amount=amount, now=now,
                                             owner="tenant's")
            return Reservation.objects.create(
                request_id=request_id, tenant=tenant, agent=agent, api_key=api_key,
                amount_microcents=amount, agent_window=agent_window, tenant_window=tenant_window,
                created_at=now,
                expires_at=now + timedelta(seconds=settings.FAIRLANE_RESERVATION_TTL_SECONDS),
            )
    except IntegrityError:
        raise InvalidRequest("A reservation with this request id exists.",
                             param="request_id") from None


def budget_reserve_adjust(*, tenant: Tenant, request_id: str, amount_microcents: int,
                          now: datetime | None = None) -> Reservation:
    """Change a held reservation to a new worst case (the request moved to a backend with
    other prices). Growing it takes the difference under the same conditional UPDATE as a
    reservation, so it raises BudgetExhausted and leaves the hold as it was when the budget
    cannot cover it; shrinking it always succeeds."""
    amount = _amount_clean(amount_microcents, param="amount_microcents")
    now = now or timezone.now()
    with transaction.atomic():
        reservation = _reservation_lock(tenant=tenant, request_id=request_id)
        if reservation.status != Reservation.Status.HELD:
            raise InvalidRequest("The reservation is no longer held.", param="request_id")
        delta = amount - reservation.amount_microcents
        windows = [(reservation.agent_window_id, "agent's"),
                   (reservation.tenant_window_id, "tenant's")]
        for window_id, owner in windows:
            if window_id is None or delta == 0:
                continue
            query = BudgetWindow.objects.filter(pk=window_id)
            if delta > 0:  # a constant limit, so PostgreSQL re-checks the row as it locks it
                limit = (BudgetWindow.objects.filter(pk=window_id)
                         .values_list("budget__limit_microcents", flat=True).get())
                query = query.filter(
                    reserved_microcents__lte=limit - delta - F("spent_microcents"))
            if not query.update(reserved_microcents=F("reserved_microcents") + delta):
                window = BudgetWindow.objects.get(pk=window_id)
                raise BudgetExhausted(
                    f"The {owner} budget cannot cover this request's worst-case cost; it "
                    f"resets at {window.end.isoformat()}.",
                    retry_after=int((window.end - now).total_seconds()) + 1)
        reservation.amount_microcents = amount
        reservation.save(update_fields=["amount_microcents"])
        return reservation


def _windows_unhold(*, reservation: Reservation, charge: int) -> None:
    """Free the reservation's hold and charge `charge` in the windows it was made in (not
    today's, when a request reserved before midnight settles after it)."""
    held = reservation.amount_microcents if reservation.status == Reservation.Status.HELD else 0
    for window_id in (reservation.agent_window_id, reservation.tenant_window_id):
        if window_id is not None and (held or charge):
            BudgetWindow.objects.filter(pk=window_id).update(
                reserved_microcents=F("reserved_microcents") - held,
                spent_microcents=F("spent_microcents") + charge,
            )


def _reservation_lock(*, tenant: Tenant, request_id: str) -> Reservation:
    reservation = (Reservation.objects.select_for_update()
                   .filter(tenant=tenant, request_id=request_id).first())
    if reservation is None:
        raise NotFound(f"No reservation for request {request_id}.")
    return reservation


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


def budget_settle(*, tenant: Tenant, request_id: str, cost_microcents: int, usage: Usage,
                  now: datetime | None = None) -> UsageRecord:
    """Charge a request's actual cost, free the rest of its reservation, and write its one
    ledger row. Idempotent: settling again returns the first row and charges nothing."""
    cost = _amount_clean(cost_microcents, param="cost_microcents")
    now = now or timezone.now()
    with transaction.atomic():
        reservation = _reservation_lock(tenant=tenant, request_id=request_id)
        if reservation.status == Reservation.Status.SETTLED:
            return UsageRecord.objects.get(request_id=request_id)
        if cost > reservation.amount_microcents:
            logger.warning("request %s cost %d exceeds its reservation %d", request_id, cost,
                           reservation.amount_microcents)
        _windows_unhold(reservation=reservation, charge=cost)
        reservation.status = Reservation.Status.SETTLED
        reservation.closed_at = now
        reservation.save(update_fields=["status", "closed_at"])
        return UsageRecord.objects.create(
            request_id=request_id, tenant=tenant, agent_id=reservation.agent_id,
            api_key_id=reservation.api_key_id, backend=usage.backend, model=usage.model,
            prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
            cached_tokens=usage.cached_tokens, cost_microcents=cost,
            latency_ms=usage.latency_ms, status=usage.status, created_at=now,
        )


def budget_release(*, tenant: Tenant, request_id: str, now: datetime | None = None,
                   status: str = Reservation.Status.RELEASED) -> Reservation:
    """Free a reservation without charging (the request never reached a backend).
    Idempotent; a settled reservation stays settled."""
    with transaction.atomic():
        reservation = _reservation_lock(tenant=tenant, request_id=request_id)
        if reservation.status == Reservation.Status.HELD:
            _windows_unhold(reservation=reservation, charge=0)
            reservation.status = status
            reservation.closed_at = now or timezone.now()
            reservation.save(update_fields=["status", "closed_at"])
    return reservation


def budget_reservations_expire(*, now: datetime | None = None) -> int:
    """Release reservations held past their TTL (their API process died); a late settlement
    still charges and records the request."""
    now = now or timezone.now()
    stale = Reservation.objects.filter(status=Reservation.Status.HELD, expires_at__lt=now)
    count = 0
    for tenant_id, request_id in stale.values_list("tenant_id", "request_id"):
        reservation = budget_release(tenant=Tenant(pk=tenant_id), request_id=request_id,
                                     now=now, status=Reservation.Status.EXPIRED)
        count += reservation.status == Reservation.Status.EXPIRED
    return count
