"""Hostile and mistaken input at /v1: a 4xx in OpenAI's error shape, nothing reserved or billed."""

import json

import pytest
from channels.db import database_sync_to_async
from django.test import AsyncClient

from tenants.models import Reservation, Scope, Tenant, UsageRecord
from tenants.services.keys import api_key_create, api_key_revoke
from tenants.services.tenancy import agent_update

pytestmark = pytest.mark.django_db(transaction=True)
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


class KeyClient(AsyncClient):
    """An async test client that sends `Authorization: Bearer <key>` on every request."""

    def __init__(self, key: str | None = None) -> None:
        super().__init__()
        self.key = key

    def generic(self, *args, headers=None, **kwargs):
        if self.key:
            headers = {**(headers or {}), "Authorization": f"Bearer {self.key}"}
        return super().generic(*args, headers=headers, **kwargs)


@pytest.fixture
def v1(embedded, key):
    return KeyClient(key)


async def post(client, path, body, content_type="application/json"):
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return await client.post(path, data, content_type=content_type)


def error_of(response, status: int) -> dict:
    assert response.status_code == status, response.content
    body = json.loads(response.content)
    assert set(body["error"]) == {"message", "type", "code", "param"}
    return body["error"]


async def nothing_billed():
    assert not await database_sync_to_async(Reservation.objects.exists)()
    assert not await database_sync_to_async(UsageRecord.objects.exists)()


@pytest.mark.parametrize(
    "raw", ['{"model": "tiny",', "[" * 100_000 + "]" * 100_000, "\xff\xfe", "null", '"string"']
)
async def test_unparseable_or_non_object_bodies_are_400(v1, raw):
    error = error_of(await post(v1, "/v1/chat/completions", raw), 400)
    assert error["code"] == "invalid_request"
    await nothing_billed()


@pytest.mark.parametrize(
    "path,body,param",
    [
        (
            "/v1/chat/completions",
            {**CHAT, "messages": [{"role": "user", "content": "\ud800"}]},
            "messages[0].content",
        ),
        (
            "/v1/chat/completions",
            {
                **CHAT,
                "stream": True,
                "messages": [{"role": "user", "content": [{"type": "text", "text": "a\udfffb"}]}],
            },
            "messages[0].content[0].text",
        ),
        ("/v1/completions", {"model": "tiny", "prompt": "\ud800", "max_tokens": 2}, "prompt"),
        ("/v1/embeddings", {"model": "tiny", "input": ["ok", "\udc00"]}, "input[1]"),
    ],
)
async def test_a_lone_surrogate_is_a_400_naming_the_field(v1, path, body, param):
    # JSON allows the escape; no tokenizer can take it (issue 28, finding 4: it was a 500).
    raw = json.dumps(body)  # ensure_ascii: the surrogate travels as its \\u escape
    error = error_of(await post(v1, path, raw), 400)
    assert error["code"] == "invalid_request" and error["param"] == param
    await nothing_billed()


async def test_a_huge_integer_is_refused_without_a_rounded_echo(v1):
    error = error_of(
        await post(
            v1,
            "/v1/chat/completions",
            json.dumps(CHAT)[:-1] + ', "max_tokens": 99999999999999999999999}',
        ),
        400,
    )
    assert error["param"] == "max_tokens"
    assert "99999999999999991611392" not in error["message"]


async def test_a_crash_is_a_counted_500_in_the_openai_shape(v1, monkeypatch):
    from prometheus_client import REGISTRY

    from routing import services

    async def broken(**kwargs):
        raise TypeError("a bug")

    monkeypatch.setattr(services, "generation_start", broken)
    sample = {"endpoint": "chat_completions", "status": "500"}
    before = REGISTRY.get_sample_value("fairlane_api_requests_total", sample) or 0
    error = error_of(await post(v1, "/v1/chat/completions", CHAT), 500)
    assert error["code"] == "internal_error" and "a bug" not in error["message"]
    assert REGISTRY.get_sample_value("fairlane_api_requests_total", sample) == before + 1


async def test_wrong_content_type_and_method(v1):
    assert error_of(
        await post(
            v1,
            "/v1/chat/completions",
            "model=tiny",
            content_type="application/x-www-form-urlencoded",
        ),
        400,
    )
    error = error_of(await v1.get("/v1/chat/completions"), 405)
    assert error["code"] == "method_not_allowed"


async def test_token_ids_outside_the_vocabulary_are_400(v1):
    error = error_of(
        await post(v1, "/v1/completions", {"model": "tiny", "prompt": [1, 10**6]}), 400
    )
    assert error["param"] == "prompt"
    await nothing_billed()


async def test_no_key_or_a_revoked_key_is_401(embedded, key, tenant):
    response = await post(KeyClient(), "/v1/chat/completions", CHAT)
    assert error_of(response, 401)["code"] == "authentication"
    assert response["WWW-Authenticate"].startswith("Bearer")
    key_row, plain = await api_key_create_async(tenant)
    await api_key_revoke_async(key_row)
    client = KeyClient(plain)
    assert error_of(await client.get("/v1/models"), 401)["code"] == "authentication"


async def test_a_management_only_key_cannot_infer(embedded, tenant, agent, tiny):
    _, plain = await database_sync_to_async(api_key_create)(
        tenant=tenant, agent=agent, scopes=[Scope.MANAGEMENT_READ]
    )
    client = KeyClient(plain)
    assert error_of(await post(client, "/v1/chat/completions", CHAT), 403)["code"] == "permission"


async def test_a_model_the_agent_may_not_use_looks_like_no_model(v1, agent):
    await database_sync_to_async(agent_update)(agent=agent, allowed_models=["other-model"])
    error = error_of(await post(v1, "/v1/chat/completions", CHAT), 404)
    assert error["code"] == "model_not_found"
    models = json.loads((await v1.get("/v1/models")).content)
    assert models["data"] == []
    await nothing_billed()


async def test_a_suspended_tenant_is_403(v1, tenant):
    await database_sync_to_async(Tenant.objects.filter(pk=tenant.pk).update)(
        status=Tenant.Status.SUSPENDED
    )
    assert error_of(await post(v1, "/v1/chat/completions", CHAT), 403)["code"] == "permission"


async def api_key_create_async(tenant):
    agent = await database_sync_to_async(tenant.agents.first)()
    return await database_sync_to_async(api_key_create)(tenant=tenant, agent=agent)


async def api_key_revoke_async(key_row):
    await database_sync_to_async(api_key_revoke)(key=key_row)
