"""A stream that outlives FAIRLANE_RESERVATION_TTL_SECONDS keeps its budget hold (its API
process renews it), so the beat cannot release it and another request of the tenant cannot
take the room: no budget is outspent (a real uvicorn, a fake provider streaming slowly)."""

import asyncio
import time

import httpx
import pytest
from django.db import connection

from routing.backend_store import agent_routing_set, backend_model_set, backend_register
from routing.bench.fakes import FakeProvider
from tenants.models import Reservation, Scope, UsageRecord
from tenants.selectors import budget_window_status
from tenants.services.budgets import budget_create, budget_reservations_expire
from tenants.services.keys import api_key_create
from tenants.services.tenancy import agent_create
from tests.conftest import child_env
from tests.servers import AsgiServer

pytestmark = pytest.mark.django_db(transaction=True)
OUT_PRICE = 100_000_000  # micro-cents per million: 100 a token


def beat() -> None:
    """What the beat task does every minute (here every 0.3 s), on a thread of its own."""
    try:
        budget_reservations_expire()
    finally:
        connection.close()


def test_a_stream_longer_than_the_hold_ttl_keeps_its_room(tenant, agent):
    fake = FakeProvider("openai", reply_tokens=12, token_delay=0.5).start()
    backend = backend_register(
        name="paid", kind="openai", base_url=fake.url, credential=fake.api_key
    )
    backend_model_set(
        backend=backend, model="m", upstream_name="fake-model", price_output_per_mtok=OUT_PRICE
    )
    other = agent_create(tenant=tenant, name="other-bot")
    for who in (agent, other):
        agent_routing_set(agent=who, chain=["paid"])
    budget = budget_create(tenant=tenant, agent=None, limit_microcents=1500)
    keys = [
        api_key_create(tenant=tenant, agent=a, scopes=[Scope.INFERENCE])[1] for a in (agent, other)
    ]
    server = AsgiServer(
        child_env(FAIRLANE_ENGINE_MODE="embedded", FAIRLANE_RESERVATION_TTL_SECONDS="2")
    )
    body = {"model": "m", "max_tokens": 12, "messages": [{"role": "user", "content": "hi"}]}
    try:

        async def scenario():
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
                headers = {"Authorization": f"Bearer {keys[0]}"}
                async with client.stream(
                    "POST", "/v1/chat/completions", headers=headers, json={**body, "stream": True}
                ) as stream:
                    lines = stream.aiter_lines()
                    assert (await anext(lines)).startswith("data: ")
                    # The beat runs while the stream goes on well past the TTL.
                    deadline = time.monotonic() + 3.0
                    while time.monotonic() < deadline:
                        await asyncio.to_thread(beat)
                        await asyncio.sleep(0.3)
                    second = await client.post(
                        "/v1/chat/completions",
                        json=body,
                        headers={"Authorization": f"Bearer {keys[1]}"},
                    )
                    rest = [line async for line in lines]
                return stream.headers["x-request-id"], second, rest

        request_id, second, rest = asyncio.run(scenario())
    finally:
        server.stop()
        fake.stop()
    assert second.status_code == 429, second.text  # the room is still held by the stream
    assert second.json()["error"]["code"] == "budget_exhausted"
    assert "data: [DONE]" in rest and not any('"error"' in line for line in rest)
    record = UsageRecord.objects.get(request_id=request_id)
    assert (record.completion_tokens, record.cost_microcents, record.unbilled_microcents) == (
        12,
        1200,
        0,
    )
    assert UsageRecord.objects.count() == 1
    assert Reservation.objects.get(request_id=request_id).status == Reservation.Status.SETTLED
    window = budget_window_status(budget=budget)
    assert (window.spent_microcents, window.reserved_microcents) == (1200, 0)
