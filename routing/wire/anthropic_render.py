"""The request path's events rendered as Anthropic's Messages API: one `message` object, or
its stream of named events as Anthropic sends them (message_start, ping, then per content
block content_block_start, content_block_delta with text_delta or input_json_delta, and
content_block_stop; message_delta with stop_reason and usage; message_stop; or an `error`
event), and errors in Anthropic's shape with its status codes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from routing.wire.render import json_bytes
from tenants.errors import ApplicationError
from workers.serving.events import Finish, Tokens, TokenUsage, ToolCallDelta

STOP_REASONS = {"stop": "end_turn", "abort": "end_turn", "length": "max_tokens"}
# Anthropic's error type per HTTP status; 529 is its "overloaded".
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_status(exc: ApplicationError) -> int:
    """Anthropic's status for an error: ours, except that shedding load is its 529."""
    return 529 if exc.code == "overloaded" else exc.status


def error_body(exc: ApplicationError) -> dict:
    return {
        "type": "error",
        "error": {"type": ERROR_TYPES.get(error_status(exc), "api_error"), "message": exc.message},
    }


# One event of a stream: its name and its data.
Event = tuple[str, dict]


def sse_event(name: str, payload: dict) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + json_bytes(payload) + b"\n\n"


def usage_body(usage: TokenUsage) -> dict:
    """Anthropic's usage: input_tokens leaves out what was read from or written to the cache."""
    cached, writes = usage.cached_tokens, usage.cache_write_tokens
    return {
        "input_tokens": max(usage.prompt_tokens - cached - writes, 0),
        "cache_creation_input_tokens": writes,
        "cache_read_input_tokens": cached,
        "output_tokens": usage.completion_tokens,
    }


@dataclass
class _Block:
    kind: str  # "text" | "tool_use" | "native" (a block passed on as the backend sent it)
    text: str = ""
    id: str = ""
    name: str = ""
    raw: dict = field(default_factory=dict)  # a native block as it is so far


@dataclass
class MessagesFormat:
    """One answer's content blocks as they come, in order (a tool call opens a block, text
    after it another)."""

    id: str
    model: str
    prompt_tokens: int = 0
    blocks: list[_Block] = field(default_factory=list)
    calls: dict[int, int] = field(default_factory=dict)  # the call's index -> its block's
    natives: dict[int, int] = field(default_factory=dict)  # the backend's index -> ours
    is_open: bool = False
    stop_reason: str | None = None

    def message(self, usage: dict, content: list[dict] | None = None) -> dict:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [] if content is None else content,
            "stop_reason": self.stop_reason,
            "stop_sequence": None,
            "usage": usage,
        }

    def opening(self) -> list[Event]:
        usage = {"input_tokens": self.prompt_tokens, "output_tokens": 0}
        return [
            ("message_start", {"type": "message_start", "message": self.message(usage)}),
            ("ping", {"type": "ping"}),
        ]

    def _close(self) -> list[Event]:
        if not self.is_open:
            return []
        self.is_open = False
        index = len(self.blocks) - 1
        return [("content_block_stop", {"type": "content_block_stop", "index": index})]

    def _open(self, block: _Block, start: dict) -> list[Event]:
        out = self._close()
        self.blocks.append(block)
        self.is_open = True
        index = len(self.blocks) - 1
        out.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": start},
            )
        )
        return out

    @staticmethod
    def _delta(index: int, delta: dict) -> Event:
        body = {"type": "content_block_delta", "index": index, "delta": delta}
        return ("content_block_delta", body)

    def _call(self, call: ToolCallDelta) -> list[Event]:
        out: list[Event] = []
        if call.index not in self.calls:
            block = _Block("tool_use", id=call.id or "", name=call.name or "")
            start = {"type": "tool_use", "id": block.id, "name": block.name, "input": {}}
            out += self._open(block, start)
            self.calls[call.index] = len(self.blocks) - 1
        index = self.calls[call.index]
        if call.arguments:
            self.blocks[index].text += call.arguments
            out.append(
                self._delta(index, {"type": "input_json_delta", "partial_json": call.arguments})
            )
        return out

    def tokens(self, event: Tokens) -> list[Event]:
        out: list[Event] = []
        if event.text:
            if not (self.is_open and self.blocks[-1].kind == "text"):
                out += self._open(_Block("text"), {"type": "text", "text": ""})
            self.blocks[-1].text += event.text
            out.append(
                self._delta(len(self.blocks) - 1, {"type": "text_delta", "text": event.text})
            )
        for call in event.tool_calls:
            out += self._call(call)
        for native in event.native:
            out += self._native(native)
        return out

    def _native(self, data: dict) -> list[Event]:
        """A thinking block's events, re-indexed among ours; its whole kept for the message."""
        kind, theirs = data.get("type"), data.get("index", 0)
        if kind == "content_block_start":
            start = dict(data.get("content_block") or {})
            out = self._open(_Block("native", raw=dict(start)), start)
            self.natives[theirs] = len(self.blocks) - 1
            return out
        index = self.natives.get(theirs)
        if index is None:
            return []
        if kind == "content_block_stop":
            return self._close() if index == len(self.blocks) - 1 else []
        delta = data.get("delta") or {}
        raw = self.blocks[index].raw
        if delta.get("type") == "thinking_delta":
            raw["thinking"] = raw.get("thinking", "") + str(delta.get("thinking") or "")
        elif delta.get("type") == "signature_delta":
            raw["signature"] = delta.get("signature")
        return [self._delta(index, delta)]

    def finish(self, event: Finish) -> list[Event]:
        self.stop_reason = STOP_REASONS.get(event.reason, "end_turn")
        if event.reason == "tool_calls" or (event.reason == "stop" and self.calls):
            self.stop_reason = "tool_use"
        return self._close()

    def ending(self, usage: TokenUsage) -> list[Event]:
        out = self._close()
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": self.stop_reason or "end_turn", "stop_sequence": None},
            "usage": usage_body(usage),
        }
        out.append(("message_delta", delta))
        out.append(("message_stop", {"type": "message_stop"}))
        return out

    def response(self, usage: TokenUsage) -> dict:
        """The whole message (not streamed)."""
        self.stop_reason = self.stop_reason or "end_turn"
        return self.message(usage_body(usage), [_content(b) for b in self.blocks])


def _content(block: _Block) -> dict[str, Any]:
    if block.kind == "native":
        return block.raw
    if block.kind == "text":
        return {"type": "text", "text": block.text}
    try:
        arguments = json.loads(block.text or "{}")
    except ValueError:
        arguments = {}
    return {"type": "tool_use", "id": block.id, "name": block.name, "input": arguments}
