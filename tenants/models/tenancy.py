"""Tenants, their members and roles, their agents and the agents' API keys."""

import functools
import uuid
import zoneinfo

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

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

    class DepartedMemberKeys(models.TextChoices):
        """What becomes of the keys a member made, when the member leaves (removed, their
        account deactivated) or drops below the role that could make them: revoked, or (for
        keys that can only call the inference API) handed over to the agent they belong to.
        Keys carrying management scopes are always revoked."""

        REVOKE = "revoke"
        HAND_OVER = "hand_over"

    departed_member_keys = models.CharField(
        max_length=16, choices=DepartedMemberKeys.choices, default=DepartedMemberKeys.REVOKE
    )
    # Members reach this tenant through single sign-on only: a password session gets 403.
    sso_only = models.BooleanField(default=False)

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


ROLE_RANK: dict[str, int] = {Role.VIEWER: 1, Role.MEMBER: 2, Role.ADMIN: 3, Role.OWNER: 4}


class Membership(models.Model):
    """A person in a tenant with a role. A deactivated membership (SCIM's `active: false`)
    stays for the record and can be reactivated, but gives no access."""

    class Source(models.TextChoices):
        MANUAL = "manual"  # added by a person (portal, API, admin)
        SSO = "sso"  # made at sign-in from the identity provider's claims
        SCIM = "scim"  # provisioned by the tenant's SCIM client

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)
    is_active = models.BooleanField(default=True)
    source = models.CharField(max_length=8, choices=Source.choices, default=Source.MANUAL)
    # SCIM: the resource id the tenant's identity provider knows this member by, and its own.
    scim_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    scim_external_id = models.CharField(max_length=200, blank=True, default="")

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
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    rotated_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="rotated_to"
    )
    # Set when the member who made it left and the tenant's policy handed it to its agent: it
    # no longer follows that member's fate (created_by still says who made it).
    handed_over_at = models.DateTimeField(null=True, blank=True)

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
