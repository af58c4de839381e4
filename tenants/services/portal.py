"""Workflows the portal offers that combine the API's services: an agent set up with its
budget in one step, a member added by username or email, and the playground's own key.
Every rule (names, ranges, roles, owners) is the API's, raised by the services called here."""

from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from tenants.errors import InvalidRequest
from tenants.models import Agent, ApiKey, Budget, Membership, Scope, Tenant
from tenants.services import budgets, keys, tenancy

PLAYGROUND_KEY_PREFIX = "playground"


def agent_budget_set(
    *,
    tenant: Tenant,
    agent: Agent | None,
    period: str,
    limit_microcents: int | None,
    soft: dict | None = None,
) -> Budget | None:
    """Create, change or (limit None) remove the budget of an agent, or of the tenant, with
    its soft level (`soft`: the budget services' soft_* fields; None leaves them)."""
    soft = soft or {}
    owner_key = f"agent:{agent.pk}" if agent is not None else "tenant"  # for every model
    budget = Budget.objects.filter(tenant=tenant, owner_key=owner_key).first()
    if limit_microcents is None:
        if budget is not None:
            budgets.budget_delete(budget=budget)
        return None
    if budget is None:
        return budgets.budget_create(
            tenant=tenant, agent=agent, period=period, limit_microcents=limit_microcents, **soft
        )
    return budgets.budget_update(
        budget=budget, period=period, limit_microcents=limit_microcents, **soft
    )


def agent_setup(
    *,
    tenant: Tenant,
    fields: dict,
    budget_period: str,
    budget_limit_microcents: int | None,
    budget_soft: dict | None = None,
) -> Agent:
    """Create an agent and its budget, both or neither."""
    with transaction.atomic():
        agent = tenancy.agent_create(tenant=tenant, **fields)
        agent_budget_set(
            tenant=tenant,
            agent=agent,
            period=budget_period,
            limit_microcents=budget_limit_microcents,
            soft=budget_soft,
        )
    return agent


def agent_change(
    *,
    tenant: Tenant,
    agent: Agent,
    fields: dict,
    budget_period: str,
    budget_limit_microcents: int | None,
    budget_soft: dict | None = None,
) -> Agent:
    with transaction.atomic():
        agent = tenancy.agent_update(agent=agent, **fields)
        agent_budget_set(
            tenant=tenant,
            agent=agent,
            period=budget_period,
            limit_microcents=budget_limit_microcents,
            soft=budget_soft,
        )
    return agent


def member_add_by_identifier(
    *, tenant: Tenant, identifier: str, role: str, actor_role: str
) -> Membership:
    """Add an existing, active user found by username, or by email when it holds an @."""
    users = get_user_model().objects.filter(is_active=True)
    identifier = identifier.strip()
    if "@" in identifier:
        matches = list(users.filter(email__iexact=identifier)[:2])
        user = matches[0] if len(matches) == 1 else None
    else:
        user = users.filter(username=identifier).first()
    if user is None:
        raise InvalidRequest("No active user with that username or email.", param="username")
    return tenancy.member_add(tenant=tenant, user=user, role=role, actor_role=actor_role)


def playground_key_issue(
    *, tenant: Tenant, agent: Agent, user: User, actor_role: str
) -> tuple[ApiKey, str]:
    """A short-lived inference key for the playground page, which holds it in memory only.
    The user's earlier playground keys for this agent are revoked: one live key per page."""
    now = timezone.now()
    name = f"{PLAYGROUND_KEY_PREFIX} ({user.get_username()})"[:100]
    with transaction.atomic():
        for old in ApiKey.objects.filter(
            tenant=tenant, agent=agent, created_by=user, name=name, revoked_at__isnull=True
        ):
            keys.api_key_revoke(key=old)
        return keys.api_key_create(
            tenant=tenant,
            agent=agent,
            name=name,
            scopes=[str(Scope.INFERENCE)],
            expires_at=now + timedelta(seconds=settings.FAIRLANE_PLAYGROUND_KEY_SECONDS),
            created_by=user,
            actor_role=actor_role,
        )
