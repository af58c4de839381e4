"""An API process gets SIGTERM with streams in flight, in both modes: it stops accepting at
once; a stream that can finish within FAIRLANE_DRAIN_TIMEOUT_SECONDS finishes; the others are
ended cleanly at the deadline (one error chunk, then [DONE]); every one is settled, once; and
the process exits."""

import asyncio
import signal
import time
import uuid

import httpx
import pytest

from tenants.models import Budget, Reservation, UsageRecord
from tests.chaos.conftest import CHAT
from tests.chaos.load import stream, until, warm_up
from tests.conftest import child_env, wait_for
from tests.servers import AsgiServer, CeleryWorker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
DRAIN = 4
# Long enough not to finish within DRAIN on a fast, quiet machine (~200 tokens/s a stream):
# the small model's whole context less the prompt.
LONG = {**CHAT, "model": "small", "max_tokens": 1900}
SHORT = {**CHAT, "model": "tiny", "max_tokens": 12}


def drained(server: AsgiServer, key: str):
    async def scenario():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            started = []
            long = [asyncio.ensure_future(stream(client, key, LONG, started)) for _ in range(3)]
            await until(lambda: len(started) == 3, 60, "long streams in flight")
            short = asyncio.ensure_future(stream(client, key, SHORT))
            await asyncio.sleep(0.3)
            signalled = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(1.0)
            try:  # a new connection is refused
                async with httpx.AsyncClient(timeout=5) as fresh:
                    refused = (await fresh.get(server.url + "/healthz")).status_code
            except httpx.ConnectError:
                refused = "refused"
            outcomes = await asyncio.gather(*long)
            return outcomes, await short, refused, time.monotonic() - signalled

    outcomes, short, refused, took = asyncio.run(scenario())
    server.proc.wait(timeout=60)
    return outcomes, short, refused, took


def assert_drained(outcomes, short, refused, took, server):
    assert refused == "refused"
    assert server.proc.returncode in (0, -signal.SIGTERM), server.output()[-3000:]
    assert short.status == 200 and short.has_done and not short.errors  # finished in time
    for outcome in outcomes:  # cut at the deadline, cleanly
        assert outcome.status == 200 and outcome.is_clean() and len(outcome.errors) == 1, (
            outcome,
            took,
            _drain_lines(server),
        )
        assert outcome.errors[0]["error"]["code"] == "service_unavailable"
    assert DRAIN - 1 < took < DRAIN + 20, took
    wait_for(
        lambda: not Reservation.objects.filter(status=Reservation.Status.HELD).exists(),
        timeout=30,
        what="every hold settled",
    )
    for outcome in outcomes:
        record = wait_for(
            lambda outcome=outcome: UsageRecord.objects.filter(
                request_id=outcome.request_id
            ).first(),
            timeout=30,
            what="a ledger row",
        )
        assert record.status == UsageRecord.Status.CANCELLED and record.completion_tokens > 0
    assert UsageRecord.objects.get(request_id=short.request_id).status == UsageRecord.Status.OK


def _drain_lines(server: AsgiServer) -> list[str]:
    """The server's own account of the drain (what it saw in flight, what it cut)."""
    return [
        line
        for line in server.output().splitlines()
        if "routing.drain" in line or "Shutting down" in line or "Finished" in line
    ]


@pytest.fixture
def drain_key(chaos_key):
    """The chaos key with room for three long streams at once (each holds ~76,000 micro-cents)."""
    Budget.objects.update(limit_microcents=10_000_000)
    return chaos_key


def test_sigterm_drains_the_embedded_mode(drain_key):
    server = AsgiServer(
        child_env(FAIRLANE_ENGINE_MODE="embedded", FAIRLANE_DRAIN_TIMEOUT_SECONDS=str(DRAIN))
    )
    try:
        warm_up(server.url, drain_key, LONG)
        warm_up(server.url, drain_key, SHORT)
        assert_drained(*drained(server, drain_key), server)
    finally:
        server.stop()


def test_sigterm_drains_the_distributed_mode(drain_key):
    env = child_env(
        FAIRLANE_ENGINE_MODE="celery",
        FAIRLANE_HEARTBEAT_SECONDS="1",
        FAIRLANE_QUEUE_NAMESPACE=f"t{uuid.uuid4().hex[:8]}-",
        FAIRLANE_DRAIN_TIMEOUT_SECONDS=str(DRAIN),
    )
    worker = CeleryWorker(env, concurrency=8)
    server = AsgiServer(env)
    try:
        warm_up(server.url, drain_key, LONG)
        warm_up(server.url, drain_key, SHORT)
        assert_drained(*drained(server, drain_key), server)
    finally:
        server.stop()
        worker.stop()
