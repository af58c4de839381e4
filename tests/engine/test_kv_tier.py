"""The CPU tier for KV blocks: copied back instead of recomputed, with the same outputs.

On this CPU-only machine both pools are in host memory, so these tests check correctness and
accounting; what the copies cost against recomputing needs a GPU.
"""

from __future__ import annotations

import pytest
import torch

from tests.engine.conftest import assert_no_leaks
from tests.engine.spec_helpers import always, perturbed_copy
from workers.engine import EngineConfig, SamplingParams
from workers.engine.block_manager import block_hash
from workers.engine.config import ModelConfig
from workers.engine.kv_tier import KVTier

SYSTEM = list(range(10, 10 + 64))  # four full blocks
# 40 blocks hold 640 tokens; the 16 prompts need ~1,600 at their peak: preemptions.
PRESSURE = {"num_kv_blocks": 40, "max_num_batched_tokens": 128}


def _sampled() -> list[SamplingParams]:
    return [
        SamplingParams(max_tokens=24, temperature=0.9, top_p=0.95, seed=i, ignore_eos=True)
        for i in range(16)
    ]


def _run(engine, prompts, greedy) -> tuple[list[list[int]], list[list[int]]]:
    """Greedy and seeded sampled outputs of every prompt, each batch under the same pressure."""
    greedy_ids = [o.token_ids for o in engine.generate(prompts, greedy)]
    sampled_ids = [o.token_ids for o in engine.generate(prompts, _sampled())]
    assert_no_leaks(engine)
    return greedy_ids, sampled_ids


def _bytes_per_block(engine) -> int:
    """From the checkpoint's shape, not from the tier: block × layers × K,V × heads × dim × 4."""
    mc = ModelConfig.from_dir(engine.config.model)
    return (
        engine.config.block_size
        * mc.num_hidden_layers
        * 2
        * mc.num_key_value_heads
        * mc.head_dim
        * torch.float32.itemsize
    )


@pytest.mark.parametrize("is_prefix_caching_enabled", [True, False])
def test_preempted_sequences_restored_from_the_tier_equal_recompute(
    make_engine, prompts, greedy, is_prefix_caching_enabled
):
    off = make_engine(**PRESSURE, is_prefix_caching_enabled=is_prefix_caching_enabled)
    on = make_engine(
        **PRESSURE, is_prefix_caching_enabled=is_prefix_caching_enabled, kv_cpu_tier_blocks=256
    )
    expected = _run(off, prompts, greedy)
    assert _run(on, prompts, greedy) == expected
    stats_off, stats_on = off.stats(), on.stats()
    assert stats_off["num_preemptions"] > 0 and stats_on["num_preemptions"] > 0
    assert stats_on["kv_tier_hits"] > 0 and stats_off["kv_tier_hits"] == 0
    # Restored blocks are not recomputed.
    assert stats_on["num_prefill_tokens"] < stats_off["num_prefill_tokens"]


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_speculating_sequences_restored_from_the_tier_equal_recompute(
    make_engine, prompts, greedy, tiny_dir, tmp_path, method
):
    """The draft model recomputes its own cache over restored blocks. Greedy only: seeded
    sampling with speculation already differs between a preempted run and an unpreempted one,
    tier or not (the draws follow the drafts)."""
    draft = perturbed_copy(tiny_dir, tmp_path / "draft", noise=0.15, seed=5)
    spec = always(method, 3, prompt_lookup_min=1, prompt_lookup_max=8, model=str(draft))
    repeating = [p[: len(p) // 2] * 2 for p in prompts if len(p) > 1]  # prompt lookup finds these
    outs = {}
    for tier in (0, 256):
        engine = make_engine(
            **PRESSURE, is_prefix_caching_enabled=False, kv_cpu_tier_blocks=tier, speculative=spec
        )
        outs[tier] = [o.token_ids for o in engine.generate(repeating, greedy)]
        assert_no_leaks(engine)
        stats = engine.stats()
        assert stats["num_preemptions"] > 0 and stats["spec_decode_num_drafts"] > 0
    assert stats["kv_tier_hits"] > 0
    assert outs[256] == outs[0]


def test_prefix_hits_come_from_the_tier_once_the_pool_evicted_them(make_engine):
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    outs, cached = {}, {}
    for tier in (0, 16):
        engine = make_engine(num_kv_blocks=12, kv_cpu_tier_blocks=tier)
        engine.generate([SYSTEM + [1]], params)
        engine.generate([list(range(100, 250))], params)  # 10 blocks: evicts the system prompt
        out = engine.generate([SYSTEM + [3]], params)[0]
        outs[tier], cached[tier] = out.token_ids, out.num_cached_tokens
        assert_no_leaks(engine)
    stats = engine.stats()
    assert cached[0] < 64, "the pool alone kept the whole system prompt: nothing to test"
    assert cached[16] == 64 and stats["prefix_hit_tokens"] == 64
    num_from_tier = (64 - cached[0]) // 16  # the pool evicts the same blocks with the tier on
    assert stats["kv_tier_hits"] == num_from_tier
    assert stats["kv_tier_bytes_restored"] == num_from_tier * _bytes_per_block(engine)
    # Restored blocks are registered in the pool's cache again: the next hit needs no copy.
    assert engine.generate([SYSTEM + [4]], params)[0].num_cached_tokens == 64
    assert engine.stats()["kv_tier_hits"] == num_from_tier
    assert outs[16] == outs[0]


@pytest.mark.parametrize("num_tier_blocks", [256, 4])
def test_tier_counters_follow_the_kv_layout_and_stay_within_its_size(
    make_engine, prompts, greedy, num_tier_blocks
):
    engine = make_engine(**PRESSURE, kv_cpu_tier_blocks=num_tier_blocks)
    for prompt in prompts:
        engine.add_request(prompt, greedy)
    max_used = 0
    while engine.has_unfinished_requests():
        engine.step()
        stats = engine.stats()
        assert stats["kv_tier_blocks_used"] <= stats["kv_tier_blocks_total"] == num_tier_blocks
        max_used = max(max_used, stats["kv_tier_blocks_used"])
    per_block = _bytes_per_block(engine)
    assert engine.tier is not None and engine.tier.bytes_per_block == per_block
    assert stats["kv_tier_blocks_saved"] > 0 and stats["kv_tier_hits"] > 0
    assert stats["kv_tier_bytes_saved"] == stats["kv_tier_blocks_saved"] * per_block
    assert stats["kv_tier_bytes_restored"] == stats["kv_tier_hits"] * per_block
    assert stats["kv_tier_copy_seconds"] > 0
    if num_tier_blocks == 256:  # never full: every block saved still sits there
        assert stats["kv_tier_blocks_evicted"] == 0
        assert stats["kv_tier_blocks_saved"] == stats["kv_tier_blocks_used"] == max_used
    else:
        assert max_used == num_tier_blocks and stats["kv_tier_blocks_evicted"] > 0


def test_tier_evicts_its_least_recently_used_block(make_engine):
    engine = make_engine(num_kv_blocks=8)
    kv = engine.runner.kv_cache  # [layers, 2, kv_heads, num_blocks, block_size, head_dim]
    for block_id in range(8):
        kv[:, :, :, block_id] = float(block_id + 1)
    tier = KVTier(2, kv)
    a, b, c, d = (block_hash(None, [i], "t") for i in range(4))
    tier.save(a, 0, None, (0,), "t")
    tier.save(b, 1, None, (1,), "t")
    tier.flush(kv)
    tier.save(a, 5, None, (0,), "t")  # already held: only marked recently used, no copy
    tier.save(c, 2, None, (2,), "t")  # full: evicts b, the least recently used
    tier.flush(kv)
    assert list(tier.entries) == [a, c]
    assert (tier.num_saved, tier.num_evicted) == (3, 1)
    assert not tier.has(b, None, [1], "t") and tier.has(a, None, [0], "t")
    assert not tier.has(a, None, [9], "t"), "a hit is verified against the tokens"
    for digest, value in ((a, 1.0), (c, 3.0)):
        assert torch.all(tier.storage[:, :, :, tier.entries[digest].slot] == value)
    # A restore copies back and marks the entry recently used; pinned entries are never evicted.
    tier.pin(a)
    tier.restore(a, 6)
    tier.save(d, 3, None, (3,), "t")  # evicts c, not a (pinned, and now the most recent)
    tier.pin(d)
    tier.save(b, 1, None, (1,), "t")  # both pinned: the save is dropped
    tier.flush(kv)
    assert list(tier.entries) == [a, d]
    assert torch.all(kv[:, :, :, 6] == 1.0) and torch.all(kv[:, :, :, 7] == 8.0)
    assert torch.all(tier.storage[:, :, :, tier.entries[d].slot] == 4.0)
    assert (tier.num_restored, tier.num_dropped, tier.num_evicted) == (1, 1, 2)
    assert tier.num_bytes_restored == tier.bytes_per_block == _bytes_per_block(engine)


@pytest.mark.parametrize("is_prefix_caching_enabled", [True, False])
def test_a_full_tier_or_none_falls_back_to_recompute_with_the_same_outputs(
    make_engine, prompts, greedy, is_prefix_caching_enabled
):
    off = make_engine(**PRESSURE, is_prefix_caching_enabled=is_prefix_caching_enabled)
    full = make_engine(
        **PRESSURE, is_prefix_caching_enabled=is_prefix_caching_enabled, kv_cpu_tier_blocks=2
    )
    expected = _run(off, prompts, greedy)
    assert _run(full, prompts, greedy) == expected
    assert off.tier is None
    assert all(v == 0 for k, v in off.stats().items() if k.startswith("kv_tier_"))
    stats = full.stats()
    assert stats["kv_tier_blocks_used"] == 2 and stats["kv_tier_blocks_evicted"] > 0
    assert stats["num_preemptions"] > 0


def test_tier_size_is_checked(tiny_dir):
    with pytest.raises(ValueError, match="kv_cpu_tier_blocks"):
        EngineConfig(model=str(tiny_dir), kv_cpu_tier_blocks=-1)
