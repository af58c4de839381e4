"""Streaming through real processes: uvicorn with in-process engines (embedded), and uvicorn in
front of a real Celery GPU worker on Redis and PostgreSQL (distributed)."""

import asyncio
import json
import re
import signal
import uuid

import httpx
import pytest

from tenants.models import UsageRecord
from tests.conftest import child_env, wait_for, workers_live
from tests.routing.conftest import PRICES
from tests.servers import AsgiServer, CeleryWorker

pytestmark = pytest.mark.django_db(transaction=True)

LONG = {
    "model": "small",
    "messages": [{"role": "user", "content": "go on"}],
    "max_tokens": 1500,
    "ignore_eos": True,
    "stream": True,
    "temperature": 0.7,
}


def distributed_env(**overrides) -> dict:
    """A fresh queue namespace, so nothing queued by another test (or run) reaches this one."""
    return child_env(
        FAIRLANE_ENGINE_MODE="celery",
        FAIRLANE_HEARTBEAT_SECONDS="1",
        FAIRLANE_QUEUE_NAMESPACE=f"t{uuid.uuid4().hex[:8]}-",
        **overrides,
    )


@pytest.fixture(scope="module")
def distributed(django_db_setup, django_db_blocker):
    """A GPU worker process and an API process that sends it work through the fair queue."""
    env = distributed_env()
    worker = CeleryWorker(env)
    server = AsgiServer(env)
    yield server, worker
    server.stop()
    worker.stop()


def expected_cost(record) -> int:
    uncached = record.prompt_tokens - record.cached_tokens
    total = (
        uncached * PRICES["price_input_per_mtok"]
        + record.cached_tokens * PRICES["price_cached_per_mtok"]
        + record.completion_tokens * PRICES["price_output_per_mtok"]
    )
    return -(-total // 1_000_000)


async def stream_chat(client: httpx.AsyncClient, key: str, body: dict) -> list[dict]:
    chunks = []
    async with client.stream(
        "POST", "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    ) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                payload = line.removeprefix("data: ")
                if payload == "[DONE]":
                    return chunks
                chunks.append(json.loads(payload))
    raise AssertionError("stream ended without [DONE]")


async def disconnect_after_first_tokens(base_url: str, key: str) -> str:
    async with (
        httpx.AsyncClient(base_url=base_url, timeout=60) as client,
        client.stream(
            "POST", "/v1/chat/completions", json=LONG, headers={"Authorization": f"Bearer {key}"}
        ) as response,
    ):
        request_id = response.headers["x-request-id"]
        seen = 0
        async for line in response.aiter_lines():
            seen += line.startswith("data: ")
            if seen >= 4:
                break  # leaving the block closes the connection mid-stream
    return request_id


def assert_charged_for_what_was_generated(request_id: str) -> UsageRecord:
    record = wait_for(lambda: UsageRecord.objects.filter(request_id=request_id).first())
    assert record.status == UsageRecord.Status.CANCELLED
    assert 0 < record.completion_tokens < LONG["max_tokens"]
    assert record.cost_microcents == expected_cost(record)
    return record


def test_embedded_disconnect_aborts_the_sequence_and_frees_its_blocks(embedded_server, key, slow):
    request_id = asyncio.run(disconnect_after_first_tokens(embedded_server.url, key))
    assert_charged_for_what_was_generated(request_id)

    def kv_used() -> float | None:
        text = httpx.get(embedded_server.url + "/metrics").text
        match = re.search(
            r'fairlane_engine_kv_blocks_used\{model="small",worker="embedded"\} '
            r"(\S+)",
            text,
        )
        return match and float(match[1])

    assert wait_for(lambda: kv_used() == 0.0)


def test_distributed_sixteen_concurrent_streams_batch_together_and_are_metered(
    distributed, key, budget
):
    server, worker = distributed
    body = {**LONG, "model": "tiny", "max_tokens": 48, "stream_options": {"include_usage": True}}

    async def run_all():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            return await asyncio.gather(*(stream_chat(client, key, body) for _ in range(16)))

    streams = asyncio.run(run_all())
    for chunks in streams:
        usage = chunks[-1]["usage"]
        assert usage["completion_tokens"] == 48
        record = UsageRecord.objects.get(request_id=chunks[0]["id"].removeprefix("chatcmpl-"))
        assert (record.prompt_tokens, record.completion_tokens) == (usage["prompt_tokens"], 48)
        assert record.backend.startswith("worker:") and record.cost_microcents == expected_cost(
            record
        )
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        assert len(text) > 0
    assert UsageRecord.objects.count() == 16

    def batched() -> bool:
        beats = [b for b in workers_live() if "tiny" in b["stats"]]
        return any(
            int(size) > 1 for b in beats for size in b["stats"]["tiny"]["batch_seqs_histogram"]
        )

    assert wait_for(batched, timeout=10)


def test_distributed_disconnect_aborts_in_the_worker(distributed, key, slow):
    server, _ = distributed
    request_id = asyncio.run(disconnect_after_first_tokens(server.url, key))
    assert_charged_for_what_was_generated(request_id)

    def blocks_free() -> bool:
        beats = [b for b in workers_live() if "small" in b["stats"]]
        return bool(beats) and all(b["stats"]["small"]["kv_blocks_used"] == 0 for b in beats)

    assert wait_for(blocks_free, timeout=10)


def test_a_cancel_whose_message_was_missed_is_found_by_its_key(distributed, key, slow):
    """Pub/sub delivers at most once (a listener reconnecting misses what is published): the
    worker also looks up the cancel keys of its runs at each heartbeat. The key alone, with
    no message, stops a run, which is charged for what it generated."""
    import redis
    from django.conf import settings

    from workers.transport import cancel_key

    server, _ = distributed

    async def cancel_by_key_only() -> tuple[str, list[str]]:
        async with (
            httpx.AsyncClient(base_url=server.url, timeout=120) as client,
            client.stream(
                "POST",
                "/v1/chat/completions",
                json=LONG,
                headers={"Authorization": f"Bearer {key}"},
            ) as response,
        ):
            request_id, lines = response.headers["x-request-id"], []
            async for line in response.aiter_lines():
                lines.append(line)
                if sum(x.startswith("data: ") for x in lines) == 4:
                    redis.Redis.from_url(settings.REDIS_URL).set(cancel_key(request_id), 1, ex=60)
            return request_id, lines

    request_id, lines = asyncio.run(cancel_by_key_only())
    assert lines[-1] == "data: [DONE]" or any('"finish_reason"' in x for x in lines)
    assert_charged_for_what_was_generated(request_id)


def test_worker_heartbeat_advertises_capabilities_and_load(distributed, key):
    server, _ = distributed
    httpx.post(
        server.url + "/v1/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": "tiny", "prompt": "warm", "max_tokens": 2},
        timeout=60,
    )
    beat = wait_for(lambda: next((b for b in workers_live() if "tiny" in b["stats"]), None))
    tiny = beat["stats"]["tiny"]
    assert beat["capacity"] == 64 and "tiny" in beat["models"]
    assert tiny["max_model_len"] == 1024 and tiny["paged_kv"] and tiny["continuous_batching"]
    assert {"num_running", "num_waiting", "kv_blocks_free", "kv_blocks_used"} <= set(tiny)
    models = httpx.get(
        server.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}
    ).json()["data"]
    assert [m["id"] for m in models] == ["tiny"]  # registered and hosted by a live worker


def test_worker_warm_shutdown_drains_requests_in_flight(django_db_setup, key, slow):
    """SIGTERM stops the worker taking work, but what it runs finishes and is billed."""
    env = distributed_env()
    worker = CeleryWorker(env, name="drain")
    server = AsgiServer(env)
    try:
        body = {**LONG, "max_tokens": 200, "stream_options": {"include_usage": True}}

        async def run():
            chunks = []
            async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
                async with client.stream(
                    "POST",
                    "/v1/chat/completions",
                    json=body,
                    headers={"Authorization": f"Bearer {key}"},
                ) as response:
                    async for line in response.aiter_lines():
                        if line.startswith("data: {"):
                            chunks.append(json.loads(line[6:]))
                            if len(chunks) == 3:
                                worker.proc.send_signal(signal.SIGTERM)  # warm shutdown
            return chunks

        chunks = asyncio.run(run())
        assert chunks[-1]["usage"]["completion_tokens"] == 200
        worker.proc.wait(timeout=60)
        assert worker.proc.returncode == 0
        record = UsageRecord.objects.get()
        assert record.status == UsageRecord.Status.OK and record.completion_tokens == 200
    finally:
        server.stop()
        worker.stop()


def test_a_worker_killed_mid_stream_is_resumed_elsewhere_and_billed_once(
    django_db_setup, key, slow
):
    """Its claim lapses, the fair queue hands the request to another worker, which continues
    each choice after the tokens already streamed: one whole stream, one ledger row."""
    import redis as redis_lib

    env = distributed_env(FAIRLANE_CLAIM_SECONDS="2", FAIRLANE_HEARTBEAT_TTL_SECONDS="2")
    first = CeleryWorker(env, name="doomed")
    server = AsgiServer(env)
    workers = [first]
    body = {**LONG, "max_tokens": 120, "stream_options": {"include_usage": True}}
    try:

        async def run() -> tuple[str, list[dict]]:
            chunks = []
            async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
                async with client.stream(
                    "POST",
                    "/v1/chat/completions",
                    json=body,
                    headers={"Authorization": f"Bearer {key}"},
                ) as response:
                    request_id = response.headers["x-request-id"]
                    async for line in response.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        chunks.append(json.loads(line[6:]))
                        if len(chunks) == 4:
                            first.stop(signal.SIGKILL)
                            workers.append(await asyncio.to_thread(CeleryWorker, env, name="heir"))
            return request_id, chunks

        request_id, chunks = asyncio.run(run())
        assert "error" not in chunks[-1] and chunks[-1]["usage"]["completion_tokens"] == 120
        assert [
            c["choices"][0]["finish_reason"]
            for c in chunks
            if c["choices"] and c["choices"][0]["finish_reason"]
        ] == ["length"]
        record = wait_for(lambda: UsageRecord.objects.filter(request_id=request_id).first())
        assert UsageRecord.objects.count() == 1 and record.status == UsageRecord.Status.OK
        assert record.completion_tokens == 120
        stream = redis_lib.Redis.from_url(env["REDIS_URL"]).xrange(f"fl:gen:{request_id}")
        events = [json.loads(fields[b"e"]) for _, fields in stream]
        assert sum(len(e["token_ids"]) for e in events if e["type"] == "token") == 120
        assert [e["type"] for e in events].count("done") == 1
        assert [e["type"] for e in events].count("accepted") == 2  # two runs, one stream
    finally:
        server.stop()
        for worker in workers:
            worker.stop()


def test_a_flood_holding_every_slot_does_not_make_another_tenant_wait(
    django_db_setup, key, slow, other_api_key
):
    """Fairness inside the batch, over HTTP: a worker of 2 slots runs two long streams of one
    tenant; another tenant's short request is taken beyond the slots (its tenant is under its
    share) and its engine preempts a flood sequence for it, so it ends while the flood still
    streams, instead of waiting for a flood request to finish. The flood is billed for what
    it was sent."""
    env = distributed_env(
        FAIRLANE_ENGINE_MAX_NUM_SEQS="2",
        FAIRLANE_WORKER_CONCURRENCY="2",
        FAIRLANE_REALTIME_RESERVED_SLOTS="0",
        FAIRLANE_FAIR_EXTRA_SLOTS="2",
    )
    worker = CeleryWorker(env, name="fair")
    server = AsgiServer(env)
    quiet_key = other_api_key[1]
    try:

        async def run() -> tuple[list[dict], list[int], list[str]]:
            started = [asyncio.Event(), asyncio.Event()]
            quiet_done = asyncio.Event()
            counts = [0, 0]
            ids: list[str] = []

            async def flood(i: int, client: httpx.AsyncClient) -> None:
                async with client.stream(
                    "POST",
                    "/v1/chat/completions",
                    json=LONG,
                    headers={"Authorization": f"Bearer {key}"},
                ) as response:
                    ids.append(response.headers["x-request-id"])
                    async for line in response.aiter_lines():
                        if line.startswith("data: {"):
                            counts[i] += 1
                            started[i].set()
                            if quiet_done.is_set():
                                return  # leaving closes the connection: the flood is cancelled

            async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
                floods = [asyncio.create_task(flood(i, client)) for i in range(2)]
                await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 120)
                body = {**LONG, "model": "small", "max_tokens": 8, "temperature": 0}
                body["stream_options"] = {"include_usage": True}
                quiet = await stream_chat(client, quiet_key, body)
                # Both flood streams were still open when the quiet answer ended.
                assert not any(task.done() for task in floods)
                quiet_done.set()
                await asyncio.gather(*floods)
            return quiet, counts, ids

        quiet, counts, ids = asyncio.run(run())
        assert quiet[-1]["usage"]["completion_tokens"] == 8
        assert all(0 < n < LONG["max_tokens"] for n in counts)
        for request_id in ids:
            record = wait_for(
                lambda rid=request_id: UsageRecord.objects.filter(request_id=rid).first()
            )
            # What the worker generated, against what the client read before it left.
            sent = (record.status, record.completion_tokens, counts)
            assert record.status == UsageRecord.Status.CANCELLED, sent
            assert 0 < record.completion_tokens < LONG["max_tokens"], sent
            assert record.cost_microcents == expected_cost(record)

        def preempted() -> int:
            beats = [b for b in workers_live() if "small" in b["stats"]]
            return sum(b["stats"]["small"].get("num_fair_preemptions", 0) for b in beats)

        assert wait_for(lambda: preempted() >= 1, timeout=10)
    finally:
        server.stop()
        worker.stop()


def test_a_full_worker_takes_the_next_request_when_one_ends_not_at_its_next_look(
    django_db_setup, tenant, key, slow
):
    """A worker waiting for a slot is woken by its own acknowledgement of a request, not by
    its pull interval (set to a minute here): a standard request queued behind a full worker
    (one standard slot, one kept for realtime) is taken as soon as a slot it may use frees,
    through both waits, the full worker's and the one whose free slot is realtime's."""
    from tenants.models import Scope
    from tenants.services.keys import api_key_create
    from tenants.services.tenancy import agent_create

    realtime = agent_create(tenant=tenant, name="pager", lane="realtime")
    realtime_key = api_key_create(tenant=tenant, agent=realtime, scopes=[Scope.INFERENCE])[1]
    env = distributed_env(
        FAIRLANE_ENGINE_MAX_NUM_SEQS="2",
        FAIRLANE_WORKER_CONCURRENCY="2",
        FAIRLANE_REALTIME_RESERVED_SLOTS="1",
        FAIRLANE_FAIR_EXTRA_SLOTS="0",
        FAIRLANE_PULL_INTERVAL_SECONDS="60",
    )
    worker = CeleryWorker(env, name="bell")
    server = AsgiServer(env)
    body = {**LONG, "max_tokens": 300}
    try:

        async def run() -> list[str]:
            ids: list[str] = []

            async def send(api_key: str, request: dict, started: asyncio.Event) -> None:
                async with client.stream(
                    "POST",
                    "/v1/chat/completions",
                    json=request,
                    headers={"Authorization": f"Bearer {api_key}"},
                ) as response:
                    assert response.status_code == 200
                    ids.append(response.headers["x-request-id"])
                    async for line in response.aiter_lines():
                        if line.startswith("data: {"):
                            started.set()
                    started.set()

            async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
                events = [asyncio.Event() for _ in range(3)]
                # the standard slot, then the realtime one: the worker is full
                first = asyncio.create_task(send(key, body, events[0]))
                await asyncio.wait_for(events[0].wait(), 60)
                second = asyncio.create_task(send(realtime_key, body, events[1]))
                await asyncio.wait_for(events[1].wait(), 60)
                short = {**body, "max_tokens": 4, "stream": True}
                # well before the pull interval's minute, though both long answers end first
                await asyncio.wait_for(send(key, short, events[2]), 40)
                await asyncio.gather(first, second)
            return ids

        ids = asyncio.run(run())
        records = [
            wait_for(lambda rid=rid: UsageRecord.objects.filter(request_id=rid).first())
            for rid in ids
        ]
        assert [r.status for r in records] == [UsageRecord.Status.OK] * 3
        by_tokens = sorted(records, key=lambda r: r.completion_tokens)
        queued, long_ones = by_tokens[0], by_tokens[1:]
        assert queued.completion_tokens == 4
        # it waited for a slot: taken only after a long answer ended
        ended = min(r.timeline["last_token"] for r in long_ones)
        assert queued.timeline["taken"] >= ended, (queued.timeline, ended)
    finally:
        server.stop()
        worker.stop()
