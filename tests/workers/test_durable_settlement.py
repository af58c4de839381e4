"""A settlement the ledger cannot take is not lost: with PostgreSQL unreachable at settlement
time, the stream still ends cleanly (usage and [DONE]), the charge waits in the outbox (files in
the embedded mode, a Redis stream in the distributed one), and once the database is back the
ledger row appears, charged once. Real processes on a database of their own."""

import asyncio
import json
import uuid

import httpx
import pytest
from django.conf import settings
from django.db import connections

from routing.backend_store import agent_routing_set, backend_model_set, backend_register
from routing.bench.fakes import FakeProvider
from tenants.models import Scope
from tenants.services.budgets import budget_create
from tenants.services.keys import api_key_create
from tests.chaos.services import Database, RedisServer
from tests.conftest import child_env, wait_for
from tests.routing.conftest import PRICES
from tests.servers import AsgiServer, CeleryWorker
from workers.serving.registration import model_register

pytestmark = pytest.mark.django_db(transaction=True)
BODY = {
    "messages": [{"role": "user", "content": "go on"}],
    "stream": True,
    "stream_options": {"include_usage": True},
}


@pytest.fixture
def seeded(tenant, agent):
    """A key, a budget, and a database of our own cloned from what the test committed."""
    budget_create(tenant=tenant, agent=agent, limit_microcents=10**9)
    key = api_key_create(tenant=tenant, agent=agent, scopes=[Scope.INFERENCE])[1]
    return key


def clone() -> Database:
    connections.close_all()
    return Database(settings.DATABASES["default"]["NAME"])


async def stream_with_outage(url: str, key: str, body: dict, db: Database) -> list[dict]:
    """Stream, and make the database unreachable after the first tokens."""
    chunks = []
    async with (
        httpx.AsyncClient(base_url=url, timeout=120) as client,
        client.stream(
            "POST", "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        ) as response,
    ):
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if line == "data: [DONE]":
                return chunks
            if line.startswith("data: "):
                chunks.append(json.loads(line[6:]))
                if len(chunks) == 3:
                    await asyncio.to_thread(db.set_reachable, False)
    raise AssertionError("the stream ended without [DONE]")


def ledger(db: Database, request_id: str):
    rows = db.query(
        "SELECT cost_microcents, completion_tokens, status FROM "
        "tenants_usagerecord WHERE request_id = %s",
        request_id,
    )
    return rows[0] if rows else None


def assert_settled_once(db: Database, request_id: str, cost: int, completion: int) -> None:
    assert wait_for(lambda: ledger(db, request_id), timeout=60) == (cost, completion, "ok")
    [(status,)] = db.query(
        "SELECT status FROM tenants_reservation WHERE request_id = %s", request_id
    )
    [(spent, reserved)] = db.query(
        "SELECT spent_microcents, reserved_microcents FROM tenants_budgetwindow"
    )
    assert status == "settled" and (spent, reserved) == (cost, 0)
    assert db.query("SELECT count(*) FROM tenants_usagerecord") == [(1,)]


def test_embedded_a_settlement_waits_on_disk_until_the_database_is_back(seeded, agent, tmp_path):
    fake = FakeProvider("openai", reply_tokens=10, token_delay=0.3).start()
    backend = backend_register(
        name="paid", kind="openai", base_url=fake.url, credential=fake.api_key
    )
    backend_model_set(backend=backend, model="m", upstream_name="fake-model", **PRICES)
    agent_routing_set(agent=agent, chain=["paid"])
    db = clone()
    outbox = tmp_path / "outbox"
    server = AsgiServer(
        child_env(
            DATABASE_URL=db.url,
            REDIS_URL="",
            FAIRLANE_ENGINE_MODE="embedded",
            FAIRLANE_SETTLEMENT_DIR=str(outbox),
            FAIRLANE_SETTLEMENT_RETRY_SECONDS="0.5",
            FAIRLANE_DB_POOL_TIMEOUT_SECONDS="2",
        )
    )
    try:
        chunks = asyncio.run(
            stream_with_outage(server.url, seeded, {**BODY, "model": "m", "max_tokens": 10}, db)
        )
        assert not any("error" in c for c in chunks)
        usage = chunks[-1]["usage"]
        assert usage["completion_tokens"] == 10
        request_id = chunks[0]["id"].removeprefix("chatcmpl-")
        queued = wait_for(lambda: list(outbox.rglob("*.json")), timeout=30)
        assert [p.stem for p in queued] == [request_id]
        db.set_reachable(True)
        cost = -(
            -(
                usage["prompt_tokens"] * PRICES["price_input_per_mtok"]
                + 10 * PRICES["price_output_per_mtok"]
            )
            // 1_000_000
        )
        assert_settled_once(db, request_id, cost, 10)
        wait_for(lambda: not list(outbox.rglob("*.json")), timeout=60)
        assert "settlement queued for retry" in server.output()
    finally:
        server.stop()
        fake.stop()
        db.drop()


def test_distributed_a_workers_settlement_waits_in_redis_until_the_database_is_back(seeded):
    model_register(name="small", source="preset:small", **PRICES)
    redis_server = RedisServer()
    db = clone()
    env = child_env(
        DATABASE_URL=db.url,
        REDIS_URL=redis_server.url,
        FAIRLANE_ENGINE_MODE="celery",
        FAIRLANE_HEARTBEAT_SECONDS="1",
        FAIRLANE_QUEUE_NAMESPACE=f"t{uuid.uuid4().hex[:8]}-",
        FAIRLANE_SETTLEMENT_RETRY_SECONDS="0.5",
        FAIRLANE_DB_POOL_TIMEOUT_SECONDS="2",
    )
    worker = CeleryWorker(env)
    server = AsgiServer(env)
    try:
        body = {**BODY, "model": "small", "max_tokens": 60, "ignore_eos": True}
        chunks = asyncio.run(stream_with_outage(server.url, seeded, body, db))
        assert not any("error" in c for c in chunks)
        usage = chunks[-1]["usage"]
        assert usage["completion_tokens"] == 60
        request_id = chunks[0]["id"].removeprefix("chatcmpl-")
        stream = env["FAIRLANE_QUEUE_NAMESPACE"] + "fl:settle"
        client = redis_server.client()
        assert wait_for(lambda: client.xlen(stream), timeout=30) == 1
        db.set_reachable(True)
        cost = -(
            -(
                (usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"])
                * PRICES["price_input_per_mtok"]
                + usage["prompt_tokens_details"]["cached_tokens"] * PRICES["price_cached_per_mtok"]
                + 60 * PRICES["price_output_per_mtok"]
            )
            // 1_000_000
        )
        assert_settled_once(db, request_id, cost, 60)
        wait_for(lambda: client.xlen(stream) == 0, timeout=60)
        assert "settlement queued for retry" in worker.output()
    finally:
        server.stop()
        worker.stop()
        db.drop()
        redis_server.stop()
