"""Files and batches as OpenAI's objects."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from routing.batch_models import Batch, StoredFile


def _epoch(at: datetime | None) -> int | None:
    return int(at.timestamp()) if at is not None else None


def file_object(row: StoredFile) -> dict[str, Any]:
    return {
        "id": row.id,
        "object": "file",
        "bytes": row.num_bytes,
        "created_at": _epoch(row.created_at),
        "expires_at": _epoch(row.expires_at),
        "filename": row.filename,
        "purpose": row.purpose,
        "status": "processed",
        "status_details": None,
    }


def batch_object(batch: Batch) -> dict[str, Any]:
    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "errors": {"object": "list", "data": batch.errors} if batch.errors else None,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": batch.status,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": _epoch(batch.created_at),
        "in_progress_at": _epoch(batch.in_progress_at),
        "expires_at": _epoch(batch.expires_at),
        "finalizing_at": _epoch(batch.finalizing_at),
        "completed_at": _epoch(batch.completed_at),
        "failed_at": _epoch(batch.failed_at),
        "expired_at": _epoch(batch.expired_at),
        "cancelling_at": _epoch(batch.cancelling_at),
        "cancelled_at": _epoch(batch.cancelled_at),
        "request_counts": {
            "total": batch.total,
            "completed": batch.completed,
            "failed": batch.failed,
        },
        "metadata": batch.metadata or None,
    }


def list_object(data: list[dict[str, Any]], *, has_more: bool) -> dict[str, Any]:
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }
