"""A request's content for its tenant's request log (tenants/services/request_logs/): what it
asked (`log_input`, from the typed request every front door parses into) and what it was
answered (from the same events every renderer reads), written once its events end, off the
response's path (a tracked task, as settlements are, so a drain waits for it). Whether the
tenant keeps logs is read when writing: nothing is kept while they are off; a tenant just
found keeping none skips even that read for a few seconds."""

from __future__ import annotations

import logging
from typing import Any

from routing.sync import db_call
from tenants.services.request_logs import request_log_write, request_logs_known_off
from workers.serving.events import Done, Event, Failed, Finish, Tokens
from workers.serving.jobs import Job
from workers.serving.settlement import settlement_track

logger = logging.getLogger(__name__)


def log_input(*, endpoint: str, request: Any) -> dict:
    """What the request asked, in OpenAI's shapes: its messages and tools, or its prompts."""
    if endpoint != "chat":
        return {"endpoint": endpoint, "model": request.model, "prompt": list(request.prompts)}
    use = request.tool_use
    asked: dict[str, Any] = {
        "endpoint": endpoint,
        "model": request.model,
        "messages": request.messages,
    }
    if use.tools:
        asked["tools"] = list(use.tools)
    if use.tool_choice is not None:
        asked["tool_choice"] = use.tool_choice
    if use.response_format is not None:
        asked["response_format"] = use.response_format
    return asked


def log_output(events: list[Event]) -> dict:
    """What was answered: each choice's text, tool calls and finish reason; the run's status
    and error."""
    choices: dict[int, dict[str, Any]] = {}
    answered: dict[str, Any] = {"status": ""}
    for event in events:
        match event:
            case Tokens():
                choice = choices.setdefault(event.choice, {"text": "", "finish_reason": None})
                choice["text"] += event.text
                for delta in event.tool_calls:
                    calls = choice.setdefault("tool_calls", {})
                    call = calls.setdefault(
                        delta.index, {"id": None, "name": None, "arguments": ""}
                    )
                    call["id"] = delta.id or call["id"]
                    call["name"] = delta.name or call["name"]
                    call["arguments"] += delta.arguments
            case Finish():
                choice = choices.setdefault(event.choice, {"text": "", "finish_reason": None})
                choice["finish_reason"] = event.reason
            case Failed():
                answered["error"] = {"code": event.code, "message": event.message}
            case Done():
                answered["status"] = event.status
    output = []
    for index in sorted(choices):
        choice = choices[index]
        calls = choice.pop("tool_calls", None)
        if calls:
            choice["tool_calls"] = [calls[i] for i in sorted(calls)]
        output.append({"index": index, **choice})
    return {"output": output, **answered}


def request_log_capture(*, job: Job, asked: dict | None, events: list[Event]) -> None:
    """Write the request's log (when its tenant keeps them) once its events have ended."""
    if asked is None or not job.request_id or request_logs_known_off(tenant_id=job.tenant_id):
        return
    try:
        content = {**asked, **log_output(events)}
    except Exception:  # an optional record: its failure never touches the answer
        logger.exception("request %s: its request log could not be built", job.request_id)
        return
    settlement_track(_write(job, asked, content))


async def _write(job: Job, asked: dict, content: dict) -> None:
    try:
        await db_call(request_log_write)(
            tenant_id=job.tenant_id,
            request_id=job.request_id,
            endpoint=str(asked["endpoint"]),
            model=str(asked["model"]),
            content=content,
        )
    except Exception:  # a task of its own: nobody else would hear of it
        logger.exception("request %s: its request log was not written", job.request_id)
