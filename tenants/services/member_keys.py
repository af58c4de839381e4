"""The keys a member made follow the member: when they leave the tenant (removed, or their
account deactivated or deleted) or drop below the role that could make a key, that key is
revoked, or, where the tenant's policy says so and the key can only call the inference API,
handed over to its agent (it then stays with the agent, whoever comes and goes).

Keys made by a key (the management API called with a key) count as made by that key's maker,
so no chain of keys outlives the person at its start."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from tenants import cache
from tenants.models import ROLE_RANK, ApiKey, Membership, Scope, Tenant
from tenants.services.audit import audit_record, snapshot
from tenants.services.keys import SCOPE_MIN_ROLE

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KeyFates:
    """What happens (or happened) to a member's keys: each list holds the keys' rows."""

    revoked: list[ApiKey] = field(default_factory=list)
    handed_over: list[ApiKey] = field(default_factory=list)


def member_keys_live(*, tenant: Tenant, user: User) -> list[ApiKey]:
    """The usable keys `user` made in `tenant` that still follow them."""
    now = timezone.now()
    keys = (
        ApiKey.objects.filter(
            tenant=tenant, created_by=user, revoked_at__isnull=True, handed_over_at__isnull=True
        )
        .select_related("agent")
        .order_by("created_at")
    )
    return [key for key in keys if key.is_usable_at(now)]


def _allowed(key: ApiKey, role: str | None) -> bool:
    """Whether a member with `role` (None: no longer a member) could have made the key."""
    return role is not None and all(
        ROLE_RANK[role] >= ROLE_RANK[SCOPE_MIN_ROLE[scope]] for scope in key.scopes
    )


def member_keys_fate(*, tenant: Tenant, user: User, role: str | None) -> KeyFates:
    """What would happen to `user`'s keys in `tenant` if their role became `role` (None: they
    leave). Read-only: the portal shows it before a removal."""
    fates = KeyFates()
    hand_over = tenant.departed_member_keys == Tenant.DepartedMemberKeys.HAND_OVER
    for key in member_keys_live(tenant=tenant, user=user):
        if _allowed(key, role):
            continue
        if hand_over and key.scopes == [str(Scope.INFERENCE)]:
            fates.handed_over.append(key)
        else:
            fates.revoked.append(key)
    return fates


def member_keys_settle(*, tenant: Tenant, user: User, role: str | None, reason: str) -> KeyFates:
    """Apply `member_keys_fate` (in the caller's transaction); every API process drops the
    revoked keys from its cache once it commits."""
    fates = member_keys_fate(tenant=tenant, user=user, role=role)
    now = timezone.now()
    for keys, column, action in (
        (fates.revoked, "revoked_at", "api_key.revoke"),
        (fates.handed_over, "handed_over_at", "api_key.hand_over"),
    ):
        for key in keys:  # each key's fate is its own audit record, saying why
            before = snapshot(key)
            setattr(key, column, now)
            key.save(update_fields=[column])
            audit_record(
                action=action,
                object_type="apikey",
                object_id=key.pk,
                tenant=tenant,
                object_repr=key.prefix,
                before=before,
                after={**snapshot(key), "reason": reason},
            )
    if fates.revoked or fates.handed_over:
        cache.invalidate()
        logger.info(
            "member keys: %s in %s (%s): revoked %s, handed over %s",
            user.get_username(),
            tenant.slug,
            reason,
            [k.prefix for k in fates.revoked],
            [k.prefix for k in fates.handed_over],
        )
    return fates


def user_keys_settle(*, user: User, reason: str) -> None:
    """The user leaves every tenant's keys at once (their account was deactivated or is being
    deleted): each tenant's policy applies."""
    with transaction.atomic():
        for membership in Membership.objects.filter(user=user).select_related("tenant"):
            member_keys_settle(tenant=membership.tenant, user=user, role=None, reason=reason)


def user_changed(sender, instance, **kwargs) -> None:
    """post_save of the user model: a deactivated account's keys stop at once."""
    if instance.pk is not None and not instance.is_active:
        user_keys_settle(user=instance, reason="account deactivated")


def user_deleting(sender, instance, **kwargs) -> None:
    """pre_delete of the user model: before created_by is cleared, their keys are settled."""
    user_keys_settle(user=instance, reason="account deleted")
