"""A lean OpenAI-format upstream for gateway benchmarks: answers every chat completion at once
with a fixed number of tokens, JSON or SSE (with the usage chunk when asked), and counts the
tokens it served so a benchmark can check a gateway's ledger against it. Its own process, so
it never shares a GIL with the load or the gateway:

    python -m routing.bench.upstream --port 9000 --tokens 16

GET /stats returns {"by_model": {model: {"requests", "prompt_tokens", "completion_tokens"}}}
(the `model` each request named, so one upstream can count several gateways apart); POST
/stats/reset zeroes them. Prompt tokens are the whitespace-separated words of the messages'
contents (as the test
fakes count them), so both sides can compute usage the same way.
"""

from __future__ import annotations

import argparse
import json
import time

TOKEN = "w{} "


async def body_read(receive) -> bytes:
    """An ASGI request's whole body."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


class Upstream:
    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self.counts: dict[str, dict[str, int]] = {}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        body = await body_read(receive)
        if path == "/v1/chat/completions" and method == "POST":
            await self._chat(json.loads(body), send)
        elif path == "/v1/models":
            await _json(
                send,
                200,
                {
                    "object": "list",
                    "data": [
                        {"id": "fake-model", "object": "model", "created": 0, "owned_by": "bench"}
                    ],
                },
            )
        elif path == "/stats":
            await _json(send, 200, {"by_model": self.counts})
        elif path == "/stats/reset" and method == "POST":
            self.counts = {}
            await _json(send, 200, {"by_model": self.counts})
        else:
            await _json(
                send, 404, {"error": {"message": "not found", "type": "invalid_request_error"}}
            )

    async def _chat(self, request: dict, send) -> None:
        prompt = sum(len(str(m.get("content", "")).split()) for m in request.get("messages", []))
        completion = min(
            self.tokens,
            request.get("max_tokens") or request.get("max_completion_tokens") or self.tokens,
        )
        counts = self.counts.setdefault(
            str(request.get("model")), {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0}
        )
        counts["requests"] += 1
        counts["prompt_tokens"] += prompt
        counts["completion_tokens"] += completion
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        base = {
            "id": f"chatcmpl-{counts['requests']}",
            "created": int(time.time()),
            "model": request.get("model", "fake-model"),
        }
        text = [TOKEN.format(i) for i in range(completion)]
        if not request.get("stream"):
            await _json(
                send,
                200,
                {
                    **base,
                    "object": "chat.completion",
                    "usage": usage,
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "length",
                            "message": {"role": "assistant", "content": "".join(text)},
                        }
                    ],
                },
            )
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream"),
                    (b"cache-control", b"no-cache"),
                ],
            }
        )
        chunk = {**base, "object": "chat.completion.chunk"}
        events = [
            {
                **chunk,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "finish_reason": None,
                    }
                ],
            }
        ]
        events += [
            {**chunk, "choices": [{"index": 0, "delta": {"content": t}, "finish_reason": None}]}
            for t in text
        ]
        events.append({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        if (request.get("stream_options") or {}).get("include_usage"):
            events.append({**chunk, "choices": [], "usage": usage})
        for event in events:
            await send(
                {
                    "type": "http.response.body",
                    "more_body": True,
                    "body": b"data: " + json.dumps(event).encode() + b"\n\n",
                }
            )
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


async def _json(send, status: int, payload: dict) -> None:
    body = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    import uvicorn

    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--tokens", type=int, default=16)
    args = p.parse_args()
    uvicorn.run(
        Upstream(args.tokens),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        access_log=False,
        loop="uvloop",
        http="httptools",
        lifespan="off",
    )


if __name__ == "__main__":
    main()
