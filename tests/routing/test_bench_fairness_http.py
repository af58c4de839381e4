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


def _row(p50, out, processed, requests, fair=0):
    return {
        "quiet_requests": 10,
        "quiet_p50_ms": p50,
        "quiet_p95_ms": p50 * 2,
        "quiet_ttft_p50_ms": p50 / 2,
        "flood_requests": 5,
        "output_tokens_per_s": out,
        "processed_tokens_per_s": processed,
        "requests_per_s": requests,
        "seconds": 3.0,
        "fair_preemptions": fair,
        "preemptions": 0,
    }


def test_rounds_give_medians_and_each_ratio_is_the_median_of_the_rounds_own():
    """--rounds: a phase's figures are medians over the rounds (counts summed); a ratio is the
    median of each round's own ratio, with its range, so a round that ran on a slower machine
    is compared with its own alone and flood/off phases."""
    from routing.bench.fair_http import _medians, _ratios

    rounds = [
        {
            "alone": _row(100, 50, 500, 5.0),
            "flood/off": _row(250, 1000, 3000, 20.0),
            "flood/on": _row(180, 950, 2940, 21.0, fair=3),
            "flood/on+step": _row(160, 900, 2850, 22.0, fair=4),
        },
        {  # a slower round: everything at half speed
            "alone": _row(200, 25, 250, 2.5),
            "flood/off": _row(500, 500, 1500, 10.0),
            "flood/on": _row(380, 480, 1530, 10.2, fair=2),
            "flood/on+step": _row(300, 470, 1440, 11.0, fair=5),
        },
        {
            "alone": _row(110, 48, 480, 4.8),
            "flood/off": _row(300, 900, 2800, 19.0),
            "flood/on": _row(200, 880, 2744, 19.5, fair=1),
            "flood/on+step": _row(170, 850, 2660, 20.0, fair=6),
        },
    ]
    on = _ratios(rounds, "flood/on")
    assert on["quiet_p50_ratio_on"] == 1.82  # the median of 1.8, 1.9 and 1.818
    assert on["quiet_p50_ratio_on_range"] == [1.8, 1.9]
    assert on["processed_tokens_per_s_on_over_off"] == 0.98  # of 0.98, 1.02 and 0.98
    assert on["processed_tokens_per_s_on_over_off_range"] == [0.98, 1.02]
    step = _ratios(rounds, "flood/on+step")
    assert step["quiet_p50_ratio_on_step"] == 1.55  # of 1.6, 1.5 and 1.545
    assert step["output_tokens_per_s_on_step_over_off"] == 0.94  # of 0.9, 0.94 and 0.944
    off = _ratios(rounds, "flood/off")
    assert set(off) == {"quiet_p50_ratio_off", "quiet_p50_ratio_off_range"}
    medians = _medians(rounds, "flood/on")
    assert medians["quiet_p50_ms"] == 200 and medians["processed_tokens_per_s"] == 2744
    assert medians["fair_preemptions"] == 6 and medians["quiet_requests"] == 30
    assert _medians(rounds[:1], "alone") == rounds[0]["alone"]
    one = _ratios(rounds[:1], "flood/on")
    assert "quiet_p50_ratio_on_range" not in one and one["quiet_p50_ratio_on"] == 1.8
