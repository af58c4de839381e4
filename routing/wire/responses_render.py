"""The typed events of a run rendered as OpenAI's Responses API: the response object, and,
streamed, its semantic events in order, each with its `sequence_number`:

    response.created, response.in_progress
    per output item: response.output_item.added, then
        a message: response.content_part.added, response.output_text.delta..., then
                   response.output_text.done, response.content_part.done
        a function call: response.function_call_arguments.delta..., then .done
    response.output_item.done
    response.completed | response.incomplete (max_output_tokens) | response.failed

A stream is framed as OpenAI frames it (`event: <type>` and `data: <json>`, no `[DONE]`)."""

from __future__ import annotations

import time
from typing import Any

from routing.wire.render import sse
from workers.serving.events import Finish, Tokens, TokenUsage, ToolCallDelta


def responses_sse(event: dict) -> bytes:
    return b"event: " + event["type"].encode() + b"\n" + sse(event)


def usage_object(usage: TokenUsage) -> dict:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


class ResponseRender:
    """One response: the output items so far, and the next sequence number."""

    def __init__(
        self, *, request_id: str, model: str, echo: dict, previous_response_id: str | None
    ) -> None:
        self.id = "resp_" + request_id
        self.request_id = request_id
        self.model, self.echo = model, echo
        self.previous_response_id = previous_response_id
        self.created_at = int(time.time())
        self.output: list[dict] = []
        self.sequence = 0
        self.message: dict | None = None  # the message item being written
        self.calls: dict[int, dict] = {}  # function call items being written, by call index
        self.reason = "stop"

    def _event(self, kind: str, **fields: Any) -> dict:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def response(
        self,
        status: str,
        usage: TokenUsage | None = None,
        error: dict | None = None,
    ) -> dict:
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "error": error,
            "incomplete_details": incomplete,
            "model": self.model,
            "output": [dict(item) for item in self.output],
            "previous_response_id": self.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "service_tier": "default",
            "truncation": "disabled",
            "usage": usage_object(usage) if usage is not None else None,
            **self.echo,
        }

    # streaming
    def opening(self) -> list[dict]:
        return [
            self._event("response.created", response=self.response("in_progress")),
            self._event("response.in_progress", response=self.response("in_progress")),
        ]

    def _item_add(self, item: dict) -> dict:
        self.output.append(item)
        return self._event(
            "response.output_item.added", output_index=len(self.output) - 1, item=dict(item)
        )

    def _text(self, text: str) -> list[dict]:
        events = []
        if self.message is None:
            self.message = {
                "id": f"msg_{self.request_id}_{len(self.output)}",
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            events.append(self._item_add(self.message))
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            self.message["content"].append(part)
            events.append(
                self._event(
                    "response.content_part.added",
                    item_id=self.message["id"],
                    output_index=len(self.output) - 1,
                    content_index=0,
                    part=dict(part),
                )
            )
        self.message["content"][0]["text"] += text
        events.append(
            self._event(
                "response.output_text.delta",
                item_id=self.message["id"],
                output_index=self.output.index(self.message),
                content_index=0,
                delta=text,
                logprobs=[],
            )
        )
        return events

    def _message_close(self, status: str) -> list[dict]:
        message, self.message = self.message, None
        if message is None:
            return []
        index, part = self.output.index(message), message["content"][0]
        message["status"] = status
        return [
            self._event(
                "response.output_text.done",
                item_id=message["id"],
                output_index=index,
                content_index=0,
                text=part["text"],
                logprobs=[],
            ),
            self._event(
                "response.content_part.done",
                item_id=message["id"],
                output_index=index,
                content_index=0,
                part=dict(part),
            ),
            self._event("response.output_item.done", output_index=index, item=_copy(message)),
        ]

    def _call(self, delta: ToolCallDelta) -> list[dict]:
        events = []
        call = self.calls.get(delta.index)
        if call is None or delta.id is not None and delta.id != call["call_id"]:
            events += self._message_close("completed")
            call = {
                "id": f"fc_{self.request_id}_{len(self.output)}",
                "type": "function_call",
                "status": "in_progress",
                "call_id": delta.id or f"call_{self.request_id}_{delta.index}",
                "name": delta.name or "",
                "arguments": "",
            }
            self.calls[delta.index] = call
            events.append(self._item_add(call))
        if delta.arguments:
            call["arguments"] += delta.arguments
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=call["id"],
                    output_index=self.output.index(call),
                    delta=delta.arguments,
                )
            )
        return events

    def tokens(self, event: Tokens) -> list[dict]:
        events = self._text(event.text) if event.text else []
        for delta in event.tool_calls:
            events += self._call(delta)
        return events

    def finish(self, event: Finish) -> list[dict]:
        """The items end: complete, or incomplete when max_output_tokens cut them."""
        self.reason = event.reason
        status = "incomplete" if event.reason == "length" else "completed"
        events = self._message_close(status)
        for call in self.calls.values():
            call["status"] = status
            index = self.output.index(call)
            events += [
                self._event(
                    "response.function_call_arguments.done",
                    item_id=call["id"],
                    output_index=index,
                    name=call["name"],
                    arguments=call["arguments"],
                ),
                self._event("response.output_item.done", output_index=index, item=dict(call)),
            ]
        self.calls = {}
        return events

    def closing(self, usage: TokenUsage) -> dict:
        status = "incomplete" if self.reason == "length" else "completed"
        return self._event(f"response.{status}", response=self.response(status, usage))

    def failure(self, code: str, message: str) -> dict:
        return self._event(
            "response.failed",
            response=self.response("failed", error={"code": code, "message": message}),
        )

    # not streaming
    def absorb(self, event: Tokens | Finish) -> None:
        if isinstance(event, Tokens):
            self.tokens(event)
        else:
            self.finish(event)

    def whole(self, usage: TokenUsage) -> dict:
        return self.closing(usage)["response"]


def _copy(message: dict) -> dict:
    return {**message, "content": [dict(part) for part in message["content"]]}
