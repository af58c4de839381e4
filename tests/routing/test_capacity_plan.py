"""`manage.py capacity_plan`: with --calibrate it times the real `tiny` engine, fits, plans
and keeps the plan as the model's CapacityFit; without it, it fits the steps the live
workers' engines recorded (here the embedded runtime's), and says so when there are none."""

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from routing.models import CapacityFit
from workers.engine import SamplingParams
from workers.serving.catalog import model_get

pytestmark = pytest.mark.django_db

ARGS = ["--model", "tiny", "--prompt-tokens", "16-128", "--output-tokens", "8-32"]


def plan(*args: str) -> dict:
    out = StringIO()
    call_command("capacity_plan", *ARGS, *args, "--json", "--requests", "300", stdout=out)
    return json.loads(out.getvalue())


def test_calibrate_plans_tiny_end_to_end_and_keeps_the_plan(tiny):
    result = plan("--rate", "5", "--p95-ms", "2000", "--calibrate", "--quick")
    fit = result["step_model"]
    assert result["source"] == "calibrate" and fit["num_samples"] >= 40
    assert fit["base"] >= 0 and fit["per_prefill_token"] > 0
    assert result["max_num_seqs"] == 64 and result["max_num_batched_tokens"] == 1024
    prediction = result["prediction"]
    assert 0 < prediction["ttft_p50"] <= prediction["ttft_p95"]
    assert prediction["ttft_p95"] <= prediction["e2e_p95"]
    knee = result["capacity_rps_per_worker"]
    assert 0 < knee <= result["saturation_rps_per_worker"]
    assert result["workers_needed"] >= 1
    row = CapacityFit.objects.get(model="tiny")
    assert row.source == CapacityFit.Source.CALIBRATE
    assert row.capacity_rps == pytest.approx(knee)
    assert row.step_model["num_samples"] == fit["num_samples"]
    assert row.targets == {"e2e_p95": 2.0, "ttft_p95": None}
    assert row.mix == [
        {"prompt_tokens": [16, 128], "output_tokens": [8, 32], "lane": "standard", "weight": 1.0}
    ]


def served(engine, num: int = 8) -> None:
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    for i in range(num):
        for _ in engine.stream([5 + i] * (10 + 9 * i), params):
            pass


def test_a_rate_beyond_one_worker_needs_more_workers(tiny, embedded):
    # Both plans fit the same recorded steps, so the second one's worker saturates where the
    # first one's does.
    served(embedded.engine_host.load(model_get(name="tiny")))
    light = plan("--rate", "1", "--p95-ms", "2000", "--no-save")
    rate = 2.5 * light["saturation_rps_per_worker"]
    heavy = plan("--rate", f"{rate}", "--p95-ms", "2000", "--no-save")
    assert heavy["saturation_rps_per_worker"] == pytest.approx(light["saturation_rps_per_worker"])
    assert heavy["prediction"]["is_saturated"]  # on the one worker hosting it
    assert heavy["workers_needed"] >= 3
    assert not CapacityFit.objects.exists()


def test_without_calibrate_it_fits_the_steps_the_workers_recorded(tiny, embedded):
    served(embedded.engine_host.load(model_get(name="tiny")))
    result = plan("--rate", "2", "--p95-ms", "3000")
    assert result["source"] == "workers"
    assert result["step_model"]["num_samples"] >= 8 * 12 - 8  # every step of the eight
    assert result["workers"] == 1  # the embedded runtime's one worker hosts tiny
    assert CapacityFit.objects.get(model="tiny").source == CapacityFit.Source.WORKERS


def test_without_samples_it_asks_for_a_calibration(tiny, distributed):
    with pytest.raises(CommandError, match="--calibrate"):
        plan("--rate", "2", "--p95-ms", "3000")


def test_bad_lengths_are_refused(tiny):
    with pytest.raises(CommandError, match="LOW-HIGH"):
        call_command(
            "capacity_plan",
            "--model",
            "tiny",
            "--rate",
            "1",
            "--prompt-tokens",
            "many",
            "--output-tokens",
            "8",
            "--calibrate",
        )


def test_the_refill_of_a_full_workers_slot_comes_from_the_models_recent_ledger(tiny, tenant, agent):
    """The plan leaves a slot freed on a full worker empty as long as the model's requests of
    the last 15 minutes show (their timelines in the ledger); other models' requests, and
    older ones, do not count."""
    from datetime import timedelta

    from django.utils import timezone

    from routing.services.capacity import refill_from_ledger
    from tenants.models import UsageRecord

    def record(model: str, worker: str, queued: float, taken: float, end: float, age_s=0.0):
        UsageRecord.objects.create(
            tenant=tenant,
            agent=agent,
            request_id=f"r-{model}-{worker}-{taken}",
            backend=f"worker:{worker}",
            model=model,
            created_at=timezone.now() - timedelta(seconds=age_s),
            timeline={"worker": worker, "queued": queued, "taken": taken, "last_token": end},
        )

    full = 64 - 2  # tiny's max_num_seqs, less the realtime slots
    for i in range(3):  # a full worker: `full` requests at a time, each end refilled after gap
        for slot in range(full):
            for model, worker, gap, age_s in (
                ("tiny", "w1", 0.02, 0),
                ("small", "w2", 0.07, 0),
                ("tiny", "w3", 0.08, 1200),  # twenty minutes ago
            ):
                start = i * 10 + slot * 0.1 + (gap if i else 0.0)
                record(model, worker, start - 0.5, start, (i + 1) * 10 + slot * 0.1, age_s)
    assert refill_from_ledger(model="tiny", full=full) == pytest.approx(0.02)
    assert refill_from_ledger(model="small", full=full) == pytest.approx(0.07)
    assert refill_from_ledger(model="other", full=full) == 0.0
    result = plan("--rate", "2", "--calibrate", "--quick", "--no-save")
    assert result["refill_s"] == pytest.approx(0.02)
