"""The endpoints a batch may run, and how a line's body is parsed for each (as the endpoint
itself parses it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from routing.wire import parse
from routing.wire.responses import responses_request_parse


@dataclass(frozen=True, slots=True)
class BatchEndpoint:
    url: str
    kind: str  # "chat" | "completion" | "embedding" | "responses": the service a line is run by
    parse: Callable[[Any], Any]  # raises InvalidRequest, naming the parameter


ENDPOINTS = {
    e.url: e
    for e in (
        BatchEndpoint("/v1/chat/completions", "chat", parse.chat_request_parse),
        BatchEndpoint("/v1/completions", "completion", parse.completion_request_parse),
        BatchEndpoint("/v1/embeddings", "embedding", parse.embedding_request_parse),
        BatchEndpoint("/v1/responses", "responses", responses_request_parse),
    )
}
