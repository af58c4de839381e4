import json
import subprocess

import pytest

from routing.bench.decisions import run
from routing.management.commands.bench import BENCHES
from routing.models import Backend
from tenants.models import BudgetWindow


@pytest.mark.django_db
def test_bench_routing_measures_every_policy_and_cleans_up(capsys, tmp_path):
    assert BENCHES["routing"] == "routing.bench.decisions"  # `manage.py bench routing`
    run(
        [
            "--backends",
            "12",
            "--decisions",
            "60",
            "--no-proxy",
            "--json-out",
            str(tmp_path / "r.json"),
        ]
    )
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(last["policies"]) == {
        "chain",
        "round_robin",
        "least_busy",
        "latency",
        "cost",
        "energy",
        "carbon",
        "affinity",
    }
    for figures in last["policies"].values():
        assert figures["decisions"] == 60 and 0 < figures["p50_us"] <= figures["p99_us"]
    assert last["baseline_db_each_decision"]["decisions"] == 50
    assert json.loads((tmp_path / "r.json").read_text()) == last
    assert not Backend.objects.filter(name__startswith="bench-routing-").exists()


@pytest.mark.django_db(transaction=True)
def test_bench_gateway_runs_the_distributed_configuration_and_meters_exactly(
    capsys, tmp_path, subprocess_env, monkeypatch
):
    """`manage.py bench gateway` as a user runs it (the peer left out): its servers start
    against this database, every answer is held and settled, and the ledger it checks
    equals what the upstream served."""
    from routing.bench import gateway

    for name in ("DATABASE_URL", "REDIS_URL", "FAIRLANE_DB_POOL_SIZE"):
        monkeypatch.setenv(name, subprocess_env[name])
    assert BENCHES["gateway"] == "routing.bench.gateway"
    figures = gateway.run(
        [
            "--clients",
            "4",
            "--modes",
            "json,stream",
            "--api-workers",
            "1",
            "--passthrough",
            "--baseline",
            "HEAD",  # a commit: checked out in a temporary worktree for the run
            "--seconds",
            "1",
            "--warmup",
            "0.3",
            "--rounds",
            "1",
            "--budgets",
            "1,4",
            "--json-out",
            str(tmp_path / "g.json"),
        ]
    )
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["ledger"] == figures["ledger"] and figures["ledger"]["exact"]
    assert figures["ledger"]["ledger_rows"] > 0 and figures["ledger"]["reservations_held"] == 0
    rows = {(r["target"], r["mode"]): r for r in figures["rows"]}
    for mode in ("json", "stream"):
        # The ceiling forwards too, and a --baseline (here this commit) serves and meters.
        for target in (
            "fairlane-1",
            "passthrough-1",
            "baseline-1",
            "fairlane-b1-1",
            "fairlane-b4-1",
        ):
            row = rows[(target, mode)]
            assert row["rps"] > 0 and row["errors"] == 0
            # CPU over the measured window only: the server's, the load generator's, and the
            # machine's (busy and stolen shares of every core).
            assert row["cpu_ms_per_request"] > 0 and row["loadgen_cpu_ms_per_request"] > 0
            assert 0 < row["machine_busy_pct"] <= 100 and 0 <= row["machine_stolen_pct"] <= 100
        # Every Fairlane request holds and settles in PostgreSQL: its transactions are counted.
        assert rows[("fairlane-1", mode)]["db_xacts_per_request"] > 0
    assert not Backend.objects.filter(name=gateway.BACKEND).exists()
    assert (
        "bench-baseline-"
        not in subprocess.run(
            ["git", "-C", str(gateway.ROOT), "worktree", "list"], capture_output=True, text=True
        ).stdout
    )  # the baseline's worktree is gone
    assert {"fairlane-b4-1/fairlane-b1 json 4", "fairlane-b4-1/fairlane-b1 stream 4"} <= set(
        figures["ratios"]
    )
    # --budgets 4: each request was held and charged on the four budgets alike.
    four = BudgetWindow.objects.filter(budget__tenant__slug="bench-b4")
    assert {w.budget.scope for w in four} == {"tenant", "agent", "api_key"}
    assert four.count() == 4 and len({w.spent_microcents for w in four}) == 1
    assert four[0].spent_microcents > 0 and {w.reserved_microcents for w in four} == {0}


def test_the_load_samples_its_counters_as_the_measured_window_opens_and_closes():
    """The probe runs after the warm-up and at the window's end, not around the whole run: CPU
    spent in the warm-up is not charged to the measured requests."""
    import sys
    import time

    from routing.bench import gateway
    from routing.bench.loadgen import Target, load
    from routing.bench.processes import Process, free_port

    port = free_port()
    upstream = Process(
        [sys.executable, "-m", "routing.bench.upstream", "--port", str(port), "--tokens", "4"],
        gateway._env(),
        "test-bench-upstream",
    )
    try:
        gateway._wait_ready(f"http://127.0.0.1:{port}/v1/models", upstream)
        started = time.perf_counter()
        result, seconds, samples = load(
            Target("direct", "127.0.0.1", port, "sk-x", "m"),
            clients=2,
            stream=False,
            seconds=0.5,
            warmup=0.4,
            probe=time.perf_counter,
        )
    finally:
        upstream.stop()
    assert seconds == 0.5 and result.completed > 0 and result.errors == 0
    opened, closed = samples
    # Each sample is taken once its instant has passed (the warm-up's end, the window's end),
    # both counted from when load() began, which is after `started`. The gap between the two
    # samples may be a hair under 0.5 s when the first one woke late, so it is not compared.
    assert opened - started >= 0.4 and closed - started >= 0.9
    assert opened < closed


def _row(target: str, rps: float, **cpu) -> dict:
    return {"target": target, "clients": 16, "mode": "json", "rps": rps, **cpu}


def test_the_second_process_ceiling_counts_what_shares_the_cores():
    """How far a second API process can lift a gateway here: each process one core at most,
    and the cores the host leaves shared with the database, the load and the upstream."""
    from routing.bench.gateway import ratios, rps_ceiling

    two = _row(
        "fairlane-2",
        300,
        cpu_ms_per_request=4.0,
        db_redis_cpu_ms_per_request=1.0,
        loadgen_cpu_ms_per_request=0.2,
        machine_stolen_pct=0,
    )
    direct = _row("direct", 4000, cpu_ms_per_request=0.3)
    # 2 cores / (4 + 1 + 0.2 + 0.3) ms = 363.6/s, under the two processes' 2 / 4 ms = 500/s.
    assert rps_ceiling(two, direct, processes=2, cores=2) == pytest.approx(363.64, abs=0.01)
    # Half of the cores stolen by the host: one core's worth is left.
    stolen = two | {"machine_stolen_pct": 50}
    assert rps_ceiling(stolen, direct, processes=2, cores=2) == pytest.approx(181.82, abs=0.01)
    # Nothing else on the cores (a machine of 8): the processes themselves are the bound.
    alone = two | {"db_redis_cpu_ms_per_request": 0, "loadgen_cpu_ms_per_request": 0}
    assert rps_ceiling(alone, None, processes=2, cores=8) == 500
    assert rps_ceiling(two | {"cpu_ms_per_request": 0}, direct, processes=2) is None
    one = _row("fairlane-1", 200, cpu_ms_per_request=4.0)
    out = ratios([one, two, direct], [1, 2])
    assert out["fairlane-2/fairlane-1 json 16"] == 1.5
    expected = round(rps_ceiling(two, direct, processes=2) / 200, 2)
    assert out["fairlane-2/fairlane-1 ceiling json 16"] == expected
    # A lone client never fills a process: no ceiling is claimed for it.
    lone = ratios([r | {"clients": 1} for r in (one, two, direct)], [1, 2])
    assert "fairlane-2/fairlane-1 json 1" in lone
    assert "fairlane-2/fairlane-1 ceiling json 1" not in lone


def test_a_front_doors_cpu_ratio_pairs_each_round_with_chats_in_the_same_round():
    """The machine slows down between rounds: the median of per-round ratios cancels it,
    where a ratio of the two medians would not."""
    from routing.bench.gateway import ratios

    chat = _row("fairlane-1", 300, cpu_ms_per_request=2.0, cpu_rounds=[2.0, 3.0, 4.0])
    responses = _row("fairlane-1", 280, cpu_ms_per_request=3.3, cpu_rounds=[2.1, 3.3, 4.2]) | {
        "mode": "responses"
    }
    out = ratios([chat, responses], [1])
    assert out["fairlane-1 responses/chat cpu per request 16"] == 1.05  # rounds: 1.05, 1.1, 1.05
    lost = responses | {"cpu_rounds": [None, None, None]}
    assert "fairlane-1 responses/chat cpu per request 16" not in ratios([chat, lost], [1])


def test_a_baseline_is_a_directory_or_a_commit_and_nothing_else():
    from routing.bench.gateway import ROOT, baseline_checkout

    with baseline_checkout(str(ROOT)) as checkout:
        assert checkout == ROOT.resolve()
    with baseline_checkout(None) as checkout:
        assert checkout is None
    with pytest.raises(SystemExit, match="neither a directory nor a commit"):
        with baseline_checkout("no-such-commit-or-directory"):
            pass
    with baseline_checkout("HEAD") as checkout:
        assert (checkout / "routing" / "bench" / "gateway.py").is_file()
    assert not checkout.exists()
