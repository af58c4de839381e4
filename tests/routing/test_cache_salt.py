"""A tenant's prefix-cache salt travels past our own engine: vLLM-style servers get a
`cache_salt` per tenant (a keyed hash, never the tenant id), and over a remote Fairlane, where
every tenant arrives under our one key, tenants no longer share cached prompts."""

import json

import pytest
from channels.db import database_sync_to_async
from django.test import AsyncClient

from routing.backend_store import backend_model_set, backend_register
from tenants.models import Scope
from tenants.services.budgets import budget_create
from tenants.services.keys import api_key_create
from tenants.services.tenancy import agent_create

pytestmark = pytest.mark.django_db(transaction=True)


def post(key, body, path="/v1/chat/completions"):
    return AsyncClient().post(
        path,
        json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}"},
    )


@pytest.fixture
def two_keys(tenant, agent, other_tenant, other_agent):
    return [
        api_key_create(tenant=t, agent=a, scopes=[Scope.INFERENCE])[1]
        for t, a in ((tenant, agent), (other_tenant, other_agent))
    ]


async def test_a_vllm_server_gets_a_salt_per_tenant_that_never_names_it(
    two_keys, tenant, other_tenant, fakes
):
    fake = fakes("openai")
    backend = await database_sync_to_async(backend_register)(
        name="vllm", kind="openai_compatible", base_url=fake.url, credential=fake.api_key
    )
    await database_sync_to_async(backend_model_set)(
        backend=backend, model="m", upstream_name="fake-model"
    )
    body = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    for key in (*two_keys, two_keys[0]):
        assert (await post(key, body)).status_code == 200
    salts = [request.get("cache_salt") for request in fake.requests]
    assert None not in salts
    assert salts[0] == salts[2] != salts[1]  # stable per tenant, different between tenants
    assert (await post(two_keys[0], {**body, "cache_salt": "conversation-7"})).status_code == 200
    salts.append(fake.requests[-1]["cache_salt"])
    assert salts[3] not in salts[:3]  # the client's own salt separates further
    for salt in salts:  # a keyed hash: hex, naming neither tenant nor the client's salt
        assert len(salt) == 32 and int(salt, 16) >= 0
        assert salt not in {str(tenant.pk), str(other_tenant.pk)}
        assert all(name not in salt for name in (tenant.slug, other_tenant.slug, "conversation"))


async def test_tenants_behind_one_key_never_share_a_remote_fairlanes_prefix_cache(
    embedded_server, two_keys, tenant, tiny
):
    def remote_backend():
        gateway = agent_create(tenant=tenant, name="gateway")
        budget_create(tenant=tenant, agent=None, limit_microcents=10**12)
        _, secret = api_key_create(tenant=tenant, agent=gateway, scopes=[Scope.INFERENCE])
        backend = backend_register(
            name="remote-fl", kind="fairlane", base_url=embedded_server.url, credential=secret
        )
        backend_model_set(backend=backend, model="via-remote", upstream_name="tiny")

    await database_sync_to_async(remote_backend)()
    prompt = "a shared system prompt that is long enough to fill whole cache blocks " * 8
    body = {
        "model": "via-remote",
        "max_tokens": 1,
        "temperature": 0,
        "messages": [{"role": "user", "content": prompt}],
    }

    async def cached(key):
        response = await post(key, body)
        assert response.status_code == 200, response.content
        return json.loads(response.content)["usage"]["prompt_tokens_details"]["cached_tokens"]

    first, again = await cached(two_keys[0]), await cached(two_keys[0])
    assert first == 0 and again > 0  # the same tenant hits its own cache on the remote
    assert await cached(two_keys[1]) == 0  # another tenant behind the same key does not
