"""The one reading of a client's JSON, for HTTP bodies and websocket frames alike: the same
size and depth limits, and every refusal an InvalidRequest that names what was wrong.

orjson reads almost every body. What it refuses (NaN and Infinity literals, a lone surrogate
escape, a number beyond a double) is read again by the stdlib, which accepts those; then lone
surrogates are refused by name, since no tokenizer, database or encoder downstream can hold
them (`"\\ud800"` is valid JSON but not a Unicode string)."""

from __future__ import annotations

import json
from typing import Any

import orjson
from django.conf import settings

from tenants.errors import InvalidRequest


def json_limit() -> int:
    """The most bytes a body or frame may have: Django's own limit on a request's body."""
    return settings.DATA_UPLOAD_MAX_MEMORY_SIZE


def json_load(raw: bytes | str) -> Any:
    """The parsed value, or InvalidRequest (too large, nested too deeply, not JSON, or holding
    a lone surrogate: `param` then names where, as `messages[0].content`)."""
    if len(raw) > json_limit():
        raise InvalidRequest(f"The JSON body is larger than {json_limit()} bytes.")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    try:
        value = json.loads(raw)
    except RecursionError:
        raise InvalidRequest("The JSON body is nested too deeply.") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"We could not parse the JSON body of your request: {exc}") from None
    where = _surrogate_path(value, "")
    if where is not None:
        raise InvalidRequest(
            f"'{where or 'body'}' holds a lone UTF-16 surrogate, which is not valid Unicode text.",
            param=where or None,
        )
    return value


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _surrogate_path(value: Any, path: str) -> str | None:
    """Where the first string (or object key) holding a lone surrogate is, or None."""
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if _has_surrogate(item):
                return where
        elif isinstance(item, dict):
            for key, child in reversed(item.items()):
                if _has_surrogate(key):
                    return where or "body"
                stack.append((child, f"{where}.{key}" if where else key))
        elif isinstance(item, list):
            stack.extend((child, f"{where}[{i}]") for i, child in reversed(list(enumerate(item))))
    return None
