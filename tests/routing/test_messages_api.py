"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) with the official
`anthropic` client, unmodified: against a live server's local `tiny` engine, a fake Anthropic
(the body arrives as it was sent, cache_control and thinking included; cache reads and writes
metered at their prices) and a fake OpenAI-format provider (translated); errors in Anthropic's
shape, changing nothing."""

import asyncio
import json

import anthropic
import httpx
import pytest
from channels.db import database_sync_to_async
from django.test import AsyncClient

from routing.bench.fake_tools import ToolFake
from routing.bench.fakes import FakeProvider, cut
from tenants.models import BudgetWindow, Reservation, UsageRecord
from tenants.services.budgets import budget_create
from tests.routing.test_routing import register, rows
from tests.routing.test_tools_openai import register as register_kind
from tests.routing.test_websocket import application, connect, frames_until_done  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Oslo"]}},
        "required": ["city"],
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
ARGS = '{"city": "Paris"}'
# micro-cents per million tokens: input 100, output 300, cached input 10 micro-cents a token
PRICES = {
    "price_input_per_mtok": 100_000_000,
    "price_output_per_mtok": 300_000_000,
    "price_cached_per_mtok": 10_000_000,
}


@pytest.fixture
def client(embedded_server, key):
    return anthropic.Anthropic(api_key=key, base_url=embedded_server.url, max_retries=0)


@pytest.fixture
def claude(key):
    fake = ToolFake("anthropic", calls=[("get_weather", ARGS)], text="Checking now", piece=5)
    fake.start()
    register("claude", fake, prices=PRICES)
    yield fake
    fake.stop()


def post(key, path="/v1/messages", **body):
    return AsyncClient().post(
        path,
        json.dumps(body),
        content_type="application/json",
        headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
    )


def events(raw: bytes) -> list[tuple[str, dict]]:
    out = []
    for frame in raw.decode().split("\n\n"):
        if frame.strip():
            name, data = frame.split("\n", 1)
            out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


# --- the local engine ---------------------------------------------------------------------------


def test_messages_create_on_the_local_engine_is_metered_once(client, budget):
    message = client.messages.create(
        model="tiny",
        max_tokens=12,
        messages=ASK,
        system="Be brief.",
        extra_body={"temperature": 0},  # this SDK version leaves sampling to extra_body
    )
    assert message.type == "message" and message.role == "assistant"
    assert message.stop_reason in {"end_turn", "max_tokens"}
    assert message.content and message.content[0].type == "text"
    record = UsageRecord.objects.get(request_id=message.id.removeprefix("msg_"))
    assert (record.prompt_tokens, record.completion_tokens) == (
        message.usage.input_tokens,
        message.usage.output_tokens,
    )
    assert 0 < message.usage.output_tokens <= 12
    assert Reservation.objects.get(request_id=record.request_id).status == "settled"
    # count_tokens counts by the model's own tokenizer: what the engine was charged for.
    counted = client.messages.count_tokens(model="tiny", messages=ASK, system="Be brief.")
    assert counted.input_tokens == message.usage.input_tokens


def test_messages_stream_parses_with_the_sdks_own_event_parser(client):
    with client.messages.stream(model="tiny", max_tokens=16, messages=ASK) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "content_block_stop" in kinds
    assert kinds[-2] == "message_delta"
    assert final.stop_reason in {"end_turn", "max_tokens"}
    record = UsageRecord.objects.get(request_id=final.id.removeprefix("msg_"))
    assert record.completion_tokens == final.usage.output_tokens > 0
    assert record.prompt_tokens == final.usage.input_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_a_named_tool_is_called_on_the_local_engine_within_64_tokens(client, stream):
    # Random weights: the call comes only because it is guided, and within max_tokens 64 only
    # because the guided JSON is compact.
    body = {
        "model": "tiny",
        "max_tokens": 64,
        "messages": ASK,
        "tools": [WEATHER],
        "tool_choice": {"type": "tool", "name": "get_weather"},
    }
    if stream:
        with client.messages.stream(**body) as events_:
            message = events_.get_final_message()
    else:
        message = client.messages.create(**body)
    assert message.stop_reason == "tool_use"
    [call] = [block for block in message.content if block.type == "tool_use"]
    assert call.name == "get_weather" and call.input["city"] in {"Paris", "Oslo"}
    assert message.usage.output_tokens <= 64


def test_the_key_may_come_as_a_bearer_token_too(embedded_server, key):
    bearer = anthropic.Anthropic(auth_token=key, base_url=embedded_server.url, max_retries=0)
    assert bearer.messages.create(model="tiny", max_tokens=2, messages=ASK).content


@pytest.mark.parametrize(
    "change, status, kind",
    [
        ({"max_tokens": None}, 400, "invalid_request_error"),
        ({"messages": [{"role": "system", "content": "x"}]}, 400, "invalid_request_error"),
        ({"temperature": 1.5}, 400, "invalid_request_error"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, 400, None),
        ({"tool_choice": {"type": "tool", "name": "nope"}, "tools": [WEATHER]}, 400, None),
        ({"frequency_penalty": 1}, 400, None),
        ({"model": "no-such-model"}, 404, "not_found_error"),
    ],
)
def test_bad_requests_are_refused_in_anthropics_shape_changing_nothing(
    client, change, status, kind
):
    body = {"model": "tiny", "max_tokens": 5, "messages": ASK, **change}
    body = {k: v for k, v in body.items() if v is not None}
    with pytest.raises(anthropic.APIStatusError) as refused:  # the SDK's own error classes
        client.post("/v1/messages", body=body, cast_to=object)
    assert refused.value.status_code == status
    error = refused.value.body
    assert error["type"] == "error" and set(error["error"]) == {"type", "message"}
    assert error["error"]["type"] == (kind or "invalid_request_error")
    assert not UsageRecord.objects.exists() and not Reservation.objects.exists()


def test_a_wrong_key_is_an_authentication_error(embedded_server):
    stranger = anthropic.Anthropic(api_key="fl-nope", base_url=embedded_server.url, max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as refused:
        stranger.messages.create(model="tiny", max_tokens=5, messages=ASK)
    assert refused.value.body["error"]["type"] == "authentication_error"


# --- a fake Anthropic: passed through natively ----------------------------------------------------


def test_an_anthropic_backend_gets_the_body_as_sent_and_tool_use_comes_back(client, claude):
    history = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "They want weather.", "signature": "sig"},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "rain"}],
        },
    ]
    system = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    message = client.messages.create(
        model="m",
        max_tokens=50,
        system=system,
        messages=history,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        metadata={"user_id": "u-1"},
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    sent = claude.requests[0]
    assert sent["system"] == system and sent["messages"] == history  # as sent, byte for byte
    assert sent["tools"] == [WEATHER] and sent["thinking"]["budget_tokens"] == 1024
    assert sent["tool_choice"] == {"type": "tool", "name": "get_weather"}
    assert (sent["model"], sent["stream"], sent["max_tokens"]) == ("fake-model", True, 50)
    assert message.stop_reason == "tool_use"
    assert [b.type for b in message.content] == ["text", "tool_use"]
    assert message.content[0].text == "Checking now"
    assert (message.content[1].id, message.content[1].input) == ("toolu_fake0", {"city": "Paris"})


@pytest.mark.parametrize("stream", [False, True])
def test_thinking_from_an_anthropic_backend_comes_back_signed_and_goes_back(client, key, stream):
    fake = ToolFake(
        "anthropic", calls=[("get_weather", ARGS)], text="Checking", thinking="Use the tool."
    )
    fake.start()
    try:
        register("claude", fake, prices=PRICES)
        body = {
            "model": "m",
            "max_tokens": 50,
            "messages": ASK,
            "tools": [WEATHER],
            "thinking": {"type": "enabled", "budget_tokens": 1024},
        }
        if stream:  # the SDK's own accumulator reads thinking_delta and signature_delta
            with client.messages.stream(**body) as events_:
                message = events_.get_final_message()
        else:
            message = client.messages.create(**body)
        assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
        thinking = message.content[0]
        assert (thinking.thinking, thinking.signature) == ("Use the tool.", "sig-fake")
        # The next turn, as an agent sends it: the assistant's blocks back, thinking first.
        turn = [b.model_dump(exclude_none=True) for b in message.content]
        result = {"type": "tool_result", "tool_use_id": message.content[2].id, "content": "4 C"}
        history = [
            *ASK,
            {"role": "assistant", "content": turn},
            {"role": "user", "content": [result]},
        ]
        client.messages.create(**{**body, "messages": history})
    finally:
        fake.stop()
    sent = fake.requests[1]["messages"][1]["content"]
    assert sent[0] == {"type": "thinking", "thinking": "Use the tool.", "signature": "sig-fake"}


def test_cache_reads_and_writes_are_metered_at_their_prices(client, key):
    fake = FakeProvider("anthropic", reply_tokens=4, cached_tokens=3, cache_write_tokens=5)
    fake.start()
    try:
        register("claude", fake, prices=PRICES)
        words = "one two three four five six seven eight nine ten"
        message = client.messages.create(
            model="m",
            max_tokens=10,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": words, "cache_control": {"type": "ephemeral"}}
                    ],
                }
            ],
        )
    finally:
        fake.stop()
    usage = message.usage
    assert (usage.cache_read_input_tokens, usage.cache_creation_input_tokens) == (3, 5)
    assert usage.input_tokens == 10 - 3 - 5 and usage.output_tokens == 4
    [row] = rows()
    assert (row.prompt_tokens, row.cached_tokens, row.completion_tokens) == (10, 3, 4)
    # 2 input at 100, 5 cache writes at 125 (5/4 of input), 3 cache reads at 10, 4 out at 300
    assert row.cost_microcents == 2 * 100 + 5 * 125 + 3 * 10 + 4 * 300


async def test_an_anthropic_stream_cut_midway_is_charged_for_what_was_served(key, fakes):
    fake = fakes("anthropic", reply_tokens=10)
    fake.push(cut(after=2))
    await database_sync_to_async(register)("claude", fake, prices=PRICES)
    response = await post(key, model="m", max_tokens=10, stream=True, messages=ASK)
    got = events(b"".join([chunk async for chunk in response.streaming_content]))
    names = [name for name, _ in got]
    assert names[:2] == ["message_start", "ping"] and names[-1] == "error"
    assert got[-1][1]["error"]["type"] == "overloaded_error"
    text = "".join(d["delta"].get("text", "") for n, d in got if n == "content_block_delta")
    assert text == "t0 t1 "
    [row] = await database_sync_to_async(rows)()
    assert row.status == UsageRecord.Status.ERROR
    assert (
        (row.prompt_tokens, row.completion_tokens)
        == (6, 2)
        == (
            fake.stats["prompt_tokens"],
            fake.stats["completion_tokens"],
        )
    )


async def test_the_stream_is_anthropics_event_sequence(key, claude):
    response = await post(
        key,
        model="m",
        max_tokens=50,
        stream=True,
        messages=ASK,
        tools=[WEATHER],
        tool_choice={"type": "any"},
    )
    assert response.status_code == 200 and response["content-type"] == "text/event-stream"
    got = events(b"".join([chunk async for chunk in response.streaming_content]))
    assert [name for name, _ in got] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        *["content_block_delta"] * 4,  # the arguments in pieces of 5
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert all(data["type"] == name for name, data in got)
    assert got[2][1]["content_block"] == {"type": "text", "text": ""}
    assert got[6][1] == {
        "type": "content_block_start",
        "index": 1,
        "content_block": {
            "type": "tool_use",
            "id": "toolu_fake0",
            "name": "get_weather",
            "input": {},
        },
    }
    pieces = [d["delta"]["partial_json"] for n, d in got[7:11]]
    assert "".join(pieces) == ARGS and all(got[i][1]["index"] == 1 for i in range(6, 12))
    assert got[-2][1]["delta"]["stop_reason"] == "tool_use"
    assert got[-2][1]["usage"]["output_tokens"] > 0


# --- an OpenAI-format backend: translated ----------------------------------------------------


@pytest.mark.parametrize("kind", ["openai", "openrouter", "openai_compatible", "fairlane"])
async def test_an_openai_format_backend_is_sent_the_translated_request(key, kind):
    fmt = "openrouter" if kind == "openrouter" else "openai"
    fake = ToolFake(fmt, calls=[("get_weather", ARGS)], piece=4).start()
    try:
        await database_sync_to_async(register_kind)("up", fake, kind=kind, supports_tools=True)
        response = await post(
            key,
            model="m",
            max_tokens=30,
            system="Be brief.",
            messages=ASK,
            tools=[WEATHER],
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
            stop_sequences=["END"],
        )
    finally:
        fake.stop()
    assert response.status_code == 200, response.content
    sent = fake.requests[0]
    assert sent["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": ASK[0]["content"]},
    ]
    assert sent["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": WEATHER["input_schema"],
                "description": WEATHER["description"],
            },
        }
    ]
    assert sent["tool_choice"] == "required" and sent["parallel_tool_calls"] is False
    assert sent["stop"] == ["END"]
    assert sent.get("max_completion_tokens", sent.get("max_tokens")) == 30
    message = json.loads(response.content)
    assert message["stop_reason"] == "tool_use"
    assert message["content"][-1]["input"] == {"city": "Paris"}


# --- the websocket ----------------------------------------------------------------------------


async def test_the_websocket_takes_a_messages_request_and_sends_its_events(
    application,  # noqa: F811  (the websocket tests' fixture)
    key,
):
    ws = await connect(application, key)
    assert (await ws.receive_json_from())["type"] == "auth.ok"
    body = {"model": "tiny", "max_tokens": 6, "messages": ASK, "system": "Be brief."}
    await ws.send_json_to({"type": "messages", "id": "m1", "body": body})
    frames = (await frames_until_done(ws, {"m1"}))["m1"]
    names = [f["event"] for f in frames if f["type"] == "event"]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == [
        "message_delta",
        "message_stop",
    ]
    done = frames[-1]
    assert done["type"] == "done" and done["usage"]["output_tokens"] > 0
    [row] = await database_sync_to_async(rows)()
    assert row.completion_tokens == done["usage"]["output_tokens"]
    assert row.request_id == frames[0]["data"]["message"]["id"].removeprefix("msg_")
    await ws.send_json_to({"type": "messages", "id": "m2", "body": {"model": "tiny"}})
    refused = (await frames_until_done(ws, {"m2"}))["m2"][-1]
    assert refused["type"] == "error" and refused["error"]["param"] == "messages"
    await ws.disconnect()


# --- budgets -------------------------------------------------------------------------------------

REQUESTS, AFFORDABLE, MAX_TOKENS = 60, 15, 8
PER_TOKEN_OUT = 1000  # micro-cents; input free, so a request costs exactly what it reserves


async def _one(client: httpx.AsyncClient, url: str, key: str, i: int) -> tuple[int, str]:
    body = {
        "model": "paid",
        "max_tokens": MAX_TOKENS,
        "stream": True,
        "messages": [{"role": "user", "content": f"request number {i}"}],
    }
    async with client.stream(
        "POST", url + "/v1/messages", json=body, headers={"x-api-key": key}
    ) as response:
        if response.status_code != 200:
            return response.status_code, json.loads(await response.aread())["error"]["type"]
        text = ""
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                data = json.loads(line[6:])
                if data["type"] == "error":
                    return 500, data["error"]["type"]
                text += (data.get("delta") or {}).get("text", "")
        return 200, text


def test_concurrent_messages_over_the_budget_never_overspend(embedded_server, tenant, agent, key):
    fake = FakeProvider("anthropic", reply_tokens=MAX_TOKENS, token_delay=0.01).start()
    try:
        register(
            "paid-claude",
            fake,
            model="paid",
            prices={"price_output_per_mtok": PER_TOKEN_OUT * 1_000_000},
        )
        limit = AFFORDABLE * MAX_TOKENS * PER_TOKEN_OUT
        budget = budget_create(tenant=tenant, agent=agent, limit_microcents=limit)

        async def all_at_once():
            async with httpx.AsyncClient(timeout=120) as client:
                return await asyncio.gather(
                    *(_one(client, embedded_server.url, key, i) for i in range(REQUESTS))
                )

        results = asyncio.run(all_at_once())
    finally:
        fake.stop()
    served = [text for status, text in results if status == 200]
    refused = {kind for status, kind in results if status != 200}
    assert refused == {"rate_limit_error"}  # the budget spent: a 429, Anthropic's shape
    assert all(text == "".join(f"t{i} " for i in range(MAX_TOKENS)) for text in served)
    window = BudgetWindow.objects.get(budget=budget)
    assert window.spent_microcents <= limit
    assert len(served) == AFFORDABLE and window.spent_microcents == limit
    assert window.reserved_microcents == 0
    assert not Reservation.objects.filter(status=Reservation.Status.HELD).exists()
    assert UsageRecord.objects.filter(agent=agent).count() == fake.stats["ok"] == AFFORDABLE
