"""Changing the tenant's time zone, a budget's period, or creating a budget mid-window never
resets what was spent: the new window starts with the ledger's charges and the open holds of
the time it covers (with time travel)."""

import uuid
from datetime import UTC, datetime

import pytest
import time_machine

from tenants.errors import BudgetExhausted
from tenants.models import BudgetWindow, Reservation
from tenants.selectors import budget_window_status
from tenants.services.budgets import (
    budget_create,
    budget_release,
    budget_reserve,
    budget_update,
)
from tenants.services.ledger import Usage, budget_settle
from tenants.services.tenancy import tenant_update

pytestmark = pytest.mark.django_db
NOON = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)  # a Tuesday


def rid() -> str:
    return uuid.uuid4().hex


def spend(tenant, agent, amount: int, *, hold: int | None = None) -> str:
    request_id = rid()
    budget_reserve(
        tenant=tenant, agent=agent, amount_microcents=hold or amount, request_id=request_id
    )
    if hold is None:
        budget_settle(tenant=tenant, request_id=request_id, cost_microcents=amount, usage=Usage())
    return request_id


def test_a_time_zone_change_keeps_the_days_spend(tenant, agent):
    budget = budget_create(tenant=tenant, agent=agent, limit_microcents=1000)  # Berlin
    with time_machine.travel(NOON, tick=False):
        spend(tenant, agent, 700)
        tenant_update(tenant=tenant, timezone="America/New_York")
        assert budget_window_status(budget=budget).spent_microcents == 700  # before first use
        with pytest.raises(BudgetExhausted):
            budget_reserve(tenant=tenant, agent=agent, amount_microcents=301, request_id=rid())
        spend(tenant, agent, 300)  # what is left, to the micro-cent
        window = budget_window_status(budget=budget)
    assert window.start == datetime(2026, 3, 10, 4, 0, tzinfo=UTC)  # New York's midnight
    assert (window.spent_microcents, window.reserved_microcents) == (1000, 0)


def test_a_period_change_keeps_the_spend_and_moves_the_open_holds(tenant, agent):
    budget = budget_create(tenant=tenant, agent=agent, limit_microcents=1000)
    with time_machine.travel(NOON, tick=False):
        spend(tenant, agent, 400)
        in_flight = spend(tenant, agent, 0, hold=350)
        budget_update(budget=budget, period="weekly")
        with pytest.raises(BudgetExhausted):
            budget_reserve(tenant=tenant, agent=agent, amount_microcents=251, request_id=rid())
        weekly = BudgetWindow.objects.get(
            budget=budget, start__lte=NOON, end__gt=NOON, end__gte=datetime(2026, 3, 15, tzinfo=UTC)
        )
        assert (weekly.spent_microcents, weekly.reserved_microcents) == (400, 350)
        assert Reservation.objects.get(request_id=in_flight).agent_window_id == weekly.pk
        budget_settle(tenant=tenant, request_id=in_flight, cost_microcents=200, usage=Usage())
    weekly.refresh_from_db()
    daily = BudgetWindow.objects.exclude(pk=weekly.pk).get(budget=budget)
    assert (weekly.spent_microcents, weekly.reserved_microcents) == (600, 0)
    assert daily.reserved_microcents == 0  # the hold moved out of the old window


def test_a_budget_created_mid_day_counts_the_days_spend(tenant, agent):
    with time_machine.travel(NOON, tick=False):
        budget_create(tenant=tenant, agent=None, limit_microcents=5_000)
        spend(tenant, agent, 900)
        budget = budget_create(tenant=tenant, agent=agent, limit_microcents=1000)
        with pytest.raises(BudgetExhausted):
            budget_reserve(tenant=tenant, agent=agent, amount_microcents=101, request_id=rid())
        assert budget_window_status(budget=budget).spent_microcents == 900
        budget_release(tenant=tenant, request_id=spend(tenant, agent, 0, hold=100))


def test_yesterdays_requests_do_not_count_in_today(tenant, agent):
    budget = budget_create(tenant=tenant, agent=agent, limit_microcents=1000)
    with time_machine.travel(datetime(2026, 3, 9, 12, 0, tzinfo=UTC), tick=False):
        spend(tenant, agent, 900)
    with time_machine.travel(NOON, tick=False):
        spend(tenant, agent, 1000)
        assert budget_window_status(budget=budget).spent_microcents == 1000
