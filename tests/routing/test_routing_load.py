"""500 concurrent streaming requests through a real API server process at a paid fake
provider, with an agent budget worth exactly N of them: never a cent over, and the ledger
agrees token for token with what the provider says it served."""

import asyncio
import json

import httpx
import pytest
from django.db.models import Sum

from routing.backend_store import agent_routing_set, backend_model_set, backend_register
from routing.bench.fakes import FakeProvider
from tenants.models import BudgetWindow, Reservation, Scope, UsageRecord
from tenants.services.budgets import budget_create
from tenants.services.keys import api_key_create
from tests.conftest import child_env
from tests.servers import AsgiServer

REQUESTS, AFFORDABLE, MAX_TOKENS = 500, 120, 10
PER_TOKEN_OUT = 1000  # micro-cents: $10 per million output tokens; input free
COST = MAX_TOKENS * PER_TOKEN_OUT  # the fake always answers max_tokens tokens


@pytest.fixture
def server(subprocess_env):
    server = AsgiServer(child_env())
    yield server
    server.stop()


async def _one(client: httpx.AsyncClient, url: str, key: str, i: int) -> tuple[int, str]:
    body = {
        "model": "paid-model",
        "max_tokens": MAX_TOKENS,
        "stream": True,
        "messages": [{"role": "user", "content": f"request number {i}"}],
    }
    async with client.stream(
        "POST", url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    ) as response:
        if response.status_code != 200:
            return response.status_code, json.loads(await response.aread()).get("error", {}).get(
                "code", ""
            )
        text = ""
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return response.status_code, chunk["error"]["code"]
                for choice in chunk.get("choices") or ():
                    text += choice["delta"].get("content") or ""
        return 200, text


def test_500_concurrent_streams_never_overspend_and_the_ledger_matches_the_provider(
    server, tenant, agent
):
    fake = FakeProvider("openai", reply_tokens=MAX_TOKENS, token_delay=0.01).start()
    try:
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
        limit = AFFORDABLE * COST
        budget = budget_create(tenant=tenant, agent=agent, limit_microcents=limit)
        _, key = api_key_create(tenant=tenant, agent=agent, scopes=[Scope.INFERENCE])

        async def all_at_once():
            limits = httpx.Limits(max_connections=REQUESTS + 10)
            async with httpx.AsyncClient(limits=limits, timeout=120) as client:
                return await asyncio.gather(
                    *(_one(client, server.url, key, i) for i in range(REQUESTS))
                )

        results = asyncio.run(all_at_once())
    finally:
        fake.stop()

    served = [text for status, text in results if status == 200]
    refused = [code for status, code in results if status != 200]
    assert len(served) + len(refused) == REQUESTS
    assert set(refused) <= {"budget_exhausted"}, set(refused)
    assert all(text == "".join(f"t{i} " for i in range(MAX_TOKENS)) for text in served)
    window = BudgetWindow.objects.get(budget=budget)
    # Each request reserves exactly what it costs, so exactly N fit, to the micro-cent.
    assert window.spent_microcents <= limit
    assert len(served) == AFFORDABLE and window.spent_microcents == limit
    assert window.reserved_microcents == 0
    assert not Reservation.objects.filter(status=Reservation.Status.HELD).exists()
    ledger = UsageRecord.objects.filter(agent=agent).aggregate(
        prompt=Sum("prompt_tokens"),
        completion=Sum("completion_tokens"),
        cost=Sum("cost_microcents"),
    )
    stats = fake.stats
    assert UsageRecord.objects.filter(agent=agent).count() == stats["ok"] == AFFORDABLE
    assert ledger["prompt"] == stats["prompt_tokens"]
    assert ledger["completion"] == stats["completion_tokens"] == AFFORDABLE * MAX_TOKENS
    assert ledger["cost"] == window.spent_microcents
