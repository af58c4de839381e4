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


@pytest.mark.django_db(transaction=True)
def test_bench_gateway_runs_the_distributed_configuration_and_meters_exactly(
        capsys, tmp_path, subprocess_env, monkeypatch):
    """`manage.py bench gateway` as a user runs it (the peer left out): its servers start
    against this database, every answer is held and settled, and the ledger it checks
    equals what the upstream served."""
    from routing.bench import gateway

    for name in ("DATABASE_URL", "REDIS_URL", "FAIRLANE_DB_POOL_SIZE"):
        monkeypatch.setenv(name, subprocess_env[name])
    assert BENCHES["gateway"] == "routing.bench.gateway"
    figures = gateway.run(["--clients", "4", "--modes", "json,stream", "--api-workers", "1",
                           "--passthrough", "--baseline", str(gateway.ROOT), "--seconds", "1",
                           "--warmup", "0.3", "--rounds", "1",
                           "--json-out", str(tmp_path / "g.json")])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["ledger"] == figures["ledger"] and figures["ledger"]["exact"]
    assert figures["ledger"]["ledger_rows"] > 0 and figures["ledger"]["reservations_held"] == 0
    rows = {(r["target"], r["mode"]): r for r in figures["rows"]}
    for mode in ("json", "stream"):
        # The ceiling forwards too, and a --baseline checkout (here this one) serves and meters.
        for target in ("fairlane-1", "passthrough-1", "baseline-1"):
            assert rows[(target, mode)]["rps"] > 0 and rows[(target, mode)]["errors"] == 0
    assert not Backend.objects.filter(name=gateway.BACKEND).exists()
