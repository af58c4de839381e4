"""Tenants, their members and their agents."""

import hashlib
import hmac

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from tenants.errors import InvalidRequest, PermissionDenied
from tenants.models import ROLE_RANK, Agent, ApiKey, Lane, Membership, Role, Tenant
from tenants.services.audit import audit_change, snapshot
from tenants.services.member_keys import KeyFates, member_keys_settle
from tenants.services.sessions import user_sessions_end
from tenants.services.validation import Conflict, save_validated


def tenant_create(
    *,
    name: str,
    slug: str,
    owner: User | None,
    timezone_name: str = "UTC",
    default_lane: str = Lane.STANDARD,
    weight: int = 1,
) -> Tenant:
    """Create a tenant; its creator (if any) becomes its owner."""
    with transaction.atomic():
        tenant = save_validated(
            Tenant(
                name=name,
                slug=slug,
                timezone=timezone_name,
                default_lane=default_lane,
                weight=weight,
            ),
            unique_param="slug",
        )
        audit_change("tenant.create", tenant)
        if owner is not None:
            membership = Membership.objects.create(user=owner, tenant=tenant, role=Role.OWNER)
            audit_change("member.add", membership)
    return tenant


OWNER_SETTINGS = {
    "departed_member_keys": "what becomes of a departing member's keys",
    "sso_only": "whether members must sign in with single sign-on",
}


def tenant_update(*, tenant: Tenant, actor_role: str = Role.OWNER, **fields) -> Tenant:
    """Change a tenant's name, time zone, default lane, or (owners only) what becomes of a
    departing member's keys and whether passwords are turned off (SSO only). Weight and
    status are operators'."""
    before = snapshot(tenant)
    for field, value in fields.items():
        if field not in {"name", "timezone", "default_lane", *OWNER_SETTINGS}:
            raise InvalidRequest(f"{field} cannot be changed here.", param=field)
        if field in OWNER_SETTINGS and actor_role != Role.OWNER:
            raise PermissionDenied(f"Only an owner can choose {OWNER_SETTINGS[field]}.")
        setattr(tenant, field, value)
    with transaction.atomic():
        tenant = save_validated(tenant)
        audit_change("tenant.update", tenant, before=before)
    return tenant


def _assert_may_grant(*, actor_role: str, role: str) -> None:
    # Admins manage members below owner; only owners make or unmake owners.
    if role == Role.OWNER and actor_role != Role.OWNER:
        raise PermissionDenied("Only an owner can grant or change the owner role.")


def member_add(
    *,
    tenant: Tenant,
    user: User,
    role: str,
    actor_role: str,
    source: str = Membership.Source.MANUAL,
    scim_external_id: str = "",
) -> Membership:
    if role not in Role.values:
        raise InvalidRequest(f"role must be one of {', '.join(Role.values)}.", param="role")
    _assert_may_grant(actor_role=actor_role, role=role)
    if Membership.objects.filter(tenant=tenant, user=user).exists():
        raise Conflict("That user is already a member.", param="user")
    with transaction.atomic():
        membership = save_validated(
            Membership(
                tenant=tenant,
                user=user,
                role=role,
                source=source,
                scim_external_id=scim_external_id,
            ),
            unique_param="user",
        )
        audit_change("member.add", membership)
    return membership


def _assert_keeps_an_owner(*, membership: Membership) -> None:
    if (
        membership.role == Role.OWNER
        and not Membership.objects.filter(tenant=membership.tenant, role=Role.OWNER, is_active=True)
        .exclude(pk=membership.pk)
        .exists()
    ):
        raise InvalidRequest("A tenant must keep at least one owner.", param="role")


def member_update(*, membership: Membership, role: str, actor_role: str) -> Membership:
    """Change a member's role; keys they made that the new role could not make are revoked
    or handed over (tenants.services.member_keys)."""
    if role not in Role.values:
        raise InvalidRequest(f"role must be one of {', '.join(Role.values)}.", param="role")
    _assert_may_grant(
        actor_role=actor_role, role=max(role, membership.role, key=ROLE_RANK.__getitem__)
    )
    before = snapshot(membership)
    with transaction.atomic():
        if role != Role.OWNER:
            _assert_keeps_an_owner(membership=membership)
        membership.role = role
        membership.save(update_fields=["role"])
        audit_change("member.role", membership, before=before)
        member_keys_settle(
            tenant=membership.tenant,
            user=membership.user,
            role=role,
            reason=f"role changed to {role}",
        )
    return membership


def member_remove(*, membership: Membership, actor_role: str) -> KeyFates:
    """Remove a member; the keys they made are revoked or handed over, as returned."""
    _assert_may_grant(actor_role=actor_role, role=membership.role)
    with transaction.atomic():
        _assert_keeps_an_owner(membership=membership)
        fates = member_keys_settle(
            tenant=membership.tenant, user=membership.user, role=None, reason="removed"
        )
        audit_change("member.remove", membership, before=snapshot(membership), deleted=True)
        membership.delete()
    return fates


def member_deactivate(*, membership: Membership, reason: str) -> KeyFates:
    """The member keeps their row but loses access (SCIM's `active: false`): the keys they made
    are revoked or handed over by the tenant's policy, and they are signed out at once (every
    session of theirs ends on its next request)."""
    if not membership.is_active:
        return KeyFates()
    before = snapshot(membership)
    with transaction.atomic():
        _assert_keeps_an_owner(membership=membership)
        membership.is_active = False
        membership.save(update_fields=["is_active"])
        audit_change("member.deactivate", membership, before=before)
        fates = member_keys_settle(
            tenant=membership.tenant, user=membership.user, role=None, reason=reason
        )
        user_sessions_end(user=membership.user)
    return fates


def member_reactivate(*, membership: Membership) -> Membership:
    """Access again, with the role the member had; keys revoked meanwhile stay revoked."""
    if membership.is_active:
        return membership
    before = snapshot(membership)
    with transaction.atomic():
        membership.is_active = True
        membership.save(update_fields=["is_active"])
        audit_change("member.reactivate", membership, before=before)
    return membership


def _clean_allowed_models(models: list) -> list[str]:
    if not isinstance(models, list) or not all(isinstance(m, str) and m for m in models):
        raise InvalidRequest(
            "allowed_models must be a list of model names.", param="allowed_models"
        )
    return sorted(set(models))


RATE_LIMIT_FIELDS = {"rpm_limit", "tpm_limit", "concurrency_limit"}


def agent_create(
    *,
    tenant: Tenant,
    name: str,
    description: str = "",
    allowed_models: list | None = None,
    lane: str = "",
    rpm_limit: int | None = None,
    tpm_limit: int | None = None,
    concurrency_limit: int | None = None,
) -> Agent:
    agent = Agent(
        tenant=tenant,
        name=name,
        description=description,
        lane=lane,
        allowed_models=_clean_allowed_models(allowed_models or []),
        rpm_limit=rpm_limit,
        tpm_limit=tpm_limit,
        concurrency_limit=concurrency_limit,
    )
    with transaction.atomic():
        agent = save_validated(agent, unique_param="name")
        audit_change("agent.create", agent)
    return agent


def agent_update(*, agent: Agent, **fields) -> Agent:
    before = snapshot(agent)
    for field, value in fields.items():
        if field not in {
            "name",
            "description",
            "allowed_models",
            "lane",
            "is_active",
            *RATE_LIMIT_FIELDS,
        }:
            raise InvalidRequest(f"{field} cannot be changed.", param=field)
        if field == "allowed_models":
            value = _clean_allowed_models(value)
        setattr(agent, field, value)
    with transaction.atomic():
        save_validated(agent, unique_param="name")
        after = snapshot(agent)
        if after != before:
            audit_change(
                "agent.deactivate"
                if before["is_active"] and not agent.is_active
                else "agent.update",
                agent,
                before=before,
            )
        if not agent.is_active:
            _agent_keys_revoke(agent=agent)
    return agent


def _agent_keys_revoke(*, agent: Agent) -> None:
    now = timezone.now()
    for key in ApiKey.objects.filter(agent=agent, revoked_at__isnull=True):
        before = snapshot(key)
        key.revoked_at = now
        key.save(update_fields=["revoked_at"])
        audit_change("api_key.revoke", key, before=before)


def agent_deactivate(*, agent: Agent) -> Agent:
    """Agents are deactivated, not deleted: the ledger keeps pointing at them. Their keys are
    revoked at once."""
    return agent_update(agent=agent, is_active=False)


def tenant_cache_salt(*, tenant_id: int, salt: str = "") -> str:
    """The prefix-cache salt a remote engine or a vLLM child is sent for a tenant (and the
    client's own `cache_salt`, if any): a keyed hash, stable per tenant, that never names it.
    Every tenant reaches a remote Fairlane under our one key; this keeps their cached prompts
    apart there, and on vLLM (a remote one, or a worker's own child)."""
    key = hashlib.sha256(b"fairlane-cache-salt:" + settings.SECRET_KEY.encode()).digest()
    message = f"{tenant_id}\x00{salt}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()[:32]
