"""Speculative greedy output is token-identical to the target alone and to Hugging Face, however
the engine batches, caches, chunks or preempts; verification keeps exactly the accepted tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.engine.conftest import NUM_NEW_TOKENS, assert_no_leaks
from tests.engine.spec_helpers import always, perturbed_copy
from workers.engine import SamplingParams

METHODS = ["ngram", "draft", "draft_self"]


@pytest.fixture(scope="module")
def spec_prompts(prompts) -> list[list[int]]:
    """32 prompts: the 16 shared ones, and 16 that repeat themselves (prompt lookup finds
    matches)."""
    g = torch.Generator().manual_seed(99)
    repeating = []
    for n in range(16):
        unit = torch.randint(5, 261, (3 + n,), generator=g).tolist()
        repeating.append((unit * (1 + 60 // len(unit)))[: 20 + 7 * n])
    return prompts + repeating


@pytest.fixture(scope="module")
def spec_refs(hf_model, prompts, hf_greedy, spec_prompts) -> list[list[int]]:
    refs = list(hf_greedy)
    for p in spec_prompts[len(prompts) :]:
        ids = torch.tensor([p])
        out = hf_model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=NUM_NEW_TOKENS,
            do_sample=False,
            pad_token_id=0,
        )
        refs.append(out[0, len(p) :].tolist())
    return refs


@pytest.fixture(scope="module")
def draft_dir(tiny_dir: Path, tmp_path_factory) -> Path:
    return perturbed_copy(
        tiny_dir, tmp_path_factory.mktemp("draft") / "tiny-jittered", noise=0.15, seed=5
    )


@pytest.fixture
def make_spec_engine(make_engine, tiny_dir, draft_dir):
    def make(method: str, k: int = 4, **overrides):
        if method == "ngram":
            spec = always("ngram", k, prompt_lookup_min=1, prompt_lookup_max=8)
        else:
            spec = always("draft", k, model=str(tiny_dir if method == "draft_self" else draft_dir))
        return make_engine(speculative=spec, **overrides)

    return make


def _assert_speculated(engine, method: str) -> None:
    stats = engine.stats()
    assert stats["spec_decode_num_drafts"] > 0, "nothing was speculated"
    accepted, drafted = (
        stats["spec_decode_num_accepted_tokens"],
        stats["spec_decode_num_draft_tokens"],
    )
    assert accepted > 0
    if method == "draft":  # ragged: some drafts rejected, some accepted
        assert accepted < drafted


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_speculative_one_at_a_time_equals_hf(
    make_spec_engine, spec_prompts, spec_refs, greedy, method
):
    engine = make_spec_engine(method)
    for p, ref in zip(spec_prompts, spec_refs, strict=False):
        assert engine.generate([p], greedy)[0].token_ids == ref
    _assert_speculated(engine, method)
    assert_no_leaks(engine)


@pytest.mark.parametrize("method", METHODS)
def test_speculative_batched_equals_hf(make_spec_engine, spec_prompts, spec_refs, greedy, method):
    engine = make_spec_engine(method, max_num_batched_tokens=8192, is_prefix_caching_enabled=False)
    outs = engine.generate(spec_prompts, greedy)
    assert [o.token_ids for o in outs] == spec_refs
    _assert_speculated(engine, method)
    if method == "draft_self":  # the target as its own draft: everything accepted, bonus tokens too
        stats = engine.stats()
        assert stats["spec_decode_num_accepted_tokens"] == stats["spec_decode_num_draft_tokens"]
    assert_no_leaks(engine)


@pytest.mark.parametrize("method", METHODS)
def test_speculative_with_prefix_cache_hits_equals_hf(
    make_spec_engine, spec_prompts, spec_refs, greedy, method
):
    engine = make_spec_engine(method)
    first = engine.generate(spec_prompts, greedy)
    again = engine.generate(spec_prompts, greedy)
    assert [o.token_ids for o in first] == spec_refs
    assert [o.token_ids for o in again] == spec_refs
    assert sum(o.num_cached_tokens for o in again) > 0
    _assert_speculated(engine, method)
    assert_no_leaks(engine)


@pytest.mark.parametrize("method", ["ngram", "draft"])
@pytest.mark.parametrize("budget", [7, 32])
def test_speculative_with_chunked_prefill_equals_hf(
    make_spec_engine, spec_prompts, spec_refs, greedy, method, budget
):
    engine = make_spec_engine(
        method, max_num_batched_tokens=budget, is_prefix_caching_enabled=False
    )
    outs = engine.generate(spec_prompts, greedy)
    assert [o.token_ids for o in outs] == spec_refs
    _assert_speculated(engine, method)
    assert_no_leaks(engine)


@pytest.mark.parametrize("method", METHODS)
def test_speculative_under_preemption_equals_hf(
    make_spec_engine, spec_prompts, spec_refs, greedy, method
):
    engine = make_spec_engine(method, num_kv_blocks=48, max_num_batched_tokens=128)
    outs = engine.generate(spec_prompts, greedy)
    assert engine.stats()["num_preemptions"] > 0
    assert [o.token_ids for o in outs] == spec_refs
    _assert_speculated(engine, method)
    assert_no_leaks(engine)


def test_speculative_requests_arriving_mid_run_equal_hf(
    make_spec_engine, spec_prompts, spec_refs, greedy
):
    engine = make_spec_engine("draft", max_num_batched_tokens=48)
    results: dict[str, list[int]] = {}
    order: dict[str, int] = {}
    pending = list(enumerate(spec_prompts))
    while pending or engine.has_unfinished_requests():
        for _ in range(3):
            if pending:
                i, p = pending.pop(0)
                order[engine.add_request(p, greedy)] = i
        for out in engine.step():
            results.setdefault(out.request_id, []).extend(out.new_token_ids)
    assert [results[rid] for rid in sorted(order, key=order.get)] == spec_refs
    assert_no_leaks(engine)


def test_speculative_logprobs_equal_the_targets(make_engine, make_spec_engine, spec_prompts):
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, logprobs=3)
    plain = make_engine().generate(spec_prompts[16:24], params)
    engine = make_spec_engine("draft")
    spec = engine.generate(spec_prompts[16:24], params)
    _assert_speculated(engine, "draft")
    for a, b in zip(plain, spec, strict=False):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(
            torch.tensor(b.logprobs), torch.tensor(a.logprobs), atol=1e-4, rtol=0
        )
        assert [set(t) for t in a.top_logprobs] == [set(t) for t in b.top_logprobs]


def test_speculative_streams_every_token_once_with_text(
    make_spec_engine, spec_prompts, spec_refs, greedy
):
    engine = make_spec_engine("draft_self")
    rid = engine.add_request(spec_prompts[20], greedy)
    tokens, text, sizes = [], "", []
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.request_id == rid
            tokens += out.new_token_ids
            text += out.new_text
            sizes.append(len(out.new_token_ids))
    assert tokens == spec_refs[20]
    assert max(sizes) > 1, "no step emitted more than one token"
    assert text == engine.tokenizer.decode(tokens)
