"""What the fuzzers (test_fuzz_wire.py, test_fuzz_v1.py) and schemathesis over the /v1
document (tests/platform/test_v1_schema.py) found, each kept as its smallest falsifying
example: a 400 naming the field where it was a 500, a socket that stays open where it was
dropped, an answer where the engine failed."""

import inspect
import json

import httpx
import pytest
from channels.testing.websocket import WebsocketCommunicator
from redis.asyncio.connection import AbstractConnection
from websockets.sync.client import connect

from routing.wire.parse import (
    chat_request_parse,
    completion_request_parse,
    embedding_request_parse,
)
from tenants.errors import InvalidRequest


@pytest.fixture
def application(embedded):
    from asgi import application

    return application


async def _socket(application, key: str | None = None) -> WebsocketCommunicator:
    headers = [(b"authorization", f"Bearer {key}".encode())] if key else []
    communicator = WebsocketCommunicator(application, "/ws/v1/chat", headers=headers)
    assert (await communicator.connect())[0]
    return communicator


def _refused(parse, body: dict) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as refused:
        parse(body)
    return refused.value


@pytest.mark.parametrize("url", ["http://[", "http://[::1", "http://a]", "https://a\uff03b/"])
def test_an_image_url_python_cannot_split_is_a_400(url):
    """urlsplit raises ValueError for an unclosed IPv6 bracket or a host whose NFKC form holds
    a URL delimiter; it reached the view as a 500."""
    body = {
        "model": "tiny",
        "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}
        ],
    }
    assert _refused(chat_request_parse, body).param == "messages[0].content"


@pytest.mark.parametrize("encoding", [[0], {}, [], 0, ""])
def test_an_encoding_format_that_is_not_a_string_is_a_400(encoding):
    """An array or object was hashed into a set (TypeError: a 500); a falsy one was read as
    "float"."""
    body = {"model": "tiny", "input": "0", "encoding_format": encoding}
    assert _refused(embedding_request_parse, body).param == "encoding_format"


@pytest.mark.parametrize("token", ["\u00b2", "0" * 5000, "\u0661", " 7", "7 ", "+7", ""])
def test_a_logit_bias_key_that_is_not_ascii_digits_is_a_400(token):
    """str.isdigit() takes "²" (int() refuses it: a 500) and "١" (int() reads it as 1); int()
    refuses more than 4300 digits (a 500)."""
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "x"}],
        "logit_bias": {token: 0},
    }
    assert _refused(chat_request_parse, body).param == "logit_bias"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("frame_type", [[], {}, [["chat.completions"]]])
async def test_a_frame_type_that_is_not_a_string_gets_an_error_frame(
    application, key, frame_type, caplog
):
    """An array or object was looked up in a dict (TypeError): an internal_error frame."""
    ws = await _socket(application, key)
    assert (await ws.receive_json_from())["type"] == "auth.ok"
    await ws.send_json_to({"type": frame_type, "id": "a"})
    error = await ws.receive_json_from()
    assert (error["id"], error["error"]["code"], error["error"]["param"]) == (
        "a",
        "invalid_request",
        "type",
    )
    assert "websocket frame failed" not in caplog.text
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_frames_after_the_server_closed_the_socket_are_ignored(application, caplog):
    """A client that sends two frames before authenticating has the second arrive after the
    server's close (4001): answering it sent an error frame and a second close after the
    first, which uvicorn refuses (RuntimeError, logged as a crash of ours)."""
    ws = await _socket(application)
    await ws.send_json_to({"type": "chat.completions", "id": "a", "body": {}})
    await ws.send_json_to({"type": "cancel", "id": "b"})
    assert (await ws.receive_json_from())["error"]["code"] == "authentication"
    assert (await ws.receive_output())["code"] == 4001
    assert await ws.receive_nothing(timeout=0.5)
    assert "websocket frame failed" not in caplog.text


@pytest.mark.django_db(transaction=True)
def test_a_socket_stays_open_past_the_redis_clients_socket_timeout(embedded_server, key):
    """With the Redis channel layer (REDIS_URL set), every socket's consumer held a blocking
    read on Redis longer than redis-py's default socket timeout (5 s): it timed out, the
    consumer crashed, and the socket was dropped without a close frame. The idle time is the
    scenario itself (waiting for nothing to happen), not a wait for a condition."""
    timeout = inspect.signature(AbstractConnection.__init__).parameters["socket_timeout"]
    idle = timeout.default + 2
    url = embedded_server.url.replace("http://", "ws://") + "/ws/v1/chat"
    with connect(url, additional_headers={"Authorization": f"Bearer {key}"}) as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "auth.ok"
        with pytest.raises(TimeoutError):
            ws.recv(timeout=idle)
        ws.send(json.dumps({"type": "cancel", "id": "nothing"}))
        assert json.loads(ws.recv(timeout=30))["id"] == "nothing"


@pytest.mark.parametrize(
    "prompt, expected", [([72.0, 7], [[72, 7]]), ([[1.0], "a", [0, -0.0]], [[1], "a", [0, 0]])]
)
def test_token_ids_written_as_integral_numbers_are_token_ids(prompt, expected):
    """JSON (and the OpenAPI document's `integer`) does not tell 72 from 72.0; a scalar
    integer parameter took 72.0, token ids refused it (found by schemathesis)."""
    assert completion_request_parse({"model": "tiny", "prompt": prompt}).prompts == expected
    assert embedding_request_parse({"model": "tiny", "input": prompt}).inputs == expected


@pytest.mark.parametrize("prompt", [[1.5], [-1.0], [2.0**60], [True], [[]], []])
def test_token_ids_that_are_not_non_negative_integers_are_a_400(prompt):
    assert _refused(completion_request_parse, {"model": "tiny", "prompt": prompt}).param == (
        "prompt"
    )


@pytest.mark.parametrize(
    "method, path, allowed",
    [
        ("get", "/v1/chat/completions", "POST"),
        ("delete", "/v1/embeddings", "POST"),
        ("post", "/v1/models", "GET"),
        ("put", "/v1/models/tiny", "GET"),
    ],
)
def test_a_405_names_the_allowed_method(client, method, path, allowed):
    """RFC 9110 requires Allow on a 405; /v1 sent none (found by schemathesis)."""
    response = getattr(client, method)(path)
    assert response.status_code == 405 and response["Allow"] == allowed
    assert response.json()["error"]["code"] == "method_not_allowed"


def _chat(**fields) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": "x"}], **fields}


@pytest.mark.parametrize(
    "body, param",
    [
        ({"model": "tiny", "messages": [{"role": {}, "content": "x"}]}, "messages[0].role"),
        ({"model": "tiny", "messages": [{"role": ["user"], "content": "x"}]}, "messages[0].role"),
        (
            _chat(
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image_url",
                                "image_url": {"url": "https://example.com/a.png", "detail": {}},
                            }
                        ],
                    }
                ]
            ),
            "messages[0].content",
        ),
        (
            _chat(
                tools=[{"type": "function", "function": {"name": "f"}}],
                tool_choice={"type": "function", "function": {"name": ["f"]}},
            ),
            "tool_choice",
        ),
    ],
)
def test_an_array_or_object_where_a_name_belongs_is_a_400(body, param):
    """A role, an image's detail or tool_choice's function name that is an array or object
    was looked up in a set (TypeError: a 500; found by schemathesis)."""
    assert _refused(chat_request_parse, body).param == param


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "sampling", [{"top_p": 5e-324}, {"temperature": 5e-324}, {"temperature": 1e-40, "top_p": 1e-46}]
)
def test_a_temperature_or_top_p_that_vanishes_in_float32_is_answered(
    embedded_server, key, sampling
):
    """Both are 0 as float32: top_p masked every token (the first was meant to stay) and the
    logits were divided by zero; the sampler indexed -1 and the engine step failed (a 500
    naming the engine's error; found by schemathesis)."""
    response = httpx.post(
        f"{embedded_server.url}/v1/chat/completions",
        timeout=60,
        headers={"Authorization": f"Bearer {key}"},
        json={
            "model": "tiny",
            "max_tokens": 3,
            **sampling,
            "messages": [{"role": "user", "content": "hi"}],
        },
    )
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] >= 1
