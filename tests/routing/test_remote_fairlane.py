"""Another Fairlane deployment (a real uvicorn process serving the `tiny` engine) as a remote
backend: chat, token-id completions and embeddings (hidden states) travel through it."""

import json

import httpx
import pytest
from channels.db import database_sync_to_async
from django.test import AsyncClient

from routing.backend_store import backend_model_set, backend_register
from tenants.models import Scope, UsageRecord
from tenants.services.keys import api_key_create
from tenants.services.tenancy import agent_create

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def remote(embedded_server, tenant, tiny):
    """The remote deployment's key belongs to an agent of its own (as another operator's
    would); our `via-remote` model is its `tiny`."""
    gateway = agent_create(tenant=tenant, name="gateway")
    _, secret = api_key_create(tenant=tenant, agent=gateway, scopes=[Scope.INFERENCE])
    backend = backend_register(
        name="remote-fl",
        kind="fairlane",
        base_url=embedded_server.url,
        credential=secret,
        hidden_states=True,
    )
    backend_model_set(
        backend=backend,
        model="via-remote",
        upstream_name="tiny",
        price_input_per_mtok=1_000_000,
        price_output_per_mtok=2_000_000,
    )
    return embedded_server, secret


def post(key, path, body):
    return AsyncClient().post(
        path,
        json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}"},
    )


async def test_chat_and_token_id_completions_through_a_remote_fairlane(remote, key):
    server, secret = remote
    body = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 6, "temperature": 0}
    ours = await post(key, "/v1/chat/completions", {"model": "via-remote", **body})
    assert ours.status_code == 200 and ours["x-fairlane-backend"] == "remote-fl"
    direct = httpx.post(
        server.url + "/v1/chat/completions",
        json={"model": "tiny", **body},
        headers={"Authorization": f"Bearer {secret}"},
    ).json()
    assert (
        json.loads(ours.content)["choices"][0]["message"]["content"]
        == direct["choices"][0]["message"]["content"]
    )
    ours = await post(
        key,
        "/v1/completions",
        {"model": "via-remote", "prompt": [5, 6, 7], "max_tokens": 3, "temperature": 0},
    )
    assert ours.status_code == 200, ours.content

    def ledger():
        return sorted((r.backend, r.model) for r in UsageRecord.objects.all())

    rows = await database_sync_to_async(ledger)()
    # Each deployment metered its side: ours as remote-fl, the remote one as its engine.
    assert rows.count(("remote-fl", "via-remote")) == 2
    assert rows.count(("embedded", "tiny")) == 3


async def test_embeddings_come_from_the_remote_engines_hidden_states(remote, key):
    server, secret = remote
    ours = await post(key, "/v1/embeddings", {"model": "via-remote", "input": ["a", "b c"]})
    assert ours.status_code == 200, ours.content
    direct = httpx.post(
        server.url + "/v1/embeddings",
        json={"model": "tiny", "input": ["a", "b c"]},
        headers={"Authorization": f"Bearer {secret}"},
    ).json()
    ours = json.loads(ours.content)
    assert len(ours["data"]) == 2
    for mine, theirs in zip(ours["data"], direct["data"], strict=False):
        assert mine["embedding"] == pytest.approx(theirs["embedding"], abs=1e-6)
    assert (
        ours["model"] == "via-remote"
        and ours["usage"]["prompt_tokens"] == direct["usage"]["prompt_tokens"]
    )
