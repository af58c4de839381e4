"""The rate-limit and lease scripts declare every key they touch, with hash tags where one
script needs several keys, so they run on a Redis Cluster (and behind proxies that route by
key): here, a real three-node cluster of our own."""

import uuid

import pytest
from django.conf import settings

from routing.leases import GRANTED, RedisLeases
from routing.ratelimit import RedisLimiter, scopes_for
from tenants.errors import RateLimited
from tests.chaos.services import RedisCluster


@pytest.fixture(scope="module")
def cluster():
    nodes = RedisCluster()
    yield nodes
    nodes.stop()


@pytest.fixture
def callers(db, make_user):
    """Five callers (key, agent and tenant limits each), of five tenants: their hash tags land
    on different nodes."""
    from routing.admission import Caller
    from tenants.services.keys import api_key_create
    from tenants.services.tenancy import agent_create, tenant_create

    made = []
    for i in range(5):
        tenant = tenant_create(name=f"T{i}", slug=f"t{i}", owner=make_user(f"owner{i}"))
        tenant.rpm_limit = 100
        agent = agent_create(tenant=tenant, name="bot")
        agent.tpm_limit = 1000
        key = api_key_create(tenant=tenant, agent=agent, scopes=["inference"])[0]
        key.rpm_limit, key.concurrency_limit = 5, 2
        made.append(Caller(api_key=key, tenant=tenant, agent=agent))
    return made


def test_rate_limits_run_on_a_redis_cluster(cluster, callers):
    limiter = RedisLimiter(cluster.client())
    for caller in callers:
        scopes = scopes_for(caller)
        assert len(scopes) == 3
        held = [
            limiter.acquire(request_id=uuid.uuid4().hex, scopes=scopes, tokens=100)
            for _ in range(2)
        ]
        with pytest.raises(RateLimited) as exc_info:  # the key's concurrency of 2
            limiter.acquire(request_id=uuid.uuid4().hex, scopes=scopes, tokens=100)
        assert exc_info.value.retry_after == 1
        limiter.release(held[0], tokens_used=10)
        limiter.acquire(request_id=uuid.uuid4().hex, scopes=scopes, tokens=100)


def test_scopes_of_one_caller_share_their_tenants_slot(callers):
    caller = callers[0]
    scopes = scopes_for(caller)
    assert {s.slot for s in scopes} == {f"tenant:{caller.tenant.pk}"}
    assert all(
        s.key("c").startswith(
            f"{settings.FAIRLANE_QUEUE_NAMESPACE}rl:{{tenant:{caller.tenant.pk}}}:"
        )
        for s in scopes
    )


def test_leases_run_on_a_redis_cluster(cluster):
    leases = RedisLeases(cluster.client())
    for _ in range(5):
        backend = f"gpu-{uuid.uuid4().hex[:6]}"
        assert leases.try_acquire(backend, "a", ttl=5, slots=1, depth=1, wait=1) == GRANTED
        assert leases.try_acquire(backend, "b", ttl=5, slots=1, depth=1, wait=1) == 0  # waits
        assert leases.renew(backend, "a", ttl=5)
        leases.release(backend, "a")
        assert leases.try_acquire(backend, "b", ttl=5, slots=1, depth=1, wait=1) == GRANTED
        assert leases.holders(backend) == ["b"]
