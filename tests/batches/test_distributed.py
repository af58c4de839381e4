"""Batches in the distributed mode: the API process's runner feeds the lines through the Redis
fair queue to a real Celery GPU worker. Then the chaos: the worker is killed with SIGKILL
mid-batch and the API process too; a new worker and API finish the batch, every line answered
exactly once and charged at most once (ledger rows = the lines answered 200, plus those whose
answer was lost after their charge: `answer_lost`)."""

import io
import json
import signal
import time
import uuid

import openai
import pytest

from routing.batch_models import Batch, BatchLine, LineState
from tenants.models import UsageRecord
from tests.conftest import child_env
from tests.servers import AsgiServer, CeleryWorker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _env(tmp_path):
    return child_env(
        FAIRLANE_ENGINE_MODE="distributed",
        FAIRLANE_QUEUE_NAMESPACE=f"b{uuid.uuid4().hex[:8]}-",
        FAIRLANE_FILES_DIR=str(tmp_path),
        FAIRLANE_HEARTBEAT_SECONDS="1",
        FAIRLANE_HEARTBEAT_TTL_SECONDS="3",
        FAIRLANE_CLAIM_SECONDS="3",
        FAIRLANE_BATCH_POLL_SECONDS="0.2",
        FAIRLANE_BATCH_IN_FLIGHT="4",
        FAIRLANE_BATCH_CLAIM_SECONDS="3",
        # Longer than a lapsed queue claim plus a resumed run: a run whose API died is
        # settled by the worker that resumes it before its hold could lapse.
        FAIRLANE_RESERVATION_TTL_SECONDS="30",
    )


def _lines(n: int, max_tokens: int = 8) -> bytes:
    return "".join(
        json.dumps(
            {
                "custom_id": f"d{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": "tiny",
                    "messages": [{"role": "user", "content": f"line {i}"}],
                    "max_tokens": max_tokens,
                },
            }
        )
        + "\n"
        for i in range(n)
    ).encode()


def _wait(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(what)


def _files(client, batch) -> tuple[list[dict], list[dict]]:
    def read(file_id):
        if file_id is None:
            return []
        return [json.loads(x) for x in client.files.content(file_id).read().splitlines()]

    return read(batch.output_file_id), read(batch.error_file_id)


def test_a_batch_on_a_celery_worker(key, budget, tmp_path):
    env = _env(tmp_path)
    worker = CeleryWorker(env, name="batches", concurrency=8)
    server = AsgiServer(env)
    try:
        client = openai.OpenAI(api_key=key, base_url=server.url + "/v1", max_retries=0)
        file_id = client.files.create(file=("in.jsonl", io.BytesIO(_lines(12))), purpose="batch").id
        batch = client.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        _wait(lambda: client.batches.retrieve(batch.id).status == "completed", 180, "not completed")
        done = client.batches.retrieve(batch.id)
        outputs, errors = _files(client, done)
        assert errors == [] and len(outputs) == 12
        assert all(o["response"]["status_code"] == 200 for o in outputs)
        assert [b.id for b in client.batches.list()] == [batch.id]
        # A second batch cancelled at once: cancelled, its lines answered once in all.
        other = client.batches.create(
            input_file_id=client.files.create(
                file=("in.jsonl", io.BytesIO(_lines(30, 16))), purpose="batch"
            ).id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
        )
        _wait(lambda: client.batches.retrieve(other.id).status == "in_progress", 60, "not running")
        assert client.batches.cancel(other.id).status == "cancelling"
        _wait(lambda: client.batches.retrieve(other.id).status == "cancelled", 120, "not cancelled")
        outputs, errors = _files(client, client.batches.retrieve(other.id))
        assert len(outputs) + len(errors) == 30
    finally:
        server.stop()
        worker.stop()
    rows = UsageRecord.objects.filter(request_id__startswith=batch.id + "-")
    assert rows.count() == 12


def test_worker_and_api_killed_mid_batch(key, budget, tmp_path):
    env = _env(tmp_path)
    lines = 40
    worker = CeleryWorker(env, name="doomed", concurrency=8)
    server = AsgiServer(env)
    try:
        client = openai.OpenAI(api_key=key, base_url=server.url + "/v1", max_retries=0)
        file_id = client.files.create(
            file=("in.jsonl", io.BytesIO(_lines(lines, 16))), purpose="batch"
        ).id
        batch_id = client.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
        ).id
        _wait(
            lambda: BatchLine.objects.filter(batch_id=batch_id, state=LineState.DONE).count() >= 6,
            180,
            "the batch never got going",
        )
    finally:
        worker.stop(signal.SIGKILL)
        server.stop(signal.SIGKILL)
    assert Batch.objects.get(pk=batch_id).status == "in_progress"
    worker = CeleryWorker(env, name="heir", concurrency=8)
    server = AsgiServer(env)
    try:
        client = openai.OpenAI(api_key=key, base_url=server.url + "/v1", max_retries=0)
        _wait(
            lambda: Batch.objects.get(pk=batch_id).status == "completed",
            240,
            "the batch did not finish after the restart",
        )
        done = client.batches.retrieve(batch_id)
        outputs, errors = _files(client, done)
    finally:
        server.stop()
        worker.stop()
    answered = sorted(o["custom_id"] for o in outputs + errors)
    assert answered == sorted(f"d{i}" for i in range(lines))  # each exactly once
    assert {e["error"]["code"] for e in errors} <= {"answer_lost"}
    rows = list(UsageRecord.objects.filter(request_id__startswith=batch_id + "-"))
    keys = [r.request_id.rpartition("-")[0] for r in rows]
    assert len(keys) == len(set(keys))  # no line charged twice
    assert len(rows) == len(outputs) + len(errors)
