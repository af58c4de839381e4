"""Fake paid LLM providers: real HTTP servers on 127.0.0.1 that speak the wire formats of OpenAI
(`POST /v1/chat/completions`), OpenRouter (the same, plus cost and its SSE quirks) and Anthropic
(`POST /v1/messages`), scriptable per request to misbehave.

    with FakeProvider("anthropic", reply_tokens=4) as fake:
        fake.push(rate_limit(retry_after=2), cut(after=1))
        ...  # 1st request: 429 + Retry-After; 2nd: stream dropped after one token; then ok

Each completion request takes the next `Behaviour` from a FIFO; an empty FIFO means the default
(`set_default`, normally `ok()`). Health probes (`GET /v1/models`) take nothing. Replies are
deterministic so tests can compute usage by hand: the reply is min(max_tokens, reply_tokens)
tokens, token i is the text "t{i} ", and prompt tokens are the whitespace-separated words of all
message contents (and Anthropic's `system`).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import json
import logging
import socket
import threading
import time
from typing import Any

import uvicorn

FORMATS = ("openai", "openrouter", "anthropic")
KINDS = ("ok", "rate_limit", "server_error", "slow_first_byte", "cut", "content_filter")
CONTENT_POLICY = (
    "The response was filtered due to the prompt triggering OpenAI's content "
    "management policy. Please modify your prompt and retry."
)
# kind: (OpenAI/OpenRouter error type, OpenAI code, Anthropic error type)
ERROR_SHAPES = {
    "auth": ("invalid_request_error", "invalid_api_key", "authentication_error"),
    "invalid": ("invalid_request_error", None, "invalid_request_error"),
    "not_found": ("invalid_request_error", "unknown_url", "not_found_error"),
    "rate_limit": ("requests", "rate_limit_exceeded", "rate_limit_error"),
    "server": ("server_error", None, "api_error"),
    "overloaded": ("server_error", None, "overloaded_error"),
    "content_filter": ("invalid_request_error", "content_filter", "invalid_request_error"),
}


@dataclasses.dataclass(slots=True, frozen=True)
class Behaviour:
    """What the fake does with one completion request. `delay` is slept before the response
    headers, whatever the kind."""

    kind: str
    retry_after: float | None = None
    retry_after_ms: int | None = None
    delay: float = 0.0
    cut_after: int = 0
    status: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown behaviour {self.kind!r}; one of {KINDS}")


def ok() -> Behaviour:
    return Behaviour("ok")


def rate_limit(retry_after: float | None = 1, retry_after_ms: int | None = None) -> Behaviour:
    """429 with `Retry-After` (seconds) and, if given, OpenAI's `retry-after-ms` header."""
    return Behaviour("rate_limit", retry_after=retry_after, retry_after_ms=retry_after_ms)


def server_error(status: int = 500) -> Behaviour:
    """A 5xx in the provider's shape; 529 is Anthropic's `overloaded_error`."""
    return Behaviour("server_error", status=status)


def slow_first_byte(delay: float) -> Behaviour:
    """A normal answer whose response headers come only after `delay` seconds."""
    return Behaviour("slow_first_byte", delay=delay)


def cut(after: int = 0) -> Behaviour:
    """Streaming: `after` content tokens, then the connection drops (no usage, no [DONE] or
    message_stop). Non-streaming: headers, then the connection drops before the body."""
    return Behaviour("cut", cut_after=after)


def content_filter() -> Behaviour:
    """OpenAI/OpenRouter: 400 `content_filter`. Anthropic: 200 with stop_reason "refusal"."""
    return Behaviour("content_filter")


class _Cut(Exception):
    """Raised inside the ASGI app after the response started: uvicorn then closes the socket."""


class _DropCutTracebacks(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], _Cut))


@dataclasses.dataclass(slots=True)
class _Answer:
    """The deterministic reply to one request; `stop` is "end", "max" or "refusal"."""

    id: str
    model: str
    prompt: int
    cached: int
    tokens: list[str]
    stop: str
    cut_after: int | None
    gone: asyncio.Event  # set when the client hangs up


def _words(content: Any) -> int:
    if isinstance(content, str):
        return len(content.split())
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        return sum(_words(part.get("text")) for part in content if isinstance(part, dict))
    return 0


async def _read_body(receive) -> bytes:
    chunks, more = [], True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    return b"".join(chunks)


async def _watch_disconnect(receive, gone: asyncio.Event) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    gone.set()


def _encode(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


async def _send_json(send, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": _encode(
                {
                    "content-type": "application/json",
                    "content-length": str(len(data)),
                    **(headers or {}),
                }
            ),
        }
    )
    await send({"type": "http.response.body", "body": data})


class FakeProvider:
    """One fake provider on a random free port. `url` is the base without `/v1`; tweak
    `models`, `logprob` and the OpenRouter prices before or between requests."""

    def __init__(
        self,
        fmt: str = "openai",
        *,
        api_key: str = "sk-fake",
        reply_tokens: int = 8,
        token_delay: float = 0.0,
        cached_tokens: int = 0,
        cache_write_tokens: int = 0,  # Anthropic: of each prompt, the tokens "written" to cache
    ) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"unknown format {fmt!r}; one of {FORMATS}")
        self.fmt, self.api_key = fmt, api_key
        self.reply_tokens, self.token_delay = reply_tokens, token_delay
        self.cached_tokens, self.cache_write_tokens = cached_tokens, cache_write_tokens
        self.models = ["fake-model"]
        self.logprob = -0.1
        self.price_in_per_mtok_usd, self.price_out_per_mtok_usd = 1.0, 2.0
        self.url = ""
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._active = 0  # survives reset(): requests still open finish after it
        self.reset()

    # -- control (test thread) ---------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """The URL SDKs take as base: `url` + "/v1"."""
        return self.url + "/v1"

    def push(self, *behaviours: Behaviour) -> None:
        with self._lock:
            self._queue.extend(behaviours)

    def set_default(self, behaviour: Behaviour) -> None:
        with self._lock:
            self._default = behaviour

    def reset(self) -> None:
        """Empty the FIFO, restore the `ok()` default and forget all stats and records."""
        with self._lock:
            self._queue: collections.deque[Behaviour] = collections.deque()
            self._default = ok()
            self._stats = {
                "requests": 0,
                "ok": 0,
                "prompt_tokens": 0,
                "completion_tokens": 0,
                "cached_tokens": 0,
                "max_concurrent": 0,
                "probes": 0,
            }
            self._by_kind: collections.Counter[str] = collections.Counter()
            self.arrivals: list[tuple[float, str]] = []
            self.requests: list[Any] = []
            self.last_headers: dict[str, str] = {}

    @property
    def stats(self) -> dict[str, Any]:
        """Counters since the last reset(); `in_flight` is completion requests open right now."""
        with self._lock:
            return {**self._stats, "by_kind": dict(self._by_kind), "in_flight": self._active}

    def start(self) -> FakeProvider:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        # A bound method's __call__ is no coroutine function, so uvicorn would guess ASGI2.
        config = uvicorn.Config(
            self._app,
            interface="asgi3",
            log_level="warning",
            lifespan="off",
            access_log=False,
            timeout_graceful_shutdown=2,
        )
        error_log = logging.getLogger("uvicorn.error")
        if not any(isinstance(f, _DropCutTracebacks) for f in error_log.filters):
            error_log.addFilter(_DropCutTracebacks())
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [sock]},
            name=f"fake-{self.fmt}",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"fake {self.fmt} provider did not start")
            time.sleep(0.005)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
            self._server = self._thread = None

    def __enter__(self) -> FakeProvider:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # -- the server (its own thread and event loop) -------------------------------------------

    async def _app(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        raw = await _read_body(receive)
        method, path = scope["method"], scope["path"]
        completion_path = "/v1/messages" if self.fmt == "anthropic" else "/v1/chat/completions"
        if method == "GET" and path == "/_stats":
            await _send_json(send, 200, self.stats)
        elif method == "GET" and path == "/v1/models":
            await self._models(headers, send)
        elif method == "POST" and path == completion_path:
            await self._completion(headers, raw, receive, send)
        else:
            await self._error(send, 404, "not_found", f"Unknown request URL: {method} {path}")

    async def _error(
        self, send, status: int, kind: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        """An error body in the provider's own shape."""
        openai_type, code, anthropic_type = ERROR_SHAPES[kind]
        if self.fmt == "anthropic":
            body = {
                "type": "error",
                "error": {"type": anthropic_type, "message": message},
                "request_id": f"req_fake{next(self._ids)}",
            }
        else:
            param = "prompt" if kind == "content_filter" else None
            body = {
                "error": {"message": message, "type": openai_type, "param": param, "code": code}
            }
        await _send_json(send, status, body, headers)

    def _auth_problem(self, headers: dict[str, str]) -> tuple[int, str, str] | None:
        """OpenAI and OpenRouter take `Authorization: Bearer`; Anthropic takes `x-api-key` and
        insists on `anthropic-version`."""
        if self.fmt != "anthropic":
            if headers.get("authorization") != f"Bearer {self.api_key}":
                return 401, "auth", "Incorrect API key provided."
        elif headers.get("x-api-key") != self.api_key:
            return 401, "auth", "invalid x-api-key"
        elif "anthropic-version" not in headers:
            return 400, "invalid", "anthropic-version: header is required"
        return None

    async def _models(self, headers: dict[str, str], send) -> None:
        """The cheap health probe: the model list, behind the same auth as completions."""
        with self._lock:
            self._stats["probes"] += 1
            self.last_headers = headers
        if problem := self._auth_problem(headers):
            return await self._error(send, *problem)
        if self.fmt == "anthropic":
            data = [
                {"type": "model", "id": m, "display_name": m, "created_at": "2025-01-01T00:00:00Z"}
                for m in self.models
            ]
            body = {"data": data, "has_more": False}
        else:
            body = {
                "object": "list",
                "data": [
                    {"id": m, "object": "model", "created": 1700000000, "owned_by": "fake"}
                    for m in self.models
                ],
            }
        await _send_json(send, 200, body)

    def _admit(self, headers: dict[str, str], raw: bytes) -> tuple[Any, Any]:
        """Record the arrival; return (body, Behaviour) or (body, (status, kind, message)) for a
        request refused before any behaviour is taken."""
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        problem = self._auth_problem(headers)
        if problem is None and not isinstance(body, dict):
            problem = 400, "invalid", "We could not parse the JSON body of your request."
        elif problem is None and self.fmt == "anthropic" and "max_tokens" not in body:
            problem = 400, "invalid", "max_tokens: Field required"
        with self._lock:
            if problem is None:
                outcome = self._queue.popleft() if self._queue else self._default
                kind = outcome.kind
            else:
                outcome, kind = problem, "unauthorized" if problem[1] == "auth" else "invalid"
            self._stats["requests"] += 1
            self._by_kind[kind] += 1
            self.arrivals.append((time.monotonic(), kind))
            self.requests.append(body)
            self.last_headers = headers
            self._active += 1
            self._stats["max_concurrent"] = max(self._stats["max_concurrent"], self._active)
        return body, outcome

    def _count(self, **amounts: int) -> None:
        with self._lock:
            for key, amount in amounts.items():
                self._stats[key] += amount

    async def _completion(self, headers: dict[str, str], raw: bytes, receive, send) -> None:
        body, outcome = self._admit(headers, raw)
        gone = asyncio.Event()  # uvicorn drops writes to a closed socket silently; stop instead
        watcher = asyncio.create_task(_watch_disconnect(receive, gone))
        try:
            if not isinstance(outcome, Behaviour):
                return await self._error(send, *outcome)
            await asyncio.sleep(outcome.delay)
            if outcome.kind == "rate_limit":
                retry = {}
                if outcome.retry_after is not None:
                    retry["retry-after"] = f"{outcome.retry_after:g}"
                if outcome.retry_after_ms is not None:
                    retry["retry-after-ms"] = str(outcome.retry_after_ms)
                return await self._error(
                    send, 429, "rate_limit", "Rate limit reached for requests.", retry
                )
            if outcome.kind == "server_error":
                status = outcome.status or 500
                kind, message = (
                    ("overloaded", "Overloaded")
                    if status == 529
                    else ("server", "The server had an error while processing your request.")
                )
                return await self._error(send, status, kind, message)
            if outcome.kind == "content_filter" and self.fmt != "anthropic":
                return await self._error(send, 400, "content_filter", CONTENT_POLICY)
            answer = self._answer(body, outcome, gone)
            stream = bool(body.get("stream"))
            if self.fmt == "anthropic":
                await (self._anthropic_stream if stream else self._anthropic_once)(send, answer)
            else:
                await (self._openai_stream if stream else self._openai_once)(send, answer, body)
            if outcome.kind != "content_filter":
                self._count(ok=1)
        finally:
            watcher.cancel()
            with self._lock:
                self._active -= 1

    def _answer(self, body: dict, behaviour: Behaviour, gone: asyncio.Event) -> _Answer:
        """Decide the reply and count its prompt (the provider bills it once it answers)."""
        prompt = sum(
            _words(m.get("content")) for m in body.get("messages") or [] if isinstance(m, dict)
        )
        if self.fmt == "anthropic":
            prompt += _words(body.get("system"))
        cached = min(self.cached_tokens, prompt)
        self._count(prompt_tokens=prompt, cached_tokens=cached)
        if behaviour.kind == "content_filter":
            return _Answer(
                f"msg_fake{next(self._ids)}",
                body.get("model", ""),
                prompt,
                cached,
                [],
                "refusal",
                None,
                gone,
            )
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        n = self.reply_tokens if max_tokens is None else min(max_tokens, self.reply_tokens)
        prefix = "msg_fake" if self.fmt == "anthropic" else "chatcmpl-fake"
        return _Answer(
            f"{prefix}{next(self._ids)}",
            body.get("model", ""),
            prompt,
            cached,
            [f"t{i} " for i in range(n)],
            "max" if n < self.reply_tokens else "end",
            behaviour.cut_after if behaviour.kind == "cut" else None,
            gone,
        )

    async def _start_stream(self, send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": _encode(
                    {
                        "content-type": "text/event-stream; charset=utf-8",
                        "cache-control": "no-cache",
                    }
                ),
            }
        )

    async def _write(self, send, text: str) -> None:
        await send({"type": "http.response.body", "body": text.encode(), "more_body": True})

    async def _tokens(self, send, answer: _Answer, frame) -> None:
        """Stream the content tokens, each framed by `frame(i, token)`; cut if scripted to."""
        for i, token in enumerate(answer.tokens):
            if answer.cut_after is not None and i >= answer.cut_after:
                break
            if self.token_delay:
                await asyncio.sleep(self.token_delay)
            if answer.gone.is_set():
                raise _Cut()  # the client left: what it never read was never sent
            await self._write(send, frame(i, token))
            self._count(completion_tokens=1)
        if answer.cut_after is not None:
            raise _Cut()

    async def _cut_before_body(self, send, answer: _Answer) -> None:
        if answer.cut_after is not None:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": _encode(
                        {"content-type": "application/json", "content-length": "1000"}
                    ),
                }
            )
            raise _Cut()

    # -- OpenAI and OpenRouter -----------------------------------------------------------------

    def _openai_usage(self, answer: _Answer) -> dict[str, Any]:
        n = len(answer.tokens)
        usage = {
            "prompt_tokens": answer.prompt,
            "completion_tokens": n,
            "total_tokens": answer.prompt + n,
            "prompt_tokens_details": {"cached_tokens": answer.cached},
            "completion_tokens_details": {"reasoning_tokens": 0},
        }
        if self.fmt == "openrouter":
            usage["cost"] = (
                self.price_in_per_mtok_usd * answer.prompt / 1e6
                + self.price_out_per_mtok_usd * n / 1e6
            )
        return usage

    def _logprobs(self, tokens: list[str]) -> dict[str, Any]:
        return {
            "content": [
                {"token": t, "logprob": self.logprob, "bytes": list(t.encode()), "top_logprobs": []}
                for t in tokens
            ],
            "refusal": None,
        }

    def _openai_base(self, answer: _Answer, obj: str) -> dict[str, Any]:
        base = {
            "id": answer.id,
            "object": obj,
            "created": int(time.time()),
            "model": answer.model,
            "system_fingerprint": "fp_fake",
        }
        if self.fmt == "openrouter":
            base["provider"] = "FakeProvider"
        return base

    async def _openai_once(self, send, answer: _Answer, body: dict) -> None:
        """A `chat.completion` object."""
        await self._cut_before_body(send, answer)
        choice = {
            "index": 0,
            "finish_reason": "length" if answer.stop == "max" else "stop",
            "message": {"role": "assistant", "content": "".join(answer.tokens), "refusal": None},
            "logprobs": self._logprobs(answer.tokens) if body.get("logprobs") else None,
        }
        await _send_json(
            send,
            200,
            {
                **self._openai_base(answer, "chat.completion"),
                "choices": [choice],
                "usage": self._openai_usage(answer),
            },
        )
        self._count(completion_tokens=len(answer.tokens))

    async def _openai_stream(self, send, answer: _Answer, body: dict) -> None:
        """`data: {chat.completion.chunk}` lines: role, one per token, finish_reason, usage
        (OpenAI only with stream_options.include_usage, OpenRouter always), `data: [DONE]`."""
        openrouter = self.fmt == "openrouter"
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        base = self._openai_base(answer, "chat.completion.chunk")
        if include_usage and not openrouter:
            base["usage"] = None  # OpenAI marks every chunk but the last this way

        def chunk(delta: dict, finish: str | None = None, logprobs: Any = None) -> str:
            choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
            return f"data: {json.dumps({**base, 'choices': [choice]})}\n\n"

        def token_chunk(i: int, token: str) -> str:
            return chunk(
                {"content": token},
                logprobs=self._logprobs([token]) if body.get("logprobs") else None,
            )

        await self._start_stream(send)
        if openrouter:
            await self._write(send, ": OPENROUTER PROCESSING\n\n")
        await self._write(send, chunk({"role": "assistant", "content": ""}))
        await self._tokens(send, answer, token_chunk)
        await self._write(send, chunk({}, "length" if answer.stop == "max" else "stop"))
        if include_usage or openrouter:
            final = {**base, "choices": [], "usage": self._openai_usage(answer)}
            await self._write(send, f"data: {json.dumps(final)}\n\n")
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    # -- Anthropic ----------------------------------------------------------------------------

    def _anthropic_message(
        self, answer: _Answer, content: list, stop_reason: str | None, output_tokens: int
    ) -> dict[str, Any]:
        writes = min(self.cache_write_tokens, answer.prompt - answer.cached)
        usage = {
            "input_tokens": answer.prompt - answer.cached - writes,
            "output_tokens": output_tokens,
            "cache_read_input_tokens": answer.cached,
            "cache_creation_input_tokens": writes,
        }
        return {
            "id": answer.id,
            "type": "message",
            "role": "assistant",
            "model": answer.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": usage,
        }

    @staticmethod
    def _stop_reason(answer: _Answer) -> str:
        return {"end": "end_turn", "max": "max_tokens", "refusal": "refusal"}[answer.stop]

    async def _anthropic_once(self, send, answer: _Answer) -> None:
        """A Message object; a refusal has no content."""
        await self._cut_before_body(send, answer)
        content = [{"type": "text", "text": "".join(answer.tokens)}] if answer.tokens else []
        await _send_json(
            send,
            200,
            self._anthropic_message(answer, content, self._stop_reason(answer), len(answer.tokens)),
        )
        self._count(completion_tokens=len(answer.tokens))

    async def _anthropic_stream(self, send, answer: _Answer) -> None:
        """message_start, content_block_start, ping, content_block_delta per token,
        content_block_stop, message_delta, message_stop (a refusal skips the content block)."""

        def event(name: str, data: dict) -> str:
            return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n"

        def delta(i: int, token: str) -> str:
            return event(
                "content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": token}}
            )

        await self._start_stream(send)
        await self._write(
            send, event("message_start", {"message": self._anthropic_message(answer, [], None, 1)})
        )
        if answer.stop != "refusal":
            block = {"index": 0, "content_block": {"type": "text", "text": ""}}
            await self._write(send, event("content_block_start", block))
            await self._write(send, event("ping", {}))
            await self._tokens(send, answer, delta)
            await self._write(send, event("content_block_stop", {"index": 0}))
        await self._write(
            send,
            event(
                "message_delta",
                {
                    "delta": {"stop_reason": self._stop_reason(answer), "stop_sequence": None},
                    "usage": {"output_tokens": len(answer.tokens)},
                },
            ),
        )
        await send({"type": "http.response.body", "body": event("message_stop", {}).encode()})
