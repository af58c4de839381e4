"""Signing in through an identity provider: find the person by (provider, subject), or link
an account made for them by SCIM or an earlier sign-in (never a local password account, never
an operator's: a claimed email must not take over an account), or make one; then give them the
tenants and roles their claims map to. Memberships made this way (source "sso") follow the
claims at every sign-in: a changed role is `member_update`, a tenant no longer mapped is
`member_deactivate`. Memberships added by people or by SCIM are left to them."""

from __future__ import annotations

import logging
import re

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from tenants.models import AuditRecord, Membership, OidcIdentity, Role, Tenant
from tenants.services import tenancy
from tenants.services.audit import (
    audit_change,
    audit_context,
    audit_context_current,
    snapshot,
    with_actor,
)
from tenants.services.sso.mapping import Mapped, claims_map
from tenants.services.sso.providers import Provider

logger = logging.getLogger(__name__)
NOTHING_MAPS = (
    "Your identity provider signed you in, but your account maps to no tenant of "
    "this platform (no email domain or group of yours is configured). Ask your "
    "administrator to add you."
)
_USERNAME = re.compile(r"^[\w.@+-]{1,150}$")


class SsoRefused(Exception):
    """The person is who they say, but may not come in: said on the refusal page."""


def _linkable(claims: dict) -> User | None:
    """An account made for this person without a password (by SCIM, or by another provider's
    sign-in) and not an operator's, by username or verified email."""
    names = {
        v
        for v in (claims.get("preferred_username"), claims.get("email"))
        if isinstance(v, str) and v
    }
    query = Q(username__in=names)
    if claims.get("email_verified") in (True, "true", "True") and claims.get("email"):
        query |= Q(email__iexact=claims["email"])
    for user in get_user_model().objects.filter(query, is_staff=False, is_superuser=False):
        if not user.has_usable_password():
            return user
    return None


def _username_free(claims: dict, provider: Provider) -> str:
    for candidate in (claims.get("preferred_username"), claims.get("email")):
        if isinstance(candidate, str) and _USERNAME.match(candidate):
            base = candidate
            break
    else:
        base = f"{provider.id}-{str(claims['sub'])[:40]}"
    username, n = base, 1
    while get_user_model().objects.filter(username=username).exists():
        n += 1
        username = f"{base[:140]}-{n}"
    return username


def _user_make(claims: dict, provider: Provider) -> User:
    user = get_user_model()(
        username=_username_free(claims, provider),
        email=claims.get("email") or "",
        first_name=(claims.get("given_name") or "")[:150],
        last_name=(claims.get("family_name") or "")[:150],
    )
    user.set_unusable_password()  # signs in through the provider only
    user.save()
    audit_change("user.create", user)
    return user


def _tenants_apply(user: User, mapped: Mapped) -> None:
    tenants = {t.slug: t for t in Tenant.objects.filter(slug__in=mapped.roles)}
    for slug in set(mapped.roles) - set(tenants):
        logger.warning("single sign-on maps to tenant %r, which does not exist", slug)
    mine = {m.tenant_id: m for m in Membership.objects.filter(user=user).select_related("tenant")}
    for slug, tenant in tenants.items():
        role, membership = mapped.roles[slug], mine.get(tenant.pk)
        if membership is None:
            tenancy.member_add(
                tenant=tenant,
                user=user,
                role=role,
                actor_role=Role.OWNER,
                source=Membership.Source.SSO,
            )
        elif membership.source == Membership.Source.SSO:
            tenancy.member_reactivate(membership=membership)
            if membership.role != role and membership.role != Role.OWNER:
                tenancy.member_update(membership=membership, role=role, actor_role=Role.OWNER)
    for membership in mine.values():
        if (
            membership.source == Membership.Source.SSO
            and membership.is_active
            and membership.tenant.slug not in tenants
        ):
            tenancy.member_deactivate(
                membership=membership, reason="no longer mapped by single sign-on"
            )


def _staff_apply(user: User, ops: bool) -> None:
    """The ops dashboard for people the provider puts in an ops group; never the admin, which
    takes local staff accounts only (tenants.signin.FairlaneAdminSite)."""
    if user.is_staff != ops and not user.has_usable_password() and not user.is_superuser:
        before = snapshot(user)
        user.is_staff = ops
        user.save(update_fields=["is_staff"])
        audit_change("user.update", user, before=before)


def sso_sign_in(*, provider: Provider, claims: dict) -> User:
    """The account `claims` sign in as, with its memberships brought in line with the
    claims; SsoRefused when nothing maps and the person has no access otherwise."""
    subject = str(claims["sub"])
    mapped = claims_map(provider, claims)
    identity = (
        OidcIdentity.objects.filter(provider=provider.id, subject=subject)
        .select_related("user")
        .first()
    )
    user = identity.user if identity else _linkable(claims)
    has_access = user is not None and (
        user.is_staff
        or Membership.objects.filter(
            user=user, is_active=True, source__in=[Membership.Source.MANUAL, Membership.Source.SCIM]
        ).exists()
    )
    if not mapped and not has_access:
        raise SsoRefused(NOTHING_MAPS)
    who = claims.get("email") or claims.get("preferred_username") or subject
    context = with_actor(
        audit_context_current(),
        actor_type=AuditRecord.ActorType.USER,
        actor_id=str(user.pk) if user else "",
        actor=f"{who} (single sign-on: {provider.id})",
    )
    with audit_context(context), transaction.atomic():
        if user is None:
            user = _user_make(claims, provider)
        if identity is None:
            identity = OidcIdentity.objects.create(provider=provider.id, subject=subject, user=user)
            audit_change("oidcidentity.link", identity)
        OidcIdentity.objects.filter(pk=identity.pk).update(last_login_at=timezone.now())
        _tenants_apply(user, mapped)
        _staff_apply(user, mapped.ops)
    if not (user.is_staff or Membership.objects.filter(user=user, is_active=True).exists()):
        raise SsoRefused(NOTHING_MAPS)
    return user
