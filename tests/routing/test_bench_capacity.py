"""`manage.py bench capacity` as a user runs it, small: calibrate `tiny`, calibrate again from
the engine's own steps under a rising load, predict, drive the real engine (in-process,
--direct: the HTTP path's run takes minutes) at two loads and a backlog, 30 % of the requests on
the bulk lane, and print predicted against measured for each fit (structure, not speed)."""

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
            "--ramp",
            "24",
            "--ramp-again",
            "--output-tokens",
            "8-16",
            "--prompt-tokens",
            "16-64",
            "--bulk-fraction",
            "0.3",
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
    assert result["bulk_fraction"] == 0.3
    assert (
        result["capacity_rps"] > 0
        and result["fits"]["calibration"]["step_model"]["num_samples"] > 20
    )
    assert result["capacity_from"] == "path" and result["ramp_requests"] == 24
    fits = result["fits"]
    assert set(fits) == {"calibration", "path", "path_again", "all_levels"}
    # The levels are fractions of the capacity the path's fit predicts, then the backlog.
    assert result["capacity_rps"] == pytest.approx(fits["path"]["saturation_rps"])
    for fit in fits.values():
        assert fit["step_model"]["num_samples"] >= 4 and fit["saturation_rps"] > 0
        levels = fit["levels"]
        assert [level["fraction"] for level in levels] == [0.3, 0.6, None]
        assert levels[-1]["rate"] is None  # the backlog: everything sent at once
        for level in levels[:-1]:
            assert level["rate"] == pytest.approx(level["fraction"] * result["capacity_rps"])
        for level in levels:
            for name in FIGURES:
                cell = level[name]
                assert cell["predicted"] >= 0 and cell["measured"] > 0
                expected = 100 * (cell["predicted"] - cell["measured"]) / cell["measured"]
                assert cell["error_pct"] == pytest.approx(expected)
            # Both lanes' requests ran (the bulk lane's in the engine's yielding lane), and the
            # simulation predicts each lane's first tokens.
            by_lane = level["ttft_p95_by_lane"]
            assert set(by_lane) == {"standard", "bulk"}
            assert all(c["predicted"] > 0 and c["measured"] > 0 for c in by_lane.values())
        # Every fit is scored against the same measurements.
        assert [lv["e2e_p50"]["measured"] for lv in levels] == [
            lv["e2e_p50"]["measured"] for lv in fits["calibration"]["levels"]
        ]
    assert result["measured_saturation_rps"] == pytest.approx(
        fits["calibration"]["levels"][-1]["throughput_rps"]["measured"]
    )
    assert "A. predicted from the calibration" in done.stdout
    assert "P. predicted from the workers' steps through the path" in done.stdout
    assert "P2. predicted from the workers' steps during the same ramp" in done.stdout
    assert "C. predicted from the workers' steps during every level" in done.stdout
    assert "measured saturation (the backlog's completions/s)" in done.stdout
