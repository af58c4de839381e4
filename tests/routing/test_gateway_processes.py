"""The gateway's hot path across API processes, with the in-process caches on (as deployed):
budgets held exactly over two uvicorn workers, and a key's revocation or a budget's change
reaching every process's cache at once (published on Redis, tenants/cache.py)."""

import asyncio
import json

import httpx
import pytest
from django.db.models import Sum

from routing.backend_store import agent_routing_set, backend_model_set, backend_register
from routing.bench.fakes import FakeProvider
from tenants.models import BudgetWindow, Reservation, Scope, UsageRecord
from tenants.services.budgets import budget_create, budget_update
from tenants.services.keys import api_key_create, api_key_revoke
from tests.conftest import child_env
from tests.servers import AsgiServer

MAX_TOKENS, PER_TOKEN_OUT = 8, 1000
COST = MAX_TOKENS * PER_TOKEN_OUT  # the fake answers max_tokens tokens; input is free


@pytest.fixture
def paid(transactional_db, tenant, agent):
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
    yield fake
    fake.stop()


def _env():
    return child_env(FAIRLANE_AUTH_CACHE_SECONDS="30")


async def _chat(client: httpx.AsyncClient, url: str, key: str, i: int, stream: bool):
    body = {
        "model": "paid-model",
        "max_tokens": MAX_TOKENS,
        "stream": stream,
        "messages": [{"role": "user", "content": f"request {i}"}],
    }
    response = await client.post(
        url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    )
    if response.status_code != 200:
        return response.status_code, response.json()["error"]["code"]
    if not stream:
        return 200, response.json()["choices"][0]["message"]["content"]
    chunks = [
        json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")
    ]
    if any("error" in c for c in chunks):
        return 200, "error"
    return 200, "".join(
        c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices")
    )


def test_a_budget_holds_exactly_over_two_api_processes(paid, tenant, agent):
    requests, affordable = 160, 50
    limit = affordable * COST
    budget = budget_create(tenant=tenant, agent=agent, limit_microcents=limit)
    _, key = api_key_create(tenant=tenant, agent=agent, scopes=[Scope.INFERENCE])
    server = AsgiServer(_env(), workers=2)
    try:

        async def fire():
            async with httpx.AsyncClient(
                timeout=120, limits=httpx.Limits(max_connections=64)
            ) as client:
                return await asyncio.gather(
                    *(_chat(client, server.url, key, i, i % 2 == 0) for i in range(requests))
                )

        results = asyncio.run(fire())
    finally:
        server.stop()
    served = [text for status, text in results if status == 200]
    refused = [code for status, code in results if status != 200]
    assert set(refused) <= {"budget_exhausted"}, set(refused)
    assert all(text == "".join(f"t{i} " for i in range(MAX_TOKENS)) for text in served)
    window = BudgetWindow.objects.get(budget=budget)
    assert len(served) == affordable and window.spent_microcents == limit
    assert window.reserved_microcents == 0
    assert not Reservation.objects.filter(status=Reservation.Status.HELD).exists()
    ledger = UsageRecord.objects.filter(agent=agent).aggregate(
        completion=Sum("completion_tokens"),
        prompt=Sum("prompt_tokens"),
        cost=Sum("cost_microcents"),
    )
    assert UsageRecord.objects.filter(agent=agent).count() == paid.stats["ok"] == affordable
    assert ledger["completion"] == paid.stats["completion_tokens"] == affordable * MAX_TOKENS
    assert ledger["prompt"] == paid.stats["prompt_tokens"]
    assert ledger["cost"] == limit


def test_four_budgets_hold_exactly_over_two_api_processes_and_the_binding_one_refuses(
    paid, tenant, agent
):
    """The tenant's, the agent's, an API key's and a model's budget all apply (issue 32): many
    requests over two API processes never overspend any of them, each 429 names the budget
    that bound, and nothing stays held. Phase one spends the key's budget (20 requests);
    phase two, with a second key of the same agent beside it, the model's (50 in all)."""
    key_record, key = api_key_create(tenant=tenant, agent=agent, scopes=[Scope.INFERENCE])
    _, other = api_key_create(tenant=tenant, agent=agent, scopes=[Scope.INFERENCE])
    budgets = {
        "tenant": budget_create(tenant=tenant, limit_microcents=60 * COST),
        "agent": budget_create(tenant=tenant, agent=agent, limit_microcents=55 * COST),
        "key": budget_create(tenant=tenant, api_key=key_record, limit_microcents=20 * COST),
        "model": budget_create(
            tenant=tenant, model_names=["paid-model"], limit_microcents=50 * COST
        ),
    }
    server = AsgiServer(_env(), workers=2)
    try:

        async def fire(keys: list[str]):
            async with httpx.AsyncClient(
                timeout=120, limits=httpx.Limits(max_connections=64)
            ) as client:
                return await asyncio.gather(
                    *(_chat_raw(client, server.url, k, i) for i, k in enumerate(keys))
                )

        first = asyncio.run(fire([key] * 40))
        second = asyncio.run(fire([key, other] * 40))
    finally:
        server.stop()
    for results, served_count in ((first, 20), (second, 30)):
        assert sum(status == 200 for status, _, _ in results) == served_count
    # Who refused: the key's budget in phase one and for that key in phase two; the model's
    # for the other key (the tenant's and the agent's never bound).
    key_says = f"API key {key_record.prefix}'s daily budget"
    model_says = "tenant's daily budget for paid-model"
    assert all(key_says in m for status, _, m in first if status == 429)
    # In phase two the first key's budget is spent, and the model's fills: a request of that
    # key may meet either first (extra windows are locked by id), never the tenant's or agent's.
    assert all(
        key_says in m or model_says in m for status, k, m in second if status == 429 and k == key
    )
    assert not any(status == 200 and k == key for status, k, _ in second)
    assert all(model_says in m for status, k, m in second if status == 429 and k == other)
    assert {status for status, _, _ in first + second} == {200, 429}
    spent = {
        name: BudgetWindow.objects.get(budget=budget).spent_microcents
        for name, budget in budgets.items()
    }
    assert spent == {"tenant": 50 * COST, "agent": 50 * COST, "key": 20 * COST, "model": 50 * COST}
    assert not BudgetWindow.objects.exclude(reserved_microcents=0).exists()
    assert not Reservation.objects.filter(status=Reservation.Status.HELD).exists()
    assert UsageRecord.objects.filter(agent=agent).count() == paid.stats["ok"] == 50
    assert UsageRecord.objects.filter(api_key=key_record).count() == 20


async def _chat_raw(client: httpx.AsyncClient, url: str, key: str, i: int):
    """(status, the key used, the error message or "")."""
    body = {
        "model": "paid-model",
        "max_tokens": MAX_TOKENS,
        "messages": [{"role": "user", "content": f"request {i}"}],
    }
    response = await client.post(
        url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    )
    error = response.json().get("error") or {} if response.status_code != 200 else {}
    return response.status_code, key, error.get("message", "")


def test_a_revoked_key_and_a_lowered_budget_reach_every_process_at_once(paid, tenant, agent):
    budget = budget_create(tenant=tenant, agent=agent, limit_microcents=100 * COST)
    api_key, key = api_key_create(tenant=tenant, agent=agent, scopes=[Scope.INFERENCE])
    _, other_key = api_key_create(tenant=tenant, agent=agent, scopes=[Scope.INFERENCE])
    servers = [AsgiServer(_env()), AsgiServer(_env())]
    try:

        async def each(key_: str):
            async with httpx.AsyncClient(timeout=60) as client:
                return await asyncio.gather(
                    *(_chat(client, s.url, key_, i, False) for i, s in enumerate(servers))
                )

        # Both processes now hold the key and the budget in their caches (the first request
        # starts each one's listener, whose subscription clears what was cached before it).
        for _ in range(3):
            assert [status for status, _ in asyncio.run(each(key))] == [200, 200]
            asyncio.run(asyncio.sleep(0.3))
        api_key_revoke(key=api_key)
        budget_update(budget=budget, limit_microcents=0)
        # A revocation is published once committed; the servers drop their copies when
        # Redis tells them (well under a second), not when their entries age out (30 s).
        for _ in range(50):
            revoked = asyncio.run(each(key))
            if [status for status, _ in revoked] == [401, 401]:
                break
            asyncio.run(asyncio.sleep(0.02))
        assert [status for status, _ in revoked] == [401, 401], revoked
        assert asyncio.run(each(other_key)) == [(429, "budget_exhausted")] * 2
    finally:
        for server in servers:
            server.stop()
    assert paid.stats["ok"] == 6


@pytest.mark.django_db(transaction=True)
async def test_a_request_cancelled_during_its_admission_gives_its_hold_back(
    tenant, agent, paid, distributed
):
    """The client leaves while the admission's hop (rate limits, the first route's budget hold)
    runs in its thread: the hop finishes, and what it took is given back at once, not when
    the hold expires 15 minutes later."""
    from asgiref.sync import sync_to_async

    from routing.admission import caller_authenticate
    from routing.services.generation import generation_start

    await sync_to_async(budget_create)(tenant=tenant, agent=agent, limit_microcents=100 * COST)
    _, key = await sync_to_async(api_key_create)(
        tenant=tenant, agent=agent, scopes=[Scope.INFERENCE]
    )
    caller = await sync_to_async(caller_authenticate)(authorization=f"Bearer {key}")
    body = {
        "model": "paid-model",
        "max_tokens": MAX_TOKENS,
        "messages": [{"role": "user", "content": "leaving"}],
    }
    task = asyncio.ensure_future(
        generation_start(runtime=distributed, caller=caller, endpoint="chat", body=body)
    )
    await asyncio.sleep(0)  # the request is in its admission hop now
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    def reservations():
        return sorted(Reservation.objects.values_list("status", flat=True))

    for _ in range(100):
        found = await sync_to_async(reservations)()
        if found and Reservation.Status.HELD not in found:
            break
        await asyncio.sleep(0.05)
    assert found == [Reservation.Status.RELEASED]  # it was held, then given back
    window = await sync_to_async(BudgetWindow.objects.get)(budget__agent=agent)
    assert window.reserved_microcents == 0 and window.spent_microcents == 0
    assert paid.stats["ok"] == 0
