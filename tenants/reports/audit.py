"""Reading the audit log: a tenant's own records (its admins, in the portal) or the whole
platform's (operators, in the ops dashboard), filtered from the query string, a page at a
time, or exported whole as JSON Lines or CSV, streamed a chunk at a time."""

from __future__ import annotations

import csv
import json
from datetime import datetime, time, timedelta

from asgiref.sync import sync_to_async
from django import forms
from django.db.models import Q, QuerySet
from django.utils import timezone

from tenants.models import PLATFORM_CHAIN, AuditRecord, Tenant

PAGE_SIZE = 50
EXPORT_CHUNK = 1000
COLUMNS = [
    "id",
    "created_at",
    "tenant",
    "chain",
    "seq",
    "actor_type",
    "actor",
    "actor_id",
    "source",
    "action",
    "object_type",
    "object_id",
    "object_repr",
    "before",
    "after",
    "request_id",
    "trace_id",
    "ip",
    "prev_hash",
    "hash",
]


class AuditQuery(forms.Form):
    since = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    action = forms.CharField(required=False, max_length=60)
    actor = forms.CharField(required=False, max_length=200)
    object_type = forms.CharField(required=False, max_length=40)
    object_id = forms.CharField(required=False, max_length=80)
    request_id = forms.CharField(required=False, max_length=64)
    tenant = forms.CharField(required=False, max_length=63)  # the ops page only

    def clean(self):
        data = super().clean()
        if data.get("since") and data.get("until") and data["since"] > data["until"]:
            raise forms.ValidationError("The start date is after the end date.")
        return data


def audit_query(params) -> tuple[AuditQuery, dict]:
    form = AuditQuery(params or None)
    return form, (form.cleaned_data if form.is_bound and form.is_valid() else {})


def _filtered(records: QuerySet, data: dict, tz) -> QuerySet:
    if data.get("since"):
        records = records.filter(created_at__gte=datetime.combine(data["since"], time(0), tz))
    if data.get("until"):
        end = datetime.combine(data["until"] + timedelta(days=1), time(0), tz)
        records = records.filter(created_at__lt=end)
    if data.get("action"):
        records = records.filter(action__startswith=data["action"])
    if data.get("actor"):
        records = records.filter(Q(actor__icontains=data["actor"]) | Q(actor_id=data["actor"]))
    for field in ("object_type", "object_id", "request_id"):
        if data.get(field):
            records = records.filter(**{field: data[field]})
    return records.order_by("-created_at", "-id")


def audit_records(*, tenant: Tenant, data: dict) -> QuerySet[AuditRecord]:
    """The tenant's own records, never another's (its chain only)."""
    return _filtered(
        AuditRecord.objects.filter(tenant=tenant), data, timezone.get_current_timezone()
    )


def audit_records_platform(*, data: dict) -> QuerySet[AuditRecord]:
    """Every record (operators): `tenant` filters by slug, "platform" for platform-wide."""
    records = AuditRecord.objects.all()
    if data.get("tenant") == PLATFORM_CHAIN:
        records = records.filter(chain=PLATFORM_CHAIN)
    elif data.get("tenant"):
        records = records.filter(tenant_slug=data["tenant"])
    return _filtered(records, data, timezone.get_current_timezone())


def record_dict(record: AuditRecord) -> dict:
    return {
        "id": record.id,
        "created_at": record.created_at.isoformat(),
        "tenant": record.tenant_slug or None,
        "chain": record.chain,
        "seq": record.seq,
        "actor_type": record.actor_type,
        "actor": record.actor,
        "actor_id": record.actor_id,
        "source": record.source,
        "action": record.action,
        "object_type": record.object_type,
        "object_id": record.object_id,
        "object_repr": record.object_repr,
        "before": record.before,
        "after": record.after,
        "request_id": record.request_id,
        "trace_id": record.trace_id,
        "ip": record.ip,
        "prev_hash": record.prev_hash,
        "hash": record.hash,
    }


def _chunk(records: QuerySet, after: tuple | None) -> list[AuditRecord]:
    if after is not None:
        records = records.filter(
            Q(created_at__lt=after[0]) | Q(created_at=after[0], id__lt=after[1])
        )
    return list(records[:EXPORT_CHUNK])


class _Echo:
    def write(self, value: str) -> str:
        return value


async def _chunks(records: QuerySet):
    after = None
    while True:
        chunk = await sync_to_async(_chunk)(records, after)
        yield chunk
        if len(chunk) < EXPORT_CHUNK:
            return
        after = (chunk[-1].created_at, chunk[-1].id)


async def jsonl_stream(records: QuerySet):
    async for chunk in _chunks(records):
        yield "".join(json.dumps(record_dict(r), ensure_ascii=False) + "\n" for r in chunk)


def _cell(value) -> str:
    if isinstance(value, dict | list):
        value = json.dumps(value, sort_keys=True, ensure_ascii=False)
    text = "" if value is None else str(value)
    # A spreadsheet would run a cell starting with one of these as a formula.
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


async def csv_stream(records: QuerySet):
    writer = csv.writer(_Echo())
    yield writer.writerow(COLUMNS)
    async for chunk in _chunks(records):
        yield "".join(writer.writerow([_cell(record_dict(r)[c]) for c in COLUMNS]) for r in chunk)
