"""Tool calls as clients read them: the official `openai` client against a live server
(streamed, its stream helper, and structured output parsed into a pydantic model through
Anthropic's forced tool), and the websocket API carrying the same deltas as SSE."""

import json

import openai
import pydantic
import pytest
from channels.db import database_sync_to_async
from channels.testing.websocket import WebsocketCommunicator

from routing.bench.fake_tools import ToolFake
from tests.routing.test_tools_openai import ARGS, register
from tests.routing.test_tools_parse import WEATHER

pytestmark = pytest.mark.django_db(transaction=True)
ASK = [{"role": "user", "content": "weather in Paris?"}]


@pytest.fixture
def gpt(key):
    fake = ToolFake("openai", calls=[("get_weather", ARGS)], piece=3).start()
    register("gpt", fake)
    yield fake
    fake.stop()


@pytest.fixture
def client(embedded_server, key):
    return openai.OpenAI(api_key=key, base_url=embedded_server.url + "/v1", max_retries=0)


def test_the_openai_client_reads_tool_calls_streamed_and_not(client, gpt):
    reply = client.chat.completions.create(
        model="m", messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=50
    )
    [call] = reply.choices[0].message.tool_calls
    assert (call.id, call.function.name, call.function.arguments) == (
        "call_fake0",
        "get_weather",
        ARGS,
    )
    assert reply.choices[0].finish_reason == "tool_calls"
    assert gpt.requests[0]["tool_choice"] == "required"
    # The next turn, as the client's users write it: its own message object sent back.
    client.chat.completions.create(
        model="m",
        tools=[WEATHER],
        max_tokens=50,
        messages=ASK
        + [reply.choices[0].message, {"role": "tool", "tool_call_id": call.id, "content": "21 C"}],
    )
    assert gpt.requests[1]["messages"][1:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_fake0",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ARGS},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_fake0", "content": "21 C"},
    ]

    chunks = list(
        client.chat.completions.create(
            model="m", messages=ASK, tools=[WEATHER], stream=True, max_tokens=50
        )
    )
    pieces = [
        c.choices[0].delta.tool_calls[0]
        for c in chunks
        if c.choices and c.choices[0].delta.tool_calls
    ]
    assert pieces[0].id == "call_fake0" and pieces[0].function.name == "get_weather"
    assert all(p.index == 0 and p.id is None for p in pieces[1:])
    assert "".join(p.function.arguments for p in pieces) == ARGS

    # The client's stream helper checks the deltas' shape as it accumulates them.
    with client.chat.completions.stream(
        model="m", messages=ASK, tools=[WEATHER], max_tokens=50
    ) as stream:
        final = stream.get_final_completion()
    [call] = final.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"city": "Paris"}


class Forecast(pydantic.BaseModel):
    city: str
    celsius: float


def test_the_openai_client_parses_structured_output_from_anthropic(client, key):
    claude = ToolFake("anthropic", calls=[(None, '{"city": "Paris", "celsius": 21.5}')])
    claude.start()
    try:
        register("claude", claude, model="c")
        reply = client.chat.completions.parse(
            model="c", messages=ASK, response_format=Forecast, max_tokens=50
        )
        assert reply.choices[0].message.parsed == Forecast(city="Paris", celsius=21.5)
        assert claude.requests[0]["tool_choice"] == {"type": "tool", "name": "Forecast"}
    finally:
        claude.stop()


async def test_the_websocket_carries_the_same_tool_call_deltas(embedded, key, gpt):
    from asgi import application

    ws = WebsocketCommunicator(
        application, "/ws/v1/chat", headers=[(b"authorization", f"Bearer {key}".encode())]
    )
    assert (await ws.connect())[0]
    assert (await ws.receive_json_from())["type"] == "auth.ok"
    await ws.send_json_to(
        {
            "type": "chat.completions",
            "id": "t1",
            "body": {"model": "m", "messages": ASK, "tools": [WEATHER], "max_tokens": 50},
        }
    )
    frames = []
    while not frames or frames[-1]["type"] not in {"done", "error"}:
        frames.append(await ws.receive_json_from(timeout=30))
    assert frames[-1]["type"] == "done", frames[-1]
    deltas = [
        f["data"]["choices"][0]["delta"]
        for f in frames
        if f["type"] == "chunk" and f["data"]["choices"]
    ]
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0] == {
        "index": 0,
        "id": "call_fake0",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    assert "".join(c["function"]["arguments"] for c in calls) == ARGS
    finals = [
        f["data"]["choices"][0]["finish_reason"]
        for f in frames
        if f["type"] == "chunk" and f["data"]["choices"]
    ]
    assert finals[-1] == "tool_calls"
    await ws.disconnect()
    assert await database_sync_to_async(lambda: gpt.stats["ok"])() == 1
