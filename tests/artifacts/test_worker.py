"""With real processes (a Celery GPU worker and uvicorn on PostgreSQL and Redis): a model whose
files were changed after signing is refused by the worker, which still hosts its other models;
a request for it falls through to another backend, or gets a 503 at once, never a hang."""

import re
import shutil
import time
import uuid

import httpx
import pytest

from routing.backend_store import backend_model_set, backend_register
from routing.bench.fake_vllm import FakeVllm
from tenants.models import Scope
from tenants.services.budgets import budget_create
from tenants.services.keys import api_key_create
from tests.artifacts.conftest import PREDICATE, flip_byte
from tests.conftest import child_env, workers_live
from tests.servers import AsgiServer, CeleryWorker
from workers.artifacts.keys import public_text
from workers.artifacts.signing import model_sign
from workers.models import ModelVerification
from workers.serving.registration import model_register

pytestmark = pytest.mark.django_db(transaction=True)


def signed_copy(pristine, path, key):
    shutil.copytree(pristine, path)
    model_sign(path, key, **PREDICATE)
    return path


def chat(server, key, model):
    return httpx.post(
        server.url + "/v1/chat/completions",
        timeout=60,
        headers={"Authorization": f"Bearer {key}"},
        json={
            "model": model,
            "max_tokens": 3,
            "messages": [{"role": "user", "content": "hello there"}],
        },
    )


def test_a_worker_refuses_a_tampered_model_and_requests_for_it_never_hang(
    trusted, pristine, tmp_path, tenant, agent
):
    key = trusted
    for name in ("good", "bad", "lonely"):
        model_register(name=name, source=str(signed_copy(pristine, tmp_path / name, key)))
    flip_byte(tmp_path / "bad" / "model.safetensors")  # after registration: on the disk
    flip_byte(tmp_path / "lonely" / "model.safetensors")
    budget_create(tenant=tenant, agent=agent, limit_microcents=10**9)
    api = api_key_create(tenant=tenant, agent=agent, scopes=[Scope.INFERENCE])[1]
    env = child_env(
        FAIRLANE_ENGINE_MODE="celery",
        FAIRLANE_HEARTBEAT_SECONDS="1",
        FAIRLANE_QUEUE_NAMESPACE=f"t{uuid.uuid4().hex[:8]}-",
        FAIRLANE_MODEL_SIGNATURES="require",
        FAIRLANE_TRUSTED_KEYS=public_text(key.public_key()),
        FAIRLANE_FIRST_EVENT_TIMEOUT_SECONDS="5",
    )
    with FakeVllm("served-elsewhere", reply_tokens=3) as vllm:
        backend = backend_register(
            name="vllm-fallback", kind="openai_compatible", base_url=vllm.url
        )
        backend_model_set(backend=backend, model="bad", upstream_name=vllm.model)
        worker = CeleryWorker(env)
        server = AsgiServer(env)
        try:
            deadline = time.monotonic() + 60
            while not any("good" in beat["models"] for beat in workers_live()):
                assert time.monotonic() < deadline, worker.output()[-3000:]
                time.sleep(0.2)
            hosted = {m for beat in workers_live() for m in beat["models"]}
            assert {"bad", "lonely"}.isdisjoint(hosted)
            log = worker.output()
            assert "refusing to load bad" in log and "hash_mismatch" in log

            good = chat(server, api, "good")
            assert good.status_code == 200 and good.headers["x-fairlane-backend"] == "local"

            fell = chat(server, api, "bad")  # the worker does not host it: next backend
            assert fell.status_code == 200, fell.text
            assert fell.headers["x-fairlane-backend"] == "vllm-fallback"
            assert fell.json()["choices"][0]["message"]["content"] == "t0 t1 t2 "

            started = time.monotonic()
            alone = chat(server, api, "lonely")  # no other backend: a 503 at once, not a wait
            assert alone.status_code == 503, alone.text
            assert alone.json()["error"]["code"] == "backend_unavailable"
            assert "retry-after" in alone.headers
            assert time.monotonic() - started < 4  # well inside the 5 s first-event timeout
            assert str(tmp_path) not in alone.text

            metrics = httpx.get(server.url + "/metrics").text
            count = re.search(
                r'fairlane_model_verify_failures_total\{model="bad",'
                r'reason="hash_mismatch"\} (\S+)',
                metrics,
            )
            assert count and float(count[1]) >= 1
            checks = {c.model.name: c.status for c in ModelVerification.objects.all()}
            assert checks == {"good": "verified", "bad": "refused", "lonely": "refused"}
            assert worker.proc.poll() is None
        finally:
            server.stop()
            worker.stop()
