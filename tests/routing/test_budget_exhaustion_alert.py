"""The exhaustion alert (issue 32): an exact budget never reaches 100 % spent, since every
request holds its worst case first, so `budget_crossed` fires when the budget first refuses a
request for lack of room: once per window, at every scope, to a real signed-webhook receiver,
also when many requests race the last room."""

import asyncio
import json

import httpx
import pytest
from channels.db import database_sync_to_async

from routing.backend_store import agent_routing_set, backend_model_set, backend_register
from routing.bench.fakes import FakeProvider
from tenants.models import AlertDelivery, AlertEvent, BudgetWindow, Reservation, Scope
from tenants.services.alerts import (
    alert_deliveries_send_due,
    alert_destination_add,
    alert_rules_set,
)
from tenants.services.alerts.evaluate import rules_cache_clear
from tenants.services.budgets import budget_create
from tenants.services.keys import api_key_create
from tests.conftest import child_env, wait_for
from tests.routing.test_gateway_processes import COST, MAX_TOKENS, PER_TOKEN_OUT, _chat
from tests.routing.test_routing import PRICES, chat, register
from tests.servers import AsgiServer
from tests.tenants.test_alerts_delivery import Receiver


@pytest.fixture(autouse=True)
def _fresh(settings):
    settings.FAIRLANE_ALERT_WEBHOOK_ALLOW_PRIVATE = True  # the receiver is on 127.0.0.1
    settings.FAIRLANE_ALERT_RETRY_BASE_SECONDS = 0.2
    rules_cache_clear()
    yield
    rules_cache_clear()


@pytest.fixture
def hook(tenant):
    receiver = Receiver()
    _, receiver.secret = alert_destination_add(tenant=tenant, kind="webhook", target=receiver.url)
    yield receiver
    receiver.stop()


def _crossed() -> list[AlertEvent]:
    return list(AlertEvent.objects.filter(event="budget_crossed").select_related("budget"))


def _delivered(hook: Receiver) -> list[dict]:
    return [json.loads(r["body"]) for r in hook.requests if r["valid"]]


def _crossed_delivered(hook: Receiver) -> list[dict]:
    return [b for b in _delivered(hook) if b["event"] == "budget_crossed"]


async def _paid_backend(fakes, agent) -> None:
    paid = fakes("openai")
    await database_sync_to_async(register)("paid", paid, prices=PRICES)
    await database_sync_to_async(agent_routing_set)(agent=agent, chain=["paid"])


@pytest.mark.django_db(transaction=True)
async def test_spending_down_to_the_first_429_sends_budget_crossed_once(
    key, tenant, agent, fakes, hook, embedded
):
    await _paid_backend(fakes, agent)
    budget = await database_sync_to_async(budget_create)(
        tenant=tenant, agent=agent, limit_microcents=60_000
    )
    statuses = []
    for _ in range(60):
        response = await chat(key, max_tokens=20)
        statuses.append(response.status_code)
        if response.status_code != 200:
            break
    assert statuses[-1] == 429 and set(statuses[:-1]) == {200}, statuses
    assert json.loads(response.content)["error"]["code"] == "budget_exhausted"
    # Refused again: still one alert in this window.
    assert (await chat(key, max_tokens=20)).status_code == 429

    delivered = await database_sync_to_async(wait_for)(
        lambda: _crossed_delivered(hook) and _delivered(hook),
        what="the signed budget_crossed delivery",
    )
    [event] = await database_sync_to_async(_crossed)()
    assert event.budget_id == budget.pk and event.rule == "threshold:100"
    crossed = [b for b in delivered if b["event"] == "budget_crossed"]
    assert len(crossed) == 1 and all(r["valid"] for r in hook.requests)
    body = crossed[0]
    assert (body["event_group"], body["team_id"], body["key_alias"]) == (
        "key",
        tenant.slug,
        agent.name,
    )
    assert body["fairlane"]["limit_microcents"] == 60_000
    assert 0 < body["fairlane"]["spend_microcents"] < 60_000  # exact: never reaches the limit
    assert "refused" in body["event_message"]
    # Nothing more arrives (give the sender a moment to misbehave, bounded by the poll).
    await database_sync_to_async(wait_for)(
        lambda: not AlertDelivery.objects.exclude(status="delivered").exists(),
        what="every delivery settled",
    )
    assert [b["event"] for b in _delivered(hook)].count("budget_crossed") == 1


@pytest.mark.django_db(transaction=True)
async def test_24_requests_racing_the_last_room_of_a_tenant_budget_send_it_once(
    key, tenant, agent, fakes, hook, embedded
):
    await _paid_backend(fakes, agent)
    budget = await database_sync_to_async(budget_create)(
        tenant=tenant, agent=None, limit_microcents=60_000
    )
    responses = await asyncio.gather(*(chat(key, max_tokens=50) for _ in range(24)))
    statuses = sorted(r.status_code for r in responses)
    assert 200 in statuses and 429 in statuses and set(statuses) == {200, 429}, statuses

    await database_sync_to_async(wait_for)(
        lambda: _crossed_delivered(hook) or None,
        what="the signed budget_crossed delivery",
    )
    [event] = await database_sync_to_async(_crossed)()
    assert event.budget_id == budget.pk and event.agent_id is None
    await database_sync_to_async(wait_for)(
        lambda: not AlertDelivery.objects.exclude(status="delivered").exists(),
        what="every delivery settled",
    )
    crossed = [b for b in _delivered(hook) if b["event"] == "budget_crossed"]
    assert len(crossed) == 1 and crossed[0]["event_group"] == "team"
    held = await database_sync_to_async(
        lambda: Reservation.objects.filter(status=Reservation.Status.HELD).count()
    )()
    assert held == 0


def test_24_requests_racing_the_last_room_over_two_api_processes_send_it_once(
    transactional_db, tenant, agent, settings
):
    # Two uvicorn workers (the distributed mode) hold the budget; their Celery sends have no
    # worker here, so this process sends what is due, as the beat does.
    fake = FakeProvider("openai", reply_tokens=MAX_TOKENS).start()
    backend = backend_register(
        name="paid", kind="openai", base_url=fake.url, credential=fake.api_key
    )
    backend_model_set(
        backend=backend,
        model="paid-model",
        upstream_name="fake-model",
        price_output_per_mtok=PER_TOKEN_OUT * 1_000_000,
    )
    agent_routing_set(agent=agent, chain=["paid"])
    budget = budget_create(tenant=tenant, agent=agent, limit_microcents=3 * COST + COST // 2)
    alert_rules_set(tenant=tenant, budget=budget, thresholds=[100], forecast=False)
    hook = Receiver()
    _, hook.secret = alert_destination_add(tenant=tenant, kind="webhook", target=hook.url)
    _, key = api_key_create(tenant=tenant, agent=agent, scopes=[Scope.INFERENCE])
    server = AsgiServer(child_env(FAIRLANE_AUTH_CACHE_SECONDS="30"), workers=2)
    try:

        async def fire():
            async with httpx.AsyncClient(timeout=120) as client:
                return await asyncio.gather(
                    *(_chat(client, server.url, key, i, i % 2 == 0) for i in range(24))
                )

        results = asyncio.run(fire())
    finally:
        server.stop()
    try:
        assert sorted(status for status, _ in results) == [200] * 3 + [429] * 21, results
        assert {text for status, text in results if status == 429} == {"budget_exhausted"}
        assert not Reservation.objects.filter(status=Reservation.Status.HELD).exists()
        [event] = AlertEvent.objects.filter(tenant=tenant)
        assert (event.event, event.budget_id) == ("budget_crossed", budget.pk)
        wait_for(
            lambda: alert_deliveries_send_due() == 0 and _crossed_delivered(hook),
            what="the budget_crossed delivery",
        )
        assert len(hook.requests) == 1 and hook.requests[0]["valid"]
        body = json.loads(hook.requests[0]["body"])
        assert body["event"] == "budget_crossed" and body["key_alias"] == agent.name
        # What the window had spent when it refused (the three served may still have held
        # their cost then, which the message says); settled since, exactly the limit's room.
        window = BudgetWindow.objects.get()
        assert body["fairlane"]["spend_microcents"] <= window.spent_microcents == 3 * COST
        assert window.reserved_microcents == 0 and "refused" in body["event_message"]
    finally:
        hook.stop()
        fake.stop()
