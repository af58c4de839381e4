"""The embedded mode's admission control gives the same answers as the fair queue's: a tenant
with too many requests waiting for the engine gets 429 with Retry-After while another tenant
is admitted, and a full lane is the platform's 503 (a real uvicorn with its engine in-process,
one sequence at a time so the rest wait)."""

import asyncio
import contextlib
import re
import time

import httpx
import pytest

from tenants.models import Scope
from tenants.services.budgets import budget_create
from tenants.services.keys import api_key_create
from tests.conftest import child_env
from tests.servers import AsgiServer

pytestmark = pytest.mark.django_db(transaction=True)
LONG = {
    "model": "small",
    "messages": [{"role": "user", "content": "go on"}],
    "max_tokens": 120,
    "ignore_eos": True,
    "stream": True,
}


def test_a_tenant_with_too_much_waiting_gets_429_and_another_tenant_gets_in(
    tenant, agent, other_tenant, other_agent, slow
):
    keys = {}
    for name, (who, bot) in {
        "acme": (tenant, agent),
        "globex": (other_tenant, other_agent),
    }.items():
        budget_create(tenant=who, agent=bot, limit_microcents=10**9)
        keys[name] = api_key_create(tenant=who, agent=bot, scopes=[Scope.INFERENCE])[1]
    server = AsgiServer(
        child_env(
            FAIRLANE_ENGINE_MODE="embedded",
            FAIRLANE_ENGINE_MAX_NUM_SEQS="1",
            FAIRLANE_MAX_QUEUE_PER_TENANT="2",
            FAIRLANE_MAX_QUEUE_PER_LANE="3",
        )
    )

    async def scenario():
        async with contextlib.AsyncExitStack() as stack:
            client = await stack.enter_async_context(
                httpx.AsyncClient(base_url=server.url, timeout=120)
            )
            open_streams = []  # an abandoned line iterator would close its connection

            async def stream(key):
                """The response once its stream starts (its first token) or it is refused."""
                response = await stack.enter_async_context(
                    client.stream(
                        "POST",
                        "/v1/chat/completions",
                        json=LONG,
                        headers={"Authorization": f"Bearer {key}"},
                    )
                )
                if response.status_code == 200:
                    lines = response.aiter_lines()
                    await anext(lines)
                    open_streams.append(lines)
                else:
                    await response.aread()
                return response

            async def engine_waiting(n):
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    text = (await client.get("/metrics")).text
                    match = re.search(
                        r'fairlane_engine_num_waiting\{model="small",'
                        r'worker="embedded"\} (\S+)',
                        text,
                    )
                    if match and float(match[1]) == n:
                        return
                    await asyncio.sleep(0.05)
                raise AssertionError(f"the engine never had {n} sequences waiting")

            running = await stream(keys["acme"])  # takes the engine's only slot
            _waiting = [asyncio.create_task(stream(keys["acme"])) for _ in range(2)]
            await engine_waiting(2)
            refused = await stream(keys["acme"])  # a third waiting one: the tenant's 429
            assert refused.status_code == 429
            other = asyncio.create_task(stream(keys["globex"]))  # another tenant gets in ...
            await engine_waiting(3)
            full = await stream(keys["globex"])  # ... until the lane is full: the 503
            return running, refused, await other, full

    try:
        running, refused, other, full = asyncio.run(scenario())
    finally:
        server.stop()
    assert running.status_code == 200
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limited"
    assert 1 <= int(refused.headers["Retry-After"]) <= 120
    assert other.status_code == 200
    assert full.status_code == 503 and full.json()["error"]["code"] == "overloaded"
    assert int(full.headers["Retry-After"]) >= 1
