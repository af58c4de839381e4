"""Tool calling on our own engine (routing/services/local_tools.py): the tools described to
the model, past calls written as text its template renders, `required` guided to one or more
calls of offered tools (parallel_tool_calls) and named choices to one call, with arguments of
their schemas, `auto` answers that are calls turned into them; through the real /v1 path,
streamed and not, in OpenAI's shapes."""

import json

import jsonschema
import pytest

from routing.services.local_tools import local_guide, local_messages, tool_call_events
from routing.wire.parse import chat_request_parse
from tests.routing.test_routing import chat, streamed
from tests.routing.test_tools_parse import WEATHER
from workers.serving.events import Done, Finish, Tokens, TokenUsage

pytestmark = pytest.mark.django_db(transaction=True)
FLAG = {
    "type": "function",
    "function": {
        "name": "set_flag",
        "parameters": {
            "type": "object",
            "required": ["on"],
            "properties": {"on": {"type": "boolean"}},
            "additionalProperties": False,
        },
    },
}
# Local $refs, as pydantic writes them: they resolve inside the tool's own schema.
MODE = {
    "type": "function",
    "function": {
        "name": "set_mode",
        "parameters": {
            "$defs": {"Mode": {"enum": ["eco", "fast"]}},
            "type": "object",
            "required": ["mode"],
            "properties": {"mode": {"$ref": "#/$defs/Mode"}},
        },
    },
}
# The tiny model's weights are random: biased against blanks (" \t\n\r", 5 + the byte) and
# against "," (arrays of calls grow long otherwise), its answers end within max_tokens.
COMPACT = {"37": -100, "14": -100, "15": -100, "18": -100, "49": -4}


def use_of(**body):
    return chat_request_parse(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}
    ).tool_use


def test_the_tools_are_described_and_past_calls_written_as_text():
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "rain"},
    ]
    turns = local_messages(history, use_of(tools=[WEATHER]))
    assert turns[0]["content"].startswith("Be brief.\n\nYou can call tools.")
    assert '"name": "get_weather"' in turns[0]["content"]
    assert turns[2] == {
        "role": "assistant",
        "content": '{"name": "get_weather", "arguments": {"city": "Oslo"}}',
    }
    assert turns[3] == {"role": "tool", "content": "rain"}
    plain = [{"role": "user", "content": "hi"}]
    assert local_messages(plain, use_of()) is plain


def test_several_calls_are_offered_and_written_as_an_array_unless_parallel_is_off():
    calls = [
        {
            "id": f"c{i}",
            "type": "function",
            "function": {"name": "set_flag", "arguments": json.dumps({"on": i == 1})},
        }
        for i in range(2)
    ]
    history = [
        {"role": "user", "content": "flags?"},
        {"role": "assistant", "content": None, "tool_calls": calls},
    ]
    turns = local_messages(history, use_of(tools=[FLAG]))
    assert "a JSON array of such objects" in turns[0]["content"]
    assert json.loads(turns[2]["content"]) == [
        {"name": "set_flag", "arguments": {"on": False}},
        {"name": "set_flag", "arguments": {"on": True}},
    ]
    single = local_messages(history, use_of(tools=[FLAG], parallel_tool_calls=False))
    assert "JSON array" not in single[0]["content"]


# A template that renders tools and calls itself, as Hugging Face's tool-use templates do.
TOOLS_TEMPLATE = (
    "{% if tools %}<tools>{% for t in tools %}{{ t.function.name }};{% endfor %}</tools>"
    "{% endif %}{% for m in messages %}<{{ m.role }}>"
    "{% if m.tool_calls is defined and m.tool_calls %}"
    "{% for c in m.tool_calls %}<call {{ c.function.name }}>"
    "{{ c.function.arguments }}</call>{% endfor %}{% else %}{{ m.content }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_a_template_that_renders_tools_gets_them_and_the_calls_as_they_are(tmp_path):
    from routing.services.prepare import chat_prompt
    from workers.engine.tokenizer import Tokenizer, byte_tokenizer_write

    byte_tokenizer_write(tmp_path, model_max_length=512)
    tokenizer = Tokenizer(tmp_path)
    assert not tokenizer.template_has_tools  # the presets' ChatML: described as text
    tokenizer.chat_template = TOOLS_TEMPLATE
    assert tokenizer.template_has_tools
    history = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "rain"},
    ]
    use = use_of(tools=[WEATHER, FLAG])
    turns = local_messages(history, use, native=True)
    assert turns is history  # no preamble, calls and results untouched
    text = tokenizer.decode(chat_prompt(tokenizer, turns, tools=use.tools))
    assert text == (
        "<tools>get_weather;set_flag;</tools><user>weather?"
        '<assistant><call get_weather>{"city": "Oslo"}</call><tool>rain<assistant>'
    )


def test_the_guide_follows_tool_choice():
    assert local_guide(use_of(tools=[WEATHER])) == {}  # auto: the model decides
    named = json.loads(
        local_guide(
            use_of(
                tools=[WEATHER, FLAG],
                tool_choice={"type": "function", "function": {"name": "set_flag"}},
            )
        )["guide_schema"]
    )
    assert [o["properties"]["name"] for o in named["anyOf"]] == [{"const": "set_flag"}]
    required = json.loads(
        local_guide(use_of(tools=[WEATHER, FLAG], tool_choice="required"))["guide_schema"]
    )
    *single, several = required["anyOf"]
    assert len(single) == 2 and several["items"] == {"anyOf": single}
    assert several["type"] == "array" and several["minItems"] == 1
    one = json.loads(
        local_guide(
            use_of(tools=[WEATHER, FLAG], tool_choice="required", parallel_tool_calls=False)
        )["guide_schema"]
    )
    assert one["anyOf"] == single
    both = json.loads(
        local_guide(use_of(tools=[FLAG], response_format={"type": "json_object"}))["guide_schema"]
    )
    assert both["anyOf"][-1] == {"type": "object"}
    assert local_guide(use_of(response_format={"type": "json_object"})) == {"guide": "json_object"}


async def run(events, **body):
    async def source():
        for event in events:
            yield event

    return [e async for e in tool_call_events(source(), use_of(**body))]


async def test_answers_that_are_calls_become_calls_and_the_rest_stays_text():
    call = [
        Tokens(choice=0, text='{"name": "set_flag", ', token_ids=(1, 2)),
        Tokens(choice=0, text='"arguments": {"on": true}}', token_ids=(3,)),
        Finish(choice=0, reason="stop"),
        Done(status="ok", usage=TokenUsage()),
    ]
    out = await run(call, tools=[FLAG])
    assert out[0].tool_calls[0].name == "set_flag" and out[0].token_ids == (1, 2, 3)
    assert json.loads(out[0].tool_calls[0].arguments) == {"on": True}
    assert out[1] == Finish(choice=0, reason="tool_calls") and isinstance(out[2], Done)
    text = [
        Tokens(choice=0, text="Sure", token_ids=(1,)),
        Tokens(choice=0, text="!"),
        Finish(choice=0, reason="stop"),
    ]
    assert await run(text, tools=[FLAG]) == text  # streamed on at once
    unknown = [
        Tokens(choice=0, text='{"name": "rm", "arguments": {}}'),
        Finish(choice=0, reason="length"),
    ]
    assert [e.text for e in (await run(unknown, tools=[FLAG]))[:1]] == [unknown[0].text]


async def test_an_array_of_calls_becomes_that_many_calls_each_with_its_own_id():
    calls = [
        Tokens(choice=0, text='[{"name": "set_flag", "arguments": {"on": true}}, ', token_ids=(1,)),
        Tokens(
            choice=0, text='{"name": "set_mode", "arguments": {"mode": "eco"}}]', token_ids=(2,)
        ),
        Finish(choice=0, reason="stop"),
    ]
    first, second, finish = await run(calls, tools=[FLAG, MODE])
    assert [e.tool_calls[0].index for e in (first, second)] == [0, 1]
    assert [e.tool_calls[0].name for e in (first, second)] == ["set_flag", "set_mode"]
    assert first.tool_calls[0].id != second.tool_calls[0].id
    assert first.token_ids == (1, 2) and second.token_ids == ()
    assert finish == Finish(choice=0, reason="tool_calls")
    # Without parallel_tool_calls an array is no call: it stays text.
    [text, stop] = await run(calls, tools=[FLAG, MODE], parallel_tool_calls=False)
    assert text.text.startswith("[{") and not text.tool_calls and stop.reason == "stop"


@pytest.mark.parametrize("stream", [False, True])
async def test_a_named_tool_on_the_local_engine_is_called_with_valid_arguments(
    embedded, key, budget, stream
):
    # Blanks are capped, so a call of this tool is short: greedy decoding must finish one.
    response = await chat(
        key,
        model="tiny",
        max_tokens=200,
        temperature=0,
        stream=stream,
        tools=[WEATHER, FLAG],
        tool_choice={"type": "function", "function": {"name": "set_flag"}},
    )
    assert response.status_code == 200
    if stream:
        deltas = [
            p["choices"][0]
            for p in await streamed(response)
            if isinstance(p, dict) and p.get("choices")
        ]
        [call] = [d["delta"]["tool_calls"][0] for d in deltas if "tool_calls" in d["delta"]]
        assert call["index"] == 0 and call["type"] == "function"
        function, reason = call["function"], deltas[-1]["finish_reason"]
    else:
        [choice] = json.loads(response.content)["choices"]
        [call] = choice["message"]["tool_calls"]
        function, reason = call["function"], choice["finish_reason"]
        assert choice["message"]["content"] is None and call["id"].startswith("call_")
    assert function["name"] == "set_flag" and reason == "tool_calls"
    jsonschema.validate(json.loads(function["arguments"]), FLAG["function"]["parameters"])


def assert_valid_call(function: dict) -> None:
    tool = {t["function"]["name"]: t["function"] for t in (FLAG, MODE)}[function["name"]]
    jsonschema.validate(json.loads(function["arguments"]), tool["parameters"])


@pytest.mark.parametrize("stream", [False, True])
async def test_required_with_parallel_calls_answers_one_or_more_each_its_own_entry(
    embedded, key, budget, stream
):
    counts = []
    for seed in range(6):  # temperature 1: each seed its own answer
        response = await chat(
            key,
            model="tiny",
            max_tokens=400,
            temperature=1.0,
            seed=seed,
            stream=stream,
            logit_bias=COMPACT,
            tools=[FLAG, MODE],
            tool_choice="required",
        )
        assert response.status_code == 200
        if stream:
            deltas = [
                p["choices"][0]
                for p in await streamed(response)
                if isinstance(p, dict) and p.get("choices")
            ]
            pieces = [d["delta"]["tool_calls"] for d in deltas if "tool_calls" in d["delta"]]
            assert all(len(piece) == 1 for piece in pieces)  # a chunk per call, as OpenAI's
            calls = [piece[0] for piece in pieces]
            assert [c["index"] for c in calls] == list(range(len(calls)))
            assert all(set(c) == {"index", "id", "type", "function"} for c in calls)
            assert not any(d["delta"].get("content") for d in deltas)
            reason = deltas[-1]["finish_reason"]
        else:
            [choice] = json.loads(response.content)["choices"]
            assert choice["message"]["content"] is None
            calls, reason = choice["message"]["tool_calls"], choice["finish_reason"]
            assert all(set(c) == {"id", "type", "function"} for c in calls)
        assert reason == "tool_calls" and all(c["type"] == "function" for c in calls)
        ids = [c["id"] for c in calls]
        assert len(set(ids)) == len(ids) and all(i.startswith("call_") for i in ids)
        for call in calls:
            assert_valid_call(call["function"])
        counts.append(len(calls))
    assert min(counts) >= 1 and max(counts) >= 2, counts


async def test_auto_on_the_local_engine_answers_text_when_it_is_no_call(embedded, key, budget):
    response = await chat(key, model="tiny", max_tokens=8, temperature=0, tools=[FLAG])
    [choice] = json.loads(response.content)["choices"]
    assert "tool_calls" not in choice["message"] and choice["finish_reason"] in {"stop", "length"}


async def test_a_model_hosted_on_vllm_refuses_tools_and_json_modes_it_would_not_guide(
    embedded, key, budget
):
    """Our vLLM runtime sends no guides to its child (workers/vllm): a tools or JSON request
    for a model hosted there is a 400 naming the parameter, before anything runs."""
    from asgiref.sync import sync_to_async

    from workers.serving.registration import model_register

    await sync_to_async(model_register)(name="on-vllm", source="preset:tiny", runtime="vllm")
    response = await chat(key, model="on-vllm", max_tokens=8, tools=[FLAG])
    assert response.status_code == 400
    assert json.loads(response.content)["error"]["param"] == "tools"
    response = await chat(
        key, model="on-vllm", max_tokens=8, response_format={"type": "json_object"}
    )
    assert response.status_code == 400
    assert json.loads(response.content)["error"]["param"] == "response_format"
