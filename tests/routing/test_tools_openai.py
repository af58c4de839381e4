"""Tools, JSON mode and images through the real /v1 path to OpenAI-format backends (fake
providers, real HTTP on 127.0.0.1): forwarded byte for byte, tool calls back in OpenAI's exact
shapes, usage as the provider reported it; and capabilities: a request needing what a backend
lacks goes elsewhere, or is a 400 naming the parameter, charging nothing."""

import json

import pytest
from channels.db import database_sync_to_async

from routing.backend_store import agent_routing_set, backend_model_set, backend_register
from routing.bench.fake_tools import ToolFake
from tenants.models import Reservation, UsageRecord
from tests.routing.test_routing import chat, streamed
from tests.routing.test_tools_parse import DATA_URL, WEATHER

pytestmark = pytest.mark.django_db(transaction=True)
ARGS = '{"city": "Paris"}'
IMAGES = [
    {"type": "text", "text": "what is this?"},
    {"type": "image_url", "image_url": {"url": "https://img.example/cat.png", "detail": "high"}},
    {"type": "image_url", "image_url": {"url": DATA_URL}},
]
HISTORY = [
    {"role": "system", "content": "You answer with tools."},
    {"role": "user", "content": IMAGES},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_a", "content": "rain, 4 C"},
    {"role": "user", "content": "and in Paris?"},
]
TOOLS_BODY = {
    "tools": [WEATHER],
    "parallel_tool_calls": False,
    "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    "response_format": {
        "type": "json_schema",
        "json_schema": {
            "name": "forecast",
            "strict": True,
            "schema": {"type": "object", "properties": {"t": {"type": "number"}}},
        },
    },
}


def register(name, fake, *, kind=None, model="m", model_flags=None, **flags):
    backend = backend_register(
        name=name, kind=kind or fake.fmt, base_url=fake.url, credential=fake.api_key, **flags
    )
    backend_model_set(
        backend=backend,
        model=model,
        upstream_name="fake-model",
        price_input_per_mtok=100_000_000,
        price_output_per_mtok=300_000_000,
        **(model_flags or {}),
    )
    return backend


def tool_fake(fmt="openai", **kwargs):
    return ToolFake(fmt, calls=[("get_weather", ARGS)], piece=5, **kwargs).start()


async def rows():
    return await database_sync_to_async(lambda: list(UsageRecord.objects.all()))()


@pytest.mark.parametrize("kind", ["openai", "openrouter", "openai_compatible", "fairlane"])
async def test_everything_is_forwarded_as_sent_and_tool_calls_come_back(key, kind):
    fake = tool_fake("openrouter" if kind == "openrouter" else "openai")
    try:
        await database_sync_to_async(register)(
            "up",
            fake,
            kind=kind,
            supports_tools=True,
            supports_vision=True,
            supports_json_schema=True,
        )
        response = await chat(key, messages=HISTORY, **TOOLS_BODY)
        assert response.status_code == 200, response.content
        [sent] = fake.requests
        # Byte for byte what the client sent (images, tool turns, tools, schema).
        assert sent["messages"] == HISTORY
        assert [p["image_url"]["url"] for p in sent["messages"][1]["content"][1:]] == [
            "https://img.example/cat.png",
            DATA_URL,
        ]
        assert sent["tools"] == TOOLS_BODY["tools"]
        assert sent["tool_choice"] == TOOLS_BODY["tool_choice"]
        assert sent["parallel_tool_calls"] is False
        assert sent["response_format"] == TOOLS_BODY["response_format"]
        body = json.loads(response.content)
        [choice] = body["choices"]
        assert choice["finish_reason"] == "tool_calls"
        assert choice["message"]["content"] is None
        assert choice["message"]["tool_calls"] == [
            {
                "id": "call_fake0",
                "type": "function",
                "function": {"name": "get_weather", "arguments": ARGS},
            }
        ]
        # Tool definitions and images count as the provider reported them.
        [row] = await rows()
        assert (row.prompt_tokens, row.completion_tokens) == (
            body["usage"]["prompt_tokens"],
            body["usage"]["completion_tokens"],
        )
        words = 4 + 3 + 3 + 3  # the fake counts the words of string and text contents
        assert row.prompt_tokens == words + 10 + 2 * 85
    finally:
        fake.stop()


async def test_streamed_tool_calls_are_openais_exact_deltas(key):
    fake = tool_fake(text="Checking now")
    try:
        await database_sync_to_async(register)("up", fake)
        payloads = await streamed(
            await chat(key, stream=True, tools=[WEATHER], stream_options={"include_usage": True})
        )
        chunks = [p for p in payloads if isinstance(p, dict) and p.get("choices")]
        deltas = [c["choices"][0]["delta"] for c in chunks]
        calls = [d["tool_calls"] for d in deltas if "tool_calls" in d]
        assert calls[0] == [
            {
                "index": 0,
                "id": "call_fake0",
                "type": "function",
                "function": {"name": "get_weather", "arguments": ""},
            }
        ]
        assert all(
            c == [{"index": 0, "function": {"arguments": c[0]["function"]["arguments"]}}]
            for c in calls[1:]
        )
        assert "".join(c[0]["function"]["arguments"] for c in calls) == ARGS
        assert "".join(d.get("content") or "" for d in deltas) == "Checking now"
        assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
        assert payloads[-2]["usage"]["completion_tokens"] == 2 + 4  # words + fragments
        assert payloads[-1] == "[DONE]"
    finally:
        fake.stop()


async def test_an_images_request_to_a_local_only_model_is_a_400_naming_messages(key, budget):
    for extra, param in (
        ({"messages": [{"role": "user", "content": IMAGES}]}, "messages"),
        ({"messages": [{"role": "user", "content": IMAGES}], "tools": [WEATHER]}, "messages"),
    ):
        response = await chat(key, model="tiny", **extra)
        assert response.status_code == 400, response.content
        error = json.loads(response.content)["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error"
    assert not await database_sync_to_async(Reservation.objects.exists)()
    assert not await rows()


async def test_backends_without_a_capability_are_passed_over_or_refused(key, agent):
    plain, capable = tool_fake(), tool_fake()
    try:
        # vLLM's default: JSON schemas, no tools, no images; the flags change it.
        await database_sync_to_async(register)("vllm", plain, kind="openai_compatible")
        response = await chat(key, tools=[WEATHER])
        assert response.status_code == 400
        assert json.loads(response.content)["error"]["param"] == "tools"
        assert (await chat(key, response_format={"type": "json_object"})).status_code == 200
        await database_sync_to_async(register)("gpt", capable, kind="openai")
        await database_sync_to_async(agent_routing_set)(agent=agent, chain=["vllm", "gpt"])
        response = await chat(key, tools=[WEATHER], messages=[{"role": "user", "content": IMAGES}])
        assert response.status_code == 200 and response["x-fairlane-backend"] == "gpt"
        assert len(plain.requests) == 1 and len(capable.requests) == 1
        # A model that differs from its backend: a text-only model on a vision backend.
        await database_sync_to_async(register)(
            "gpt", capable, kind="openai", model_flags={"supports_vision": False}
        )
        response = await chat(key, messages=[{"role": "user", "content": IMAGES}])
        assert json.loads(response.content)["error"]["param"] == "messages"
        assert len(capable.requests) == 1
        # Only the agent's chain counts: a capable backend outside it does not.
        await database_sync_to_async(agent_routing_set)(agent=agent, chain=["vllm"])
        response = await chat(key, tools=[WEATHER])
        assert json.loads(response.content)["error"]["param"] == "tools"
    finally:
        plain.stop()
        capable.stop()


@pytest.mark.parametrize(
    "extra,param",
    [
        (
            {"tools": [{"type": "function", "function": {"name": "no spaces"}}]},
            "tools[0].function.name",
        ),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}
                        ],
                    }
                ]
            },
            "messages[0].content",
        ),
    ],
)
async def test_malformed_input_is_a_400_that_sends_and_charges_nothing(key, extra, param):
    fake = tool_fake()
    try:
        await database_sync_to_async(register)("up", fake)
        response = await chat(key, **extra)
        assert response.status_code == 400
        assert json.loads(response.content)["error"]["param"] == param
        assert fake.requests == [] and not await rows()
    finally:
        fake.stop()
