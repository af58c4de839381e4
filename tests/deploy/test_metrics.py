"""The figures the autoscaler reads are ones /metrics exports: every fairlane_* name in the
ScaledObjects' queries, with the labels they select on, and the values the fair queue holds."""

import re
import uuid

import pytest

from tests.deploy.manifests import of
from workers.serving.registration import model_register
from workers.transport import queue_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def queue(settings, distributed):
    settings.FAIRLANE_QUEUE_NAMESPACE = f"t{uuid.uuid4().hex[:8]}-"
    model_register(name="tiny", source="preset:tiny")
    fair = queue_for(distributed.redis, "tiny")
    yield fair
    fair.clear()


def scrape(client) -> str:
    response = client.get("/metrics")
    assert response.status_code == 200
    return response.content.decode()


def test_every_metric_the_scalers_query_is_exported(client, queue, manifests):
    queries = [
        t["metadata"]["query"]
        for docs in manifests.values()
        for s in of(docs, "ScaledObject")
        for t in s["spec"]["triggers"]
    ]
    names = {n for q in queries for n in re.findall(r"\b(fairlane_[a-z_]+)\b", q)}
    assert names == {"fairlane_queue_depth", "fairlane_model_replicas_min"}
    text = scrape(client)
    for name in names:
        assert re.search(rf"^{name}\{{[^}}]*model=\"tiny\"", text, re.M), name
    for query in queries:  # `by (lane)` and `model=~` need both labels on the series
        if "fairlane_queue_depth" in query:
            assert "by (lane)" in query and 'lane="standard",model="tiny"' in text
    assert 'fairlane_model_replicas_min{model="tiny"} 1.0' in text
    assert 'fairlane_num_requests_waiting{model="tiny"} 0.0' in text


def test_the_gauges_count_what_waits_in_the_fair_queue(client, queue):
    for i in range(3):
        queue.enqueue(id=f"r{i}", tenant="t1", lane="standard", weight=1, cost=4, payload={})
    queue.enqueue(id="b0", tenant="t2", lane="bulk", weight=1, cost=4, payload={})
    text = scrape(client)
    assert 'fairlane_queue_depth{lane="standard",model="tiny"} 3.0' in text
    assert 'fairlane_queue_depth{lane="bulk",model="tiny"} 1.0' in text
    assert 'fairlane_queue_depth{lane="realtime",model="tiny"} 0.0' in text
    assert 'fairlane_num_requests_waiting{model="tiny"} 4.0' in text
    queue.dequeue(worker="w")
    assert 'fairlane_queue_depth{lane="standard",model="tiny"} 2.0' in scrape(client)
