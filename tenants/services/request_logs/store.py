"""Request logs' writes: a tenant's policy (its admins'), one request's content written beside
its ledger row (only while the policy is on, read at the moment of writing, so turning it off
stops storage at once), everything of a tenant's deleted in one audited action, retention, and
re-encryption under a new key."""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db import close_old_connections, transaction
from django.utils import timezone

from tenants.errors import InvalidRequest
from tenants.loops import BackgroundLoop
from tenants.models import MAX_RETENTION_DAYS, RequestLog, RequestLogPolicy, Tenant
from tenants.services.audit import audit_change, audit_record, snapshot
from tenants.services.request_logs.redaction import Redaction, content_redact
from tenants.services.request_logs.sealing import content_reseal, content_seal

logger = logging.getLogger(__name__)
ROTATE_CHUNK = 500
# Tenants found not keeping logs, until when (monotonic): their requests skip the database for
# FAIRLANE_REQUEST_LOG_OFF_CACHE_SECONDS. Only "off" is remembered: a tenant keeping logs is
# read again for every request, so turning them off stops storage at once.
_off_until: dict[int, float] = {}


def request_logs_known_off(*, tenant_id: int) -> bool:
    """Whether this process saw, moments ago, that the tenant keeps no logs (no database)."""
    return _off_until.get(tenant_id, 0.0) > time.monotonic()


def request_log_policy_get(*, tenant: Tenant) -> RequestLogPolicy:
    """The tenant's policy; an unsaved one (off) when it never chose."""
    return RequestLogPolicy.objects.filter(tenant=tenant).first() or RequestLogPolicy(tenant=tenant)


def request_log_policy_set(
    *,
    tenant: Tenant,
    enabled: bool,
    retention_days: int,
    redact_emails: bool,
    redact_numbers: bool,
) -> RequestLogPolicy:
    """Turn request logs on or off and choose their retention and redaction (audited)."""
    if not 1 <= retention_days <= MAX_RETENTION_DAYS:
        raise InvalidRequest(
            f"retention_days must be between 1 and {MAX_RETENTION_DAYS}.", param="retention_days"
        )
    with transaction.atomic():
        policy = RequestLogPolicy.objects.select_for_update().filter(tenant=tenant).first()
        before = snapshot(policy) if policy is not None else None
        policy = policy or RequestLogPolicy(tenant=tenant)
        policy.enabled, policy.retention_days = enabled, retention_days
        policy.redact_emails, policy.redact_numbers = redact_emails, redact_numbers
        policy.save()
        audit_change("request_logs.policy", policy, before=before, tenant=tenant)
    _off_until.pop(tenant.pk, None)
    return policy


def request_log_write(
    *,
    tenant_id: int,
    request_id: str,
    endpoint: str,
    model: str,
    content: dict,
    now: datetime | None = None,
) -> bool:
    """Keep one request's content, redacted then encrypted, when its tenant's logs are on.
    Once per request id (a cascade's replayed answer is the same request). True: stored."""
    policy = RequestLogPolicy.objects.filter(tenant_id=tenant_id, enabled=True).first()
    if policy is None:
        _off_until[tenant_id] = time.monotonic() + settings.FAIRLANE_REQUEST_LOG_OFF_CACHE_SECONDS
        return False
    redaction = Redaction(emails=policy.redact_emails, numbers=policy.redact_numbers)
    sealed = content_seal(content_redact(content, redaction))
    created = RequestLog.objects.bulk_create(
        [
            RequestLog(
                tenant_id=tenant_id,
                request_id=request_id,
                created_at=now or timezone.now(),
                endpoint=endpoint[:20],
                model=model[:200],
                content=sealed,
            )
        ],
        ignore_conflicts=True,
    )
    return bool(created)


def request_logs_delete_all(*, tenant: Tenant) -> int:
    """Delete every request log of the tenant, in one action recorded in its audit log."""
    with transaction.atomic():
        deleted, _ = RequestLog.objects.filter(tenant=tenant).delete()
        audit_record(
            action="request_logs.delete_all",
            object_type="requestlog",
            tenant=tenant,
            after={"deleted": deleted},
            object_repr=f"all request logs of {tenant.slug}",
        )
    return deleted


def request_logs_expire(*, now: datetime | None = None) -> int:
    """Delete the logs older than their tenant's retention. Returns how many went."""
    now = now or timezone.now()
    deleted = 0
    for tenant_id, days in RequestLogPolicy.objects.values_list("tenant_id", "retention_days"):
        gone, _ = RequestLog.objects.filter(
            tenant_id=tenant_id, created_at__lt=now - timedelta(days=days)
        ).delete()
        deleted += gone
    if deleted:
        logger.info("request logs: %d past their tenants' retention deleted", deleted)
    return deleted


def request_logs_rotate() -> int:
    """Re-encrypt every stored log under the first of FAIRLANE_REQUEST_LOG_KEYS, a chunk at a
    time (after which the old key can be dropped). Returns how many were re-encrypted."""
    done, after = 0, 0
    while True:
        chunk = list(
            RequestLog.objects.filter(pk__gt=after)
            .order_by("pk")
            .only("pk", "content")[:ROTATE_CHUNK]
        )
        if not chunk:
            return done
        for log in chunk:
            log.content = content_reseal(log.content)
        RequestLog.objects.bulk_update(chunk, ["content"])
        done += len(chunk)
        after = chunk[-1].pk


class RequestLogExpirer:
    """The embedded runtime's retention: a loop of the server process that runs
    `request_logs_expire` every FAIRLANE_REQUEST_LOG_SWEEP_SECONDS (the beat does it in the
    distributed mode)."""

    def __init__(self) -> None:
        self.loop = BackgroundLoop(
            "request-log-expirer",
            self._step,
            interval=lambda: float(settings.FAIRLANE_REQUEST_LOG_SWEEP_SECONDS),
        )

    def _step(self) -> None:
        try:
            request_logs_expire()
        finally:
            close_old_connections()
