"""Budget alerts fire once per crossing: evaluated on settlement (64 settlements crossing 80 %
together give one alert), at window boundaries (time travel), re-armed by the next window or a
raised limit, and forecast by the beat at the trailing run-rate."""

import threading
import uuid
from collections import Counter
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
import time_machine
from django.db import connection

from tenants.errors import BudgetExhausted
from tenants.models import AlertDelivery, AlertEvent, AlertState, BudgetWindow, Reservation
from tenants.selectors import alert_event_list, alert_forecasts_current
from tenants.services.alerts import (
    alert_destination_add,
    alert_rules_set,
    budget_alerts_sweep,
    budget_rules,
)
from tenants.services.alerts.evaluate import rules_cache_clear
from tenants.services.budgets import (
    budget_create,
    budget_reserve,
    budget_reserve_adjust,
    budget_update,
)
from tenants.services.ledger import Usage, budget_settle

BERLIN = ZoneInfo("Europe/Berlin")


@pytest.fixture(autouse=True)
def _fresh_process_caches():
    rules_cache_clear()
    yield
    rules_cache_clear()


def rid() -> str:
    return uuid.uuid4().hex


def spend(tenant, agent, amount: int, *, now=None) -> str:
    request_id = rid()
    budget_reserve(
        tenant=tenant, agent=agent, amount_microcents=amount, request_id=request_id, now=now
    )
    budget_settle(
        tenant=tenant, request_id=request_id, cost_microcents=amount, usage=Usage(), now=now
    )
    return request_id


def fired(tenant) -> Counter:
    return Counter(AlertEvent.objects.filter(tenant=tenant).values_list("rule", flat=True))


def thresholds_fired(tenant) -> Counter:
    """The threshold rules' events only: a committed window that spends fast is also forecast
    to run out, and the embedded runtime's alert sweep (a thread of the test process, every
    FAIRLANE_ALERT_SWEEP_SECONDS) may fire that forecast at any moment."""
    return Counter(
        AlertEvent.objects.filter(tenant=tenant, rule__startswith="threshold:").values_list(
            "rule", flat=True
        )
    )


@pytest.fixture
def settle_now(django_capture_on_commit_callbacks):
    """spend() with the settlement's commit hooks run (the test's transaction never commits)."""

    def run(tenant, agent, amount, **kwargs):
        with django_capture_on_commit_callbacks(execute=True):
            return spend(tenant, agent, amount, **kwargs)

    return run


# --- on settlement -----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_64_concurrent_settlements_crossing_80_percent_fire_one_alert(tenant, agent, other_tenant):
    assert connection.vendor == "postgresql"
    budget_create(tenant=tenant, agent=agent, limit_microcents=10_000)
    alert_destination_add(tenant=tenant, kind="email", target="ops@acme.example")
    spend(tenant, agent, 7_000)  # 70 %: the 50 % rule fires
    assert thresholds_fired(tenant) == {"threshold:50": 1}
    held = [rid() for _ in range(64)]
    for request_id in held:
        budget_reserve(tenant=tenant, agent=agent, amount_microcents=40, request_id=request_id)
    barrier = threading.Barrier(64)

    def settle(request_id: str) -> None:
        try:
            barrier.wait(timeout=30)
            budget_settle(tenant=tenant, request_id=request_id, cost_microcents=40, usage=Usage())
        finally:
            connection.close()

    threads = [threading.Thread(target=settle, args=(r,)) for r in held]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    window = BudgetWindow.objects.get(budget__agent=agent)
    assert window.spent_microcents == 7_000 + 64 * 40  # 95.6 %: 80 % crossed, 100 % not
    assert thresholds_fired(tenant) == {"threshold:50": 1, "threshold:80": 1}
    event = AlertEvent.objects.get(rule="threshold:80")
    assert event.event == "threshold_crossed" and event.agent == agent
    assert AlertDelivery.objects.filter(event=event).count() == 1
    assert AlertState.objects.get(rule="threshold:80").state == "alarm"
    assert not AlertEvent.objects.filter(tenant=other_tenant).exists()


@pytest.mark.django_db
def test_each_rule_fires_once_exactly_at_its_mark_and_100_is_budget_crossed(
    tenant, agent, settle_now
):
    budget_create(tenant=tenant, agent=None, limit_microcents=1_000)
    settle_now(tenant, agent, 499)
    assert fired(tenant) == {}
    settle_now(tenant, agent, 1)  # exactly 50 %
    assert fired(tenant) == {"threshold:50": 1}
    settle_now(tenant, agent, 100)
    settle_now(tenant, agent, 200)  # 80 %
    settle_now(tenant, agent, 150)
    settle_now(tenant, agent, 50)  # 100 %
    assert fired(tenant) == {"threshold:50": 1, "threshold:80": 1, "threshold:100": 1}
    events = {e.rule: e for e in alert_event_list(tenant=tenant)}
    assert events["threshold:100"].event == "budget_crossed"
    assert events["threshold:80"].event == "threshold_crossed"
    assert events["threshold:80"].agent is None  # the tenant's budget
    assert "80 %" in events["threshold:80"].message and "$" in events["threshold:80"].message


@pytest.mark.django_db
def test_a_settlement_jumping_over_several_marks_fires_each_once(tenant, agent, settle_now):
    budget_create(tenant=tenant, agent=agent, limit_microcents=1_000)
    settle_now(tenant, agent, 1_000)
    assert fired(tenant) == {"threshold:50": 1, "threshold:80": 1, "threshold:100": 1}


@pytest.mark.django_db
def test_a_budgets_own_rules_replace_the_defaults_and_off_silences_it(tenant, agent, settle_now):
    budget = budget_create(tenant=tenant, agent=agent, limit_microcents=1_000)
    assert [r.key for r in budget_rules(budget)] == [
        "threshold:50",
        "threshold:80",
        "threshold:100",
        "forecast",
    ]
    rules = alert_rules_set(tenant=tenant, budget=budget, thresholds=[90, 25, 25], forecast=False)
    assert [r.key for r in rules] == ["threshold:25", "threshold:90"]
    rules_cache_clear()
    settle_now(tenant, agent, 600)
    assert fired(tenant) == {"threshold:25": 1}
    alert_rules_set(tenant=tenant, budget=budget, thresholds=[], forecast=False)
    rules_cache_clear()
    settle_now(tenant, agent, 350)  # 95 %: silenced
    assert fired(tenant) == {"threshold:25": 1}


@pytest.mark.django_db
def test_rules_are_validated_and_scoped_to_the_tenant(tenant, agent, other_tenant, other_agent):
    from tenants.errors import InvalidRequest

    budget = budget_create(tenant=tenant, agent=agent, limit_microcents=1_000)
    for bad in ([0], [1001], ["80"], [True], list(range(1, 13)), "80"):
        with pytest.raises(InvalidRequest):
            alert_rules_set(tenant=tenant, budget=budget, thresholds=bad, forecast=True)
    with pytest.raises(InvalidRequest):
        alert_rules_set(tenant=other_tenant, budget=budget, thresholds=[50], forecast=True)
    assert not budget.alert_rules.exists()


# --- windows: re-armed by the next one (time travel) --------------------------------------------


@pytest.mark.django_db
def test_a_late_settlement_alerts_its_own_window_and_the_next_window_rearms(
    tenant, agent, settle_now, django_capture_on_commit_callbacks
):
    budget_create(tenant=tenant, agent=agent, limit_microcents=1_000)  # daily, Berlin
    before_midnight = datetime(2026, 3, 10, 23, 55, tzinfo=BERLIN)
    after_midnight = before_midnight + timedelta(minutes=10)
    request_id = rid()
    with time_machine.travel(before_midnight, tick=False):
        budget_reserve(tenant=tenant, agent=agent, amount_microcents=850, request_id=request_id)
    with time_machine.travel(after_midnight, tick=False):
        with django_capture_on_commit_callbacks(execute=True):
            budget_settle(tenant=tenant, request_id=request_id, cost_microcents=850, usage=Usage())
        # Charged to the window it was reserved in, and alerted there.
        old = datetime(2026, 3, 10, tzinfo=BERLIN)
        assert set(AlertEvent.objects.values_list("window_start", "rule")) == {
            (old, "threshold:50"),
            (old, "threshold:80"),
        }
        settle_now(tenant, agent, 100)  # the new window: 10 %
        assert fired(tenant) == {"threshold:50": 1, "threshold:80": 1}
        settle_now(tenant, agent, 750)  # 85 % of the new window: re-armed, fires again
    new = datetime(2026, 3, 11, tzinfo=BERLIN)
    assert fired(tenant) == {"threshold:50": 2, "threshold:80": 2}
    assert AlertEvent.objects.filter(window_start=new).count() == 2
    with time_machine.travel(after_midnight + timedelta(hours=1), tick=False):
        settle_now(tenant, agent, 10)
    assert sum(fired(tenant).values()) == 4


@pytest.mark.django_db
def test_a_raised_limit_rearms_the_rule_and_the_next_crossing_fires(tenant, agent, settle_now):
    budget = budget_create(tenant=tenant, agent=agent, limit_microcents=1_000)
    settle_now(tenant, agent, 850)
    assert fired(tenant) == {"threshold:50": 1, "threshold:80": 1}
    budget_update(budget=budget, limit_microcents=1_050)  # still above 80 % of the new limit
    settle_now(tenant, agent, 10)
    assert fired(tenant) == {"threshold:50": 1, "threshold:80": 1}
    budget_update(budget=budget, limit_microcents=2_000)  # 43 %: both re-armed
    settle_now(tenant, agent, 800)  # 83 %
    assert fired(tenant) == {"threshold:50": 2, "threshold:80": 2}


@pytest.mark.django_db
def test_the_sweep_rearms_a_raised_limit_and_fires_what_a_settlement_missed(tenant, agent):
    budget = budget_create(tenant=tenant, agent=agent, limit_microcents=1_000)
    noon = datetime(2026, 3, 10, 12, 0, tzinfo=BERLIN)
    with time_machine.travel(noon, tick=False):
        # Its commit hooks never ran (its process died, say); spent hours ago: no run-rate.
        spend(tenant, agent, 850, now=noon - timedelta(hours=3))
        assert fired(tenant) == {}
        assert budget_alerts_sweep() == 2
        assert budget_alerts_sweep() == 0
        budget_update(budget=budget, limit_microcents=10_000)
        budget_alerts_sweep()
    assert set(AlertState.objects.values_list("rule", "state")) == {
        ("threshold:50", "ok"),
        ("threshold:80", "ok"),
    }


# --- the forecast (the beat) -------------------------------------------------------------------


@pytest.mark.django_db
def test_the_forecast_fires_once_when_the_run_rate_would_spend_the_budget_before_the_window_ends(
    tenant, agent, other_tenant
):
    budget_create(tenant=tenant, agent=agent, limit_microcents=10_000)  # daily, Berlin
    noon = datetime(2026, 3, 10, 12, 0, tzinfo=BERLIN)
    with time_machine.travel(noon, tick=False):
        for minutes in (50, 30, 10):  # 1,500 in the last hour: 15 % spent, 12 h to go
            spend(tenant, agent, 500, now=noon - timedelta(minutes=minutes))
        assert budget_alerts_sweep() == 1
        assert budget_alerts_sweep() == 0
        event = AlertEvent.objects.get(tenant=tenant)
        assert (event.event, event.rule) == ("projected_limit_exceeded", "forecast")
        # 8,500 left at 1,500 an hour: out at 17:40, before midnight
        assert event.projected_at == noon + timedelta(hours=8_500 / 1_500)
        assert event.projected_spend_microcents == 1_500 + 1_500 * 12
        assert "projected to run out" in event.message
        assert alert_forecasts_current(tenant=tenant) == [event]
        assert alert_forecasts_current(tenant=other_tenant) == []
    with time_machine.travel(noon + timedelta(days=1), tick=False):  # a quiet new window
        assert budget_alerts_sweep() == 0
        assert alert_forecasts_current(tenant=tenant) == []


@pytest.mark.django_db
def test_no_forecast_at_a_rate_the_window_can_afford(tenant, agent):
    budget_create(tenant=tenant, agent=agent, limit_microcents=100_000)
    noon = datetime(2026, 3, 10, 12, 0, tzinfo=BERLIN)
    with time_machine.travel(noon, tick=False):
        spend(tenant, agent, 1_000, now=noon - timedelta(minutes=20))  # 12 h more: 13 %
        assert budget_alerts_sweep() == 0
    assert not AlertEvent.objects.exists()


# --- on refusal (issue 32) ---------------------------------------------------------------------


def refused(tenant, agent, amount: int) -> None:
    with pytest.raises(BudgetExhausted):
        budget_reserve(tenant=tenant, agent=agent, amount_microcents=amount, request_id=rid())


@pytest.mark.django_db(transaction=True)
def test_the_first_refusal_fires_budget_crossed_once_and_a_raised_limit_arms_it_again(
    tenant, agent, other_tenant
):
    budget = budget_create(tenant=tenant, agent=agent, limit_microcents=1_000)
    alert_rules_set(tenant=tenant, budget=budget, thresholds=[50, 80, 100], forecast=False)
    spend(tenant, agent, 400)
    refused(tenant, agent, 700)
    refused(tenant, agent, 700)
    assert fired(tenant) == {"threshold:100": 1}
    [event] = AlertEvent.objects.filter(tenant=tenant)
    assert (event.event, event.spent_microcents, event.limit_microcents) == (
        "budget_crossed",
        400,
        1_000,
    )
    assert not AlertEvent.objects.filter(tenant=other_tenant).exists()

    budget_update(budget=budget, limit_microcents=1_050)
    budget_alerts_sweep()  # the beat re-arms a rule whose limit was raised above the mark
    refused(tenant, agent, 700)
    assert fired(tenant) == {"threshold:100": 2}


@pytest.mark.django_db(transaction=True)
def test_a_refused_growth_of_a_held_reservation_fires_it_too(tenant, agent):
    budget_create(tenant=tenant, agent=None, limit_microcents=1_000)
    request_id = rid()
    budget_reserve(tenant=tenant, agent=agent, amount_microcents=600, request_id=request_id)
    with pytest.raises(BudgetExhausted):
        budget_reserve_adjust(tenant=tenant, request_id=request_id, amount_microcents=1_200)
    [event] = AlertEvent.objects.filter(tenant=tenant)
    assert event.event == "budget_crossed" and event.agent_id is None
    assert Reservation.objects.get(request_id=request_id).amount_microcents == 600


@pytest.mark.django_db(transaction=True)
def test_no_100_percent_rule_or_a_zero_limit_fires_nothing_on_refusal(tenant, agent):
    budget = budget_create(tenant=tenant, agent=agent, limit_microcents=1_000)
    alert_rules_set(tenant=tenant, budget=budget, thresholds=[80], forecast=False)
    refused(tenant, agent, 2_000)
    budget_update(budget=budget, limit_microcents=0)
    alert_rules_set(tenant=tenant, budget=budget, thresholds=[50, 80, 100], forecast=False)
    refused(tenant, agent, 1)
    assert not AlertEvent.objects.filter(tenant=tenant).exists()
