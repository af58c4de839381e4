"""Anthropic's messages and content blocks as OpenAI-shaped chat turns (routing/wire/
messages.py checks those): `system` as the first turn, text and images as parts, `tool_use`
blocks as an assistant's `tool_calls`, `tool_result` blocks as `tool` turns ahead of the rest
of their user turn. Thinking blocks have no such shape and are left out of it (an Anthropic
backend gets them in the body as sent). Every block's keys are checked."""

from __future__ import annotations

import json
from typing import Any

from routing.wire.messages import image_url_check, messages_parse
from tenants.errors import InvalidRequest

THINKING = {"thinking", "redacted_thinking"}
# Each block's keys; cache_control and citations change nothing in the chat shape.
BLOCK_KEYS = {
    "text": {"type", "text", "cache_control", "citations"},
    "image": {"type", "source", "cache_control"},
    "tool_use": {"type", "id", "name", "input", "cache_control"},
    "tool_result": {"type", "tool_use_id", "content", "is_error", "cache_control"},
    "thinking": {"type", "thinking", "signature"},
    "redacted_thinking": {"type", "data"},
}
THINKING_TYPES = {"enabled", "disabled", "adaptive"}


def cache_control_check(value: Any, param: str) -> None:
    if value is not None and (not isinstance(value, dict) or value.get("type") != "ephemeral"):
        raise InvalidRequest("'cache_control' is {'type': 'ephemeral', ...}.", param=param)


def _block(block: Any, param: str) -> str | None:
    """A block's type, once its keys are known ones and its cache_control is one."""
    kind = block.get("type") if isinstance(block, dict) else None
    if not isinstance(kind, str) or kind not in BLOCK_KEYS:
        return None
    unknown = sorted(set(block) - BLOCK_KEYS[kind])
    if unknown:
        raise InvalidRequest(f"Unknown {kind} block field {unknown[0]!r}.", param=param)
    cache_control_check(block.get("cache_control"), f"{param}.cache_control")
    if block.get("citations") is not None and not isinstance(block.get("citations"), list):
        raise InvalidRequest("'citations' is an array.", param=f"{param}.citations")
    return kind


def _text(block: dict, param: str) -> str:
    if _block(block, param) != "text" or not isinstance(block.get("text"), str):
        raise InvalidRequest("A text block needs a string 'text'.", param=param)
    return block["text"]


def _image(block: dict, param: str) -> dict:
    """An image block's source as an `image_url` part: base64 as a data URL, or its URL."""
    source = block.get("source")
    if not isinstance(source, dict):
        source = {}
    kind = source.get("type")
    url: Any
    if kind == "base64" and isinstance(source.get("media_type"), str):
        url = f"data:{source['media_type']};base64,{source.get('data')}"
    elif kind == "url":
        url = source.get("url")
    else:
        raise InvalidRequest(
            "An image block needs a 'source' of type 'base64' (with 'media_type' and 'data') "
            "or 'url'.",
            param=param,
        )
    image_url_check(url, param)
    return {"type": "image_url", "image_url": {"url": url}}


def _result_content(block: dict, param: str) -> str:
    content = block.get("content")
    if not isinstance(block.get("tool_use_id"), str):
        raise InvalidRequest("A tool_result needs the 'tool_use_id' it answers.", param=param)
    if block.get("is_error") is not None and not isinstance(block.get("is_error"), bool):
        raise InvalidRequest("'is_error' is a boolean.", param=f"{param}.is_error")
    if content is None or isinstance(content, str):
        text = content or ""
    elif isinstance(content, list):
        kinds = [_block(b, f"{param}.content") for b in content]
        if any(kind not in {"text", "image"} for kind in kinds):
            raise InvalidRequest("A tool_result holds text and image blocks.", param=param)
        for b in content:
            if b.get("type") == "image":
                _image(b, f"{param}.content")  # checked; our chat shape carries its text only
        text = "".join(_text(b, param) for b in content if b.get("type") == "text")
    else:
        raise InvalidRequest("A tool_result's 'content' is a string or blocks.", param=param)
    return f"Error: {text}" if block.get("is_error") is True else text


def _tool_use(block: dict, param: str) -> dict:
    if (
        not isinstance(block.get("id"), str)
        or not block["id"]
        or not isinstance(block.get("name"), str)
        or not isinstance(block.get("input"), dict)
    ):
        raise InvalidRequest(
            "A tool_use block needs a string 'id' and 'name' and an object 'input'.", param=param
        )
    return {
        "id": block["id"],
        "type": "function",
        "function": {"name": block["name"], "arguments": json.dumps(block["input"])},
    }


def _turns(message: Any, i: int) -> list[dict]:
    """One Anthropic message as OpenAI-shaped turns (before messages_parse checks them)."""
    param = f"messages[{i}]"
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
        raise InvalidRequest(
            "Each message is an object with role 'user' or 'assistant'.", param=param
        )
    if set(message) - {"role", "content"}:
        unknown = sorted(set(message) - {"role", "content"})[0]
        raise InvalidRequest(f"Unknown message field {unknown!r}.", param=f"{param}.{unknown}")
    role, content = message["role"], message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise InvalidRequest(
            "Message content is a string or an array of blocks.", param=f"{param}.content"
        )
    results, parts, calls = [], [], []
    for j, block in enumerate(content):
        where = f"{param}.content[{j}]"
        kind = _block(block, where)
        if kind == "text":
            parts.append({"type": "text", "text": _text(block, where)})
        elif kind == "image" and role == "user":
            parts.append(_image(block, where))
        elif kind == "tool_result" and role == "user":
            results.append(
                {
                    "role": "tool",
                    "tool_call_id": block.get("tool_use_id"),
                    "content": _result_content(block, where),
                }
            )
        elif kind == "tool_use" and role == "assistant":
            calls.append(_tool_use(block, where))
        elif kind in THINKING and role == "assistant":
            _thinking(block, where)  # only an Anthropic backend reads it, in the body as sent
        else:
            raise InvalidRequest(
                f"A {role} message cannot hold a {kind!r} block here.", param=where
            )
    turns = list(results)
    if role == "assistant":
        text = "".join(p["text"] for p in parts)
        turns.append({"role": role, "content": text or None if calls else text})
        if calls:
            turns[-1]["tool_calls"] = calls
    elif parts or not results:
        turns.append({"role": role, "content": parts or ""})
    return turns


def _thinking(block: dict, param: str) -> None:
    key = "thinking" if block.get("type") == "thinking" else "data"
    if not isinstance(block.get(key), str) or (
        key == "thinking" and not isinstance(block.get("signature"), str)
    ):
        raise InvalidRequest(
            "A thinking block has string 'thinking' and 'signature'; a redacted one 'data'.",
            param=param,
        )


def _system(body: dict) -> list[dict]:
    system = body.get("system")
    if system is None or system == "":
        return []
    if isinstance(system, list):
        if not all(isinstance(b, dict) and b.get("type") == "text" for b in system):
            raise InvalidRequest("'system' is a string or an array of text blocks.", param="system")
        system = "".join(_text(b, "system") for b in system)
    if not isinstance(system, str):
        raise InvalidRequest("'system' is a string or an array of text blocks.", param="system")
    return [{"role": "system", "content": system}]


def anthropic_messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty array.", param="messages")
    turns = _system(body) + [t for i, m in enumerate(messages) for t in _turns(m, i)]
    return messages_parse({"messages": turns})
