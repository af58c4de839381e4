"""Budget windows: where the current window of a period starts and ends in a tenant's zone,
and what a new window already counts from the ledger and the holds of its time."""

from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from django.db.models import Sum

from tenants.models import Reservation, UsageRecord


def _local_midnight(day: date, tz: ZoneInfo) -> datetime:
    return datetime.combine(day, time(0), tzinfo=tz).astimezone(UTC)


def window_bounds(*, period: str, tz_name: str, now: datetime) -> tuple[datetime, datetime]:
    """[start, end) in UTC of the window of `period` containing `now`, with boundaries at
    local midnight (daily), Monday midnight (weekly) or the 1st at midnight (monthly)."""
    tz = ZoneInfo(tz_name)
    today = now.astimezone(tz).date()
    if period == "daily":
        first, after = today, today + timedelta(days=1)
    elif period == "weekly":
        first = today - timedelta(days=today.weekday())
        after = first + timedelta(days=7)
    elif period == "monthly":
        first = today.replace(day=1)
        after = (first + timedelta(days=32)).replace(day=1)
    else:
        raise ValueError(f"unknown budget period {period!r}")
    return _local_midnight(first, tz), _local_midnight(after, tz)


def _owner_reservations(*, budget, start: datetime, end: datetime):
    """The requests a budget applies to (its agent's, its API key's, its member's keys', or the
    whole tenant's, for its models) reserved in [start, end). A member's are those made with
    the keys they created and still own (not handed to the agent when they left)."""
    reservations = Reservation.objects.filter(
        tenant_id=budget.tenant_id, created_at__gte=start, created_at__lt=end
    )
    if budget.agent_id:
        reservations = reservations.filter(agent_id=budget.agent_id)
    elif budget.api_key_id:
        reservations = reservations.filter(api_key_id=budget.api_key_id)
    elif budget.member_id:
        reservations = reservations.filter(
            api_key__created_by_id=budget.member.user_id, api_key__handed_over_at__isnull=True
        )
    if budget.model_names:
        reservations = reservations.filter(model__in=budget.model_names)
    return reservations


def window_usage_settled(*, budget, start: datetime, end: datetime):
    """The ledger rows of the owner's requests reserved in [start, end) and settled, whichever
    window they were charged to (a window of another time zone or period): a query."""
    settled = (
        _owner_reservations(budget=budget, start=start, end=end)
        .filter(status=Reservation.Status.SETTLED)
        .values("request_id")
    )
    return UsageRecord.objects.filter(tenant_id=budget.tenant_id, request_id__in=settled)


def window_spent_settled(*, budget, start: datetime, end: datetime) -> int:
    """What the ledger charged for the owner's requests reserved in [start, end)."""
    total = window_usage_settled(budget=budget, start=start, end=end).aggregate(
        total=Sum("cost_microcents")
    )["total"]
    return int(total or 0)


def window_reservations_open(*, budget, start: datetime, end: datetime):
    """The owner's holds of [start, end) still open (a query)."""
    return _owner_reservations(budget=budget, start=start, end=end).filter(
        status=Reservation.Status.HELD
    )
