"""Versions and replica pools with real GPU worker processes and a real API server under a
steady load: a swap, a canary split and a rollback fail no request, each request is answered by
exactly one version (its header, its system_fingerprint and its ledger row agree), the canary
takes its weight, and the swapped-out versions are drained and unloaded without a restart; in a
pool of two workers, one killed fails no request."""

import asyncio
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass

import httpx
import pytest
import redis
from django.conf import settings

from tenants.models import Reservation, Scope, UsageRecord
from tenants.services.budgets import budget_create
from tenants.services.keys import api_key_create
from tests.conftest import child_env, wait_for, workers_live
from tests.servers import AsgiServer, CeleryWorker
from workers.fairqueue import FairQueue
from workers.models import ModelVersion, ServedModel
from workers.serving.registration import model_register
from workers.serving.versions import version_rollback

pytestmark = pytest.mark.django_db(transaction=True)
CACHE = 1.0  # FAIRLANE_ROUTING_CACHE_SECONDS of the API server


@dataclass
class Answer:
    started: float
    status: int
    request_id: str = ""
    version: str = ""
    fingerprint: str | None = None
    backend: str = ""
    text: str = ""


class SteadyLoad:
    """`clients` callers, each sending one short chat after another, each with a prompt of its
    own (so the canary's choice, sticky per conversation, is spread), until stopped."""

    def __init__(self, url: str, key: str, *, clients: int = 16, max_tokens: int = 1) -> None:
        self.url, self.key, self.clients, self.max_tokens = url, key, clients, max_tokens
        self.answers: list[Answer] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def __enter__(self) -> "SteadyLoad":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> list[Answer]:
        self._stop.set()
        self._thread.join(timeout=120)
        return self.answers

    def since(self, moment: float) -> list[Answer]:
        return [a for a in list(self.answers) if a.started > moment]

    async def _run(self) -> None:
        limits = httpx.Limits(max_connections=self.clients + 4)
        async with httpx.AsyncClient(base_url=self.url, timeout=120, limits=limits) as client:
            await asyncio.gather(*(self._caller(client, i) for i in range(self.clients)))

    async def _caller(self, client: httpx.AsyncClient, caller: int) -> None:
        sent = 0
        while not self._stop.is_set():
            sent += 1
            started = time.monotonic()
            body = {
                "model": "tiny",
                "max_tokens": self.max_tokens,
                "messages": [
                    {
                        "role": "user",
                        "content": f"caller {caller} conversation {sent} {uuid.uuid4()}",
                    }
                ],
            }
            try:
                response = await client.post(
                    "/v1/chat/completions",
                    json=body,
                    headers={"Authorization": f"Bearer {self.key}"},
                )
            except httpx.HTTPError as exc:
                self.answers.append(Answer(started, 0, text=f"{type(exc).__name__}: {exc}"))
                continue
            payload = response.json()
            self.answers.append(
                Answer(
                    started,
                    response.status_code,
                    response.headers.get("x-request-id", ""),
                    response.headers.get("x-fairlane-model-version", ""),
                    payload.get("system_fingerprint"),
                    response.headers.get("x-fairlane-backend", ""),
                    "" if response.status_code == 200 else response.text[:300],
                )
            )


def failed(answers: list[Answer]) -> list[Answer]:
    return [a for a in answers if a.status != 200]


def hosted_versions(model: str = "tiny") -> list[set[str]]:
    """Per live worker: the versions of the model it hosts now."""
    return [set(beat.get("versions", {}).get(model, {})) for beat in workers_live()]


def fingerprints() -> dict[str, str]:
    return {
        v.label: "fp_" + v.manifest_digest.rpartition(":")[2][:10]
        for v in ModelVersion.objects.all()
    }


@pytest.fixture
def inference_key(tenant, agent):
    budget_create(tenant=tenant, agent=agent, limit_microcents=10**12)
    return api_key_create(tenant=tenant, agent=agent, scopes=[Scope.INFERENCE])[1]


def pool_env(**extra) -> dict:
    return child_env(
        FAIRLANE_ENGINE_MODE="distributed",
        FAIRLANE_HEARTBEAT_SECONDS="1",
        FAIRLANE_HEARTBEAT_TTL_SECONDS="3",
        FAIRLANE_ENGINE_THREADS="1",
        FAIRLANE_QUEUE_NAMESPACE=f"t{uuid.uuid4().hex[:8]}-",
        **extra,
    )


def test_a_swap_a_canary_and_a_rollback_under_load_fail_nothing(inference_key):
    model_register(name="tiny", source="preset:tiny@1", version="v1")
    # The API routes by a registry snapshot of up to a second, as deployed (and the workers
    # keep a swapped-out version that long after its last request).
    env = pool_env(FAIRLANE_ROUTING_CACHE_SECONDS=str(CACHE))
    worker = CeleryWorker(env, concurrency=4)
    server = AsgiServer(env)
    try:
        with SteadyLoad(server.url, inference_key) as load:
            wait_for(lambda: len(load.answers) >= 20, 60, "the load under way")

            before_swap = list(load.answers)  # answered before it: by v1
            model_register(name="tiny", source="preset:tiny@2", version="v2")  # the swap
            wait_for(lambda: hosted_versions() == [{"v2"}], 60, "v1 drained and unloaded")
            assert worker.proc.poll() is None  # no restart

            model_register(name="tiny", source="preset:tiny@3", version="v3", canary_weight=5)
            canary_at = time.monotonic() + CACHE  # every request started since sees the canary
            wait_for(lambda: len(load.since(canary_at)) >= 1000, 120, "1,000 canary requests")
            assert hosted_versions() == [{"v2", "v3"}]

            canary_until = time.monotonic()
            version_rollback(name="tiny")  # the canary goes
            rolled_at = time.monotonic() + CACHE
            wait_for(lambda: hosted_versions() == [{"v2"}], 60, "v3 drained and unloaded")
            wait_for(lambda: len(load.since(rolled_at)) >= 20, 60, "requests after it")
            answers = load.stop()
        ServedModel.objects.filter(name="tiny").update(is_enabled=False)
        wait_for(lambda: hosted_versions() == [set()], 30, "the disabled model unloaded")
    finally:
        server.stop()
        worker.stop()

    assert not failed(answers), failed(answers)[:5]
    prints = fingerprints()
    for answer in answers:  # one version each: its header, its fingerprint, its ledger row
        assert answer.version in {"v1", "v2", "v3"}
        assert answer.fingerprint == prints[answer.version]
    ledger = dict(UsageRecord.objects.values_list("request_id", "model_version"))
    assert {a.request_id: a.version for a in answers} == {
        a.request_id: ledger[a.request_id] for a in answers
    }
    assert len(ledger) == len(answers)
    assert before_swap and {a.version for a in before_swap} == {"v1"}
    canary = [a for a in answers if canary_at < a.started < canary_until][:1000]
    assert len(canary) == 1000
    share = sum(a.version == "v3" for a in canary) / 10
    assert 2 <= share <= 8, share  # 5 % within 3 points
    assert {a.version for a in canary} == {"v2", "v3"}
    after = [a for a in answers if a.started > rolled_at]
    assert after and {a.version for a in after} == {"v2"}
    assert not Reservation.objects.filter(status=Reservation.Status.HELD).exists()


def test_a_worker_killed_in_a_pool_of_two_fails_no_request(inference_key):
    model_register(name="tiny", source="preset:tiny", min_replicas=2, max_replicas=2)
    env = pool_env(FAIRLANE_CLAIM_SECONDS="2")
    first = CeleryWorker(env, name="first", concurrency=4)
    second = CeleryWorker(env, name="second", concurrency=4)
    server = AsgiServer(env)
    try:
        wait_for(
            lambda: len([b for b in workers_live() if "tiny" in b["models"]]) == 2,
            30,
            "two replicas advertised",
        )
        metrics = httpx.get(server.url + "/metrics").text
        assert 'fairlane_model_replicas{model="tiny"} 2.0' in metrics
        assert 'fairlane_model_replicas_min{model="tiny"} 2.0' in metrics
        with SteadyLoad(server.url, inference_key, max_tokens=16) as load:

            def both_served() -> bool:
                ids = [a.request_id for a in load.answers]
                return (
                    UsageRecord.objects.filter(request_id__in=ids)
                    .values("backend")
                    .distinct()
                    .count()
                    == 2
                )

            wait_for(both_served, 60, "work spread over both replicas")
            # Killed while it runs a request (its claim names it), which the other resumes.
            queue = FairQueue(
                redis.Redis.from_url(settings.REDIS_URL), env["FAIRLANE_QUEUE_NAMESPACE"] + "tiny"
            )

            def first_runs() -> list[str]:
                return [
                    id_.decode()
                    for id_, holder in queue.client.hgetall(queue.prefix + "holder").items()
                    if holder.decode().endswith(f":{first.proc.pid}")
                ]

            def frozen_while_running() -> set[str]:
                # Frozen first, then read: a request it holds and has not settled can only be
                # finished by the other worker (a running one could finish between a read and
                # the kill, as CI once saw). A settlement it sent just before freezing still
                # commits: read after it has.
                os.killpg(first.proc.pid, signal.SIGSTOP)
                time.sleep(0.5)
                held = set(first_runs())
                held -= set(
                    UsageRecord.objects.filter(request_id__in=held).values_list(
                        "request_id", flat=True
                    )
                )
                if not held:
                    os.killpg(first.proc.pid, signal.SIGCONT)
                    time.sleep(0.05)
                return held

            running = wait_for(frozen_while_running, 60, "a request running on the first worker")
            killed_at = time.monotonic()
            first.stop(signal.SIGKILL)
            wait_for(lambda: len(load.since(killed_at)) >= 40, 60, "requests after the kill")
            answers = load.stop()
    finally:
        server.stop()
        first.stop(signal.SIGKILL)
        second.stop()

    assert not failed(answers), failed(answers)[:5]
    assert UsageRecord.objects.filter(
        request_id__in=[a.request_id for a in answers]
    ).count() == len(answers)
    # What the killed worker was running was finished by the other one (its claim lapsed).
    finished_by = dict(
        UsageRecord.objects.filter(request_id__in=running).values_list("request_id", "backend")
    )
    assert set(finished_by) == running, (finished_by, running)
    assert all(b.endswith(f":{second.proc.pid}") for b in finished_by.values()), finished_by
    wait_for(
        lambda: not Reservation.objects.filter(status=Reservation.Status.HELD).exists(),
        30,
        "every hold settled",
    )
