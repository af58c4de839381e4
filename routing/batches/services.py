"""Batches (services and selectors): create, retrieve, list and cancel for the API; what a
batch cost so far, the batches a runner has work for, and the bulk lane's backlog. A batch
goes validating -> in_progress -> finalizing -> completed, or failed, expired, cancelling ->
cancelled; the runner's steps over its lines are in routing/batches/lines.py."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import Count, Q, QuerySet, Sum
from django.utils import timezone

from routing.admission import Caller
from routing.batch_models import BATCH_FINAL, Batch, BatchLine, BatchStatus, FilePurpose, LineState
from routing.batches.endpoints import ENDPOINTS
from routing.batches.files import file_get, storable
from tenants.errors import InvalidRequest, NotFound
from tenants.models import Tenant, UsageRecord

WINDOWS = {"24h": timedelta(hours=24)}
MAX_METADATA_KEYS = 16


def _metadata_clean(metadata: Any) -> dict[str, str]:
    if metadata is None:
        return {}
    if (
        not isinstance(metadata, dict)
        or len(metadata) > MAX_METADATA_KEYS
        or not all(
            isinstance(k, str)
            and isinstance(v, str)
            and len(k) <= 64
            and len(v) <= 512
            and storable(k + v)  # a JSON column (jsonb) holds no NUL
            for k, v in metadata.items()
        )
    ):
        raise InvalidRequest(
            "'metadata' must be an object of up to 16 string keys (64 characters) and string "
            "values (512 characters), without NUL characters.",
            param="metadata",
        )
    return metadata


def batch_create(*, caller: Caller, body: Any) -> Batch:
    """A batch of `input_file_id`'s lines against `endpoint`, validated by the runner next."""
    if not isinstance(body, dict):
        raise InvalidRequest("The body must be a JSON object.")
    unknown = set(body) - {"input_file_id", "endpoint", "completion_window", "metadata"}
    if unknown:
        raise InvalidRequest(
            f"Unknown parameter: '{sorted(unknown)[0]}'.", param=sorted(unknown)[0]
        )
    endpoint = body.get("endpoint")
    if not isinstance(endpoint, str) or endpoint not in ENDPOINTS:
        raise InvalidRequest(f"'endpoint' must be one of {', '.join(ENDPOINTS)}.", param="endpoint")
    window = body.get("completion_window")
    if not isinstance(window, str) or window not in WINDOWS:
        raise InvalidRequest("'completion_window' must be '24h'.", param="completion_window")
    file_id = body.get("input_file_id")
    if not isinstance(file_id, str):
        raise InvalidRequest("'input_file_id' must be a file's id.", param="input_file_id")
    input_file = file_get(tenant=caller.tenant, file_id=file_id)
    if input_file.purpose != FilePurpose.BATCH:
        raise InvalidRequest(
            f"The file {file_id} has purpose '{input_file.purpose}'; a batch's input must "
            "have purpose 'batch'.",
            param="input_file_id",
        )
    now = timezone.now()
    return Batch.objects.create(
        tenant=caller.tenant,
        agent=caller.agent,
        api_key=caller.api_key,
        endpoint=endpoint,
        input_file=input_file,
        completion_window=window,
        metadata=_metadata_clean(body.get("metadata")),
        created_at=now,
        expires_at=now + WINDOWS[window],
    )


def batch_get(*, tenant: Tenant, batch_id: str) -> Batch:
    batch = Batch.objects.filter(tenant=tenant, pk=batch_id).first() if storable(batch_id) else None
    if batch is None:
        raise NotFound(f"No such Batch object: {batch_id}", param="batch_id")
    return batch


def batch_list(*, tenant: Tenant, after: str = "", limit: int = 20) -> tuple[list[Batch], bool]:
    """A page of the tenant's batches, newest first, after the batch `after`."""
    batches: QuerySet[Batch] = Batch.objects.filter(tenant=tenant).order_by("-created_at", "-id")
    if after:
        cursor = Batch.objects.filter(tenant=tenant, pk=after).first() if storable(after) else None
        if cursor is None:
            raise NotFound(f"No batch '{after}' to list after.", param="after")
        batches = batches.filter(
            Q(created_at__lt=cursor.created_at) | Q(created_at=cursor.created_at, id__lt=cursor.id)
        )
    page = list(batches[: limit + 1])
    return page[:limit], len(page) > limit


def batch_cancel(*, tenant: Tenant, batch_id: str) -> Batch:
    """Stop taking lines: the batch is `cancelling` until its lines in flight end, then
    `cancelled` with the answers it has (a batch at rest is refused)."""
    with transaction.atomic():
        batch = Batch.objects.select_for_update().filter(tenant=tenant, pk=batch_id).first()
        if batch is None:
            raise NotFound(f"No such Batch object: {batch_id}", param="batch_id")
        if batch.status in BATCH_FINAL:
            raise InvalidRequest(f"Cannot cancel a batch that is {batch.status}.", param="batch_id")
        if batch.status != BatchStatus.CANCELLING:
            batch.status, batch.cancelling_at = BatchStatus.CANCELLING, timezone.now()
            batch.save(update_fields=["status", "cancelling_at"])
    return batch


def batch_cost(*, batch: Batch) -> int:
    """What the batch's lines were charged so far (micro-cents): its ledger rows."""
    total = UsageRecord.objects.filter(
        tenant_id=batch.tenant_id, request_id__startswith=batch.id + "-"
    ).aggregate(total=Sum("cost_microcents"))["total"]
    return int(total or 0)


def batches_active() -> list[str]:
    """The ids of the batches some runner has work for, oldest first."""
    return list(
        Batch.objects.exclude(status__in=BATCH_FINAL)
        .order_by("created_at")
        .values_list("id", flat=True)
    )


def batches_backlog() -> list[dict[str, Any]]:
    """The bulk lane's backlog from batches, across tenants (the ops dashboard): per tenant,
    its batches not at rest, their lines waiting to run and those in flight."""
    rows = (
        BatchLine.objects.filter(
            batch__status__in=(BatchStatus.IN_PROGRESS, BatchStatus.CANCELLING),
            state__in=(LineState.PENDING, LineState.RUNNING),
        )
        .values("batch__tenant__slug")
        .annotate(
            batches=Count("batch", distinct=True),
            waiting=Count("pk", filter=Q(state=LineState.PENDING)),
            running=Count("pk", filter=Q(state=LineState.RUNNING)),
        )
        .order_by("-waiting")
    )
    return [
        {
            "tenant": row["batch__tenant__slug"],
            "batches": row["batches"],
            "waiting": row["waiting"],
            "running": row["running"],
        }
        for row in rows
    ]
