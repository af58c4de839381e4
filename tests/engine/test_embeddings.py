"""Final hidden states: pooled embeddings and per-token states equal transformers'."""

from __future__ import annotations

import torch

from workers.engine import SamplingParams


def test_mean_and_last_pooling_equal_hf_last_hidden_state(make_engine, hf_model, prompts):
    engine = make_engine(max_num_batched_tokens=64)  # long prompts pool across chunks
    batch = prompts[5:12]
    mean = engine.embed(batch, pooling="mean")
    last = engine.embed(batch, pooling="last")
    for i, p in enumerate(batch):
        with torch.no_grad():
            ref = hf_model.model(torch.tensor([p])).last_hidden_state[0]
        torch.testing.assert_close(mean[i], ref.mean(0), atol=1e-4, rtol=0)
        torch.testing.assert_close(last[i], ref[-1], atol=1e-4, rtol=0)
    unit = engine.embed(batch[:2], normalize=True)
    torch.testing.assert_close(unit.norm(dim=-1), torch.ones(2))


def test_embeddings_ignore_the_prefix_cache(make_engine, prompts):
    engine = make_engine()
    engine.generate([prompts[12]], SamplingParams(max_tokens=1, temperature=0))
    cold = make_engine().embed([prompts[12]])
    torch.testing.assert_close(engine.embed([prompts[12]]), cold, atol=1e-5, rtol=0)


def test_generation_can_return_hidden_states(make_engine, hf_model, prompts):
    engine = make_engine()
    out = engine.generate(
        [prompts[6]],
        SamplingParams(max_tokens=5, temperature=0, ignore_eos=True),
        return_hidden_states=True,
    )[0]
    assert out.hidden_states.shape == (5, engine.model_config.hidden_size)
    full = torch.tensor([prompts[6] + out.token_ids])
    with torch.no_grad():
        ref = hf_model.model(full).last_hidden_state[0, len(prompts[6]) - 1 : -1]
    torch.testing.assert_close(out.hidden_states, ref, atol=1e-4, rtol=0)


def test_embeddings_survive_preemption(make_engine, prompts):
    roomy = make_engine().embed(prompts[12:16])
    engine = make_engine(num_kv_blocks=24, max_num_batched_tokens=64)
    for p in prompts[8:12]:
        engine.add_request(p, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
    squeezed = engine.embed(prompts[12:16])
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.stats()["num_preemptions"] > 0
    torch.testing.assert_close(squeezed, roomy, atol=1e-5, rtol=0)
