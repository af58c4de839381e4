"""One audited action per test case, each through the surface people use (the management
API, the portal, the admin, a management command) and checked in its record: the action, the
object, the tenant, who did it and through what, and what changed."""

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.test import Client

from routing.models import Backend
from tenants.models import AuditRecord, Budget, Role, Scope
from tenants.services.budgets import budget_create
from tenants.services.keys import api_key_create
from tests.governance.conftest import last_record
from workers.models import TrustedKey

pytestmark = pytest.mark.django_db


def api(client, method, url, body=None, **headers):
    return getattr(client, method)(
        url,
        data=json.dumps(body) if body is not None else None,
        content_type="application/json",
        **headers,
    )


def test_a_key_made_through_the_api_is_recorded_with_request_trace_and_address(
    tenant, agent, portal_as
):
    client, admin = portal_as(Role.ADMIN)
    response = api(
        client,
        "post",
        f"/api/tenants/{tenant.slug}/keys/",
        {"agent": str(agent.pk), "name": "ci"},
        HTTP_X_REQUEST_ID="req-abc.1",
        HTTP_TRACEPARENT="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        REMOTE_ADDR="203.0.113.7",
    )
    assert response.status_code == 201, response.content
    record = last_record(action="api_key.create")
    assert (record.tenant_id, record.object_type, record.object_id) == (
        tenant.pk,
        "apikey",
        response.json()["id"],
    )
    assert (record.actor_type, record.actor, record.actor_id) == (
        "user",
        admin.username,
        str(admin.pk),
    )
    assert (record.source, record.request_id, record.trace_id, record.ip) == (
        "api",
        "req-abc.1",
        "0af7651916cd43dd8448eb211c80319c",
        "203.0.113.7",
    )
    assert record.before is None and record.after["name"] == "ci"


def test_a_key_acting_through_the_api_is_the_actor(tenant, agent, api_key):
    _, plain = api_key
    client = Client(HTTP_AUTHORIZATION=f"Bearer {plain}")
    response = api(
        client,
        "post",
        f"/api/tenants/{tenant.slug}/budgets/",
        {"agent": str(agent.pk), "period": "daily", "limit_microcents": 500},
    )
    assert response.status_code == 201, response.content
    record = last_record(action="budget.create")
    assert (record.actor_type, record.actor) == ("api_key", api_key[0].prefix)
    assert record.after["limit_microcents"] == 500


@pytest.mark.parametrize(
    "action, change",
    [
        (
            "budget.update",
            lambda c, t, b: api(
                c, "patch", f"/api/tenants/{t.slug}/budgets/{b.pk}/", {"limit_microcents": 900}
            ),
        ),
        (
            "budget.delete",
            lambda c, t, b: api(c, "delete", f"/api/tenants/{t.slug}/budgets/{b.pk}/"),
        ),
    ],
)
def test_budget_changes_keep_before_and_after(tenant, agent, portal_as, action, change):
    budget = budget_create(tenant=tenant, agent=agent, limit_microcents=300)
    client, _ = portal_as(Role.ADMIN)
    assert change(client, tenant, budget).status_code in (200, 204)
    record = last_record(action=action)
    assert record.before["limit_microcents"] == 300
    assert record.after == ({"limit_microcents": 900} if action == "budget.update" else None)


def test_revoke_and_rotate_through_the_portal_and_the_api(tenant, agent, portal_as):
    client, _ = portal_as(Role.MEMBER)
    key, _ = api_key_create(tenant=tenant, agent=agent, name="old")
    assert (
        api(
            client,
            "post",
            f"/api/tenants/{tenant.slug}/keys/{key.pk}/rotate/",
            {"grace_seconds": 0},
        ).status_code
        == 201
    )
    assert last_record(action="api_key.rotate", object_id=str(key.pk)).after["revoked_at"]
    other, _ = api_key_create(tenant=tenant, agent=agent, name="other")
    assert client.post(f"/portal/t/{tenant.slug}/keys/{other.pk}/revoke/").status_code == 302
    record = last_record(action="api_key.revoke", object_id=str(other.pk))
    assert record.source == "portal" and record.before == {"revoked_at": None}


def test_members_roles_and_the_departed_keys_policy(tenant, agent, portal_as, member_of):
    owner_client, _ = portal_as(Role.OWNER)
    departing = member_of(tenant, Role.ADMIN, "dana")
    key, _ = api_key_create(tenant=tenant, agent=agent, created_by=departing, name="dana's")
    assert (
        owner_client.post(
            f"/portal/t/{tenant.slug}/members/keys-policy/", {"departed_member_keys": "hand_over"}
        ).status_code
        == 302
    )
    policy = last_record(action="tenant.update")
    assert (policy.before, policy.after) == (
        {"departed_member_keys": "revoke"},
        {"departed_member_keys": "hand_over"},
    )
    membership = tenant.memberships.get(user=departing)
    assert (
        owner_client.post(
            f"/portal/t/{tenant.slug}/members/{membership.pk}/role/", {"role": "viewer"}
        ).status_code
        == 302
    )
    role = last_record(action="member.role")
    assert (role.before, role.after) == ({"role": "admin"}, {"role": "viewer"})
    handed = last_record(action="api_key.hand_over", object_id=str(key.pk))
    assert handed.after["reason"] == "role changed to viewer" and handed.after["handed_over_at"]
    assert (
        owner_client.post(f"/portal/t/{tenant.slug}/members/{membership.pk}/remove/").status_code
        == 302
    )
    removed = last_record(action="member.remove")
    assert removed.before["user_id"] == departing.pk and removed.after is None


def test_agents_and_their_routing(tenant, portal_as):
    client, _ = portal_as(Role.ADMIN)
    created = api(client, "post", f"/api/tenants/{tenant.slug}/agents/", {"name": "writer"})
    agent_id = created.json()["id"]
    assert last_record(action="agent.create").object_id == agent_id
    api(client, "patch", f"/api/tenants/{tenant.slug}/agents/{agent_id}/", {"rpm_limit": 9})
    assert last_record(action="agent.update").after == {"rpm_limit": 9}
    response = api(
        client,
        "put",
        f"/api/tenants/{tenant.slug}/agents/{agent_id}/routing/",
        {"chain": ["local"], "policy": "chain"},
    )
    assert response.status_code == 200, response.content
    routing = last_record(action="agent_routing.set")
    assert routing.tenant_id == tenant.pk and routing.after["chain"] == ["local"]
    api(client, "delete", f"/api/tenants/{tenant.slug}/agents/{agent_id}/")
    assert last_record(action="agent.deactivate").after == {"is_active": False}


def test_alert_rules_and_destinations_in_the_portal(tenant, agent, portal_as):
    budget = budget_create(tenant=tenant, agent=agent, limit_microcents=300)
    client, _ = portal_as(Role.ADMIN)
    prefix = f"b{str(budget.pk)[:8]}"
    client.post(
        f"/portal/t/{tenant.slug}/alerts/rules/{budget.pk}/",
        {f"{prefix}-thresholds": "90", f"{prefix}-forecast": ""},
    )
    rules = last_record(action="alert_rules.set")
    assert rules.before == {"thresholds": [50, 80, 100], "forecast": True}
    assert rules.after == {"thresholds": [90], "forecast": False}
    client.post(
        f"/portal/t/{tenant.slug}/alerts/destinations/",
        {"kind": "email", "target": "ops@acme.example"},
    )
    added = last_record(action="alert_destination.add")
    client.post(f"/portal/t/{tenant.slug}/alerts/destinations/{added.object_id}/remove/")
    assert last_record(action="alert_destination.remove").before["target"] == "ops@acme.example"


def test_commands_name_themselves_as_the_actor(tmp_path, settings):
    settings.FAIRLANE_TRUSTED_KEYS = []
    call_command("model_keygen", str(tmp_path / "k.pem"), stdout=StringIO())
    public = (tmp_path / "k.pem.pub").read_text().strip()
    call_command("model_trust", "release", public, stdout=StringIO())
    added = last_record(action="trustedkey.add")
    assert (added.actor_type, added.actor_id, added.source) == ("command", "model_trust", "command")
    assert added.actor.startswith("manage.py model_trust (by ") and added.tenant_id is None
    call_command("model_trust", "--revoke", TrustedKey.objects.get().key_id, stdout=StringIO())
    assert last_record(action="trustedkey.revoke").after == {"is_active": False}
    call_command(
        "backend_add",
        "openrouter",
        "--kind",
        "openrouter",
        "--base-url",
        "https://openrouter.example/api/v1",
        "--credential-ref",
        "env:OPENROUTER_KEY",
        stdout=StringIO(),
    )
    backend = last_record(action="backend.register")
    assert backend.after["credential_ref"] == "[masked]" and backend.actor_id == "backend_add"


def test_models_and_versions_through_their_commands():
    call_command("model_register", "tiny", "preset:tiny", "--version", "v1", stdout=StringIO())
    assert last_record(action="model.register").object_repr.startswith("tiny")
    assert last_record(action="modelversion.add").after["label"] == "v1"
    call_command(
        "model_register",
        "tiny",
        "preset:tiny@2",
        "--version",
        "v2",
        "--canary",
        "10",
        stdout=StringIO(),
    )
    call_command("model_promote", "tiny", stdout=StringIO())
    promoted = last_record(action="modelversion.promote")
    assert (promoted.before["state"], promoted.after["state"]) == ("canary", "primary")
    call_command("model_rollback", "tiny", stdout=StringIO())
    assert last_record(action="modelversion.rollback").actor_id == "model_rollback"


def test_the_admin_records_saves_deletes_and_password_changes(admin_client, tenant, admin_user):
    response = admin_client.post(
        "/admin/routing/backend/add/",
        {
            "name": "vllm-a",
            "kind": "openai",
            "base_url": "https://api.openai.com",
            "credential": "sk-live-abcdef",
            "credential_ref": "",
            "context_length": 0,
            "accelerator": "gpu",
            "max_concurrency": 0,
            "energy_mj_per_token": 0,
            "carbon_g_per_kwh": 0,
            "lease_seconds": 0,
            "queue_depth": 0,
            "timeout_seconds": 60,
            "is_enabled": "on",
            "health": "unknown",
            "probe_p50_ms": 0,
            "probe_p95_ms": 0,
            "probe_error_rate": 0,
            "zone": "",
            "models-TOTAL_FORMS": 1,
            "models-INITIAL_FORMS": 0,
            "models-0-model": "gpt",
            "models-0-upstream_name": "gpt-4o-mini",
            "models-0-price_input_per_mtok": 15_000_000,
            "models-0-price_output_per_mtok": 60_000_000,
            "models-0-price_cached_per_mtok": 0,
        },
    )
    assert response.status_code == 302, response.content[:2000]
    created = last_record(action="backend.create")
    assert (created.source, created.actor) == ("admin", admin_user.username)
    assert created.after["credential_encrypted"] == "[masked]"
    assert last_record(action="backendmodel.create").after["model"] == "gpt"
    backend = Backend.objects.get(name="vllm-a")
    admin_client.post(f"/admin/routing/backend/{backend.pk}/delete/", {"post": "yes"})
    assert last_record(action="backend.delete").before["name"] == "vllm-a"
    user = tenant.memberships.get().user
    admin_client.post(
        f"/admin/auth/user/{user.pk}/password/",
        {"password1": "a-new-Passw0rd!", "password2": "a-new-Passw0rd!"},
    )
    assert last_record(action="user.password_set").after == {"password": "[masked]"}


def test_scim_tokens_and_sso_only_in_the_portal(tenant, portal_as):
    client, _ = portal_as(Role.OWNER)
    assert (
        client.post(f"/portal/t/{tenant.slug}/identity/scim-tokens/", {"name": "okta"}).status_code
        == 201
    )
    assert last_record(action="scim_token.create").after["secret_hash"] == "[masked]"
    client.post(f"/portal/t/{tenant.slug}/identity/sso-only/", {"sso_only": "on"})
    assert last_record(action="tenant.update").after == {"sso_only": True}


def test_nothing_is_recorded_for_a_change_that_changes_nothing(tenant, agent):
    from tenants.services.budgets import budget_update

    budget = budget_create(tenant=tenant, agent=agent, limit_microcents=300)
    count = AuditRecord.objects.count()
    budget_update(budget=Budget.objects.get(pk=budget.pk), limit_microcents=300)
    assert AuditRecord.objects.count() == count


def test_the_v1_api_writes_no_audit_record(tenant, agent):
    _, plain = api_key_create(tenant=tenant, agent=agent, scopes=[Scope.INFERENCE.value])
    count = AuditRecord.objects.count()
    Client().get("/v1/models", HTTP_AUTHORIZATION=f"Bearer {plain}")
    assert AuditRecord.objects.count() == count
