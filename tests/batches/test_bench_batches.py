"""`manage.py bench batches` as a user runs it, small: one embedded server, an interactive
client alone and then beside a batch through the official SDK; the figures it prints are
complete and name the bulk lane's setting (structure, not speed)."""

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_bench_batches_reports_both_phases_and_the_setting(subprocess_env, tmp_path):
    out = tmp_path / "batches.json"
    done = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "bench",
            "batches",
            "--lines",
            "12",
            "--requests",
            "3",
            "--max-tokens",
            "4",
            "--bulk-beside",
            "2",
            "--json-out",
            str(out),
        ],
        cwd=ROOT,
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures == json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["bulk_beside"] == "2" and "bulk sequences beside interactive: 2" in done.stdout
    assert figures["batch_status"] == "completed"
    assert (figures["batch_completed"], figures["batch_failed"]) == (12, 0)
    assert figures["alone_p95_ms"] > 0 and figures["under_batch_p95_ms"] > 0
    assert figures["p95_ratio_under_over_alone"] == pytest.approx(
        figures["under_batch_p95_ms"] / figures["alone_p95_ms"], rel=0.01
    )
