"""Tools, JSON mode and images translated to and from Anthropic's Messages API, through the
real /v1 path to a fake Anthropic (real HTTP on 127.0.0.1) that answers with `tool_use` blocks
and `input_json_delta`; images served by a real local HTTP server, fetched within limits or
refused with a 400 that says why."""

import base64
import http.server
import json
import threading
import time

import httpx
import pytest
from channels.db import database_sync_to_async

from routing.backends.anthropic_request import tools_translate
from routing.bench.fake_tools import ToolFake
from routing.wire.parse import chat_request_parse
from tenants.models import Reservation, UsageRecord
from tests.routing.test_routing import chat, streamed
from tests.routing.test_tools_openai import ARGS, register
from tests.routing.test_tools_parse import DATA_URL, PNG, WEATHER

pytestmark = pytest.mark.django_db(transaction=True)
CAT = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
CLOCK = {"type": "function", "function": {"name": "get_time"}}


class Images(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        routes = {
            "/cat.png": (200, "image/png", CAT),
            "/big.png": (200, "image/png", CAT * 4),
            "/page": (200, "text/html", b"<html></html>"),
            "/moved": (302, "image/png", b""),
        }
        if self.path == "/slow.png":
            time.sleep(1.5)
        status, kind, data = routes.get(self.path, (404, "text/plain", b"missing"))
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(data)))
        if status == 302:
            self.send_header("location", "/cat.png")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def images(settings):
    settings.FAIRLANE_IMAGE_FETCH_ALLOW_PRIVATE = True  # the image server is on 127.0.0.1
    settings.FAIRLANE_IMAGE_MAX_BYTES = 4096
    settings.FAIRLANE_IMAGE_FETCH_TIMEOUT_SECONDS = 0.5
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Images)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture
def claude(key):
    fake = ToolFake("anthropic", calls=[("get_weather", ARGS)], text="Checking now", piece=5)
    fake.start()
    register("claude", fake)
    yield fake
    fake.stop()


def conversation(images_url: str) -> list[dict]:
    return [
        {"role": "system", "content": "You answer with tools."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": images_url + "/cat.png"}},
                {"type": "image_url", "image_url": {"url": DATA_URL}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                },
                {
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "get_time", "arguments": "{}"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "rain, 4 C"},
        {"role": "tool", "tool_call_id": "call_b", "content": "noon"},
        {"role": "user", "content": "and in Paris?"},
    ]


async def test_a_tool_conversation_is_translated_and_tool_use_comes_back(key, claude, images):
    body = {
        "messages": conversation(images),
        "tools": [WEATHER, CLOCK],
        "tool_choice": "required",
        "parallel_tool_calls": False,
    }
    response = await chat(key, **body)
    assert response.status_code == 200, response.content
    sent = claude.requests[0]
    assert sent["system"] == "You answer with tools."
    assert sent["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {
                    "type": "image",
                    "source": {
                        "type": "base64",
                        "media_type": "image/png",
                        "data": base64.b64encode(CAT).decode(),
                    },
                },
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": PNG},
                },
            ],
        },
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "call_a",
                    "name": "get_weather",
                    "input": {"city": "Oslo"},
                },
                {"type": "tool_use", "id": "call_b", "name": "get_time", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [  # both results and the next question: one user turn
                {"type": "tool_result", "tool_use_id": "call_a", "content": "rain, 4 C"},
                {"type": "tool_result", "tool_use_id": "call_b", "content": "noon"},
                {"type": "text", "text": "and in Paris?"},
            ],
        },
    ]
    function = WEATHER["function"]
    assert sent["tools"] == [
        {
            "name": "get_weather",
            "input_schema": function["parameters"],
            "description": function["description"],
        },
        {"name": "get_time", "input_schema": {"type": "object", "properties": {}}},
    ]
    assert sent["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    [choice] = json.loads(response.content)["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Checking now"
    assert choice["message"]["tool_calls"] == [
        {
            "id": "toolu_fake0",
            "type": "function",
            "function": {"name": "get_weather", "arguments": ARGS},
        }
    ]
    [row] = await database_sync_to_async(lambda: list(UsageRecord.objects.all()))()
    assert row.prompt_tokens == 4 + 3 + 3 + 2 * 10 + 2 * 85  # as the fake reported it

    payloads = await streamed(await chat(key, stream=True, **body))
    deltas = [
        p["choices"][0]["delta"] for p in payloads if isinstance(p, dict) and p.get("choices")
    ]
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0] == {
        "index": 0,
        "id": "toolu_fake0",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    assert all(
        set(c) == {"index", "function"} and set(c["function"]) == {"arguments"} for c in calls[1:]
    )
    assert "".join(c["function"]["arguments"] for c in calls) == ARGS
    assert "".join(d.get("content") or "" for d in deltas) == "Checking now"
    assert [
        p["choices"][0]["finish_reason"]
        for p in payloads
        if isinstance(p, dict) and p.get("choices") and p["choices"][0]["finish_reason"]
    ] == ["tool_calls"]


async def test_a_tool_without_arguments_gets_an_empty_object(key, claude):
    claude.calls, claude.text = [("get_time", "")], ""
    response = await chat(key, tools=[CLOCK])
    [call] = json.loads(response.content)["choices"][0]["message"]["tool_calls"]
    assert call["function"] == {"name": "get_time", "arguments": "{}"}
    assert "tool_choice" not in claude.requests[0]  # none asked: Anthropic's default, auto


async def test_past_tool_calls_without_tools_are_defined_and_uncallable(key, claude):
    claude.calls, claude.text = [], "It rained."
    response = await chat(
        key,
        messages=[
            {"role": "user", "content": "weather in Oslo?"},
            {
                "role": "assistant",
                "content": "Let me look.",
                "tool_calls": [
                    {
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_a", "content": "rain"},
        ],
    )
    sent = claude.requests[0]
    assert sent["messages"][1]["content"][0] == {"type": "text", "text": "Let me look."}
    assert sent["tools"] == [
        {"name": "get_weather", "input_schema": {"type": "object", "properties": {}}}
    ]
    assert sent["tool_choice"] == {"type": "none"}
    [choice] = json.loads(response.content)["choices"]
    assert choice["message"]["content"] == "It rained." and choice["finish_reason"] == "stop"


@pytest.mark.parametrize("stream", [False, True])
async def test_json_mode_is_a_forced_tool_whose_input_is_the_content(key, claude, stream):
    claude.calls, claude.text = [(None, '{"t": 21.5}')], ""
    schema = {"type": "object", "properties": {"t": {"type": "number"}}}
    response = await chat(
        key,
        stream=stream,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "forecast", "schema": schema},
        },
    )
    sent = claude.requests[0]
    assert sent["tools"][0]["name"] == "forecast" and sent["tools"][0]["input_schema"] == schema
    assert sent["tool_choice"] == {"type": "tool", "name": "forecast"}
    if stream:
        payloads = [p for p in await streamed(response) if isinstance(p, dict)]
        content = "".join(p["choices"][0]["delta"].get("content") or "" for p in payloads)
        assert not any("tool_calls" in p["choices"][0]["delta"] for p in payloads)
        reason = payloads[-1]["choices"][0]["finish_reason"]
    else:
        [choice] = json.loads(response.content)["choices"]
        content, reason = choice["message"]["content"], choice["finish_reason"]
        assert "tool_calls" not in choice["message"]
    assert json.loads(content) == {"t": 21.5} and reason == "stop"

    claude.requests.clear()
    await chat(key, response_format={"type": "json_object"})
    assert claude.requests[0]["tools"][0]["name"] == "json_object"
    assert claude.requests[0]["tools"][0]["input_schema"]["type"] == "object"


def translate(**body):
    return tools_translate(
        chat_request_parse(
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}
        ).tool_use
    )[1]


def test_tool_choice_maps_to_anthropics():
    assert translate(tools=[WEATHER], tool_choice="auto") == {"type": "auto"}
    assert translate(tools=[WEATHER], tool_choice="none") == {"type": "none"}
    assert translate(tools=[WEATHER], tool_choice="required") == {"type": "any"}
    assert translate(
        tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}
    ) == {"type": "tool", "name": "get_weather"}
    assert translate(tools=[WEATHER], parallel_tool_calls=False) == {
        "type": "auto",
        "disable_parallel_tool_use": True,
    }
    # Tools and JSON mode together: a real tool or the answer, either through a tool.
    assert translate(tools=[WEATHER], response_format={"type": "json_object"}) == {"type": "any"}


@pytest.mark.parametrize(
    "path,why",
    [
        ("/missing.png", "HTTP 404"),
        ("/big.png", "larger than the 4096 bytes"),
        ("/page", "text/html"),
        ("/moved", "redirect"),
        ("/slow.png", "within 0.5 s"),
    ],
)
async def test_images_that_cannot_be_fetched_are_a_400_saying_why(key, claude, images, path, why):
    response = await chat(
        key,
        messages=[
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": images + path}}],
            }
        ],
    )
    assert response.status_code == 400, response.content
    error = json.loads(response.content)["error"]
    assert why in error["message"] and error["param"] == "messages[0].content"
    assert claude.requests == []
    assert not await database_sync_to_async(UsageRecord.objects.exists)()
    assert not await database_sync_to_async(Reservation.objects.filter(status="held").exists)()


async def test_images_on_private_addresses_are_not_fetched(key, claude, images, settings):
    settings.FAIRLANE_IMAGE_FETCH_ALLOW_PRIVATE = False
    response = await chat(
        key,
        messages=[
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": images + "/cat.png"}}],
            }
        ],
    )
    assert response.status_code == 400
    assert "not on a public address" in json.loads(response.content)["error"]["message"]
    assert claude.requests == []


def test_the_fake_speaks_tool_use_unstreamed_too(claude):
    reply = httpx.post(
        claude.url + "/v1/messages",
        headers={"x-api-key": claude.api_key, "anthropic-version": "2023-06-01"},
        json={
            "model": "fake-model",
            "max_tokens": 10,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
        },
    ).json()
    assert reply["stop_reason"] == "tool_use"
    assert reply["content"][1] == {
        "type": "tool_use",
        "id": "toolu_fake0",
        "name": "get_weather",
        "input": {"city": "Paris"},
    }
