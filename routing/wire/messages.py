"""Chat messages as OpenAI takes them, validated and normalised into what every backend is
sent: text-only content as one string (as before tools), user content with images as an array
of text and `image_url` parts, assistant turns with `tool_calls` (their content may be null)
and `tool` turns answering one by `tool_call_id`. Nothing is rewritten beyond that: image URLs
and tool arguments travel byte for byte."""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any
from urllib.parse import urlsplit

from tenants.errors import InvalidRequest

CHAT_ROLES = {"system", "developer", "user", "assistant", "tool"}
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
DATA_URL = re.compile(r"data:(image/[a-z]+);base64,(.*)", re.DOTALL)
MAX_IMAGE_BYTES = 20 * 1024 * 1024  # OpenAI's limit per image; adapters may allow less
MAX_URL_CHARS = 2048
DETAILS = {"auto", "low", "high"}
TOOL_CALL_ID = re.compile(r"[A-Za-z0-9_.:-]{1,256}")


def _text_parts(content: list, param: str) -> str:
    parts: list[str] = []
    for j, part in enumerate(content):
        if (
            not isinstance(part, dict)
            or part.get("type") != "text"
            or not isinstance(part.get("text"), str)
        ):
            raise InvalidRequest(f"Content part {j} must be a text part here.", param=param)
        parts.append(part["text"])
    return "".join(parts)


def image_url_check(url: Any, param: str) -> None:
    """An http(s) URL, or a base64 data URL of a PNG, JPEG, GIF or WebP image."""
    if not isinstance(url, str) or not url:
        raise InvalidRequest("'image_url.url' must be a non-empty string.", param=param)
    if url.startswith("data:"):
        match = DATA_URL.fullmatch(url)
        if match is None or match.group(1) not in IMAGE_TYPES:
            raise InvalidRequest(
                "An image data URL must be data:image/(png|jpeg|gif|webp);base64,<data>.",
                param=param,
            )
        if len(match.group(2)) * 3 // 4 > MAX_IMAGE_BYTES:
            raise InvalidRequest(f"The image is larger than {MAX_IMAGE_BYTES} bytes.", param=param)
        try:
            base64.b64decode(match.group(2), validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRequest("The image data URL is not valid base64.", param=param) from None
        return
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. "http://[" (an unclosed IPv6 bracket), "http://a\uff03b"
        parts = None
    if (
        parts is None
        or parts.scheme not in {"http", "https"}
        or not parts.hostname
        or len(url) > MAX_URL_CHARS
    ):
        raise InvalidRequest(
            f"An image URL must be http(s) (up to {MAX_URL_CHARS} characters) or a data URL.",
            param=param,
        )


def _image_part(part: dict, param: str) -> dict:
    image = part.get("image_url")
    if not isinstance(image, dict) or set(image) - {"url", "detail"}:
        raise InvalidRequest(
            "An image_url part needs an object 'image_url' with 'url' (and optionally 'detail').",
            param=param,
        )
    image_url_check(image.get("url"), param)
    normal = {"url": image.get("url")}
    if image.get("detail") is not None:
        if not isinstance(image.get("detail"), str) or image.get("detail") not in DETAILS:
            raise InvalidRequest(f"'detail' must be one of {sorted(DETAILS)}.", param=param)
        normal["detail"] = image.get("detail")
    return {"type": "image_url", "image_url": normal}


def _user_content(content: list, param: str) -> str | list[dict]:
    """Text parts alone collapse into one string; with images, the parts are kept in order."""
    if all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return _text_parts(content, param)
    parts = []
    for j, part in enumerate(content):
        part_type = part.get("type") if isinstance(part, dict) else None
        if part_type == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part.get("text")})
        elif part_type == "image_url":
            parts.append(_image_part(part, param))
        else:
            raise InvalidRequest(f"Content part {j} must be a text or image_url part.", param=param)
    return parts


def _content(message: dict, role: str, index: int) -> str | list[dict] | None:
    param = f"messages[{index}].content"
    content = message.get("content")
    if content is None:
        if role == "assistant" and message.get("tool_calls"):
            return None
        raise InvalidRequest("Message content is required.", param=param)
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(
            "Message content must be a string or an array of content parts.", param=param
        )
    if role == "user":
        return _user_content(content, param)
    return _text_parts(content, param)


def _tool_calls(calls: Any, index: int) -> list[dict]:
    param = f"messages[{index}].tool_calls"
    if not isinstance(calls, list) or not calls:
        raise InvalidRequest("'tool_calls' must be a non-empty array.", param=param)
    normal = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if (
            not isinstance(function, dict)
            or call.get("type", "function") != "function"
            or not isinstance(call.get("id"), str)
            or not call.get("id")
            or not isinstance(function.get("name"), str)
            or not function.get("name")
            or not isinstance(function.get("arguments"), str)
        ):
            raise InvalidRequest(
                "Each tool call needs 'id', 'type': 'function' and 'function' "
                "with string 'name' and 'arguments'.",
                param=param,
            )
        normal.append(
            {
                "id": call.get("id"),
                "type": "function",
                "function": {"name": function.get("name"), "arguments": function.get("arguments")},
            }
        )
    return normal


def _message(message: Any, index: int) -> dict:
    if not isinstance(message, dict):
        raise InvalidRequest("Each message must be an object.", param=f"messages[{index}]")
    role = message.get("role")
    if not isinstance(role, str) or role not in CHAT_ROLES:
        raise InvalidRequest(
            f"Invalid role {role!r}; use one of {sorted(CHAT_ROLES)}.",
            param=f"messages[{index}].role",
        )
    if message.get("function_call"):
        raise InvalidRequest(
            "'function_call' is deprecated and not supported; use 'tool_calls'.",
            param=f"messages[{index}].function_call",
        )
    if message.get("tool_calls") is not None and role != "assistant":
        raise InvalidRequest(
            "Only assistant messages carry 'tool_calls'.", param=f"messages[{index}].tool_calls"
        )
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not TOOL_CALL_ID.fullmatch(call_id):
            raise InvalidRequest(
                "A tool message needs the 'tool_call_id' it answers.",
                param=f"messages[{index}].tool_call_id",
            )
        return {"role": role, "tool_call_id": call_id, "content": _content(message, role, index)}
    parsed = {"role": role, "content": _content(message, role, index)}
    if role == "assistant" and message.get("tool_calls") is not None:
        parsed["tool_calls"] = _tool_calls(message.get("tool_calls"), index)
    return parsed


def messages_parse(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty array.", param="messages")
    return [_message(message, i) for i, message in enumerate(messages)]


def message_images(message: dict) -> list[str]:
    """The image URLs of a parsed message, in order."""
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [part.get("image_url").get("url") for part in content if part.get("type") == "image_url"]


def message_text(message: dict) -> str:
    """A parsed message's text as a tokenizer would see most of it (no images): its content,
    and its tool calls' names, arguments and ids; for counting and KV affinity."""
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(part.get("text") or "" for part in content)
    pieces = [content or "", message.get("tool_call_id") or ""]
    for call in message.get("tool_calls") or ():
        function = call.get("function")
        pieces += [call.get("id"), function.get("name"), function.get("arguments")]
    return "".join(pieces)
