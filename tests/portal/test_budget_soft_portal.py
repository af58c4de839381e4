"""The portal's budget forms take a soft level (issue 32): set on the tenant's and an agent's
budget, the services' validation shown on the field, and only admins may change it."""

import pytest
from django.urls import reverse

from tenants.models import Budget, Role

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
