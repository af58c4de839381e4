"""Budgets, their windows, the reservations held against them, and the usage ledger.

Money is integer micro-cents everywhere (1 USD = 100 cents = 100,000,000 micro-cents), never
floats: a price of $0.15 per million tokens is 15 micro-cents per token.
"""

import uuid

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from tenants.models.tenancy import Agent, ApiKey, Membership, Tenant

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
    """A spending limit per window, for one scope of a tenant: an agent, an API key, a member
    (the requests made with the keys they created and still own), or the whole tenant when
    none is set; `model_names` narrows it to requests for those models (empty: every model).
    Windows start at midnight in the tenant's time zone (weeks on Monday, months on the 1st).
    An optional soft level below the limit slows its owner down instead of refusing
    (`soft_action`); the limit itself still refuses.

    A request is held against every budget that applies to it, all or none. The agent's and
    the tenant's budgets for every model are its "primary" windows (the reservation's
    agent_window and tenant_window); the others are its extra windows."""

    class Scope(models.TextChoices):
        TENANT = "tenant"
        AGENT = "agent"
        API_KEY = "api_key"
        MEMBER = "member"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="budgets")
    agent = models.ForeignKey(
        Agent, null=True, blank=True, on_delete=models.CASCADE, related_name="budgets"
    )
    api_key = models.ForeignKey(
        ApiKey, null=True, blank=True, on_delete=models.CASCADE, related_name="budgets"
    )
    member = models.ForeignKey(
        Membership, null=True, blank=True, on_delete=models.CASCADE, related_name="budgets"
    )
    # Model names; empty: every model (the API calls it `models`).
    model_names = models.JSONField(default=list, blank=True)
    # The scope, its owner and its models as one string: one budget per (tenant, owner_key).
    owner_key = models.CharField(max_length=600, editable=False, default="")
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
            models.CheckConstraint(
                condition=Q(api_key__isnull=True, member__isnull=True)
                | Q(agent__isnull=True, member__isnull=True)
                | Q(agent__isnull=True, api_key__isnull=True),
                name="budget_one_scope",
            ),
            models.UniqueConstraint(fields=["tenant", "owner_key"], name="budget_one_per_owner"),
        ]
        ordering = ["tenant", "owner_key"]

    def __str__(self) -> str:
        return f"{self.tenant.slug}/{self.owner_label} {self.period}"

    def save(self, *args, **kwargs) -> None:
        self.owner_key = self.owner_key_of()
        super().save(*args, **kwargs)

    def owner_key_of(self) -> str:
        owners: dict[str, object] = {
            self.Scope.AGENT: self.agent_id,
            self.Scope.API_KEY: self.api_key_id,
            self.Scope.MEMBER: self.member_id,
        }
        owner = owners.get(self.scope)
        key = self.scope if owner is None else f"{self.scope}:{owner}"
        return key + (f"|{','.join(sorted(self.model_names))}" if self.model_names else "")

    @property
    def scope(self) -> str:
        if self.agent_id is not None:
            return self.Scope.AGENT
        if self.api_key_id is not None:
            return self.Scope.API_KEY
        if self.member_id is not None:
            return self.Scope.MEMBER
        return self.Scope.TENANT

    @property
    def slot(self) -> str:
        """Where a reservation names this budget's window: "agent", "tenant" (the primary
        windows: those scopes for every model) or "extra"."""
        if self.model_names or self.scope in (self.Scope.API_KEY, self.Scope.MEMBER):
            return "extra"
        return self.scope

    def _owner(self) -> str:
        """ "agent support", "API key fl-ab12", "member mia" or "tenant"."""
        if self.agent is not None:
            return f"agent {self.agent.name}"
        if self.api_key is not None:
            return f"API key {self.api_key.prefix}"
        if self.member is not None:
            return f"member {self.member.user.get_username()}"
        return "tenant"

    @property
    def owner_label(self) -> str:
        """Who the budget is for, in words: "agent support", "API key fl-ab12 (models: big)"."""
        return self._owner() + (
            f" (models: {', '.join(self.model_names)})" if self.model_names else ""
        )

    @property
    def owner_short(self) -> str:
        """The agent's name or "tenant" for the primary budgets, else `owner_label`: a table's
        row name."""
        if self.slot == "agent" and self.agent is not None:
            return self.agent.name
        return "tenant" if self.slot == "tenant" else self.owner_label

    @property
    def possessive(self) -> str:
        """ "agent's daily budget", "API key fl-ab12's daily budget for big", ...: for the
        caller's error messages (the agent is the caller's own)."""
        return self.described(named=False)

    def described(self, *, named: bool = True) -> str:
        """ "agent support's daily budget" (`named`), "tenant's weekly budget for big", ..."""
        plain = self.scope == self.Scope.AGENT and not (named or self.model_names)
        owner = "agent's" if plain else f"{self._owner()}'s"
        models_for = f" for {', '.join(self.model_names)}" if self.model_names else ""
        return f"{owner} {self.period} budget{models_for}"

    @property
    def title(self) -> str:
        """ "The tenant's daily budget", "Agent support's weekly budget", ...: a sentence's
        start."""
        described = self.described()
        if self.scope == self.Scope.TENANT:
            return f"The {described}"
        return described[0].upper() + described[1:]

    def applies_to(self, *, model: str) -> bool:
        """Whether a request for `model` counts against this budget (its owner already
        matched)."""
        return not self.model_names or model in self.model_names

    def soft_crossed(self, used_microcents: int) -> str:
        """The soft action in force when a window has `used_microcents` spent and reserved:
        "" below the soft level (or with none)."""
        soft = self.soft_limit_microcents
        return self.soft_action if soft is not None and used_microcents >= soft else ""

    def clean(self) -> None:
        self.owner_key = self.owner_key_of()  # before the unique constraint is checked
        errors = {}
        soft = self.soft_limit_microcents
        if soft is not None and self.limit_microcents is not None and soft > self.limit_microcents:
            errors["soft_limit_microcents"] = "The soft limit must not exceed the limit."
        if self.soft_action == SoftAction.THROTTLE and not self.soft_rpm:
            errors["soft_rpm"] = "A throttling soft limit needs soft_rpm (requests per minute)."
        owners = {"agent": self.agent, "api_key": self.api_key, "member": self.member}
        for field, owner in owners.items():
            if owner is not None and owner.tenant_id != self.tenant_id:
                errors[field] = "It belongs to another tenant."
        if sum(owner is not None for owner in owners.values()) > 1:
            errors["agent"] = "A budget has one owner: an agent, an API key or a member."
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
    """The worst-case cost of one request, held against the current windows of every budget
    that applies to it until the request is settled (actual cost charged, the rest freed) or
    released."""

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
    # The windows of the other budgets that apply (API key, member, model filters): their ids,
    # locked after the agent's and the tenant's, in ascending order.
    extra_windows = models.JSONField(default=list, blank=True)
    # The model asked for (a model-filtered budget's window counts the holds for its models).
    model = models.CharField(max_length=200, blank=True, default="")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.HELD)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField(db_index=True)
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.request_id

    def window_ids(self) -> list[int]:
        """Its windows in the order they are locked: the agent's, the tenant's, then the
        extra ones by id."""
        primary = [i for i in (self.agent_window_id, self.tenant_window_id) if i is not None]
        return primary + sorted(self.extra_windows or ())


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
