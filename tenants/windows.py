"""Budget windows: where the current window of a period starts and ends in a tenant's zone."""

from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo


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
