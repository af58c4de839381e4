"""Validation first: each input line parsed as its endpoint would parse it, its model one the
agent may use, its custom_id unique. Errors name the line (OpenAI's `errors.data`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from routing.batches.endpoints import BatchEndpoint
from routing.router import registry_get
from tenants.errors import ApplicationError
from tenants.models import Agent

MAX_ERRORS = 100


@dataclass(frozen=True, slots=True)
class Line:
    index: int  # 0-based; errors name `line` 1-based, as OpenAI does
    custom_id: str
    body: dict[str, Any]


def line_key(*, batch_id: str, custom_id: str) -> str:
    """What a line's ledger rows are keyed by: its batch, then a digest of its custom_id."""
    return f"{batch_id}-{hashlib.sha256(custom_id.encode()).hexdigest()[:24]}"


def _error(number: int, code: str, message: str, param: str | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": number}


def _line_check(
    raw: bytes, number: int, endpoint: BatchEndpoint, agent: Agent, models: set[str]
) -> Line | dict[str, Any]:
    try:
        item = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        return _error(number, "invalid_json_line", f"Line {number} is not valid JSON.")
    if not isinstance(item, dict):
        return _error(number, "invalid_json_line", f"Line {number} is not a JSON object.")
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > 512:
        return _error(
            number,
            "missing_required_parameter",
            f"Line {number}: 'custom_id' must be a string of 1 to 512 characters.",
            "custom_id",
        )
    if item.get("method") != "POST":
        return _error(
            number, "invalid_method", f"Line {number}: 'method' must be 'POST'.", "method"
        )
    if item.get("url") != endpoint.url:
        return _error(
            number,
            "invalid_url",
            f"Line {number}: 'url' must be the batch's endpoint, {endpoint.url}.",
            "url",
        )
    body = item.get("body")
    if not isinstance(body, dict):
        return _error(
            number, "invalid_request", f"Line {number}: 'body' must be an object.", "body"
        )
    if body.get("stream"):
        return _error(
            number, "invalid_request", f"Line {number}: a batch line cannot stream.", "body.stream"
        )
    try:
        endpoint.parse(body)
    except ApplicationError as exc:
        param = f"body.{exc.param}" if exc.param else "body"
        return _error(number, exc.code, f"Line {number}: {exc.message}", param)
    model = body.get("model")
    if model not in models or not agent.may_use_model(model):
        return _error(
            number,
            "model_not_found",
            f"Line {number}: the model '{model}' does not exist or you do not have access to it.",
            "body.model",
        )
    return Line(index=number - 1, custom_id=custom_id, body=body)


def lines_validate(
    raws: Iterable[bytes], *, endpoint: BatchEndpoint, agent: Agent, max_lines: int
) -> tuple[list[Line], list[dict[str, Any]]]:
    """The file's lines, or the errors naming them (up to MAX_ERRORS)."""
    models = set(registry_get().routes)
    lines: list[Line] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    number = 0
    for raw in raws:
        number += 1
        if not raw.strip():
            continue
        if len(lines) >= max_lines:
            errors.append(
                _error(number, "too_many_lines", f"A batch may hold at most {max_lines} lines.")
            )
            break
        checked = _line_check(raw, number, endpoint, agent, models)
        if isinstance(checked, dict):
            errors.append(checked)
        elif checked.custom_id in seen:
            errors.append(
                _error(
                    number,
                    "duplicate_custom_id",
                    f"Line {number}: the custom_id '{checked.custom_id}' appears earlier.",
                    "custom_id",
                )
            )
        else:
            seen.add(checked.custom_id)
            lines.append(checked)
        if len(errors) >= MAX_ERRORS:
            break
    if not lines and not errors:
        errors.append(_error(0, "empty_file", "The input file holds no requests."))
    return lines, errors
