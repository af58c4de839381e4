"""Who a person is to the outside: the identity provider's subject they signed in as (SSO),
the SCIM tokens and groups a tenant's identity provider provisions with, and the moment
before which a person's sessions no longer count (signed out everywhere)."""

import uuid

from django.conf import settings
from django.db import models

from tenants.models.tenancy import Membership, Role, Tenant


class OidcIdentity(models.Model):
    """A user as an OpenID provider knows them: (provider id, `sub`). Sign-in finds the user by
    this pair, never by a claimed email alone."""

    provider = models.CharField(max_length=40)
    subject = models.CharField(max_length=255)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oidc_identities"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_login_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["provider", "subject"], name="oidc_identity_unique")
        ]

    def __str__(self) -> str:
        return f"{self.provider}:{self.subject}"


class SessionCutoff(models.Model):
    """Sessions of this user that began before `not_before` are ended on their next request
    (a SCIM deprovisioning, a deactivated account)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        primary_key=True,
        related_name="session_cutoff",
    )
    not_before = models.DateTimeField()

    def __str__(self) -> str:
        return f"sessions before {self.not_before:%Y-%m-%d %H:%M}"


class ScimToken(models.Model):
    """A tenant's SCIM bearer token: `scim-<token_id>-<secret>`, shown once; only its keyed
    hash is stored (like API keys)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="scim_tokens")
    name = models.CharField(max_length=100, blank=True, default="")
    token_id = models.CharField(max_length=16, unique=True, editable=False)
    secret_hash = models.CharField(max_length=64, editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"scim-{self.token_id}"

    @property
    def prefix(self) -> str:
        return f"scim-{self.token_id}"


class ScimGroup(models.Model):
    """A group the tenant's identity provider pushes. A group whose name is a role (`admin`,
    `member`, `viewer`, optionally prefixed `fairlane-`) gives its members that role; a
    member's role is the highest their groups give (owners are made by owners, never by
    SCIM)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="scim_groups")
    scim_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    scim_external_id = models.CharField(max_length=200, blank=True, default="")
    display_name = models.CharField(max_length=200)
    members = models.ManyToManyField(Membership, blank=True, related_name="scim_groups")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "display_name"], name="scim_group_name_unique"
            )
        ]
        ordering = ["display_name"]

    def __str__(self) -> str:
        return self.display_name

    @property
    def role(self) -> str | None:
        name = self.display_name.strip().lower().removeprefix("fairlane-")
        return name if name in {Role.ADMIN, Role.MEMBER, Role.VIEWER} else None
