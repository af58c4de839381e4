"""Files and batches (OpenAI's Files and Batch APIs): a tenant's uploaded files, whose bytes
live in the files storage (routing/batches/storage.py), and its batches, each a file of
requests run on the bulk lane as ordinary requests of the agent that created it, one
`BatchLine` per input line so that a batch survives its processes (each line is run and
charged once, keyed by the batch and its `custom_id`)."""

from __future__ import annotations

import secrets

from django.db import models

from tenants.models import Agent, ApiKey, Tenant


def _file_id() -> str:
    return "file-" + secrets.token_hex(12)


def _batch_id() -> str:
    return "batch_" + secrets.token_hex(12)


class FilePurpose(models.TextChoices):
    BATCH = "batch"
    BATCH_OUTPUT = "batch_output"
    USER_DATA = "user_data"


class StoredFile(models.Model):
    """A tenant's file: its name and size here, its bytes in the files storage under
    `storage_name`. Uploaded (`batch`, `user_data`) or written by a batch (`batch_output`)."""

    id = models.CharField(primary_key=True, max_length=40, default=_file_id, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="files")
    filename = models.CharField(max_length=255)
    purpose = models.CharField(max_length=16, choices=FilePurpose.choices)
    num_bytes = models.BigIntegerField(default=0)
    storage_name = models.CharField(max_length=300)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["tenant", "purpose", "created_at"], name="file_tenant")]

    def __str__(self) -> str:
        return f"{self.id} ({self.filename})"


class BatchStatus(models.TextChoices):
    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


# Where a batch is at rest: nothing more will happen to it.
BATCH_FINAL = (
    BatchStatus.FAILED,
    BatchStatus.COMPLETED,
    BatchStatus.EXPIRED,
    BatchStatus.CANCELLED,
)


class Batch(models.Model):
    """A batch: `input_file`'s lines, run against `endpoint` for `agent` (through the key that
    created it), within `completion_window`. The timestamps are OpenAI's (`*_at`)."""

    id = models.CharField(primary_key=True, max_length=40, default=_batch_id, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="batches")
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="batches")
    api_key = models.ForeignKey(
        ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    endpoint = models.CharField(max_length=64)
    input_file = models.ForeignKey(
        StoredFile, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    output_file = models.ForeignKey(
        StoredFile, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    error_file = models.ForeignKey(
        StoredFile, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    completion_window = models.CharField(max_length=8, default="24h")
    status = models.CharField(
        max_length=16, choices=BatchStatus.choices, default=BatchStatus.VALIDATING
    )
    metadata = models.JSONField(default=dict, blank=True)
    # Validation errors (OpenAI's `errors.data`): [{code, message, param, line}].
    errors = models.JSONField(default=list, blank=True)
    total = models.PositiveIntegerField(default=0)
    completed = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    in_progress_at = models.DateTimeField(null=True, blank=True)
    finalizing_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)
    cancelling_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["tenant", "created_at"], name="batch_tenant"),
            models.Index(fields=["status"], name="batch_status"),
        ]

    def __str__(self) -> str:
        return self.id


class LineState(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"  # claimed by a runner until `claimed_until`
    DONE = "done"  # answered: `status_code` and `body` (the output file)
    ERROR = "error"  # not answered by the endpoint: `error` (the error file)


class BatchLine(models.Model):
    """One input line: its request (`body`) and, once run, its answer. Unique per batch and
    `custom_id`. Its runs' request ids (the ledger's) are its `key` (the batch id, then a
    digest of the custom_id) and the attempt: a run is started only when no earlier attempt
    can still be charged, so a line is charged once whatever process runs it."""

    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="lines")
    index = models.PositiveIntegerField()
    custom_id = models.CharField(max_length=512)
    key = models.CharField(max_length=60, unique=True)
    attempts = models.PositiveSmallIntegerField(default=0)  # runs started so far
    # The request's and the answer's JSON as text: PostgreSQL's jsonb cannot hold a \u0000,
    # which a model's answer (or a client's prompt) may.
    body = models.TextField()
    state = models.CharField(max_length=8, choices=LineState.choices, default=LineState.PENDING)
    claimed_until = models.DateTimeField(null=True, blank=True)
    status_code = models.PositiveSmallIntegerField(default=0)
    response = models.TextField(blank=True, default="")
    error = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["batch", "index"]
        constraints = [
            models.UniqueConstraint(fields=["batch", "custom_id"], name="batch_line_custom_id")
        ]
        indexes = [models.Index(fields=["batch", "state", "index"], name="batch_line_state")]

    def __str__(self) -> str:
        return f"{self.batch_id} line {self.index + 1}"

    @property
    def request_id(self) -> str:
        """The request id of its latest run (attempts counts from 1)."""
        return f"{self.key}-{self.attempts}"
