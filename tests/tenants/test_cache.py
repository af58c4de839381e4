"""The in-process caches of the request path (tenants/cache.py): what clears them, and what
must not."""

import time

import pytest
import redis
from django.conf import settings

from tenants import cache
from tenants.services.budgets import budget_create, budget_update


def _wait_generation_above(before: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cache.epoch() > before:
            return True
        time.sleep(0.02)
    return False


def test_rows_read_before_a_change_are_not_cached_after_it():
    entries = cache.hot_cache("test-entries")
    read_at = cache.epoch()
    cache.clear_local()  # a change lands (here or through Redis) while the rows are read
    entries.put("k", "old row", read_at)
    assert entries.get("k") is None
    entries.put("k", "new row", cache.epoch())
    assert entries.get("k") == "new row"


@pytest.mark.django_db(transaction=True)
def test_saving_a_budget_clears_every_cache_in_this_process(tenant, agent):
    entries = cache.hot_cache("test-budgets")
    budget = budget_create(tenant=tenant, agent=agent, limit_microcents=100)
    entries.put("budget", budget, cache.epoch())
    budget_update(budget=budget, limit_microcents=50)
    assert entries.get("budget") is None


@pytest.mark.django_db(transaction=True)
def test_invalidations_reach_this_database_and_not_another_on_the_same_server():
    client = redis.Redis.from_url(settings.REDIS_URL)
    listener = cache.CacheListener(client)
    listener.loop.start()
    db = client.connection_pool.connection_kwargs.get("db", 0)
    ours = f"{settings.FAIRLANE_QUEUE_NAMESPACE}{cache.CHANNEL}:{db}"
    other = f"{settings.FAIRLANE_QUEUE_NAMESPACE}{cache.CHANNEL}:{db + 1}"
    assert listener.subscribed.wait(5)  # it listens, and cleared what it had
    before = cache.epoch()
    client.publish(other, b"1")  # another deployment on this Redis server
    assert not _wait_generation_above(before, timeout=0.5)
    client.publish(ours, b"1")  # another process of ours saved a cached row
    assert _wait_generation_above(before)
    listener.loop.stop()


@pytest.mark.django_db(transaction=True)
def test_a_committed_change_is_published_by_the_connected_listener(tenant, agent):
    client = redis.Redis.from_url(settings.REDIS_URL)
    listener = cache.CacheListener(client)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(listener._channel())
    listener.connect()
    try:
        budget_create(tenant=tenant, agent=agent, limit_microcents=100)
        deadline = time.monotonic() + 5
        message = None
        while message is None and time.monotonic() < deadline:
            message = pubsub.get_message(timeout=0.5)
        assert message is not None and message["data"] == b"1"
    finally:
        listener.disconnect()
        listener.loop.stop()
