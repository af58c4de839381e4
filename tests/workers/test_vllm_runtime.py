"""A model whose runtime is vLLM, hosted by a real GPU worker process as a managed `vllm serve`
child: the fake vLLM server (routing/bench/fake_vllm.py) started through FAIRLANE_VLLM_COMMAND,
behind uvicorn, Redis, PostgreSQL and the fair queue. Streaming and JSON answers with vLLM's
own usage, the tenant's cache salt, abort on disconnect, the load in the heartbeat from vLLM's
/metrics, fairness by weight and budgets, restart after a crash with a backoff, and the drain
on warm shutdown."""

import asyncio
import json
import os
import signal
import sys
import uuid

import httpx
import pytest

from tenants.models import Reservation, Scope, UsageRecord
from tenants.services.budgets import budget_create
from tenants.services.keys import api_key_create
from tenants.services.tenancy import agent_create, tenant_cache_salt, tenant_create
from tests.conftest import child_env, wait_for, workers_live
from tests.routing.conftest import PRICES
from tests.servers import AsgiServer, CeleryWorker
from workers.serving.registration import model_register
from workers.serving.versions import version_promote

pytestmark = pytest.mark.django_db(transaction=True)

REPLY_TOKENS = 400  # the fake's answer when max_tokens allows; token i is "t{i} "


def vllm_env(record) -> dict:
    """A fresh queue namespace; the fake vLLM as the command; one sequence at a time."""
    command = (
        f"{sys.executable} -m routing.bench.fake_vllm serve --reply-tokens "
        f"{REPLY_TOKENS} --token-delay 0.02 --record {record}"
    )
    return child_env(
        FAIRLANE_ENGINE_MODE="distributed",
        FAIRLANE_HEARTBEAT_SECONDS="1",
        FAIRLANE_QUEUE_NAMESPACE=f"t{uuid.uuid4().hex[:8]}-",
        FAIRLANE_VLLM_COMMAND=command,
        FAIRLANE_VLLM_HEALTH_SECONDS="0.5",
        FAIRLANE_ENGINE_MAX_NUM_SEQS="1",
        FAIRLANE_REALTIME_RESERVED_SLOTS="0",
    )


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    """Every request the child started, in order (the fake's --record file)."""
    return tmp_path_factory.mktemp("vllm") / "requests.jsonl"


@pytest.fixture(scope="module")
def pool(django_db_setup, django_db_blocker, record):
    """One GPU worker (its vLLM child runs one sequence at a time) and one API process."""
    env = vllm_env(record)
    worker = CeleryWorker(env, name="vllm")
    WORKER_PIDS[:] = [worker.proc.pid]
    server = AsgiServer(env)
    yield server, worker
    server.stop()
    worker.stop()


# The pid of this module's GPU worker (set by `pool`): heartbeats are read from the test
# Redis, which other workers (another test run's, another xdist worker's copy of this module)
# may share; one of theirs read here once had its child killed by this module's crash test.
WORKER_PIDS: list[int] = []


def beats_mine() -> list[dict]:
    """The heartbeats of this module's worker only (its id is `host:pid`)."""
    return [b for b in workers_live() if int(b["id"].rsplit(":", 1)[1]) in WORKER_PIDS]


def beat_hosting(model="llama"):
    return next((b for b in beats_mine() if model in b["models"]), None)


@pytest.fixture
def llama(pool, record):
    """The `tiny` preset's files, served by vLLM; its child is up once this returns."""
    record.write_text("")
    model_register(name="llama", source="preset:tiny", runtime="vllm", **PRICES)
    wait_for(beat_hosting, what="the vLLM child to be hosted")
    return pool[0]


def key_for(tenant, agent, limit=10**9):
    budget_create(tenant=tenant, agent=agent, limit_microcents=limit)
    return api_key_create(tenant=tenant, agent=agent, scopes=[Scope.INFERENCE])[1]


def started(record) -> list[dict]:
    return [json.loads(line)["body"] for line in record.read_text().splitlines()]


def chat(server, key, timeout=60, **body):
    body = {"model": "llama", "messages": [{"role": "user", "content": "hello there"}], **body}
    return httpx.post(
        server.url + "/v1/chat/completions",
        timeout=timeout,
        json=body,
        headers={"Authorization": f"Bearer {key}"},
    )


def sse(lines) -> list[dict]:
    return [
        json.loads(line[6:])
        for line in lines
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def cost(prompt: int, completion: int, cached: int = 0) -> int:
    total = (
        (prompt - cached) * PRICES["price_input_per_mtok"]
        + completion * PRICES["price_output_per_mtok"]
        + cached * PRICES["price_cached_per_mtok"]
    )
    return -(-total // 1_000_000)


def test_streams_and_answers_through_the_api_with_vllms_usage_and_the_tenants_salt(
    llama, record, tenant, agent, other_tenant, other_agent
):
    key, other_key = key_for(tenant, agent), key_for(other_tenant, other_agent)
    with httpx.stream(
        "POST",
        llama.url + "/v1/chat/completions",
        timeout=60,
        headers={"Authorization": f"Bearer {key}"},
        json={
            "model": "llama",
            "max_tokens": 5,
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "hello there"}],
        },
    ) as response:
        assert response.status_code == 200
        request_id = response.headers["x-request-id"]
        chunks = sse(response.iter_lines())
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "t0 t1 t2 t3 t4 "
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    usage = chunks[-1]["usage"]
    sent = started(record)[-1]
    # vLLM got our tokenizer's token ids, so its prompt count is the registry's own.
    assert isinstance(sent["prompt"], list) and usage["prompt_tokens"] == len(sent["prompt"])
    assert usage["completion_tokens"] == 5 and sent["max_tokens"] == 5
    assert sent["return_token_ids"] is True and sent["stream_options"]["include_usage"]
    assert sent["cache_salt"] == tenant_cache_salt(tenant_id=tenant.pk)
    row = wait_for(lambda: UsageRecord.objects.filter(request_id=request_id).first())
    assert row.backend.startswith("worker:") and row.status == UsageRecord.Status.OK
    assert (row.prompt_tokens, row.completion_tokens) == (usage["prompt_tokens"], 5)
    assert row.cost_microcents == cost(row.prompt_tokens, 5)

    # JSON; a long enough prompt fills cache blocks: the same tenant hits vLLM's prefix cache
    # (charged at the cached price), another tenant with the same prompt does not.
    long = " ".join(f"word{i}" for i in range(60))
    answers = [
        chat(llama, k, max_tokens=3, messages=[{"role": "user", "content": long}])
        for k in (key, key, other_key)
    ]
    assert all(a.status_code == 200 for a in answers), answers[-1].text
    assert answers[1].json()["choices"][0]["message"]["content"] == "t0 t1 t2 "
    cached = [a.json()["usage"]["prompt_tokens_details"]["cached_tokens"] for a in answers]
    assert cached[0] == 0 and cached[1] >= 48 and cached[2] == 0
    assert started(record)[-1]["cache_salt"] == tenant_cache_salt(tenant_id=other_tenant.pk)
    again = UsageRecord.objects.get(request_id=answers[1].headers["x-request-id"])
    assert again.cached_tokens == cached[1]
    assert again.cost_microcents == cost(again.prompt_tokens, 3, cached[1])

    # The heartbeat advertises the runtime, what it can do and its load from vLLM's /metrics.
    stats = wait_for(
        lambda: (s := beat_hosting()["stats"]["llama"])["num_generated_tokens"] >= 14 and s
    )
    assert stats["runtime"] == "vllm" and stats["hidden_states"] is False
    assert stats["prefix_hit_rate"] > 0 and stats["max_num_seqs"] == 1
    models = httpx.get(llama.url + "/v1/models", headers={"Authorization": f"Bearer {key}"})
    assert [m["id"] for m in models.json()["data"]] == ["llama"]
    embed = httpx.post(
        llama.url + "/v1/embeddings",
        json={"model": "llama", "input": "a"},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert embed.status_code == 400 and "vLLM" in embed.json()["error"]["message"]


def test_a_client_that_leaves_aborts_the_childs_stream(llama, tenant, agent):
    key = key_for(tenant, agent)

    def idle():
        stats = beat_hosting()["stats"]["llama"]
        return stats["num_running"] == 0 and stats["in_flight"] == 0 and stats

    # vLLM's own count of generated tokens, from a beat taken with nothing running (so no
    # earlier test's tokens land after it)
    generated = wait_for(idle, what="the vLLM child to be idle")["num_generated_tokens"]
    with httpx.stream(
        "POST",
        llama.url + "/v1/chat/completions",
        timeout=60,
        headers={"Authorization": f"Bearer {key}"},
        json={
            "model": "llama",
            "max_tokens": REPLY_TOKENS,
            "stream": True,
            "messages": [{"role": "user", "content": "go on"}],
        },
    ) as response:
        request_id = response.headers["x-request-id"]
        seen = 0
        for line in response.iter_lines():
            seen += line.startswith("data: ")
            if seen >= 4:
                break  # leaving closes the connection mid-stream

    row = wait_for(lambda: UsageRecord.objects.filter(request_id=request_id).first())
    assert row.status == UsageRecord.Status.CANCELLED
    assert 0 < row.completion_tokens < REPLY_TOKENS / 2

    def stopped():  # a beat taken after this request ran, with nothing running
        stats = idle()
        return stats and stats["num_generated_tokens"] > generated and stats

    later = wait_for(stopped, what="vLLM's sequence to be aborted")["num_generated_tokens"]
    # vLLM stopped when we did: a child left generating would reach all REPLY_TOKENS (400, 8 s);
    # the abort may land a few of its 20 ms tokens after the last one the client got (on a
    # loaded machine 3 more were seen), so up to 25 (half a second) are allowed.
    assert later - generated <= row.completion_tokens + 25
    # The slot is free: the next request is served at once.
    assert chat(llama, key, max_tokens=2).status_code == 200


def test_the_fair_queue_orders_a_vllm_model_by_weight_and_budgets_hold(
    llama, record, tenant, agent, make_user
):
    light = key_for(tenant, agent)
    heavy_tenant = tenant_create(name="Heavy", slug="heavy", owner=make_user("hank"), weight=3)
    heavy = key_for(heavy_tenant, agent_create(tenant=heavy_tenant, name="bot"))
    body = {
        "model": "llama",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "same prompt"}],
    }

    async def burst():
        async with httpx.AsyncClient(base_url=llama.url, timeout=120) as client:

            async def one(key):
                return await client.post(
                    "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
                )

            first = [asyncio.create_task(one(light)) for _ in range(8)]
            await asyncio.sleep(0.4)  # the light tenant's requests are queued first
            second = [asyncio.create_task(one(heavy)) for _ in range(8)]
            return await asyncio.gather(*first, *second)

    assert all(r.status_code == 200 for r in asyncio.run(burst()))
    salts = {
        tenant_cache_salt(tenant_id=tenant.pk): "light",
        tenant_cache_salt(tenant_id=heavy_tenant.pk): "heavy",
    }
    order = [salts[b["cache_salt"]] for b in started(record)]
    assert len(order) == 16
    # FCFS would run every light request first; weight 3 gets about 3 of 4 turns instead,
    # from when its requests arrive (0.4 s after the light ones: a few light ones ran by then,
    # more on a loaded machine).
    since = order.index("heavy")
    assert since < 8, order
    assert order[since : since + 8].count("heavy") >= 5, order

    # A budget that covers two of these requests at their worst case (no prompt cached): the
    # rest are refused up front; what ran is charged by vLLM's counts (cached prompt tokens at
    # the cached price).
    row = UsageRecord.objects.filter(tenant=tenant).first()
    each = cost(row.prompt_tokens, 10)
    poor_tenant = tenant_create(name="Poor", slug="poor", owner=make_user("pete"))
    poor = key_for(
        poor_tenant, agent_create(tenant=poor_tenant, name="bot"), limit=2 * each + each // 2
    )

    async def spend():
        async with httpx.AsyncClient(base_url=llama.url, timeout=120) as client:
            return await asyncio.gather(
                *[
                    client.post(
                        "/v1/chat/completions",
                        json=body,
                        headers={"Authorization": f"Bearer {poor}"},
                    )
                    for _ in range(5)
                ]
            )

    codes = sorted(r.status_code for r in asyncio.run(spend()))
    assert codes == [200, 200, 429, 429, 429]
    rows = UsageRecord.objects.filter(tenant=poor_tenant)
    assert rows.count() == 2 and sum(r.cost_microcents for r in rows) <= 2 * each
    assert all(r.cost_microcents == cost(r.prompt_tokens, 10, r.cached_tokens) for r in rows)
    assert chat(llama, poor, max_tokens=10).json()["error"]["code"] == "budget_exhausted"
    assert not Reservation.objects.filter(status=Reservation.Status.HELD).exists()


def test_a_crashed_child_fails_its_stream_cleanly_and_restarts_with_a_backoff(
    pool, llama, tenant, agent
):
    key = key_for(tenant, agent)
    first_pid = beat_hosting()["stats"]["llama"]["pid"]
    with httpx.stream(
        "POST",
        llama.url + "/v1/chat/completions",
        timeout=60,
        headers={"Authorization": f"Bearer {key}"},
        json={
            "model": "llama",
            "max_tokens": REPLY_TOKENS,
            "stream": True,
            "messages": [{"role": "user", "content": "go on"}],
        },
    ) as response:
        request_id, lines = response.headers["x-request-id"], []
        for line in response.iter_lines():
            lines.append(line)
            if len(sse(lines)) == 4:
                os.kill(first_pid, signal.SIGKILL)
    chunks = sse(lines)
    assert [line for line in lines if line][-1] == "data: [DONE]"
    assert "error" in chunks[-1]  # one clean error, no hang
    row = wait_for(lambda: UsageRecord.objects.filter(request_id=request_id).first())
    assert row.status == UsageRecord.Status.ERROR and 0 < row.completion_tokens < REPLY_TOKENS

    def restarted(previous):
        beat = beat_hosting()
        return beat and beat["stats"]["llama"]["pid"] != previous and beat

    beat = wait_for(lambda: restarted(first_pid), what="a new vLLM child")
    assert chat(llama, key, max_tokens=2).json()["choices"][0]["message"]["content"] == "t0 t1 "

    # It crashes again at once: the second restart waits longer (1 s, then 2 s, ...).
    os.kill(beat["stats"]["llama"]["pid"], signal.SIGKILL)
    failed = wait_for(
        lambda: next(
            (b["failed"]["llama"] for b in beats_mine() if "llama" in b.get("failed", {})), None
        )
    )
    assert failed["attempts"] == 2 and 0 < failed["retry_in"] <= 2
    assert "exited with code -9" in failed["error"]
    wait_for(lambda: restarted(beat["stats"]["llama"]["pid"]), what="the third vLLM child")
    answer = chat(llama, key, max_tokens=2)
    assert answer.status_code == 200, (
        f"{answer.status_code} {answer.text}\n--- API log:\n{llama.output()[-3000:]}"
        f"\n--- worker log:\n{pool[1].output()[-3000:]}"
    )


def fake_children(record) -> list[int]:
    """The pids of this module's `vllm serve` children (the fake, recording to `record`)."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
        except (OSError, ValueError):
            continue
        if "fake_vllm" in cmdline and str(record) in cmdline:
            pids.append(int(entry))
    return pids


def test_a_canary_version_on_vllm_gets_its_own_child_and_a_promotion_drains_the_old(
    llama, tenant, agent, record
):
    """Versions (#17) on the vLLM runtime: a canary is a second `vllm serve` child beside the
    primary's; requests split between them, each answer and ledger row naming its version;
    promoted, the old version's child is stopped once its requests are done."""
    key = key_for(tenant, agent)
    model_register(name="llama", source="preset:tiny", runtime="vllm", version="v1", **PRICES)
    model_register(
        name="llama",
        source="preset:small",
        runtime="vllm",
        version="v2",
        canary_weight=50,
        **PRICES,
    )

    def children() -> dict:
        beat = beat_hosting()
        return beat.get("versions", {}).get("llama", {}) if beat else {}

    wait_for(lambda: set(children()) == {"v1", "v2"}, 90, "both versions' children")
    assert len(fake_children(record)) == 2
    seen = {}
    for i in range(24):  # sticky per conversation: different conversations split
        response = httpx.post(
            llama.url + "/v1/chat/completions",
            timeout=60,
            json={
                "model": "llama",
                "max_tokens": 2,
                "messages": [{"role": "user", "content": f"conversation {i}"}],
            },
            headers={"Authorization": f"Bearer {key}"},
        )
        assert response.status_code == 200, response.text
        seen[response.headers["x-request-id"]] = response.headers["x-fairlane-model-version"]
    assert set(seen.values()) == {"v1", "v2"}, seen
    ledger = dict(
        UsageRecord.objects.filter(request_id__in=seen).values_list("request_id", "model_version")
    )
    assert ledger == seen
    version_promote(name="llama", label="v2")
    wait_for(lambda: set(children()) == {"v2"}, 60, "v1's version dropped after the promotion")
    wait_for(lambda: len(fake_children(record)) == 1, 30, "v1's child process gone")
    response = chat(llama, key, max_tokens=2)
    assert response.headers["x-fairlane-model-version"] == "v2"


def test_warm_shutdown_drains_the_vllm_model_then_stops_its_child(pool, llama, tenant, agent):
    """Last here: it ends the module's worker."""
    worker = pool[1]
    key = key_for(tenant, agent)
    # The heartbeat that names the child's pid (the one the fixture saw may predate the
    # worker's view of this test's registration, under load).
    child = wait_for(
        lambda: ((beat_hosting() or {}).get("stats", {}).get("llama") or {}).get("pid"),
        60,
        "a heartbeat naming the vLLM child",
    )
    chunks = []
    with httpx.stream(
        "POST",
        llama.url + "/v1/chat/completions",
        timeout=60,
        headers={"Authorization": f"Bearer {key}"},
        json={
            "model": "llama",
            "max_tokens": 150,
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "go on"}],
        },
    ) as response:
        for line in response.iter_lines():
            chunks += sse([line])
            if len(chunks) == 3 and line:
                worker.proc.send_signal(signal.SIGTERM)  # warm shutdown
    # It ran to its end. CI saw it end without usage twice: the message carries the whole tail
    # as text (a list there is cut short by pytest's repr), how many chunks came, and both
    # processes' last log lines (which side ended the stream: the API's drain, a run's error).
    tail = (
        f"{len(chunks)} chunks; last 3: {json.dumps(chunks[-3:])}\n"
        f"--- API log:\n{llama.output()[-3000:]}\n--- worker log:\n{worker.output()[-3000:]}"
    )
    assert (chunks[-1].get("usage") or {}).get("completion_tokens") == 150, tail
    assert worker.proc.wait(timeout=60) == 0
    record = UsageRecord.objects.get()
    assert record.status == UsageRecord.Status.OK and record.completion_tokens == 150
    assert not alive(child)  # the worker stopped its child before it exited
