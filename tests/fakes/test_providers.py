"""The fake providers speak the real wire formats: the official openai client reads the OpenAI and
OpenRouter fakes, and Anthropic's SSE event sequence is checked by hand."""

import asyncio
import contextlib
import json
import time

import httpx
import openai
import pytest

from routing.bench.fakes import (
    FakeProvider,
    content_filter,
    cut,
    rate_limit,
    server_error,
    slow_first_byte,
)

MESSAGES = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": [{"type": "text", "text": "hello there world"}]},
]
ANTHROPIC_HEADERS = {"x-api-key": "sk-fake", "anthropic-version": "2023-06-01"}


@pytest.fixture
def fake():
    with FakeProvider("openai") as provider:
        yield provider


@pytest.fixture
def router():
    with FakeProvider("openrouter") as provider:
        yield provider


@pytest.fixture
def claude():
    with FakeProvider("anthropic") as provider:
        yield provider


def client(provider: FakeProvider, **kwargs) -> openai.OpenAI:
    return openai.OpenAI(base_url=provider.base_url, api_key=provider.api_key, **kwargs)


def sse_data(lines: list[str]) -> list[str]:
    return [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]


def anthropic_events(text: str) -> list[tuple[str, dict]]:
    events = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((fields["event"], json.loads(fields["data"])))
    return events


def test_openai_client_reads_a_completion_with_usage():
    with FakeProvider("openai", reply_tokens=8, cached_tokens=2) as fake:
        reply = client(fake).chat.completions.create(
            model="gpt-x", messages=MESSAGES, max_tokens=5, logprobs=True
        )
    assert reply.object == "chat.completion" and reply.model == "gpt-x"
    assert reply.choices[0].message.content == "t0 t1 t2 t3 t4 "
    assert reply.choices[0].finish_reason == "length"
    assert [lp.logprob for lp in reply.choices[0].logprobs.content] == [-0.1] * 5
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (5, 5)
    assert reply.usage.total_tokens == 10
    assert reply.usage.prompt_tokens_details.cached_tokens == 2
    assert fake.stats["ok"] == 1 and fake.stats["completion_tokens"] == 5
    assert fake.requests[0]["max_tokens"] == 5


def test_openai_client_streams_with_include_usage(fake):
    fake.logprob = -0.5
    chunks = list(
        client(fake).chat.completions.create(
            model="gpt-x",
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
            logprobs=True,
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "".join(f"t{i} " for i in range(8))
    assert chunks[1].choices[0].logprobs.content[0].logprob == -0.5
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == []
    assert chunks[-1].usage.prompt_tokens == 5 and chunks[-1].usage.completion_tokens == 8
    assert all(c.usage is None for c in chunks[:-1])
    assert fake.stats["prompt_tokens"] == 5 and fake.stats["completion_tokens"] == 8


def test_openai_stream_without_include_usage_sends_no_usage(fake):
    with httpx.stream(
        "POST",
        fake.base_url + "/chat/completions",
        headers={"authorization": "Bearer sk-fake"},
        json={"model": "m", "messages": MESSAGES, "stream": True},
    ) as r:
        data = sse_data(list(r.iter_lines()))
    assert data[-1] == "[DONE]"
    assert all("usage" not in json.loads(d) for d in data[:-1])


def test_openrouter_stream_has_comment_and_always_ends_with_cost(router):
    router.price_in_per_mtok_usd, router.price_out_per_mtok_usd = 3.0, 15.0
    with httpx.stream(
        "POST",
        router.base_url + "/chat/completions",
        headers={"authorization": "Bearer sk-fake"},
        json={"model": "m", "messages": MESSAGES, "stream": True, "max_tokens": 3},
    ) as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines[0] == ": OPENROUTER PROCESSING"
    data = sse_data(lines)
    assert data[-1] == "[DONE]"
    final = json.loads(data[-2])
    assert final["choices"] == [] and final["provider"] == "FakeProvider"
    assert final["usage"]["prompt_tokens"] == 5 and final["usage"]["completion_tokens"] == 3
    assert final["usage"]["cost"] == pytest.approx(3.0 * 5 / 1e6 + 15.0 * 3 / 1e6)
    assert final["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert json.loads(data[-3])["choices"][0]["finish_reason"] == "length"


def test_openai_client_ignores_the_openrouter_comment(router):
    chunks = list(client(router).chat.completions.create(model="m", messages=MESSAGES, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).startswith("t0 ")
    assert chunks[-1].usage.completion_tokens == 8


def test_anthropic_stream_event_sequence_and_usage():
    with FakeProvider("anthropic", reply_tokens=3, cached_tokens=1) as claude:
        r = httpx.post(
            claude.base_url + "/messages",
            headers=ANTHROPIC_HEADERS,
            json={
                "model": "claude-x",
                "max_tokens": 100,
                "stream": True,
                "system": "be brief",
                "messages": MESSAGES[1:],
            },
        )
    assert r.headers["content-type"].startswith("text/event-stream")
    events = anthropic_events(r.text)
    assert [name for name, _ in events] == [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert all(data["type"] == name for name, data in events)
    start = events[0][1]["message"]
    assert start["usage"] == {
        "input_tokens": 4,
        "output_tokens": 1,
        "cache_read_input_tokens": 1,
        "cache_creation_input_tokens": 0,
    }
    deltas = [data["delta"]["text"] for name, data in events if name == "content_block_delta"]
    assert "".join(deltas) == "t0 t1 t2 "
    assert events[-2][1]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert events[-2][1]["usage"] == {"output_tokens": 3}


def test_anthropic_message_object(claude):
    r = httpx.post(
        claude.base_url + "/messages",
        headers=ANTHROPIC_HEADERS,
        json={"model": "claude-x", "max_tokens": 2, "messages": MESSAGES[1:]},
    )
    message = r.json()
    assert message["type"] == "message" and message["role"] == "assistant"
    assert message["content"] == [{"type": "text", "text": "t0 t1 "}]
    assert message["stop_reason"] == "max_tokens" and message["stop_sequence"] is None
    assert message["usage"]["input_tokens"] == 3 and message["usage"]["output_tokens"] == 2


def test_anthropic_requires_version_and_max_tokens(claude):
    url = claude.base_url + "/messages"
    r = httpx.post(
        url,
        headers={"x-api-key": "sk-fake"},
        json={"model": "m", "max_tokens": 5, "messages": MESSAGES[1:]},
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(url, headers=ANTHROPIC_HEADERS, json={"model": "m", "messages": MESSAGES[1:]})
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]
    assert claude.stats["by_kind"] == {"invalid": 2}


def test_rate_limit_in_openai_shape_with_retry_headers(fake):
    fake.push(rate_limit(retry_after=2, retry_after_ms=1500))
    with pytest.raises(openai.RateLimitError) as caught:
        client(fake, max_retries=0).chat.completions.create(model="m", messages=MESSAGES)
    assert caught.value.response.headers["retry-after"] == "2"
    assert caught.value.response.headers["retry-after-ms"] == "1500"
    assert caught.value.code == "rate_limit_exceeded" and caught.value.type == "requests"
    assert fake.stats["by_kind"] == {"rate_limit": 1} and fake.stats["ok"] == 0


def test_rate_limit_and_overload_in_anthropic_shape(claude):
    claude.push(rate_limit(retry_after=3), server_error(529))
    body = {"model": "m", "max_tokens": 5, "stream": True, "messages": MESSAGES[1:]}
    r = httpx.post(claude.base_url + "/messages", headers=ANTHROPIC_HEADERS, json=body)
    assert r.status_code == 429 and r.headers["retry-after"] == "3"
    assert "retry-after-ms" not in r.headers
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "rate_limit_error"
    r = httpx.post(claude.base_url + "/messages", headers=ANTHROPIC_HEADERS, json=body)
    assert r.status_code == 529 and r.json()["error"]["type"] == "overloaded_error"


def test_server_error_and_default_behaviour(fake):
    fake.set_default(server_error(503))
    api = client(fake, max_retries=0)
    for _ in range(2):
        with pytest.raises(openai.InternalServerError) as caught:
            api.chat.completions.create(model="m", messages=MESSAGES)
        assert caught.value.status_code == 503 and caught.value.type == "server_error"
    fake.reset()
    assert api.chat.completions.create(model="m", messages=MESSAGES).choices[0].message.content
    assert fake.stats["requests"] == 1 and fake.stats["by_kind"] == {"ok": 1}


def test_cut_stream_ends_without_done_and_counts_only_sent_tokens(router):
    router.push(cut(after=3))
    lines = []
    with (
        pytest.raises(httpx.RemoteProtocolError),
        httpx.stream(
            "POST",
            router.base_url + "/chat/completions",
            headers={"authorization": "Bearer sk-fake"},
            json={"model": "m", "messages": MESSAGES, "stream": True},
        ) as r,
    ):
        for line in r.iter_lines():
            lines.append(line)
    data = [json.loads(d) for d in sse_data(lines)]
    assert "[DONE]" not in sse_data(lines)
    assert [c["choices"][0]["delta"].get("content") for c in data] == ["", "t0 ", "t1 ", "t2 "]
    assert all("usage" not in c for c in data)
    stats = router.stats
    assert (stats["completion_tokens"], stats["prompt_tokens"], stats["ok"]) == (3, 5, 0)
    assert stats["by_kind"] == {"cut": 1}


def test_cut_anthropic_stream_has_no_message_stop(claude):
    claude.push(cut(after=1))
    received = []
    with (
        pytest.raises(httpx.RemoteProtocolError),
        httpx.stream(
            "POST",
            claude.base_url + "/messages",
            headers=ANTHROPIC_HEADERS,
            json={"model": "m", "max_tokens": 9, "stream": True, "messages": MESSAGES[1:]},
        ) as r,
    ):
        for text in r.iter_text():
            received.append(text)
    names = [name for name, _ in anthropic_events("".join(received))]
    assert names == ["message_start", "content_block_start", "ping", "content_block_delta"]
    assert claude.stats["completion_tokens"] == 1


def test_cut_non_streaming_drops_before_the_body(fake):
    fake.push(cut())
    with pytest.raises(openai.APIConnectionError):
        client(fake, max_retries=0).chat.completions.create(model="m", messages=MESSAGES)
    assert fake.stats["completion_tokens"] == 0 and fake.stats["prompt_tokens"] == 5


def test_client_hang_up_stops_the_stream_and_is_not_ok():
    with FakeProvider("openai", reply_tokens=50, token_delay=0.02) as fake:
        with httpx.stream(
            "POST",
            fake.base_url + "/chat/completions",
            headers={"authorization": "Bearer sk-fake"},
            json={"model": "m", "messages": MESSAGES, "stream": True},
        ) as r:
            next(r.iter_lines())
        deadline = time.monotonic() + 5
        while fake.stats["in_flight"] and time.monotonic() < deadline:
            time.sleep(0.01)
        stats = fake.stats
    assert stats["in_flight"] == 0 and stats["ok"] == 0
    assert stats["completion_tokens"] < 50


def test_content_filter_in_openai_shape(fake):
    fake.push(content_filter())
    with pytest.raises(openai.BadRequestError) as caught:
        client(fake, max_retries=0).chat.completions.create(model="m", messages=MESSAGES)
    assert caught.value.code == "content_filter"
    assert caught.value.type == "invalid_request_error"
    assert "content management policy" in caught.value.message


def test_content_filter_is_an_anthropic_refusal(claude):
    claude.push(content_filter(), content_filter())
    body = {"model": "m", "max_tokens": 9, "messages": MESSAGES[1:]}
    message = httpx.post(claude.base_url + "/messages", headers=ANTHROPIC_HEADERS, json=body).json()
    assert message["stop_reason"] == "refusal" and message["content"] == []
    r = httpx.post(
        claude.base_url + "/messages", headers=ANTHROPIC_HEADERS, json={**body, "stream": True}
    )
    events = anthropic_events(r.text)
    assert [name for name, _ in events] == ["message_start", "message_delta", "message_stop"]
    assert events[1][1]["delta"]["stop_reason"] == "refusal"
    assert claude.stats["ok"] == 0 and claude.stats["completion_tokens"] == 0


def test_wrong_key_is_401_in_each_shape(fake, claude):
    with pytest.raises(openai.AuthenticationError) as caught:
        openai.OpenAI(base_url=fake.base_url, api_key="sk-wrong", max_retries=0).models.list()
    assert caught.value.code == "invalid_api_key"
    r = httpx.post(
        claude.base_url + "/messages",
        headers={**ANTHROPIC_HEADERS, "x-api-key": "sk-wrong"},
        json={"model": "m", "max_tokens": 5, "messages": MESSAGES[1:]},
    )
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert claude.stats["by_kind"] == {"unauthorized": 1}


def test_slow_first_byte_delays_the_headers(fake):
    fake.push(slow_first_byte(0.4))
    started = time.monotonic()
    with httpx.stream(
        "POST",
        fake.base_url + "/chat/completions",
        headers={"authorization": "Bearer sk-fake"},
        json={"model": "m", "messages": MESSAGES, "stream": True},
    ) as r:
        assert r.status_code == 200
        assert time.monotonic() - started >= 0.4
        assert sse_data(list(r.iter_lines()))[-1] == "[DONE]"
    assert fake.stats["by_kind"] == {"slow_first_byte": 1} and fake.stats["ok"] == 1


def test_health_probe_takes_no_behaviour(fake, claude):
    fake.models = ["a", "b"]
    fake.push(server_error())
    assert [m.id for m in client(fake).models.list()] == ["a", "b"]
    listing = httpx.get(claude.base_url + "/models", headers=ANTHROPIC_HEADERS).json()
    assert listing["data"][0] == {**listing["data"][0], "type": "model", "id": "fake-model"}
    assert listing["has_more"] is False
    with pytest.raises(openai.InternalServerError):
        client(fake, max_retries=0).chat.completions.create(model="m", messages=MESSAGES)
    assert fake.stats["probes"] == 1 and fake.stats["requests"] == 1
    assert httpx.get(fake.url + "/_stats").json()["probes"] == 1


def test_arrivals_and_headers_are_recorded(fake):
    fake.push(rate_limit(), rate_limit())
    api = client(fake, max_retries=0, default_headers={"x-trace": "abc"})
    for _ in range(3):
        with contextlib.suppress(openai.RateLimitError):
            api.chat.completions.create(model="m", messages=MESSAGES)
    assert [kind for _, kind in fake.arrivals] == ["rate_limit", "rate_limit", "ok"]
    times = [at for at, _ in fake.arrivals]
    assert times == sorted(times)
    assert fake.last_headers["x-trace"] == "abc" and len(fake.requests) == 3


async def test_200_concurrent_streams_complete():
    with FakeProvider("openrouter", token_delay=0.05) as fake:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(
            base_url=fake.base_url,
            limits=limits,
            timeout=30,
            headers={"authorization": "Bearer sk-fake"},
        ) as http:

            async def one(i: int) -> str:
                body = {
                    "model": "m",
                    "stream": True,
                    "messages": [{"role": "user", "content": f"request {i}"}],
                }
                async with http.stream("POST", "/chat/completions", json=body) as r:
                    data = sse_data([line async for line in r.aiter_lines()])
                assert data[-1] == "[DONE]"
                return "".join(
                    c["choices"][0]["delta"].get("content", "")
                    for c in map(json.loads, data[:-1])
                    if c["choices"]
                )

            texts = await asyncio.gather(*(one(i) for i in range(200)))
        stats = fake.stats
    assert set(texts) == {"".join(f"t{i} " for i in range(8))}
    assert stats["ok"] == 200 and stats["completion_tokens"] == 1600
    assert stats["prompt_tokens"] == 400
    assert stats["max_concurrent"] >= 100
