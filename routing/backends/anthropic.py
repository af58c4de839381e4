"""Anthropic's Messages API: `system` apart from the turns, `max_tokens` required, and a stream
of named events (message_start, content_block_delta, message_delta, message_stop, ping,
error). Usage comes in two parts: input (and cache-read) tokens in message_start, output tokens
in message_delta. The request is translated in anthropic_request.py; a `tool_use` block comes
back as an OpenAI tool call (its `input_json_delta` pieces as the call's argument pieces), the
forced JSON tool's input as content, and `stop_reason: tool_use` as `tool_calls`."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace

import httpx

from routing.backends.anthropic_request import request_body
from routing.backends.base import (
    BackendSpec,
    Call,
    error_for_status,
    retry_after_parse,
    sse_lines,
)
from routing.errors import backend_error
from workers.serving.events import Finish, RemoteEvent, Reported, Tokens, ToolCallDelta

VERSION = "2023-06-01"


def headers(secret: str) -> dict[str, str]:
    return {"x-api-key": secret, "anthropic-version": VERSION}


async def _raise_for_status(response: httpx.Response, backend: str) -> None:
    if response.status_code < 400:
        return
    raw = await response.aread()
    message = raw[:500].decode(errors="replace")
    with contextlib.suppress(ValueError, KeyError, TypeError):
        message = json.loads(raw)["error"]["message"]
    status = response.status_code
    if status == 529:  # overloaded_error
        status = 503
    raise error_for_status(status, message, retry_after_parse(response.headers), backend=backend)


@dataclass
class _Blocks:
    """The answer's content blocks so far: which are tool calls (block index -> call index),
    which the forced JSON tool's (its input is the content), which have had input."""

    json_tool: str | None
    is_native: bool = False  # a Messages request: blocks we do not model are passed on
    calls: dict[int, int] = field(default_factory=dict)
    json_blocks: set[int] = field(default_factory=set)
    with_input: set[int] = field(default_factory=set)
    passed: set[int] = field(default_factory=set)

    def passed_on(self, name: str, data: dict) -> Tokens | None:
        """A block we do not model (thinking, redacted thinking) of a Messages request's
        answer: its events as they came, for the Messages renderer."""
        if not self.is_native:
            return None
        index = data.get("index", 0)
        if name == "content_block_start":
            if (data.get("content_block") or {}).get("type") in ("text", "tool_use"):
                return None
            self.passed.add(index)
        elif index not in self.passed:
            return None
        return Tokens(choice=0, text="", native=(data,))

    def start(self, index: int, block: dict) -> Tokens | None:
        if block.get("type") != "tool_use":
            return None
        if block.get("name") == self.json_tool:
            self.json_blocks.add(index)
            return None
        call = self.calls[index] = len(self.calls)
        return Tokens(
            choice=0,
            text="",
            tool_calls=(
                ToolCallDelta(index=call, id=block.get("id") or "", name=block.get("name") or ""),
            ),
        )

    def delta(self, index: int, delta: dict) -> Tokens | None:
        delta_type = delta.get("type")
        text = delta.get("text")
        if delta_type == "text_delta" and text:
            return Tokens(choice=0, text=text)
        piece = delta.get("partial_json") if delta_type == "input_json_delta" else None
        if not piece:
            return None
        self.with_input.add(index)
        if index in self.json_blocks:
            return Tokens(choice=0, text=piece)
        if index in self.calls:
            return Tokens(
                choice=0,
                text="",
                tool_calls=(ToolCallDelta(index=self.calls[index], arguments=piece),),
            )
        return None

    def stop(self, index: int) -> Tokens | None:
        """A tool that takes no arguments streams no input: its arguments are `{}`."""
        if index in self.with_input:
            return None
        if index in self.json_blocks:
            return Tokens(choice=0, text="{}")
        if index in self.calls:
            return Tokens(
                choice=0,
                text="",
                tool_calls=(ToolCallDelta(index=self.calls[index], arguments="{}"),),
            )
        return None

    def finish_reason(self, stop_reason: str) -> str:
        if stop_reason == "max_tokens":
            return "length"
        return "tool_calls" if stop_reason == "tool_use" and self.calls else "stop"


def _prompt_usage(usage: Reported, u: dict) -> Reported:
    """The prompt's part of Anthropic's usage: input, cache reads and cache writes, apart."""
    cached = int(u.get("cache_read_input_tokens") or 0)
    writes = int(u.get("cache_creation_input_tokens") or 0)
    return replace(
        usage,
        cached_tokens=cached,
        cache_write_tokens=writes,
        prompt_tokens=int(u.get("input_tokens") or 0) + cached + writes,
    )


async def anthropic_stream(
    client: httpx.AsyncClient, spec: BackendSpec, call: Call, secret: str, timeout: httpx.Timeout
) -> AsyncIterator[RemoteEvent]:
    body = await request_body(call)
    # A Messages body sent as it came asks for no stand-in tool: its tool calls are its own.
    blocks = _Blocks(
        json_tool=None if call.native is not None else call.tool_use.schema_name,
        is_native=call.native is not None,
    )
    async with client.stream(
        "POST",
        spec.base_url.rstrip("/") + "/v1/messages",
        json=body,
        headers=headers(secret),
        timeout=timeout,
    ) as response:
        await _raise_for_status(response, spec.name)
        usage = Reported()
        name, is_done = "", False
        async for line in sse_lines(response):
            if line.startswith(b"event:"):
                name = line[6:].strip().decode(errors="replace")
                continue
            if not line.startswith(b"data:"):
                continue
            try:
                data = json.loads(line[5:].strip())
            except ValueError:
                raise backend_error(
                    "backend_unavailable", "unparseable stream event", backend=spec.name
                ) from None
            name = data.get("type", name)
            if name == "message_start":
                usage = _prompt_usage(usage, data["message"].get("usage") or {})
                yield usage  # the prompt's count, should the stream be cut later
            elif name in {"content_block_start", "content_block_delta", "content_block_stop"}:
                if (passed := blocks.passed_on(name, data)) is not None:
                    yield passed
                    continue
                index = data.get("index", 0)
                event = (
                    blocks.start(index, data.get("content_block") or {})
                    if name == "content_block_start"
                    else blocks.delta(index, data.get("delta") or {})
                    if name == "content_block_delta"
                    else blocks.stop(index)
                )
                if event is not None:
                    yield event
            elif name == "message_delta":
                reason = (data.get("delta") or {}).get("stop_reason")
                reported = data.get("usage") or {}
                if reported.get("input_tokens") is not None:  # cumulative: overwrites
                    usage = _prompt_usage(usage, reported)
                usage = replace(usage, completion_tokens=int(reported.get("output_tokens") or 0))
                if reason == "refusal":
                    raise backend_error(
                        "content_filtered",
                        "The provider declined to answer (refusal).",
                        backend=spec.name,
                    )
                if reason:
                    yield Finish(choice=0, reason=blocks.finish_reason(reason))
            elif name == "error":
                error = data.get("error") or {}
                code = (
                    "rate_limited"
                    if error.get("type") == "rate_limit_error"
                    else "backend_unavailable"
                )
                raise backend_error(
                    code, str(error.get("message", "stream error")), backend=spec.name
                )
            elif name == "message_stop":
                is_done = True
                break
        if not is_done:
            raise backend_error(
                "backend_unavailable", "the stream ended without message_stop", backend=spec.name
            )
        yield usage
