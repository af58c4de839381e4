"""The audit log: who changed what, when, from where, with the state before and after.

Records are append-only (a PostgreSQL trigger refuses UPDATE and DELETE but for the retention
role) and form one hash chain per tenant and one for the platform: each record holds the hash
of the one before it in its chain. The chain's head (its last seq and hash) is kept beside it
and locked by every writer, so two writers never fork a chain; checkpoints sign every head at
once with the platform's Ed25519 key (tenants/services/audit/)."""

from django.db import models

from tenants.models.tenancy import Tenant

PLATFORM_CHAIN = "platform"
GENESIS_HASH = "0" * 64


def chain_name(tenant_id: int | None) -> str:
    return PLATFORM_CHAIN if tenant_id is None else f"tenant:{tenant_id}"


class AuditRecord(models.Model):
    """One change. No foreign key can cascade into it: the tenant is kept without a database
    constraint (its record outlives it) and actors are named, not referenced."""

    class ActorType(models.TextChoices):
        USER = "user"
        API_KEY = "api_key"
        COMMAND = "command"
        SCIM = "scim"
        SYSTEM = "system"

    chain = models.CharField(max_length=40)
    seq = models.BigIntegerField()
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)
    created_at = models.DateTimeField()
    tenant = models.ForeignKey(
        Tenant,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    tenant_slug = models.CharField(max_length=63, blank=True, default="")
    actor_type = models.CharField(max_length=16, choices=ActorType.choices)
    actor_id = models.CharField(max_length=80, blank=True, default="")
    actor = models.CharField(max_length=200, blank=True, default="")  # username, key prefix...
    source = models.CharField(max_length=16, blank=True, default="")  # portal, api, admin...
    action = models.CharField(max_length=60)
    object_type = models.CharField(max_length=40)
    object_id = models.CharField(max_length=80, blank=True, default="")
    object_repr = models.CharField(max_length=200, blank=True, default="")
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    request_id = models.CharField(max_length=64, blank=True, default="")
    trace_id = models.CharField(max_length=32, blank=True, default="")
    ip = models.CharField(max_length=45, blank=True, default="")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["chain", "seq"], name="audit_chain_seq")]
        indexes = [
            models.Index(fields=["tenant", "-created_at"], name="audit_tenant_time"),
            models.Index(fields=["created_at"], name="audit_time"),
        ]
        ordering = ["-created_at", "-seq"]

    def __str__(self) -> str:
        return f"{self.chain}#{self.seq} {self.action} {self.object_type}:{self.object_id}"


class AuditChainHead(models.Model):
    """The last record of a chain, and what retention removed below its first record.
    Writers lock this row (SELECT ... FOR UPDATE) before appending."""

    chain = models.CharField(max_length=40, primary_key=True)
    seq = models.BigIntegerField(default=0)
    hash = models.CharField(max_length=64, default=GENESIS_HASH)
    pruned_seq = models.BigIntegerField(default=0)
    pruned_hash = models.CharField(max_length=64, default=GENESIS_HASH)

    def __str__(self) -> str:
        return f"{self.chain} #{self.seq}"


class AuditCheckpoint(models.Model):
    """Every chain's head at one moment, signed (Ed25519, detached, over `payload`'s exact
    bytes) by the platform's key: a chain rewritten after it no longer matches."""

    created_at = models.DateTimeField()
    payload = models.TextField()  # canonical JSON: {"at": ..., "heads": {chain: [seq, hash]}}
    key_id = models.CharField(max_length=80)
    signature = models.CharField(max_length=200)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"checkpoint of {self.created_at:%Y-%m-%d %H:%M}"
