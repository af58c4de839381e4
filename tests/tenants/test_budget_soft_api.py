"""Soft budget levels in the management API and the portal (issue 32): the fields are set
and read back, bad values are 400s naming the field, a viewer cannot change them, another
tenant's budget is not found."""

import pytest

from tenants.models import Budget, Role
from tenants.services.budgets import budget_create
from tests.tenants.test_apis import assert_error

pytestmark = pytest.mark.django_db


@pytest.fixture
def owner_client(client_for, owner):
    return client_for(user=owner)


def test_a_budget_takes_a_soft_level_and_shows_it(owner_client, tenant, agent):
    response = owner_client.post(
        "/api/tenants/acme/budgets/",
        {
            "agent": str(agent.pk),
            "limit_microcents": 1_000_000,
            "soft_limit_microcents": 800_000,
            "soft_action": "throttle",
            "soft_rpm": 5,
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["soft_limit_microcents"], body["soft_action"], body["soft_rpm"]) == (
        800_000,
        "throttle",
        5,
    )
    changed = owner_client.patch(
        f"/api/tenants/acme/budgets/{body['id']}/",
        {"soft_action": "demote", "soft_rpm": None},
        format="json",
    )
    assert changed.status_code == 200, changed.content
    budget = Budget.objects.get(pk=body["id"])
    assert (budget.soft_limit_microcents, budget.soft_action, budget.soft_rpm) == (
        800_000,
        "demote",
        None,
    )
    cleared = owner_client.patch(
        f"/api/tenants/acme/budgets/{body['id']}/", {"soft_limit_microcents": None}, format="json"
    )
    assert cleared.json()["soft_limit_microcents"] is None


@pytest.mark.parametrize(
    "body, param",
    [
        ({"limit_microcents": 100, "soft_limit_microcents": 101}, "soft_limit_microcents"),
        ({"limit_microcents": 100, "soft_limit_microcents": -1}, "soft_limit_microcents"),
        ({"limit_microcents": 100, "soft_limit_microcents": "50"}, "soft_limit_microcents"),
        ({"limit_microcents": 100, "soft_action": "slow"}, "soft_action"),
        (
            {"limit_microcents": 100, "soft_limit_microcents": 50, "soft_action": "throttle"},
            "soft_rpm",
        ),
        ({"limit_microcents": 100, "soft_action": "throttle", "soft_rpm": 0}, "soft_rpm"),
    ],
)
def test_bad_soft_levels_are_400s_naming_the_field(owner_client, tenant, body, param):
    response = owner_client.post("/api/tenants/acme/budgets/", body, format="json")
    assert_error(response, 400, "invalid_request", param)
    assert not Budget.objects.filter(tenant=tenant).exists()


def test_lowering_the_limit_under_the_soft_level_is_refused(owner_client, tenant):
    budget = budget_create(
        tenant=tenant, agent=None, limit_microcents=100, soft_limit_microcents=80
    )
    response = owner_client.patch(
        f"/api/tenants/acme/budgets/{budget.pk}/", {"limit_microcents": 50}, format="json"
    )
    assert_error(response, 400, "invalid_request", "soft_limit_microcents")
    budget.refresh_from_db()
    assert budget.limit_microcents == 100


def test_a_viewer_cannot_change_the_soft_level(client_for, member_of, tenant, agent):
    budget = budget_create(tenant=tenant, agent=agent, limit_microcents=100)
    viewer = client_for(user=member_of(tenant, Role.VIEWER))
    assert viewer.get(f"/api/tenants/acme/budgets/{budget.pk}/").status_code == 200
    response = viewer.patch(
        f"/api/tenants/acme/budgets/{budget.pk}/",
        {"soft_limit_microcents": 50, "soft_action": "demote"},
        format="json",
    )
    assert_error(response, 403, "permission")
    budget.refresh_from_db()
    assert budget.soft_limit_microcents is None


def test_another_tenant_cannot_see_or_edit_the_budget(client_for, other_owner, tenant, agent):
    budget = budget_create(tenant=tenant, agent=agent, limit_microcents=100)
    other = client_for(user=other_owner)
    for url in (
        f"/api/tenants/globex/budgets/{budget.pk}/",
        f"/api/tenants/acme/budgets/{budget.pk}/",
    ):
        response = other.patch(url, {"soft_limit_microcents": 50}, format="json")
        assert response.status_code == 404, response.content
    budget.refresh_from_db()
    assert budget.soft_limit_microcents is None


def test_the_admin_edits_a_soft_level_and_refuses_one_over_the_limit(
    client, django_user_model, tenant, agent
):
    client.force_login(django_user_model.objects.create_superuser("root", "r@example.com", "pw"))
    budget = budget_create(tenant=tenant, agent=agent, limit_microcents=100)
    url = f"/admin/tenants/budget/{budget.pk}/change/"
    page = client.get(url)
    assert page.status_code == 200 and b'name="soft_limit_microcents"' in page.content
    assert client.get("/admin/tenants/budget/").status_code == 200
    form = {
        "tenant": tenant.pk,
        "agent": str(agent.pk),
        "period": "daily",
        "limit_microcents": 100,
        "soft_action": "demote",
    }
    refused = client.post(url, {**form, "soft_limit_microcents": 101})
    assert refused.status_code == 200
    assert b"The soft limit must not exceed the limit." in refused.content
    saved = client.post(url, {**form, "soft_limit_microcents": 60})
    assert saved.status_code == 302, saved.content.decode()[-1500:]
    budget.refresh_from_db()
    assert (budget.soft_limit_microcents, budget.soft_action) == (60, "demote")
