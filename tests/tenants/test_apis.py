"""The management API over HTTP (DRF test client): roles, cross-tenant isolation, keys shown
once, and bad input answered with a clear 4xx in the OpenAI error shape that writes nothing."""

import json
import uuid

import pytest
from django.core import serializers as django_serializers

from tenants.models import (
    MAX_MICROCENTS,
    Agent,
    ApiKey,
    Budget,
    Membership,
    Role,
    Scope,
    Tenant,
    UsageRecord,
)
from tenants.services.budgets import budget_create, budget_reserve
from tenants.services.keys import api_key_authenticate, api_key_create
from tenants.services.ledger import Usage, budget_settle


def assert_error(response, status: int, code: str, param: str | None = ...) -> dict:
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "code", "param"}
    assert body["error"]["code"] == code and body["error"]["message"]
    if param is not ...:
        assert body["error"]["param"] == param
    return body["error"]


def snapshot(tenant) -> str:
    """Everything a tenant owns, to prove a request changed none of it."""
    rows = [
        tenant,
        *Membership.objects.filter(tenant=tenant),
        *Agent.objects.filter(tenant=tenant),
        *ApiKey.objects.filter(tenant=tenant),
        *Budget.objects.filter(tenant=tenant),
        *UsageRecord.objects.filter(tenant=tenant),
    ]
    return django_serializers.serialize("json", rows)


@pytest.fixture
def owner_client(client_for, owner):
    return client_for(user=owner)


# --- happy paths -----------------------------------------------------------------------------


def test_tenant_list_shows_only_my_tenants_with_my_role(owner_client, tenant, other_tenant):
    body = owner_client.get("/api/tenants/").json()
    assert [(t["slug"], t["role"]) for t in body["results"]] == [("acme", "owner")]


def test_create_tenant_makes_me_its_owner(client_for, make_user):
    client = client_for(user=make_user("newbie"))
    response = client.post(
        "/api/tenants/",
        {"name": "Initech", "slug": "initech", "timezone": "Asia/Tokyo"},
        format="json",
    )
    assert response.status_code == 201, response.content
    assert response.json()["role"] == "owner"
    tenant = Tenant.objects.get(slug="initech")
    assert tenant.timezone == "Asia/Tokyo"
    assert Membership.objects.get(tenant=tenant).role == Role.OWNER


def test_agent_key_budget_usage_flow(owner_client, tenant):
    agent = owner_client.post(
        "/api/tenants/acme/agents/",
        {"name": "writer", "allowed_models": ["tiny"], "lane": "bulk"},
        format="json",
    )
    assert agent.status_code == 201, agent.content
    agent_id = agent.json()["id"]
    assert agent.json()["effective_lane"] == "bulk"

    created = owner_client.post(
        "/api/tenants/acme/keys/", {"agent": agent_id, "name": "prod"}, format="json"
    )
    assert created.status_code == 201 and created["Cache-Control"] == "no-store"
    plain = created.json()["key"]
    assert api_key_authenticate(plain=plain).agent_id == uuid.UUID(agent_id)
    assert created.json()["scopes"] == [Scope.INFERENCE]

    budget = owner_client.post(
        "/api/tenants/acme/budgets/",
        {"agent": agent_id, "limit_microcents": 5_000_000},
        format="json",
    )
    assert budget.status_code == 201, budget.content
    assert budget.json()["window"]["remaining_microcents"] == 5_000_000

    agent_row = Agent.objects.get(pk=agent_id)
    budget_reserve(tenant=tenant, agent=agent_row, amount_microcents=2_000_000, request_id="r1")
    budget_settle(
        tenant=tenant,
        request_id="r1",
        cost_microcents=1_500_000,
        usage=Usage(model="tiny", backend="local", prompt_tokens=7, completion_tokens=3),
    )
    window = owner_client.get(f"/api/tenants/acme/budgets/{budget.json()['id']}/").json()["window"]
    assert (window["spent_microcents"], window["remaining_microcents"]) == (1_500_000, 3_500_000)

    usage = owner_client.get(f"/api/tenants/acme/usage/?agent={agent_id}").json()
    assert usage["count"] == 1 and usage["results"][0]["total_tokens"] == 10
    summary = owner_client.get("/api/tenants/acme/usage/summary/").json()["results"]
    assert summary == [
        {
            "agent_name": "writer",
            "api_key_prefix": None,  # not grouped by (group_by: agent,model by default)
            "member_username": None,
            "model": "tiny",
            "requests": 1,
            "prompt_tokens": 7,
            "completion_tokens": 3,
            "cached_tokens": 0,
            "cost_microcents": 1_500_000,
        }
    ]


def test_key_auth_works_for_programs_with_management_scope(client_for, api_key, tenant):
    client = client_for(key=api_key[1])
    assert client.get("/api/me/").json()["tenant"] == "acme"
    assert [t["slug"] for t in client.get("/api/tenants/").json()["results"]] == ["acme"]
    response = client.post("/api/tenants/acme/agents/", {"name": "from-a-program"}, format="json")
    assert response.status_code == 201


def test_inference_only_key_cannot_use_the_management_api(client_for, tenant, agent):
    _, plain = api_key_create(tenant=tenant, agent=agent, scopes=[Scope.INFERENCE])
    assert_error(client_for(key=plain).get("/api/tenants/acme/agents/"), 403, "permission")


def test_revoked_key_is_refused_on_the_next_request(client_for, owner_client, api_key):
    key, plain = api_key
    program = client_for(key=plain)
    assert program.get("/api/tenants/acme/").status_code == 200
    revoked = owner_client.delete(f"/api/tenants/acme/keys/{key.pk}/")
    assert revoked.status_code == 200 and revoked.json()["revoked_at"]
    response = program.get("/api/tenants/acme/")
    assert_error(response, 401, "authentication")
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_rotate_returns_a_new_key_once_and_old_one_keeps_its_grace(owner_client, api_key):
    key, old_plain = api_key
    response = owner_client.post(
        f"/api/tenants/acme/keys/{key.pk}/rotate/", {"grace_seconds": 60}, format="json"
    )
    assert response.status_code == 201
    body = response.json()
    assert body["rotated_from"] == str(key.pk) and body["key"] != old_plain
    api_key_authenticate(plain=old_plain)
    api_key_authenticate(plain=body["key"])


def test_key_list_and_detail_never_show_a_secret(owner_client, api_key):
    key, plain = api_key
    for url in ["/api/tenants/acme/keys/", f"/api/tenants/acme/keys/{key.pk}/"]:
        response = owner_client.get(url)
        assert response.status_code == 200
        assert "key" not in (response.json().get("results") or [response.json()])[0]
        assert plain.rsplit("-", 1)[1] not in response.content.decode()
        assert key.secret_hash not in response.content.decode()


def test_members_can_be_added_and_roles_changed_but_one_owner_remains(
    owner_client, owner, make_user, tenant
):
    make_user("dana")
    added = owner_client.post(
        "/api/tenants/acme/members/", {"username": "dana", "role": "viewer"}, format="json"
    )
    assert added.status_code == 201, added.content
    changed = owner_client.patch(
        f"/api/tenants/acme/members/{added.json()['id']}/", {"role": "admin"}, format="json"
    )
    assert changed.json()["role"] == "admin"
    me = Membership.objects.get(tenant=tenant, user=owner)
    assert_error(
        owner_client.patch(f"/api/tenants/acme/members/{me.pk}/", {"role": "admin"}, format="json"),
        400,
        "invalid_request",
    )
    assert_error(owner_client.delete(f"/api/tenants/acme/members/{me.pk}/"), 400, "invalid_request")
    assert Membership.objects.get(pk=me.pk).role == Role.OWNER


# --- roles -----------------------------------------------------------------------------------


def test_viewer_reads_but_cannot_write(client_for, member_of, tenant, agent):
    viewer = client_for(user=member_of(tenant, Role.VIEWER))
    assert viewer.get("/api/tenants/acme/agents/").status_code == 200
    before = snapshot(tenant)
    assert_error(
        viewer.post("/api/tenants/acme/agents/", {"name": "x"}, format="json"), 403, "permission"
    )
    assert_error(
        viewer.post("/api/tenants/acme/keys/", {"agent": str(agent.pk)}, format="json"),
        403,
        "permission",
    )
    assert_error(
        viewer.patch("/api/tenants/acme/", {"name": "Hacked"}, format="json"), 403, "permission"
    )
    assert snapshot(tenant) == before


def test_member_manages_keys_but_not_agents_and_not_powerful_keys(
    client_for, member_of, tenant, agent
):
    member = client_for(user=member_of(tenant, Role.MEMBER))
    ok = member.post("/api/tenants/acme/keys/", {"agent": str(agent.pk)}, format="json")
    assert ok.status_code == 201
    assert_error(
        member.post(
            "/api/tenants/acme/keys/",
            {"agent": str(agent.pk), "scopes": ["management.write"]},
            format="json",
        ),
        403,
        "permission",
    )
    assert_error(
        member.post("/api/tenants/acme/agents/", {"name": "x"}, format="json"), 403, "permission"
    )
    assert_error(
        member.post("/api/tenants/acme/budgets/", {"limit_microcents": 1}, format="json"),
        403,
        "permission",
    )


def test_admin_manages_agents_and_budgets_but_cannot_make_owners(
    client_for, member_of, make_user, tenant
):
    admin = client_for(user=member_of(tenant, Role.ADMIN))
    assert admin.post("/api/tenants/acme/agents/", {"name": "x"}, format="json").status_code == 201
    assert (
        admin.post("/api/tenants/acme/budgets/", {"limit_microcents": 1}, format="json").status_code
        == 201
    )
    make_user("eve")
    assert_error(
        admin.post(
            "/api/tenants/acme/members/", {"username": "eve", "role": "owner"}, format="json"
        ),
        403,
        "permission",
    )
    assert not Membership.objects.filter(user__username="eve").exists()


def test_read_only_key_acts_as_a_viewer(client_for, tenant, agent):
    _, plain = api_key_create(tenant=tenant, agent=agent, scopes=[Scope.MANAGEMENT_READ])
    client = client_for(key=plain)
    assert client.get("/api/tenants/acme/keys/").status_code == 200
    assert_error(
        client.post("/api/tenants/acme/keys/", {"agent": str(agent.pk)}, format="json"),
        403,
        "permission",
    )


def test_unauthenticated_requests_get_401_in_the_error_shape(client_for, tenant):
    for url in ["/api/me/", "/api/tenants/", "/api/tenants/acme/agents/"]:
        response = client_for().get(url)
        assert_error(response, 401, "authentication")
        assert response["WWW-Authenticate"] == 'Bearer realm="fairlane"'


def test_session_writes_need_the_csrf_token(client_for, owner, tenant):
    client = client_for(user=owner, csrf=True)
    assert_error(
        client.post("/api/tenants/acme/agents/", {"name": "x"}, format="json"), 403, "permission"
    )
    assert not Agent.objects.filter(name="x").exists()


# --- cross-tenant ------------------------------------------------------------------------------


@pytest.fixture
def theirs(other_tenant, other_agent, other_api_key, other_owner, make_user):
    """Globex's objects, which Acme's people and keys must neither see nor touch."""
    budget = budget_create(tenant=other_tenant, agent=other_agent, limit_microcents=100)
    budget_reserve(tenant=other_tenant, agent=other_agent, amount_microcents=10, request_id="g1")
    budget_settle(tenant=other_tenant, request_id="g1", cost_microcents=5, usage=Usage())
    member = Membership.objects.get(tenant=other_tenant, user=other_owner)
    return {
        "agent": other_agent.pk,
        "key": other_api_key[0].pk,
        "budget": budget.pk,
        "member": member.pk,
    }


def cross_tenant_requests(t: dict) -> list[tuple[str, str, dict | None]]:
    g = "/api/tenants/globex"
    a = "/api/tenants/acme"
    return [
        ("get", f"{g}/", None),
        ("patch", f"{g}/", {"name": "pwned"}),
        ("get", f"{g}/members/", None),
        ("post", f"{g}/members/", {"username": "olivia"}),
        ("patch", f"{g}/members/{t['member']}/", {"role": "viewer"}),
        ("delete", f"{g}/members/{t['member']}/", None),
        ("get", f"{g}/agents/", None),
        ("post", f"{g}/agents/", {"name": "intruder"}),
        ("get", f"{g}/agents/{t['agent']}/", None),
        ("patch", f"{g}/agents/{t['agent']}/", {"name": "pwned"}),
        ("delete", f"{g}/agents/{t['agent']}/", None),
        ("get", f"{g}/keys/", None),
        ("post", f"{g}/keys/", {"agent": str(t["agent"])}),
        ("get", f"{g}/keys/{t['key']}/", None),
        ("delete", f"{g}/keys/{t['key']}/", None),
        ("post", f"{g}/keys/{t['key']}/rotate/", {}),
        ("get", f"{g}/budgets/", None),
        ("post", f"{g}/budgets/", {"limit_microcents": 1}),
        ("get", f"{g}/budgets/{t['budget']}/", None),
        ("patch", f"{g}/budgets/{t['budget']}/", {"limit_microcents": 10**9}),
        ("delete", f"{g}/budgets/{t['budget']}/", None),
        ("get", f"{g}/usage/", None),
        ("get", f"{g}/usage/summary/", None),
        # Our own tenant in the URL, their objects' ids in the path or the body.
        ("get", f"{a}/agents/{t['agent']}/", None),
        ("patch", f"{a}/agents/{t['agent']}/", {"name": "pwned"}),
        ("delete", f"{a}/agents/{t['agent']}/", None),
        ("get", f"{a}/keys/{t['key']}/", None),
        ("delete", f"{a}/keys/{t['key']}/", None),
        ("post", f"{a}/keys/{t['key']}/rotate/", {}),
        ("post", f"{a}/keys/", {"agent": str(t["agent"])}),
        ("get", f"{a}/keys/?agent={t['agent']}", None),
        ("get", f"{a}/budgets/{t['budget']}/", None),
        ("patch", f"{a}/budgets/{t['budget']}/", {"limit_microcents": 10**9}),
        ("delete", f"{a}/budgets/{t['budget']}/", None),
        ("post", f"{a}/budgets/", {"agent": str(t["agent"]), "limit_microcents": 1}),
        ("patch", f"{a}/members/{t['member']}/", {"role": "viewer"}),
        ("delete", f"{a}/members/{t['member']}/", None),
        ("get", f"{a}/usage/?agent={t['agent']}", None),
        ("post", f"{a}/budgets/", {"api_key": str(t["key"]), "limit_microcents": 1}),
        ("post", f"{a}/budgets/", {"member": t["member"], "limit_microcents": 1}),
        ("get", f"{a}/usage/?api_key={t['key']}", None),
        ("get", f"{a}/usage/summary/?member={t['member']}", None),
    ]


@pytest.mark.parametrize("principal", ["owner-session", "admin-key"])
def test_another_tenants_objects_are_invisible_and_untouchable(
    principal, client_for, owner, api_key, tenant, other_tenant, theirs
):
    client = client_for(user=owner) if principal == "owner-session" else client_for(key=api_key[1])
    before = snapshot(other_tenant)
    for method, url, body in cross_tenant_requests(theirs):
        response = getattr(client, method)(url, body, format="json")
        assert response.status_code == 404, (method, url, response.status_code, response.content)
        assert_error(response, 404, "not_found")
        assert "globex" not in response.content.decode().lower().replace("/api/tenants/globex", "")
    assert snapshot(other_tenant) == before


def test_a_tenant_that_exists_and_one_that_does_not_answer_alike(owner_client, other_tenant):
    exists = owner_client.get("/api/tenants/globex/agents/")
    missing = owner_client.get("/api/tenants/no-such-tenant/agents/")
    assert (exists.status_code, exists.json()) == (missing.status_code, missing.json())


# --- bad input -------------------------------------------------------------------------------

BAD_AGENT_BODIES = [
    ({"name": 123}, "name"),
    ({"name": ""}, "name"),
    ({"name": "has space"}, "name"),
    ({"name": "x" * 101}, "name"),
    ({"name": "ok", "allowed_models": "tiny"}, "allowed_models"),
    ({"name": "ok", "lane": "vip"}, "lane"),
    ({"name": "ok", "colour": "red"}, "colour"),
    ({}, "name"),
    ([], None),
    ("just a string", None),
    (None, None),
]


@pytest.mark.parametrize("body,param", BAD_AGENT_BODIES)
def test_bad_agent_bodies_are_400_and_write_nothing(owner_client, tenant, body, param):
    before = snapshot(tenant)
    response = owner_client.post("/api/tenants/acme/agents/", body, format="json")
    error = assert_error(response, 400, "invalid_request")
    if param:
        assert error["param"] == param
    assert snapshot(tenant) == before


BAD_BUDGET_BODIES = [
    {"limit_microcents": -1},
    {"limit_microcents": MAX_MICROCENTS + 1},
    {"limit_microcents": 10**30},
    {"limit_microcents": "100"},
    {"limit_microcents": 1.5},
    {"limit_microcents": True},
    {"limit_microcents": None},
    {"limit_microcents": 1, "period": "hourly"},
    {"limit_microcents": 1, "agent": "not-a-uuid"},
    {"limit_microcents": 1, "extra": 1},
]


@pytest.mark.parametrize("body", BAD_BUDGET_BODIES)
def test_bad_budget_bodies_are_400_and_write_nothing(owner_client, tenant, body):
    before = snapshot(tenant)
    assert_error(
        owner_client.post("/api/tenants/acme/budgets/", body, format="json"), 400, "invalid_request"
    )
    assert snapshot(tenant) == before


def test_malformed_json_is_400(owner_client, tenant):
    before = snapshot(tenant)
    response = owner_client.generic(
        "POST", "/api/tenants/acme/agents/", '{"name": "x",', content_type="application/json"
    )
    error = assert_error(response, 400, "invalid_request")
    assert "JSON" in error["message"]
    assert snapshot(tenant) == before


def test_form_encoded_body_is_415(owner_client, tenant):
    response = owner_client.post("/api/tenants/acme/agents/", {"name": "x"})
    assert_error(response, 415, "unsupported_media_type")
    assert not Agent.objects.filter(name="x").exists()


def test_unknown_ids_are_404_and_bad_ids_are_404_routes(owner_client, tenant, agent):
    assert_error(owner_client.get(f"/api/tenants/acme/agents/{uuid.uuid4()}/"), 404, "not_found")
    assert_error(owner_client.get("/api/tenants/acme/agents/123/"), 404, "not_found")
    assert_error(
        owner_client.post("/api/tenants/acme/keys/", {"agent": str(uuid.uuid4())}, format="json"),
        404,
        "not_found",
    )
    assert_error(owner_client.get("/api/no-such-endpoint/"), 404, "not_found")


def test_unknown_scope_expiry_in_the_past_are_400_and_duplicate_names_409(
    owner_client, tenant, agent
):
    before = snapshot(tenant)
    for body, param in [
        ({"agent": str(agent.pk), "scopes": ["root"]}, "scopes[0]"),
        ({"agent": str(agent.pk), "scopes": []}, "scopes"),
        ({"agent": str(agent.pk), "expires_at": "2001-01-01T00:00:00Z"}, "expires_at"),
        ({"agent": str(agent.pk), "expires_at": "tomorrow"}, "expires_at"),
    ]:
        assert_error(
            owner_client.post("/api/tenants/acme/keys/", body, format="json"),
            400,
            "invalid_request",
            param,
        )
    # A name or owner already taken conflicts with what exists: 409, naming the field.
    assert_error(
        owner_client.post("/api/tenants/acme/agents/", {"name": agent.name}, format="json"),
        409,
        "conflict",
        "name",
    )
    budget_create(tenant=tenant, agent=agent, limit_microcents=1)
    before = snapshot(tenant)
    assert_error(
        owner_client.post(
            "/api/tenants/acme/budgets/",
            {"agent": str(agent.pk), "limit_microcents": 5},
            format="json",
        ),
        409,
        "conflict",
        "agent",
    )
    assert snapshot(tenant) == before


def test_bad_tenant_input(owner_client, tenant):
    assert_error(
        owner_client.post("/api/tenants/", {"name": "x", "slug": "acme"}, format="json"),
        409,
        "conflict",
        "slug",
    )  # taken
    for body, param in [
        ({"name": "x", "slug": "Not A Slug"}, "slug"),
        ({"name": "x", "slug": "new", "timezone": "Mars/Olympus"}, "timezone"),
    ]:
        assert_error(
            owner_client.post("/api/tenants/", body, format="json"), 400, "invalid_request", param
        )
    assert_error(
        owner_client.patch("/api/tenants/acme/", {"weight": 1000}, format="json"),
        400,
        "invalid_request",
        "weight",
    )
    assert Tenant.objects.count() == 1 and Tenant.objects.get().weight == 1


def test_usage_query_validation(owner_client, tenant):
    assert_error(
        owner_client.get("/api/tenants/acme/usage/?since=yesterday"),
        400,
        "invalid_request",
        "since",
    )
    assert_error(
        owner_client.get(
            "/api/tenants/acme/usage/?since=2026-02-01T00:00:00Z&until=2026-01-01T00:00:00Z"
        ),
        400,
        "invalid_request",
        "since",
    )


def test_method_not_allowed_is_405_in_the_error_shape(owner_client, tenant):
    assert_error(owner_client.delete("/api/tenants/acme/"), 405, "method_not_allowed")


def test_schema_and_docs_are_served(client_for):
    schema = client_for().get("/api/schema/?format=json")
    assert schema.status_code == 200
    paths = json.loads(schema.content)["paths"]
    assert "/api/tenants/{slug}/keys/{key_id}/rotate/" in paths
    docs = client_for().get("/api/docs/")
    assert docs.status_code == 200 and b"swagger-ui" in docs.content


def test_rate_limits_are_set_on_agents_and_keys_and_validated(owner_client, tenant):
    agent = owner_client.post(
        "/api/tenants/acme/agents/",
        {"name": "limited", "rpm_limit": 30, "concurrency_limit": 2},
        format="json",
    ).json()
    assert (agent["rpm_limit"], agent["tpm_limit"], agent["concurrency_limit"]) == (30, None, 2)
    key = owner_client.post(
        "/api/tenants/acme/keys/", {"agent": agent["id"], "tpm_limit": 5000}, format="json"
    ).json()
    assert key["tpm_limit"] == 5000
    patched = owner_client.patch(
        f"/api/tenants/acme/agents/{agent['id']}/", {"rpm_limit": None}, format="json"
    ).json()
    assert patched["rpm_limit"] is None
    before = snapshot(tenant)
    for bad in [0, -1, "30", 1.5, True]:
        assert_error(
            owner_client.patch(
                f"/api/tenants/acme/agents/{agent['id']}/", {"rpm_limit": bad}, format="json"
            ),
            400,
            "invalid_request",
            "rpm_limit",
        )
    assert snapshot(tenant) == before


def test_the_openapi_schema_generates_without_warnings(tmp_path):
    from django.core.management import call_command

    call_command("spectacular", "--fail-on-warn", "--file", str(tmp_path / "schema.yaml"))
    text = (tmp_path / "schema.yaml").read_text()
    assert "/api/tenants/{slug}/agents/{agent_id}/routing/:" in text
    assert "scheme: bearer" in text
