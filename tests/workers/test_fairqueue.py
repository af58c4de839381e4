"""The Redis fair queue on real Redis: lanes, weighted fairness, idling earns no credit,
starvation guard, claims that bring back the requests of dead workers."""

import threading
import time
import uuid
from collections import Counter

import pytest
import redis
from django.conf import settings

from workers.fairqueue import FairQueue


@pytest.fixture
def fq():
    queue = FairQueue(
        redis.Redis.from_url(settings.REDIS_URL), f"test-{uuid.uuid4().hex[:8]}", claim_seconds=0.3
    )
    yield queue
    queue.clear()


def put(fq, tenant, lane="standard", cost=10, weight=1, n=1):
    ids = []
    for _ in range(n):
        ids.append(uuid.uuid4().hex)
        fq.enqueue(
            id=ids[-1],
            tenant=tenant,
            lane=lane,
            weight=weight,
            cost=cost,
            payload={"tenant": tenant, "id": ids[-1]},
        )
    return ids


def take_all(fq, worker="w"):
    taken = []
    while (item := fq.dequeue(worker=worker)) is not None:
        taken.append(item)
        fq.ack(id=item.id, worker=worker)
    return taken


def test_fifo_within_a_tenant_and_payloads_round_trip(fq):
    ids = put(fq, "a", n=3)
    taken = take_all(fq)
    assert [t.id for t in taken] == ids
    assert taken[0].payload == {"tenant": "a", "id": ids[0]} and taken[0].lane == "standard"
    assert fq.depth() == 0 and fq.claimed() == 0


def test_lanes_are_strict_priority(fq):
    put(fq, "a", lane="bulk", n=2)
    put(fq, "b", lane="standard", n=2)
    put(fq, "c", lane="realtime", n=2)
    assert [t.lane for t in take_all(fq)][:4] == ["realtime", "realtime", "standard", "standard"]


def test_backlogged_tenants_are_served_in_proportion_to_their_weights(fq):
    put(fq, "light", weight=1, n=60)
    put(fq, "heavy", weight=2, n=60)
    first = [fq.dequeue(worker="w").tenant for _ in range(30)]
    counts = Counter(first)
    assert counts["heavy"] == 20 and counts["light"] == 10


def test_a_flood_does_not_delay_a_light_tenant(fq):
    put(fq, "flood", n=100)
    put(fq, "light", n=1)
    order = [t.tenant for t in take_all(fq)]
    assert order.index("light") <= 1


def test_idling_earns_no_credit(fq):
    put(fq, "busy", n=50)
    take = [fq.dequeue(worker="w") for _ in range(40)]  # busy's counter climbs to 400
    assert all(t.tenant == "busy" for t in take)
    put(fq, "returning", n=20)  # idle all along: lifted to busy's counter, not left at 0
    next_ten = Counter(fq.dequeue(worker="w").tenant for _ in range(10))
    assert 4 <= next_ten["returning"] <= 6


def test_output_tokens_are_charged_as_generated(fq):
    put(fq, "a", n=5)
    put(fq, "b", n=5)
    first = fq.dequeue(worker="w")
    fq.charge(tenant=first.tenant, lane="standard", tokens=1000)  # a long answer
    other = "b" if first.tenant == "a" else "a"
    assert [fq.dequeue(worker="w").tenant for _ in range(4)] == [other] * 4


def test_lower_lanes_get_their_minimum_share_when_higher_ones_are_backlogged(fq):
    put(fq, "rt", lane="realtime", n=400)
    put(fq, "bulky", lane="bulk", n=400)
    lanes = Counter(fq.dequeue(worker="w").lane for _ in range(400))
    assert 0.04 <= lanes["bulk"] / 400 <= 0.07


def test_an_expired_claim_puts_the_request_back_first(fq):
    first, second = put(fq, "a", n=2)
    taken = fq.dequeue(worker="dies")
    assert taken.id == first and fq.claimed() == 1
    time.sleep(0.35)
    again = fq.dequeue(worker="heir")
    assert again.id == first and again.payload == taken.payload
    assert fq.ack(id=first, worker="dies") is False  # its claim was lost
    assert fq.ack(id=first, worker="heir") is True
    assert fq.dequeue(worker="heir").id == second


def test_a_claim_kept_under_its_former_name_still_expires(fq):
    """A worker of the version before claims were renamed keeps them in 'leases'; during a
    rolling upgrade, one that dies there still has its request put back."""
    (only,) = put(fq, "a")
    fq.dequeue(worker="old")
    fq.client.zrem(fq.prefix + "claims", only)
    fq.client.zadd(fq.prefix + "leases", {only: int(time.time() * 1000) - 1})
    again = fq.dequeue(worker="heir")
    assert again.id == only and fq.claimed() == 1
    assert fq.client.zcard(fq.prefix + "leases") == 0


def test_renewed_claims_are_kept(fq):
    (only,) = put(fq, "a")
    fq.dequeue(worker="w")
    for _ in range(4):
        time.sleep(0.15)
        assert fq.renew(worker="w", ids=[only]) == []
    assert fq.dequeue(worker="other") is None
    assert fq.renew(worker="intruder", ids=[only]) == [only]


def test_concurrent_workers_never_take_a_request_twice(fq):
    ids = set(put(fq, "a", n=100) + put(fq, "b", n=100))
    taken: list[str] = []
    lock = threading.Lock()

    def worker(name):
        client = FairQueue(
            redis.Redis.from_url(settings.REDIS_URL), fq.prefix[4:-2], claim_seconds=30
        )
        while (item := client.dequeue(worker=name)) is not None:
            with lock:
                taken.append(item.id)

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(taken) == sorted(ids)


def test_reserved_slots_take_realtime_only(fq):
    put(fq, "b", lane="bulk", n=2)
    assert fq.dequeue(worker="w", realtime_only=True) is None
    (rt,) = put(fq, "r", lane="realtime")
    assert fq.dequeue(worker="w", realtime_only=True).id == rt
    assert fq.dequeue(worker="w").lane == "bulk"


def test_excluded_tenants_stay_queued_and_the_next_lowest_counter_goes(fq):
    """A full worker takes beyond its slots only for tenants under their share: the others'
    requests stay queued, in order, for a later dequeue."""
    flood = put(fq, "flood", n=3)
    put(fq, "other", n=1, cost=500)  # its counter climbs above the flood's once taken
    (quiet,) = put(fq, "quiet", cost=1000)
    assert fq.dequeue(worker="w", exclude=frozenset({"flood", "quiet", "other"})) is None
    assert fq.dequeue(worker="w", exclude=frozenset({"flood", "other"})).id == quiet
    assert fq.dequeue(worker="w", exclude=frozenset({"flood"})).tenant == "other"
    assert fq.dequeue(worker="w", exclude=frozenset({"flood"})) is None
    assert fq.depth(lane="standard", tenant="flood") == 3
    assert [t.id for t in take_all(fq)] == flood


def test_an_acknowledgement_wakes_the_workers_own_wait_and_leaves_the_queues_bell(fq):
    """A full worker waits on a bell of its own, rung when it acknowledges a request (one ring
    kept however many end); its wait does not take the queue's bell, which an arrival rang for
    workers with room, and another worker's acknowledgement does not wake it."""
    (one,) = put(fq, "a")  # rings the queue's bell
    fq.dequeue(worker="full")
    (other,) = put(fq, "a")
    fq.dequeue(worker="elsewhere")
    assert fq.ack(id=other, worker="elsewhere")  # rings that worker's bell, not this one's
    assert fq.client.llen(fq.prefix + "freed:full") == 0
    fq.client.delete(fq.prefix + "freed:elsewhere")
    woke = threading.Event()

    def wait() -> None:
        fq.wait_for_slot("full", timeout=30)
        woke.set()

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    assert fq.ack(id=one, worker="full")
    assert woke.wait(10)
    waiter.join(10)
    assert fq.client.llen(fq.prefix + "bell") == 2  # the arrivals' rings, still there
    for _ in range(3):
        put(fq, "a")
        fq.ack(id=fq.dequeue(worker="full").id, worker="full")
    assert fq.client.llen(fq.prefix + "freed:full") == 1
