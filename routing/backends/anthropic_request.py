"""An OpenAI-shaped chat call as Anthropic's Messages request: `system` apart from the turns,
assistant `tool_calls` as `tool_use` blocks, `tool` messages as `tool_result` blocks (one user
turn for a run of them, since Anthropic wants every result of a turn's calls in the next user
turn), images as base64 `source` blocks, tools with `input_schema`, and tool_choice
auto -> auto, required -> any, a named function -> tool, none -> none.

JSON mode is a forced tool: `response_format` json_schema becomes a tool named after the
schema, with the schema as its input, and tool_choice that tool; json_object a tool taking any
object. Its input is the answer's content (routing/backends/anthropic.py). A forced tool,
rather than a prefilled "{", because Anthropic checks tool input is JSON of the schema's shape
and always an object, streams it the same way, and a prefill neither holds the schema nor
stops the model closing the object and talking on."""

from __future__ import annotations

import asyncio
import json

from routing.backends.base import Call
from routing.backends.images import image_source
from routing.wire.tools import ToolUse
from tenants.errors import InvalidRequest

JSON_OBJECT_SCHEMA = {"type": "object", "additionalProperties": True}
EMPTY_SCHEMA = {"type": "object", "properties": {}}


def _arguments(arguments: str, param: str) -> dict:
    try:
        value = json.loads(arguments)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise InvalidRequest(
            "This model's backend needs each tool call's arguments to be a JSON object.",
            param=param,
        )
    return value


async def _user_blocks(content, param: str) -> str | list[dict]:
    if not isinstance(content, list):
        return content
    urls = [p.get("image_url").get("url") for p in content if p.get("type") == "image_url"]
    sources = iter(await asyncio.gather(*(image_source(url, param) for url in urls)))
    return [
        {"type": "image", "source": next(sources)}
        if p.get("type") == "image_url"
        else {"type": "text", "text": p.get("text")}
        for p in content
    ]


def _assistant_blocks(message: dict, param: str) -> str | list[dict]:
    content, calls = message.get("content"), message.get("tool_calls") or ()
    if not calls:
        return content or ""
    blocks = [{"type": "text", "text": content}] if content else []
    for call in calls:
        function = call.get("function")
        blocks.append(
            {
                "type": "tool_use",
                "id": call.get("id"),
                "name": function.get("name"),
                "input": _arguments(function.get("arguments"), param),
            }
        )
    return blocks


def _blocks(content: str | list[dict]) -> list[dict]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


async def turns_translate(messages: list[dict]) -> list[dict]:
    """The conversation without system turns. A tool result and the user turns next to it
    become one user turn (results first)."""
    turns: list[dict] = []
    merge_next = False
    for i, message in enumerate(messages):
        role = message.get("role")
        if role in {"system", "developer"}:
            continue
        is_result = role == "tool"
        content: str | list[dict]
        if is_result:
            content = [
                {
                    "type": "tool_result",
                    "tool_use_id": message.get("tool_call_id"),
                    "content": message.get("content") or "",
                }
            ]
        elif role == "user":
            content = await _user_blocks(message.get("content"), f"messages[{i}].content")
        else:
            content = _assistant_blocks(message, f"messages[{i}].tool_calls")
        wire_role = "assistant" if role == "assistant" else "user"
        previous = turns[-1] if turns else None
        if (
            previous is not None
            and previous.get("role") == "user" == wire_role
            and (is_result or merge_next)
        ):
            previous["content"] = _blocks(previous["content"]) + _blocks(content)
        else:
            turns.append({"role": wire_role, "content": content})
        merge_next = is_result
    return turns


def json_tool(use: ToolUse) -> dict | None:
    """The forced tool standing in for response_format, if any."""
    if use.response_format is None:
        return None
    name = use.schema_name
    if any(t["function"]["name"] == name for t in use.tools):
        raise InvalidRequest(
            f"The response_format name {name!r} is also a tool's name; this "
            "model's backend needs them apart.",
            param="response_format",
        )
    schema = use.response_format.get("json_schema") or {}
    return {
        "name": name,
        "description": schema.get("description")
        or "Give the answer as this tool's input: a JSON object of its schema.",
        "input_schema": schema.get("schema") or JSON_OBJECT_SCHEMA,
    }


def tools_translate(use: ToolUse) -> tuple[list[dict], dict | None]:
    """Anthropic's `tools` and `tool_choice` for the call's tools and response_format."""
    tools = []
    for tool in use.tools:
        function = tool["function"]
        entry = {
            "name": function["name"],
            "input_schema": function.get("parameters") or EMPTY_SCHEMA,
        }
        if function.get("description"):
            entry["description"] = function.get("description")
        tools.append(entry)
    forced = json_tool(use)
    choice, named = use.tool_choice, None
    choice_type: str | None
    if isinstance(choice, dict):
        named = choice["function"]["name"]
    if forced is not None:
        tools.append(forced)
        if named is None and (not use.tools or choice == "none"):
            named = forced.get("name")
        choice_type = "tool" if named else "any"  # a tool or the answer: either way, through a tool
    elif named is not None:
        choice_type = "tool"
    elif isinstance(choice, str):
        choice_type = {"auto": "auto", "required": "any", "none": "none"}.get(choice)
    else:
        choice_type = None
    if choice_type is None and use.parallel_tool_calls is False and tools:
        choice_type = "auto"
    if choice_type is None:
        return tools, None
    out: dict[str, str | bool | None] = {"type": choice_type}
    if choice_type == "tool":
        out["name"] = named
    if use.parallel_tool_calls is False and choice_type != "none":
        out["disable_parallel_tool_use"] = True
    return tools, out


def _history_tools(turns: list[dict]) -> list[str]:
    names = [
        block.get("name")
        for turn in turns
        if isinstance(turn.get("content"), list)
        for block in turn["content"]
        if block.get("type") == "tool_use"
    ]
    return list(dict.fromkeys(names))


async def request_body(call: Call) -> dict:
    if call.native is not None:  # a Messages body: as it came, on our model name and max_tokens
        return {
            **call.native,
            "model": call.upstream,
            "max_tokens": call.max_tokens,
            "stream": True,
        }
    s = call.generation_sampling
    system = "\n\n".join(
        m.get("content") or "" for m in call.messages if m.get("role") in {"system", "developer"}
    )
    body: dict = {
        "model": call.upstream,
        "max_tokens": call.max_tokens,
        "messages": await turns_translate(call.messages),
        "stream": True,
        "temperature": min(s.temperature, 1.0),
    }
    if system:
        body["system"] = system
    if s.top_p < 1.0:
        body["top_p"] = s.top_p
    if s.top_k > 0:
        body["top_k"] = s.top_k
    if s.stop:
        body["stop_sequences"] = list(s.stop)
    tools, choice = tools_translate(call.tool_use)
    if not tools and _history_tools(body["messages"]):
        # Anthropic wants the tools of tool_use blocks in the history defined; none offered
        # this turn: they are defined, and none may be called.
        tools = [
            {"name": name, "input_schema": EMPTY_SCHEMA}
            for name in _history_tools(body["messages"])
        ]
        choice = {"type": "none"}
    if tools:
        body["tools"] = tools
    if choice is not None:
        body["tool_choice"] = choice
    return body
