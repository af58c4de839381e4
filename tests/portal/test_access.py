"""Who may see and do what: every portal URL is a 404 to a member of another tenant; a
viewer sees every page but every action is refused on the server; a suspended tenant's
portal is read-only; CSRF guards every form."""

import pytest
from django.test import Client
from django.urls import reverse

from tenants.models import Agent, ApiKey, Budget, Membership, Role, Tenant
from tenants.services.budgets import budget_create

PAGES = [
    "overview",
    "overview_figures",
    "agents",
    "agent_create",
    "agent_edit",
    "agent_routing",
    "budgets",
    "keys",
    "usage",
    "usage_csv",
    "usage_request",
    "members",
    "member_remove",
    "playground",
]
ACTIONS = [
    "agent_create",
    "agent_edit",
    "agent_deactivate",
    "tenant_budget_set",
    "key_create",
    "key_rotate",
    "key_revoke",
    "member_add",
    "member_role",
    "member_remove",
    "member_keys_policy",
    "playground_key",
]
# Pages whose GET needs the admin role (member_remove's says which keys a removal stops).
ADMIN_PAGES = {"agent_create", "agent_edit", "member_remove"}


@pytest.fixture
def things(tenant, agent, api_key, member_of):
    """One of everything in Acme, for URLs that name an agent, key, member or request."""
    budget_create(tenant=tenant, agent=agent, limit_microcents=10**8)
    viewer = member_of(tenant, Role.VIEWER, "vic")
    return {
        "agent_id": agent.pk,
        "key_id": api_key[0].pk,
        "member_id": Membership.objects.get(user=viewer).pk,
        "request_id": "req-1",
    }


def url(name: str, slug: str, things: dict) -> str:
    params = {"slug": slug}
    pattern = reverse(f"portal:{name}", kwargs={**params, **_ids(name, things)})
    return pattern


def _ids(name: str, things: dict) -> dict:
    if name.startswith("agent_") and name not in {"agent_create"}:
        return {"agent_id": things["agent_id"]}
    if name in {"key_rotate", "key_revoke"}:
        return {"key_id": things["key_id"]}
    if name in {"member_role", "member_remove"}:
        return {"member_id": things["member_id"]}
    if name == "usage_request":
        return {"request_id": things["request_id"]}
    return {}


def _snapshot() -> tuple:
    return (
        list(Agent.objects.values_list("name", "is_active", "description")),
        list(ApiKey.objects.values_list("key_id", "revoked_at", "expires_at")),
        list(Budget.objects.values_list("agent_id", "limit_microcents", "period")),
        list(Membership.objects.values_list("user_id", "role")),
        list(Tenant.objects.values_list("slug", "status")),
    )


POST_DATA = {
    "name": "x-agent",
    "budget_period": "daily",
    "budget_limit_usd": "1",
    "agent": "",
    "scopes": ["inference"],
    "grace_seconds": "0",
    "username": "oscar",
    "role": "viewer",
}


def test_every_portal_url_is_a_404_to_a_member_of_another_tenant(things, other_tenant, other_owner):
    client = Client()
    client.force_login(other_owner)  # owner of Globex, a stranger to Acme
    before = _snapshot()
    for name in PAGES:
        assert client.get(url(name, "acme", things)).status_code == 404, name
    for name in ACTIONS:
        assert client.post(url(name, "acme", things), POST_DATA).status_code == 404, name
    # a tenant that does not exist answers exactly the same
    assert client.get(url("overview", "no-such", things)).status_code == 404
    assert _snapshot() == before


def test_signed_out_visitors_are_sent_to_sign_in(things):
    client = Client()
    for name in PAGES:
        response = client.get(url(name, "acme", things))
        assert response.status_code == 302, name
        assert response["Location"].startswith("/portal/login/?next=")
    assert client.post(url("key_create", "acme", things), POST_DATA).status_code == 302


def test_a_viewer_sees_every_page_but_every_action_is_refused(things, portal_client):
    client, _ = portal_client(Role.VIEWER)
    before = _snapshot()
    for name in PAGES:
        expected = 403 if name in ADMIN_PAGES else (404 if name == "usage_request" else 200)
        assert client.get(url(name, "acme", things)).status_code == expected, name
    for name in ACTIONS:
        assert (
            client.post(
                url(name, "acme", things), {**POST_DATA, "agent": str(things["agent_id"])}
            ).status_code
            == 403
        ), name
    assert _snapshot() == before
    page = client.get(url("keys", "acme", things)).content.decode()
    assert "Create key" not in page and "Revoke" not in page and "Rotate" not in page


def test_a_member_manages_keys_but_not_agents_budgets_or_members(things, portal_client):
    client, _ = portal_client(Role.MEMBER)
    before = _snapshot()
    for name in [
        "agent_create",
        "agent_edit",
        "agent_deactivate",
        "tenant_budget_set",
        "member_add",
        "member_role",
        "member_remove",
        "member_keys_policy",
    ]:
        assert client.post(url(name, "acme", things), POST_DATA).status_code == 403, name
    assert _snapshot() == before
    page = client.get(url("agents", "acme", things)).content.decode()
    assert "New agent" not in page and "Deactivate" not in page
    assert "Create key" in client.get(url("keys", "acme", things)).content.decode()


def test_actions_are_post_only(things, portal_client):
    client, _ = portal_client(Role.OWNER)
    for name in set(ACTIONS) - ADMIN_PAGES:
        assert client.get(url(name, "acme", things)).status_code == 405, name


def test_every_form_needs_its_csrf_token(things, portal_client):
    client, _ = portal_client(Role.OWNER, csrf=True)
    before = _snapshot()
    for name in ACTIONS:
        assert client.post(url(name, "acme", things), POST_DATA).status_code == 403, name
    assert (
        Client(enforce_csrf_checks=True)
        .post("/portal/login/", {"username": "olivia", "password": "pw-olivia"})
        .status_code
        == 403
    )
    assert _snapshot() == before


def test_a_suspended_tenant_reads_but_refuses_every_write(things, tenant, portal_client):
    Tenant.objects.filter(pk=tenant.pk).update(status=Tenant.Status.SUSPENDED)
    client, _ = portal_client(Role.OWNER)
    before = _snapshot()
    for name in set(PAGES) - {"usage_request"}:
        response = client.get(url(name, "acme", things))
        assert response.status_code == 200, name
    overview = client.get(url("overview", "acme", things)).content.decode()
    assert "suspended" in overview and "read-only" in overview
    for name in ACTIONS:
        response = client.post(
            url(name, "acme", things), {**POST_DATA, "agent": str(things["agent_id"])}
        )
        assert response.status_code == 403, name
        assert b"suspended" in response.content
    assert _snapshot() == before
    assert "Create key" not in client.get(url("keys", "acme", things)).content.decode()
