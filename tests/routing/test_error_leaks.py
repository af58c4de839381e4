"""No error a client sees names a backend, its URL, its upstream model, an environment
variable or a provider's own words: every failure path of the routing chain, answered as JSON,
as an SSE error chunk and over the websocket, against fake providers that are real HTTP
servers. The detail is in the log and in the backend's last_error for the admin."""

import json

import pytest
from channels.db import database_sync_to_async
from django.test import AsyncClient

from routing.backend_store import agent_routing_set, backend_model_set, backend_register
from routing.bench.fakes import (
    CONTENT_POLICY,
    content_filter,
    cut,
    rate_limit,
    server_error,
    slow_first_byte,
)
from routing.models import Backend

pytestmark = pytest.mark.django_db(transaction=True)
ENV = "ZQ_SECRET_PROVIDER_KEY_ENV"
UPSTREAM = "zq-upstream-model-7"
PROVIDER_WORDS = [
    "The server had an error while processing your request.",
    "Rate limit reached for requests.",
    CONTENT_POLICY,
    "invalid_api_key",
]


def closed_port_url() -> str:
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"


def register(name: str, url: str, **fields) -> Backend:
    fields.setdefault("credential", "sk-fake")
    backend = backend_register(name=name, kind="openai", base_url=url, **fields)
    backend_model_set(backend=backend, model="m", upstream_name=UPSTREAM)
    return backend


async def chat(key, *, stream=False):
    body = {
        "model": "m",
        "max_tokens": 5,
        "stream": stream,
        "messages": [{"role": "user", "content": "one two three"}],
    }
    return await AsyncClient().post(
        "/v1/chat/completions",
        json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}"},
    )


async def body_of(response) -> str:
    if response.streaming:
        return b"".join([c async for c in response.streaming_content]).decode()
    return response.content.decode()


def assert_clean(text: str, backend: Backend) -> None:
    secrets = [
        backend.name,
        backend.base_url,
        backend.base_url.split("//")[1],
        UPSTREAM,
        ENV,
        "env:",
        *PROVIDER_WORDS,
    ]
    leaked = [s for s in secrets if s in text]
    assert not leaked, f"{leaked} in {text}"


FAILURES = {
    # name: (how the backend is set up, what the fake does) -> the status clients see
    "provider-500": ({}, server_error(500), 503),
    "provider-529": ({}, server_error(529), 503),
    "provider-429-long": ({}, rate_limit(retry_after=600), 503),
    "cut-before-first-token": ({}, cut(after=0), 503),
    "content-filter": ({}, content_filter(), 400),
    "slow-past-timeout": ({"timeout_seconds": 0.3}, slow_first_byte(2.0), 504),
    "wrong-credential": ({"credential": "sk-wrong"}, None, 503),
    "env-credential-unset": ({"credential": "", "credential_ref": f"env:{ENV}"}, None, 503),
}


@pytest.mark.parametrize("failure", sorted(FAILURES))
@pytest.mark.parametrize("stream", [False, True])
async def test_failures_before_the_answer_name_nothing_internal(
    key, agent, fakes, settings, failure, stream
):
    settings.FAIRLANE_RETRIES = 0
    setup, behaviour, status = FAILURES[failure]
    fake = fakes("openai")
    if behaviour is not None:
        fake.set_default(behaviour)
    backend = await database_sync_to_async(register)(f"zq-{failure}", fake.url, **setup)
    await database_sync_to_async(agent_routing_set)(agent=agent, chain=[backend.name])
    response = await chat(key, stream=stream)
    text = await body_of(response)
    assert response.status_code == status, text
    assert json.loads(text)["error"]["code"] in {
        "backend_unavailable",
        "timeout",
        "content_filtered",
        "circuit_open",
    }
    assert_clean(text, backend)
    if failure != "content-filter":  # the operator sees what happened
        noted = await database_sync_to_async(Backend.objects.get)(pk=backend.pk)
        assert noted.last_error and noted.last_error_at


async def test_an_unreachable_backend_and_an_undecryptable_credential_name_nothing(
    key, agent, settings
):
    settings.FAIRLANE_RETRIES = 0
    refused = await database_sync_to_async(register)("zq-refused", closed_port_url())
    await database_sync_to_async(agent_routing_set)(agent=agent, chain=[refused.name])
    response = await chat(key)
    assert response.status_code == 503
    assert_clean(await body_of(response), refused)

    settings.FAIRLANE_CREDENTIALS_KEY = "rotated"  # the stored ciphertext no longer opens
    response = await chat(key, stream=True)
    assert response.status_code == 503
    assert_clean(await body_of(response), refused)


async def test_a_stream_cut_after_its_first_tokens_ends_with_a_clean_error_chunk(key, agent, fakes):
    fake = fakes("openai")
    fake.set_default(cut(after=2))
    backend = await database_sync_to_async(register)("zq-cut-mid-stream", fake.url)
    await database_sync_to_async(agent_routing_set)(agent=agent, chain=[backend.name])
    response = await chat(key, stream=True)
    text = await body_of(response)
    assert response.status_code == 200 and '"error"' in text and '"t1 "' in text
    assert_clean(text, backend)


async def test_websocket_error_frames_name_nothing_internal(key, agent, fakes):
    from channels.testing import WebsocketCommunicator

    from routing.consumers import CompletionConsumer

    fake = fakes("openai")
    fake.set_default(server_error(500))
    backend = await database_sync_to_async(register)("zq-websocket", fake.url)
    await database_sync_to_async(agent_routing_set)(agent=agent, chain=[backend.name])
    from api_handler import RuntimeScope

    ws = WebsocketCommunicator(
        RuntimeScope(CompletionConsumer.as_asgi()),
        "/ws/v1/chat",
        headers=[(b"authorization", f"Bearer {key}".encode())],
    )
    assert (await ws.connect())[0]
    await ws.receive_json_from(timeout=10)  # auth.ok
    await ws.send_json_to(
        {
            "type": "chat.completions",
            "id": "a",
            "body": {
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "hi"}],
            },
        }
    )
    frame = await ws.receive_from(timeout=30)
    await ws.disconnect()
    assert json.loads(frame)["type"] == "error"
    assert_clean(frame, backend)


def test_an_error_code_rebuilds_as_its_general_class():
    """A subclass with its own constructor (a refused model is a BackendUnavailable) must not
    be what an error code from another process turns into."""
    from tenants.errors import BackendUnavailable, error_from_code

    error = error_from_code("backend_unavailable", "The model's backend is unavailable.")
    assert type(error) is BackendUnavailable and error.status == 503
