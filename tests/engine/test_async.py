"""The threaded front: many streams at once, batched together, cancellable."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tests.engine.conftest import assert_no_leaks
from workers.engine import AsyncEngine, EngineStopped, InvalidRequest, SamplingParams


@pytest.fixture
def front(make_engine):
    engine = AsyncEngine(make_engine()).start()
    yield engine
    engine.shutdown()


async def _collect(front, prompt, params, **kwargs) -> list[int]:
    tokens: list[int] = []
    async for out in front.generate(prompt, params, **kwargs):
        tokens.extend(out.new_token_ids)
    return tokens


async def test_concurrent_streams_equal_hf_and_share_steps(front, prompts, hf_greedy, greedy):
    results = await asyncio.gather(*(_collect(front, p, greedy) for p in prompts))
    assert results == hf_greedy
    stats = front.stats()
    assert stats["batch_seqs_mean"] > 4, "the loop did not batch the streams together"
    assert_no_leaks(front.engine)


async def test_bad_input_raises_in_the_caller_and_loop_keeps_serving(
    front, prompts, hf_greedy, greedy
):
    with pytest.raises(InvalidRequest):
        await _collect(front, "", greedy)
    assert await _collect(front, prompts[3], greedy) == hf_greedy[3]


async def test_cancelled_stream_is_aborted_and_frees_its_blocks(front):
    params = SamplingParams(max_tokens=500, temperature=0, ignore_eos=True)
    seen = asyncio.Event()

    async def consume():
        async for _out in front.generate([5] * 40, params, request_id="gone"):
            seen.set()

    task = asyncio.create_task(consume())
    await seen.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(200):
        if not front.engine.requests and front.stats()["kv_blocks_used"] == 0:
            break
        await asyncio.sleep(0.01)
    assert front.stats()["kv_blocks_used"] == 0
    assert front.stats()["num_finished"].get("abort") == 1


def test_blocking_streams_from_threads(front, prompts, hf_greedy, greedy):
    results: dict[int, list[int]] = {}

    def worker(i: int) -> None:
        results[i] = [
            t for out in front.stream(prompts[i], greedy, timeout=60) for t in out.new_token_ids
        ]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [results[i] for i in range(6)] == hf_greedy[:6]


async def test_embeddings_through_the_front(front, make_engine):
    vector = await front.embed([5, 6, 7, 8], pooling="last")
    assert vector.shape == (front.engine.model_config.hidden_size,)
    direct = make_engine().embed([[5, 6, 7, 8]], pooling="last")[0]
    assert (vector - direct).abs().max() < 1e-5


def test_submitting_after_shutdown_raises(make_engine, greedy):
    front = AsyncEngine(make_engine()).start()
    front.shutdown()
    with pytest.raises(EngineStopped):
        list(front.stream([5, 6], greedy))


def test_a_failing_step_fails_its_requests_and_the_loop_survives(front, greedy, monkeypatch):
    runner = front.engine.runner
    original = runner.execute
    calls = {"n": 0}

    def flaky(batch):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("boom")
        return original(batch)

    monkeypatch.setattr(runner, "execute", flaky)
    with pytest.raises(Exception, match="boom"):
        list(front.stream([5, 6, 7], greedy, timeout=30))
    assert len(list(front.stream([5, 6, 7], greedy, timeout=30))) == greedy.max_tokens
    assert front.stats()["kv_blocks_used"] == 0
