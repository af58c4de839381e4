"""Fairness as the bench measures it, on the real Redis queue with simulated service (virtual
time, seeded: these are properties of the queue, not of this machine's speed)."""

import redis
from django.conf import settings

from workers.bench.fairness import scenario_engine, scenario_lanes, scenario_tenants


def client():
    return redis.Redis.from_url(settings.REDIS_URL)


def test_weighted_fairness_holds_where_fcfs_lets_the_flood_win():
    result = scenario_tenants(client(), slots=8, duration=60.0, seed=1)
    fair, fcfs = result["fair"], result["fcfs"]
    assert fair["jain_index"] >= 0.99 and fcfs["jain_index"] < 0.6
    assert fair["max_service_gap"] <= result["gap_bound"]
    shares = {name: row["share"] for name, row in fair["tenants"].items()}
    assert abs(shares["C"] - 2 * shares["A"]) < 0.03  # weight 2 gets twice the service
    assert fcfs["tenants"]["F"]["share"] > 0.6  # FCFS: the flood takes most of it
    assert fair["idle_slot_seconds_while_waiting"] == 0.0  # work-conserving
    assert fair["tenants"]["A"]["wait_p99_s"] < fcfs["tenants"]["A"]["wait_p99_s"]


def test_realtime_waits_under_a_second_while_bulk_is_backlogged_tenfold():
    result = scenario_lanes(client(), slots=8, duration=60.0, seed=2)
    assert result["realtime_requests"] > 50
    assert result["realtime_wait_p99_s"] < 1.0
    assert result["bulk_share_of_service"] > 0.5  # bulk still gets the rest


def test_a_real_engine_pulling_from_the_queue_serves_by_weight(tmp_path):
    result = scenario_engine(client(), seconds=4.0, seed=3, models_dir=tmp_path)
    assert result["jain_index"] >= 0.97
    assert result["shares"]["C"] > 1.6 * result["shares"]["A"]
