"""Anthropic's Messages request (`POST /v1/messages`) parsed into the chat request every other
front door makes: the messages as chat turns (anthropic_messages.py), tools with `input_schema`
as functions, tool_choice auto/any/tool/none as auto/required/a named function/none, and
`output_config.format` as a json_schema response_format.

The body itself rides along (`ChatRequest.native`, checked here as strictly as the rest): an
Anthropic backend is sent it as it came, so `cache_control`, thinking and what the chat shape
does not model reach it (routing/backends/anthropic_request.py)."""

from __future__ import annotations

import json
from typing import Any

from routing.wire import fields
from routing.wire.anthropic_messages import (
    THINKING_TYPES,
    anthropic_messages,
    cache_control_check,
)
from routing.wire.parse import ChatRequest, Sampling
from routing.wire.tools import NAME, tool_use_parse
from tenants.errors import InvalidRequest

KNOWN = {
    "model",
    "messages",
    "system",
    "max_tokens",
    "stop_sequences",
    "temperature",
    "top_p",
    "top_k",
    "tools",
    "tool_choice",
    "metadata",
    "stream",
    "thinking",
    "service_tier",
    "cache_control",
    "output_config",
}
COUNT_KNOWN = {
    "model",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "thinking",
    "cache_control",
    "output_config",
}
EFFORTS = {"low", "medium", "high", "xhigh", "max"}
MAX_STOP_SEQUENCES = 16
MAX_TOKENS = 10_000_000
CHOICES = {"auto": "auto", "any": "required", "none": "none"}
TOOL_KEYS = {"type", "name", "description", "input_schema", "cache_control"}
CHOICE_KEYS = {"type", "name", "disable_parallel_tool_use"}


def _one_of(value: Any, allowed: set[str]) -> bool:
    """Whether a JSON value is one of `allowed` (an object or array is none, not a crash)."""
    return isinstance(value, str) and value in allowed


def _tools(body: dict) -> list[dict] | None:
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise InvalidRequest("'tools' must be an array.", param="tools")
    out = []
    for i, tool in enumerate(tools):
        param = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type", "custom") != "custom":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise InvalidRequest(f"Tool type {kind!r} is not supported here.", param=param)
        unknown = sorted(set(tool) - TOOL_KEYS)
        if unknown:
            raise InvalidRequest(f"Unknown tool field {unknown[0]!r}.", param=param)
        cache_control_check(tool.get("cache_control"), f"{param}.cache_control")
        if not isinstance(tool.get("name"), str) or not NAME.fullmatch(tool["name"]):
            raise InvalidRequest("A tool name is 1 to 64 of a-z, A-Z, 0-9, _ and -.", param=param)
        if not isinstance(tool.get("input_schema"), dict):
            raise InvalidRequest(
                "A tool needs an object 'input_schema'.", param=f"{param}.input_schema"
            )
        function = {"name": tool["name"], "parameters": tool["input_schema"]}
        if tool.get("description") is not None:
            function["description"] = tool.get("description")
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(body: dict) -> tuple[Any, bool | None]:
    choice = body.get("tool_choice")
    if choice is None:
        return None, None
    kind = choice.get("type") if isinstance(choice, dict) else None
    allowed = CHOICE_KEYS if kind == "tool" else CHOICE_KEYS - {"name"}
    if isinstance(choice, dict) and set(choice) - allowed:
        kind = None
    parallel = None
    if isinstance(choice, dict) and choice.get("disable_parallel_tool_use") is not None:
        parallel = not fields.boolean(choice, "disable_parallel_tool_use", False)
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    if isinstance(kind, str) and kind in CHOICES:
        return CHOICES[kind], parallel
    raise InvalidRequest(
        "'tool_choice' is {'type': 'auto' | 'any' | 'none'} or {'type': 'tool', 'name': ...}.",
        param="tool_choice",
    )


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop_sequences")
    if stop is None:
        return ()
    if (
        not isinstance(stop, list)
        or len(stop) > MAX_STOP_SEQUENCES
        or not all(isinstance(s, str) and s for s in stop)
    ):
        raise InvalidRequest(
            f"'stop_sequences' is an array of up to {MAX_STOP_SEQUENCES} non-empty strings.",
            param="stop_sequences",
        )
    return tuple(stop)


def _extras(body: dict) -> None:
    """What is checked but changes nothing in the chat shape."""
    metadata = body.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict) or set(metadata) - {"user_id"}:
            raise InvalidRequest("'metadata' holds only 'user_id'.", param="metadata")
        if metadata.get("user_id") is not None:
            fields.string(metadata, "user_id")
    thinking = body.get("thinking")
    if thinking is not None and (
        not isinstance(thinking, dict) or not _one_of(thinking.get("type"), THINKING_TYPES)
    ):
        raise InvalidRequest(
            f"'thinking' is {{'type': one of {sorted(THINKING_TYPES)}, ...}}.", param="thinking"
        )
    fields.unsupported_unless(body, "service_tier", ["auto", "standard_only"])
    cache_control_check(body.get("cache_control"), "cache_control")


def _response_format(body: dict) -> dict | None:
    """`output_config.format` (a JSON schema the answer must follow) as OpenAI's
    response_format; `output_config.effort` is for models that think, and changes nothing
    elsewhere."""
    config = body.get("output_config")
    if config is None:
        return None
    if not isinstance(config, dict) or set(config) - {"effort", "format"}:
        raise InvalidRequest("'output_config' holds 'effort' and 'format'.", param="output_config")
    if config.get("effort") is not None and not _one_of(config.get("effort"), EFFORTS):
        raise InvalidRequest(f"'effort' is one of {sorted(EFFORTS)}.", param="output_config.effort")
    form = config.get("format")
    if form is None:
        return None
    if (
        not isinstance(form, dict)
        or form.get("type") != "json_schema"
        or not isinstance(form.get("schema"), dict)
    ):
        raise InvalidRequest(
            "'format' is {'type': 'json_schema', 'schema': {...}}.", param="output_config.format"
        )
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": form["schema"]}}


def messages_request_parse(body: Any, *, counting: bool = False) -> ChatRequest:
    """The chat request of a Messages body; `counting`: count_tokens' (no max_tokens)."""
    body = fields.json_object(body)
    fields.reject_unknown(body, COUNT_KNOWN if counting else KNOWN)
    model = fields.string(body, "model", required=True)
    messages = anthropic_messages(body)
    choice, parallel = _tool_choice(body)
    tools = _tools(body)
    openai_shape = {
        "tools": tools,
        "tool_choice": choice,
        "parallel_tool_calls": parallel,
        "response_format": _response_format(body),
    }
    if choice is not None and not tools:
        openai_shape["tool_choice"] = None  # Anthropic takes a tool_choice without tools
    tool_use = tool_use_parse({k: v for k, v in openai_shape.items() if v is not None})
    _extras(body)
    if counting:
        max_tokens = 1
    else:
        if body.get("max_tokens") is None:
            raise InvalidRequest("Missing required parameter: 'max_tokens'.", param="max_tokens")
        max_tokens = fields.integer(body, "max_tokens", low=1, high=MAX_TOKENS, default=1)
    sampling = Sampling(
        max_tokens=max_tokens,
        temperature=fields.number(body, "temperature", low=0.0, high=1.0, default=1.0),
        top_p=fields.number(body, "top_p", low=0.0, high=1.0, default=1.0, low_open=True),
        top_k=fields.integer(body, "top_k", low=0, high=1_000_000, default=0),
        n=1,
        stop=_stop(body),
        seed=None,
        logprobs=None,
    )
    return ChatRequest(
        model=model,
        messages=messages,
        sampling=sampling,
        stream=fields.boolean(body, "stream", False),
        include_usage=True,
        tool_use=tool_use,
        native=body,
    )


def cache_control_used(native: dict | None) -> bool:
    """Whether a Messages body asks for prompt caching anywhere (its writes cost more)."""
    return native is not None and b'"cache_control"' in json.dumps(native).encode()
