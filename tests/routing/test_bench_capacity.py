"""`manage.py bench capacity` as a user runs it, small: calibrate `tiny`, calibrate again from
the engine's own steps under a rising load, predict the knee for a p95 target, drive the real
engine (in-process, --direct: the HTTP path's run takes minutes) at two loads and a backlog,
30 % of the requests on the bulk lane, and print predicted against measured for each fit and
the knee measured between the levels (structure, not speed)."""

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FIGURES = ("ttft_p50", "ttft_p95", "e2e_p50", "e2e_p95", "throughput_rps", "itl_p50")


def _bench(env: dict, out, *args: str) -> subprocess.CompletedProcess:
    """`manage.py bench capacity ARGS --json-out OUT`, as a user runs it, on the in-process
    engine with the quick calibration and short requests."""
    small = [
        "--direct",
        "--quick-calibration",
        "--output-tokens",
        "8-16",
        "--prompt-tokens",
        "16-64",
    ]
    return subprocess.run(
        [sys.executable, "manage.py", "bench", "capacity", *small, *args, "--json-out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_bench_capacity_levels_at_given_rates(subprocess_env, tmp_path):
    """--rates: the levels at the same rates whatever the run's fit predicts (an A/B of a
    change), each level's fraction of the predicted capacity reported beside it."""
    out = tmp_path / "capacity.json"
    done = _bench(
        subprocess_env,
        out,
        "--ramp",
        "0",
        "--requests",
        "12",
        "--rates",
        "3,6.5",
        "--no-backlog",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    levels = result["fits"]["calibration"]["levels"]
    assert [level["rate"] for level in levels] == [3.0, 6.5]
    assert [level["fraction"] for level in levels] == pytest.approx(
        [3.0 / result["capacity_rps"], 6.5 / result["capacity_rps"]]
    )
    assert all(level["throughput_rps"]["measured"] > 0 for level in levels)


def test_bench_capacity_reports_predicted_against_measured(subprocess_env, tmp_path):
    out = tmp_path / "capacity.json"
    done = _bench(
        subprocess_env,
        out,
        "--requests",
        "24",
        "--fractions",
        "0.3,0.6",
        "--ramp",
        "24",
        "--ramp-again",
        "--bulk-fraction",
        "0.3",
        "--p95-ms",
        "60000",  # a target every level meets: the knee is above them
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
    # The levels are fractions of the capacity the path's fit predicts (its knee for the p95
    # target, at or below its saturation), then the backlog.
    knee = result["knee_p95"]
    assert result["capacity_rps"] == pytest.approx(knee["predicted"]["P"]["steady_rps"])
    assert 0 < result["capacity_rps"] <= fits["path"]["saturation_rps"]
    assert knee["target_ms"] == 60000 and knee["measured_where"] == "above"
    assert set(knee["predicted"]) == {"A", "P", "P2", "C"}
    for predicted in knee["predicted"].values():
        assert predicted["at_levels_rps"] is None and predicted["at_levels_where"] == "above"
        assert predicted["levels_length_rps"] > 0
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
    assert "the knee for p95 60000 ms between the levels: measured above the levels" in done.stdout


def test_the_measured_knee_is_where_p95_first_crosses_the_target():
    from routing.bench.capacity import knee_measured

    assert knee_measured([(3, 5.0), (1, 1.0), (2, 2.0)], 3.0) == (
        pytest.approx(2 + 1 / 3),
        "within",
    )
    assert knee_measured([(1, 1.0), (2, 2.0)], 3.0) == (None, "above")
    assert knee_measured([(1, 4.0), (2, 5.0)], 3.0) == (None, "below")
    # A level that meets the target again above one that missed it is noise: the first crossing.
    assert knee_measured([(1, 1.0), (2, 4.0), (3, 2.0)], 3.0) == (pytest.approx(5 / 3), "within")


def test_the_knee_report_reads_each_fits_knee_off_the_same_levels(capsys):
    """Levels 'measured' as the simulation predicts them: the knee interpolated between them
    lands where the simulation's own search puts it for the levels' length; a fit predicting
    those same levels has no error, and one predicting p95s 30 % longer a lower knee."""
    import argparse

    from routing.bench.capacity import _knee_report
    from workers.engine.planner import (
        Mix,
        RequestClass,
        ServerShape,
        StepTimeModel,
        Targets,
        capacity_search,
        simulate,
    )

    model = StepTimeModel(0.004, 2e-5, 3e-4, 1e-6)
    shape = ServerShape(max_num_seqs=8)
    mix = Mix((RequestClass((32, 256), (16, 48)),))
    targets = Targets(e2e_p95=0.5)  # a knee below saturation (the search stops there)
    args = argparse.Namespace(requests=300, seed=3)
    knee = capacity_search(model, shape, mix, targets, num_requests=300, seed=3, steady=False)
    levels, same, slower = [], [], []
    for fraction in (0.7, 0.85, 1.0, 1.15, 1.3):
        rate = fraction * knee
        p95 = simulate(model, shape, mix, rate, num_requests=300, seed=3).e2e_p95
        levels.append((fraction, rate, 3, {"e2e_p95": p95}))
        same.append({"rate": rate, "e2e_p95": {"predicted": p95}})
        slower.append({"rate": rate, "e2e_p95": {"predicted": 1.3 * p95}})
    levels.append((None, float("inf"), 4, {"e2e_p95": 99.0}))  # a backlog is left out
    same.append({"rate": None, "e2e_p95": {"predicted": 99.0}})
    slower.append({"rate": None, "e2e_p95": {"predicted": 99.0}})

    report = _knee_report(
        levels,
        {"path": (model, shape), "all_levels": (model, shape)},
        {"path": same, "all_levels": slower},
        mix,
        targets,
        args,
    )

    assert report["target_ms"] == 500 and report["measured_where"] == "within"
    assert report["measured_rps"] == pytest.approx(knee, rel=0.1)
    p, c = report["predicted"]["P"], report["predicted"]["C"]
    assert p["at_levels_rps"] == pytest.approx(report["measured_rps"])
    assert p["error_pct"] == pytest.approx(0, abs=1e-6)
    assert c["at_levels_rps"] < report["measured_rps"] and c["error_pct"] < 0
    assert p["levels_length_rps"] == pytest.approx(knee)
    assert 0 < p["steady_rps"] <= p["levels_length_rps"] * 1.05
    out = capsys.readouterr().out
    assert "the knee for p95 500 ms between the levels: measured" in out
    assert f"P: at the same levels {report['measured_rps']:.2f} (+0%)" in out

    # No level meets the target: the knee is below them all.
    missed = [(f, r, s, {"e2e_p95": 9.0}) for f, r, s, _ in levels]
    report = _knee_report(missed, {"path": (model, shape)}, {"path": slower}, mix, targets, args)
    assert report["measured_rps"] is None and report["measured_where"] == "below"
    assert "measured below the levels" in capsys.readouterr().out


def test_the_path_has_room_in_its_queue_for_a_whole_level(settings):
    """A level above the knee queues up to all its arrivals, which the simulation admits: the
    API process the bench starts must not refuse them with the tenant's 429 (a run of 1,200
    arrivals a level once stopped there), and an operator's larger limit stays."""
    from argparse import Namespace

    from routing.bench.capacity import queue_room

    settings.FAIRLANE_MAX_QUEUE_PER_TENANT = 256
    assert queue_room(Namespace(requests=1200, ramp=150)) == 1200
    assert queue_room(Namespace(requests=150, ramp=300)) == 300
    settings.FAIRLANE_MAX_QUEUE_PER_TENANT = 5000
    assert queue_room(Namespace(requests=1200, ramp=150)) == 5000
