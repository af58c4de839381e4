"""The portal's pages doing what they say, through the API's own services: agents with
budgets (the services' validation messages), keys shown once and never again, rotation with
grace, revocation, members under the owner rules, the playground's own key, and banners."""

import logging
import re

import pytest
from django.urls import reverse
from django.utils import timezone

from tenants.errors import AuthenticationFailed
from tenants.models import Agent, ApiKey, Budget, Membership, Role, Scope, UsageRecord
from tenants.services.budgets import budget_create, budget_reserve
from tenants.services.keys import api_key_authenticate
from tenants.services.ledger import Usage, budget_settle

KEY_RE = re.compile(r"fl-[a-z0-9]{12}-[A-Za-z0-9]{43}")


def u(name, **kwargs):
    return reverse(f"portal:{name}", kwargs={"slug": "acme", **kwargs})


def test_an_admin_creates_an_agent_with_its_budget(portal_client, tenant):
    client, _ = portal_client(Role.ADMIN)
    response = client.post(
        u("agent_create"),
        {
            "name": "writer",
            "description": "drafts",
            "allowed_models": "tiny, small",
            "lane": "bulk",
            "rpm_limit": "60",
            "budget_period": "weekly",
            "budget_limit_usd": "2.50",
        },
    )
    assert response.status_code == 302
    agent = Agent.objects.get(tenant=tenant, name="writer")
    assert agent.allowed_models == ["small", "tiny"] and agent.lane == "bulk"
    assert agent.rpm_limit == 60
    budget = Budget.objects.get(agent=agent)
    assert (budget.period, budget.limit_microcents) == ("weekly", 250_000_000)
    page = client.get(u("agents")).content.decode()
    assert "writer" in page and "$2.50 weekly" in page


def test_agent_validation_messages_are_the_services_and_nothing_is_half_made(
    portal_client, tenant, agent
):
    client, _ = portal_client(Role.ADMIN)
    bad_name = client.post(u("agent_create"), {"name": "-bad name", "budget_period": "daily"})
    assert bad_name.status_code == 400
    assert "Use letters, digits" in bad_name.content.decode()  # the model validator's words
    taken = client.post(
        u("agent_create"), {"name": agent.name, "budget_period": "daily", "budget_limit_usd": "1"}
    )
    assert taken.status_code == 400 and "name:" in taken.content.decode()
    assert Agent.objects.filter(tenant=tenant).count() == 1
    assert not Budget.objects.exists()
    too_low = client.post(
        u("agent_create"), {"name": "ok", "rpm_limit": "0", "budget_period": "daily"}
    )
    assert too_low.status_code == 400 and not Agent.objects.filter(name="ok").exists()


def test_editing_an_agent_changes_and_removes_its_budget(portal_client, tenant, agent):
    budget_create(tenant=tenant, agent=agent, limit_microcents=10**8)
    client, _ = portal_client(Role.ADMIN)
    edit = client.get(u("agent_edit", agent_id=agent.pk)).content.decode()
    assert 'value="1' in edit  # the current $1 limit is filled in
    client.post(
        u("agent_edit", agent_id=agent.pk),
        {"name": agent.name, "budget_period": "monthly", "budget_limit_usd": "3"},
    )
    assert Budget.objects.get(agent=agent).limit_microcents == 300_000_000
    client.post(u("agent_edit", agent_id=agent.pk), {"name": agent.name, "budget_period": "daily"})
    assert not Budget.objects.filter(agent=agent).exists()


def test_deactivating_an_agent_revokes_its_keys(portal_client, agent, api_key):
    client, _ = portal_client(Role.ADMIN)
    assert client.post(u("agent_deactivate", agent_id=agent.pk)).status_code == 302
    agent.refresh_from_db()
    assert not agent.is_active
    assert ApiKey.objects.get(pk=api_key[0].pk).revoked_at is not None


def test_a_key_is_shown_once_and_never_in_a_later_page_or_log(portal_client, agent, caplog):
    client, user = portal_client(Role.MEMBER)
    caplog.set_level(logging.DEBUG)
    created = client.post(
        u("key_create"),
        {"agent": str(agent.pk), "name": "prod", "scopes": ["inference"], "expires_in_days": "30"},
    )
    assert created.status_code == 201
    assert created["Cache-Control"].startswith("no-store") or "no-store" in created["Cache-Control"]
    plain = KEY_RE.search(created.content.decode())[0]
    key = api_key_authenticate(plain=plain)
    assert key.name == "prod" and key.created_by == user and key.scopes == ["inference"]
    assert key.expires_at > timezone.now() + timezone.timedelta(days=29)
    for name in ["overview", "agents", "budgets", "keys", "usage", "members", "playground"]:
        assert plain not in client.get(u(name)).content.decode(), name
    assert key.prefix in client.get(u("keys")).content.decode()
    assert plain not in caplog.text and key.prefix in caplog.text


def test_a_member_cannot_mint_a_key_with_more_power_than_their_role(portal_client, agent):
    client, _ = portal_client(Role.MEMBER)
    response = client.post(
        u("key_create"), {"agent": str(agent.pk), "scopes": [Scope.MANAGEMENT_WRITE]}
    )
    assert response.status_code == 403
    assert b"cannot grant the management.write scope" in response.content
    assert not ApiKey.objects.exists()


def test_rotation_keeps_the_old_key_for_the_grace_then_revoke_stops_it(portal_client, api_key):
    old, old_plain = api_key
    client, _ = portal_client(Role.ADMIN)
    rotated = client.post(u("key_rotate", key_id=old.pk), {"grace_seconds": "3600"})
    assert rotated.status_code == 201 and "no-store" in rotated["Cache-Control"]
    new_plain = KEY_RE.search(rotated.content.decode())[0]
    assert new_plain != old_plain
    assert api_key_authenticate(plain=old_plain).pk == old.pk  # still works in its grace
    new = api_key_authenticate(plain=new_plain)
    assert new.rotated_from_id == old.pk and new.scopes == old.scopes
    old.refresh_from_db()
    assert timezone.now() < old.expires_at <= timezone.now() + timezone.timedelta(seconds=3601)
    assert "in grace" in client.get(u("keys")).content.decode()
    assert client.post(u("key_revoke", key_id=old.pk)).status_code == 302
    with pytest.raises(AuthenticationFailed):
        api_key_authenticate(plain=old_plain)
    again = client.post(u("key_rotate", key_id=old.pk), {"grace_seconds": "0"})
    assert again.status_code == 400 and b"Only a usable key can be rotated." in again.content


def test_members_added_by_username_or_email_under_the_owner_rules(
    portal_client, tenant, make_user, owner
):
    make_user("nina", email="Nina@Example.com")
    make_user("paul")
    make_user("quinn")
    client, _ = portal_client(Role.ADMIN)
    assert (
        client.post(u("member_add"), {"username": "nina@example.com", "role": "member"}).status_code
        == 302
    )
    assert client.post(u("member_add"), {"username": "paul", "role": "viewer"}).status_code == 302
    roles = dict(Membership.objects.filter(tenant=tenant).values_list("user__username", "role"))
    assert roles["nina"] == "member" and roles["paul"] == "viewer"
    unknown = client.post(u("member_add"), {"username": "nobody", "role": "viewer"})
    assert (
        unknown.status_code == 400
        and b"No active user with that username or email." in unknown.content
    )
    owner_grant = client.post(u("member_add"), {"username": "quinn", "role": "owner"})
    assert owner_grant.status_code == 403  # admins cannot make owners
    owner_membership = Membership.objects.get(tenant=tenant, user=owner)
    assert client.post(u("member_remove", member_id=owner_membership.pk)).status_code == 403
    owner_client, _ = portal_client(Role.OWNER)
    last = owner_client.post(u("member_role", member_id=owner_membership.pk), {"role": "admin"})
    assert last.status_code == 400 and b"A tenant must keep at least one owner." in last.content
    paul = Membership.objects.get(tenant=tenant, user__username="paul")
    owner_client.post(u("member_role", member_id=paul.pk), {"role": "admin"})
    owner_client.post(
        u(
            "member_remove",
            member_id=Membership.objects.get(tenant=tenant, user__username="nina").pk,
        )
    )
    roles = dict(Membership.objects.filter(tenant=tenant).values_list("user__username", "role"))
    assert roles == {"olivia": "owner", "paul": "admin", "admin-acme": "admin"}


def test_the_playground_gets_a_short_lived_inference_key_as_json_only(
    portal_client, agent, other_agent, settings
):
    client, user = portal_client(Role.MEMBER)
    first = client.post(u("playground_key"), {"agent": str(agent.pk)})
    assert first.status_code == 201 and "no-store" in first["Cache-Control"]
    key = api_key_authenticate(plain=first.json()["key"])
    assert key.scopes == ["inference"] and key.created_by == user
    assert key.expires_at <= timezone.now() + timezone.timedelta(
        seconds=settings.FAIRLANE_PLAYGROUND_KEY_SECONDS
    )
    second = client.post(u("playground_key"), {"agent": str(agent.pk)}).json()["key"]
    with pytest.raises(AuthenticationFailed):  # one live playground key per person and agent
        api_key_authenticate(plain=first.json()["key"])
    api_key_authenticate(plain=second)
    assert client.post(u("playground_key"), {"agent": str(other_agent.pk)}).status_code == 404
    assert client.post(u("playground_key"), {"agent": "not-a-uuid"}).status_code == 404
    assert second not in client.get(u("playground")).content.decode()


def _spend(tenant, agent, microcents, request_id, status=UsageRecord.Status.OK):
    budget_reserve(tenant=tenant, agent=agent, amount_microcents=microcents, request_id=request_id)
    return budget_settle(
        tenant=tenant,
        request_id=request_id,
        cost_microcents=microcents,
        usage=Usage(model="tiny", prompt_tokens=5, completion_tokens=7, status=status),
    )


def test_banners_say_when_a_budget_is_nearly_or_fully_spent_and_pages_still_load(
    portal_client, tenant, agent
):
    budget_create(tenant=tenant, agent=agent, limit_microcents=1000)
    budget_create(tenant=tenant, agent=None, limit_microcents=10_000)
    client, _ = portal_client(Role.VIEWER)
    assert b'class="banner ' not in client.get(u("overview")).content
    _spend(tenant, agent, 850, "r1")
    page = client.get(u("overview")).content.decode()
    assert "support-bot&#x27;s daily budget is 85 % used" in page
    _spend(tenant, agent, 150, "r2")
    for name in ["overview", "agents", "budgets", "keys", "usage", "members", "playground"]:
        response = client.get(u(name))
        assert response.status_code == 200, name
        assert "budget is spent: its API requests are refused" in response.content.decode(), name


def test_the_ledger_row_of_a_request_is_readable_by_its_tenant_only(
    portal_client, tenant, agent, other_tenant, other_agent
):
    _spend(tenant, agent, 1234, "mine")
    _spend(other_tenant, other_agent, 99, "theirs")
    client, _ = portal_client(Role.VIEWER)
    row = client.get(u("usage_request", request_id="mine")).json()
    assert row["cost_microcents"] == 1234 and row["completion_tokens"] == 7
    assert client.get(u("usage_request", request_id="theirs")).status_code == 404
