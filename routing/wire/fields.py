"""Typed checks of JSON values, each failing with an InvalidRequest that names the param."""

from __future__ import annotations

import math
from typing import Any, Literal, overload

from tenants.errors import InvalidRequest

# The largest integer a double holds exactly.
EXACT_FLOAT_INT = 2**53


def type_name(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number"
    )


@overload
def integer(body: dict, name: str, *, low: int, high: int, default: int) -> int: ...
@overload
def integer(body: dict, name: str, *, low: int, high: int, default: None) -> int | None: ...
def integer(body: dict, name: str, *, low: int, high: int, default: int | None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        # 2.0 is a float in JSON terms but an integer in value; OpenAI accepts it, so do we.
        if isinstance(value, float) and value.is_integer() and abs(value) <= EXACT_FLOAT_INT:
            value = int(value)
        elif isinstance(value, float) and value.is_integer():
            # The JSON parser read it as a double: what we could echo is not what was sent.
            raise InvalidRequest(f"'{name}' must be between {low} and {high}.", param=name)
        else:
            raise InvalidRequest(
                f"'{name}' must be an integer, got {type_name(value)}.", param=name
            )
    if not low <= value <= high:
        raise InvalidRequest(f"'{name}' must be between {low} and {high}, got {value}.", param=name)
    return value


def number(
    body: dict, name: str, *, low: float, high: float, default: float, low_open: bool = False
) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidRequest(f"'{name}' must be a number.", param=name)
    if value > high or value < low or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise InvalidRequest(
            f"'{name}' must be in {bracket}{low}, {high}], got {value}.", param=name
        )
    return float(value)


def boolean(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequest(f"'{name}' must be a boolean.", param=name)
    return value


@overload
def string(body: dict, name: str, *, required: Literal[True]) -> str: ...
@overload
def string(body: dict, name: str, *, required: Literal[False] = False) -> str | None: ...
def string(body: dict, name: str, *, required: bool = False) -> str | None:
    value = body.get(name)
    if value is None:
        if required:
            raise InvalidRequest(f"Missing required parameter: '{name}'.", param=name)
        return None
    if not isinstance(value, str) or (required and not value):
        raise InvalidRequest(f"'{name}' must be a non-empty string.", param=name)
    return value


def unsupported_unless(body: dict, name: str, allowed: list) -> None:
    """A parameter we accept only at its neutral value(s) (a list: values may be unhashable)."""
    if name in body and body[name] is not None and body[name] not in allowed:
        raise InvalidRequest(f"'{name}' is not supported by this server.", param=name)


def reject_unknown(body: dict, known: set[str]) -> None:
    unknown = sorted(set(body) - known)
    if unknown:
        raise InvalidRequest(
            f"Unrecognized request argument supplied: {unknown[0]}", param=unknown[0]
        )


def json_object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    return body
