"""Budgets, their windows, the reservations held against them, and the usage ledger.

Money is integer micro-cents everywhere (1 USD = 100 cents = 100,000,000 micro-cents), never
floats: a price of $0.15 per million tokens is 15 micro-cents per token.
"""

import uuid

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from tenants.models.tenancy import Agent, ApiKey, Tenant

MICROCENTS_PER_CENT = 1_000_000
MICROCENTS_PER_USD = 100 * MICROCENTS_PER_CENT
# Largest amount accepted anywhere (USD 10M): far above any real budget, far below int64.
MAX_MICROCENTS = 10_000_000 * MICROCENTS_PER_USD


class Period(models.TextChoices):
    DAILY = "daily"
    WEEKLY = "weekly"
    MONTHLY = "monthly"


class SoftAction(models.TextChoices):
    """What a budget does once its window's spent + reserved reaches its soft level."""

    ALERT = "alert"  # only the alert
    DEMOTE = "demote"  # new requests run on the bulk lane until the window resets
    THROTTLE = "throttle"  # new requests are limited to soft_rpm requests per minute


class Budget(models.Model):
    """A spending limit per window for an agent, or for the whole tenant when agent is empty.
    Windows start at midnight in the tenant's time zone (weeks on Monday, months on the 1st).
    An optional soft level below the limit slows its owner down instead of refusing
    (`soft_action`); the limit itself still refuses."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="budgets")
    agent = models.ForeignKey(
        Agent, null=True, blank=True, on_delete=models.CASCADE, related_name="budgets"
    )
    period = models.CharField(max_length=16, choices=Period.choices, default=Period.DAILY)
    limit_microcents = models.BigIntegerField(
        validators=[MinValueValidator(0), MaxValueValidator(MAX_MICROCENTS)]
    )
    soft_limit_microcents = models.BigIntegerField(
        null=True, blank=True, validators=[MinValueValidator(0), MaxValueValidator(MAX_MICROCENTS)]
    )
    soft_action = models.CharField(
        max_length=16, choices=SoftAction.choices, default=SoftAction.ALERT
    )
    soft_rpm = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(1_000_000)]
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(soft_limit_microcents__isnull=True)
                | Q(soft_limit_microcents__lte=models.F("limit_microcents")),
                name="budget_soft_lte_limit",
            ),
            models.UniqueConstraint(
                fields=["tenant", "agent"],
                condition=Q(agent__isnull=False),
                name="budget_one_per_agent",
            ),
            models.UniqueConstraint(
                fields=["tenant"], condition=Q(agent__isnull=True), name="budget_one_per_tenant"
            ),
        ]
        ordering = ["tenant", "agent"]

    def __str__(self) -> str:
        owner = self.agent.name if self.agent else "tenant"
        return f"{self.tenant.slug}/{owner} {self.period}"

    def soft_crossed(self, used_microcents: int) -> str:
        """The soft action in force when a window has `used_microcents` spent and reserved:
        "" below the soft level (or with none)."""
        soft = self.soft_limit_microcents
        return self.soft_action if soft is not None and used_microcents >= soft else ""

    def clean(self) -> None:
        errors = {}
        soft = self.soft_limit_microcents
        if soft is not None and self.limit_microcents is not None and soft > self.limit_microcents:
            errors["soft_limit_microcents"] = "The soft limit must not exceed the limit."
        if self.soft_action == SoftAction.THROTTLE and not self.soft_rpm:
            errors["soft_rpm"] = "A throttling soft limit needs soft_rpm (requests per minute)."
        if errors:
            raise ValidationError(errors)


class BudgetWindow(models.Model):
    """One window of a budget: what was spent (settled) and what is reserved by requests in
    flight. A window row is created on first use, so resets need no job and survive restarts."""

    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="windows")
    start = models.DateTimeField()
    end = models.DateTimeField()
    spent_microcents = models.BigIntegerField(default=0)
    reserved_microcents = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["budget", "start"], name="budget_window_unique"),
            models.CheckConstraint(condition=Q(spent_microcents__gte=0), name="window_spent_gte_0"),
            models.CheckConstraint(
                condition=Q(reserved_microcents__gte=0), name="window_reserved_gte_0"
            ),
        ]
        ordering = ["budget", "-start"]

    def __str__(self) -> str:
        return f"{self.start:%Y-%m-%d %H:%M}-{self.end:%Y-%m-%d %H:%M}"


class Reservation(models.Model):
    """The worst-case cost of one request, held against the agent's and tenant's current
    windows until the request is settled (actual cost charged, the rest freed) or released."""

    class Status(models.TextChoices):
        HELD = "held"
        SETTLED = "settled"
        RELEASED = "released"
        EXPIRED = "expired"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    request_id = models.CharField(max_length=64, unique=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="reservations")
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="reservations")
    api_key = models.ForeignKey(
        ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    amount_microcents = models.BigIntegerField()
    agent_window = models.ForeignKey(
        BudgetWindow, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    tenant_window = models.ForeignKey(
        BudgetWindow, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.HELD)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField(db_index=True)
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.request_id


class UsageRecord(models.Model):
    """The ledger: one row per request, written once (request_id is unique). `cost_microcents`
    is what was charged to the budgets; `unbilled_microcents` what the request cost beyond
    the room its budgets had left (never charged past a limit; normally 0)."""

    class Status(models.TextChoices):
        OK = "ok"
        ERROR = "error"
        CANCELLED = "cancelled"
        TIMEOUT = "timeout"

    request_id = models.CharField(max_length=64, unique=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="usage_records")
    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, related_name="usage_records")
    api_key = models.ForeignKey(
        ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    backend = models.CharField(max_length=100, blank=True, default="")
    model = models.CharField(max_length=200, blank=True, default="")
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    cached_tokens = models.PositiveIntegerField(default=0)
    cost_microcents = models.BigIntegerField(default=0)
    unbilled_microcents = models.BigIntegerField(default=0)
    latency_ms = models.PositiveIntegerField(default=0)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OK)
    created_at = models.DateTimeField()  # when it was settled
    # The W3C trace id the request carried (its `traceparent`) or was given: 32 hex digits.
    trace_id = models.CharField(max_length=32, blank=True, default="")
    # Which version of the served model answered (its manifest digest or version label).
    model_version = models.CharField(max_length=100, blank=True, default="")
    # The request's steps as they happened: {step: epoch seconds, ...} plus where it was
    # queued and who took it (routing/trace.py documents the keys).
    timeline = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["tenant", "created_at"], name="usage_tenant_time"),
            models.Index(fields=["agent", "created_at"], name="usage_agent_time"),
            # Operators' figures across tenants (the ops dashboard: top spenders, per model).
            models.Index(fields=["created_at"], name="usage_time"),
            models.Index(fields=["trace_id"], name="usage_trace", condition=~models.Q(trace_id="")),
        ]

    def __str__(self) -> str:
        return self.request_id

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens
