"""Budget alerts: the rules a budget is watched by, each rule's state in each window (so a
crossing fires exactly once), the alerts that fired, where they are sent, and every delivery.
"""

import uuid

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from tenants.models.budgets import Budget
from tenants.models.tenancy import Agent, Tenant

# A budget without rules of its own is watched by these: 50, 80 and 100 % of actual spend,
# and the forecast (projected to run out before the window ends at the trailing run-rate).
DEFAULT_THRESHOLDS = (50, 80, 100)
FORECAST = "forecast"


def threshold_rule(percent: int) -> str:
    return f"threshold:{percent}"


class AlertEventName(models.TextChoices):
    """LiteLLM's budget alert events, so receivers written for it work."""

    BUDGET_CROSSED = "budget_crossed"  # spend reached 100 % (or more) of the limit
    THRESHOLD_CROSSED = "threshold_crossed"  # spend reached a lower threshold
    PROJECTED_LIMIT_EXCEEDED = "projected_limit_exceeded"  # runs out before the window ends


class AlertRule(models.Model):
    """One rule of a budget: a threshold (percent of the limit actually spent) or the
    forecast. A budget with no rows is watched by the defaults; one `off` row silences it."""

    class Kind(models.TextChoices):
        THRESHOLD = "threshold"
        FORECAST = "forecast"
        OFF = "off"

    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="alert_rules")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    percent = models.PositiveSmallIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(1000)]
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["budget", "kind", "percent"], name="alert_rule_unique")
        ]
        ordering = ["budget", "kind", "percent"]

    def __str__(self) -> str:
        return f"{self.kind} {self.percent} %"

    @property
    def key(self) -> str:
        return FORECAST if self.kind == self.Kind.FORECAST else threshold_rule(self.percent or 0)


class AlertState(models.Model):
    """A rule in one window of a budget: OK until the rule holds, then ALARM. Only the write
    that turns OK into ALARM fires, so a crossing fires once however many settlements see it.
    It re-arms in the next window (a new row), or when the limit is raised above the mark."""

    class State(models.TextChoices):
        OK = "ok"
        ALARM = "alarm"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="alert_states")
    window_start = models.DateTimeField()
    rule = models.CharField(max_length=32)
    state = models.CharField(max_length=8, choices=State.choices, default=State.OK)
    # The limit when it fired: a raised limit re-arms the rule.
    limit_microcents = models.BigIntegerField(default=0)
    changed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["budget", "window_start", "rule"], name="alert_state_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.rule}: {self.state}"


class AlertEvent(models.Model):
    """An alert that fired: what, for whom (the tenant, or one of its agents), and when."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="alert_events")
    budget = models.ForeignKey(
        Budget, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    agent = models.ForeignKey(
        Agent, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    event = models.CharField(max_length=32, choices=AlertEventName.choices)
    rule = models.CharField(max_length=32)
    period = models.CharField(max_length=16)
    window_start = models.DateTimeField()
    window_end = models.DateTimeField()
    spent_microcents = models.BigIntegerField()
    limit_microcents = models.BigIntegerField()
    projected_at = models.DateTimeField(null=True, blank=True)
    projected_spend_microcents = models.BigIntegerField(null=True, blank=True)
    message = models.CharField(max_length=300)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["tenant", "created_at"], name="alert_event_tenant_time"),
            models.Index(fields=["created_at"], name="alert_event_time"),
        ]

    def __str__(self) -> str:
        return f"{self.event} ({self.rule})"


class AlertDestination(models.Model):
    """Where alerts go: an email address or a webhook URL, of one tenant (set in its portal)
    or, with no tenant, of the platform (set by operators: every tenant's alerts)."""

    class Kind(models.TextChoices):
        EMAIL = "email"
        WEBHOOK = "webhook"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="alert_destinations"
    )
    kind = models.CharField(max_length=16, choices=Kind.choices)
    target = models.CharField(max_length=2000)
    # The webhook's signing secret, encrypted (it is needed to sign; shown once).
    secret_encrypted = models.TextField(blank=True, default="", editable=False)
    is_enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["kind", "target"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "kind", "target"],
                condition=models.Q(tenant__isnull=False),
                name="alert_destination_unique",
            ),
            models.UniqueConstraint(
                fields=["kind", "target"],
                condition=models.Q(tenant__isnull=True),
                name="alert_destination_platform_unique",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.target}"


class AlertDelivery(models.Model):
    """One alert to one destination: sent, retried with backoff until delivered or given up,
    every attempt logged."""

    class Status(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"  # gave up after the last retry

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    event = models.ForeignKey(AlertEvent, on_delete=models.CASCADE, related_name="deliveries")
    destination = models.ForeignKey(
        AlertDestination,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="deliveries",
    )
    kind = models.CharField(max_length=16, choices=AlertDestination.Kind.choices)
    target = models.CharField(max_length=2000)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(db_index=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    # [{"at": iso, "ok": bool, "status": http status or null, "error": "..."}], newest last.
    log = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-next_attempt_at"]

    def __str__(self) -> str:
        return f"{self.kind} delivery: {self.status}"
