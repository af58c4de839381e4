"""A GPU worker stalls, then is killed with -9, while Redis is slow (every byte to and from it
~50 ms late, through a proxy of our own). Frozen (SIGSTOP) long enough for its claims to lapse,
its requests are resumed by the other worker, once, after the tokens already streamed; thawed,
it finds them owned by another and stops writing to them (the fence), then it is killed. The
clients get whole streams, no token twice, and the ledger one row each."""

import asyncio
import json
import signal
import uuid

import pytest

from tenants.models import Reservation, UsageRecord
from tests.chaos.conftest import CHAT
from tests.chaos.load import storm, until, warm_up
from tests.chaos.proxy import SlowProxy
from tests.chaos.services import RedisServer
from tests.conftest import child_env, wait_for
from tests.servers import AsgiServer, CeleryWorker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
TOKENS = 60
BODY = {**CHAT, "model": "small", "max_tokens": TOKENS, "temperature": 0.7}


def stream_events(client, request_id: str) -> list[dict]:
    return [json.loads(fields[b"e"]) for _, fields in client.xrange(f"fl:gen:{request_id}")]


def test_a_stalled_then_killed_worker_is_resumed_once_and_fenced_off(chaos_key):
    redis_server = RedisServer()
    proxy = SlowProxy(redis_server.port, delay=0.05)
    env = child_env(
        REDIS_URL=proxy.url,
        FAIRLANE_ENGINE_MODE="celery",
        FAIRLANE_HEARTBEAT_SECONDS="1",
        FAIRLANE_HEARTBEAT_TTL_SECONDS="3",
        FAIRLANE_CLAIM_SECONDS="4",
        FAIRLANE_QUEUE_NAMESPACE=f"t{uuid.uuid4().hex[:8]}-",
    )
    doomed = CeleryWorker(env, name="doomed", concurrency=8)
    server = AsgiServer(env)
    heir = None
    try:
        warm_up(server.url, chaos_key, BODY)  # on the doomed worker: it alone is up
        # One standard request at a time on the heir (3 slots, the last 2 kept for realtime),
        # so the stalled worker holds most of them.
        heir = CeleryWorker({**env, "FAIRLANE_WORKER_CONCURRENCY": "3"}, name="heir", concurrency=8)
        warm_up(server.url, chaos_key, BODY)
        client = redis_server.client()  # straight to Redis: what the streams hold

        started_ref: list = []

        def resumed() -> bool:
            return any(
                [e["type"] for e in stream_events(client, o.request_id)].count("accepted") == 2
                for o in started_ref
            )

        async def scenario():
            started = started_ref
            load = asyncio.ensure_future(storm(server.url, chaos_key, BODY, 6, started))
            await until(lambda: len(started) == 6, 120, "streams in flight")
            doomed.proc.send_signal(signal.SIGSTOP)  # stalled: its claims lapse
            await until(resumed, 60, "the heir resuming the stalled worker's requests")
            doomed.proc.send_signal(signal.SIGCONT)  # back: its writes must be refused
            await asyncio.sleep(1.0)
            doomed.stop(signal.SIGKILL)
            return await load

        outcomes = asyncio.run(scenario())
        resumed_count = 0
        for outcome in outcomes:
            assert outcome.status == 200 and outcome.has_done and not outcome.errors, outcome
            assert outcome.completion_tokens == TOKENS
            events = stream_events(client, outcome.request_id)
            kinds = [e["type"] for e in events]
            assert kinds.count("accepted") in (1, 2), kinds  # resumed at most once
            resumed_count += kinds.count("accepted") == 2
            assert kinds.count("done") == 1 and kinds[-1] == "done", kinds
            # Every token once: nothing the stalled worker wrote after the heir took over.
            assert sum(len(e["token_ids"]) for e in events if e["type"] == "token") == TOKENS
            streamed = sum(
                1
                for c in outcome.chunks
                if c.get("choices") and c["choices"][0]["delta"].get("content") is not None
            )
            assert 1 <= streamed <= TOKENS + 1
        assert resumed_count >= 1
        wait_for(
            lambda: not Reservation.objects.filter(status=Reservation.Status.HELD).exists(),
            timeout=30,
            what="every hold settled",
        )
        for outcome in outcomes:
            record = UsageRecord.objects.get(request_id=outcome.request_id)
            assert record.status == UsageRecord.Status.OK and record.completion_tokens == TOKENS
    finally:
        server.stop()
        if doomed.proc.poll() is None:
            doomed.proc.send_signal(signal.SIGCONT)
        doomed.stop(signal.SIGKILL)
        if heir is not None:
            heir.stop()
        proxy.stop()
        redis_server.stop()
