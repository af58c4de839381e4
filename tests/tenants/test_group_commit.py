"""Group commit (tenants/services/group_commit.py): concurrent holds and settlements share
statements and transactions on PostgreSQL, with the results they would have had one by one."""

import random
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Sum
from django.utils import timezone
from psycopg.types.json import Jsonb

from tenants.errors import BudgetExhausted, InvalidRequest
from tenants.models import BudgetWindow, Reservation, UsageRecord
from tenants.services import budget_sql
from tenants.services.budgets import budget_create, budget_reserve
from tenants.services.ledger import Usage, budget_settle
from tenants.services.tenancy import agent_create
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def rid() -> str:
    return uuid.uuid4().hex


def test_batched_holds_and_settlements_add_up_across_agents_and_tenants(tenant, other_tenant):
    """64 threads hold and settle for six agents of two tenants at once: calls share batches
    (so windows of both tenants lock in one transaction), nothing deadlocks, and every window
    ends with exactly what its ledger rows charged, within its limit."""
    assert connection.vendor == "postgresql"
    agents = [
        agent_create(tenant=t, name=f"a{i}") for t in (tenant, other_tenant) for i in range(3)
    ]
    for t in (tenant, other_tenant):
        budget_create(tenant=t, agent=None, limit_microcents=40_000)
    for agent in agents:
        budget_create(tenant=agent.tenant, agent=agent, limit_microcents=9_000)
    budget_sql._reservations.largest = budget_sql._settlements.largest = 0
    barrier = threading.Barrier(64)

    def worker(index: int) -> tuple[int, int]:
        rng, held, refused = random.Random(index), 0, 0
        try:
            barrier.wait(timeout=30)
            for n in range(12):
                agent = agents[(index + n) % len(agents)]
                request_id = rid()
                try:
                    budget_reserve(
                        tenant=agent.tenant,
                        agent=agent,
                        amount_microcents=300,
                        request_id=request_id,
                    )
                except BudgetExhausted:
                    refused += 1
                    continue
                held += 1
                budget_settle(
                    tenant=agent.tenant,
                    request_id=request_id,
                    cost_microcents=rng.randrange(0, 301),
                    usage=Usage(model="m", completion_tokens=1),
                )
        finally:
            connection.close()
        return held, refused

    with ThreadPoolExecutor(max_workers=64) as pool:
        outcomes = list(pool.map(worker, range(64)))
    held = sum(h for h, _ in outcomes)
    assert held + sum(r for _, r in outcomes) == 64 * 12
    assert (
        UsageRecord.objects.count()
        == held
        == Reservation.objects.filter(status=Reservation.Status.SETTLED).count()
    )
    for window in BudgetWindow.objects.select_related("budget"):
        budget = window.budget
        rows = UsageRecord.objects.filter(tenant=budget.tenant)
        if budget.agent_id is not None:
            rows = rows.filter(agent_id=budget.agent_id)
        assert window.reserved_microcents == 0
        assert window.spent_microcents == (rows.aggregate(s=Sum("cost_microcents"))["s"] or 0)
        assert window.spent_microcents <= budget.limit_microcents
    assert budget_sql._reservations.largest > 1 and budget_sql._settlements.largest > 1


def test_a_batch_holding_a_duplicate_request_id_fails_only_that_call(tenant, agent):
    """Three holds queued behind a busy leader run as one batch; the one reusing a request id
    is refused as it would be alone, the others hold."""
    budget = budget_create(tenant=tenant, agent=agent, limit_microcents=1_000)
    taken = rid()
    budget_reserve(tenant=tenant, agent=agent, amount_microcents=100, request_id=taken)
    holds = budget_sql._reservations
    with holds._lock:
        holds._running = True  # as if another thread led a batch now
    results: dict[str, object] = {}

    def hold(request_id: str) -> None:
        try:
            budget_reserve(tenant=tenant, agent=agent, amount_microcents=200, request_id=request_id)
            results[request_id] = "held"
        except InvalidRequest as exc:
            results[request_id] = exc
        finally:
            connection.close()

    fresh = [rid(), rid()]
    threads = [threading.Thread(target=hold, args=(r,)) for r in (fresh[0], taken, fresh[1])]
    for thread in threads:
        thread.start()
        wait_for(lambda t=thread: len(holds._pending) == threads.index(t) + 1, 10, "queued")
    holds.largest = 0
    holds._lead()  # this thread leads the three as one batch
    for thread in threads:
        thread.join(10)
    assert holds.largest == 3 and not holds._running
    assert results[fresh[0]] == results[fresh[1]] == "held"
    assert isinstance(results[taken], InvalidRequest) and results[taken].param == "request_id"
    assert BudgetWindow.objects.get(budget=budget).reserved_microcents == 500


def test_the_batch_functions_give_what_the_single_calls_give(tenant, agent):
    """fairlane_budget_hold_many: in order, each call sees the ones before it (the third
    does not fit the agent's window, the fifth not the model budget's extra window), a reused
    request id is 'duplicate'; nothing is held for any of them, on any window."""
    budget = budget_create(tenant=tenant, agent=agent, limit_microcents=500)
    big = budget_create(tenant=tenant, model_names=["big"], limit_microcents=455)
    window, extra = (
        BudgetWindow.objects.create(
            budget=b,
            start=timezone.now() - timedelta(hours=1),
            end=timezone.now() + timedelta(hours=1),
        )
        for b in (budget, big)
    )
    now, ids = timezone.now(), [rid(), rid(), rid(), rid()]
    params = [
        [uuid.uuid4() for _ in range(5)],
        [ids[0], ids[1], ids[2], ids[0], ids[3]],
        [tenant.pk] * 5,
        [agent.pk] * 5,
        [None] * 5,
        [200, 250, 100, 10, 10],
        [window.pk] * 5,
        [None] * 5,
        [Jsonb([extra.pk])] * 5,
        ["big"] * 5,
        [now] * 5,
        [now + timedelta(minutes=5)] * 5,
    ]
    with connection.cursor() as cursor:
        cursor.execute(budget_sql._reservations.many, params)
        assert [row[0] for row in cursor.fetchall()] == [
            "",
            "",
            "agent",
            "duplicate",
            f"window:{extra.pk}",
        ]
    window.refresh_from_db()
    extra.refresh_from_db()
    assert window.reserved_microcents == extra.reserved_microcents == 450
    assert set(Reservation.objects.values_list("request_id", flat=True)) == set(ids[:2])
    assert Reservation.objects.get(request_id=ids[0]).extra_windows == [extra.pk]


def test_the_batch_settlement_charges_in_order_within_every_window(tenant, agent):
    """fairlane_budget_settle_many on one batch: each charge sees the ones before it (the
    second is capped by the model budget's extra window), a request settled earlier in the
    batch answers 'settled', an unknown one 'missing'; every window is written once with the
    sum, and each row says its windows' spent after its own charge."""
    budget_create(tenant=tenant, agent=agent, limit_microcents=10_000)
    big = budget_create(tenant=tenant, model_names=["big"], limit_microcents=1_000)
    first, second = rid(), rid()
    for request_id in (first, second):
        budget_reserve(
            tenant=tenant,
            agent=agent,
            model="big",
            amount_microcents=400,
            request_id=request_id,
        )
    agent_window = BudgetWindow.objects.get(budget__agent=agent)
    extra = BudgetWindow.objects.get(budget=big)
    ids = [first, second, first, "nobody"]
    now = timezone.now()
    params = [
        ids,
        [tenant.pk] * 4,
        [600, 900, 600, 5],
        ["b"] * 4,
        ["big"] * 4,
        [1] * 4,
        [2] * 4,
        [0] * 4,
        [10] * 4,
        ["ok"] * 4,
        [now] * 4,
        [""] * 4,
        [""] * 4,
        [Jsonb({})] * 4,
    ]
    with connection.cursor() as cursor:
        cursor.execute(budget_sql._settlements.many, params)
        rows = cursor.fetchall()
    outcome = [(r[0], r[1], r[9], r[11], r[12]) for r in rows]
    # The first: 600 of its 400 hold (room: 1,000 - 800 held + 400). The second: what the
    # model's window has left, 1,000 - 600 = 400, of its 900 (the rest unbilled).
    assert outcome == [
        ("ok", 600, 600, [extra.pk], [600]),
        ("ok", 400, 1_000, [extra.pk], [1_000]),
        ("settled", None, None, None, None),
        ("missing", None, None, None, None),
    ]
    agent_window.refresh_from_db()
    extra.refresh_from_db()
    assert (agent_window.spent_microcents, agent_window.reserved_microcents) == (1_000, 0)
    assert (extra.spent_microcents, extra.reserved_microcents) == (1_000, 0)
    assert UsageRecord.objects.get(request_id=second).unbilled_microcents == 500
    assert rows[2][4] == UsageRecord.objects.get(request_id=first).pk


def _prepared_here() -> list[str]:
    """The statements prepared on this thread's connection (PostgreSQL's view of it)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


@pytest.mark.parametrize("prepare", [True, False])
def test_the_hold_and_the_settlement_are_prepared_on_the_connection(
    tenant, agent, settings, prepare
):
    """Django turns psycopg's prepared statements off; the two budget statements of every
    request are prepared on their connection at first use, unless FAIRLANE_DB_PREPARE is off
    (a pooler that cannot keep them), and answer the same either way."""
    settings.FAIRLANE_DB_PREPARE = prepare
    connection.close()  # a fresh connection: nothing prepared on it yet
    budget_create(tenant=tenant, agent=agent, limit_microcents=10_000)
    request_id = rid()
    budget_reserve(tenant=tenant, agent=agent, amount_microcents=700, request_id=request_id)
    record = budget_settle(
        tenant=tenant,
        request_id=request_id,
        cost_microcents=300,
        usage=Usage(backend="b", model="m", completion_tokens=3),
    )
    assert record.cost_microcents == 300
    prepared = _prepared_here()
    assert any("fairlane_budget_hold(" in s for s in prepared) is prepare
    assert any("fairlane_budget_settle(" in s for s in prepared) is prepare
