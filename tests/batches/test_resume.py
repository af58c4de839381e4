"""A batch survives its process: the API server running it is killed with SIGKILL mid-batch
and another is started; the batch finishes, every line answered exactly once (one output
line per input line across the two files) and charged at most once (ledger rows = the lines
answered 200, plus any whose answer was lost after its charge)."""

import io
import json
import signal
import time

import openai
import pytest

from routing.batch_models import Batch, BatchLine, LineState
from tenants.models import UsageRecord
from tests.conftest import child_env
from tests.servers import AsgiServer

pytestmark = pytest.mark.django_db(transaction=True)
LINES = 60


def _server(files_dir):
    return AsgiServer(
        child_env(
            FAIRLANE_ENGINE_MODE="embedded",
            FAIRLANE_FILES_DIR=str(files_dir),
            FAIRLANE_BATCH_POLL_SECONDS="0.2",
            FAIRLANE_BATCH_IN_FLIGHT="4",
            # A dead runner's claims and holds lapse quickly, so the test is short.
            FAIRLANE_BATCH_CLAIM_SECONDS="3",
            FAIRLANE_RESERVATION_TTL_SECONDS="4",
        )
    )


def _wait(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(what)


def test_api_killed_mid_batch_then_restarted(key, budget, tmp_path):
    first = _server(tmp_path)
    try:
        client = openai.OpenAI(api_key=key, base_url=first.url + "/v1", max_retries=0)
        lines = [
            {
                "custom_id": f"c{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": "tiny",
                    "messages": [{"role": "user", "content": f"line {i}"}],
                    "max_tokens": 8,
                },
            }
            for i in range(LINES)
        ]
        data = "".join(json.dumps(x) + "\n" for x in lines).encode()
        file_id = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch").id
        batch_id = client.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
        ).id
        _wait(
            lambda: BatchLine.objects.filter(batch_id=batch_id, state=LineState.DONE).count() >= 8,
            120,
            "the batch never got going",
        )
    finally:
        first.stop(sig=signal.SIGKILL)
    assert Batch.objects.get(pk=batch_id).status == "in_progress"
    second = _server(tmp_path)
    try:
        client = openai.OpenAI(api_key=key, base_url=second.url + "/v1", max_retries=0)
        _wait(
            lambda: Batch.objects.get(pk=batch_id).status == "completed",
            180,
            "the batch did not finish after the restart",
        )
        batch = client.batches.retrieve(batch_id)
        outputs = [
            json.loads(x) for x in client.files.content(batch.output_file_id).read().splitlines()
        ]
        errors = (
            [json.loads(x) for x in client.files.content(batch.error_file_id).read().splitlines()]
            if batch.error_file_id
            else []
        )
    finally:
        second.stop()
    answered = [o["custom_id"] for o in outputs + errors]
    assert sorted(answered) == sorted(f"c{i}" for i in range(LINES))  # each exactly once
    assert {e["error"]["code"] for e in errors} <= {"answer_lost"}
    rows = UsageRecord.objects.filter(request_id__startswith=batch_id + "-")
    assert rows.count() == len(outputs) + len(errors)
    assert {r.request_id for r in rows} >= {o["response"]["request_id"] for o in outputs}
    assert batch.request_counts.completed + batch.request_counts.failed == LINES
