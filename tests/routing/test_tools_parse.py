"""Tools, JSON mode and images as parsed: OpenAI's shapes accepted and forwarded as sent,
anything malformed a 400 naming its param; what a request needs from a backend
(`features`); and what a request is counted as before and after (tools and images never
free)."""

import base64

import pytest

from routing.backends.base import Call
from routing.remote import _usage
from routing.services.prepare import worst_prompt_tokens
from routing.wire.parse import chat_request_parse
from routing.wire.render import ChatFormat
from routing.wire.tools import ToolUse
from tenants.errors import InvalidRequest
from workers.serving.events import Finish, Tokens, TokenUsage, ToolCallDelta

MSG = [{"role": "user", "content": "hi"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode()
DATA_URL = f"data:image/png;base64,{PNG}"


def parse(**body):
    return chat_request_parse({"model": "m", "messages": MSG, **body})


def test_a_whole_tool_conversation_parses_as_sent():
    messages = [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "weather here? "},
                {"type": "image_url", "image_url": {"url": DATA_URL, "detail": "low"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    request = chat_request_parse(
        {
            "model": "m",
            "messages": messages,
            "tools": [WEATHER],
            "parallel_tool_calls": False,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "weather", "strict": True, "schema": {"type": "object"}},
            },
        }
    )
    assert request.messages == messages
    use = request.tool_use
    assert use.tools == (WEATHER,) and use.parallel_tool_calls is False
    assert use.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    assert use.response_format["json_schema"]["name"] == "weather"
    assert request.features == {"tools", "json_schema", "vision"}


def test_text_only_requests_need_nothing_and_keep_their_old_shape():
    request = parse(
        tools=[], tool_choice="auto", response_format={"type": "text"}, parallel_tool_calls=True
    )
    assert request.features == frozenset() and request.tool_use == ToolUse()
    assert request.messages == MSG
    assert parse(response_format={"type": "json_object"}).features == {"json_object"}
    history = [
        {
            "role": "assistant",
            "content": "x",
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "ok"}]},
    ]
    assert chat_request_parse({"model": "m", "messages": history}).features == {"tools"}


def bad_image(part):
    return {"messages": [{"role": "user", "content": [part]}]}


@pytest.mark.parametrize(
    "body,param",
    [
        ({"tools": {"type": "function"}}, "tools"),
        ({"tools": [{"type": "code_interpreter"}]}, "tools[0].type"),
        ({"tools": [{"type": "function"}]}, "tools[0].function"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]},
            "tools[0].function.parameters",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}]},
            "tools[0].function.strict",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "extra": 1}}]},
            "tools[0].function.extra",
        ),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        ({"tools": [WEATHER] * 129}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"tools": [WEATHER], "tool_choice": {"type": "function"}}, "tool_choice"),
        ({"tools": [WEATHER], "parallel_tool_calls": "no"}, "parallel_tool_calls"),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        ({"response_format": "json"}, "response_format"),
        ({"response_format": {"type": "json_object", "schema": {}}}, "response_format"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
            "response_format.json_schema.name",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": []},
                }
            },
            "response_format.json_schema.schema",
        ),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"function_call": "auto"}, "function_call"),
        (bad_image({"type": "image_url", "image_url": "http://x/y.png"}), "messages[0].content"),
        (
            bad_image({"type": "image_url", "image_url": {"url": "ftp://x/y.png"}}),
            "messages[0].content",
        ),
        (
            bad_image({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}),
            "messages[0].content",
        ),
        (
            bad_image({"type": "image_url", "image_url": {"url": "data:text/plain;base64,aGk="}}),
            "messages[0].content",
        ),
        (
            bad_image({"type": "image_url", "image_url": {"url": DATA_URL, "detail": "max"}}),
            "messages[0].content",
        ),
        (bad_image({"type": "input_audio", "input_audio": {}}), "messages[0].content"),
        (
            {
                "messages": [
                    {
                        "role": "system",
                        "content": [{"type": "image_url", "image_url": {"url": DATA_URL}}],
                    }
                ]
            },
            "messages[0].content",
        ),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
        ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
        ({"messages": [{"role": "assistant", "content": None}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": "x", "tool_calls": []}]},
            "messages[0].tool_calls",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "c",
                                "type": "function",
                                "function": {"name": "f", "arguments": {}},
                            }
                        ],
                    }
                ]
            },
            "messages[0].tool_calls",
        ),
        (
            {"messages": [{"role": "assistant", "content": "", "function_call": {"name": "f"}}]},
            "messages[0].function_call",
        ),
    ],
)
def test_malformed_tools_choices_formats_and_images_name_their_param(body, param):
    with pytest.raises(InvalidRequest) as exc_info:
        parse(**body)
    assert exc_info.value.param == param


def test_tools_and_images_count_in_the_worst_case_and_when_unreported(settings):
    request = parse(
        tools=[WEATHER],
        response_format={"type": "json_object"},
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "hi"},
                    {"type": "image_url", "image_url": {"url": DATA_URL}},
                ],
            }
        ],
    )
    plain = worst_prompt_tokens(MSG, "")
    worst = worst_prompt_tokens(request.messages, "", request.tool_use)
    assert worst >= plain + settings.FAIRLANE_IMAGE_WORST_TOKENS + len(str(WEATHER)) // 2
    call = Call(
        endpoint="chat",
        upstream="u",
        sampling=request.sampling,
        max_tokens=5,
        messages=request.messages,
        tool_use=request.tool_use,
    )
    bare = Call(
        endpoint="chat", upstream="u", sampling=request.sampling, max_tokens=5, messages=MSG
    )
    answer = [
        Tokens(
            choice=0,
            text="",
            tool_calls=(
                ToolCallDelta(index=0, id="c", name="get_weather", arguments='{"city": "Oslo"}'),
            ),
        )
    ]
    counted = _usage(None, call, answer)
    assert (
        counted.prompt_tokens
        > _usage(None, bare, []).prompt_tokens + settings.FAIRLANE_IMAGE_WORST_TOKENS
    )
    assert counted.completion_tokens >= 5  # the call's name and arguments, never zero


def test_tool_call_pieces_render_as_openai_streams_and_collects_them():
    fmt = ChatFormat(request_id="r", model="m", num_choices=1, tokenizer=None, wants_logprobs=False)
    first = fmt.token_chunk(
        Tokens(
            choice=0, text="", tool_calls=(ToolCallDelta(index=0, id="call_1", name="get_weather"),)
        ),
        False,
    )
    assert first["choices"][0]["delta"] == {
        "tool_calls": [
            {
                "index": 0,
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": ""},
            }
        ]
    }
    more = fmt.token_chunk(
        Tokens(choice=0, text="", tool_calls=(ToolCallDelta(index=0, arguments='{"city"'),)), False
    )
    assert more["choices"][0]["delta"] == {
        "tool_calls": [{"index": 0, "function": {"arguments": '{"city"'}}]
    }
    fmt.absorb(Tokens(choice=0, text="", tool_calls=(ToolCallDelta(index=0, arguments=": 1}"),)))
    fmt.absorb(Finish(choice=0, reason="tool_calls"))
    [choice] = fmt.response(TokenUsage(prompt_tokens=1, completion_tokens=2))["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert choice["message"]["tool_calls"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": 1}'},
        }
    ]
