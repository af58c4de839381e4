"""A /v1/responses request waits in the same Redis fair queue as every other request for our
engines (distributed runtime, no GPU worker: the test takes the queue's next request itself),
ordered with the rest by lane and tenant."""

import asyncio
import json

import pytest
from channels.db import database_sync_to_async
from django.test import AsyncClient

from tenants.models import Agent, Reservation

pytestmark = pytest.mark.django_db(transaction=True)


async def test_a_response_waits_in_the_fair_queue_ordered_with_the_rest(
    queue, key, agent, tenant, budget
):
    # Another tenant's request was first, in the standard lane; this agent's lane is realtime.
    queue.enqueue(id="theirs", tenant="other", lane="standard", weight=1, cost=1, payload={})
    await database_sync_to_async(Agent.objects.filter(pk=agent.pk).update)(lane="realtime")
    body = {"model": "tiny", "input": "hi", "max_output_tokens": 4}
    request = asyncio.create_task(
        AsyncClient().post(
            "/v1/responses",
            json.dumps(body),
            content_type="application/json",
            headers={"Authorization": f"Bearer {key}"},
        )
    )
    try:
        for _ in range(300):
            if queue.depth() == 2:
                break
            await asyncio.sleep(0.05)
        assert queue.depth(lane="realtime", tenant=str(tenant.pk)) == 1
        first = queue.dequeue(worker="test")
        assert (first.tenant, first.lane) == (str(tenant.pk), "realtime")
        assert queue.dequeue(worker="test").id == "theirs"
        # Held against the budget like any request while it waits.
        assert (
            await database_sync_to_async(
                Reservation.objects.filter(tenant=tenant, status=Reservation.Status.HELD).count
            )()
            == 1
        )
    finally:
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
