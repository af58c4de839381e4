"""Engine events rendered in OpenAI's wire format: chat.completion(.chunk), text_completion,
embeddings, models, and the SSE framing around them."""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from tenants.errors import ApplicationError
from workers.serving.events import Finish, Tokens, TokenUsage, ToolCallDelta

SSE_DONE = b"data: [DONE]\n\n"


def _plain(value):
    """What orjson does not know: numpy's scalars (a logprob straight from the engine)."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def json_bytes(payload) -> bytes:
    """An answer as JSON, by orjson (the stdlib encoder was a visible share of a gateway
    request's CPU). A float that is not finite becomes null, where the stdlib would write an
    invalid `NaN`."""
    return orjson.dumps(payload, default=_plain)


# Characters orjson writes raw (the stdlib's ASCII encoder escaped them) at which a client's
# str.splitlines() ends a line, httpx's aiter_lines among them: an SSE line must not hold one.
_LINE_BREAKS = (
    (b"\xe2\x80\xa8", b"\\u2028"),
    (b"\xe2\x80\xa9", b"\\u2029"),
    (b"\xc2\x85", b"\\u0085"),
)


def sse(payload: dict) -> bytes:
    data = json_bytes(payload)
    if b"\xe2\x80" in data or b"\xc2\x85" in data:
        for raw, escaped in _LINE_BREAKS:
            data = data.replace(raw, escaped)
    return b"data: " + data + b"\n\n"


@dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk object of a streamed answer."""

    body: dict


@dataclass(frozen=True, slots=True)
class UsageChunk:
    """A streamed answer's last chunk: its usage alone (stream_options.include_usage)."""

    body: dict


# A streamed answer's pieces; an error after the first token comes as itself (rendered by the
# one error body builder) and ends the stream.
Rendered = Chunk | UsageChunk | ApplicationError


def usage_body(usage: TokenUsage) -> dict:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def _piece(tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False)


def _chat_logprob_entries(tokenizer, event: Tokens) -> list[dict]:
    if event.entries is not None:  # a remote backend's, already in OpenAI's shape
        return list(event.entries)
    entries = []
    tops = event.top_logprobs or [None] * len(event.token_ids)
    for token_id, logprob, top in zip(event.token_ids, event.logprobs or [], tops, strict=False):
        piece = _piece(tokenizer, token_id)
        entries.append(
            {
                "token": piece,
                "logprob": logprob,
                "bytes": list(piece.encode()),
                "top_logprobs": [
                    {
                        "token": (p := _piece(tokenizer, int(tid))),
                        "logprob": lp,
                        "bytes": list(p.encode()),
                    }
                    for tid, lp in (top or {}).items()
                ],
            }
        )
    return entries


@dataclass
class Choice:
    """What one choice has produced so far."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprob_entries: list[dict] = field(default_factory=list)
    finish_reason: str | None = None
    tool_calls: dict[int, dict] = field(default_factory=dict)  # by the call's index

    def tool_call_absorb(self, delta: ToolCallDelta) -> None:
        call = self.tool_calls.setdefault(
            delta.index,
            {
                "id": delta.id or "",
                "type": "function",
                "function": {"name": delta.name or "", "arguments": ""},
            },
        )
        call["function"]["arguments"] += delta.arguments

    def message(self) -> dict:
        """The whole answer: with tool calls and no text, its content is null (as OpenAI's)."""
        message: dict[str, Any] = {
            "role": "assistant",
            "content": self.text or (None if self.tool_calls else ""),
            "refusal": None,
            "annotations": [],
        }
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        return message


def tool_call_delta(delta: ToolCallDelta) -> dict:
    """OpenAI's streamed shape: a call's first piece names it, later ones add arguments."""
    if delta.id is None:
        return {"index": delta.index, "function": {"arguments": delta.arguments}}
    return {
        "index": delta.index,
        "id": delta.id,
        "type": "function",
        "function": {"name": delta.name or "", "arguments": delta.arguments},
    }


def _finish_reason(reason: str | None) -> str | None:
    # An aborted sequence (client gone, or server shutdown) has no OpenAI reason; "stop" is
    # what vLLM reports for it too.
    return "stop" if reason == "abort" else reason


class ChatFormat:
    object, chunk_object, id_prefix = "chat.completion", "chat.completion.chunk", "chatcmpl-"

    def __init__(
        self,
        *,
        request_id: str,
        model: str,
        num_choices: int,
        tokenizer,
        wants_logprobs: bool,
        prompt_texts: list[str] | None = None,
        fingerprint: str | None = None,
    ) -> None:
        self.id = self.id_prefix + request_id
        self.fingerprint = fingerprint  # system_fingerprint: the version of ours that answers
        self.created = int(time.time())
        self.model = model
        self.tokenizer = tokenizer
        self.wants_logprobs = wants_logprobs
        self.choices = [Choice() for _ in range(num_choices)]

    def _chunk(
        self, choices: list[dict], usage: dict | None = None, include_usage: bool = False
    ) -> dict:
        body = {
            "id": self.id,
            "object": self.chunk_object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": choices,
        }
        if include_usage:
            body["usage"] = usage
        return body

    # streaming
    def opening(self, include_usage: bool) -> list[dict]:
        return [
            self._chunk(
                [
                    {
                        "index": i,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
                include_usage=include_usage,
            )
            for i in range(len(self.choices))
        ]

    def token_chunk(self, event: Tokens, include_usage: bool) -> dict:
        choice = self.choices[event.choice]
        choice.text += event.text
        choice.token_ids += event.token_ids
        logprobs = None
        if self.wants_logprobs:
            entries = _chat_logprob_entries(self.tokenizer, event)
            choice.logprob_entries += entries
            logprobs = {"content": entries, "refusal": None}
        delta: dict[str, Any] = (
            {"content": event.text} if event.text or not event.tool_calls else {}
        )
        if event.tool_calls:
            for call in event.tool_calls:
                choice.tool_call_absorb(call)
            delta["tool_calls"] = [tool_call_delta(call) for call in event.tool_calls]
        return self._chunk(
            [{"index": event.choice, "delta": delta, "logprobs": logprobs, "finish_reason": None}],
            include_usage=include_usage,
        )

    def finish_chunk(self, event: Finish, include_usage: bool) -> dict:
        reason = _finish_reason(event.reason)
        self.choices[event.choice].finish_reason = reason
        return self._chunk(
            [{"index": event.choice, "delta": {}, "logprobs": None, "finish_reason": reason}],
            include_usage=include_usage,
        )

    def usage_chunk(self, usage: TokenUsage) -> dict:
        return self._chunk([], usage=usage_body(usage), include_usage=True)

    # not streaming
    def absorb(self, event: Tokens | Finish) -> None:
        match event:
            case Tokens():
                self.token_chunk(event, False)
            case Finish():
                self.finish_chunk(event, False)

    def response(self, usage: TokenUsage) -> dict:
        return {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "service_tier": None,
            "choices": [
                {
                    "index": i,
                    "message": c.message(),
                    "logprobs": {"content": c.logprob_entries, "refusal": None}
                    if self.wants_logprobs
                    else None,
                    "finish_reason": c.finish_reason or "stop",
                }
                for i, c in enumerate(self.choices)
            ],
            "usage": usage_body(usage),
        }


class CompletionFormat(ChatFormat):
    """Legacy /v1/completions: `text_completion` objects, `logprobs` as parallel arrays."""

    object, chunk_object, id_prefix = "text_completion", "text_completion", "cmpl-"

    def __init__(self, *, prompt_texts: list[str] | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        # echo: each choice starts with its prompt.
        self.echo = prompt_texts or []
        self.offsets = [0] * len(self.choices)

    def opening(self, include_usage: bool) -> list[dict]:
        return [
            self._chunk(
                [{"index": i, "text": text, "logprobs": None, "finish_reason": None}],
                include_usage=include_usage,
            )
            for i, text in enumerate(self.echo)
            if text
        ]

    def _legacy_logprobs(self, index: int, event: Tokens) -> dict:
        tokens, offsets = [], []
        tops = event.top_logprobs or [None] * len(event.token_ids)
        for token_id in event.token_ids:
            piece = _piece(self.tokenizer, token_id)
            tokens.append(piece)
            offsets.append(self.offsets[index])
            self.offsets[index] += len(piece)
        return {
            "tokens": tokens,
            "token_logprobs": list(event.logprobs or ()),
            "top_logprobs": [
                {_piece(self.tokenizer, int(t)): lp for t, lp in (top or {}).items()}
                for top in tops
            ]
            if event.top_logprobs
            else None,
            "text_offset": offsets,
        }

    def token_chunk(self, event: Tokens, include_usage: bool) -> dict:
        index = event.choice
        choice = self.choices[index]
        choice.text += event.text
        choice.token_ids += event.token_ids
        logprobs = self._legacy_logprobs(index, event) if self.wants_logprobs else None
        if logprobs:
            choice.logprob_entries.append(logprobs)
        return self._chunk(
            [{"index": index, "text": event.text, "logprobs": logprobs, "finish_reason": None}],
            include_usage=include_usage,
        )

    def finish_chunk(self, event: Finish, include_usage: bool) -> dict:
        reason = _finish_reason(event.reason)
        self.choices[event.choice].finish_reason = reason
        return self._chunk(
            [{"index": event.choice, "text": "", "logprobs": None, "finish_reason": reason}],
            include_usage=include_usage,
        )

    def response(self, usage: TokenUsage) -> dict:
        choices = []
        for i, c in enumerate(self.choices):
            logprobs: dict[str, list | None] | None = None
            if self.wants_logprobs:
                logprobs = {
                    key: [v for part in c.logprob_entries for v in (part[key] or [])]
                    for key in ("tokens", "token_logprobs", "text_offset")
                }
                top = [v for part in c.logprob_entries for v in (part["top_logprobs"] or [])]
                logprobs["top_logprobs"] = top or None
            choices.append(
                {
                    "index": i,
                    "text": (self.echo[i] if i < len(self.echo) else "") + c.text,
                    "logprobs": logprobs,
                    "finish_reason": c.finish_reason or "stop",
                }
            )
        return {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": choices,
            "usage": usage_body(usage),
        }


def embeddings_response(
    *, model: str, vectors: dict[int, str], usage: TokenUsage, encoding_format: str
) -> dict:
    """`vectors` maps input index to base64 float32 (the transport's form)."""
    data = []
    for index in sorted(vectors):
        raw = vectors[index]
        embedding = (
            raw
            if encoding_format == "base64"
            else np.frombuffer(base64.b64decode(raw), dtype=np.float32).tolist()
        )
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": usage.prompt_tokens, "total_tokens": usage.prompt_tokens},
    }


def model_object(name: str, created: int, max_model_len: int = 0) -> dict:
    model = {"id": name, "object": "model", "created": created, "owned_by": "fairlane"}
    if max_model_len:
        model["max_model_len"] = max_model_len  # vLLM's field: the context, in tokens
    return model
