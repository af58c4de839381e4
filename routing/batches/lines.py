"""A batch's lines as the runner (routing/batches/runner.py) takes them: validation into
lines, claims (so runners in several processes share a batch, and a dead runner's lines are
taken over), each line's answer recorded once with the batch's request_counts, the lines not
run closed with an error code, and the output and error files written at the end. Every step
is a database transition that any runner process may take."""

from __future__ import annotations

import json
import tempfile
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.files import File
from django.db import transaction
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from routing.batch_models import (
    BATCH_FINAL,
    Batch,
    BatchLine,
    BatchStatus,
    FilePurpose,
    LineState,
)
from routing.batches.endpoints import ENDPOINTS
from routing.batches.files import file_lines, file_store
from routing.batches.validate import line_key, lines_validate


def batch_validate(*, batch: Batch) -> Batch:
    """Read and check the input file: its lines as `BatchLine`s (in_progress), or the
    batch failed with errors naming the lines. Once (under a lock on the batch)."""
    with transaction.atomic():
        batch = Batch.objects.select_for_update().get(pk=batch.pk)
        if batch.status != BatchStatus.VALIDATING:
            return batch
        now = timezone.now()
        if batch.input_file is None:
            errors = [
                {
                    "code": "file_deleted",
                    "message": "The input file was deleted.",
                    "param": "input_file_id",
                    "line": None,
                }
            ]
            lines: list = []
        else:
            lines, errors = lines_validate(
                file_lines(row=batch.input_file),
                endpoint=ENDPOINTS[batch.endpoint],
                agent=batch.agent,
                max_lines=settings.FAIRLANE_BATCH_MAX_LINES,
            )
        if errors:
            batch.status, batch.failed_at, batch.errors = BatchStatus.FAILED, now, errors
            batch.save(update_fields=["status", "failed_at", "errors"])
            return batch
        BatchLine.objects.bulk_create(
            (
                BatchLine(
                    batch=batch,
                    index=line.index,
                    custom_id=line.custom_id,
                    key=line_key(batch_id=batch.id, custom_id=line.custom_id),
                    body=json.dumps(line.body),
                )
                for line in lines
            ),
            batch_size=1000,
        )
        batch.status, batch.in_progress_at, batch.total = BatchStatus.IN_PROGRESS, now, len(lines)
        batch.save(update_fields=["status", "in_progress_at", "total"])
        return batch


def lines_claim(*, batch: Batch, count: int, now: datetime | None = None) -> list[BatchLine]:
    """Up to `count` lines of the batch for this runner: pending ones, and running ones whose
    runner's claim lapsed (it died), held for FAIRLANE_BATCH_CLAIM_SECONDS."""
    now = now or timezone.now()
    with transaction.atomic():
        lines = list(
            BatchLine.objects.select_for_update(skip_locked=True)
            .filter(batch=batch)
            .filter(Q(state=LineState.PENDING) | Q(state=LineState.RUNNING, claimed_until__lt=now))
            .order_by("index")[:count]
        )
        until = now + timedelta(seconds=settings.FAIRLANE_BATCH_CLAIM_SECONDS)
        for line in lines:
            line.state, line.claimed_until = LineState.RUNNING, until
        BatchLine.objects.bulk_update(lines, ["state", "claimed_until"])
    return lines


def line_release(*, line: BatchLine) -> None:
    """Back to pending (a retryable refusal: the queue is full, a rate limit)."""
    BatchLine.objects.filter(pk=line.pk, state=LineState.RUNNING).update(
        state=LineState.PENDING, claimed_until=None
    )


def line_answer(
    *,
    line: BatchLine,
    status_code: int = 0,
    response: dict | None = None,
    error: dict | None = None,
    attempts: int | None = None,
) -> bool:
    """Record the line's answer once (a line answered already keeps its first), and count it
    in the batch's request_counts in the same transaction."""
    ok = status_code == 200 and error is None
    with transaction.atomic():
        updated = BatchLine.objects.filter(
            pk=line.pk, state__in=(LineState.RUNNING, LineState.PENDING)
        ).update(
            state=LineState.DONE if ok else LineState.ERROR,
            status_code=status_code,
            response=json.dumps(response) if response is not None else "",
            error=error,
            claimed_until=None,
            **({"attempts": attempts} if attempts is not None else {}),
        )
        if updated:
            Batch.objects.filter(pk=line.batch_id).update(
                **({"completed": F("completed") + 1} if ok else {"failed": F("failed") + 1})
            )
    return bool(updated)


def lines_close(*, batch: Batch, code: str, message: str) -> int:
    """Every line not yet run answered with error `code` (budget exhausted, expired,
    cancelled): the error file says so for each. Lines in flight are left to finish."""
    with transaction.atomic():
        closed = BatchLine.objects.filter(batch=batch, state=LineState.PENDING).update(
            state=LineState.ERROR, error={"code": code, "message": message}
        )
        if closed:
            Batch.objects.filter(pk=batch.pk).update(failed=F("failed") + closed)
    return closed


def lines_open(*, batch: Batch) -> int:
    return BatchLine.objects.filter(
        batch=batch, state__in=(LineState.PENDING, LineState.RUNNING)
    ).count()


def _output_line(line: BatchLine, batch: Batch) -> dict[str, Any]:
    response = None
    if line.status_code:
        response = {
            "status_code": line.status_code,
            "request_id": line.request_id,
            "body": json.loads(line.response) if line.response else None,
        }
    return {
        "id": f"batch_req_{line.key.rpartition('-')[2]}",
        "custom_id": line.custom_id,
        "response": response,
        "error": line.error,
    }


def _output_file(batch: Batch, lines: QuerySet[BatchLine], name: str):
    """The lines as a JSONL file of the tenant (written to a temporary file first, then to
    storage in chunks); None when there are none."""
    if not lines.exists():
        return None
    with tempfile.TemporaryFile() as spool:
        for line in lines.iterator(chunk_size=500):
            spool.write(json.dumps(_output_line(line, batch)).encode() + b"\n")
        spool.flush()
        size = spool.tell()
        spool.seek(0)
        content = File(spool, name=name)
        content.size = size
        return file_store(
            tenant=batch.tenant,
            filename=name,
            purpose=FilePurpose.BATCH_OUTPUT,
            content=content,
            quota=False,
        )


def batch_finalize(*, batch: Batch, status: str) -> Batch:
    """Write the output and error files and put the batch at rest (`status`: completed,
    expired or cancelled). Once (under a lock on the batch)."""
    with transaction.atomic():
        batch = Batch.objects.select_for_update().get(pk=batch.pk)
        if batch.status in BATCH_FINAL:
            return batch
        now = timezone.now()
        if batch.finalizing_at is None:
            batch.finalizing_at = now
        lines = BatchLine.objects.filter(batch=batch).order_by("index")
        batch.output_file = _output_file(
            batch, lines.filter(state=LineState.DONE), f"{batch.id}_output.jsonl"
        )
        batch.error_file = _output_file(
            batch, lines.filter(state=LineState.ERROR), f"{batch.id}_error.jsonl"
        )
        batch.status = status
        setattr(batch, f"{status}_at", now)
        batch.save()
        return batch
