"""The `openai_compatible` backend kind against a fake `vllm serve` (a real HTTP server on
127.0.0.1 speaking vLLM's API), through the real request path: uvicorn, admission, budget
hold, routing, httpx, SSE back to the official client, and the ledger."""

import time

import httpx
import openai
import pytest

from routing.backend_store import backend_model_set, backend_register
from routing.bench.fake_vllm import FakeVllm
from routing.health import backends_probe
from routing.models import Backend
from tenants.models import Reservation, Scope, UsageRecord
from tenants.services.keys import api_key_create

pytestmark = pytest.mark.django_db(transaction=True)
PRICES = {"price_input_per_mtok": 20_000_000, "price_output_per_mtok": 60_000_000}


@pytest.fixture
def vllm():
    with FakeVllm(
        "meta-llama/Llama-3.1-8B-Instruct", reply_tokens=6, api_key="vllm-secret", max_num_seqs=2
    ) as fake:
        yield fake


@pytest.fixture
def registered(vllm):
    backend = backend_register(
        name="vllm-a",
        kind="openai_compatible",
        base_url=vllm.url,
        credential="vllm-secret",
        max_concurrency=64,
    )
    backend_model_set(backend=backend, model="llama", upstream_name=vllm.model, **PRICES)
    return backend


@pytest.fixture
def client(embedded_server, tenant, agent, budget, registered):
    key = api_key_create(tenant=tenant, agent=agent, scopes=[Scope.INFERENCE])[1]
    return openai.OpenAI(api_key=key, base_url=embedded_server.url + "/v1", max_retries=0)


def ledger_row(request_id: str) -> UsageRecord:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        row = UsageRecord.objects.filter(request_id=request_id).first()
        if row:
            return row
        time.sleep(0.05)
    raise AssertionError(f"no ledger row for {request_id}")


def test_streamed_chat_takes_usage_from_vllm_and_is_metered_once(client, vllm):
    raw = client.chat.completions.with_raw_response.create(
        model="llama",
        messages=[{"role": "user", "content": "one two three four"}],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    assert raw.headers["x-fairlane-backend"] == "vllm-a"
    request_id = raw.headers["x-request-id"]
    chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "t0 t1 t2 t3 "
    assert chunks[-1].usage.prompt_tokens == 4 and chunks[-1].usage.completion_tokens == 4
    sent = vllm.requests[-1]
    assert sent["model"] == vllm.model and sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True} and sent["max_tokens"] == 4
    row = ledger_row(request_id)
    assert (row.backend, row.prompt_tokens, row.completion_tokens) == ("vllm-a", 4, 4)
    assert row.cost_microcents == -(-(4 * 20_000_000 + 4 * 60_000_000) // 1_000_000)
    assert Reservation.objects.get(request_id=request_id).status == "settled"
    assert UsageRecord.objects.count() == 1


def test_non_streamed_completion_is_collected_from_the_stream(client, vllm):
    reply = client.completions.create(model="llama", prompt="alpha beta", max_tokens=3)
    assert reply.choices[0].text == "t0 t1 t2 " and reply.choices[0].finish_reason == "length"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (2, 3)
    assert vllm.requests[-1]["prompt"] == "alpha beta"


def test_vllm_sampling_extensions_reach_the_server(client, vllm):
    client.chat.completions.create(
        model="llama",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=2,
        extra_body={"top_k": 5, "min_tokens": 1, "repetition_penalty": 1.1},
    )
    sent = vllm.requests[-1]
    assert (sent["top_k"], sent["min_tokens"], sent["repetition_penalty"]) == (5, 1, 1.1)


def test_a_request_vllm_refuses_is_the_clients_400_and_charges_nothing(client, vllm):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="llama", max_tokens=4000, messages=[{"role": "user", "content": "hi"}]
        )
    assert caught.value.status_code == 400
    assert caught.value.body["code"] == "invalid_request" and vllm.stats["refused"] == 1
    assert all(row.cost_microcents == 0 for row in UsageRecord.objects.all())


def test_a_client_that_leaves_stops_the_vllm_stream(embedded_server, client, vllm):
    vllm.reply_tokens, vllm.token_delay = 400, 0.02
    with httpx.stream(
        "POST",
        embedded_server.url + "/v1/chat/completions",
        timeout=30,
        headers={"Authorization": f"Bearer {client.api_key}"},
        json={
            "model": "llama",
            "stream": True,
            "max_tokens": 400,
            "messages": [{"role": "user", "content": "go"}],
        },
    ) as response:
        request_id = response.headers["x-request-id"]
        seen = 0
        for line in response.iter_lines():
            seen += line.startswith("data: ")
            if seen >= 4:
                break
    deadline = time.monotonic() + 10
    while vllm.stats["aborted"] < 1:
        assert time.monotonic() < deadline, vllm.stats
        time.sleep(0.05)
    assert vllm.stats["running"] == 0 and vllm.stats["generation_tokens"] < 400
    row = ledger_row(request_id)
    assert row.status == UsageRecord.Status.CANCELLED and 0 < row.completion_tokens < 400


def test_the_health_probe_reads_the_model_list_with_the_key(registered, vllm, distributed_runtime):
    backends_probe(pool=distributed_runtime.pool)
    backend = Backend.objects.get(name="vllm-a")
    assert backend.health == "live" and backend.probe_error_rate == 0.0
    vllm.api_key = "rotated"  # our stored key no longer works: the probe says so
    backends_probe(pool=distributed_runtime.pool)
    backend = Backend.objects.get(name="vllm-a")
    assert backend.probe_error_rate > 0 and "authentication failed" in backend.health_detail


def test_the_fake_speaks_vllms_metrics_health_and_cache_salt(vllm):
    assert httpx.get(vllm.url + "/health").status_code == 200
    headers = {"Authorization": "Bearer vllm-secret"}
    body = {
        "model": vllm.model,
        "messages": [{"role": "user", "content": "a b"}],
        "max_tokens": 2,
        "cache_salt": "tenant-42",
    }
    assert (
        httpx.post(vllm.url + "/v1/chat/completions", json=body, headers=headers).status_code == 200
    )
    assert vllm.cache_salts == ["tenant-42"]
    refused = httpx.post(
        vllm.url + "/v1/chat/completions", json={**body, "cache_salt": ""}, headers=headers
    )
    assert refused.status_code == 400 and "cache_salt" in refused.json()["error"]["message"]
    unknown = httpx.post(
        vllm.url + "/v1/chat/completions", json={**body, "model": "x"}, headers=headers
    )
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "NotFoundError"
    metrics = httpx.get(vllm.url + "/metrics").text
    for name in (
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:generation_tokens_total",
    ):
        assert f'{name}{{engine="0",model_name="{vllm.model}"}}' in metrics
    assert f'vllm:prompt_tokens_total{{engine="0",model_name="{vllm.model}"}} 2.0' in metrics
