"""Tenants, their members and their agents."""

import hashlib
import hmac

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from tenants.errors import InvalidRequest, PermissionDenied
from tenants.models import ROLE_RANK, Agent, ApiKey, Lane, Membership, Role, Tenant
from tenants.services.validation import Conflict, save_validated


def tenant_create(*, name: str, slug: str, owner: AbstractBaseUser | None,
                  timezone_name: str = "UTC", default_lane: str = Lane.STANDARD,
                  weight: int = 1) -> Tenant:
    """Create a tenant; its creator (if any) becomes its owner."""
    with transaction.atomic():
        tenant = save_validated(
            Tenant(name=name, slug=slug, timezone=timezone_name, default_lane=default_lane,
                   weight=weight),
            unique_param="slug",
        )
        if owner is not None:
            Membership.objects.create(user=owner, tenant=tenant, role=Role.OWNER)
    return tenant


def tenant_update(*, tenant: Tenant, **fields) -> Tenant:
    """Change a tenant's name, time zone or default lane (weight and status are operators')."""
    for field, value in fields.items():
        if field not in {"name", "timezone", "default_lane"}:
            raise InvalidRequest(f"{field} cannot be changed here.", param=field)
        setattr(tenant, field, value)
    return save_validated(tenant)


def _assert_may_grant(*, actor_role: str, role: str) -> None:
    # Admins manage members below owner; only owners make or unmake owners.
    if role == Role.OWNER and actor_role != Role.OWNER:
        raise PermissionDenied("Only an owner can grant or change the owner role.")


def member_add(*, tenant: Tenant, user: AbstractBaseUser, role: str, actor_role: str) -> Membership:
    if role not in Role.values:
        raise InvalidRequest(f"role must be one of {', '.join(Role.values)}.", param="role")
    _assert_may_grant(actor_role=actor_role, role=role)
    if Membership.objects.filter(tenant=tenant, user=user).exists():
        raise Conflict("That user is already a member.", param="user")
    return save_validated(Membership(tenant=tenant, user=user, role=role), unique_param="user")


def _assert_keeps_an_owner(*, membership: Membership) -> None:
    if membership.role == Role.OWNER and not Membership.objects.filter(
        tenant=membership.tenant, role=Role.OWNER
    ).exclude(pk=membership.pk).exists():
        raise InvalidRequest("A tenant must keep at least one owner.", param="role")


def member_update(*, membership: Membership, role: str, actor_role: str) -> Membership:
    if role not in Role.values:
        raise InvalidRequest(f"role must be one of {', '.join(Role.values)}.", param="role")
    _assert_may_grant(actor_role=actor_role, role=max(role, membership.role, key=ROLE_RANK.get))
    with transaction.atomic():
        if role != Role.OWNER:
            _assert_keeps_an_owner(membership=membership)
        membership.role = role
        membership.save(update_fields=["role"])
    return membership


def member_remove(*, membership: Membership, actor_role: str) -> None:
    _assert_may_grant(actor_role=actor_role, role=membership.role)
    with transaction.atomic():
        _assert_keeps_an_owner(membership=membership)
        membership.delete()


def _clean_allowed_models(models: list) -> list[str]:
    if not isinstance(models, list) or not all(isinstance(m, str) and m for m in models):
        raise InvalidRequest("allowed_models must be a list of model names.",
                             param="allowed_models")
    return sorted(set(models))


RATE_LIMIT_FIELDS = {"rpm_limit", "tpm_limit", "concurrency_limit"}


def agent_create(*, tenant: Tenant, name: str, description: str = "",
                 allowed_models: list | None = None, lane: str = "", rpm_limit: int | None = None,
                 tpm_limit: int | None = None, concurrency_limit: int | None = None) -> Agent:
    agent = Agent(tenant=tenant, name=name, description=description, lane=lane,
                  allowed_models=_clean_allowed_models(allowed_models or []),
                  rpm_limit=rpm_limit, tpm_limit=tpm_limit, concurrency_limit=concurrency_limit)
    return save_validated(agent, unique_param="name")


def agent_update(*, agent: Agent, **fields) -> Agent:
    for field, value in fields.items():
        if field not in {"name", "description", "allowed_models", "lane", "is_active",
                         *RATE_LIMIT_FIELDS}:
            raise InvalidRequest(f"{field} cannot be changed.", param=field)
        if field == "allowed_models":
            value = _clean_allowed_models(value)
        setattr(agent, field, value)
    with transaction.atomic():
        save_validated(agent, unique_param="name")
        if not agent.is_active:
            _agent_keys_revoke(agent=agent)
    return agent


def _agent_keys_revoke(*, agent: Agent) -> None:
    ApiKey.objects.filter(agent=agent, revoked_at__isnull=True).update(revoked_at=timezone.now())


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
