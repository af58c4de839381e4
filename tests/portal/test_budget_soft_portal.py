"""The portal's budget forms take a soft level (issue 32): set on the tenant's and an agent's
budget, the services' validation shown on the field, and only admins may change it; the
budgets page and the overview say whose soft level is crossed and what it does."""

import uuid

import pytest
from django.urls import reverse

from tenants.models import Budget, Role
from tenants.services.budgets import budget_create, budget_reserve

pytestmark = pytest.mark.django_db


def u(name, **kwargs):
    return reverse(f"portal:{name}", kwargs={"slug": "acme", **kwargs})


def test_an_admin_sets_the_tenants_soft_level_and_sees_it_again(portal_client, tenant):
    client, _ = portal_client(Role.ADMIN)
    response = client.post(
        u("tenant_budget_set"),
        {
            "budget_period": "daily",
            "budget_limit_usd": "10",
            "budget_soft_limit_usd": "8",
            "budget_soft_action": "throttle",
            "budget_soft_rpm": "30",
        },
    )
    assert response.status_code == 302, response.content.decode()[-2000:]
    budget = Budget.objects.get(tenant=tenant, agent=None)
    assert (budget.soft_limit_microcents, budget.soft_action, budget.soft_rpm) == (
        800_000_000,
        "throttle",
        30,
    )
    page = client.get(u("budgets")).content.decode()
    assert 'name="budget_soft_rpm" value="30"' in page


def test_an_agents_soft_level_over_its_limit_is_shown_on_the_field(portal_client, tenant):
    client, _ = portal_client(Role.ADMIN)
    response = client.post(
        u("agent_create"),
        {
            "name": "writer",
            "budget_period": "daily",
            "budget_limit_usd": "1",
            "budget_soft_limit_usd": "2",
            "budget_soft_action": "demote",
        },
    )
    assert response.status_code == 400
    assert "The soft limit must not exceed the limit." in response.content.decode()
    assert not Budget.objects.exists()
    created = client.post(
        u("agent_create"),
        {
            "name": "writer",
            "budget_period": "daily",
            "budget_limit_usd": "1",
            "budget_soft_limit_usd": "0.5",
            "budget_soft_action": "demote",
        },
    )
    assert created.status_code == 302
    budget = Budget.objects.get(agent__name="writer")
    assert (budget.soft_limit_microcents, budget.soft_action) == (50_000_000, "demote")


def test_a_viewer_cannot_set_a_soft_level(portal_client, tenant):
    client, _ = portal_client(Role.VIEWER)
    response = client.post(
        u("tenant_budget_set"),
        {"budget_period": "daily", "budget_limit_usd": "10", "budget_soft_limit_usd": "8"},
    )
    assert response.status_code == 403
    assert not Budget.objects.exists()


def test_the_budgets_page_and_the_overview_say_who_is_demoted_or_throttled(
    portal_client, tenant, agent
):
    """Past its soft level, the agent's row says what is in force; one below its own says
    nothing; the tenant's line shows its level, not crossed."""
    from tenants.services.tenancy import agent_create

    client, _ = portal_client(Role.VIEWER)  # members who cannot change budgets see it too
    quiet = agent_create(tenant=tenant, name="quiet")
    budget_create(
        tenant=tenant,
        agent=agent,
        limit_microcents=1_000,
        soft_limit_microcents=500,
        soft_action="demote",
    )
    budget_create(
        tenant=tenant,
        agent=quiet,
        limit_microcents=1_000,
        soft_limit_microcents=500,
        soft_action="throttle",
        soft_rpm=6,
    )
    budget_create(
        tenant=tenant,
        agent=None,
        limit_microcents=10_000,
        soft_limit_microcents=9_000,
        soft_action="alert",
    )
    held(tenant, agent, 600)  # past its soft level: demoted
    held(tenant, quiet, 400)  # below: not throttled yet
    page = client.get(u("budgets")).content.decode()
    demoted = cell(page, 'data-budget-soft="support-bot"')
    assert 'data-soft="demote"' in demoted and "demoted to the bulk lane" in demoted
    throttled = cell(page, 'data-budget-soft="quiet"')
    assert "throttle to 6/min" in throttled and "data-soft=" not in throttled
    assert "data-soft=" not in cell(page, 'data-budget-soft="tenant"', end=".</span>")
    held(tenant, quiet, 100)  # now at its soft level exactly
    page = client.get(u("budgets")).content.decode()
    assert 'data-soft="throttle"' in cell(page, 'data-budget-soft="quiet"')
    overview = client.get(u("overview")).content.decode()
    row = cell(overview, 'data-owner="support-bot"', end="</tr>")
    assert 'data-soft="demote"' in row


def held(tenant, agent, amount: int) -> None:
    """`amount` reserved by a request in flight (spent and reserved both count)."""
    budget_reserve(
        tenant=tenant, agent=agent, amount_microcents=amount, request_id=uuid.uuid4().hex
    )


def cell(page: str, marker: str, end: str = "</td>") -> str:
    start = page.index(marker)
    return page[start : page.index(end, start)]
