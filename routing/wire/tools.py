"""Function calling and structured output in OpenAI's shapes: `tools`, `tool_choice`,
`parallel_tool_calls` and `response_format`, validated strictly (a 400 naming the param) and
normalised to what is forwarded. Which backends can honour them is the router's business
(`features`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tenants.errors import InvalidRequest

MAX_TOOLS = 128
NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
FUNCTION_KEYS = {"name", "description", "parameters", "strict"}
SCHEMA_KEYS = {"name", "description", "schema", "strict"}
CHOICES = {"none", "auto", "required"}


@dataclass(frozen=True, slots=True)
class ToolUse:
    """What a chat request asks of a backend beyond text: its tools (OpenAI's shape, only the
    keys given), tool_choice ("none" | "auto" | "required" | {"type": "function", ...}),
    parallel_tool_calls, and response_format (json_object or json_schema; None for text)."""

    tools: tuple[dict, ...] = ()
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict | None = None

    @property
    def schema_name(self) -> str | None:
        if self.response_format is None:
            return None
        return (self.response_format.get("json_schema") or {}).get("name") or "json_object"


def _optional(value: dict, key: str, expected: type, param: str) -> None:
    if value.get(key) is not None and type(value.get(key)) is not expected:  # JSON: exact types
        raise InvalidRequest(
            f"'{key}' must be of type {expected.__name__}.", param=f"{param}.{key}"
        )


def _function(tool: Any, i: int) -> dict:
    param = f"tools[{i}]"
    if (
        not isinstance(tool, dict)
        or tool.get("type") != "function"
        or set(tool) - {"type", "function"}
    ):
        raise InvalidRequest(
            "Each tool must be {'type': 'function', 'function': {...}}.", param=f"{param}.type"
        )
    function = tool.get("function")
    param += ".function"
    if not isinstance(function, dict):
        raise InvalidRequest("'function' must be an object.", param=param)
    if set(function) - FUNCTION_KEYS:
        unknown = sorted(set(function) - FUNCTION_KEYS)[0]
        raise InvalidRequest(f"Unknown tool field {unknown!r}.", param=f"{param}.{unknown}")
    name = function.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise InvalidRequest(
            "A function name is 1 to 64 of a-z, A-Z, 0-9, _ and -.", param=f"{param}.name"
        )
    _optional(function, "description", str, param)
    _optional(function, "parameters", dict, param)
    _optional(function, "strict", bool, param)
    return {"type": "function", "function": {k: v for k, v in function.items() if v is not None}}


def _tools(body: dict) -> tuple[dict, ...]:
    tools = body.get("tools")
    if tools is None or tools == []:  # [] was accepted as "no tools" before tools were served
        return ()
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise InvalidRequest(f"'tools' must be an array of up to {MAX_TOOLS} tools.", param="tools")
    parsed = tuple(_function(tool, i) for i, tool in enumerate(tools))
    names = [t["function"]["name"] for t in parsed]
    if len(set(names)) != len(names):
        raise InvalidRequest("Function names must be unique.", param="tools")
    return parsed


def _tool_choice(body: dict, tools: tuple[dict, ...]) -> str | dict | None:
    choice = body.get("tool_choice")
    if choice is None:
        return None
    if choice in ("none", "auto"):
        return choice if tools else None  # neutral without tools, as before tools were served
    if not tools:
        raise InvalidRequest(
            "'tool_choice' is only allowed when 'tools' are given.", param="tool_choice"
        )
    if choice == "required":
        return choice
    function = choice.get("function") if isinstance(choice, dict) else None
    if (
        not isinstance(function, dict)
        or choice.get("type") != "function"
        or set(choice) != {"type", "function"}
        or set(function) != {"name"}
    ):
        raise InvalidRequest(
            f"'tool_choice' must be one of {sorted(CHOICES)} or "
            "{'type': 'function', 'function': {'name': ...}}.",
            param="tool_choice",
        )
    if function.get("name") not in [t["function"]["name"] for t in tools]:
        raise InvalidRequest(
            f"'tool_choice' names {function.get('name')!r}, which is not one of the tools.",
            param="tool_choice",
        )
    return {"type": "function", "function": {"name": function.get("name")}}


def _json_schema(value: Any) -> dict:
    param = "response_format.json_schema"
    if not isinstance(value, dict):
        raise InvalidRequest("'json_schema' must be an object with a 'name'.", param=param)
    if set(value) - SCHEMA_KEYS:
        unknown = sorted(set(value) - SCHEMA_KEYS)[0]
        raise InvalidRequest(f"Unknown json_schema field {unknown!r}.", param=f"{param}.{unknown}")
    name = value.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise InvalidRequest(
            "A schema name is 1 to 64 of a-z, A-Z, 0-9, _ and -.", param=f"{param}.name"
        )
    _optional(value, "description", str, param)
    _optional(value, "schema", dict, param)
    _optional(value, "strict", bool, param)
    return {k: v for k, v in value.items() if v is not None}


def _response_format(body: dict) -> dict | None:
    value = body.get("response_format")
    if value is None:
        return None
    format_type = value.get("type") if isinstance(value, dict) else None
    if format_type == "text" and set(value) == {"type"}:
        return None
    if format_type == "json_object" and set(value) == {"type"}:
        return {"type": "json_object"}
    if format_type == "json_schema" and set(value) <= {"type", "json_schema"}:
        return {"type": "json_schema", "json_schema": _json_schema(value.get("json_schema"))}
    raise InvalidRequest(
        "'response_format' must be {'type': 'text'}, {'type': 'json_object'} "
        "or {'type': 'json_schema', 'json_schema': {...}}.",
        param="response_format",
    )


def tool_use_parse(body: dict) -> ToolUse:
    if body.get("functions") or body.get("function_call"):
        name = "functions" if body.get("functions") else "function_call"
        raise InvalidRequest(f"'{name}' is deprecated and not supported; use 'tools'.", param=name)
    tools = _tools(body)
    choice = _tool_choice(body, tools)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise InvalidRequest(
            "'parallel_tool_calls' must be a boolean.", param="parallel_tool_calls"
        )
    return ToolUse(
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=parallel if tools else None,
        response_format=_response_format(body),
    )
