"""OpenAI's wire format: OpenAI itself, OpenAI-compatible servers (vLLM, TGI, ...), OpenRouter
(the same format with a `cost` in its usage, and `: OPENROUTER PROCESSING` comment lines) and
remote Fairlane engines (our own /v1 API, which also serves embeddings: hidden states).

A call is streamed upstream with `stream_options.include_usage`, so usage comes from the
provider's final chunk; a client that does not stream is asked the whole answer in one body
when it is short enough (routing.backends.base.call_streams), read as the same events. Tools,
tool_choice, parallel_tool_calls, response_format and image parts are forwarded as the client
sent them (parsed and checked in routing/wire/); streamed tool calls come back as
ToolCallDelta pieces in OpenAI's shape: a call's id and name once, then its arguments."""

from __future__ import annotations

import functools
import json
import secrets
from collections.abc import AsyncIterator, Iterator

import httpx
import orjson

from routing.backends.aio import post_whole
from routing.backends.base import (
    BackendSpec,
    Call,
    body_json,
    error_for_status,
    retry_after_parse,
    sse_lines,
)
from routing.errors import backend_error
from routing.models import BackendKind
from workers.serving.events import Finish, RemoteEvent, Reported, Tokens, ToolCallDelta

OPENAI_KINDS = {
    BackendKind.OPENAI,
    BackendKind.OPENAI_COMPATIBLE,
    BackendKind.OPENROUTER,
    BackendKind.FAIRLANE,
}
FINISH_REASONS = {"length": "length", "tool_calls": "tool_calls", "function_call": "tool_calls"}


def headers(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"} if secret else {}


def call_headers(spec: BackendSpec, call: Call, secret: str) -> dict[str, str]:
    """A call's headers: the key, and for our own infrastructure (a remote Fairlane, a vLLM
    server: both continue W3C traces) the request's `traceparent`; paid providers get none."""
    sent = headers(secret)
    if call.traceparent and spec.kind in {BackendKind.FAIRLANE, BackendKind.OPENAI_COMPATIBLE}:
        sent["traceparent"] = call.traceparent
    return sent


def request_body(spec: BackendSpec, call: Call) -> tuple[str, dict]:
    s = call.generation_sampling
    body: dict = {
        "model": call.upstream,
        "stream": call.stream,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "n": s.n,
    }
    if call.stream:
        body["stream_options"] = {"include_usage": True}
    # OpenAI's newer models take only max_completion_tokens; servers that copy the API take
    # max_tokens.
    body["max_completion_tokens" if spec.kind == BackendKind.OPENAI else "max_tokens"] = (
        call.max_tokens
    )
    if s.stop:
        body["stop"] = list(s.stop)
    if s.seed is not None:
        body["seed"] = s.seed
    if s.presence_penalty:
        body["presence_penalty"] = s.presence_penalty
    if s.frequency_penalty:
        body["frequency_penalty"] = s.frequency_penalty
    if spec.kind in {BackendKind.FAIRLANE, BackendKind.OPENAI_COMPATIBLE}:  # vLLM's, and ours
        if call.cache_salt:
            body["cache_salt"] = call.cache_salt
        if s.top_k > 0:
            body["top_k"] = s.top_k
        if s.repetition_penalty != 1.0:
            body["repetition_penalty"] = s.repetition_penalty
        if s.min_tokens:
            body["min_tokens"] = s.min_tokens
    if s.logit_bias:
        body["logit_bias"] = {str(k): v for k, v in s.logit_bias}
    if call.endpoint == "chat":
        body["messages"] = call.messages
        use = call.tool_use
        for name, value in (
            ("tools", list(use.tools) or None),
            ("tool_choice", use.tool_choice),
            ("parallel_tool_calls", use.parallel_tool_calls),
            ("response_format", use.response_format),
        ):
            if value is not None:
                body[name] = value
        if call.wants_logprobs:
            body["logprobs"] = True
            if s.logprobs:
                body["top_logprobs"] = s.logprobs
        return "/v1/chat/completions", body
    body["prompt"] = call.prompt
    if call.wants_logprobs:
        body["logprobs"] = s.logprobs or 0
    return "/v1/completions", body


async def _raise_for_status(response: httpx.Response, backend: str) -> None:
    if response.status_code < 400:
        return
    raw = await response.aread()
    message, code = raw[:500].decode(errors="replace"), ""
    try:
        error = json.loads(raw).get("error") or {}
        message, code = error.get("message") or message, str(error.get("code") or "")
    except (ValueError, AttributeError):
        pass
    if code == "content_filter" or "content management policy" in message:
        raise backend_error(
            "content_filtered", message, backend=backend, status=response.status_code
        )
    raise error_for_status(
        response.status_code, message, retry_after_parse(response.headers), backend=backend
    )


def _tool_calls(choice: dict, seen: dict[tuple[int, int], str]) -> tuple[ToolCallDelta, ...]:
    """A chunk's tool-call pieces, as OpenAI streams them whatever the server did: the id and
    name on a call's first piece only (one is made up for a server that sent no id)."""
    pieces = []
    for position, call in enumerate((choice.get("delta") or {}).get("tool_calls") or ()):
        function = call.get("function") or {}
        index = call.get("index", position)
        key = (choice.get("index", 0), index)
        arguments = function.get("arguments") or ""
        if key in seen:
            pieces.append(ToolCallDelta(index=index, arguments=arguments))
            continue
        seen[key] = call.get("id") or f"call_{secrets.token_hex(12)}"
        pieces.append(
            ToolCallDelta(
                index=index, arguments=arguments, id=seen[key], name=function.get("name") or ""
            )
        )
    return tuple(pieces)


def _token_event(choice: dict, endpoint: str, seen: dict[tuple[int, int], str]) -> Tokens | None:
    index = choice.get("index", 0)
    if endpoint == "chat":
        delta = choice.get("delta") or {}
        text = delta.get("content")
        calls = _tool_calls(choice, seen) if delta.get("tool_calls") else ()
    else:
        text, calls = choice.get("text"), ()
    logprobs = choice.get("logprobs")
    if not text and not logprobs and not calls:
        return None
    if calls:
        return Tokens(choice=index, text=text or "", tool_calls=calls)
    if endpoint == "chat" and logprobs and logprobs.get("content"):
        entries = tuple(logprobs["content"])
        return Tokens(
            choice=index,
            text=text or "",
            entries=entries,
            logprobs=tuple(entry.get("logprob") for entry in entries),
        )
    if endpoint == "completion" and logprobs and logprobs.get("token_logprobs"):
        return Tokens(choice=index, text=text or "", logprobs=tuple(logprobs["token_logprobs"]))
    return Tokens(choice=index, text=text or "")


def usage_event(usage: dict) -> Reported:
    details = usage.get("prompt_tokens_details") or {}
    cost = usage.get("cost")  # OpenRouter: what the call cost, in dollars
    return Reported(
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        cached_tokens=int(details.get("cached_tokens") or 0),
        cost_usd=None if cost is None else float(cost),
    )


@functools.lru_cache(maxsize=256)
def _url(base_url: str, path: str) -> httpx.URL:
    """Parsed once per backend and path (httpx parses a str URL on every call)."""
    return httpx.URL(base_url.rstrip("/") + path)


async def openai_stream(
    client: httpx.AsyncClient, spec: BackendSpec, call: Call, secret: str, timeout: httpx.Timeout
) -> AsyncIterator[RemoteEvent]:
    """The call's answer as events: from its stream's chunks, or from the one body of a call
    that does not stream."""
    path, body = request_body(spec, call)
    url, content = _url(spec.base_url, path), body_json(body)
    headers = {**call_headers(spec, call, secret), "Content-Type": "application/json"}
    if not call.stream:
        response = await post_whole(client, url, content=content, headers=headers, timeout=timeout)
        await _raise_for_status(response, spec.name)
        try:
            answer = orjson.loads(response.content)
        except ValueError:
            raise backend_error(
                "backend_unavailable", "unparseable answer", backend=spec.name
            ) from None
        for event in _answer_events(answer, call.endpoint, spec.name):
            yield event
        return
    async with client.stream(
        "POST", url, content=content, headers=headers, timeout=timeout
    ) as response:
        await _raise_for_status(response, spec.name)
        is_done, seen = False, dict[tuple[int, int], str]()
        async for line in sse_lines(response):
            if not line.startswith(b"data:"):
                continue  # blank lines, `event:` and comments such as OpenRouter's keep-alive
            data = line[5:].strip()
            if data == b"[DONE]":
                is_done = True
                break
            try:
                chunk = orjson.loads(data)
            except ValueError:
                raise backend_error(
                    "backend_unavailable", "unparseable stream chunk", backend=spec.name
                ) from None
            if chunk.get("error"):  # OpenRouter reports upstream failures mid-stream
                error = chunk["error"]
                raise backend_error(
                    "backend_unavailable", str(error.get("message", error)), backend=spec.name
                )
            for event in _choice_events(chunk, call.endpoint, seen, spec.name):
                yield event
        if not is_done:
            raise backend_error(
                "backend_unavailable", "the stream ended without [DONE]", backend=spec.name
            )


def _choice_events(
    chunk: dict, endpoint: str, seen: dict[tuple[int, int], str], backend: str
) -> Iterator[RemoteEvent]:
    """A stream chunk's events, or a whole answer's (its choices' messages read as deltas):
    each choice's tokens and finish, then the usage. A content filter raises after the tokens
    before it, so a stream hands those on first."""
    for choice in chunk.get("choices") or ():
        event = _token_event(choice, endpoint, seen)
        if event is not None:
            yield event
        reason = choice.get("finish_reason")
        if reason == "content_filter":
            raise backend_error(
                "content_filtered",
                "The provider's content filter stopped the answer.",
                backend=backend,
            )
        if reason:
            yield Finish(choice=choice.get("index", 0), reason=FINISH_REASONS.get(reason, "stop"))
    if chunk.get("usage"):
        yield usage_event(chunk["usage"])


def _answer_events(answer: dict, endpoint: str, backend: str) -> list[RemoteEvent]:
    """A whole answer (`chat.completion` or `text_completion`) as the stream's events."""
    if not isinstance(answer, dict) or not isinstance(answer.get("choices"), list):
        raise backend_error("backend_unavailable", "an answer without choices", backend=backend)
    if endpoint == "chat":
        choices = []
        for choice in answer["choices"]:
            message = choice.get("message") or {}
            calls = [{**call, "index": i} for i, call in enumerate(message.get("tool_calls") or ())]
            choices.append(
                {**choice, "delta": {"content": message.get("content"), "tool_calls": calls}}
            )
        answer = {**answer, "choices": choices}
    events = list(_choice_events(answer, endpoint, {}, backend))  # a filtered answer raises
    for choice in answer["choices"]:  # a whole answer always ends
        if not choice.get("finish_reason"):
            events.append(Finish(choice=choice.get("index", 0), reason="stop"))
    return events


async def openai_embed(
    client: httpx.AsyncClient,
    spec: BackendSpec,
    upstream: str,
    inputs: list,
    secret: str,
    timeout: httpx.Timeout,
) -> dict:
    """Embeddings from a backend with hidden states: {"vectors": {index: b64}, usage}."""
    response = await client.post(
        spec.base_url.rstrip("/") + "/v1/embeddings",
        json={"model": upstream, "input": inputs, "encoding_format": "base64"},
        headers=headers(secret),
        timeout=timeout,
    )
    await _raise_for_status(response, spec.name)
    body = response.json()
    return {
        "vectors": {item["index"]: item["embedding"] for item in body["data"]},
        "prompt_tokens": int((body.get("usage") or {}).get("prompt_tokens") or 0),
    }
