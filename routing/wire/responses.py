"""OpenAI's Responses API (`POST /v1/responses`) parsed into the chat request every backend
is sent: input items (messages with text and image parts, `function_call` and
`function_call_output`) become chat turns, `instructions` the system turn, function tools
and `text.format` the chat's tools and response_format. Like the chat parser, an argument we
do not know, or cannot honour (hosted tools, `background`), is a 400 naming its `param`.

Items (routing/wire/response_items.py) are kept in the Responses shape
(`ResponsesRequest.items`) so that a stored response can be chained: the earlier turns are
prepended and the whole converted again (`responses_chat_request`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from routing.wire import fields
from routing.wire.messages import messages_parse
from routing.wire.parse import ChatRequest, Sampling
from routing.wire.response_items import items_parse, items_turns
from routing.wire.tools import ToolUse, tool_use_parse
from tenants.errors import InvalidRequest

KNOWN = {
    "model",
    "input",
    "instructions",
    "max_output_tokens",
    "temperature",
    "top_p",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "text",
    "metadata",
    "user",
    "store",
    "stream",
    "stream_options",
    "previous_response_id",
    "truncation",
    "include",
    "reasoning",
    "background",
    "service_tier",
    "top_logprobs",
    "max_tool_calls",
    "prompt",
    "prompt_cache_key",
    "safety_identifier",
    "conversation",
}
# Accepted only at their neutral values (a list: values may be unhashable).
NEUTRAL: dict[str, list] = {
    "truncation": ["disabled"],
    "include": [[]],
    "reasoning": [{}],
    "background": [False],
    "service_tier": ["auto", "default"],
    "top_logprobs": [0],
    "prompt": [],
    "conversation": [],
}
MAX_METADATA = 16


@dataclass(frozen=True, slots=True)
class ResponsesRequest:
    """A Responses request: its own input items (Responses shape, validated), what the chat
    request is built from, and what the response object echoes."""

    model: str
    items: list[dict]
    instructions: str | None
    sampling: Sampling
    tool_use: ToolUse
    stream: bool
    store: bool
    previous_response_id: str | None
    echo: dict  # the request's parameters as the response object repeats them


def _tools(body: dict) -> list[dict]:
    tools = body.get("tools")
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise InvalidRequest("'tools' must be an array.", param="tools")
    chat = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise InvalidRequest(
                f"Tools of type {kind!r} are not supported by this server; use function tools.",
                param=f"tools[{i}].type",
            )
        function = {k: v for k, v in tool.items() if k != "type"}
        chat.append({"type": "function", "function": function})
    return chat


def _tool_choice(body: dict) -> Any:
    choice = body.get("tool_choice")
    if not isinstance(choice, dict):
        return choice
    if choice.get("type") != "function" or set(choice) != {"type", "name"}:
        raise InvalidRequest(
            "'tool_choice' must be none, auto, required or {'type': 'function', 'name': ...}.",
            param="tool_choice",
        )
    return {"type": "function", "function": {"name": choice.get("name")}}


def _response_format(body: dict) -> dict | None:
    text = body.get("text")
    if text is None:
        return None
    if not isinstance(text, dict) or set(text) - {"format", "verbosity"}:
        raise InvalidRequest("'text' must be an object with 'format'.", param="text")
    fields.unsupported_unless(text, "verbosity", ["medium"])
    shape = text.get("format")
    if not isinstance(shape, dict) or shape.get("type") != "json_schema":
        return shape
    schema = {k: v for k, v in shape.items() if k != "type"}
    return {"type": "json_schema", "json_schema": schema}


def _renamed(param: str | None) -> str | None:
    """A chat parser's param as the Responses API names it."""
    if param is None:
        return None
    if param.startswith("messages"):  # turns are not items one for one
        return "input"
    for chat, ours in (
        ("response_format.json_schema", "text.format"),
        ("response_format", "text.format"),
        (".function", ""),
    ):
        param = param.replace(chat, ours)
    return param


def _tool_use(body: dict) -> ToolUse:
    chat = {
        "tools": _tools(body),
        "tool_choice": _tool_choice(body),
        "parallel_tool_calls": body.get("parallel_tool_calls"),
        "response_format": _response_format(body),
    }
    try:
        return tool_use_parse(chat)
    except InvalidRequest as exc:
        raise InvalidRequest(exc.message, param=_renamed(exc.param)) from None


def _metadata(body: dict) -> dict:
    metadata = body.get("metadata")
    if metadata is None:
        return {}
    if (
        not isinstance(metadata, dict)
        or len(metadata) > MAX_METADATA
        or not all(
            isinstance(v, str) and len(k) <= 64 and len(v) <= 512 for k, v in metadata.items()
        )
    ):
        raise InvalidRequest(
            f"'metadata' holds up to {MAX_METADATA} string values (keys up to 64 characters, "
            "values up to 512).",
            param="metadata",
        )
    return metadata


def responses_request_parse(body: Any) -> ResponsesRequest:
    body = fields.json_object(body)
    fields.reject_unknown(body, KNOWN)
    model = fields.string(body, "model", required=True)
    for name, allowed in NEUTRAL.items():
        fields.unsupported_unless(body, name, allowed)
    for name in ("user", "prompt_cache_key", "safety_identifier", "previous_response_id"):
        if body.get(name) is not None:
            fields.string(body, name)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidRequest("'instructions' must be a string.", param="instructions")
    stream = fields.boolean(body, "stream", False)
    options = body.get("stream_options")
    if options is not None and (
        not stream or not isinstance(options, dict) or set(options) - {"include_obfuscation"}
    ):
        raise InvalidRequest(
            "'stream_options' takes 'include_obfuscation', and only with 'stream': true.",
            param="stream_options",
        )
    if options is not None:
        fields.boolean(options, "include_obfuscation", False)
    fields.integer(body, "max_tool_calls", low=1, high=1_000_000, default=None)
    items = items_parse(body)
    items_turns(items)  # validated now, before anything is read for a chain
    tool_use = _tool_use(body)
    max_tokens = fields.integer(body, "max_output_tokens", low=1, high=10_000_000, default=None)
    sampling = Sampling(
        max_tokens=max_tokens,
        temperature=fields.number(body, "temperature", low=0.0, high=2.0, default=1.0),
        top_p=fields.number(body, "top_p", low=0.0, high=1.0, default=1.0, low_open=True),
        top_k=0,
        n=1,
        stop=(),
        seed=None,
        logprobs=None,
    )
    return ResponsesRequest(
        model=model,
        items=items,
        instructions=instructions,
        sampling=sampling,
        tool_use=tool_use,
        stream=stream,
        store=fields.boolean(body, "store", True),
        previous_response_id=body.get("previous_response_id"),
        echo={
            "instructions": instructions,
            "max_output_tokens": max_tokens,
            "metadata": _metadata(body),
            "parallel_tool_calls": fields.boolean(body, "parallel_tool_calls", True),
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "text": {"format": (body.get("text") or {}).get("format") or {"type": "text"}},
            "tool_choice": body.get("tool_choice") or "auto",
            "tools": body.get("tools") or [],
            "user": body.get("user"),
            "store": fields.boolean(body, "store", True),
        },
    )


def responses_chat_request(request: ResponsesRequest, history: list[dict]) -> ChatRequest:
    """The chat request the model is sent: the instructions, the chain's earlier items
    (`history`, already in the Responses shape) and this request's input."""
    turns = items_turns(history + request.items)
    if request.instructions:
        turns.insert(0, {"role": "system", "content": request.instructions})
    if not turns:
        raise InvalidRequest("'input' must not be empty.", param="input")
    try:
        messages = messages_parse({"messages": turns})
    except InvalidRequest as exc:
        raise InvalidRequest(exc.message, param=_renamed(exc.param)) from None
    return ChatRequest(
        model=request.model,
        messages=messages,
        sampling=request.sampling,
        stream=request.stream,
        include_usage=True,
        tool_use=request.tool_use,
    )
