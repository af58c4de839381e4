"""The KV pool: reference counts, chained hashes, LRU eviction, no leaks."""

from __future__ import annotations

import random

import pytest

from tests.engine.conftest import assert_no_leaks
from workers.engine import SamplingParams
from workers.engine.block_manager import BlockManager, block_hash
from workers.engine.params import SamplingParams as Params
from workers.engine.sequence import Sequence


def _seq(tokens: list[int], salt: str = "a") -> Sequence:
    return Sequence(
        "r", tokens, Params(), tenant=salt, lane="standard", salt=salt, arrival_time=0.0
    )


def _run(bm: BlockManager, seq: Sequence) -> None:
    """Pretend every token of ``seq`` was computed, as the engine does after a step."""
    hits = bm.prefix_lookup(seq)
    bm.allocate(seq, hits)
    bm.append_slots(seq, seq.num_tokens - seq.num_computed_tokens)
    seq.num_computed_tokens = seq.num_tokens
    bm.commit(seq)


def test_hash_chains_parent_tokens_and_salt():
    h = block_hash(None, [1, 2, 3], "a")
    assert h == block_hash(None, [1, 2, 3], "a")
    assert h != block_hash(None, [1, 2, 3], "b")
    assert h != block_hash(None, [1, 2, 4], "a")
    assert block_hash(h, [5], "a") != block_hash(block_hash(None, [9, 9, 9], "a"), [5], "a")


def test_shared_prefix_blocks_are_refcounted_and_freed_last_user():
    bm = BlockManager(16, 4, is_prefix_caching_enabled=True)
    a = _seq(list(range(10)))
    _run(bm, a)
    b = _seq(list(range(8)) + [50, 51, 52])
    _run(bm, b)
    assert b.block_table[:2] == a.block_table[:2]
    assert [bm.blocks[i].ref_count for i in a.block_table[:2]] == [2, 2]
    bm.free(a)
    assert [bm.blocks[i].ref_count for i in b.block_table[:2]] == [1, 1]
    bm.free(b)
    assert bm.num_free_blocks == 16


def test_last_block_is_never_served_from_cache():
    """A prompt exactly one cached block long still computes its last token."""
    bm = BlockManager(8, 4, is_prefix_caching_enabled=True)
    _run(bm, _seq([1, 2, 3, 4, 5]))
    assert bm.prefix_lookup(_seq([1, 2, 3, 4])) == []
    assert len(bm.prefix_lookup(_seq([1, 2, 3, 4, 9]))) == 1


def test_cached_free_blocks_are_evicted_least_recently_used_first():
    bm = BlockManager(4, 2, is_prefix_caching_enabled=True)
    old, new = _seq([1, 2, 3]), _seq([7, 8, 9])
    _run(bm, old)
    bm.free(old)
    _run(bm, new)
    bm.free(new)
    # Two plain blocks go first, then the older cached block; the newer one survives.
    bm.append_slots(filler := _seq([0] * 6), 6)
    assert bm.prefix_lookup(_seq([1, 2, 3])) == []
    assert len(bm.prefix_lookup(_seq([7, 8, 9]))) == 1
    bm.free(filler)


def test_hash_hit_is_verified_against_stored_tokens():
    bm = BlockManager(8, 2, is_prefix_caching_enabled=True)
    seq = _seq([1, 2, 3])
    _run(bm, seq)
    block = bm.blocks[seq.block_table[0]]
    block.token_ids = (1, 99)  # as if two contents collided on one hash
    assert bm.prefix_lookup(_seq([1, 2, 3])) == []


def test_other_salt_never_hits():
    bm = BlockManager(8, 2, is_prefix_caching_enabled=True)
    _run(bm, _seq([1, 2, 3, 4, 5], salt="tenant-a"))
    assert bm.prefix_lookup(_seq([1, 2, 3, 4, 5], salt="tenant-b")) == []
    assert len(bm.prefix_lookup(_seq([1, 2, 3, 4, 5], salt="tenant-a"))) == 2


@pytest.mark.slow
def test_no_block_leaks_after_1000_requests_with_random_aborts(make_engine):
    rng = random.Random(0)
    engine = make_engine(num_kv_blocks=40, max_num_seqs=32, max_num_batched_tokens=256)
    live: list[str] = []
    shared = [rng.randrange(5, 261) for _ in range(48)]
    for i in range(1000):
        prompt = (shared if rng.random() < 0.5 else []) + [
            rng.randrange(5, 261) for _ in range(rng.randint(1, 40))
        ]
        params = SamplingParams(
            max_tokens=rng.randint(1, 12), temperature=rng.choice([0.0, 1.0]), ignore_eos=True
        )
        live.append(engine.add_request(prompt, params, tenant=f"t{i % 3}"))
        if rng.random() < 0.3:
            engine.abort(live.pop(rng.randrange(len(live))))
        if i % 3 == 2:  # requests arrive faster than they finish: the pool runs dry
            for out in engine.step():
                if out.finished and out.request_id in live:
                    live.remove(out.request_id)
            bm = engine.block_manager  # the kept count, against a scan of the free queue
            assert bm.num_cached_free_blocks == sum(
                1 for b in bm.free_queue if bm.blocks[b].hash is not None
            )
    while engine.has_unfinished_requests():
        engine.step()
    finished = engine.stats()["num_finished"]
    assert sum(finished.values()) == 1000 and finished["abort"] > 0
    assert engine.stats()["num_preemptions"] > 0
    assert_no_leaks(engine)
