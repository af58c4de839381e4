"""A model that fails to load (a corrupt model directory) never hangs its requests: with real
GPU worker processes, the worker keeps serving its other models, advertises the failure in its
heartbeat (so /v1/models drops the model and the router stops sending it there), answers
requests already queued for it at once, and retries the load with a backoff; a request falls
through to the next backend, or gets 503 with Retry-After."""

import shutil
import time
import uuid

import httpx
import pytest

from routing.backend_store import backend_model_set, backend_register
from routing.bench.fakes import FakeProvider
from tenants.models import Reservation, Scope, UsageRecord
from tenants.services.budgets import budget_create
from tenants.services.keys import api_key_create
from tests.conftest import child_env, wait_for, workers_live
from tests.servers import AsgiServer, CeleryWorker
from workers.serving.catalog import model_dir
from workers.serving.registration import model_register

pytestmark = pytest.mark.django_db(transaction=True)


def corrupt_copy(tmp_path):
    """The tiny preset's config and tokenizer (the API can tokenize for it), unsigned, with a
    well-formed safetensors file that holds none of the model's weights."""
    import torch
    from safetensors.torch import save_file

    path = tmp_path / "broken"
    shutil.copytree(
        model_dir("preset:tiny"), path, ignore=shutil.ignore_patterns("fairlane-manifest.*")
    )
    save_file({"not.a.layer": torch.zeros(4)}, str(path / "model.safetensors"))
    return path


def chat(server, key, model, timeout=60):
    return httpx.post(
        server.url + "/v1/chat/completions",
        timeout=timeout,
        headers={"Authorization": f"Bearer {key}"},
        json={
            "model": model,
            "max_tokens": 3,
            "messages": [{"role": "user", "content": "hello there"}],
        },
    )


def beat_of(model_key: str):
    return next((b for b in workers_live() if b.get(model_key)), None)


def test_a_model_that_fails_to_load_answers_at_once_and_is_retried(
    settings, tmp_path, tenant, agent
):
    settings.FAIRLANE_MODEL_SIGNATURES = "warn"  # unsigned loads: the weights themselves fail
    model_register(name="tiny", source="preset:tiny")
    model_register(name="broken", source=str(corrupt_copy(tmp_path)))
    model_register(name="lonely", source=str(corrupt_copy(tmp_path / "l")))
    budget_create(tenant=tenant, agent=agent, limit_microcents=10**9)
    key = api_key_create(tenant=tenant, agent=agent, scopes=[Scope.INFERENCE])[1]
    env = child_env(
        FAIRLANE_ENGINE_MODE="celery",
        FAIRLANE_HEARTBEAT_SECONDS="1",
        FAIRLANE_QUEUE_NAMESPACE=f"t{uuid.uuid4().hex[:8]}-",
        FAIRLANE_MODEL_SIGNATURES="warn",
    )
    with FakeProvider("openai", reply_tokens=3) as vllm:
        backend = backend_register(
            name="vllm-fallback",
            kind="openai_compatible",
            base_url=vllm.url,
            credential=vllm.api_key,
        )
        backend_model_set(backend=backend, model="broken", upstream_name="fake-model")
        worker = CeleryWorker(env)
        server = AsgiServer(env)
        try:
            deadline = time.monotonic() + 60
            while not (beat := next((b for b in workers_live() if "tiny" in b["models"]), None)):
                assert time.monotonic() < deadline, worker.output()[-3000:]
                time.sleep(0.2)
            assert {"broken", "lonely"} <= set(beat["failed"])
            assert beat["failed"]["lonely"]["attempts"] >= 1
            assert {"broken", "lonely"}.isdisjoint(beat["models"])

            assert chat(server, key, "tiny").status_code == 200  # its other model serves
            fell = chat(server, key, "broken")
            assert fell.status_code == 200 and fell.headers["x-fairlane-backend"] == "vllm-fallback"

            alone = chat(server, key, "lonely", timeout=30)  # never a hang
            assert alone.status_code == 503, alone.text
            assert alone.json()["error"]["code"] == "backend_unavailable"
            assert int(alone.headers["Retry-After"]) >= 1
            assert str(tmp_path) not in alone.text

            listed = httpx.get(
                server.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}
            ).json()["data"]
            assert {m["id"] for m in listed} == {"tiny", "broken"}  # broken: via vllm only

            # The worker keeps retrying, with a backoff (1 s, 2 s, ...), not in a tight loop:
            # the first heartbeat that shows a retry shows a few attempts, not hundreds.
            def retried():
                beat = next(b for b in workers_live() if "tiny" in b["models"])
                attempts = beat["failed"]["lonely"]["attempts"]
                return attempts >= 2 and attempts

            assert wait_for(retried, what="a second attempt at loading the model") <= 5
            assert worker.proc.poll() is None
        finally:
            server.stop()
            worker.stop()
    assert not Reservation.objects.filter(status=Reservation.Status.HELD).exists()
    assert UsageRecord.objects.filter(model="lonely").count() == 0  # nothing ran, nothing billed
