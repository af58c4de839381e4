"""Anthropic's Messages API: `system` apart from the turns, `max_tokens` required, and a stream
of named events (message_start, content_block_delta, message_delta, message_stop, ping,
error). Usage comes in two parts: input (and cache-read) tokens in message_start, output tokens
in message_delta."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace

import httpx

from routing.backends.base import (
    BackendSpec, Call, UpstreamError, error_for_status, retry_after_parse,
)
from workers.events import Finish, RemoteEvent, Reported, Tokens

VERSION = "2023-06-01"


def headers(secret: str) -> dict[str, str]:
    return {"x-api-key": secret, "anthropic-version": VERSION}


def request_body(call: Call) -> dict:
    s = call.sampling
    system = "\n\n".join(m["content"] for m in call.messages
                         if m["role"] in {"system", "developer"})
    turns = [{"role": m["role"], "content": m["content"]} for m in call.messages
             if m["role"] in {"user", "assistant"}]
    body: dict = {"model": call.upstream, "max_tokens": call.max_tokens, "messages": turns,
                  "stream": True, "temperature": min(s.temperature, 1.0)}
    if system:
        body["system"] = system
    if s.top_p < 1.0:
        body["top_p"] = s.top_p
    if s.top_k > 0:
        body["top_k"] = s.top_k
    if s.stop:
        body["stop_sequences"] = list(s.stop)
    return body


async def _raise_for_status(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    raw = await response.aread()
    message = raw[:500].decode(errors="replace")
    try:
        message = json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        pass
    status = response.status_code
    if status == 529:  # overloaded_error
        status = 503
    raise error_for_status(status, message, retry_after_parse(response.headers))


async def anthropic_stream(client: httpx.AsyncClient, spec: BackendSpec, call: Call,
                           secret: str, timeout: httpx.Timeout) -> AsyncIterator[RemoteEvent]:
    async with client.stream("POST", spec.base_url.rstrip("/") + "/v1/messages",
                             json=request_body(call), headers=headers(secret),
                             timeout=timeout) as response:
        await _raise_for_status(response)
        usage = Reported()
        name, is_done = "", False
        async for line in response.aiter_lines():
            if line.startswith("event:"):
                name = line[6:].strip()
                continue
            if not line.startswith("data:"):
                continue
            try:
                data = json.loads(line[5:].strip())
            except ValueError:
                raise UpstreamError("backend_unavailable", "unparseable stream event") from None
            name = data.get("type", name)
            if name == "message_start":
                u = data["message"].get("usage") or {}
                cached = int(u.get("cache_read_input_tokens") or 0)
                usage = replace(usage, cached_tokens=cached, prompt_tokens=(
                    int(u.get("input_tokens") or 0) + cached
                    + int(u.get("cache_creation_input_tokens") or 0)))
                yield usage  # the prompt's count, should the stream be cut later
            elif name == "content_block_delta":
                delta = data.get("delta") or {}
                if delta.get("type") == "text_delta" and delta.get("text"):
                    yield Tokens(choice=0, text=delta["text"])
            elif name == "message_delta":
                reason = (data.get("delta") or {}).get("stop_reason")
                usage = replace(usage, completion_tokens=int(
                    (data.get("usage") or {}).get("output_tokens") or 0))
                if reason == "refusal":
                    raise UpstreamError("content_filtered",
                                        "The provider declined to answer (refusal).")
                if reason:
                    yield Finish(choice=0,
                                 reason="length" if reason == "max_tokens" else "stop")
            elif name == "error":
                error = data.get("error") or {}
                code = "rate_limited" if error.get("type") == "rate_limit_error" else \
                    "backend_unavailable"
                raise UpstreamError(code, str(error.get("message", "stream error")))
            elif name == "message_stop":
                is_done = True
                break
        if not is_done:
            raise UpstreamError("backend_unavailable", "the stream ended without message_stop")
        yield usage
