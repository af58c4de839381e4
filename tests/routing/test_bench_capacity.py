"""`manage.py bench capacity` as a user runs it, small: calibrate `tiny`, predict, drive the
real engine (in-process, --direct: the HTTP path's run takes minutes) at two loads, and print
predicted against measured for the calibration and the engine's own recorded steps
(structure, not speed)."""

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FIGURES = ("ttft_p50", "ttft_p95", "e2e_p50", "e2e_p95", "throughput_rps", "itl_p50")


def test_bench_capacity_reports_predicted_against_measured(subprocess_env, tmp_path):
    out = tmp_path / "capacity.json"
    done = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "bench",
            "capacity",
            "--direct",
            "--quick-calibration",
            "--requests",
            "24",
            "--fractions",
            "0.3,0.6",
            "--output-tokens",
            "8-16",
            "--prompt-tokens",
            "16-64",
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
    assert result["path"] == "direct" and result["preset"] == "tiny"
    assert result["capacity_rps"] > 0 and result["step_model"]["num_samples"] > 20
    assert [level["fraction"] for level in result["levels"]] == [0.3, 0.6]
    for level in result["levels"]:
        assert level["rate"] == pytest.approx(level["fraction"] * result["capacity_rps"])
        for name in FIGURES:
            cell = level[name]
            assert cell["predicted"] >= 0 and cell["measured"] > 0
            expected = 100 * (cell["predicted"] - cell["measured"]) / cell["measured"]
            assert cell["error_pct"] == pytest.approx(expected)
    fits = result["worker_fits"]
    assert set(fits) == {"first_level", "all_levels"}
    assert len(fits["all_levels"]["levels"]) == 2
    assert (
        fits["all_levels"]["step_model"]["num_samples"]
        > fits["first_level"]["step_model"]["num_samples"]
    )
    assert "A. predicted from the calibration" in done.stdout
    assert "C. predicted from the steps the worker recorded during every level" in done.stdout
