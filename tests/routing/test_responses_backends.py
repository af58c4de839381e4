"""The Responses API through the official `openai` client at a live server whose model is
served by fake providers (real HTTP servers speaking OpenAI's chat format, or Anthropic's):
what they receive is the chat translation of the input items; function calls come back as
items; budgets hold under concurrency; a cut stream is charged for what was served; another
tenant's responses are 404 everywhere."""

import asyncio
import json

import httpx
import openai
import pytest
from django.db.models import Sum

from routing.backend_store import agent_routing_set, backend_model_set, backend_register
from routing.bench.fake_tools import ToolFake
from routing.bench.fakes import FakeProvider, cut
from routing.models import StoredResponse
from tenants.models import BudgetWindow, Reservation, Scope, UsageRecord
from tenants.services.budgets import budget_create
from tenants.services.keys import api_key_create
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)
ARGS = '{"city": "Paris"}'
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": False,
}


def _register(fake, *, kind, model="m", **prices):
    backend = backend_register(
        name="up",
        kind=kind,
        base_url=fake.url,
        credential=fake.api_key,
        supports_tools=True,
        supports_vision=True,
        supports_json_schema=True,
    )
    backend_model_set(backend=backend, model=model, upstream_name="fake-model", **prices)
    return backend


def _client(server, key) -> openai.OpenAI:
    return openai.OpenAI(api_key=key, base_url=server.url + "/v1", max_retries=0)


@pytest.fixture
def tool_fake():
    fake = ToolFake("openai", calls=[("get_weather", ARGS)], piece=5).start()
    yield fake
    fake.stop()


@pytest.mark.parametrize("kind", ["openai", "openai_compatible", "fairlane"])
def test_an_openai_format_backend_gets_the_chat_translation(embedded_server, key, tool_fake, kind):
    _register(tool_fake, kind=kind)
    client = _client(embedded_server, key)
    asked = client.responses.create(
        model="m",
        instructions="Use tools.",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "weather in Paris?"}]}],
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        text={"format": {"type": "json_object"}},
        max_output_tokens=50,
    )
    sent = tool_fake.requests[-1]
    assert sent["messages"] == [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "weather in Paris?"},
    ]
    assert sent["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": WEATHER["parameters"],
                "strict": False,
            },
        }
    ]
    assert sent["tool_choice"] == "required" and sent["parallel_tool_calls"] is False
    assert sent["response_format"] == {"type": "json_object"}
    assert sent.get("max_completion_tokens", sent.get("max_tokens")) == 50
    [call] = asked.output
    assert (call.type, call.name, call.arguments) == ("function_call", "get_weather", ARGS)
    # The call's output goes back; the backend is sent the whole conversation as chat turns.
    tool_fake.calls, tool_fake.text = [], "sunny and warm"
    answer = client.responses.create(
        model="m",
        previous_response_id=asked.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "22 C"}],
        tools=[WEATHER],
    )
    sent = tool_fake.requests[-1]
    assert sent["messages"] == [
        {"role": "user", "content": "weather in Paris?"},  # instructions stay with their request
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ARGS},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "22 C"},
    ]
    assert answer.output_text.strip() == "sunny and warm"
    # Charged for what the provider says it was sent and wrote.
    row = UsageRecord.objects.get(request_id=answer.id.removeprefix("resp_"))
    assert (row.prompt_tokens, row.completion_tokens) == (
        answer.usage.input_tokens,
        answer.usage.output_tokens,
    )
    assert UsageRecord.objects.count() == 2


def test_streamed_function_call_arguments_arrive_in_pieces(embedded_server, key, tool_fake):
    _register(tool_fake, kind="openai")
    with _client(embedded_server, key).responses.stream(
        model="m", input="weather?", tools=[WEATHER]
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(pieces) > 1 and "".join(pieces) == ARGS
    [done] = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done.arguments == ARGS and final.output[0].arguments == ARGS
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_an_anthropic_backend_gets_tool_use_and_tool_result_blocks(embedded_server, key):
    fake = ToolFake("anthropic", calls=[("get_weather", ARGS)], piece=5).start()
    try:
        _register(fake, kind="anthropic")
        client = _client(embedded_server, key)
        asked = client.responses.create(model="m", input="weather?", tools=[WEATHER])
        [call] = asked.output
        assert call.type == "function_call" and call.arguments == ARGS
        fake.calls, fake.text = [], "warm"
        answer = client.responses.create(
            model="m",
            previous_response_id=asked.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "22 C"}],
        )
        sent = fake.requests[-1]["messages"]
        assert [m["role"] for m in sent] == ["user", "assistant", "user"]
        assert sent[1]["content"][-1]["type"] == "tool_use"
        assert sent[2]["content"][0]["type"] == "tool_result"
        assert answer.output_text.strip() == "warm"
    finally:
        fake.stop()


def test_another_tenants_response_is_404_everywhere(
    embedded_server, key, tool_fake, other_tenant, other_agent, tiny
):
    _register(tool_fake, kind="openai")
    tool_fake.calls, tool_fake.text = [], "hello"
    mine = _client(embedded_server, key).responses.create(model="m", input="hi")
    _, other_key = api_key_create(tenant=other_tenant, agent=other_agent, scopes=[Scope.INFERENCE])
    theirs = _client(embedded_server, other_key)
    with pytest.raises(openai.NotFoundError):
        theirs.responses.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        theirs.responses.input_items.list(mine.id)
    with pytest.raises(openai.NotFoundError):
        theirs.responses.delete(mine.id)
    with pytest.raises(openai.NotFoundError) as refused:
        theirs.responses.create(model="tiny", input="and?", previous_response_id=mine.id)
    assert refused.value.body["param"] == "previous_response_id"
    assert StoredResponse.objects.filter(pk=mine.id).exists()
    assert not UsageRecord.objects.filter(tenant=other_tenant).exists()
    assert _client(embedded_server, key).responses.retrieve(mine.id).output_text == "hello"


REQUESTS, AFFORDABLE, MAX_TOKENS = 60, 15, 10
PER_TOKEN_OUT = 1000  # micro-cents: input free, so every request costs the same


async def _one(client: httpx.AsyncClient, url: str, key: str, i: int) -> tuple[int, str]:
    body = {
        "model": "paid",
        "max_output_tokens": MAX_TOKENS,
        "stream": True,
        "input": f"request number {i}",
    }
    async with client.stream(
        "POST", url + "/v1/responses", json=body, headers={"Authorization": f"Bearer {key}"}
    ) as response:
        if response.status_code != 200:
            return response.status_code, json.loads(await response.aread())["error"]["code"]
        last = {}
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                last = json.loads(line[6:])
        return 200, last["type"]


def test_concurrent_responses_never_overspend(embedded_server, tenant, agent):
    fake = FakeProvider("openai", reply_tokens=MAX_TOKENS, token_delay=0.005).start()
    try:
        backend = backend_register(
            name="paid", kind="openai", base_url=fake.url, credential=fake.api_key
        )
        backend_model_set(
            backend=backend,
            model="paid",
            upstream_name="fake-model",
            price_output_per_mtok=PER_TOKEN_OUT * 1_000_000,
        )
        agent_routing_set(agent=agent, chain=["paid"])
        limit = AFFORDABLE * MAX_TOKENS * PER_TOKEN_OUT
        budget = budget_create(tenant=tenant, agent=agent, limit_microcents=limit)
        _, key = api_key_create(tenant=tenant, agent=agent, scopes=[Scope.INFERENCE])

        async def all_at_once():
            async with httpx.AsyncClient(timeout=120) as client:
                return await asyncio.gather(
                    *(_one(client, embedded_server.url, key, i) for i in range(REQUESTS))
                )

        results = asyncio.run(all_at_once())
    finally:
        fake.stop()
    served = [last for status, last in results if status == 200]
    refused = [code for status, code in results if status != 200]
    assert set(refused) <= {"budget_exhausted"}, set(refused)
    assert len(served) == AFFORDABLE
    assert set(served) <= {"response.completed", "response.incomplete"}, served
    window = BudgetWindow.objects.get(budget=budget)
    assert window.spent_microcents == limit and window.reserved_microcents == 0
    assert not Reservation.objects.filter(status=Reservation.Status.HELD).exists()
    ledger = UsageRecord.objects.filter(agent=agent).aggregate(cost=Sum("cost_microcents"))
    assert UsageRecord.objects.filter(agent=agent).count() == AFFORDABLE == fake.stats["ok"]
    assert ledger["cost"] == window.spent_microcents


def test_a_stream_cut_mid_way_is_charged_for_what_was_served(embedded_server, key, budget):
    fake = FakeProvider("openai", reply_tokens=400, token_delay=0.02).start()
    try:
        _register(fake, kind="openai", price_output_per_mtok=1_000_000_000)

        async def read_a_few() -> str:
            async with (
                httpx.AsyncClient(base_url=embedded_server.url, timeout=60) as client,
                client.stream(
                    "POST",
                    "/v1/responses",
                    json={"model": "m", "input": "go on", "stream": True},
                    headers={"Authorization": f"Bearer {key}"},
                ) as response,
            ):
                deltas = 0
                async for line in response.aiter_lines():
                    deltas += line == "event: response.output_text.delta"
                    if deltas >= 3:
                        break  # leaving the block closes the connection mid-stream
            return response.headers["x-request-id"]

        request_id = asyncio.run(read_a_few())
        record = wait_for(lambda: UsageRecord.objects.filter(request_id=request_id).first())
    finally:
        fake.stop()
    assert record.status == UsageRecord.Status.CANCELLED
    assert 3 <= record.completion_tokens < 400
    assert record.cost_microcents == record.completion_tokens * 1000
    assert not StoredResponse.objects.exists()  # it never ended: nothing to chain


def test_a_failure_after_the_first_token_ends_the_stream_with_response_failed(
    embedded_server, key, budget
):
    fake = FakeProvider("openai", reply_tokens=20).start()
    try:
        _register(fake, kind="openai")
        fake.push(cut(after=3))
        with _client(embedded_server, key).responses.stream(model="m", input="go") as stream:
            events = list(stream)
    finally:
        fake.stop()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds.count("response.output_text.delta") == 3 and kinds[-1] == "response.failed"
    failed = events[-1].response
    assert failed.status == "failed" and failed.error.code
    assert [e.sequence_number for e in events] == list(range(len(events)))
    row = wait_for(lambda: UsageRecord.objects.first())
    assert row.completion_tokens == 3  # charged for what was served, never another backend's
