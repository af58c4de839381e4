"""Admission control and brownout against a real Redis fair queue."""

import json
import uuid

import pytest
from channels.db import database_sync_to_async
from django.test import AsyncClient

from routing.overload import load_admit
from tenants.errors import Overloaded, RateLimited
from tenants.models import Agent, Reservation
from workers.serving.catalog import ModelInfo
from workers.transport import queue_for

pytestmark = pytest.mark.django_db(transaction=True)
TINY = ModelInfo(name="tiny", source="preset:tiny")


@pytest.fixture
def queue(settings, distributed):
    settings.FAIRLANE_QUEUE_NAMESPACE = f"t{uuid.uuid4().hex[:8]}-"
    settings.FAIRLANE_MAX_QUEUE_PER_TENANT = 5
    settings.FAIRLANE_MAX_QUEUE_PER_LANE = 20
    q = queue_for(distributed.redis, "tiny")
    yield q
    q.clear()


def admit(**request) -> tuple[int, str]:
    """Admission with the distributed runtime's pool (the Redis fair queue)."""
    from routing.runtimes import runtime_installed

    return load_admit(pool=runtime_installed().pool, **request)


def fill(queue, n, tenant="other", lane="standard"):
    for _ in range(n):
        queue.enqueue(id=uuid.uuid4().hex, tenant=tenant, lane=lane, weight=1, cost=1, payload={})


def test_a_tenant_with_too_much_waiting_gets_429_with_retry_after(queue):
    fill(queue, 5, tenant="7")
    with pytest.raises(RateLimited) as exc_info:
        admit(info=TINY, lane="standard", tenant="7", max_tokens=10)
    assert exc_info.value.retry_after >= 1
    assert admit(info=TINY, lane="standard", tenant="8", max_tokens=10) == (10, "")


def test_a_full_lane_is_the_platform_overloaded_503(queue):
    fill(queue, 20, lane="realtime")
    with pytest.raises(Overloaded) as exc_info:
        admit(info=TINY, lane="realtime", tenant="9", max_tokens=10)
    assert exc_info.value.status == 503 and exc_info.value.retry_after >= 1


def test_retry_after_follows_the_dispatch_rate(queue):
    fill(queue, 20, lane="realtime")
    fast = queue_for(queue.client, "tiny")
    for _ in range(15):  # 15 taken in the last second: ~0.5/s over 30 s
        fast.dequeue(worker="w")
    fill(queue, 15, lane="realtime")
    with pytest.raises(Overloaded) as exc_info:
        admit(info=TINY, lane="realtime", tenant="9", max_tokens=10)
    assert exc_info.value.retry_after == 40  # 20 waiting / 0.5 per second


def test_brownout_sheds_bulk_then_caps_standard_and_spares_realtime(queue, settings):
    settings.FAIRLANE_BROWNOUT_MAX_TOKENS = 64
    fill(queue, 10, tenant="a")  # half full: level 1
    with pytest.raises(Overloaded) as exc_info:
        admit(info=TINY, lane="bulk", tenant="b", max_tokens=500)
    assert exc_info.value.headers == {"x-fairlane-brownout": "shed-bulk"}
    assert admit(info=TINY, lane="standard", tenant="b", max_tokens=500) == (500, "")
    fill(queue, 5, tenant="c")  # three quarters: level 2
    assert admit(info=TINY, lane="standard", tenant="b", max_tokens=500) == (
        64,
        "cap-max-tokens=64",
    )
    assert admit(info=TINY, lane="realtime", tenant="b", max_tokens=500) == (500, "")


async def test_shed_requests_are_refused_over_http_before_anything_is_reserved(queue, key, agent):
    fill(queue, 10)
    await database_sync_to_async(Agent.objects.filter(pk=agent.pk).update)(lane="bulk")
    response = await AsyncClient().post(
        "/v1/chat/completions",
        json.dumps(
            {"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
        ),
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}"},
    )
    assert response.status_code == 503
    assert response["x-fairlane-brownout"] == "shed-bulk" and int(response["Retry-After"]) >= 1
    assert json.loads(response.content)["error"]["code"] == "overloaded"
    assert not await database_sync_to_async(Reservation.objects.exists)()
