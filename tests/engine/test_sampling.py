"""Sampling: seeds reproduce, filters never leak, stops and limits end requests as asked."""

from __future__ import annotations

import torch

from workers.engine import SamplingParams
from workers.engine.params import SamplingParams as Params
from workers.engine.sampler import Sampler
from workers.engine.sequence import Sequence


def _seqs(params: Params, n: int) -> list[Sequence]:
    return [
        Sequence(str(i), [5], params, tenant="t", lane="standard", salt="t", arrival_time=0.0)
        for i in range(n)
    ]


def test_seeded_sampling_reproduces_whatever_the_batch(make_engine, prompts):
    params = SamplingParams(max_tokens=20, temperature=1.0, top_p=0.95, seed=42, ignore_eos=True)
    alone = make_engine().generate([prompts[8]], params)[0].token_ids
    crowd_params = [SamplingParams(max_tokens=20, temperature=0.9, ignore_eos=True)] * 6 + [params]
    crowd = make_engine(seed=7).generate(prompts[2:8] + [prompts[8]], crowd_params)[-1].token_ids
    assert alone == crowd
    other_seed = (
        make_engine()
        .generate([prompts[8]], SamplingParams(max_tokens=20, seed=43, ignore_eos=True))[0]
        .token_ids
    )
    assert other_seed != alone


def test_unseeded_sampling_follows_the_engine_seed(make_engine, prompts):
    params = SamplingParams(max_tokens=16, temperature=1.0, ignore_eos=True)
    a = [o.token_ids for o in make_engine(seed=5).generate(prompts[:4], params)]
    b = [o.token_ids for o in make_engine(seed=5).generate(prompts[:4], params)]
    assert a == b


def test_top_k_never_leaves_its_support():
    logits = torch.randn(1, 261, generator=torch.Generator().manual_seed(0)).repeat(4000, 1)
    allowed = set(logits[0].topk(7).indices.tolist())
    result = Sampler(seed=0)(logits, _seqs(Params(temperature=1.5, top_k=7), 4000), ())
    assert set(result.token_ids) <= allowed
    assert len(set(result.token_ids)) == 7  # and all of the support is reachable


def test_top_p_never_leaves_the_nucleus_and_keeps_its_proportions():
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.2, -1.0, -3.0]]).repeat(20000, 1)
    probs = torch.softmax(logits[0], dim=-1)
    # top_p=0.8: the nucleus is the smallest prefix (by probability) whose mass reaches 0.8.
    nucleus = int((probs.cumsum(0) < 0.8).sum()) + 1
    result = Sampler(seed=1)(logits, _seqs(Params(temperature=1.0, top_p=0.8), 20000), ())
    counts = torch.bincount(torch.tensor(result.token_ids), minlength=6).float()
    assert counts[nucleus:].sum() == 0
    expected = probs[:nucleus] / probs[:nucleus].sum()
    torch.testing.assert_close(counts[:nucleus] / counts.sum(), expected, atol=0.015, rtol=0)


def test_top_k_and_top_p_together_and_tiny_temperature():
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(2)).repeat(3000, 1)
    order = logits[0].argsort(descending=True)
    result = Sampler(seed=2)(logits, _seqs(Params(temperature=0.7, top_k=10, top_p=0.5), 3000), ())
    assert set(result.token_ids) <= set(order[:10].tolist())
    cold = Sampler(seed=2)(logits[:50], _seqs(Params(temperature=1e-4), 50), ())
    assert set(cold.token_ids) == {int(order[0])}


def test_engine_top_k_tokens_are_within_hf_top_k(make_engine, hf_model, prompts):
    params = SamplingParams(max_tokens=16, temperature=2.0, top_k=3, ignore_eos=True, seed=9)
    for p, out in zip(prompts[3:7], make_engine().generate(prompts[3:7], params), strict=False):
        with torch.no_grad():
            logits = hf_model(torch.tensor([p + out.token_ids])).logits[0, len(p) - 1 : -1]
        top3 = logits.topk(3).indices
        assert all(t in row.tolist() for t, row in zip(out.token_ids, top3, strict=False))


def test_stop_token_ids_eos_and_max_tokens_set_finish_reasons(make_engine, prompts, hf_greedy):
    engine = make_engine()
    ref = hf_greedy[10]
    stop_token = ref[5]
    first = ref.index(stop_token)
    out = engine.generate(
        [prompts[10]], SamplingParams(max_tokens=24, temperature=0, stop_token_ids=[stop_token])
    )[0]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop_token)
    assert out.token_ids == ref[: first + 1]
    out = engine.generate([prompts[10]], SamplingParams(max_tokens=4, temperature=0))[0]
    assert (out.finish_reason, len(out.token_ids)) == ("length", 4)
    out = engine.generate(
        [prompts[10]],
        SamplingParams(max_tokens=8, temperature=0, min_tokens=8, stop_token_ids=[stop_token]),
    )[0]
    assert len(out.token_ids) == 8 and stop_token not in out.token_ids


def test_stop_string_truncates_text_and_is_never_streamed(make_engine):
    engine = make_engine()
    text = engine.generate(
        ["Hello"], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    )[0].text
    stop = text[10:13]
    assert len(stop) == 3
    cut = text.index(stop)
    rid = engine.add_request(
        "Hello", SamplingParams(max_tokens=30, temperature=0, ignore_eos=True, stop=[stop])
    )
    streamed, final = "", None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id == rid:
                streamed += out.new_text
                final = out
    assert streamed == text[:cut]
    assert (final.finish_reason, final.stop_reason) == ("stop", stop)
    with_stop = engine.generate(
        ["Hello"],
        SamplingParams(
            max_tokens=30,
            temperature=0,
            ignore_eos=True,
            stop=[stop],
            include_stop_str_in_output=True,
        ),
    )[0]
    assert with_stop.text == text[: cut + 3]


def test_streamed_text_equals_decoded_tokens(make_engine):
    engine = make_engine()
    params = SamplingParams(max_tokens=40, temperature=1.0, seed=3, ignore_eos=True)
    rid = engine.add_request("héllo wörld, 日本語", params)
    text, ids = "", []
    while engine.has_unfinished_requests():
        for out in engine.step():
            text += out.new_text
            ids += out.new_token_ids
    assert text == engine.tokenizer.decode(ids)
    assert rid


def test_repetition_penalty_equals_hf(make_engine, hf_model, prompts):
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, repetition_penalty=1.3)
    for p, out in zip(prompts[4:8], make_engine().generate(prompts[4:8], params), strict=False):
        ids = torch.tensor([p])
        ref = hf_model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=16,
            do_sample=False,
            repetition_penalty=1.3,
            pad_token_id=0,
        )[0, len(p) :].tolist()
        assert out.token_ids == ref


def test_presence_and_frequency_penalties_shift_logits_by_output_counts():
    logits = torch.tensor([[3.0, 2.9, 2.8, 0.0]])
    seq = _seqs(Params(temperature=0, presence_penalty=0.5, frequency_penalty=0.2), 1)[0]
    seq.token_ids += [0, 0, 1]  # outputs: token 0 twice, token 1 once
    # 3.0 - 0.5 - 0.4 = 2.1, 2.9 - 0.5 - 0.2 = 2.2, 2.8 untouched: token 2 wins.
    assert Sampler(seed=0)(logits, [seq], ()).token_ids == [2]
    plain = _seqs(Params(temperature=0), 1)[0]
    plain.token_ids += [0, 0, 1]
    assert Sampler(seed=0)(logits, [plain], ()).token_ids == [0]


def test_logit_bias_forces_and_bans_tokens(make_engine, prompts, hf_greedy):
    engine = make_engine()
    forced = engine.generate(
        [prompts[5]], SamplingParams(max_tokens=5, temperature=1.0, seed=0, logit_bias={42: 100})
    )[0]
    assert forced.token_ids == [42] * 5
    banned = hf_greedy[5][0]
    out = engine.generate(
        [prompts[5]],
        SamplingParams(max_tokens=5, temperature=0, ignore_eos=True, logit_bias={banned: -100}),
    )[0]
    assert banned not in out.token_ids
