"""The tenancy core: tenants and their members, agents, API keys, budgets and the usage ledger.

Money is integer micro-cents everywhere (1 USD = 100 cents = 100,000,000 micro-cents), never
floats: a price of $0.15 per million tokens is 15 micro-cents per token.
"""

import functools
import uuid
import zoneinfo

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q

MICROCENTS_PER_CENT = 1_000_000
MICROCENTS_PER_USD = 100 * MICROCENTS_PER_CENT
# Largest amount accepted anywhere (USD 10M): far above any real budget, far below int64.
MAX_MICROCENTS = 10_000_000 * MICROCENTS_PER_USD

name_validator = RegexValidator(
    r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
    "Use letters, digits, '.', '_' or '-', starting with a letter or digit.",
)


@functools.cache
def timezone_names() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())  # scans tzdata: once per process


def validate_timezone(value: str) -> None:
    if value not in timezone_names():
        raise ValidationError(f"Unknown IANA time zone {value!r}.")


class Lane(models.TextChoices):
    """The fair queue's lanes, the first served first: the fair queue, the workers and their
    engines all take their order from this declaration."""

    REALTIME = "realtime"
    STANDARD = "standard"
    BULK = "bulk"


class RateLimits(models.Model):
    """Requests per minute, tokens per minute (prompt plus the most a request may generate)
    and requests at once; empty means no limit at this level."""

    rpm_limit = models.PositiveIntegerField(null=True, blank=True)
    tpm_limit = models.PositiveIntegerField(null=True, blank=True)
    concurrency_limit = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        abstract = True

    @property
    def rate_limits(self) -> tuple[int, int, int]:
        return self.rpm_limit or 0, self.tpm_limit or 0, self.concurrency_limit or 0


class Tenant(RateLimits):
    """An organisation using the platform: it owns members, agents, keys and budgets."""

    class Status(models.TextChoices):
        ACTIVE = "active"
        SUSPENDED = "suspended"

    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=63, unique=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    timezone = models.CharField(max_length=64, default="UTC", validators=[validate_timezone])
    # Fair-share weight in the GPU queue; an operator's decision, not the tenant's.
    weight = models.PositiveIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(1000)]
    )
    default_lane = models.CharField(max_length=16, choices=Lane.choices, default=Lane.STANDARD)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug

    @property
    def is_active(self) -> bool:
        return self.status == self.Status.ACTIVE


class Role(models.TextChoices):
    OWNER = "owner"
    ADMIN = "admin"
    MEMBER = "member"
    VIEWER = "viewer"


ROLE_RANK = {Role.VIEWER: 1, Role.MEMBER: 2, Role.ADMIN: 3, Role.OWNER: 4}


class Membership(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "tenant"], name="membership_unique")]
        ordering = ["tenant", "user"]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant} ({self.role})"


class Agent(RateLimits):
    """A tenant's named consumer of the API (the design notes' "Akh"), with its own budget,
    allowed models and lane."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="agents")
    name = models.CharField(max_length=100, validators=[name_validator])
    description = models.CharField(max_length=500, blank=True, default="")
    # Empty: every model the platform serves.
    allowed_models = models.JSONField(default=list, blank=True)
    # Empty: the tenant's default lane.
    lane = models.CharField(max_length=16, choices=Lane.choices, blank=True, default="")
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="agent_name_unique")]
        ordering = ["tenant", "name"]

    def __str__(self) -> str:
        return f"{self.tenant.slug}/{self.name}"

    @property
    def effective_lane(self) -> str:
        return self.lane or self.tenant.default_lane

    def may_use_model(self, model: str) -> bool:
        return not self.allowed_models or model in self.allowed_models


class Scope(models.TextChoices):
    INFERENCE = "inference"  # the /v1 API
    MANAGEMENT_READ = "management.read"  # read the management API (as a viewer)
    MANAGEMENT_WRITE = "management.write"  # change it (as an admin)


class ApiKey(RateLimits):
    """A secret an agent authenticates with. Only a keyed hash of it is stored; the plain key
    (`fl-<key_id>-<secret>`) is shown once, at creation."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100, blank=True, default="")
    key_id = models.CharField(max_length=16, unique=True, editable=False)
    secret_hash = models.CharField(max_length=64, editable=False)
    scopes = models.JSONField(default=list)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    rotated_from = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="rotated_to")

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return self.prefix

    @property
    def prefix(self) -> str:
        """The visible, loggable part of the key."""
        return f"fl-{self.key_id}"

    def is_usable_at(self, now) -> bool:
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > now)


class Period(models.TextChoices):
    DAILY = "daily"
    WEEKLY = "weekly"
    MONTHLY = "monthly"


class Budget(models.Model):
    """A spending limit per window for an agent, or for the whole tenant when agent is empty.
    Windows start at midnight in the tenant's time zone (weeks on Monday, months on the 1st)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="budgets")
    agent = models.ForeignKey(Agent, null=True, blank=True, on_delete=models.CASCADE,
                              related_name="budgets")
    period = models.CharField(max_length=16, choices=Period.choices, default=Period.DAILY)
    limit_microcents = models.BigIntegerField(
        validators=[MinValueValidator(0), MaxValueValidator(MAX_MICROCENTS)]
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "agent"], condition=Q(agent__isnull=False),
                                    name="budget_one_per_agent"),
            models.UniqueConstraint(fields=["tenant"], condition=Q(agent__isnull=True),
                                    name="budget_one_per_tenant"),
        ]
        ordering = ["tenant", "agent"]

    def __str__(self) -> str:
        owner = self.agent.name if self.agent_id else "tenant"
        return f"{self.tenant.slug}/{owner} {self.period}"


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
            models.CheckConstraint(condition=Q(reserved_microcents__gte=0),
                                   name="window_reserved_gte_0"),
        ]
        ordering = ["budget", "-start"]


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
    api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="+")
    amount_microcents = models.BigIntegerField()
    agent_window = models.ForeignKey(BudgetWindow, null=True, blank=True,
                                     on_delete=models.SET_NULL, related_name="+")
    tenant_window = models.ForeignKey(BudgetWindow, null=True, blank=True,
                                      on_delete=models.SET_NULL, related_name="+")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.HELD)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField(db_index=True)
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]


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
    api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="+")
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
            models.Index(fields=["trace_id"], name="usage_trace",
                         condition=~models.Q(trace_id="")),
        ]

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


# Budget alerts (rules, their state per window, fired alerts, destinations, deliveries).
from tenants.alert_models import (  # noqa: E402, F401
    AlertDelivery, AlertDestination, AlertEvent, AlertEventName, AlertRule, AlertState,
)
