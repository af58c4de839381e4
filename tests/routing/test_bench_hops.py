"""`manage.py bench hops` as a user runs it, in both modes: one real chat completion, and the
stacks of our functions at each point of its path (the probes must still name live code: a
probe left on a moved function records nothing, and this fails)."""

import json
import subprocess
import sys
import uuid

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _hops(env: dict, *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "manage.py", "bench", "hops", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_bench_hops_counts_the_embedded_path(subprocess_env):
    figures = _hops({**subprocess_env, "FAIRLANE_ENGINE_MODE": "embedded"})
    assert figures["mode"] == "embedded" and figures["status"] == 200
    assert set(figures["per_point"]) == {"admit", "engine", "answer", "settle"}
    assert all(count > 0 for count in figures["per_point"].values())
    assert figures["per_point"]["engine"] <= 12 and figures["per_point"]["answer"] <= 12


def test_bench_hops_counts_the_distributed_path_across_api_and_worker(subprocess_env):
    figures = _hops(
        {**subprocess_env, "FAIRLANE_QUEUE_NAMESPACE": f"h{uuid.uuid4().hex[:8]}-"}, "--distributed"
    )
    assert figures["mode"] == "distributed" and figures["status"] == 200
    assert set(figures["per_point"]) == {
        "admit",
        "enqueue",
        "engine",
        "answer",
        "receive",
        "settle",
    }
    assert all(count > 0 for count in figures["per_point"].values())
    assert figures["threads"] >= 3  # the API's loop and pool, and the worker's run thread
