"""KV rollback and the rest of the engine under speculation: exactly the accepted tokens stay,
blocks past them are freed, unverified tokens are never published to the prefix cache, the draft's
cache rolls back, k + 1 slots are reserved without preempting anyone; stops, max_tokens,
min_tokens, abort and adaptivity; no block leaks after 1,000 requests with random aborts."""

from __future__ import annotations

import random

import pytest

from tests.engine.conftest import assert_no_leaks
from tests.engine.spec_helpers import ScriptedProposer, always, perturbed_copy
from workers.engine import SamplingParams
from workers.engine.config import SpeculativeConfig

BLOCK = 4  # small blocks: draft windows cross block boundaries all the time


def _check_kv(engine, seq) -> None:
    """What must hold for a running sequence after every step."""
    bm = engine.block_manager
    assert seq.num_computed_tokens == seq.num_tokens - 1
    assert len(seq.block_table) == -(-seq.num_computed_tokens // BLOCK), (
        "blocks wholly past the accepted tokens"
    )
    for i, block_id in enumerate(seq.block_table):
        block = bm.blocks[block_id]
        if block.hash is not None:  # published: full of verified tokens only
            assert block.token_ids == tuple(seq.token_ids[i * BLOCK : (i + 1) * BLOCK])
            assert (i + 1) * BLOCK <= seq.num_computed_tokens
    assert seq.draft_num_computed <= seq.num_computed_tokens
    assert not seq.spec_token_ids


def _published_prefixes_are_true(engine, streams: dict[str, list[int]]) -> None:
    """Every cached block's tokens are a prefix of some request's real prompt + output."""
    for block in engine.block_manager.blocks:
        if block.hash is None:
            continue
        assert any(
            tuple(s[i : i + BLOCK]) == block.token_ids
            for s in streams.values()
            for i in range(0, len(s), BLOCK)
        )


def test_partial_acceptance_keeps_exactly_the_accepted_tokens(
    make_engine, prompts, hf_greedy, greedy
):
    """Drafts right for ``a`` positions then wrong, for a = 0, 1, 2, 3: only verified KV
    survives."""
    refs = {tuple(p): r for p, r in zip(prompts, hf_greedy, strict=False)}
    calls = []

    def script(seq, k):
        ref = refs[tuple(seq.token_ids[: seq.num_prompt_tokens])]
        done = seq.num_output_tokens
        a = len(calls) % 4
        calls.append(a)
        good = ref[done : done + a]
        return (good + [(t + 1) % 200 + 5 for t in ref[done + len(good) : done + k]])[:k], None

    engine = make_engine(
        block_size=BLOCK,
        num_kv_blocks=600,
        speculative=always("ngram", 4),
        proposer=ScriptedProposer(script),
    )
    ids = {engine.add_request(p, greedy): i for i, p in enumerate(prompts)}
    outs: dict[str, list[int]] = {rid: [] for rid in ids}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outs[out.request_id] += out.new_token_ids
        for seq in engine.scheduler.running:
            if not seq.is_prefilling:
                _check_kv(engine, seq)
        _published_prefixes_are_true(
            engine, {rid: prompts[i] + outs[rid] for rid, i in ids.items()}
        )
    assert [outs[rid] for rid in ids] == hf_greedy
    per_pos = engine.stats()["spec_decode_num_accepted_tokens_per_pos"]
    assert per_pos[0] > per_pos[1] > per_pos[2] > 0 and per_pos[3] == 0
    assert_no_leaks(engine)


def test_draft_cache_rolls_back_with_the_target(
    make_engine, tiny_dir, tmp_path, prompts, hf_greedy, greedy
):
    draft = perturbed_copy(tiny_dir, tmp_path / "draft", noise=0.3, seed=2)
    engine = make_engine(
        block_size=BLOCK, num_kv_blocks=600, speculative=always("draft", 4, model=str(draft))
    )
    ids = [engine.add_request(p, greedy) for p in prompts]
    outs: dict[str, list[int]] = {rid: [] for rid in ids}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outs[out.request_id] += out.new_token_ids
        for seq in engine.scheduler.running:
            if not seq.is_prefilling:
                _check_kv(engine, seq)
    assert [outs[rid] for rid in ids] == hf_greedy
    stats = engine.stats()
    assert 0 < stats["spec_decode_num_accepted_tokens"] < stats["spec_decode_num_draft_tokens"]
    assert_no_leaks(engine)


def test_speculation_never_preempts_for_its_slots(make_engine, prompts):
    """A full pool with room for each decode token but not for drafts: no drafts, no preemption."""
    engine = make_engine(
        block_size=BLOCK,
        num_kv_blocks=10,
        speculative=always("ngram", 4),
        proposer=ScriptedProposer(lambda seq, k: ([5] * k, None)),
    )
    engine.add_request(
        prompts[8][:31], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    )
    engine.add_request(
        prompts[4][:5],
        SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True, is_speculative=False),
    )
    engine.step()  # both prefills: 8 + 2 blocks
    assert engine.block_manager.num_free_blocks == 0
    engine.step()  # each decode token fits its last block; a draft would need a new one
    stats = engine.stats()
    assert stats["num_preemptions"] == 0 and stats["spec_decode_num_drafts"] == 0
    assert stats["num_generated_tokens"] == 4
    while engine.has_unfinished_requests():
        engine.step()
    assert_no_leaks(engine)


@pytest.mark.parametrize("case", ["stop_id", "stop_str", "max_tokens", "min_tokens", "eos"])
def test_stops_and_limits_equal_the_target_alone(make_engine, tiny_dir, prompts, hf_greedy, case):
    """Whatever cuts a sequence short, speculation (every draft accepted) ends it on the same
    token."""
    plain = make_engine(block_size=BLOCK)
    spec = make_engine(block_size=BLOCK, speculative=always("draft", 4, model=str(tiny_dir)))
    for i in (3, 9, 12, 15):
        ref = hf_greedy[i]
        params = {
            "stop_id": SamplingParams(
                max_tokens=24, temperature=0.0, ignore_eos=True, stop_token_ids=[ref[7]]
            ),
            "stop_str": SamplingParams(
                max_tokens=24,
                temperature=0.0,
                ignore_eos=True,
                stop=[plain.tokenizer.decode(ref[5:7])[-1:] or "x"],
                logprobs=1,
            ),
            "max_tokens": SamplingParams(
                max_tokens=1 + i % 7, temperature=0.0, ignore_eos=True, logprobs=0
            ),
            "min_tokens": SamplingParams(
                max_tokens=20, min_tokens=9, temperature=0.0, stop_token_ids=[ref[3]]
            ),
            "eos": SamplingParams(max_tokens=24, temperature=0.0),
        }[case]
        a, b = plain.generate([prompts[i]], params)[0], spec.generate([prompts[i]], params)[0]
        assert (b.token_ids, b.text, b.finish_reason, b.stop_reason) == (
            a.token_ids,
            a.text,
            a.finish_reason,
            a.stop_reason,
        )
        if params.logprobs is not None:
            assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
    assert spec.stats()["spec_decode_num_drafts"] > 0
    assert_no_leaks(spec)


def test_abort_mid_speculation_frees_everything(make_engine, tiny_dir, prompts, greedy):
    engine = make_engine(block_size=BLOCK, speculative=always("draft", 4, model=str(tiny_dir)))
    ids = [engine.add_request(p, greedy) for p in prompts[:8]]
    for _ in range(3):
        engine.step()
    assert engine.stats()["spec_decode_num_drafts"] > 0
    for rid in ids[::2]:
        assert engine.abort(rid)
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out.finish_reason
    assert [finished[rid] for rid in ids[::2]] == ["abort"] * 4
    assert_no_leaks(engine)


def test_adaptive_speculation(make_engine, tiny_dir, tmp_path, prompts, greedy):
    # Above the batch size: off; below it again: on.
    crowded = make_engine(
        speculative=SpeculativeConfig("draft", model=str(tiny_dir), disable_by_batch_size=3)
    )
    crowded.generate(prompts[:8], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    assert crowded.stats()["spec_decode_num_drafts"] == 0
    crowded.generate(prompts[:2], greedy)
    assert crowded.stats()["spec_decode_num_drafts"] > 0
    # A request may opt out.
    engine = make_engine(speculative=always("draft", 4, model=str(tiny_dir)))
    engine.generate(
        prompts[:4],
        SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, is_speculative=False),
    )
    assert engine.stats()["spec_decode_num_drafts"] == 0
    # A draft that is mostly wrong pauses itself, per request.
    bad = perturbed_copy(tiny_dir, tmp_path / "bad", noise=3.0, seed=4)
    config = SpeculativeConfig(
        "draft",
        model=str(bad),
        disable_by_batch_size=None,
        min_acceptance_rate=0.5,
        pause_steps=1000,
    )
    paused = make_engine(speculative=config)
    paused.generate(prompts[:4], SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True))
    stats = paused.stats()
    assert 4 <= stats["spec_decode_num_drafts"] <= 4 * 6, (
        "each request stops drafting once its rate is low"
    )


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_no_block_leaks_after_1000_requests_with_speculation_and_random_aborts(
    make_engine, tiny_dir, method
):
    rng = random.Random(1)
    spec = (
        always("ngram", 4, prompt_lookup_min=1)
        if method == "ngram"
        else always("draft", 3, model=str(tiny_dir))
    )
    engine = make_engine(
        num_kv_blocks=36, max_num_seqs=32, max_num_batched_tokens=256, speculative=spec
    )
    live: list[str] = []
    shared = [rng.randrange(5, 261) for _ in range(48)]
    for i in range(1000):
        unit = [rng.randrange(5, 261) for _ in range(rng.randint(1, 6))]
        prompt = (shared if rng.random() < 0.5 else []) + unit * rng.randint(1, 8)
        params = SamplingParams(
            max_tokens=rng.randint(1, 16),
            temperature=rng.choice([0.0, 1.0]),
            ignore_eos=True,
            seed=rng.choice([None, i]),
        )
        live.append(engine.add_request(prompt, params, tenant=f"t{i % 3}"))
        if rng.random() < 0.3:
            engine.abort(live.pop(rng.randrange(len(live))))
        if i % 3 == 2:
            for out in engine.step():
                if out.finished and out.request_id in live:
                    live.remove(out.request_id)
    while engine.has_unfinished_requests():
        engine.step()
    stats = engine.stats()
    assert sum(stats["num_finished"].values()) == 1000 and stats["num_finished"]["abort"] > 0
    assert stats["spec_decode_num_drafts"] > 0
    if (
        method == "ngram"
    ):  # (draft slots, always reserved here, leave fewer sequences admitted to preempt)
        assert stats["num_preemptions"] > 0
    assert_no_leaks(engine)
