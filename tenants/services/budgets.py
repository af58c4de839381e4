"""Budgets: reserve a request's worst-case cost before it is sent, settle its actual cost after.

The invariant: in every window, spent + reserved never exceeds the limit, however many API
processes reserve at once. Each hold is one conditional UPDATE
(`reserved = reserved + c WHERE spent + reserved + c <= limit`), which PostgreSQL re-checks on
the latest row version after waiting for the row lock, and which SQLite serialises with
IMMEDIATE transactions. The agent's window is always locked before the tenant's, so two
requests never wait on each other in opposite orders; a reservation row is always locked
before the windows it holds on.

A hold lives as long as its request: whoever owns the request renews it
(`budget_reservations_renew`, the API process every third of FAIRLANE_RESERVATION_TTL_SECONDS), and
the beat releases only holds nobody renewed (their process died). Settlement is in
tenants/services/ledger.py.
"""

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from tenants.cache import epoch, hot_cache
from tenants.errors import BudgetExhausted, InvalidRequest, NotFound
from tenants.models import (
    MAX_MICROCENTS,
    Agent,
    ApiKey,
    Budget,
    BudgetWindow,
    Period,
    Reservation,
    SoftAction,
    Tenant,
)
from tenants.services import budget_sql
from tenants.services.alerts import budget_exhausted_alert
from tenants.services.audit import audit_change, snapshot
from tenants.services.validation import Conflict, save_validated
from tenants.windows import window_bounds, window_reservations_open, window_spent_settled

logger = logging.getLogger(__name__)


def amount_clean(value, *, param: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_MICROCENTS:
        raise InvalidRequest(f"{param} must be an integer from 0 to {MAX_MICROCENTS}.", param=param)
    return value


SOFT_FIELDS = ("soft_limit_microcents", "soft_action", "soft_rpm")


def _soft_clean(field: str, value):
    """The soft level's fields as given (None clears the level or the rpm)."""
    if value is None and field != "soft_action":
        return None
    if field == "soft_limit_microcents":
        return amount_clean(value, param=field)
    if field == "soft_action":
        if value not in SoftAction.values:
            raise InvalidRequest(
                f"soft_action must be one of {', '.join(SoftAction.values)}.", param=field
            )
        return value
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1_000_000:
        raise InvalidRequest("soft_rpm must be an integer from 1 to 1000000.", param=field)
    return value


def budget_create(
    *,
    tenant: Tenant,
    agent: Agent | None,
    limit_microcents: int,
    period: str = Period.DAILY,
    **soft,
) -> Budget:
    if agent is not None and agent.tenant_id != tenant.id:
        raise InvalidRequest("agent does not belong to this tenant.", param="agent")
    if Budget.objects.filter(tenant=tenant, agent=agent).exists():
        raise Conflict("This owner already has a budget; change it instead.", param="agent")
    budget = Budget(
        tenant=tenant,
        agent=agent,
        period=period,
        limit_microcents=amount_clean(limit_microcents, param="limit_microcents"),
    )
    for field, value in soft.items():
        if field not in SOFT_FIELDS:
            raise InvalidRequest(f"{field} is not a budget field.", param=field)
        setattr(budget, field, _soft_clean(field, value))
    with transaction.atomic():
        budget = save_validated(budget, unique_param="agent")
        audit_change("budget.create", budget)
    return budget


def budget_update(*, budget: Budget, **fields) -> Budget:
    before = snapshot(budget)
    for field, value in fields.items():
        if field == "limit_microcents":
            value = amount_clean(value, param=field)
        elif field in SOFT_FIELDS:
            value = _soft_clean(field, value)
        elif field != "period":
            raise InvalidRequest(f"{field} cannot be changed.", param=field)
        setattr(budget, field, value)
    with transaction.atomic():
        budget = save_validated(budget)
        if snapshot(budget) != before:
            audit_change("budget.update", budget, before=before)
    return budget


def budget_delete(*, budget: Budget) -> None:
    with transaction.atomic():
        audit_change("budget.delete", budget, before=snapshot(budget), deleted=True)
        budget.delete()


def budget_window_current(*, budget: Budget, now: datetime) -> BudgetWindow:
    """The budget's window containing `now`, opened on first use with what the ledger and the
    open holds already count in its time (see `_window_open`)."""
    start, end = window_bounds(period=budget.period, tz_name=budget.tenant.timezone, now=now)
    window = BudgetWindow.objects.filter(budget=budget, start=start).first()
    return window or _window_open(budget=budget, start=start, end=end)


def _window_open(*, budget: Budget, start: datetime, end: datetime) -> BudgetWindow:
    """Create a window that starts with what its owner already spent in its time: after a
    change of the tenant's time zone or the budget's period (or a budget created mid-window),
    the settled cost of every request reserved since `start` counts, and open holds of that
    time move into it, so a settings change never resets a window. Its own transaction, taken
    before any hold: the holds it moves are locked before their windows, as everywhere."""
    try:
        with transaction.atomic():
            moving = list(
                window_reservations_open(budget=budget, start=start, end=end)
                .select_for_update()
                .order_by("pk")
            )
            # After the locks: a settlement that won the race has committed, and is counted.
            window = BudgetWindow.objects.create(
                budget=budget,
                start=start,
                end=end,
                spent_microcents=window_spent_settled(budget=budget, start=start, end=end),
                reserved_microcents=sum(r.amount_microcents for r in moving),
            )
            field = "agent_window" if budget.agent_id else "tenant_window"
            for reservation in moving:
                old = getattr(reservation, f"{field}_id")
                if old is not None:
                    BudgetWindow.objects.filter(pk=old).update(
                        reserved_microcents=F("reserved_microcents") - reservation.amount_microcents
                    )
                setattr(reservation, field, window)
                reservation.save(update_fields=[field])
            return window
    except IntegrityError:  # another request opened it first
        return BudgetWindow.objects.get(budget=budget, start=start)


def _window_reserve(
    *, window: BudgetWindow, budget: Budget, amount: int, now: datetime, owner: str
) -> BudgetWindow:
    held = BudgetWindow.objects.filter(
        pk=window.pk,
        reserved_microcents__lte=budget.limit_microcents - amount - F("spent_microcents"),
    ).update(reserved_microcents=F("reserved_microcents") + amount)
    if not held:
        raise _exhausted(budget=budget, window=window, now=now, owner=owner)
    return window


_budgets = hot_cache("budgets")  # (tenant, agent) -> (agent's budget, tenant's budget)
_windows = hot_cache("windows")  # (budget, start) -> BudgetWindow (only id and end are read)


def budgets_for_caller(*, tenant: Tenant, agent: Agent) -> tuple[Budget | None, Budget | None]:
    found = _budgets.get((tenant.pk, agent.pk))
    if found is None:
        read_at = epoch()
        budgets = {
            b.agent_id: b
            for b in Budget.objects.select_related("tenant").filter(
                Q(agent__isnull=True) | Q(agent=agent), tenant=tenant
            )
        }
        found = budgets.get(agent.pk), budgets.get(None)
        _budgets.put((tenant.pk, agent.pk), found, read_at)
    return found


def budget_window_cached(*, budget: Budget, now: datetime) -> BudgetWindow:
    """The current window's row as cached (its counters are not: holds read them in SQL)."""
    start, _ = window_bounds(period=budget.period, tz_name=budget.tenant.timezone, now=now)
    window = _windows.get((budget.pk, start))
    if window is None:
        read_at = epoch()
        window = budget_window_current(budget=budget, now=now)
        _windows.put((budget.pk, start), window, read_at)
    return window


def _exhausted(
    *, budget: Budget, window: BudgetWindow, now: datetime, owner: str
) -> BudgetExhausted:
    exc = BudgetExhausted(
        f"The {owner} {budget.period} budget cannot cover this request's worst-case cost; "
        f"it resets at {window.end.isoformat()}.",
        retry_after=int((window.end - now).total_seconds()) + 1,
    )
    exc.window_id = window.pk
    return exc


def budget_reserve(
    *,
    tenant: Tenant,
    agent: Agent,
    amount_microcents: int,
    request_id: str,
    api_key: ApiKey | None = None,
    now: datetime | None = None,
) -> Reservation:
    """Hold a request's worst-case cost against the agent's and the tenant's current windows,
    both or neither. Raises BudgetExhausted (with Retry-After until the window resets)."""
    if agent.tenant_id != tenant.id:
        raise InvalidRequest("agent does not belong to this tenant.", param="agent")
    amount = amount_clean(amount_microcents, param="amount_microcents")
    now = now or timezone.now()
    agent_budget, tenant_budget = budgets_for_caller(tenant=tenant, agent=agent)
    windows = {
        b.pk: budget_window_cached(budget=b, now=now)
        for b in (agent_budget, tenant_budget)
        if b is not None
    }
    expires = now + timedelta(seconds=settings.FAIRLANE_RESERVATION_TTL_SECONDS)
    reservation = Reservation(
        request_id=request_id,
        tenant=tenant,
        agent=agent,
        api_key=api_key,
        amount_microcents=amount,
        created_at=now,
        expires_at=expires,
        agent_window=windows.get(agent_budget.pk) if agent_budget else None,
        tenant_window=windows.get(tenant_budget.pk) if tenant_budget else None,
    )
    try:
        if budget_sql.enabled():
            refused = budget_sql.reserve(reservation)
            if refused:
                budget = agent_budget if refused == "agent" else tenant_budget
                if budget is None:  # the function refuses only for a budget it was given
                    raise RuntimeError(f"the budget function refused an absent {refused} budget")
                raise _exhausted(
                    budget=budget, window=windows[budget.pk], now=now, owner=f"{refused}'s"
                )
            return reservation
        with transaction.atomic():
            for budget, owner in ((agent_budget, "agent's"), (tenant_budget, "tenant's")):
                if budget is not None:
                    _window_reserve(
                        window=windows[budget.pk],
                        budget=budget,
                        amount=amount,
                        now=now,
                        owner=owner,
                    )
            reservation.save(force_insert=True)
            return reservation
    except IntegrityError:
        raise InvalidRequest(
            "A reservation with this request id exists.", param="request_id"
        ) from None
    except BudgetExhausted as exc:  # after the rollback: the alert's writes must stand
        if exc.window_id is not None:
            budget_exhausted_alert(window_id=exc.window_id, now=now)
        raise


def budget_reserve_adjust(
    *, tenant: Tenant, request_id: str, amount_microcents: int, now: datetime | None = None
) -> Reservation:
    """Change a held reservation to a new worst case (the request moved to a backend with
    other prices). Growing it takes the difference under the same conditional UPDATE as a
    reservation, so it raises BudgetExhausted and leaves the hold as it was when the budget
    cannot cover it; shrinking it always succeeds."""
    amount = amount_clean(amount_microcents, param="amount_microcents")
    now = now or timezone.now()
    try:
        return _reserve_adjust(tenant=tenant, request_id=request_id, amount=amount, now=now)
    except BudgetExhausted as exc:  # after the rollback, as in budget_reserve
        if exc.window_id is not None:
            budget_exhausted_alert(window_id=exc.window_id, now=now)
        raise


def _reserve_adjust(*, tenant: Tenant, request_id: str, amount: int, now: datetime) -> Reservation:
    with transaction.atomic():
        reservation = reservation_lock(tenant=tenant, request_id=request_id)
        if reservation.status != Reservation.Status.HELD:
            raise InvalidRequest("The reservation is no longer held.", param="request_id")
        delta = amount - reservation.amount_microcents
        windows = [
            (reservation.agent_window_id, "agent's"),
            (reservation.tenant_window_id, "tenant's"),
        ]
        for window_id, owner in windows:
            if window_id is None or delta == 0:
                continue
            query = BudgetWindow.objects.filter(pk=window_id)
            if delta > 0:  # a constant limit, so PostgreSQL re-checks the row as it locks it
                limit = (
                    BudgetWindow.objects.filter(pk=window_id)
                    .values_list("budget__limit_microcents", flat=True)
                    .get()
                )
                query = query.filter(reserved_microcents__lte=limit - delta - F("spent_microcents"))
            if not query.update(reserved_microcents=F("reserved_microcents") + delta):
                window = BudgetWindow.objects.get(pk=window_id)
                exc = BudgetExhausted(
                    f"The {owner} budget cannot cover this request's worst-case cost; it "
                    f"resets at {window.end.isoformat()}.",
                    retry_after=int((window.end - now).total_seconds()) + 1,
                )
                exc.window_id = window.pk
                raise exc
        reservation.amount_microcents = amount
        reservation.save(update_fields=["amount_microcents"])
        return reservation


def _windows_unreserve(*, reservation: Reservation, charge: int) -> None:
    """Free the reservation's hold and charge `charge` in the windows it was made in (not
    today's, when a request reserved before midnight settles after it)."""
    held = reservation.amount_microcents if reservation.status == Reservation.Status.HELD else 0
    for window_id in (reservation.agent_window_id, reservation.tenant_window_id):
        if window_id is not None and (held or charge):
            BudgetWindow.objects.filter(pk=window_id).update(
                reserved_microcents=F("reserved_microcents") - held,
                spent_microcents=F("spent_microcents") + charge,
            )


def reservation_lock(*, tenant: Tenant, request_id: str) -> Reservation:
    reservation = (
        Reservation.objects.select_for_update().filter(tenant=tenant, request_id=request_id).first()
    )
    if reservation is None:
        raise NotFound(f"No reservation for request {request_id}.")
    return reservation


def budget_release(
    *,
    tenant: Tenant,
    request_id: str,
    now: datetime | None = None,
    status: str = Reservation.Status.RELEASED,
) -> Reservation:
    """Free a reservation without charging (the request never reached a backend).
    Idempotent; a settled reservation stays settled."""
    with transaction.atomic():
        reservation = reservation_lock(tenant=tenant, request_id=request_id)
        if reservation.status == Reservation.Status.HELD:
            _windows_unreserve(reservation=reservation, charge=0)
            reservation.status = status
            reservation.closed_at = now or timezone.now()
            reservation.save(update_fields=["status", "closed_at"])
    return reservation


def budget_reservations_renew(*, request_ids: list[str], now: datetime | None = None) -> int:
    """Keep the holds of requests still running (their owner calls this every third of
    FAIRLANE_RESERVATION_TTL_SECONDS); returns how many are still held. A system task over
    many tenants' requests, like the expiry below."""
    if not request_ids:
        return 0
    now = now or timezone.now()
    return Reservation.objects.filter(
        request_id__in=request_ids, status=Reservation.Status.HELD
    ).update(expires_at=now + timedelta(seconds=settings.FAIRLANE_RESERVATION_TTL_SECONDS))


def budget_reservations_expire(*, now: datetime | None = None) -> int:
    """Release reservations held past their TTL: nobody renewed them (their API process
    died). A late settlement still records the request, charging at most what its windows
    have room for (see settlement.py)."""
    now = now or timezone.now()
    stale = Reservation.objects.filter(status=Reservation.Status.HELD, expires_at__lt=now)
    count = 0
    for tenant_id, request_id in stale.values_list("tenant_id", "request_id"):
        reservation = budget_release(
            tenant=Tenant(pk=tenant_id),
            request_id=request_id,
            now=now,
            status=Reservation.Status.EXPIRED,
        )
        count += reservation.status == Reservation.Status.EXPIRED
    return count
