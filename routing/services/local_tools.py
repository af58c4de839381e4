"""Tool calling on our own engine, whatever the model's chat template knows of tools.

A template that renders tools (Hugging Face's `tools` variable) gets them, and the past calls
and results as they are. For any other, the tools are described in the system turn, with the
one way to call them: an answer that is only `{"name": <tool>, "arguments": {...}}`, or, with
`parallel_tool_calls` (OpenAI's default), a JSON array of such calls. Past calls and results
are written into the turns as text the template can render, in the same shapes. With
tool_choice `required` the answer is guided (workers/engine/guide.py, llguidance) to be one
or more calls of tools offered with arguments of their schemas; a named function, one call of
it; with `auto` an answer that turns out to be such calls is them, anything else is text (an
answer opening with "{" or "[" is held back until it is known which).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator

from routing.wire.tools import ToolUse
from workers.serving.events import Done, Event, Failed, Finish, Tokens, ToolCallDelta

PREAMBLE = (
    "You can call tools. To call one, answer with only a JSON object "
    '{"name": <the tool\'s name>, "arguments": <its arguments>} and nothing else. '
)
PARALLEL = "To call several at once, answer with only a JSON array of such objects. "
ANY_OBJECT = {"type": "object"}


def tools_active(use: ToolUse) -> bool:
    return bool(use.tools) and use.tool_choice != "none"


def _parallel(use: ToolUse) -> bool:
    """Whether an answer may be several calls: OpenAI's default, not for a named function."""
    return use.parallel_tool_calls is not False and not isinstance(use.tool_choice, dict)


def _call_text(calls: list[dict]) -> str:
    """Past calls as the model answers them: one object, or an array of several."""
    written = []
    for call in calls:
        function = call["function"]
        try:
            arguments = json.loads(function.get("arguments"))
        except ValueError:
            arguments = function.get("arguments")
        written.append({"name": function.get("name"), "arguments": arguments})
    return json.dumps(written[0] if len(written) == 1 else written)


def local_messages(messages: list[dict], use: ToolUse, *, native: bool = False) -> list[dict]:
    """The turns as the chat template gets them: unchanged without tools, or when the template
    renders tools itself (`native`: it gets the tools, the calls and the results as they are);
    else every content a string, the tools described in the (first) system turn."""
    if native or (
        not tools_active(use)
        and not any(m.get("tool_calls") or m.get("role") == "tool" for m in messages)
    ):
        return messages
    turns: list[dict] = []
    for message in messages:
        content = message.get("content") or ""
        if message.get("tool_calls"):
            content = "\n".join(filter(None, [content, _call_text(message["tool_calls"])]))
        turns.append({"role": message.get("role"), "content": content})
    if tools_active(use):
        described = [{k: v for k, v in t["function"].items() if k != "strict"} for t in use.tools]
        preamble = (
            PREAMBLE + (PARALLEL if _parallel(use) else "") + "The tools:\n" + json.dumps(described)
        )
        if turns and turns[0].get("role") in {"system", "developer"}:
            turns[0] = {**turns[0], "content": turns[0]["content"] + "\n\n" + preamble}
        else:
            turns.insert(0, {"role": "system", "content": preamble})
    return turns


def _call_schema(tool: dict) -> dict:
    function = tool["function"]
    arguments = function.get("parameters") or ANY_OBJECT
    # Its own base URI: the local $refs of its schema ("#/$defs/...") resolve inside it.
    arguments = {"$id": f"urn:fairlane:tool:{function.get('name')}", **arguments}
    return {
        "type": "object",
        "required": ["name", "arguments"],
        "additionalProperties": False,
        "properties": {"name": {"const": function.get("name")}, "arguments": arguments},
    }


def _answer_schema(use: ToolUse) -> dict | None:
    if use.response_format is None:
        return None
    if use.response_format.get("type") == "json_object":
        return ANY_OBJECT
    return use.response_format["json_schema"].get("schema") or {}


def local_guide(use: ToolUse) -> dict:
    """What our engine's guide is told (SamplingParams keywords): the answer's format; with
    tools, calls for `required` (one or more with parallel_tool_calls) or one call of a named
    function, calls or the answer's format for `auto` with a response_format, nothing for
    `auto` alone (the model decides)."""
    answer = _answer_schema(use)
    choice = use.tool_choice
    if not tools_active(use):
        if answer is None:
            return {}
        if answer is ANY_OBJECT:
            return {"guide": "json_object"}
        return {"guide": "json_schema", "guide_schema": json.dumps(_lenient(answer, use))}
    calls = [_call_schema(t) for t in use.tools]
    if isinstance(choice, dict):
        name = choice["function"]["name"]
        calls = [c for c, t in zip(calls, use.tools, strict=True) if t["function"]["name"] == name]
    elif choice != "required" and answer is None:
        return {}
    options = list(calls)
    if _parallel(use):
        options.append({"type": "array", "minItems": 1, "items": {"anyOf": calls}})
    if (choice == "auto" or choice is None) and answer is not None:
        options.append(
            answer if answer is ANY_OBJECT else {"$id": "urn:fairlane:response_format", **answer}
        )
    return {"guide": "json_schema", "guide_schema": json.dumps(_lenient({"anyOf": options}, use))}


def _lenient(schema: dict, use: ToolUse) -> dict:
    """As OpenAI does: a schema sent with `strict: true` is enforced exactly, and one using a
    keyword the engine cannot enforce is refused (400); without `strict` (every schema of the
    guide must ask for it) such keywords are ignored and the rest enforced (llguidance's
    lenient mode)."""
    flags = [t["function"].get("strict") for t in use.tools] if tools_active(use) else []
    if use.response_format is not None and use.response_format.get("type") == "json_schema":
        flags.append(use.response_format["json_schema"].get("strict"))
    if flags and all(flag is True for flag in flags):
        return schema
    return {**schema, "x-guidance": {"lenient": True}}


def _as_calls(text: str, names: set[str], *, parallel: bool) -> list[ToolCallDelta] | None:
    """An answer that is a call of an offered tool (or, with parallel, an array of them) as
    its calls, each with its own id; None for anything else."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    calls = value if parallel and isinstance(value, list) and value else [value]
    for call in calls:
        if (
            not isinstance(call, dict)
            or set(call) != {"name", "arguments"}
            or call.get("name") not in names
            or not isinstance(call.get("arguments"), dict)
        ):
            return None
    return [
        ToolCallDelta(
            index=i,
            id=f"call_{secrets.token_hex(12)}",
            name=call.get("name"),
            arguments=json.dumps(call.get("arguments")),
        )
        for i, call in enumerate(calls)
    ]


async def tool_call_events(
    events: AsyncIterator[Event],
    use: ToolUse,
) -> AsyncIterator[Event]:
    """The engine's events with answers that are tool calls turned into them."""
    names = {t["function"]["name"] for t in use.tools}
    parallel = _parallel(use)
    held: dict[int, list[Tokens]] = {}  # per choice: text held back while it may be a call
    passing: set[int] = set()  # choices known to be text

    def flush(choice: int) -> list[Event]:
        pieces = held.pop(choice, [])
        if not pieces:
            return []
        return [
            Tokens(
                choice=choice,
                text="".join(p.text for p in pieces),
                token_ids=tuple(t for p in pieces for t in p.token_ids),
            )
        ]

    async for event in events:
        match event:
            case Tokens(choice=choice) if choice not in passing:
                held.setdefault(choice, []).append(event)
                text = "".join(p.text for p in held[choice]).lstrip()
                if text and not text.startswith(("{", "[")):
                    passing.add(choice)
                    for flushed in flush(choice):
                        yield flushed
            case Finish(choice=choice) if choice in held:
                pieces = held.pop(choice)
                calls = _as_calls("".join(p.text for p in pieces), names, parallel=parallel)
                if calls is None:
                    held[choice] = pieces
                    for flushed in flush(choice):
                        yield flushed
                    yield event
                else:  # one chunk per call, as OpenAI streams them; the tokens with the first
                    token_ids = tuple(t for p in pieces for t in p.token_ids)
                    for call in calls:
                        yield Tokens(
                            choice=choice,
                            text="",
                            tool_calls=(call,),
                            token_ids=token_ids if call.index == 0 else (),
                        )
                    yield Finish(choice=choice, reason="tool_calls")
            case Failed() | Done():
                for choice in list(held):
                    for flushed in flush(choice):
                        yield flushed
                yield event
            case _:
                yield event
