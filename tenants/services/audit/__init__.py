"""The audit log (docs/security.md, "Audit log"): every change made through the portal, the
management API, the admin, SCIM and management commands is recorded here, by the service that
makes it: `audit_change(action, obj, before=snapshot(obj))` after the change (snapshot taken
before it), or `audit_record(...)` for a change that is not one object's. Records form a hash
chain per tenant and one for the platform; `audit_verify` finds any tampering."""

from tenants.services.audit.checkpoint import audit_checkpoint_write, checkpoint_parts
from tenants.services.audit.context import (
    AuditContext,
    audit_context,
    audit_context_current,
    command_context,
    request_context,
    with_actor,
)
from tenants.services.audit.record import audit_change, audit_record, canonical, record_hash
from tenants.services.audit.snapshot import MASK, masked, snapshot
from tenants.services.audit.verify import Problem, audit_verify

__all__ = [
    "MASK",
    "AuditContext",
    "Problem",
    "audit_change",
    "audit_checkpoint_write",
    "audit_context",
    "audit_context_current",
    "audit_record",
    "audit_verify",
    "canonical",
    "checkpoint_parts",
    "command_context",
    "masked",
    "record_hash",
    "request_context",
    "snapshot",
    "with_actor",
]
