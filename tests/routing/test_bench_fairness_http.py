"""`manage.py bench fairness --http` as a user runs it, small: the quiet tenant alone, then
beside a flood with fairness inside the batch off and on, each through uvicorn, the Redis
fair queue and a Celery GPU worker (structure, not speed)."""

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_bench_fairness_http_reports_each_phase_and_the_ratios(subprocess_env, tmp_path):
    out = tmp_path / "fairness-http.json"
    done = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "bench",
            "fairness",
            "--http",
            "--slots",
            "2",
            "--extra",
            "2",
            "--quiet-clients",
            "1",
            "--flood-clients",
            "4",
            "--seconds",
            "3",
            "--json-out",
            str(out),
        ],
        cwd=ROOT,
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert json.loads(done.stdout.strip().splitlines()[-1]) == result
    phases = result["phases"]
    assert list(phases) == ["alone", "flood/off", "flood/on"]
    assert phases["alone"]["flood_requests"] == 0
    for row in phases.values():
        assert row["quiet_requests"] > 0 and row["output_tokens_per_s"] > 0
        assert row["quiet_p95_ms"] >= row["quiet_p50_ms"] > 0
    assert phases["flood/off"]["flood_requests"] > 0 and phases["flood/on"]["flood_requests"] > 0
    # Off, nobody is preempted for fairness; on, the flood holds both slots whenever the
    # quiet tenant's requests arrive, and gives one up for them.
    assert phases["flood/off"]["fair_preemptions"] == 0
    assert phases["flood/on"]["fair_preemptions"] > 0
    alone = phases["alone"]["quiet_p50_ms"]
    assert result["quiet_p50_ratio_on"] == round(phases["flood/on"]["quiet_p50_ms"] / alone, 2)
    on, off = phases["flood/on"], phases["flood/off"]
    for figure in ("output_tokens_per_s", "processed_tokens_per_s", "requests_per_s"):
        assert result[f"{figure}_on_over_off"] == round(on[figure] / off[figure], 3)
    for row in phases.values():  # prompts count in the work done
        assert row["processed_tokens_per_s"] > row["output_tokens_per_s"]
    assert "quiet p50 under the flood" in done.stdout
