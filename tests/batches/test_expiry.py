"""A batch whose completion window ends: the lines not yet run are answered `batch_expired`,
and the batch is `expired` with the answers it has (one runner round, in this process)."""

import asyncio
import json
from datetime import timedelta

import pytest
from django.utils import timezone

from routing.batch_models import Batch, BatchLine, BatchStatus, LineState, StoredFile
from routing.batches.files import file_chunks
from routing.batches.runner import BatchRunner
from routing.runtimes import runtime_build

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def files_in_tmp(settings, tmp_path):
    settings.STORAGES = {
        **settings.STORAGES,
        "fairlane_files": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path)},
        },
    }
    return tmp_path


def _lines(row: StoredFile) -> list[dict]:
    return [json.loads(x) for x in b"".join(file_chunks(row=row)).splitlines()]


def test_an_expired_batch_keeps_its_answers_and_expires_the_rest(tenant, agent, files_in_tmp):
    now = timezone.now()
    batch = Batch.objects.create(
        tenant=tenant,
        agent=agent,
        endpoint="/v1/chat/completions",
        status=BatchStatus.IN_PROGRESS,
        total=5,
        completed=2,
        created_at=now - timedelta(hours=25),
        expires_at=now - timedelta(hours=1),
    )
    for i in range(5):
        done = i < 2
        BatchLine.objects.create(
            batch=batch,
            index=i,
            custom_id=f"c{i}",
            key=f"{batch.id}-{i}",
            attempts=1 if done else 0,
            body="{}",
            state=LineState.DONE if done else LineState.PENDING,
            status_code=200 if done else 0,
            response=json.dumps({"object": "chat.completion", "n": i}) if done else "",
        )
    runner = BatchRunner(runtime_build("embedded", redis_url=""))
    asyncio.run(runner.round())
    batch.refresh_from_db()
    assert batch.status == BatchStatus.EXPIRED and batch.expired_at
    assert (batch.completed, batch.failed) == (2, 3)
    outputs, errors = _lines(batch.output_file), _lines(batch.error_file)
    assert [o["custom_id"] for o in outputs] == ["c0", "c1"]
    assert outputs[1]["response"] == {
        "status_code": 200,
        "request_id": f"{batch.id}-1-1",
        "body": {"object": "chat.completion", "n": 1},
    }
    assert [e["custom_id"] for e in errors] == ["c2", "c3", "c4"]
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}
    assert all(e["response"] is None for e in errors)
