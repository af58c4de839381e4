"""A fake `vllm serve`: a real HTTP server on 127.0.0.1 speaking vLLM's OpenAI-compatible API,
for tests and benchmarks without a GPU.

- `POST /v1/chat/completions` and `/v1/completions`, streamed or not, with `usage` (and the
  final usage chunk under `stream_options.include_usage`), vLLM's sampling extensions accepted
  (`top_k`, `min_tokens`, `repetition_penalty`, ...) and `cache_salt` (a non-empty string);
- a scheduler like vLLM's: at most `max_num_seqs` requests run, the rest wait;
- `GET /metrics` with vLLM's names: `vllm:num_requests_running`, `vllm:num_requests_waiting`,
  `vllm:kv_cache_usage_perc`, `vllm:prompt_tokens_total`, `vllm:generation_tokens_total`,
  `vllm:request_success_total` (label `model_name`);
- `GET /health` (200 with an empty body) and `GET /v1/models`;
- a stream stops generating when its client disconnects (counted as `aborted`);
- errors in vLLM's shape: `{"error": {"message", "type", "param", "code"}}`;
- `return_token_ids` (each chunk's `token_ids`), and with `--enable-prompt-tokens-details` a
  prefix cache per `cache_salt` (whole blocks of 16 tokens shared with an earlier prompt of the
  same salt count as `cached_tokens`; a different salt shares nothing), counted in
  `vllm:prefix_cache_queries_total` / `_hits_total`.

Replies are deterministic: token i is "t{i} " (token id 100 + i), min(max_tokens, reply_tokens)
of them; the prompt counts one token per whitespace-separated word (or its token ids).

As a process (`serve`, the command a worker runs as FAIRLANE_VLLM_COMMAND in tests), `--record
FILE` appends one JSON line per request when it starts running (`t`, its `body`).

    with FakeVllm("llama", reply_tokens=8) as fake:   # fake.url is the base URL (no /v1)
        ...
    python -m routing.bench.fake_vllm serve MODEL --port 8000 [--served-model-name NAME]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
import uuid

import uvicorn

from routing.bench.fakes import _encode, _read_body, _send_json, _watch_disconnect, _words


class FakeVllm:
    def __init__(
        self,
        model: str = "fake-model",
        *,
        reply_tokens: int = 8,
        token_delay: float = 0.0,
        max_num_seqs: int = 4,
        max_model_len: int = 2048,
        api_key: str = "",
        host: str = "127.0.0.1",
        port: int = 0,
        prompt_tokens_details: bool = False,
        record: str = "",
    ) -> None:
        self.model, self.reply_tokens, self.token_delay = model, reply_tokens, token_delay
        self.max_num_seqs, self.max_model_len, self.api_key = max_num_seqs, max_model_len, api_key
        self.host, self.port = host, port
        self.prompt_tokens_details, self.record = prompt_tokens_details, record
        self.url = ""
        self._cached: dict[str, set[tuple]] = {}  # salt -> block-aligned prefixes it has seen
        self.requests: list[dict] = []
        self.cache_salts: list[str] = []
        self.stats = {
            "running": 0,
            "waiting": 0,
            "prompt_tokens": 0,
            "generation_tokens": 0,
            "finished": 0,
            "aborted": 0,
            "refused": 0,
            "cache_queries": 0,
            "cache_hits": 0,
        }
        self._slots: asyncio.Semaphore | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    # -- control --------------------------------------------------------------------------------

    def start(self) -> FakeVllm:
        config = uvicorn.Config(
            self._app,
            host=self.host,
            port=self.port,
            interface="asgi3",
            lifespan="off",
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=2,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True, name="fake-vllm")
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the fake vLLM server did not start")
            time.sleep(0.005)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://{self.host}:{port}"
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
            self._server = None

    def __enter__(self) -> FakeVllm:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # -- the server -----------------------------------------------------------------------------

    async def _app(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        if self._slots is None:  # made on the server's own loop
            self._slots = asyncio.Semaphore(self.max_num_seqs)
        method, path = scope["method"], scope["path"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        body = await _read_body(receive)
        if method == "GET" and path == "/health":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            return await send({"type": "http.response.body", "body": b""})
        if method == "GET" and path == "/metrics":
            return await self._metrics(send)
        if (
            path.startswith("/v1/")
            and self.api_key
            and headers.get("authorization") != f"Bearer {self.api_key}"
        ):
            return await _send_json(send, 401, {"error": "Unauthorized"})
        if method == "GET" and path == "/v1/models":
            return await _send_json(
                send,
                200,
                {
                    "object": "list",
                    "data": [
                        {
                            "id": self.model,
                            "object": "model",
                            "created": int(time.time()),
                            "owned_by": "vllm",
                            "root": self.model,
                            "parent": None,
                            "max_model_len": self.max_model_len,
                        }
                    ],
                },
            )
        if method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            return await self._completion(path, body, receive, send)
        await _error(send, 404, "NotFoundError", f"Not Found: {method} {path}")

    async def _metrics(self, send) -> None:
        label = f'{{engine="0",model_name="{self.model}"}}'
        s = self.stats
        lines = [
            ("vllm:num_requests_running", "gauge", s["running"]),
            ("vllm:num_requests_waiting", "gauge", s["waiting"]),
            ("vllm:kv_cache_usage_perc", "gauge", s["running"] / self.max_num_seqs),
            ("vllm:prompt_tokens_total", "counter", s["prompt_tokens"]),
            ("vllm:generation_tokens_total", "counter", s["generation_tokens"]),
            ("vllm:prefix_cache_queries_total", "counter", s["cache_queries"]),
            ("vllm:prefix_cache_hits_total", "counter", s["cache_hits"]),
        ]
        text = "".join(
            f"# TYPE {name} {metric_type}\n{name}{label} {float(value)}\n"
            for name, metric_type, value in lines
        )
        text += "# TYPE vllm:request_success_total counter\n" + "".join(
            f'vllm:request_success_total{{engine="0",finished_reason="{reason}",model_name='
            f'"{self.model}"}} {float(s[key])}\n'
            for reason, key in (("stop", "finished"), ("abort", "aborted"))
        )
        data = text.encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": _encode({"content-type": "text/plain; version=0.0.4; charset=utf-8"}),
            }
        )
        await send({"type": "http.response.body", "body": data})

    def _refusal(self, path: str, body) -> tuple[int, str, str] | None:
        if not isinstance(body, dict):
            return 400, "BadRequestError", "The request body is not a JSON object."
        if body.get("model") != self.model:
            return 404, "NotFoundError", f"The model `{body.get('model')}` does not exist."
        salt = body.get("cache_salt")
        if salt is not None and (not isinstance(salt, str) or not salt):
            return 400, "BadRequestError", "Parameter 'cache_salt' must be a non-empty string."
        if path.endswith("chat/completions") and not isinstance(body.get("messages"), list):
            return 400, "BadRequestError", "messages: Field required"
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            return 400, "BadRequestError", "max_tokens must be at least 1."
        if _prompt_tokens(body) + (max_tokens or 0) > self.max_model_len:
            return (
                400,
                "BadRequestError",
                (f"This model's maximum context length is {self.max_model_len} tokens."),
            )
        return None

    async def _completion(self, path: str, raw: bytes, receive, send) -> None:
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if refusal := self._refusal(path, body):
            self.stats["refused"] += 1
            return await _error(send, *refusal)
        self.requests.append(body)
        if body.get("cache_salt"):
            self.cache_salts.append(body["cache_salt"])
        gone = asyncio.Event()
        watcher = asyncio.create_task(_watch_disconnect(receive, gone))
        self.stats["waiting"] += 1
        try:
            async with self._slots:
                self.stats["waiting"] -= 1
                self.stats["running"] += 1
                if self.record:
                    with open(self.record, "a") as out:
                        out.write(json.dumps({"t": time.time(), "body": body}) + "\n")
                try:
                    await self._answer(path, body, gone, send)
                finally:
                    self.stats["running"] -= 1
        finally:
            watcher.cancel()

    async def _answer(self, path: str, body: dict, gone: asyncio.Event, send) -> None:
        chat = path.endswith("chat/completions")
        prompt = _prompt_tokens(body)
        cached = self._cache(body)
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        tokens = [f"t{i} " for i in range(min(limit or self.reply_tokens, self.reply_tokens))]
        reason = "length" if limit is not None and limit < self.reply_tokens else "stop"
        self.stats["prompt_tokens"] += prompt
        ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": len(tokens),
            "total_tokens": prompt + len(tokens),
            "prompt_tokens_details": {"cached_tokens": cached}
            if self.prompt_tokens_details
            else None,
        }
        if not body.get("stream"):
            for _ in tokens:
                await asyncio.sleep(self.token_delay)
            self.stats["generation_tokens"] += len(tokens)
            self.stats["finished"] += 1
            text = "".join(tokens)
            choice = (
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": reason,
                    "logprobs": None,
                }
                if chat
                else {"index": 0, "text": text, "finish_reason": reason, "logprobs": None}
            )
            return await _send_json(
                send,
                200,
                {
                    "id": ident,
                    "object": "chat.completion" if chat else "text_completion",
                    "created": int(time.time()),
                    "model": self.model,
                    "choices": [choice],
                    "usage": usage,
                },
            )
        await self._stream(chat, body, ident, tokens, reason, usage, gone, send)

    def _cache(self, body: dict) -> int:
        """Prompt tokens found in this salt's cache (whole blocks); the prompt is cached then."""
        prompt = body.get("prompt")
        tokens = (
            list(prompt)
            if isinstance(prompt, list)
            else (
                [
                    w
                    for m in body.get("messages") or []
                    if isinstance(m, dict)
                    for w in str(m.get("content", "")).split()
                ]
                if "messages" in body
                else str(prompt or "").split()
            )
        )
        seen = self._cached.setdefault(body.get("cache_salt") or "", set())
        blocks = [tuple(tokens[:end]) for end in range(BLOCK, len(tokens) + 1, BLOCK)]
        hits = sum(BLOCK for prefix in blocks if prefix in seen)
        seen.update(blocks)
        self.stats["cache_queries"] += len(tokens)
        self.stats["cache_hits"] += hits
        return hits

    async def _stream(self, chat, body, ident, tokens, reason, usage, gone, send) -> None:
        base = {
            "id": ident,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.model,
        }

        ids = body.get("return_token_ids")

        def chunk(
            content: str | None,
            finish: str | None = None,
            role: bool = False,
            token_id: int | None = None,
        ) -> bytes:
            if chat:
                delta = (
                    {"role": "assistant", "content": ""}
                    if role
                    else ({"content": content} if content is not None else {})
                )
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                choice = {
                    "index": 0,
                    "text": content or "",
                    "logprobs": None,
                    "finish_reason": finish,
                }
            if ids:
                choice["token_ids"] = [] if token_id is None else [token_id]
            return f"data: {json.dumps({**base, 'choices': [choice]})}\n\n".encode()

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
        out = [chunk(None, role=True)] if chat else []
        for body_part in out:
            await send({"type": "http.response.body", "body": body_part, "more_body": True})
        for index, token in enumerate(tokens):
            await asyncio.sleep(self.token_delay)
            if gone.is_set():  # the client went away: abort, as vLLM does
                self.stats["aborted"] += 1
                return
            self.stats["generation_tokens"] += 1
            await send(
                {
                    "type": "http.response.body",
                    "body": chunk(token, token_id=100 + index),
                    "more_body": True,
                }
            )
        await send({"type": "http.response.body", "body": chunk("", reason), "more_body": True})
        if (body.get("stream_options") or {}).get("include_usage"):
            final = {**base, "choices": [], "usage": usage}
            await send(
                {
                    "type": "http.response.body",
                    "body": f"data: {json.dumps(final)}\n\n".encode(),
                    "more_body": True,
                }
            )
        self.stats["finished"] += 1
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


BLOCK = 16  # tokens per cached block


def _prompt_tokens(body: dict) -> int:
    if isinstance(body.get("messages"), list):
        return sum(_words(m.get("content")) for m in body["messages"] if isinstance(m, dict))
    prompt = body.get("prompt", "")
    return len(prompt) if isinstance(prompt, list) else _words(prompt)


async def _error(send, status: int, error_type: str, message: str) -> None:
    await _send_json(
        send,
        status,
        {"error": {"message": message, "type": error_type, "param": None, "code": status}},
    )


def main(argv: list[str] | None = None) -> None:
    """`serve MODEL` with the flags `vllm serve` takes that matter here."""
    parser = argparse.ArgumentParser(allow_abbrev=False, prog="fake_vllm")
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name")
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--api-key", default="")
    parser.add_argument("--reply-tokens", type=int, default=8)
    parser.add_argument("--token-delay", type=float, default=0.0)
    parser.add_argument("--enable-prompt-tokens-details", action="store_true")
    parser.add_argument("--record", default="")
    args, _ = parser.parse_known_args(argv)  # vLLM's other flags are accepted and ignored
    fake = FakeVllm(
        args.served_model_name or args.model,
        reply_tokens=args.reply_tokens,
        token_delay=args.token_delay,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        api_key=args.api_key,
        host=args.host,
        port=args.port,
        prompt_tokens_details=args.enable_prompt_tokens_details,
        record=args.record,
    ).start()
    print(f"fake vLLM serving {fake.model} on {fake.url}", flush=True)
    try:
        while fake._thread.is_alive():
            time.sleep(0.5)
    except KeyboardInterrupt:
        fake.stop()


if __name__ == "__main__":
    main()
