"""Rate limits per key, agent and tenant: exact on Redis and in-process, all-or-nothing across
scopes, tokens given back, and one limit shared by two API processes."""

import asyncio
import time
import uuid

import httpx
import pytest
import redis
from django.conf import settings

from routing.ratelimit import LimitScope, LocalLimiter, RedisLimiter
from tenants.errors import RateLimited
from tenants.models import Agent
from tests.conftest import child_env
from tests.servers import AsgiServer


@pytest.fixture(params=["redis", "local"])
def limiter(request):
    if request.param == "redis":
        return RedisLimiter(redis.Redis.from_url(settings.REDIS_URL))
    return LocalLimiter()


def scope(rpm=0, tpm=0, concurrency=0):
    return LimitScope(f"test:{uuid.uuid4().hex}", rpm, tpm, concurrency)


def away_from_the_minute_boundary():
    """Windows are calendar minutes: do not let a test straddle two of them."""
    if time.time() % 60 > 50:
        time.sleep(61 - time.time() % 60)


def test_requests_per_minute_are_exact(limiter):
    away_from_the_minute_boundary()
    s = scope(rpm=5)
    for _ in range(5):
        limiter.acquire(request_id=uuid.uuid4().hex, scopes=(s,), tokens=1)
    with pytest.raises(RateLimited) as exc_info:
        limiter.acquire(request_id=uuid.uuid4().hex, scopes=(s,), tokens=1)
    assert 0 < exc_info.value.retry_after <= 60 and exc_info.value.status == 429


def test_unused_tokens_are_given_back(limiter):
    away_from_the_minute_boundary()
    s = scope(tpm=1000)
    first = limiter.acquire(request_id="a", scopes=(s,), tokens=800)  # worst case reserved
    with pytest.raises(RateLimited):
        limiter.acquire(request_id="b", scopes=(s,), tokens=300)
    limiter.release(first, tokens_used=100)
    limiter.acquire(request_id="c", scopes=(s,), tokens=900)


def test_concurrency_is_freed_on_release(limiter):
    s = scope(concurrency=2)
    held = [limiter.acquire(request_id=str(i), scopes=(s,), tokens=0) for i in range(2)]
    with pytest.raises(RateLimited) as exc_info:
        limiter.acquire(request_id="x", scopes=(s,), tokens=0)
    assert exc_info.value.retry_after == 1
    limiter.release(held[0], tokens_used=0)
    limiter.acquire(request_id="y", scopes=(s,), tokens=0)


def test_all_scopes_or_none(limiter):
    away_from_the_minute_boundary()
    roomy, tight = scope(rpm=10), scope(rpm=1)
    limiter.acquire(request_id="1", scopes=(roomy, tight), tokens=0)
    for _ in range(3):
        with pytest.raises(RateLimited):
            limiter.acquire(request_id=uuid.uuid4().hex, scopes=(roomy, tight), tokens=0)
    for _ in range(9):  # the refusals took nothing from the roomy scope
        limiter.acquire(request_id=uuid.uuid4().hex, scopes=(roomy,), tokens=0)


@pytest.mark.django_db(transaction=True)
def test_a_limit_holds_exactly_across_two_api_processes(agent, key):
    Agent.objects.filter(pk=agent.pk).update(rpm_limit=7)
    env = child_env(FAIRLANE_ENGINE_MODE="embedded")
    servers = [AsgiServer(env), AsgiServer(env)]
    body = {"model": "tiny", "prompt": "x", "max_tokens": 1}
    try:
        away_from_the_minute_boundary()

        async def fire():
            async with httpx.AsyncClient(
                timeout=60, headers={"Authorization": f"Bearer {key}"}
            ) as client:
                return await asyncio.gather(
                    *(
                        client.post(servers[i % 2].url + "/v1/completions", json=body)
                        for i in range(20)
                    )
                )

        responses = asyncio.run(fire())
        codes = sorted(r.status_code for r in responses)
        assert codes == [200] * 7 + [429] * 13
        refused = next(r for r in responses if r.status_code == 429)
        assert refused.json()["error"]["code"] == "rate_limited"
        assert 0 < int(refused.headers["Retry-After"]) <= 60
    finally:
        for server in servers:
            server.stop()


def test_a_caller_without_limits_needs_no_redis():
    """Nothing to check or take: no round trip, so an unreachable Redis does not refuse it;
    a caller with a limit still gets a clear 503 then."""
    from tenants.errors import ServiceUnavailable

    down = RedisLimiter(redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5))
    admitted = down.acquire(request_id="r1", scopes=(), tokens=10)
    down.release(admitted, tokens_used=3)
    with pytest.raises(ServiceUnavailable):
        down.acquire(request_id="r2", scopes=(scope(rpm=5),), tokens=10)


def test_deployments_on_one_redis_count_their_own_requests_only(settings):
    """FAIRLANE_QUEUE_NAMESPACE separates deployments sharing a Redis; they number tenants and
    keys alike, so one's requests must not fill the other's limits (nor its backends' lease
    slots)."""
    from routing.leases import GRANTED, RedisLeases

    client = redis.Redis.from_url(settings.REDIS_URL)
    limiter, leases = RedisLimiter(client), RedisLeases(client)
    same = scope(rpm=1, concurrency=1)
    backend = f"shared-name-{uuid.uuid4().hex[:6]}"
    away_from_the_minute_boundary()
    taken = {}
    for namespace in (f"a{uuid.uuid4().hex[:6]}-", f"b{uuid.uuid4().hex[:6]}-"):
        settings.FAIRLANE_QUEUE_NAMESPACE = namespace
        taken[namespace] = limiter.acquire(request_id=namespace, scopes=(same,), tokens=1)
        assert leases.try_acquire(backend, namespace, ttl=30, slots=1, depth=0, wait=0) == GRANTED
        with pytest.raises(RateLimited):  # within one deployment the limits hold
            limiter.acquire(request_id=namespace + "2", scopes=(same,), tokens=1)
    for namespace, admitted in taken.items():
        settings.FAIRLANE_QUEUE_NAMESPACE = namespace
        limiter.release(admitted, tokens_used=1)
        leases.release(backend, namespace)
