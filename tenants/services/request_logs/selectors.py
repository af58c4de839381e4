"""Request logs' reads, always within one tenant: another tenant's logs do not exist here.
The content is decrypted only for the one log asked for, or for an export."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from asgiref.sync import sync_to_async
from django.db.models import QuerySet

from tenants.errors import NotFound
from tenants.models import RequestLog, Tenant
from tenants.services.request_logs.sealing import InvalidToken, content_open

EXPORT_CHUNK = 500


def request_log_list(*, tenant: Tenant) -> QuerySet[RequestLog]:
    """Newest first, without their content."""
    return RequestLog.objects.filter(tenant=tenant).defer("content").order_by("-created_at", "-pk")


def request_log_get(*, tenant: Tenant, request_id: str) -> RequestLog:
    log = RequestLog.objects.filter(tenant=tenant, request_id=request_id).first()
    if log is None:
        raise NotFound(f"No request log for request {request_id}.")
    return log


def request_log_content(log: RequestLog) -> dict:
    """The stored content, decrypted; what is said instead when no configured key opens it."""
    try:
        return content_open(log.content)
    except InvalidToken:
        return {"error": "This log was encrypted with a key that is no longer configured."}


def request_log_json(log: RequestLog) -> dict:
    return {
        "request_id": log.request_id,
        "created_at": log.created_at.isoformat(),
        "endpoint": log.endpoint,
        "model": log.model,
        **request_log_content(log),
    }


def _chunk(tenant: Tenant, after: int) -> list[RequestLog]:
    return list(
        RequestLog.objects.filter(tenant=tenant, pk__gt=after).order_by("pk")[:EXPORT_CHUNK]
    )


async def request_logs_jsonl(*, tenant: Tenant) -> AsyncIterator[str]:
    """Every log of the tenant as JSON Lines, oldest first, a chunk at a time."""
    after = 0
    while True:
        chunk = await sync_to_async(_chunk)(tenant, after)
        if not chunk:
            return
        yield "".join(json.dumps(request_log_json(log), ensure_ascii=False) + "\n" for log in chunk)
        after = chunk[-1].pk
