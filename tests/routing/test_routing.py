"""The fall-through chain against fake providers that are real HTTP servers on 127.0.0.1:
chain order, no failover after the first token, circuit breakers, Retry-After, leases,
budgets with paid backends, usage and cost from the providers' own usage."""

import asyncio
import json
import time

import pytest
from channels.db import database_sync_to_async
from django.db import connection
from django.test import AsyncClient

from routing.backend_store import agent_routing_set, backend_model_set, backend_register
from routing.bench.fakes import (
    FakeProvider,
    content_filter,
    cut,
    rate_limit,
    server_error,
    slow_first_byte,
)
from routing.leases import FULL, GRANTED, WAITING, lease_acquire
from routing.models import Backend
from routing.runtimes import runtime_installed
from tenants.models import Reservation, UsageRecord
from tenants.services.budgets import budget_create

pytestmark = pytest.mark.django_db(transaction=True)
PRICES = {
    "price_input_per_mtok": 100_000_000,
    "price_output_per_mtok": 300_000_000,
    "price_cached_per_mtok": 50_000_000,
}  # $1 / $3 / $0.50 per million tokens
KIND = {"openai": "openai", "openrouter": "openrouter", "anthropic": "anthropic"}


def register(name: str, fake: FakeProvider, *, prices=None, model="m", **fields) -> Backend:
    backend = backend_register(
        name=name, kind=KIND[fake.fmt], base_url=fake.url, credential=fake.api_key, **fields
    )
    backend_model_set(backend=backend, model=model, upstream_name="fake-model", **(prices or {}))
    return backend


def chat(key, *, stream=False, model="m", max_tokens=5, content="one two three", **extra):
    body = {
        "model": model,
        "max_tokens": max_tokens,
        "stream": stream,
        "messages": [{"role": "user", "content": content}],
        **extra,
    }
    return AsyncClient().post(
        "/v1/chat/completions",
        json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}"},
    )


async def streamed(response) -> list:
    """The SSE payloads of a streamed response, decoded (the `[DONE]` sentinel as a string)."""
    raw = b"".join([chunk async for chunk in response.streaming_content])
    out = []
    for line in raw.decode().split("\n\n"):
        if line.startswith("data: "):
            payload = line[6:]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def rows():
    return list(UsageRecord.objects.all())


async def test_the_chain_order_is_followed_and_a_failure_falls_through(key, agent, fakes):
    first, second = fakes("openai"), fakes("anthropic")
    first.set_default(server_error(500))
    await database_sync_to_async(register)("first", first)
    await database_sync_to_async(register)("second", second)
    await database_sync_to_async(agent_routing_set)(agent=agent, chain=["first", "second"])
    response = await chat(key)
    assert response.status_code == 200, response.content
    assert response["x-fairlane-backend"] == "second"
    assert json.loads(response.content)["choices"][0]["message"]["content"] == "t0 t1 t2 t3 t4 "
    assert first.stats["requests"] == 1 and second.stats["ok"] == 1

    await database_sync_to_async(agent_routing_set)(agent=agent, chain=["second", "first"])
    response = await chat(key)
    assert response["x-fairlane-backend"] == "second"
    assert first.stats["requests"] == 1 and second.stats["ok"] == 2


async def test_after_the_first_token_the_stream_ends_with_an_error_not_another_backend(
    key, agent, fakes
):
    first, second = fakes("openai"), fakes("openai")
    first.push(cut(after=3))
    await database_sync_to_async(register)("first", first, prices=PRICES)
    await database_sync_to_async(register)("second", second)
    await database_sync_to_async(agent_routing_set)(agent=agent, chain=["first", "second"])
    payloads = await streamed(await chat(key, stream=True))
    text = "".join(
        p["choices"][0]["delta"].get("content") or ""
        for p in payloads
        if isinstance(p, dict) and p.get("choices")
    )
    assert text == "t0 t1 t2 "
    assert payloads[-2]["error"]["code"] == "backend_unavailable" and payloads[-1] == "[DONE]"
    assert second.stats["requests"] == 0
    [row] = await database_sync_to_async(rows)()
    # No usage chunk came: counted here, never zero; the client is charged what it got.
    assert row.status == UsageRecord.Status.ERROR and row.backend == "first"
    assert row.completion_tokens == 3 and row.prompt_tokens > 0 and row.cost_microcents > 0


async def test_a_failure_before_the_first_token_falls_through_even_mid_stream_setup(
    key, agent, fakes
):
    first, second = fakes("openai"), fakes("openai")
    first.push(cut(after=0))  # headers sent, then the connection drops: no token yet
    await database_sync_to_async(register)("first", first)
    await database_sync_to_async(register)("second", second)
    await database_sync_to_async(agent_routing_set)(agent=agent, chain=["first", "second"])
    payloads = await streamed(await chat(key, stream=True))
    assert not any("error" in p for p in payloads if isinstance(p, dict))
    assert second.stats["ok"] == 1
    [row] = await database_sync_to_async(rows)()
    assert row.backend == "second" and row.status == UsageRecord.Status.OK


async def test_the_breaker_opens_then_half_opens_after_the_cooldown(key, agent, fakes, settings):
    settings.FAIRLANE_BREAKER_FAILURES = 2
    settings.FAIRLANE_BREAKER_COOLDOWN_SECONDS = 1.0
    flaky, spare = fakes("openai"), fakes("openai")
    flaky.set_default(server_error(503))
    await database_sync_to_async(register)("flaky", flaky)
    await database_sync_to_async(register)("spare", spare)
    await database_sync_to_async(agent_routing_set)(agent=agent, chain=["flaky", "spare"])
    for _ in range(2):
        assert (await chat(key))["x-fairlane-backend"] == "spare"
    assert flaky.stats["requests"] == 2
    assert (await chat(key))["x-fairlane-backend"] == "spare"
    assert flaky.stats["requests"] == 2  # open: not even tried
    await asyncio.sleep(1.1)
    flaky.set_default(server_error(503))
    assert (await chat(key))["x-fairlane-backend"] == "spare"
    assert flaky.stats["requests"] == 3  # one half-open trial, failed: open again
    assert (await chat(key))["x-fairlane-backend"] == "spare"
    assert flaky.stats["requests"] == 3
    await asyncio.sleep(1.1)
    flaky.reset()  # recovered
    assert (await chat(key))["x-fairlane-backend"] == "flaky"  # the trial succeeds: closed
    assert (await chat(key))["x-fairlane-backend"] == "flaky"
    assert flaky.stats["ok"] == 2


@pytest.mark.parametrize("header", ["retry-after", "retry-after-ms"])
async def test_a_429_is_retried_no_sooner_than_retry_after(key, agent, fakes, settings, header):
    settings.FAIRLANE_RETRY_BACKOFF_SECONDS = 0.05
    only = fakes("openai")
    only.push(
        rate_limit(retry_after=2)
        if header == "retry-after"
        else rate_limit(retry_after=None, retry_after_ms=1500)
    )
    await database_sync_to_async(register)("only", only)
    response = await chat(key)
    assert response.status_code == 200, response.content
    (first, _), (second, _) = only.arrivals
    assert second - first >= (2.0 if header == "retry-after" else 1.5)
    assert only.stats["requests"] == 2


async def test_a_wait_longer_than_we_wait_is_our_503_with_retry_after(key, agent, fakes, settings):
    settings.FAIRLANE_RETRY_MAX_WAIT_SECONDS = 1
    only = fakes("anthropic")
    only.push(rate_limit(retry_after=30))
    await database_sync_to_async(register)("only", only)
    response = await chat(key)
    assert response.status_code == 503
    assert int(response["Retry-After"]) >= 30
    assert json.loads(response.content)["error"]["code"] == "backend_unavailable"
    assert only.stats["requests"] == 1
    assert not await database_sync_to_async(
        Reservation.objects.filter(status=Reservation.Status.HELD).exists
    )()
    # Nobody in this process sends to it before the time it named, even a new request.
    response = await chat(key)
    assert response.status_code == 503 and only.stats["requests"] == 1


async def test_content_filtering_is_surfaced_not_retried_elsewhere(key, agent, fakes):
    for fmt in ("openai", "anthropic"):
        filtering, spare = fakes(fmt), fakes("openai")
        filtering.push(content_filter())
        await database_sync_to_async(register)(f"filtering-{fmt}", filtering)
        await database_sync_to_async(register)(f"spare-{fmt}", spare)
        await database_sync_to_async(agent_routing_set)(
            agent=agent, chain=[f"filtering-{fmt}", f"spare-{fmt}"]
        )
        response = await chat(key)
        assert response.status_code == 400, fmt
        assert json.loads(response.content)["error"]["code"] == "content_filtered"
        assert spare.stats["requests"] == 0


async def test_a_slow_first_byte_past_the_timeout_falls_through(key, agent, fakes):
    slow, fast = fakes("openai"), fakes("openai")
    slow.push(slow_first_byte(3))
    await database_sync_to_async(register)("slow", slow, timeout_seconds=0.5)
    await database_sync_to_async(register)("fast", fast)
    await database_sync_to_async(agent_routing_set)(agent=agent, chain=["slow", "fast"])
    response = await chat(key)
    assert response["x-fairlane-backend"] == "fast"


def test_a_lease_is_exclusive_queues_up_to_its_depth_and_expires():
    leases = runtime_installed().leases
    name = f"scarce-{time.monotonic_ns()}"
    take = {"ttl": 0.5, "slots": 1, "depth": 1, "wait": 5}
    assert leases.try_acquire(name, "a", **take) == GRANTED
    assert leases.try_acquire(name, "b", **take) == WAITING
    assert leases.try_acquire(name, "c", **take) == FULL  # the queue holds one
    assert leases.holders(name) == ["a"]
    time.sleep(0.6)  # a died without releasing: its lease expires, b is next in line
    assert leases.try_acquire(name, "c", **take) == FULL  # b is still waiting ahead of it
    assert leases.try_acquire(name, "b", **take) == GRANTED
    assert leases.try_acquire(name, "c", **take) == WAITING
    leases.release(name, "b")
    assert leases.try_acquire(name, "c", **take) == GRANTED


async def test_lease_acquire_waits_for_a_release_and_gives_up_after_its_wait():
    name = f"scarce-{time.monotonic_ns()}"
    assert await lease_acquire(
        runtime_installed().leases, name, "a", ttl=30, slots=1, depth=4, wait=1
    )
    started = time.monotonic()
    assert not await lease_acquire(
        runtime_installed().leases, name, "b", ttl=30, slots=1, depth=4, wait=0.3
    )
    assert time.monotonic() - started >= 0.3
    asyncio.get_running_loop().call_later(0.2, runtime_installed().leases.release, name, "a")
    assert await lease_acquire(
        runtime_installed().leases, name, "c", ttl=30, slots=1, depth=4, wait=2
    )
    assert runtime_installed().leases.holders(name) == ["c"]


async def test_a_held_lease_sends_the_next_request_down_the_chain(key, agent, fakes):
    scarce, spare = fakes("openai", token_delay=0.1), fakes("openai")
    await database_sync_to_async(register)(
        "scarce", scarce, lease_seconds=30, max_concurrency=1, queue_depth=0
    )
    await database_sync_to_async(register)("spare", spare)
    await database_sync_to_async(agent_routing_set)(agent=agent, chain=["scarce", "spare"])
    holding = await chat(key, stream=True)
    assert holding["x-fairlane-backend"] == "scarce"
    assert runtime_installed().leases.holders("scarce")
    assert (await chat(key))["x-fairlane-backend"] == "spare"
    await streamed(holding)
    assert runtime_installed().leases.holders("scarce") == []  # released when the stream ended
    assert (await chat(key))["x-fairlane-backend"] == "scarce"


async def test_paid_backends_drop_out_once_the_budget_is_spent(key, tenant, agent, fakes):
    paid, free = fakes("openai"), fakes("openai")
    await database_sync_to_async(register)("paid", paid, prices=PRICES)
    await database_sync_to_async(register)("free", free)
    await database_sync_to_async(agent_routing_set)(agent=agent, chain=["paid", "free"])
    await database_sync_to_async(budget_create)(tenant=tenant, agent=agent, limit_microcents=0)
    response = await chat(key)
    assert response["x-fairlane-backend"] == "free" and paid.stats["requests"] == 0
    [row] = await database_sync_to_async(rows)()
    assert row.backend == "free" and row.cost_microcents == 0

    await database_sync_to_async(agent_routing_set)(agent=agent, chain=["paid"])
    response = await chat(key)
    assert response.status_code == 429
    assert json.loads(response.content)["error"]["code"] == "budget_exhausted"
    assert paid.stats["requests"] == 0


@pytest.mark.parametrize("fmt", ["openai", "anthropic", "openrouter"])
async def test_usage_and_cost_come_from_the_provider_cached_tokens_included(key, agent, fakes, fmt):
    fake = fakes(fmt, reply_tokens=7, cached_tokens=2)
    await database_sync_to_async(register)("paid", fake, prices=PRICES)
    payloads = await streamed(
        await chat(
            key,
            stream=True,
            max_tokens=20,
            content="a b c d e f",
            stream_options={"include_usage": True},
        )
    )
    usage = payloads[-2]["usage"]
    [row] = await database_sync_to_async(rows)()
    stats = fake.stats
    assert (
        (row.prompt_tokens, row.completion_tokens, row.cached_tokens)
        == (stats["prompt_tokens"], stats["completion_tokens"], stats["cached_tokens"])
        == (6, 7, 2)
    )
    assert usage["prompt_tokens"] == 6 and usage["completion_tokens"] == 7
    assert usage["prompt_tokens_details"]["cached_tokens"] == 2
    if fmt == "openrouter":  # what OpenRouter says it charged: $1/M in, $2/M out
        assert row.cost_microcents == (6 * 100 + 7 * 200)
    else:  # 4 uncached in at 100, 2 cached at 50, 7 out at 300 micro-cents per token
        assert row.cost_microcents == 4 * 100 + 2 * 50 + 7 * 300


async def test_the_client_never_sees_nor_the_database_stores_the_credential(
    key, agent, fakes, caplog
):
    fake = fakes("openai", api_key="sk-very-secret-123")
    await database_sync_to_async(register)("paid", fake)
    assert (await chat(key)).status_code == 200
    assert fake.last_headers["authorization"] == "Bearer sk-very-secret-123"

    def dump() -> str:
        with connection.cursor() as cursor:
            cursor.execute("SELECT * FROM routing_backend")
            return repr(cursor.fetchall())

    assert "sk-very-secret-123" not in await database_sync_to_async(dump)()
    fake.set_default(server_error(401))
    await chat(key)
    assert "sk-very-secret-123" not in caplog.text


async def test_an_env_reference_is_read_when_used(key, agent, fakes, monkeypatch):
    fake = fakes("anthropic", api_key="sk-ant-from-env")
    monkeypatch.setenv("FAKE_ANTHROPIC_KEY", "sk-ant-from-env")
    backend = await database_sync_to_async(backend_register)(
        name="ant", kind="anthropic", base_url=fake.url, credential_ref="env:FAKE_ANTHROPIC_KEY"
    )
    await database_sync_to_async(backend_model_set)(
        backend=backend, model="m", upstream_name="fake-model"
    )
    response = await chat(key)
    assert response.status_code == 200 and fake.last_headers["x-api-key"] == "sk-ant-from-env"
    monkeypatch.delenv("FAKE_ANTHROPIC_KEY")
    response = await chat(key)
    assert response.status_code == 503  # the operator's problem, said without the secret


async def test_unknown_models_and_unsupported_requests_are_clear_4xx(key, agent, fakes):
    fake = fakes("anthropic")
    await database_sync_to_async(register)("ant", fake)
    response = await chat(key, model="nope")
    assert response.status_code == 404
    response = await chat(key, n=2)  # Anthropic has no n; nothing else serves "m"
    assert response.status_code == 400
    assert fake.stats["requests"] == 0


async def test_a_cascade_answers_from_the_cheap_tier_when_confident_else_escalates(
    key, agent, fakes, settings
):
    settings.FAIRLANE_ROUTING_CACHE_SECONDS = 0  # every registry read goes to the database
    cheap, best = fakes("openai"), fakes("openai")
    cheap.logprob = -2.5  # unsure
    await database_sync_to_async(register)("cheap", cheap, model="small-m", prices=PRICES)
    await database_sync_to_async(register)("best", best, model="big-m", prices=PRICES)
    await database_sync_to_async(agent_routing_set)(
        agent=agent, cascade=["small-m", "big-m"], cascade_threshold=-1.0
    )
    response = await chat(key, model="big-m")
    assert response.status_code == 200 and response["x-fairlane-backend"] == "best"
    assert json.loads(response.content)["model"] == "big-m"
    assert cheap.requests[0]["logprobs"] is True and best.stats["ok"] == 1
    escalated = await database_sync_to_async(rows)()
    assert sorted(r.backend for r in escalated) == ["best", "cheap"]  # both calls are paid for

    cheap.logprob = -0.2  # sure enough
    payloads = await streamed(await chat(key, model="big-m", stream=True))
    text = "".join(
        p["choices"][0]["delta"].get("content") or ""
        for p in payloads
        if isinstance(p, dict) and p.get("choices")
    )
    assert text == "t0 t1 t2 t3 t4 " and payloads[-1] == "[DONE]"
    assert all(p["model"] == "small-m" for p in payloads if isinstance(p, dict))
    assert all(
        p["choices"][0]["logprobs"] is None
        for p in payloads
        if isinstance(p, dict) and p.get("choices")
    )  # not asked for: not sent
    assert best.stats["ok"] == 1  # not asked this time
    response = await chat(key, model="big-m")
    assert response["x-fairlane-cascade"] == "small-m; mean_logprob=-0.2000"


def test_the_official_client_through_a_live_server_to_anthropic(embedded_server, key, agent, fakes):
    import openai

    fake = fakes("anthropic", reply_tokens=4, cached_tokens=1)
    register("claude", fake, prices=PRICES)
    client = openai.OpenAI(api_key=key, base_url=embedded_server.url + "/v1", max_retries=0)
    assert "m" in [m.id for m in client.models.list()]
    reply = client.chat.completions.create(
        model="m",
        max_tokens=10,
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hello there"},
        ],
    )
    assert reply.choices[0].message.content == "t0 t1 t2 t3 "
    assert reply.choices[0].finish_reason == "stop"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (4, 4)
    assert reply.usage.prompt_tokens_details.cached_tokens == 1
    assert fake.requests[-1]["system"] == "be brief"  # Anthropic takes the system prompt apart
    stream = client.chat.completions.create(
        model="m",
        max_tokens=2,
        stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "hello"}],
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "t0 t1 "
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 2
    fake.set_default(server_error(529))  # Anthropic's overloaded_error
    with pytest.raises(openai.InternalServerError) as exc_info:
        client.chat.completions.create(
            model="m", max_tokens=2, messages=[{"role": "user", "content": "hi"}]
        )
    assert exc_info.value.status_code == 503
    assert int(exc_info.value.response.headers["retry-after"]) >= 1


def test_a_client_that_leaves_a_remote_stream_is_charged_for_what_it_got_and_upstream_stops(
    embedded_server, key, agent, fakes
):
    import httpx

    fake = fakes("openai", reply_tokens=200, token_delay=0.05)
    register("paid", fake, prices=PRICES)
    body = {
        "model": "m",
        "max_tokens": 200,
        "stream": True,
        "messages": [{"role": "user", "content": "tell me everything"}],
    }
    received = 0
    with httpx.stream(
        "POST",
        embedded_server.url + "/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    ) as response:
        for line in response.iter_lines():
            if '"content":"t' in line:
                received += 1
            if received == 5:
                break
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not UsageRecord.objects.exists():
        time.sleep(0.1)
    row = UsageRecord.objects.get()
    assert row.status == UsageRecord.Status.CANCELLED and row.backend == "paid"
    assert 5 <= row.completion_tokens < 200 and row.cost_microcents > 0
    assert Reservation.objects.get(request_id=row.request_id).status == "settled"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and fake.stats["in_flight"]:
        time.sleep(0.1)
    assert fake.stats["in_flight"] == 0 and fake.stats["completion_tokens"] < 200


async def test_an_openrouter_cost_above_the_reserved_worst_case_never_overspends(
    key, tenant, agent, fakes
):
    fake = fakes("openrouter", reply_tokens=5)
    fake.price_out_per_mtok_usd = 1_000_000.0  # $1 a token: far above our price table
    await database_sync_to_async(register)("router", fake, prices=PRICES)
    budget = await database_sync_to_async(budget_create)(
        tenant=tenant, agent=agent, limit_microcents=10**8
    )
    assert (await chat(key)).status_code == 200
    [row] = await database_sync_to_async(rows)()
    reservation = await database_sync_to_async(Reservation.objects.get)(request_id=row.request_id)
    assert row.cost_microcents == reservation.amount_microcents  # charged the hold, no more
    window = await database_sync_to_async(budget.windows.get)()
    assert window.spent_microcents == row.cost_microcents <= budget.limit_microcents


async def test_without_max_tokens_each_backend_gets_what_its_context_leaves(
    key, agent, fakes, tiny
):
    """The local `tiny` has a larger context than the remote one; an unset max_tokens must
    not rule the remote one out, and it is sent (and reserved) as what its context leaves."""
    small = fakes("openai", reply_tokens=3)
    await database_sync_to_async(register)(
        "small-ctx", small, model="tiny", context_length=300, prices=PRICES
    )
    await database_sync_to_async(agent_routing_set)(agent=agent, chain=["small-ctx", "local"])
    body = {"model": "tiny", "messages": [{"role": "user", "content": "one two three"}]}
    response = await AsyncClient().post(
        "/v1/chat/completions",
        json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}"},
    )
    assert response.status_code == 200 and response["x-fairlane-backend"] == "small-ctx"
    sent = small.requests[-1]["max_completion_tokens"]
    assert 250 < sent < 300  # the context less the prompt's (worst-case) share


async def test_an_anthropic_stream_cut_midway_is_charged_its_reported_prompt_and_sent_tokens(
    key, agent, fakes
):
    fake = fakes("anthropic", reply_tokens=10)
    fake.push(cut(after=2))
    await database_sync_to_async(register)("claude", fake, prices=PRICES)
    payloads = await streamed(await chat(key, stream=True, content="a b c d e"))
    assert payloads[-2]["error"]["code"] == "backend_unavailable"
    [row] = await database_sync_to_async(rows)()
    assert row.status == UsageRecord.Status.ERROR
    # The prompt as Anthropic counted it in message_start; the 2 tokens sent, counted here.
    assert (
        (row.prompt_tokens, row.completion_tokens)
        == (5, 2)
        == (fake.stats["prompt_tokens"], fake.stats["completion_tokens"])
    )


async def test_each_retry_waits_out_the_retry_after_it_was_given(key, agent, fakes, settings):
    settings.FAIRLANE_RETRIES = 2
    settings.FAIRLANE_RETRY_BACKOFF_SECONDS = 0.05
    only = fakes("openai")
    only.push(rate_limit(retry_after=1), rate_limit(retry_after=1))
    await database_sync_to_async(register)("only", only)
    response = await chat(key)
    assert response.status_code == 200, response.content
    times = [t for t, _ in only.arrivals]
    assert len(times) == 3 and times[1] - times[0] >= 1 and times[2] - times[1] >= 1
