"""Request logs: the prompt and answer of a tenant's requests, kept only when the tenant turns
them on, redacted before storage, encrypted at rest, and deleted after the tenant's retention
(tenants/services/request_logs/)."""

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from tenants.models.tenancy import Tenant

MAX_RETENTION_DAYS = 365


class RequestLogPolicy(models.Model):
    """A tenant's choice: whether request content is kept (off unless a tenant's admin turns
    it on), for how long, and what is redacted beyond secrets (always redacted)."""

    tenant = models.OneToOneField(
        Tenant, on_delete=models.CASCADE, primary_key=True, related_name="request_log_policy"
    )
    enabled = models.BooleanField(default=False)
    retention_days = models.PositiveIntegerField(
        default=7, validators=[MinValueValidator(1), MaxValueValidator(MAX_RETENTION_DAYS)]
    )
    redact_emails = models.BooleanField(default=True)
    redact_numbers = models.BooleanField(default=False)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        state = "on" if self.enabled else "off"
        return f"request logs {state} ({self.retention_days} days)"


class RequestLog(models.Model):
    """One request's content beside its ledger row (same request id): its messages or prompt,
    tools, output and finish reasons, as one Fernet token (`content`); only the model and the
    endpoint are readable without the key."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="request_logs")
    request_id = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField()
    endpoint = models.CharField(max_length=20)
    model = models.CharField(max_length=200)
    content = models.BinaryField()

    class Meta:
        indexes = [models.Index(fields=["tenant", "created_at"], name="request_log_tenant_time")]

    def __str__(self) -> str:
        return f"request log {self.request_id}"
