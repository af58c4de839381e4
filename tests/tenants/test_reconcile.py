"""Reconciliation: budget windows recomputed from the ledger and the open holds; differences
reported with their rows, corrected (and audited) only when asked; the command and the nightly
task, on PostgreSQL."""

import json
import logging
import subprocess
import sys
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from io import StringIO

import pytest
import time_machine
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from tenants import tasks
from tenants.models import AuditRecord, BudgetWindow, Reservation, UsageRecord
from tenants.services.budget_reconcile import budget_windows_reconcile
from tenants.services.budgets import (
    budget_create,
    budget_release,
    budget_reserve,
    budget_update,
)
from tenants.services.ledger import Usage, budget_settle

import celery_app

pytestmark = pytest.mark.django_db


def rid() -> str:
    return uuid.uuid4().hex


def traffic(tenant, agent) -> dict:
    """Real requests on an agent's and the tenant's budgets: two settled, one released, one
    still held. Returns the rows the windows should count."""
    agent_budget = budget_create(tenant=tenant, agent=agent, limit_microcents=10_000)
    tenant_budget = budget_create(tenant=tenant, agent=None, limit_microcents=50_000)
    usage_ids = []
    for hold, cost in ((1000, 400), (2000, 1500)):
        request_id = rid()
        budget_reserve(tenant=tenant, agent=agent, amount_microcents=hold, request_id=request_id)
        row = budget_settle(
            tenant=tenant, request_id=request_id, cost_microcents=cost, usage=Usage(model="m")
        )
        usage_ids.append(row.pk)
    released = rid()
    budget_reserve(tenant=tenant, agent=agent, amount_microcents=700, request_id=released)
    budget_release(tenant=tenant, request_id=released)
    held = budget_reserve(tenant=tenant, agent=agent, amount_microcents=900, request_id=rid())
    return {
        "agent_window": BudgetWindow.objects.get(budget=agent_budget),
        "tenant_window": BudgetWindow.objects.get(budget=tenant_budget),
        "usage_ids": sorted(usage_ids),
        "held": held,
    }


def counters(window: BudgetWindow) -> tuple[int, int]:
    window.refresh_from_db()
    return window.spent_microcents, window.reserved_microcents


def plant(window: BudgetWindow, **values) -> None:
    """A drifted counter, as a bug or a hand edit would leave it."""
    BudgetWindow.objects.filter(pk=window.pk).update(**values)


def reconcile_audits():
    return AuditRecord.objects.filter(action="budget_window.reconcile")


def test_windows_of_real_requests_reconcile_to_no_difference(tenant, agent):
    rows = traffic(tenant, agent)
    assert counters(rows["agent_window"]) == (1900, 900)  # the traffic really did count

    report = budget_windows_reconcile()

    assert report.windows_checked == 2
    assert report.differences == []


def test_a_planted_difference_is_reported_with_its_rows_and_left_alone(tenant, agent):
    rows = traffic(tenant, agent)
    plant(rows["agent_window"], spent_microcents=5000, reserved_microcents=0)

    report = budget_windows_reconcile()

    assert [d.window_id for d in report.differences] == [rows["agent_window"].pk]
    found = report.differences[0]
    assert (found.spent_stored, found.spent_recomputed) == (5000, 1900)
    assert (found.reserved_stored, found.reserved_recomputed) == (0, 900)
    assert list(found.usage_ids) == rows["usage_ids"]
    assert found.reservation_ids == (rows["held"].pk,)
    assert (found.tenant, found.owner, found.fixed) == (tenant.slug, agent.name, False)
    assert counters(rows["agent_window"]) == (5000, 0)
    assert not reconcile_audits().exists()


def test_fix_corrects_the_window_and_audits_it(tenant, agent):
    rows = traffic(tenant, agent)
    plant(rows["tenant_window"], spent_microcents=17, reserved_microcents=123_456)

    report = budget_windows_reconcile(fix=True)

    assert [(d.window_id, d.fixed) for d in report.differences] == [
        (rows["tenant_window"].pk, True)
    ]
    assert counters(rows["tenant_window"]) == (1900, 900)
    (record,) = reconcile_audits()
    assert record.tenant_id == tenant.pk and record.object_id == str(rows["tenant_window"].pk)
    assert record.before == {"spent_microcents": 17, "reserved_microcents": 123_456}
    assert record.after == {"spent_microcents": 1900, "reserved_microcents": 900}
    assert budget_windows_reconcile().differences == []
    # Holds pass the tenant's window again (its planted 123,456 held refused any), up to what
    # the agent's window leaves (10,000 - 1,900 - 900).
    budget_reserve(tenant=tenant, agent=agent, amount_microcents=7200, request_id=rid())


def test_a_ledger_row_changed_behind_the_windows_is_found(tenant, agent):
    rows = traffic(tenant, agent)
    UsageRecord.objects.filter(pk=rows["usage_ids"][0]).update(cost_microcents=401)

    report = budget_windows_reconcile()

    assert sorted(d.window_id for d in report.differences) == sorted(
        [rows["agent_window"].pk, rows["tenant_window"].pk]
    )
    assert {(d.spent_stored, d.spent_recomputed) for d in report.differences} == {(1900, 1901)}


def test_a_hold_closed_behind_the_windows_is_found(tenant, agent):
    rows = traffic(tenant, agent)
    Reservation.objects.filter(pk=rows["held"].pk).update(status=Reservation.Status.RELEASED)

    report = budget_windows_reconcile(tenant=tenant)

    assert {(d.reserved_stored, d.reserved_recomputed) for d in report.differences} == {(900, 0)}
    assert all(d.reservation_ids == () for d in report.differences)


def test_tenant_scope_checks_and_fixes_only_that_tenant(tenant, agent, other_tenant, other_agent):
    ours, theirs = traffic(tenant, agent), traffic(other_tenant, other_agent)
    plant(ours["agent_window"], spent_microcents=1)
    plant(theirs["agent_window"], spent_microcents=2)

    out = StringIO()
    call_command("budgets_reconcile", "--tenant", tenant.slug, "--fix", stdout=out)

    assert counters(ours["agent_window"])[0] == 1900
    assert counters(theirs["agent_window"])[0] == 2  # the other tenant's is untouched
    assert "checked 2 windows: 1 differ, 1 corrected" in out.getvalue()
    assert f"window {theirs['agent_window'].pk} " not in out.getvalue()
    assert {r.tenant_id for r in reconcile_audits()} == {tenant.pk}
    remaining = budget_windows_reconcile()
    assert [d.window_id for d in remaining.differences] == [theirs["agent_window"].pk]


def test_command_exits_1_when_differences_are_left_and_0_once_fixed(tenant, agent, subprocess_env):
    rows = traffic(tenant, agent)
    plant(rows["agent_window"], reserved_microcents=0)

    def manage(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(settings.BASE_DIR / "manage.py"), "budgets_reconcile", *args],
            env=subprocess_env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    left = manage()
    assert left.returncode == 1, left.stderr
    assert "1 windows differ" in left.stderr
    assert counters(rows["agent_window"]) == (1900, 0)

    fixed = manage("--fix")
    assert fixed.returncode == 0, fixed.stderr
    assert "(corrected)" in fixed.stdout and counters(rows["agent_window"]) == (1900, 900)
    (record,) = reconcile_audits()
    assert record.actor_id == "budgets_reconcile"  # the command is the audited actor
    assert manage().returncode == 0


def test_command_json_reports_each_difference_with_its_rows(tenant, agent):
    rows = traffic(tenant, agent)
    plant(rows["agent_window"], spent_microcents=0)
    out = StringIO()

    with pytest.raises(CommandError) as failed:
        call_command("budgets_reconcile", "--json", "--tenant", tenant.slug, stdout=out)

    assert failed.value.returncode == 1
    body = json.loads(out.getvalue())
    assert body["windows_checked"] == 2
    (difference,) = body["differences"]
    assert difference["window_id"] == rows["agent_window"].pk
    assert difference["spent"] == {"stored": 0, "recomputed": 1900}
    assert difference["reserved"] == {"stored": 900, "recomputed": 900}
    assert difference["usage_ids"] == rows["usage_ids"]
    assert difference["reservation_ids"] == [str(rows["held"].pk)]
    assert (difference["tenant"], difference["owner"], difference["fixed"]) == (
        tenant.slug,
        agent.name,
        False,
    )


def test_command_refuses_an_unknown_tenant(tenant, agent):
    rows = traffic(tenant, agent)
    plant(rows["agent_window"], spent_microcents=0)
    with pytest.raises(CommandError, match="no tenant") as failed:
        call_command("budgets_reconcile", "--tenant", "nobody", "--fix", stdout=StringIO())
    assert failed.value.returncode == 2
    assert counters(rows["agent_window"])[0] == 0


def test_nightly_task_logs_differences_and_fixes_nothing(tenant, agent, caplog):
    rows = traffic(tenant, agent)
    plant(rows["agent_window"], spent_microcents=3)

    with caplog.at_level(logging.WARNING, logger="tenants.tasks"):
        result = tasks.budget_windows_reconcile()

    assert result == {"checked": 2, "differences": 1}
    (logged,) = [r for r in caplog.records if "budget reconciliation" in r.getMessage()]
    assert f'"window_id": {rows["agent_window"].pk}' in logged.getMessage()
    assert counters(rows["agent_window"])[0] == 3
    assert not reconcile_audits().exists()
    entry = settings.CELERY_BEAT_SCHEDULE["budget-windows-reconcile"]
    assert entry["task"] == tasks.budget_windows_reconcile.name
    assert entry["task"] in celery_app.app.tasks


def test_windows_overlapping_after_a_period_change_check_holds_but_not_spent(tenant, agent):
    """The daily window and the weekly one that replaced it share a day: a request of that day
    settled in the weekly window is in both windows' time, so the ledger cannot say which
    spent it; their holds still say exactly where they are."""
    budget = budget_create(tenant=tenant, agent=agent, limit_microcents=1000)
    with time_machine.travel(datetime(2026, 3, 10, 12, 0, tzinfo=UTC), tick=False):
        first = rid()
        budget_reserve(tenant=tenant, agent=agent, amount_microcents=400, request_id=first)
        budget_settle(tenant=tenant, request_id=first, cost_microcents=400, usage=Usage())
        in_flight = rid()
        budget_reserve(tenant=tenant, agent=agent, amount_microcents=350, request_id=in_flight)
        budget_update(budget=budget, period="weekly")
        budget_reserve(tenant=tenant, agent=agent, amount_microcents=1, request_id=rid())
        budget_settle(tenant=tenant, request_id=in_flight, cost_microcents=200, usage=Usage())
    daily, weekly = BudgetWindow.objects.filter(budget=budget).order_by("end")
    assert (counters(daily), counters(weekly)) == ((400, 0), (600, 1))

    assert budget_windows_reconcile().differences == []

    plant(daily, reserved_microcents=5)
    (found,) = budget_windows_reconcile(fix=True).differences
    assert (found.window_id, found.spent_recomputed, found.reserved_recomputed) == (
        daily.pk,
        None,
        0,
    )
    assert counters(daily) == (400, 0)  # the holds corrected, the spent left as it was


@pytest.mark.django_db(transaction=True)
def test_requests_racing_the_check_show_no_difference(tenant, agent):
    """Holds, settlements and releases commit while the check runs: each window is read under
    its lock, so its counters and its rows always agree."""
    budget_create(tenant=tenant, agent=agent, limit_microcents=10**9)
    budget_create(tenant=tenant, agent=None, limit_microcents=10**9)
    threads, per_thread = 4, 25
    barrier = threading.Barrier(threads + 1)

    def requests(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            for n in range(per_thread):
                request_id = rid()
                budget_reserve(
                    tenant=tenant, agent=agent, amount_microcents=1000, request_id=request_id
                )
                if n % 3 == 0:
                    budget_release(tenant=tenant, request_id=request_id)
                elif n % 3 == 1:
                    budget_settle(
                        tenant=tenant, request_id=request_id, cost_microcents=n, usage=Usage()
                    )
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=threads) as pool:
        running = [pool.submit(requests, i) for i in range(threads)]
        barrier.wait(timeout=30)
        checks = []
        while not all(f.done() for f in running):
            checks.append(budget_windows_reconcile())
        for future in running:
            future.result()

    assert len(checks) > 1  # the check really ran while the requests did
    assert [d for report in checks for d in report.differences] == []
    final = budget_windows_reconcile()
    assert final.windows_checked == 2 and final.differences == []
    assert UsageRecord.objects.filter(tenant=tenant).count() == threads * 8
