"""Redis restarted under load (100 concurrent streams, uvicorn in front of a real Celery GPU
worker, a Redis of our own that loses everything when it restarts): every request completes
or ends with one clean error; every stream that started has exactly one ledger row; no budget
goes over its limit and no hold outlives its request; new requests get 503 with Retry-After
while Redis is down and succeed within seconds of its return."""

import asyncio
import collections
import time
import uuid

import httpx
import pytest

from tenants.models import BudgetWindow, Reservation, UsageRecord
from tenants.services.budget_reconcile import budget_windows_reconcile
from tests.chaos.conftest import CHAT
from tests.chaos.load import storm, stream, until, warm_up
from tests.chaos.services import RedisServer
from tests.conftest import child_env, wait_for
from tests.servers import AsgiServer, CeleryWorker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_redis_restarted_under_load(chaos_key):
    redis_server = RedisServer()
    env = child_env(
        REDIS_URL=redis_server.url,
        FAIRLANE_ENGINE_MODE="celery",
        FAIRLANE_HEARTBEAT_SECONDS="1",
        FAIRLANE_QUEUE_NAMESPACE=f"t{uuid.uuid4().hex[:8]}-",
        FAIRLANE_FIRST_EVENT_TIMEOUT_SECONDS="30",
    )
    worker = CeleryWorker(env, concurrency=8)
    server = AsgiServer(env)
    try:
        warm_up(server.url, chaos_key, CHAT)

        async def scenario():
            started = []
            load = asyncio.ensure_future(storm(server.url, chaos_key, CHAT, 100, started))
            await until(lambda: len(started) >= 10, 60, "streams in flight")
            redis_server.kill()
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
                during = [await stream(client, chaos_key, CHAT) for _ in range(3)]
                await asyncio.sleep(1.0)
                redis_server.start()  # empty: queues, streams and counters are gone
                back_at, after = time.monotonic(), None
                while time.monotonic() - back_at < 20:
                    after = await stream(client, chaos_key, CHAT)
                    if after.status == 200:
                        break
                    await asyncio.sleep(0.5)
                recovered_in = time.monotonic() - back_at
            return await load, during, after, recovered_in

        outcomes, during, after, recovered_in = asyncio.run(scenario())
    finally:
        server.stop()
        worker.stop()
        logged = server.log_path.read_text() + worker.log_path.read_text()
        redis_server.stop()

    for refused in during:  # Redis down: a clean 503 that says when to retry
        assert refused.status == 503, refused
        assert refused.errors[0]["error"]["code"] in {"service_unavailable", "backend_unavailable"}
        assert int(refused.retry_after) >= 1
    assert after is not None and after.status == 200 and after.has_done, (after, recovered_in)

    seen = collections.Counter((o.status, len(o.errors)) for o in outcomes)
    assert all(o.is_clean() for o in outcomes), (seen, [o for o in outcomes if not o.is_clean()])
    refusals = collections.Counter(
        (o.status, o.errors[0]["error"].get("code")) for o in outcomes if o.status != 200
    )
    # On a failure, what the server said about it: the refusals by code, then each error it
    # logged that is not a 503's line or an expected retry, with the traceback after it.
    lines = logged.splitlines()
    errors = [
        "\n".join(lines[i : i + 60])
        for i, line in enumerate(lines)
        if " ERROR " in line
        and "Service Unavailable" not in line
        # background loops and the worker's pulling retry while Redis is away, as they should
        and not any(part in line for part in ("tenants.loops", "workers.pulling", "consumer:"))
    ]
    assert {status for status, _ in seen} <= {200, 429, 503}, (
        "\n".join(  # a str: not cut
            [repr(dict(refusals)), repr([o for o in outcomes if o.status == 500][:3]), *errors[:6]]
        )
    )
    assert seen[(200, 1)] >= 1, seen  # the restart cut streams in flight
    started = [o for o in outcomes + [after] if o.status == 200]
    assert any(not o.errors for o in started)  # some finished despite the restart

    def settled() -> bool:
        return not Reservation.objects.filter(status=Reservation.Status.HELD).exists()

    wait_for(settled, timeout=60, what="every hold released or settled")
    for outcome in started:  # exactly one ledger row each
        assert UsageRecord.objects.filter(request_id=outcome.request_id).count() == 1
    for outcome in outcomes:
        if outcome.request_id:
            assert UsageRecord.objects.filter(request_id=outcome.request_id).count() <= 1
    for window in BudgetWindow.objects.select_related("budget"):
        assert (
            window.spent_microcents + window.reserved_microcents <= window.budget.limit_microcents
        )
        assert window.reserved_microcents == 0
    # Every window's figures equal what its ledger rows and holds add up to (issue 32).
    report = budget_windows_reconcile()
    # the agent's, the tenant's, the key's and the model's windows
    assert report.windows_checked == 4 and report.differences == [], report.as_json()
