"""The Responses API through the official `openai` client, unmodified, against a live server
in the embedded mode with the `tiny` engine: create, stream (the SDK's own event parser
checks the order), retrieve, delete, input items, chaining, a function tool round trip; each
one ledger row, charged for what the model was sent."""

import json

import openai
import pytest
from pydantic import BaseModel

from routing.models import StoredResponse
from tenants.models import Reservation, UsageRecord

pytestmark = pytest.mark.django_db(transaction=True)
# A boolean's call is short: greedy decoding of the random `tiny` finishes it within
# max_output_tokens (a string argument may run on).
FLAG = {
    "type": "function",
    "name": "set_flag",
    "description": "Turn the flag on or off.",
    "parameters": {
        "type": "object",
        "properties": {"on": {"type": "boolean"}},
        "required": ["on"],
        "additionalProperties": False,
    },
    "strict": True,
}


@pytest.fixture
def client(embedded_server, key):
    return openai.OpenAI(api_key=key, base_url=embedded_server.url + "/v1", max_retries=0)


def _row(response) -> UsageRecord:
    return UsageRecord.objects.get(request_id=response.id.removeprefix("resp_"))


def test_create_is_metered_once_and_stored(client, budget):
    response = client.responses.create(
        model="tiny",
        input="Hello there",
        instructions="Be brief.",
        max_output_tokens=12,
        temperature=0,
        metadata={"run": "a"},
    )
    assert response.object == "response" and response.status in {"completed", "incomplete"}
    [message] = response.output
    assert message.type == "message" and message.role == "assistant"
    assert response.output_text == message.content[0].text
    assert response.usage.output_tokens <= 12 and response.usage.input_tokens > 0
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    assert response.usage.input_tokens_details.cached_tokens >= 0
    assert response.metadata == {"run": "a"} and response.instructions == "Be brief."
    if response.status == "incomplete":
        assert response.incomplete_details.reason == "max_output_tokens"
    row = _row(response)
    assert (row.prompt_tokens, row.completion_tokens) == (
        response.usage.input_tokens,
        response.usage.output_tokens,
    )
    assert Reservation.objects.get(request_id=row.request_id).status == "settled"
    again = client.responses.retrieve(response.id)
    assert again.output_text == response.output_text and again.usage == response.usage
    items = client.responses.input_items.list(response.id)
    assert [(i.type, i.role, i.content[0].text) for i in items.data] == [
        ("message", "user", "Hello there")
    ]


def test_stream_parses_with_the_sdk_and_matches_the_whole_answer(client):
    with client.responses.stream(
        model="tiny", input="Stream, please", max_output_tokens=20, temperature=0
    ) as stream:
        events = list(stream)
    final = events[-1].response  # get_final_response() wants response.completed; a cut one
    # (max_output_tokens) ends with response.incomplete, as OpenAI's
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:-1] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert kinds[-1] in {"response.completed", "response.incomplete"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert final.output_text == text
    whole = client.responses.create(
        model="tiny", input="Stream, please", max_output_tokens=20, temperature=0
    )
    assert whole.output_text == text
    assert whole.usage.output_tokens == final.usage.output_tokens
    assert _row(final).completion_tokens == final.usage.output_tokens


def test_chaining_sends_the_conversation_and_is_charged_for_it(client):
    first = client.responses.create(
        model="tiny", input="My name is Ada.", max_output_tokens=5, temperature=0
    )
    second = client.responses.create(
        model="tiny",
        input="What is my name?",
        previous_response_id=first.id,
        max_output_tokens=5,
        temperature=0,
    )
    alone = client.responses.create(
        model="tiny", input="What is my name?", max_output_tokens=5, temperature=0, store=False
    )
    # The chain is sent the earlier turns: more prompt tokens, each charged.
    assert second.usage.input_tokens > alone.usage.input_tokens + first.usage.input_tokens // 2
    assert _row(second).prompt_tokens == second.usage.input_tokens
    items = client.responses.input_items.list(second.id, order="asc")
    assert [i.type for i in items.data] == ["message", "message", "message"]
    assert [i.role for i in items.data] == ["user", "assistant", "user"]
    assert items.data[1].content[0].text == first.output_text
    # store: false keeps nothing.
    assert not StoredResponse.objects.filter(pk=alone.id).exists()
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(alone.id)
    assert client.responses.delete(first.id) is None
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(first.id)
    # The chain kept its own copy of the conversation.
    third = client.responses.create(
        model="tiny", input="And now?", previous_response_id=second.id, max_output_tokens=3
    )
    assert third.previous_response_id == second.id


def test_function_tool_round_trip(client):
    """tool_choice required: the engine's guided decoding makes a call whatever its weights;
    the call's output goes back as a function_call_output item."""
    response = client.responses.create(
        model="tiny",
        input="What is the weather in Paris?",
        tools=[FLAG],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=200,
        temperature=0,
    )
    [call] = response.output
    assert call.type == "function_call" and call.name == "set_flag"
    assert set(json.loads(call.arguments)) == {"on"}
    answer = client.responses.create(
        model="tiny",
        previous_response_id=response.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        tools=[FLAG],
        max_output_tokens=8,
        temperature=0,
    )
    assert answer.status in {"completed", "incomplete"}
    kinds = [i.type for i in client.responses.input_items.list(answer.id, order="asc").data]
    assert kinds == ["message", "function_call", "function_call_output"]
    # Streamed, the call comes as its own item with its arguments' events.
    with client.responses.stream(
        model="tiny",
        input="Weather in Oslo?",
        tools=[FLAG],
        tool_choice={"type": "function", "name": "set_flag"},
        max_output_tokens=200,
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds
    assert kinds.index("response.function_call_arguments.done") < kinds.index(
        "response.output_item.done"
    )
    [call] = final.output
    assert call.type == "function_call" and set(json.loads(call.arguments)) == {"on"}


def test_unsupported_parameters_are_400_naming_them(client):
    for extra, param in (
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"background": True}, "background"),
        ({"extra_body": {"frequency_penalty": 1.0}}, "frequency_penalty"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"text": {"format": {"type": "yaml"}}}, "text.format"),
    ):
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model="tiny", **{"input": "hi", **extra})
        assert refused.value.param == param, (extra, refused.value.body)
    assert not UsageRecord.objects.exists()


class Flag(BaseModel):
    on: bool


def test_structured_output_with_text_format_parses_with_the_sdk(client):
    """`responses.parse` sends text.format json_schema (strict); our engine's guided decoding
    makes the answer match it whatever the weights."""
    parsed = client.responses.parse(
        model="tiny", input="Is the flag on?", text_format=Flag, max_output_tokens=200
    )
    assert isinstance(parsed.output_parsed, Flag)
    assert json.loads(parsed.output_text) == parsed.output_parsed.model_dump()
    stored = client.responses.retrieve(parsed.id)
    assert stored.text.format.type == "json_schema" and stored.text.format.name == "Flag"
