"""Reservation and settlement: atomic under concurrency, charged once, windows that reset at the
tenant's midnight."""

import subprocess
import sys
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
import time_machine
from django.db import connection

from tenants.errors import BudgetExhausted, InvalidRequest, NotFound
from tenants.models import BudgetWindow, Reservation, UsageRecord
from tenants.selectors import budget_window_status
from tenants.services.budgets import (
    budget_create,
    budget_release,
    budget_reservations_expire,
    budget_reserve,
)
from tenants.services.ledger import Usage, budget_settle
from tenants.services.tenancy import agent_create

BERLIN = ZoneInfo("Europe/Berlin")


def rid() -> str:
    return uuid.uuid4().hex


def window_of(budget):
    """The budget's current window as the database has it (empty if never used)."""
    return budget_window_status(budget=budget)


def test_reserve_holds_worst_case_and_settle_charges_actual_and_frees_the_rest(tenant, agent):
    budget = budget_create(tenant=tenant, agent=agent, limit_microcents=1000)
    request_id = rid()
    budget_reserve(tenant=tenant, agent=agent, amount_microcents=600, request_id=request_id)
    assert (window_of(budget).reserved_microcents, window_of(budget).spent_microcents) == (600, 0)

    record = budget_settle(
        tenant=tenant,
        request_id=request_id,
        cost_microcents=250,
        usage=Usage(model="m", prompt_tokens=10, completion_tokens=5),
    )

    window = window_of(budget)
    assert (window.reserved_microcents, window.spent_microcents) == (0, 250)
    assert (record.cost_microcents, record.prompt_tokens, record.completion_tokens) == (250, 10, 5)
    assert record.agent_id == agent.pk and record.tenant_id == tenant.pk


def test_budget_reserve_refuses_when_window_spent(tenant, agent):
    budget_create(tenant=tenant, agent=agent, limit_microcents=1000)
    budget_reserve(tenant=tenant, agent=agent, amount_microcents=700, request_id=rid())
    with pytest.raises(BudgetExhausted) as exc_info:
        budget_reserve(tenant=tenant, agent=agent, amount_microcents=301, request_id=rid())
    assert exc_info.value.status == 429 and exc_info.value.retry_after > 0
    # What is left can still be reserved, to the micro-cent.
    budget_reserve(tenant=tenant, agent=agent, amount_microcents=300, request_id=rid())


def test_tenant_budget_refusal_leaves_agent_window_untouched(tenant, agent):
    agent_budget = budget_create(tenant=tenant, agent=agent, limit_microcents=10_000)
    budget_create(tenant=tenant, agent=None, limit_microcents=500)
    with pytest.raises(BudgetExhausted, match="tenant"):
        budget_reserve(tenant=tenant, agent=agent, amount_microcents=600, request_id=rid())
    assert window_of(agent_budget).reserved_microcents == 0
    assert not Reservation.objects.exists()


def test_settle_is_idempotent_one_ledger_row_charged_once(tenant, agent):
    budget = budget_create(tenant=tenant, agent=agent, limit_microcents=1000)
    request_id = rid()
    budget_reserve(tenant=tenant, agent=agent, amount_microcents=400, request_id=request_id)
    first = budget_settle(tenant=tenant, request_id=request_id, cost_microcents=300, usage=Usage())
    again = budget_settle(tenant=tenant, request_id=request_id, cost_microcents=300, usage=Usage())
    assert first.pk == again.pk
    assert UsageRecord.objects.filter(request_id=request_id).count() == 1
    assert window_of(budget).spent_microcents == 300


def test_release_frees_everything_and_records_nothing(tenant, agent):
    budget = budget_create(tenant=tenant, agent=agent, limit_microcents=1000)
    request_id = rid()
    budget_reserve(tenant=tenant, agent=agent, amount_microcents=1000, request_id=request_id)
    budget_release(tenant=tenant, request_id=request_id)
    assert (window_of(budget).reserved_microcents, window_of(budget).spent_microcents) == (0, 0)
    assert not UsageRecord.objects.exists()
    budget_reserve(tenant=tenant, agent=agent, amount_microcents=1000, request_id=rid())


def test_duplicate_request_id_is_refused_and_holds_nothing_more(tenant, agent):
    budget = budget_create(tenant=tenant, agent=agent, limit_microcents=1000)
    request_id = rid()
    budget_reserve(tenant=tenant, agent=agent, amount_microcents=100, request_id=request_id)
    with pytest.raises(InvalidRequest):
        budget_reserve(tenant=tenant, agent=agent, amount_microcents=100, request_id=request_id)
    assert window_of(budget).reserved_microcents == 100


@pytest.mark.parametrize("amount", [-1, 10**20, 1.5, "100", True, None])
def test_reserve_rejects_bad_amounts(tenant, agent, amount):
    with pytest.raises(InvalidRequest):
        budget_reserve(tenant=tenant, agent=agent, amount_microcents=amount, request_id=rid())
    assert not Reservation.objects.exists()


def test_settle_of_another_tenants_request_is_not_found(tenant, agent, other_tenant):
    request_id = rid()
    budget_reserve(tenant=tenant, agent=agent, amount_microcents=100, request_id=request_id)
    with pytest.raises(NotFound):
        budget_settle(tenant=other_tenant, request_id=request_id, cost_microcents=1, usage=Usage())
    assert Reservation.objects.get(request_id=request_id).status == Reservation.Status.HELD


def test_reserve_refuses_an_agent_of_another_tenant(tenant, other_agent):
    with pytest.raises(InvalidRequest):
        budget_reserve(tenant=tenant, agent=other_agent, amount_microcents=1, request_id=rid())


def test_stale_reservations_expire_and_a_late_settlement_still_charges(tenant, agent, settings):
    settings.FAIRLANE_RESERVATION_TTL_SECONDS = 60
    budget = budget_create(tenant=tenant, agent=agent, limit_microcents=1000)
    request_id = rid()
    now = datetime.now(UTC)
    budget_reserve(
        tenant=tenant, agent=agent, amount_microcents=800, request_id=request_id, now=now
    )
    assert budget_reservations_expire(now=now + timedelta(seconds=30)) == 0
    assert budget_reservations_expire(now=now + timedelta(seconds=61)) == 1
    assert window_of(budget).reserved_microcents == 0

    budget_settle(tenant=tenant, request_id=request_id, cost_microcents=120, usage=Usage())
    window = window_of(budget)
    assert (window.reserved_microcents, window.spent_microcents) == (0, 120)


# --- windows ---------------------------------------------------------------------------------


def test_daily_window_resets_at_the_tenants_midnight(tenant, agent):
    """Acme is in Europe/Berlin: its day ends at 23:00 UTC in winter."""
    budget_create(tenant=tenant, agent=agent, limit_microcents=1000)
    with time_machine.travel(datetime(2026, 1, 15, 22, 58, tzinfo=UTC), tick=False):
        budget_reserve(tenant=tenant, agent=agent, amount_microcents=1000, request_id=rid())
        with pytest.raises(BudgetExhausted) as exc_info:
            budget_reserve(tenant=tenant, agent=agent, amount_microcents=1, request_id=rid())
        assert exc_info.value.retry_after == 121  # until 23:00 UTC, rounded up
    with time_machine.travel(datetime(2026, 1, 15, 23, 0, 1, tzinfo=UTC), tick=False):
        budget_reserve(tenant=tenant, agent=agent, amount_microcents=1000, request_id=rid())
        with pytest.raises(BudgetExhausted):
            budget_reserve(tenant=tenant, agent=agent, amount_microcents=1, request_id=rid())


def test_reservation_before_midnight_settled_after_is_charged_to_its_own_window(tenant, agent):
    budget = budget_create(tenant=tenant, agent=agent, limit_microcents=1000)
    request_id = rid()
    before = datetime(2026, 7, 1, 23, 50, tzinfo=BERLIN)
    after = datetime(2026, 7, 2, 0, 10, tzinfo=BERLIN)
    with time_machine.travel(before, tick=False):
        budget_reserve(tenant=tenant, agent=agent, amount_microcents=900, request_id=request_id)
    with time_machine.travel(after, tick=False):
        # The new day starts empty: the old day's hold does not shrink it.
        budget_reserve(tenant=tenant, agent=agent, amount_microcents=1000, request_id=rid())
        budget_settle(tenant=tenant, request_id=request_id, cost_microcents=700, usage=Usage())
        today = window_of(budget)
    yesterday = BudgetWindow.objects.get(budget=budget, start=datetime(2026, 7, 1, tzinfo=BERLIN))
    assert (yesterday.spent_microcents, yesterday.reserved_microcents) == (700, 0)
    assert (today.spent_microcents, today.reserved_microcents) == (0, 1000)
    assert today.start == datetime(2026, 7, 2, tzinfo=BERLIN)


@pytest.mark.django_db(transaction=True)
def test_window_state_survives_a_restart_because_it_lives_in_the_database(
    tenant, agent, subprocess_env
):
    budget_create(tenant=tenant, agent=agent, limit_microcents=1000)
    budget_reserve(tenant=tenant, agent=agent, amount_microcents=999, request_id=rid())
    # A fresh process (as after a restart) sees the spent window and refuses.
    script = (
        "import django; django.setup()\n"
        "from tenants.models import Agent\n"
        "from tenants.errors import BudgetExhausted\n"
        "from tenants.services.budgets import budget_reserve\n"
        f"agent = Agent.objects.select_related('tenant').get(pk='{agent.pk}')\n"
        "budget_reserve(tenant=agent.tenant, agent=agent, amount_microcents=1, request_id='p1')\n"
        "try:\n"
        "    budget_reserve(tenant=agent.tenant, agent=agent, amount_microcents=1,"
        " request_id='p2')\n"
        "except BudgetExhausted:\n"
        "    print('refused')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "refused"
    assert Reservation.objects.filter(request_id="p1").exists()


# --- concurrency on PostgreSQL ---------------------------------------------------------------


def _reserve_concurrently(*, tenant, agents, cost: int, attempts: int, threads: int) -> int:
    barrier = threading.Barrier(threads)
    per_thread = attempts // threads

    def worker(index: int) -> int:
        won = 0
        try:
            barrier.wait(timeout=30)
            for n in range(per_thread):
                try:
                    budget_reserve(
                        tenant=tenant,
                        agent=agents[(index + n) % len(agents)],
                        amount_microcents=cost,
                        request_id=rid(),
                    )
                    won += 1
                except BudgetExhausted:
                    pass
        finally:
            connection.close()  # each thread had its own connection
        return won

    with ThreadPoolExecutor(max_workers=threads) as pool:
        return sum(pool.map(worker, range(threads)))


@pytest.mark.django_db(transaction=True)
def test_concurrent_reservations_never_overspend_an_agent_budget(tenant, agent):
    assert connection.vendor == "postgresql"
    limit, cost = 10_007, 97
    budget = budget_create(tenant=tenant, agent=agent, limit_microcents=limit)
    won = _reserve_concurrently(tenant=tenant, agents=[agent], cost=cost, attempts=256, threads=64)
    assert won == limit // cost == 103
    assert window_of(budget).reserved_microcents == won * cost <= limit
    assert Reservation.objects.filter(tenant=tenant).count() == won


@pytest.mark.django_db(transaction=True)
def test_concurrent_reservations_never_overspend_a_tenant_budget(tenant):
    assert connection.vendor == "postgresql"
    agents = [agent_create(tenant=tenant, name=f"a{i}") for i in range(8)]
    limit, cost = 5_000, 73
    budget = budget_create(tenant=tenant, agent=None, limit_microcents=limit)
    won = _reserve_concurrently(tenant=tenant, agents=agents, cost=cost, attempts=256, threads=64)
    assert won == limit // cost == 68
    assert window_of(budget).reserved_microcents == won * cost <= limit
