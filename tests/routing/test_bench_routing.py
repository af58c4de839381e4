import json

import pytest
from routing.bench.decisions import run
from routing.management.commands.bench import BENCHES
from routing.models import Backend


@pytest.mark.django_db
def test_bench_routing_measures_every_policy_and_cleans_up(capsys, tmp_path):
    assert BENCHES["routing"] == "routing.bench.decisions"  # `manage.py bench routing`
    run(["--backends", "12", "--decisions", "60", "--no-proxy",
         "--json-out", str(tmp_path / "r.json")])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(last["policies"]) == {"chain", "round_robin", "least_busy", "latency", "cost",
                                     "energy", "carbon", "affinity"}
    for figures in last["policies"].values():
        assert figures["decisions"] == 60 and 0 < figures["p50_us"] <= figures["p99_us"]
    assert last["baseline_db_each_decision"]["decisions"] == 50
    assert json.loads((tmp_path / "r.json").read_text()) == last
    assert not Backend.objects.filter(name__startswith="bench-routing-").exists()
