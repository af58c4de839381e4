"""Window boundaries in the tenant's zone: days, Monday weeks, calendar months, DST."""

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from tenants.windows import window_bounds

NY = ZoneInfo("America/New_York")


@pytest.mark.parametrize(
    "period,now,start,end",
    [
        (
            "daily",
            datetime(2026, 5, 10, 3, 59, tzinfo=UTC),  # 23:59 on the 9th in New York
            datetime(2026, 5, 9, tzinfo=NY),
            datetime(2026, 5, 10, tzinfo=NY),
        ),
        (
            "daily",
            datetime(2026, 5, 10, 4, 0, tzinfo=UTC),
            datetime(2026, 5, 10, tzinfo=NY),
            datetime(2026, 5, 11, tzinfo=NY),
        ),
        (
            "weekly",
            datetime(2026, 5, 10, 12, 0, tzinfo=UTC),  # a Sunday
            datetime(2026, 5, 4, tzinfo=NY),
            datetime(2026, 5, 11, tzinfo=NY),
        ),
        (
            "monthly",
            datetime(2026, 12, 31, 12, 0, tzinfo=UTC),
            datetime(2026, 12, 1, tzinfo=NY),
            datetime(2027, 1, 1, tzinfo=NY),
        ),
        (
            "monthly",
            datetime(2026, 3, 1, 4, 59, tzinfo=UTC),  # still February in New York
            datetime(2026, 2, 1, tzinfo=NY),
            datetime(2026, 3, 1, tzinfo=NY),
        ),
    ],
)
def test_window_bounds(period, now, start, end):
    assert window_bounds(period=period, tz_name="America/New_York", now=now) == (start, end)


def test_the_day_clocks_spring_forward_is_23_hours_long():
    start, end = window_bounds(
        period="daily", tz_name="America/New_York", now=datetime(2026, 3, 8, 12, tzinfo=UTC)
    )
    assert (end - start).total_seconds() == 23 * 3600


def test_unknown_period_is_refused():
    with pytest.raises(ValueError):
        window_bounds(period="hourly", tz_name="UTC", now=datetime.now(UTC))
