"""Request logs (docs/security.md, "Request logs"): opt-in per tenant, the prompt and answer of
each request kept beside its ledger row, redacted before storage (redaction.py), encrypted at
rest (sealing.py), deleted after the tenant's retention (store.py)."""

from tenants.services.request_logs.redaction import Redaction, content_redact, image_hash
from tenants.services.request_logs.sealing import content_open, content_seal
from tenants.services.request_logs.selectors import (
    request_log_content,
    request_log_get,
    request_log_json,
    request_log_list,
    request_logs_jsonl,
)
from tenants.services.request_logs.store import (
    RequestLogExpirer,
    request_log_policy_get,
    request_log_policy_set,
    request_log_write,
    request_logs_delete_all,
    request_logs_expire,
    request_logs_known_off,
    request_logs_rotate,
)

__all__ = [
    "Redaction",
    "RequestLogExpirer",
    "content_open",
    "content_redact",
    "content_seal",
    "image_hash",
    "request_log_content",
    "request_log_get",
    "request_log_json",
    "request_log_list",
    "request_log_policy_get",
    "request_log_policy_set",
    "request_log_write",
    "request_logs_delete_all",
    "request_logs_expire",
    "request_logs_jsonl",
    "request_logs_known_off",
    "request_logs_rotate",
]
