"""/v1/files and /v1/batches: OpenAI's Files and Batch APIs. Views authenticate (the same
key as every /v1 request), call one service or selector on a pool thread, and render."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from django.http import HttpRequest, JsonResponse, StreamingHttpResponse

from routing.admission import Caller
from routing.apis import json_body, openai_view
from routing.batch_models import StoredFile
from routing.batches import files as file_services
from routing.batches import services as batch_services
from routing.batches.render import batch_object, file_object, list_object
from routing.batches.storage import files_storage
from routing.batches.uploads import upload_read
from routing.sync import db_call
from tenants.errors import InvalidRequest

CHUNK_BYTES = 64 * 1024


def _limit(request: HttpRequest, *, default: int, most: int) -> int:
    raw = request.GET.get("limit") or str(default)
    try:
        limit = int(raw)
    except ValueError:
        limit = 0
    if not 1 <= limit <= most:
        raise InvalidRequest(f"'limit' must be an integer from 1 to {most}.", param="limit")
    return limit


def _order(request: HttpRequest) -> bool:
    order = request.GET.get("order") or "desc"
    if order not in ("asc", "desc"):
        raise InvalidRequest("'order' must be 'asc' or 'desc'.", param="order")
    return order == "asc"


def _upload(request: HttpRequest, caller: Caller) -> StoredFile:
    fields, upload = upload_read(request)
    purpose = file_services.purpose_clean(fields.get("purpose"))
    try:
        return file_services.file_store(
            tenant=caller.tenant, filename=upload.name or "", purpose=purpose, content=upload
        )
    finally:
        upload.close()  # its temporary file


@openai_view("GET", "POST")
async def files(request, caller):
    if request.method == "POST":
        return JsonResponse(file_object(await db_call(_upload)(request, caller)))
    purpose = request.GET.get("purpose", "")
    rows, has_more = await db_call(file_services.file_list)(
        tenant=caller.tenant,
        purpose=purpose,
        after=request.GET.get("after", ""),
        limit=_limit(request, default=10_000, most=10_000),
        ascending=_order(request),
    )
    return JsonResponse(list_object([file_object(r) for r in rows], has_more=has_more))


@openai_view("GET", "DELETE")
async def file_detail(request, caller, file_id: str):
    if request.method == "DELETE":
        await db_call(file_services.file_delete)(tenant=caller.tenant, file_id=file_id)
        return JsonResponse({"id": file_id, "object": "file", "deleted": True})
    row = await db_call(file_services.file_get)(tenant=caller.tenant, file_id=file_id)
    return JsonResponse(file_object(row))


async def _content(name: str) -> AsyncIterator[bytes]:
    """The stored bytes a chunk at a time, read on a thread (never whole in memory)."""
    handle = await asyncio.to_thread(files_storage().open, name, "rb")
    try:
        while chunk := await asyncio.to_thread(handle.read, CHUNK_BYTES):
            yield chunk
    finally:
        await asyncio.to_thread(handle.close)


@openai_view("GET")
async def file_content(request, caller, file_id: str):
    row = await db_call(file_services.file_get)(tenant=caller.tenant, file_id=file_id)
    return StreamingHttpResponse(
        _content(row.storage_name),
        content_type="application/jsonl"
        if row.filename.endswith(".jsonl")
        else "application/octet-stream",
        headers={
            "Content-Length": str(row.num_bytes),
            "Content-Disposition": 'attachment; filename="{}"'.format(
                row.filename.replace('"', "")
            ),
        },
    )


@openai_view("GET", "POST")
async def batches(request, caller):
    if request.method == "POST":
        batch = await db_call(batch_services.batch_create)(caller=caller, body=json_body(request))
        return JsonResponse(batch_object(batch))
    rows, has_more = await db_call(batch_services.batch_list)(
        tenant=caller.tenant,
        after=request.GET.get("after", ""),
        limit=_limit(request, default=20, most=100),
    )
    return JsonResponse(list_object([batch_object(b) for b in rows], has_more=has_more))


@openai_view("GET")
async def batch_detail(request, caller, batch_id: str):
    batch = await db_call(batch_services.batch_get)(tenant=caller.tenant, batch_id=batch_id)
    return JsonResponse(batch_object(batch))


@openai_view("POST")
async def batch_cancel(request, caller, batch_id: str):
    batch = await db_call(batch_services.batch_cancel)(tenant=caller.tenant, batch_id=batch_id)
    return JsonResponse(batch_object(batch))
