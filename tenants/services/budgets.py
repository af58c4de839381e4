"""Budgets: reserve a request's worst-case cost before it is sent, settle its actual cost after.

The invariant: in every window, spent + reserved never exceeds the limit, however many API
processes reserve at once. Each hold is one conditional UPDATE
(`reserved = reserved + c WHERE spent + reserved + c <= limit`), which PostgreSQL re-checks on
the latest row version after waiting for the row lock, and which SQLite serialises with
IMMEDIATE transactions. A request is held on every budget that applies to it (its agent's, its
tenant's, its API key's, its member's, each for every model or for its model), all or none.
Windows are always locked in one order, the agent's, the tenant's, then the others by id
(`Reservation.window_ids`), so two requests never wait on each other in a circle; a
reservation row is always locked before the windows it holds on.

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
    Membership,
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


def model_names_clean(value) -> list[str]:
    if value is None:
        return []
    if (
        not isinstance(value, list)
        or len(value) > 50
        or not all(isinstance(m, str) and 0 < len(m) <= 200 and m.isprintable() for m in value)
    ):
        raise InvalidRequest(
            "models must be a list of up to 50 model names (1-200 printable characters).",
            param="models",
        )
    return sorted(set(value))


def budget_create(
    *,
    tenant: Tenant,
    agent: Agent | None = None,
    limit_microcents: int,
    period: str = Period.DAILY,
    api_key: ApiKey | None = None,
    member: Membership | None = None,
    model_names: list[str] | None = None,
    **soft,
) -> Budget:
    """A budget for one scope: `agent`, `api_key` or `member` (at most one; none: the whole
    tenant), for `model_names` only when given."""
    for param, owner in (("agent", agent), ("api_key", api_key), ("member", member)):
        if owner is not None and owner.tenant_id != tenant.id:
            raise InvalidRequest(f"{param} does not belong to this tenant.", param=param)
    if sum(owner is not None for owner in (agent, api_key, member)) > 1:
        raise InvalidRequest("A budget has one scope: agent, api_key or member.", param="scope")
    budget = Budget(
        tenant=tenant,
        agent=agent,
        api_key=api_key,
        member=member,
        model_names=model_names_clean(model_names),
        period=period,
        limit_microcents=amount_clean(limit_microcents, param="limit_microcents"),
    )
    # The conflict names the owner's field (the tenant's budget: "agent", as it is absent).
    owner_param = budget.scope if budget.scope != Budget.Scope.TENANT else "agent"
    if Budget.objects.filter(tenant=tenant, owner_key=budget.owner_key_of()).exists():
        raise Conflict(
            "This owner already has a budget for these models; change it instead.",
            param=owner_param,
        )
    for field, value in soft.items():
        if field not in SOFT_FIELDS:
            raise InvalidRequest(f"{field} is not a budget field.", param=field)
        setattr(budget, field, _soft_clean(field, value))
    with transaction.atomic():
        budget = save_validated(budget, unique_param=owner_param)
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
            slot = budget.slot
            theirs = (
                set(BudgetWindow.objects.filter(budget=budget).values_list("pk", flat=True))
                if slot == "extra" and moving
                else set()
            )
            for reservation in moving:
                if slot == "extra":
                    olds = [i for i in reservation.extra_windows if i in theirs]
                    reservation.extra_windows = sorted(
                        [i for i in reservation.extra_windows if i not in theirs] + [window.pk]
                    )
                    fields = ["extra_windows"]
                else:
                    old = getattr(reservation, f"{slot}_window_id")
                    olds = [old] if old is not None else []
                    setattr(reservation, f"{slot}_window", window)
                    fields = [f"{slot}_window"]
                BudgetWindow.objects.filter(pk__in=olds).update(
                    reserved_microcents=F("reserved_microcents") - reservation.amount_microcents
                )
                reservation.save(update_fields=fields)
            return window
    except IntegrityError:  # another request opened it first
        return BudgetWindow.objects.get(budget=budget, start=start)


def _window_reserve(*, window: BudgetWindow, budget: Budget, amount: int, now: datetime) -> None:
    held = BudgetWindow.objects.filter(
        pk=window.pk,
        reserved_microcents__lte=budget.limit_microcents - amount - F("spent_microcents"),
    ).update(reserved_microcents=F("reserved_microcents") + amount)
    if not held:
        raise _exhausted(budget=budget, window=window, now=now)


_budgets = hot_cache("budgets")  # (tenant, agent, key) -> the budgets of those owners
_windows = hot_cache("windows")  # (budget, start) -> BudgetWindow (only id and end are read)


def _slot_order(budget: Budget) -> int:
    return {"agent": 0, "tenant": 1}.get(budget.slot, 2)


def budgets_for_caller(
    *, tenant: Tenant, agent: Agent, api_key: ApiKey | None = None, model: str = ""
) -> list[Budget]:
    """Every budget a request of `agent` with `api_key` for `model` counts against: the
    tenant's, its agent's, its key's and its key's member's (the member who created the key
    and still owns it), each for every model or for a list holding `model`. The agent's and
    the tenant's for every model come first, in that order."""
    key_pk = api_key.pk if api_key is not None else None
    found = _budgets.get((tenant.pk, agent.pk, key_pk))
    if found is None:
        read_at = epoch()
        owners = Q(agent__isnull=True, api_key__isnull=True, member__isnull=True) | Q(agent=agent)
        if api_key is not None:
            owners |= Q(api_key=api_key)
            if api_key.created_by_id is not None and api_key.handed_over_at is None:
                owners |= Q(member__user_id=api_key.created_by_id)
        found = sorted(
            Budget.objects.select_related("tenant", "agent", "api_key", "member__user").filter(
                owners, tenant=tenant
            ),
            key=lambda b: (_slot_order(b), str(b.pk)),
        )
        _budgets.put((tenant.pk, agent.pk, key_pk), found, read_at)
    return [b for b in found if b.applies_to(model=model)]


def budget_window_cached(*, budget: Budget, now: datetime) -> BudgetWindow:
    """The current window's row as cached (its counters are not: holds read them in SQL)."""
    start, _ = window_bounds(period=budget.period, tz_name=budget.tenant.timezone, now=now)
    window = _windows.get((budget.pk, start))
    if window is None:
        read_at = epoch()
        window = budget_window_current(budget=budget, now=now)
        _windows.put((budget.pk, start), window, read_at)
    return window


def _exhausted(*, budget: Budget, window: BudgetWindow, now: datetime) -> BudgetExhausted:
    exc = BudgetExhausted(
        f"The {budget.possessive} cannot cover this request's worst-case cost; "
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
    model: str = "",
    now: datetime | None = None,
) -> Reservation:
    """Hold a request's worst-case cost against the current window of every budget that
    applies to it (`budgets_for_caller`), all or none. Raises BudgetExhausted (with
    Retry-After until the refusing window resets)."""
    if agent.tenant_id != tenant.id:
        raise InvalidRequest("agent does not belong to this tenant.", param="agent")
    amount = amount_clean(amount_microcents, param="amount_microcents")
    now = now or timezone.now()
    applying = budgets_for_caller(tenant=tenant, agent=agent, api_key=api_key, model=model)
    windows = {b.pk: budget_window_cached(budget=b, now=now) for b in applying}
    slots = {b.slot: windows[b.pk] for b in applying if b.slot != "extra"}
    by_window = {windows[b.pk].pk: b for b in applying}
    expires = now + timedelta(seconds=settings.FAIRLANE_RESERVATION_TTL_SECONDS)
    reservation = Reservation(
        request_id=request_id,
        tenant=tenant,
        agent=agent,
        api_key=api_key,
        model=model,
        amount_microcents=amount,
        created_at=now,
        expires_at=expires,
        agent_window=slots.get("agent"),
        tenant_window=slots.get("tenant"),
        extra_windows=sorted(windows[b.pk].pk for b in applying if b.slot == "extra"),
    )
    try:
        if budget_sql.enabled():
            refused = budget_sql.reserve(reservation)
            if refused:
                kind, _, extra_id = refused.partition(":")
                found = by_window.get(slots[kind].pk if kind in slots else int(extra_id or 0))
                if found is None:  # the function refuses only for a window it was given
                    raise RuntimeError(f"the budget function refused an absent window {refused}")
                raise _exhausted(budget=found, window=windows[found.pk], now=now)
            return reservation
        with transaction.atomic():
            for window_id in reservation.window_ids():
                budget = by_window[window_id]
                _window_reserve(window=windows[budget.pk], budget=budget, amount=amount, now=now)
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
        for window_id in reservation.window_ids():
            if delta == 0:
                break
            query = BudgetWindow.objects.filter(pk=window_id)
            if delta > 0:  # a constant limit, so PostgreSQL re-checks the row as it locks it
                limit = (
                    BudgetWindow.objects.filter(pk=window_id)
                    .values_list("budget__limit_microcents", flat=True)
                    .get()
                )
                query = query.filter(reserved_microcents__lte=limit - delta - F("spent_microcents"))
            if not query.update(reserved_microcents=F("reserved_microcents") + delta):
                window = BudgetWindow.objects.select_related(
                    "budget__agent", "budget__api_key", "budget__member__user"
                ).get(pk=window_id)
                raise _exhausted(budget=window.budget, window=window, now=now)
        reservation.amount_microcents = amount
        reservation.save(update_fields=["amount_microcents"])
        return reservation


def _windows_unreserve(*, reservation: Reservation, charge: int) -> None:
    """Free the reservation's hold and charge `charge` in the windows it was made in (not
    today's, when a request reserved before midnight settles after it)."""
    held = reservation.amount_microcents if reservation.status == Reservation.Status.HELD else 0
    for window_id in reservation.window_ids():
        if held or charge:
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
