"""The routing part of the management API: the backends a tenant can route to, and each
agent's chain, policy and cascade, with the same roles and tenant scoping as the rest."""

import pytest

from routing.backend_store import backend_model_set, backend_register
from routing.models import AgentRouting
from routing.router import registry_get
from tenants.models import Role
from workers.serving.registration import model_register

pytestmark = pytest.mark.django_db


@pytest.fixture
def backend(db):
    backend = backend_register(
        name="claude",
        kind="anthropic",
        base_url="http://10.9.8.7:1",
        credential="sk-ant-secret-value",
    )
    backend_model_set(
        backend=backend,
        model="claude",
        upstream_name="claude-sonnet",
        price_output_per_mtok=1_500_000_000,
    )
    return backend


def url(tenant, agent):
    return f"/api/tenants/{tenant.slug}/agents/{agent.id}/routing/"


def test_members_see_backends_but_never_their_urls_or_credentials(
    backend, tenant, member_of, client_for
):
    response = client_for(member_of(tenant, Role.VIEWER)).get("/api/backends/")
    assert response.status_code == 200
    [row] = response.json()
    assert row["name"] == "claude" and row["kind"] == "anthropic"
    assert row["models"] == [
        {
            "model": "claude",
            "price_input_per_mtok": 0,
            "price_output_per_mtok": 1_500_000_000,
            "price_cached_per_mtok": 0,
        }
    ]
    assert "10.9.8.7" not in response.content.decode()
    assert "sk-ant" not in response.content.decode() and "credential" not in row
    assert client_for().get("/api/backends/").status_code in (401, 403)


def test_an_admin_sets_the_agents_routing_and_the_router_follows_it(
    backend, tenant, agent, member_of, client_for
):
    model_register(name="tiny", source="preset:tiny")  # a cascade names models that exist
    admin = client_for(member_of(tenant, Role.ADMIN))
    assert admin.get(url(tenant, agent)).json() == {
        "chain": [],
        "policy": "chain",
        "cascade": [],
        "cascade_threshold": -1.0,
    }
    response = admin.put(
        url(tenant, agent),
        {
            "chain": ["claude", "local"],
            "policy": "cost",
            "cascade": ["tiny", "claude"],
            "cascade_threshold": -0.8,
        },
        format="json",
    )
    assert response.status_code == 200, response.content
    plan = registry_get().agents[str(agent.id)]
    assert plan.chain == ("claude", "local") and plan.policy == "cost"
    assert plan.cascade == ("tiny", "claude") and plan.cascade_threshold == -0.8


def test_bad_routing_is_refused_naming_the_field_and_changes_nothing(
    backend, tenant, agent, member_of, client_for
):
    """A 400 for what is malformed; a 404 for what names nothing (an unknown backend or model,
    like an unknown agent id)."""
    admin = client_for(member_of(tenant, Role.ADMIN))
    for body, param, status in [
        ({"chain": ["nope"]}, "chain", 404),
        ({"policy": "fastest"}, "policy", 400),
        ({"cascade": ["one"]}, "cascade", 404),
        ({"cascade": ["claude"]}, "cascade", 400),
        ({"chain": "claude"}, "chain", 400),
        ({"cascade_threshold": 3}, "cascade_threshold", 400),
        ({"cascade_threshold": True}, "cascade_threshold", 400),
        ({"chian": ["claude"]}, "chian", 400),
    ]:
        response = admin.put(url(tenant, agent), body, format="json")
        assert response.status_code == status, body
        assert response.json()["error"]["param"] == param, body
    assert not AgentRouting.objects.exists()


def test_viewers_cannot_change_routing_and_other_tenants_cannot_see_it(
    backend, tenant, agent, other_tenant, member_of, client_for
):
    viewer = client_for(member_of(tenant, Role.VIEWER))
    assert viewer.get(url(tenant, agent)).status_code == 200
    assert viewer.put(url(tenant, agent), {"policy": "cost"}, format="json").status_code == 403
    stranger = client_for(member_of(other_tenant, Role.OWNER, "stranger"))
    assert stranger.get(url(tenant, agent)).status_code == 404
    assert stranger.put(url(tenant, agent), {"policy": "cost"}, format="json").status_code == 404
    # Naming another tenant's agent under one's own tenant finds nothing either.
    assert stranger.get(url(other_tenant, agent)).status_code == 404
    assert not AgentRouting.objects.exists()
