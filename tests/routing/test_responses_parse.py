"""The Responses API's parser (routing/wire/responses.py): items into chat turns, parameters
into the chat request's, and every refusal naming its `param`; stored responses keep any
text (U+0000 too) and are read per tenant; the websocket API takes the same request."""

import pytest
from channels.db import database_sync_to_async
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from routing.responses.store import (
    stored_response_create,
    stored_response_delete,
    stored_response_get,
    stored_response_history,
    stored_responses_expire,
)
from routing.wire.responses import responses_chat_request, responses_request_parse
from tenants.errors import InvalidRequest, NotFound
from tenants.models import UsageRecord
from tests.routing.test_websocket import connect, frames_until_done


def parse(**body):
    return responses_request_parse({"model": "m", **body})


def test_items_become_chat_turns():
    request = parse(
        instructions="Be brief.",
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "a"},
                    {"type": "input_text", "text": "b"},
                ],
            },
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "c", "annotations": []}],
            },
            {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
            {"type": "function_call", "call_id": "call_2", "name": "g", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "one"},
            {"type": "function_call_output", "call_id": "call_2", "output": "two"},
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "see"},
                    {
                        "type": "input_image",
                        "image_url": "https://img.example/a.png",
                        "detail": "low",
                    },
                ],
            },
        ],
        max_output_tokens=7,
        temperature=0.5,
    )
    chat = responses_chat_request(request, [])
    assert chat.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "ab"},
        {
            "role": "assistant",
            "content": "c",
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                {"id": "call_2", "type": "function", "function": {"name": "g", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "one"},
        {"role": "tool", "tool_call_id": "call_2", "content": "two"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "see"},
                {
                    "type": "image_url",
                    "image_url": {"url": "https://img.example/a.png", "detail": "low"},
                },
            ],
        },
    ]
    assert chat.sampling.max_tokens == 7 and chat.sampling.temperature == 0.5
    assert chat.features == {"tools", "vision"}


def test_tools_and_text_format_become_the_chat_ones():
    request = parse(
        input="hi",
        tools=[{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True}],
        tool_choice={"type": "function", "name": "f"},
        parallel_tool_calls=False,
        text={"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}}},
    )
    use = request.tool_use
    assert use.tools == (
        {
            "type": "function",
            "function": {"name": "f", "parameters": {"type": "object"}, "strict": True},
        },
    )
    assert use.tool_choice == {"type": "function", "function": {"name": "f"}}
    assert use.parallel_tool_calls is False
    assert use.response_format == {
        "type": "json_schema",
        "json_schema": {"name": "out", "schema": {"type": "object"}},
    }


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [{"type": "web_search_preview"}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "name": "f", "extra": 1}]}, "tools[0].extra"),
        ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
        (
            {
                "tools": [{"type": "function", "name": "f"}],
                "tool_choice": {"type": "function", "name": "g"},
            },
            "tool_choice",
        ),
        ({"background": True}, "background"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"include": ["reasoning.encrypted_content"]}, "include"),
        ({"logit_bias": {}}, "logit_bias"),
        ({"text": {"format": {"type": "json_schema"}}}, "text.format.name"),
        ({"input": []}, "input"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
        ({"input": [{"type": {}, "call_id": "0", "output": ""}]}, "input[0].type"),
        ({"input": [{"role": "user", "content": [{"type": {}}]}]}, "input[0].content[0].type"),
        (
            {
                "input": [
                    {"role": "assistant", "content": [{"type": "input_image", "image_url": "x"}]}
                ]
            },
            "input[0].content[0].type",
        ),
        (
            {"input": [{"type": "function_call_output", "call_id": "a b", "output": "x"}]},
            "input[0].call_id",
        ),
        (
            {
                "input": [
                    {"role": "user", "content": [{"type": "input_image", "image_url": "ftp://x"}]}
                ]
            },
            "input",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
            "input[0].content[0].file_id",
        ),
        ({"metadata": {"k": 1}}, "metadata"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"stream_options": {"include_obfuscation": False}}, "stream_options"),
    ],
)
def test_refusals_name_the_param(body, param):
    with pytest.raises(InvalidRequest) as refused:
        request = parse(**{"input": "hi", **body})
        responses_chat_request(request, [])
    assert refused.value.param == param


@pytest.mark.django_db
def test_stored_responses_keep_any_text_and_are_per_tenant(tenant, agent, other_tenant):
    items = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a\x00b"}]}
    ]
    body = {"id": "resp_1", "output": [{"type": "message", "content": [{"text": "\x00"}]}]}
    stored_response_create(tenant=tenant, agent=agent, items=items, body=body)
    history = stored_response_history(tenant=tenant, response_id="resp_1")
    assert history[0]["content"][0]["text"] == "a\x00b" and history[0]["id"].startswith("msg_")
    assert history[1] == body["output"][0]
    for call in (stored_response_get, stored_response_delete, stored_response_history):
        with pytest.raises(NotFound):
            call(tenant=other_tenant, response_id="resp_1")
    assert stored_response_get(tenant=tenant, response_id="resp_1")


@pytest.mark.django_db
def test_expired_responses_are_gone(tenant, agent, settings):
    settings.FAIRLANE_RESPONSES_RETENTION_DAYS = 0
    stored_response_create(tenant=tenant, agent=agent, items=[], body={"id": "resp_kept"})
    settings.FAIRLANE_RESPONSES_RETENTION_DAYS = -1  # expired at once
    stored_response_create(tenant=tenant, agent=agent, items=[], body={"id": "resp_old"})
    with pytest.raises(NotFound):
        stored_response_get(tenant=tenant, response_id="resp_old")
    assert stored_responses_expire() == 1
    assert stored_response_get(tenant=tenant, response_id="resp_kept").expires_at is None


@pytest.mark.django_db(transaction=True)
async def test_the_websocket_takes_the_responses_shape(embedded, key):
    from asgi import application

    ws = await connect(application, key)
    assert (await ws.receive_json_from())["type"] == "auth.ok"
    body = {"model": "tiny", "input": "hi", "max_output_tokens": 6, "temperature": 0}
    await ws.send_json_to({"type": "responses", "id": "r", "body": body})
    frames = (await frames_until_done(ws, {"r"}))["r"]
    events = [f["data"] for f in frames if f["type"] == "chunk"]
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] in {"response.completed", "response.incomplete"}
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]["response"]
    assert frames[-1]["type"] == "done" and frames[-1]["usage"] == final["usage"]
    assert final["usage"]["output_tokens"] <= 6
    row = await database_sync_to_async(UsageRecord.objects.get)()
    assert row.request_id == final["id"].removeprefix("resp_")
    await ws.disconnect()


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)
KEYS = ["type", "role", "content", "text", "call_id", "name", "arguments", "output", "image_url"]
WORDS = ["message", "user", "assistant", "system", "input_text", "output_text", "refusal"]
WORDS += ["input_image", "function_call", "function_call_output", "call_1", "f", "{}"]
ITEM = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(WORDS) | JSON, max_size=5)
PARTS_OR_TEXT = st.lists(ITEM, max_size=3) | st.sampled_from(WORDS)
FIELDS = ["input", "tools", "tool_choice", "text", "metadata", "instructions"]
FIELDS += ["max_output_tokens", "stream_options", "include", "parallel_tool_calls", "store"]


@settings(max_examples=1500, deadline=None, database=None)
@seed(20261205)
@given(
    items=st.lists(
        st.one_of(
            ITEM,
            st.fixed_dictionaries(
                {"role": st.sampled_from(WORDS)},
                optional={"content": PARTS_OR_TEXT, "type": st.sampled_from(WORDS)},
            ),
        ),
        max_size=4,
    ),
    extra=st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=2),
)
def test_fuzz_bodies_parse_or_are_refused_as_invalid(items, extra):
    """Whatever the items and fields, a request is parsed or refused with a 400 naming a
    param: never another exception (a 500)."""
    try:
        request = parse(**{"input": items, **extra})
        responses_chat_request(request, [])
    except InvalidRequest as exc:
        assert exc.status == 400 and exc.param, exc
