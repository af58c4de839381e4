"""A hold lives as long as its request (renewed by its owner), and no settlement charges past
a limit: one whose hold was released meanwhile charges at most the room left and records the
rest as unbilled, with a warning and a metric."""

import logging
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import REGISTRY

from tenants.errors import BudgetExhausted
from tenants.models import Reservation, UsageRecord
from tenants.selectors import budget_window_status
from tenants.services.budgets import (
    budget_create,
    budget_reservations_expire,
    budget_reservations_renew,
    budget_reserve,
)
from tenants.services.ledger import Usage, budget_settle

pytestmark = pytest.mark.django_db


def rid() -> str:
    return uuid.uuid4().hex


def test_a_renewed_hold_outlives_its_ttl_and_keeps_its_room(tenant, agent, settings):
    settings.FAIRLANE_RESERVATION_TTL_SECONDS = 60
    budget = budget_create(tenant=tenant, agent=agent, limit_microcents=1000)
    request_id, now = rid(), datetime.now(UTC)
    budget_reserve(
        tenant=tenant, agent=agent, amount_microcents=800, request_id=request_id, now=now
    )
    for minute in range(1, 6):  # a stream five times longer than the TTL, renewed as it runs
        at = now + timedelta(seconds=60 * minute - 10)
        assert budget_reservations_renew(request_ids=[request_id, "gone"], now=at) == 1
        assert budget_reservations_expire(now=at + timedelta(seconds=30)) == 0
    with pytest.raises(BudgetExhausted):  # the room is still held
        budget_reserve(tenant=tenant, agent=agent, amount_microcents=300, request_id=rid())
    assert budget_window_status(budget=budget).reserved_microcents == 800


def test_a_late_settlement_charges_only_the_room_left_and_records_the_rest(
    tenant, agent, settings, caplog
):
    settings.FAIRLANE_RESERVATION_TTL_SECONDS = 60
    budget = budget_create(tenant=tenant, agent=agent, limit_microcents=1000)
    late, now = rid(), datetime.now(UTC)
    budget_reserve(tenant=tenant, agent=agent, amount_microcents=800, request_id=late, now=now)
    assert budget_reservations_expire(now=now + timedelta(seconds=61)) == 1  # nobody renewed
    other = rid()
    budget_reserve(tenant=tenant, agent=agent, amount_microcents=900, request_id=other)
    before = REGISTRY.get_sample_value("fairlane_budget_unbilled_microcents_total") or 0

    with caplog.at_level(logging.WARNING, logger="tenants.services.ledger"):
        record = budget_settle(
            tenant=tenant,
            request_id=late,
            cost_microcents=800,
            usage=Usage(model="m", completion_tokens=8),
        )

    assert (record.cost_microcents, record.unbilled_microcents) == (100, 700)
    window = budget_window_status(budget=budget)
    assert (window.spent_microcents, window.reserved_microcents) == (100, 900)
    assert window.spent_microcents + window.reserved_microcents <= window.limit_microcents
    assert any("left unbilled" in r.getMessage() for r in caplog.records)
    assert REGISTRY.get_sample_value("fairlane_budget_unbilled_microcents_total") == before + 700
    budget_settle(tenant=tenant, request_id=other, cost_microcents=900, usage=Usage())
    assert budget_window_status(budget=budget).spent_microcents == 1000  # to the micro-cent


def test_a_cost_above_its_hold_is_capped_by_the_tenants_limit_too(tenant, agent):
    budget_create(tenant=tenant, agent=None, limit_microcents=500)
    request_id = rid()
    budget_reserve(tenant=tenant, agent=agent, amount_microcents=400, request_id=request_id)
    record = budget_settle(tenant=tenant, request_id=request_id, cost_microcents=650, usage=Usage())
    assert (record.cost_microcents, record.unbilled_microcents) == (500, 150)
    assert Reservation.objects.get(request_id=request_id).status == Reservation.Status.SETTLED
    assert UsageRecord.objects.count() == 1
