"""The Responses API's input items: messages (text and image parts), `function_call` and
`function_call_output`, validated (a 400 naming where, as `input[2].call_id`), kept in
OpenAI's item shape (only the keys modelled; a message's text as typed parts), and turned into
the chat turns every backend is sent."""

from __future__ import annotations

from typing import Any

from routing.wire.messages import TOOL_CALL_ID
from tenants.errors import InvalidRequest

ROLES = {"user", "system", "developer", "assistant"}


def _text(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(f"'{param}' must be a string.", param=param)
    return value


# The content parts each role may send.
PARTS = {
    "user": ("input_text", "input_image"),
    "system": ("input_text",),
    "developer": ("input_text",),
    "assistant": ("output_text", "refusal"),
}


def _part(part: Any, role: str, param: str) -> dict:
    """One content part, as the chat shape has it."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind not in PARTS[role]:
        raise InvalidRequest(
            f"A {role} message's content parts are {' or '.join(PARTS[role])}.",
            param=f"{param}.type",
        )
    if kind == "refusal":
        return {"type": "text", "text": _text(part.get("refusal"), f"{param}.refusal")}
    if kind == "input_image":
        if part.get("file_id") is not None:
            raise InvalidRequest(
                "Image 'file_id's are not supported; send 'image_url'.", param=f"{param}.file_id"
            )
        image = {"url": part.get("image_url")}
        if part.get("detail") is not None:
            image["detail"] = part.get("detail")
        return {"type": "image_url", "image_url": image}
    return {"type": "text", "text": _text(part.get("text"), f"{param}.text")}


def _message(item: dict, param: str) -> dict:
    role = item.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise InvalidRequest(f"'role' must be one of {sorted(ROLES)}.", param=f"{param}.role")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise InvalidRequest(
            "'content' must be a string or an array of content parts.", param=f"{param}.content"
        )
    parts = [_part(p, role, f"{param}.content[{j}]") for j, p in enumerate(content)]
    if all(p["type"] == "text" for p in parts):
        return {"role": role, "content": "".join(p["text"] for p in parts)}
    return {"role": role, "content": parts}


def _call_id(item: dict, param: str) -> str:
    call_id = item.get("call_id")
    if not isinstance(call_id, str) or not TOOL_CALL_ID.fullmatch(call_id):
        raise InvalidRequest(
            "'call_id' must be 1 to 256 of a-z, A-Z, 0-9, _, ., : and -.", param=f"{param}.call_id"
        )
    return call_id


def _output(item: dict, param: str) -> str:
    return _text(item.get("output"), f"{param}.output")


def items_turns(items: list[dict]) -> list[dict]:
    """Responses items as chat turns: consecutive function calls join one assistant turn
    (the one just before when it has text), each output is a `tool` turn."""
    turns: list[dict] = []
    for i, item in enumerate(items):
        param = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            turns.append(_message(item, param))
        elif kind == "function_call":
            call = {
                "id": _call_id(item, param),
                "type": "function",
                "function": {
                    "name": _text(item.get("name"), f"{param}.name"),
                    "arguments": _text(item.get("arguments"), f"{param}.arguments"),
                },
            }
            last = turns[-1] if turns else None
            if (
                last is not None
                and last["role"] == "assistant"
                and not isinstance(last.get("content"), list)
            ):
                last.setdefault("tool_calls", []).append(call)
            else:
                turns.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            turns.append(
                {
                    "role": "tool",
                    "tool_call_id": _call_id(item, param),
                    "content": _output(item, param),
                }
            )
        else:
            raise InvalidRequest(
                f"Input items of type {kind!r} are not supported; use message, function_call "
                "or function_call_output.",
                param=f"{param}.type",
            )
    return turns


# What an item keeps of what it was sent (anything else is dropped, as it is not modelled).
ITEM_KEYS = {
    "message": ("type", "id", "status", "role", "content"),
    "function_call": ("type", "id", "status", "call_id", "name", "arguments"),
    "function_call_output": ("type", "id", "status", "call_id", "output"),
}
PART_KEYS = {
    "input_text": ("type", "text"),
    "output_text": ("type", "text", "annotations"),
    "refusal": ("type", "refusal"),
    "input_image": ("type", "image_url", "detail", "file_id"),
}


def _normal(item: dict) -> dict:
    """An item as OpenAI lists it back: only the keys it has, a message's text content as
    typed parts (what is not an item stays as it is, for _turns to refuse)."""
    item = {"type": "message", **item}
    kind = item.get("type")
    keys = ITEM_KEYS.get(kind) if isinstance(kind, str) else None
    if keys is None:
        return item
    item = {k: item[k] for k in keys if k in item}
    content = item.get("content")
    if item.get("type") == "message" and isinstance(content, str):
        kind = "output_text" if item.get("role") == "assistant" else "input_text"
        content = [{"type": kind, "text": content}]
    if isinstance(content, list):
        item["content"] = [
            {k: p[k] for k in PART_KEYS[str(p.get("type"))] if k in p}
            if isinstance(p, dict) and isinstance(p.get("type"), str) and p.get("type") in PART_KEYS
            else p
            for p in content
        ]
    return item


def items_parse(body: dict) -> list[dict]:
    value = body.get("input")
    if value is None:
        raise InvalidRequest("Missing required parameter: 'input'.", param="input")
    if isinstance(value, str):
        return [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": value}]}
        ]
    if not isinstance(value, list) or not value or not all(isinstance(i, dict) for i in value):
        raise InvalidRequest(
            "'input' must be a string or a non-empty array of items.", param="input"
        )
    return [_normal(item) for item in value]
