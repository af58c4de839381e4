"""Greedy continuations equal Hugging Face's, however the engine batches, caches or chunks them."""

from __future__ import annotations

import pytest

from tests.engine.conftest import assert_no_leaks


def test_one_at_a_time_equals_hf(make_engine, prompts, hf_greedy, greedy):
    engine = make_engine()
    for p, ref in zip(prompts, hf_greedy, strict=False):
        assert engine.generate([p], greedy)[0].token_ids == ref
    assert_no_leaks(engine)


def test_all_batched_equals_hf(make_engine, prompts, hf_greedy, greedy):
    engine = make_engine(max_num_batched_tokens=4096, is_prefix_caching_enabled=False)
    outs = engine.generate(prompts, greedy)
    assert [o.token_ids for o in outs] == hf_greedy
    assert engine.stats()["batch_seqs_histogram"].get(len(prompts)), (
        "all prompts never ran in one step"
    )
    assert_no_leaks(engine)


def test_prefix_cache_hits_keep_outputs_equal(make_engine, prompts, hf_greedy, greedy):
    engine = make_engine()
    first = engine.generate(prompts, greedy)
    again = engine.generate(prompts, greedy)  # every full prompt block is now cached
    assert [o.token_ids for o in first] == hf_greedy
    assert [o.token_ids for o in again] == hf_greedy
    assert sum(o.num_cached_tokens for o in again) >= sum(
        len(p) // 16 * 16 for p in prompts
    ) - 16 * len(prompts)
    assert engine.stats()["prefix_hit_tokens"] > 0
    assert_no_leaks(engine)


@pytest.mark.parametrize("budget", [7, 32])
def test_chunked_prefill_equals_hf(make_engine, prompts, hf_greedy, greedy, budget):
    engine = make_engine(max_num_batched_tokens=budget, is_prefix_caching_enabled=False)
    outs = engine.generate(prompts, greedy)
    assert [o.token_ids for o in outs] == hf_greedy
    assert_no_leaks(engine)


def test_without_chunked_prefill_equals_hf(make_engine, prompts, hf_greedy, greedy):
    engine = make_engine(max_num_batched_tokens=64, is_chunked_prefill_enabled=False)
    outs = engine.generate(prompts, greedy)
    assert [o.token_ids for o in outs] == hf_greedy
    assert_no_leaks(engine)


@pytest.mark.parametrize("is_prefix_caching_enabled", [False, True])
def test_preemption_under_a_small_pool_equals_hf(
    make_engine, prompts, hf_greedy, greedy, is_prefix_caching_enabled
):
    # 40 blocks hold 640 tokens; the 16 sequences need ~1,600 at their peak.
    engine = make_engine(
        num_kv_blocks=40,
        max_num_batched_tokens=128,
        is_prefix_caching_enabled=is_prefix_caching_enabled,
    )
    outs = engine.generate(prompts, greedy)
    assert engine.stats()["num_preemptions"] > 0
    assert [o.token_ids for o in outs] == hf_greedy
    assert_no_leaks(engine)


def test_mixed_arrivals_equal_hf(make_engine, prompts, hf_greedy, greedy):
    """Requests joining while others decode (the continuous part of continuous batching)."""
    engine = make_engine(max_num_batched_tokens=48)
    results: dict[str, list[int]] = {}
    pending = list(enumerate(prompts))
    ids: dict[str, int] = {}
    while pending or engine.has_unfinished_requests():
        for _ in range(2):
            if pending:
                i, p = pending.pop(0)
                ids[engine.add_request(p, greedy)] = i
        for out in engine.step():
            results.setdefault(out.request_id, []).extend(out.new_token_ids)
    assert [results[rid] for rid in sorted(ids, key=ids.get)] == hf_greedy
    assert_no_leaks(engine)
