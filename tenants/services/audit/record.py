"""Writing a record: appended to its chain (the tenant's, or the platform's) under a lock on
the chain's head row, in the caller's transaction, so a change and its record are committed
together or not at all, and two writers to one chain never both take the same place."""

from __future__ import annotations

import hashlib
import json

from django.db import models, transaction
from django.utils import timezone

from tenants.models import AuditChainHead, AuditRecord, Tenant, chain_name
from tenants.services.audit.context import actor_of, audit_context_current
from tenants.services.audit.snapshot import diff, masked, snapshot

# The fields a record's hash covers, in this order; `hash` itself is the sha256 of their
# canonical JSON (sorted keys, no spaces, UTF-8).
HASHED = (
    "chain",
    "seq",
    "prev_hash",
    "created_at",
    "tenant_id",
    "tenant_slug",
    "actor_type",
    "actor_id",
    "actor",
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
)


def canonical(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def record_hash(fields: dict) -> str:
    body = {name: fields[name] for name in HASHED}
    body["created_at"] = fields["created_at"].isoformat(timespec="microseconds")
    return hashlib.sha256(canonical(body)).hexdigest()


def row_fields(record: AuditRecord) -> dict:
    return {name: getattr(record, name) for name in HASHED}


def _head_locked(chain: str) -> AuditChainHead:
    AuditChainHead.objects.bulk_create([AuditChainHead(chain=chain)], ignore_conflicts=True)
    return AuditChainHead.objects.select_for_update().get(chain=chain)


def audit_record(
    *,
    action: str,
    object_type: str,
    object_id="",
    tenant: Tenant | None,
    before: dict | None = None,
    after: dict | None = None,
    object_repr: str = "",
) -> AuditRecord:
    """Append one record of a change made by the current context's actor."""
    context = audit_context_current()
    actor_type, actor_id, actor = actor_of(context)
    before, after = diff(masked(before), masked(after))
    with transaction.atomic():
        head = _head_locked(chain_name(tenant.pk if tenant else None))
        fields = {
            "chain": head.chain,
            "seq": head.seq + 1,
            "prev_hash": head.hash,
            "created_at": timezone.now(),
            "tenant_id": tenant.pk if tenant else None,
            "tenant_slug": tenant.slug if tenant else "",
            "actor_type": actor_type,
            "actor_id": actor_id,
            "actor": actor,
            "source": context.source,
            "action": action,
            "object_type": object_type,
            "object_id": str(object_id)[:80],
            "object_repr": str(object_repr)[:200],
            "before": before,
            "after": after,
            "request_id": context.request_id,
            "trace_id": context.trace_id,
            "ip": context.ip,
        }
        fields["hash"] = record_hash(fields)
        record = AuditRecord.objects.create(**fields)
        head.seq, head.hash = record.seq, record.hash
        head.save(update_fields=["seq", "hash"])
    return record


def _tenant_of(obj: models.Model) -> Tenant | None:
    if isinstance(obj, Tenant):
        return obj
    tenant_id = getattr(obj, "tenant_id", None)
    if tenant_id is None and hasattr(obj, "agent"):  # e.g. an agent's routing
        tenant_id = getattr(obj.agent, "tenant_id", None)
    if tenant_id is None:
        return None
    cached = getattr(obj, "tenant", None) if hasattr(obj, "tenant_id") else None
    return cached if isinstance(cached, Tenant) else Tenant.objects.filter(pk=tenant_id).first()


def audit_change(
    action: str,
    obj: models.Model,
    *,
    before: dict | None = None,
    deleted: bool = False,
    tenant: Tenant | None = None,
) -> AuditRecord | None:
    """Record a change of a model instance: `before` is `snapshot(obj)` taken before it (None
    for a creation); `deleted`: the object is gone (its last state is `before`). The tenant is
    the object's own (its `tenant`, or its agent's), else the platform's chain."""
    after = None if deleted else snapshot(obj)
    if before is not None and after == before:
        return None  # nothing changed: nothing to record
    return audit_record(
        action=action,
        object_type=obj._meta.model_name or "",
        object_id=obj.pk if obj.pk is not None else "",
        tenant=tenant or _tenant_of(obj),
        before=before,
        after=after,
        object_repr=str(obj),
    )
