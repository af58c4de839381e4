"""Closed-loop HTTP load for gateway benchmarks: N clients, each on its own keep-alive
connection, sending the next chat completion as soon as the last one ended. A plain asyncio
HTTP/1.1 client (uvloop), so the load costs far less CPU than the servers it measures; httpx
at 64 clients would spend more than the gateway under test.

For each request it records the latency to the whole answer and, for streams, to the first
token of content (TTFT)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# A chat chunk's content, an Anthropic text_delta's text, a Responses text delta.
FIRST_TOKEN = re.compile(rb'"(?:content|text|delta)":\s*"w')
# What an answer that arrived whole holds, per API and stream (any of them): chat's [DONE],
# Anthropic's message_stop, the Responses API's last event (incomplete when
# max_output_tokens ended it, as the upstream's answers are); else its usage.
ENDED = {
    ("chat", True): (b"[DONE]",),
    ("messages", True): (b"message_stop",),
    ("responses", True): (b'"type":"response.completed"', b'"type":"response.incomplete"'),
}


@dataclass(slots=True)
class Target:
    name: str
    host: str
    port: int
    key: str
    model: str


@dataclass(slots=True)
class Result:
    completed: int = 0
    errors: int = 0
    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    error_samples: list[str] = field(default_factory=list)


def request_bytes(
    target: Target, *, stream: bool, max_tokens: int = 16, api: str = "chat"
) -> bytes:
    """A chat completion, or the same ask as Anthropic's Messages (`api="messages"`) or of the
    Responses API (`api="responses"`, stored nothing)."""
    prompt = "say something short please"
    body: dict = {
        "model": target.model,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": prompt}],
    }
    if stream:
        body |= {"stream": True}
        if api == "chat":
            body["stream_options"] = {"include_usage": True}
    if api == "responses":
        body = {"model": target.model, "max_output_tokens": max_tokens, "input": prompt}
        body |= {"store": False, "stream": stream}
    raw = json.dumps(body).encode()
    path = {"messages": "/v1/messages", "responses": "/v1/responses"}.get(
        api, "/v1/chat/completions"
    )
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {target.host}:{target.port}\r\n"
        f"Authorization: Bearer {target.key}\r\nContent-Type: application/json\r\n"
        f"Accept: */*\r\nContent-Length: {len(raw)}\r\n\r\n"
    )
    return head.encode() + raw


async def _read_response(
    reader: asyncio.StreamReader, started: float
) -> tuple[int, bytes, float | None, bool]:
    """(status, body, time of the first content token or None, keep-alive)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip().lower()
    first = None
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding") == "chunked":
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            data = await reader.readexactly(size + 2)
            if first is None and FIRST_TOKEN.search(data):
                first = time.perf_counter() - started
            parts.append(data[:-2])
        body = b"".join(parts)
    else:  # read to close
        body = await reader.read()
        return status, body, first, False
    if first is None and FIRST_TOKEN.search(body):
        first = time.perf_counter() - started
    return status, body, first, headers.get("connection") != "close"


async def _client(
    target: Target,
    payload: bytes,
    ended: tuple[bytes, ...],
    stream: bool,
    stop_at: float,
    record_from: float,
    result: Result,
) -> None:
    reader = writer = None
    while time.perf_counter() < stop_at:
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection(target.host, target.port)
            started = time.perf_counter()
            writer.write(payload)
            status, body, first, keep = await _read_response(reader, started)
            elapsed = time.perf_counter() - started
            ok = status == 200 and any(end in body for end in ended)
            # Only answers that started and ended inside the measured window count.
            if started >= record_from and started + elapsed <= stop_at:
                if ok:
                    result.completed += 1
                    result.latencies.append(elapsed)
                    if stream and first is not None:
                        result.ttfts.append(first)
                else:
                    result.errors += 1
                    if len(result.error_samples) < 3:
                        result.error_samples.append(f"{status}: {body[:300]!r}")
            if not keep:
                writer.close()
                writer = None
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            if time.perf_counter() >= record_from:
                result.errors += 1
                if len(result.error_samples) < 3:
                    result.error_samples.append(repr(exc))
            if writer is not None:
                writer.close()
            writer = None
            await asyncio.sleep(0.05)
    if writer is not None:
        writer.close()


async def load_run(
    target: Target,
    *,
    clients: int,
    stream: bool,
    seconds: float,
    warmup: float,
    probe: Callable[[], object] | None = None,
    api: str = "chat",
) -> tuple[Result, float, list]:
    """Run `clients` closed-loop clients for warmup + seconds; only requests started after the
    warm-up count. Returns the result, the measured window's length and, with `probe`, what it
    returned as the window opened and as it closed (CPU counters: the warm-up's CPU would
    otherwise be charged to the measured window's requests)."""
    payload = request_bytes(target, stream=stream, api=api)
    ended = ENDED.get((api, stream), (b'"usage"',))
    result = Result()
    now = time.perf_counter()
    record_from, stop_at = now + warmup, now + warmup + seconds
    samples: list = []

    async def window() -> None:
        for at in (record_from, stop_at):
            while (left := at - time.perf_counter()) > 0:  # the loop's timers round to 1 ms
                await asyncio.sleep(left)
            samples.append(probe())

    clients_done = asyncio.gather(
        *(
            _client(target, payload, ended, stream, stop_at, record_from, result)
            for _ in range(clients)
        )
    )
    await asyncio.gather(clients_done, *([window()] if probe else []))
    return result, seconds, samples


def load(target: Target, **kwargs) -> tuple[Result, float, list]:
    try:
        import uvloop

        return uvloop.run(load_run(target, **kwargs))
    except ImportError:  # uvloop comes with uvicorn[standard]; plain asyncio otherwise
        return asyncio.run(load_run(target, **kwargs))
