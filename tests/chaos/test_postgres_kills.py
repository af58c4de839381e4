"""PostgreSQL connections killed under load (pg_terminate_backend on every session of a
database of our own, three times while 100 streams run through uvicorn and a real Celery GPU
worker): every request completes or ends with one clean error; every stream that started has
exactly one ledger row (a settlement that lost its connection is retried from the outbox); no
budget goes over its limit; no hold outlives its request; and the pools recover by themselves."""

import asyncio
import collections
import json
import subprocess
import sys
import time
import uuid

import httpx
import pytest
from django.conf import settings
from django.db import connections

from tests.chaos.conftest import CHAT
from tests.chaos.load import storm, stream, until, warm_up
from tests.chaos.services import Database, RedisServer
from tests.conftest import ROOT, child_env, wait_for
from tests.servers import AsgiServer, CeleryWorker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_postgres_connections_killed_under_load(chaos_key):
    connections.close_all()
    db = Database(settings.DATABASES["default"]["NAME"])
    redis_server = RedisServer()
    env = child_env(
        DATABASE_URL=db.url,
        REDIS_URL=redis_server.url,
        FAIRLANE_ENGINE_MODE="celery",
        FAIRLANE_HEARTBEAT_SECONDS="1",
        FAIRLANE_QUEUE_NAMESPACE=f"t{uuid.uuid4().hex[:8]}-",
        FAIRLANE_SETTLEMENT_RETRY_SECONDS="0.5",
        FAIRLANE_DB_POOL_TIMEOUT_SECONDS="5",
    )
    worker = CeleryWorker(env, concurrency=8)
    server = AsgiServer(env)
    killed = []
    try:
        warm_up(server.url, chaos_key, CHAT)

        async def scenario():
            started = []
            load = asyncio.ensure_future(storm(server.url, chaos_key, CHAT, 100, started))
            await until(lambda: len(started) >= 5, 60, "streams in flight")
            for _ in range(3):
                killed.append(await asyncio.to_thread(db.terminate_connections))
                await asyncio.sleep(0.7)
            outcomes = await load
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
                back_at = time.monotonic()
                after = await stream(client, chaos_key, CHAT)  # the pools healed themselves
            return outcomes, after, time.monotonic() - back_at

        outcomes, after, took = asyncio.run(scenario())

        def query(sql, *params):
            return db.query(sql, *params)

        wait_for(
            lambda: (
                query("SELECT count(*) FROM tenants_reservation WHERE status = 'held'") == [(0,)]
            ),
            timeout=60,
            what="every hold released or settled",
        )
        seen = collections.Counter((o.status, len(o.errors)) for o in outcomes)
        assert sum(killed) > 0, killed  # sessions of ours were really terminated
        assert all(o.is_clean() for o in outcomes), (
            seen,
            [o for o in outcomes if not o.is_clean()],
        )
        assert {status for status, _ in seen} <= {200, 429, 503}, seen
        assert after.status == 200 and after.has_done and not after.errors, (
            after,
            server.output()[-6000:],
        )
        started = [o for o in outcomes + [after] if o.status == 200]
        for outcome in started:  # exactly one ledger row each, charged as reported
            rows = query(
                "SELECT completion_tokens FROM tenants_usagerecord WHERE request_id = %s",
                outcome.request_id,
            )
            assert len(rows) == 1, (outcome, rows)
            if not outcome.errors:
                assert rows[0][0] == outcome.completion_tokens
        for request_id in {o.request_id for o in outcomes if o.request_id}:
            assert (
                len(query("SELECT 1 FROM tenants_usagerecord WHERE request_id = %s", request_id))
                <= 1
            )
        for spent, reserved, limit in query(
            "SELECT w.spent_microcents, w.reserved_microcents, b.limit_microcents FROM "
            "tenants_budgetwindow w JOIN tenants_budget b ON b.id = w.budget_id"
        ):
            assert spent + reserved <= limit and reserved == 0
        # Every window's figures equal what its ledger rows and holds add up to, as the
        # operator's command checks them (issue 32).
        checked = subprocess.run(
            [sys.executable, "manage.py", "budgets_reconcile", "--json"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        report = json.loads(checked.stdout)
        assert checked.returncode == 0 and report["differences"] == [], checked.stdout
        # the agent's, the tenant's, the key's and the model's windows
        assert report["windows_checked"] == 4, report
    finally:
        server.stop()
        worker.stop()
        redis_server.stop()
        db.drop()
