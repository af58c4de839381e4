"""What the request path carries from whoever answers (the engine adapter, a remote adapter)
through the transports and dispatch to settlement, the renderers and the websocket consumer:
a small set of frozen types, matched on by type, never by a key.

One run's events come in this order:
  Accepted                    the engine took every sequence
  Tokens                      repeated; per choice (a remote model's tool calls too)
  Finish                      per choice: stop | length | abort | tool_calls
  Embedding                   embedding requests, per input
  Failed                      something failed
  Done                        always last; the ledger row exists

They cross Redis as JSON (`event_encode` / `event_decode`), one object per event with its
`type` ("accepted", "token", "finish", "embedding", "error", "done"), readable with redis-cli.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Accepted:
    pass


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of one tool call, as OpenAI streams it: the first piece of call `index` has
    its id and function name, later ones only more of its JSON arguments."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None


@dataclass(frozen=True, slots=True)
class Tokens:
    """New output of one choice. A remote backend's text carries no token ids; its
    log-probabilities may come already in OpenAI's chat shape (`entries`)."""

    choice: int
    text: str
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] | None = None
    top_logprobs: tuple[dict[str, float], ...] | None = None  # per token: {str(id): logprob}
    entries: tuple[dict[str, Any], ...] | None = None
    tool_calls: tuple[ToolCallDelta, ...] = ()
    # An Anthropic backend's events of a block we do not model (thinking), as it sent them
    # (its own block index), for the Messages renderer; remote answers only, never encoded.
    native: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class Finish:
    choice: int
    reason: str  # stop | length | abort | tool_calls


@dataclass(frozen=True, slots=True)
class Embedding:
    index: int
    b64: str  # unit-length float32, base64


@dataclass(frozen=True, slots=True)
class Failed:
    """An error with an ApplicationError's code. `retryable`: nothing ran, so the walk may
    fall through to the next backend (after `retry_after` seconds, when given)."""

    code: str
    message: str
    param: str | None = None
    retryable: bool = False
    retry_after: int | None = None


@dataclass(frozen=True, slots=True)
class TokenUsage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    # Of the prompt, tokens written to a provider's prompt cache (Anthropic's), priced apart.
    cache_write_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class Done:
    """The run is settled: its status (a UsageRecord status) and what it was charged."""

    status: str
    usage: TokenUsage
    cost_microcents: int = 0


@dataclass(frozen=True, slots=True)
class Reported:
    """A remote provider's usage report (its latest wins); remote adapters only, never sent
    on: the answer's `Done` says what was charged."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float | None = None  # OpenRouter: what the call cost us
    cache_write_tokens: int = 0  # Anthropic: the prompt's tokens written to its cache


Event = Accepted | Tokens | Finish | Embedding | Failed | Done
RemoteEvent = Tokens | Finish | Reported  # what a remote adapter's stream yields


def event_to_dict(event: Event) -> dict[str, Any]:
    """The wire form of an event (also what tests and operators read in Redis)."""
    match event:
        case Accepted():
            return {"type": "accepted"}
        case Tokens():
            wire = {
                "type": "token",
                "choice": event.choice,
                "text": event.text,
                "token_ids": list(event.token_ids),
                "logprobs": None if event.logprobs is None else list(event.logprobs),
                "top_logprobs": None if event.top_logprobs is None else list(event.top_logprobs),
            }
            if event.entries is not None:
                wire["entries"] = list(event.entries)
            if event.tool_calls:
                wire["tool_calls"] = [
                    {"index": c.index, "id": c.id, "name": c.name, "arguments": c.arguments}
                    for c in event.tool_calls
                ]
            return wire
        case Finish():
            return {"type": "finish", "choice": event.choice, "reason": event.reason}
        case Embedding():
            return {"type": "embedding", "index": event.index, "b64": event.b64}
        case Failed():
            wire = {
                "type": "error",
                "code": event.code,
                "message": event.message,
                "param": event.param,
            }
            if event.retryable:
                wire.update(retryable=True, retry_after=event.retry_after)
            return wire
        case Done():
            usage = event.usage
            return {
                "type": "done",
                "status": event.status,
                "usage": {
                    "prompt_tokens": usage.prompt_tokens,
                    "completion_tokens": usage.completion_tokens,
                    "total_tokens": usage.total_tokens,
                    "cached_tokens": usage.cached_tokens,
                    "cost_microcents": event.cost_microcents,
                },
            }
    raise TypeError(f"not an event: {event!r}")


def _tuple(values: Iterable[Any] | None) -> tuple[Any, ...] | None:
    return None if values is None else tuple(values)


def event_from_dict(wire: dict[str, Any]) -> Event:
    event_type = wire.get("type")
    if event_type == "accepted":
        return Accepted()
    if event_type == "token":
        return Tokens(
            choice=wire["choice"],
            text=wire["text"],
            token_ids=tuple(wire.get("token_ids") or ()),
            logprobs=_tuple(wire.get("logprobs")),
            top_logprobs=_tuple(wire.get("top_logprobs")),
            entries=_tuple(wire.get("entries")),
            tool_calls=tuple(ToolCallDelta(**c) for c in wire.get("tool_calls") or ()),
        )
    if event_type == "finish":
        return Finish(choice=wire["choice"], reason=wire["reason"])
    if event_type == "embedding":
        return Embedding(index=wire["index"], b64=wire["b64"])
    if event_type == "error":
        return Failed(
            code=wire["code"],
            message=wire["message"],
            param=wire.get("param"),
            retryable=bool(wire.get("retryable")),
            retry_after=wire.get("retry_after"),
        )
    if event_type == "done":
        usage = wire["usage"]
        return Done(
            status=wire["status"],
            usage=TokenUsage(
                prompt_tokens=usage["prompt_tokens"],
                completion_tokens=usage["completion_tokens"],
                cached_tokens=usage.get("cached_tokens", 0),
            ),
            cost_microcents=usage.get("cost_microcents", 0),
        )
    raise ValueError(f"unknown event type {event_type!r}")


def event_encode(event: Event) -> str:
    """For the Redis transport: one JSON object."""
    return json.dumps(event_to_dict(event))


def event_decode(raw: str | bytes) -> Event:
    return event_from_dict(json.loads(raw))
