"""Our decoder against transformers on the same checkpoint: logits, paged decode, variants."""

from __future__ import annotations

import json

import pytest
import torch

from workers.engine import EngineConfig, LLMEngine, ModelConfig, UnsupportedModel, preset_create
from workers.engine.loader import model_load
from workers.engine.model.attention import AttentionGroup, AttentionMetadata
from workers.engine.model.layers import rope_inv_freq

ATOL = 1e-4


def _dense_logits(model, ids: list[int]) -> torch.Tensor:
    """Our model over a fresh cache, whole prompt as one chunk: logits for every position."""
    mc = model.config
    num_blocks = len(ids) // 16 + 2
    caches = [
        (
            torch.zeros(mc.num_key_value_heads, num_blocks, 16, mc.head_dim),
            torch.zeros(mc.num_key_value_heads, num_blocks, 16, mc.head_dim),
        )
        for _ in range(mc.num_hidden_layers)
    ]
    n = len(ids)
    meta = AttentionMetadata(
        torch.arange(n), [AttentionGroup(1, n, 0, None, None, rows=slice(0, n))]
    )
    hidden = model(torch.tensor(ids), torch.arange(n), caches, meta)
    return model.compute_logits(hidden)


def test_logits_equal_hf_on_every_position(tiny_dir, hf_model, prompts):
    model = model_load(
        tiny_dir, device=torch.device("cpu"), dtype=torch.float32, max_positions=1024
    )
    for p in prompts[::3]:
        with torch.no_grad():
            ref = hf_model(torch.tensor([p])).logits[0]
        torch.testing.assert_close(_dense_logits(model, p), ref, atol=ATOL, rtol=0)


def test_paged_decode_logits_equal_hf(make_engine, hf_model, prompts):
    """Logprobs the engine reports while decoding through the paged cache match HF's full pass."""
    from workers.engine import SamplingParams

    engine = make_engine(max_num_batched_tokens=64)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=3)
    for p, out in zip(prompts[4:10], engine.generate(prompts[4:10], params), strict=False):
        full = torch.tensor([p + out.token_ids])
        with torch.no_grad():
            ref = torch.log_softmax(hf_model(full).logits[0, len(p) - 1 : -1].float(), dim=-1)
        chosen = ref.gather(1, torch.tensor(out.token_ids)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(out.logprobs), chosen, atol=ATOL, rtol=0)
        for row, top in enumerate(out.top_logprobs):
            values, indices = ref[row].topk(3)
            assert list(top) == indices.tolist()
            torch.testing.assert_close(torch.tensor(list(top.values())), values, atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    "overrides",
    [{"model_type": "qwen2"}, {"tie_word_embeddings": True}],
    ids=["qwen2-qkv-bias", "tied-embeddings"],
)
def test_checkpoint_variants_load_and_match_hf(tmp_path, overrides):
    from transformers import AutoModelForCausalLM

    path = preset_create("tiny", tmp_path / "variant", seed=3, **overrides)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ours = model_load(path, device=torch.device("cpu"), dtype=torch.float32, max_positions=1024)
    ids = torch.randint(5, 261, (70,), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(_dense_logits(ours, ids), ref, atol=ATOL, rtol=0)


def test_the_benchmarks_hf_side_runs_the_same_qwen2_model(tmp_path):
    """`bench engine --preset qwen2-0.5b` compares against transformers on the same weights:
    its loader keeps Qwen2's QKV biases (a Llama class would drop them with a warning)."""
    from workers.engine.bench.hf import hf_model_load

    path = preset_create("tiny", tmp_path / "qwen2", seed=4, model_type="qwen2")
    hf = hf_model_load(path)
    assert hf.model.layers[0].self_attn.q_proj.bias is not None
    ours = model_load(path, device=torch.device("cpu"), dtype=torch.float32, max_positions=1024)
    ids = torch.randint(5, 261, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(_dense_logits(ours, ids), ref, atol=ATOL, rtol=0)


def test_legacy_rope_theta_config_loads(tmp_path):
    """Older config.json files carry rope_theta/rope_scaling instead of rope_parameters."""
    path = preset_create("tiny", tmp_path / "legacy", seed=0, rope_theta=1234.0)
    raw = json.loads((path / "config.json").read_text())
    raw.pop("rope_parameters")
    assert ModelConfig.from_dict(raw).rope_theta == 1234.0
    raw["rope_scaling"] = {"type": "linear", "factor": 2.0}
    config = ModelConfig.from_dict(raw)
    assert (config.rope_type, dict(config.rope_scaling)) == ("linear", {"factor": 2.0})


def test_llama3_rope_frequencies_equal_hf():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    raw = {
        "vocab_size": 10,
        "hidden_size": 128,
        "intermediate_size": 8,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "max_position_embeddings": 131072,
        "rope_parameters": scaling,
    }
    hf_config = LlamaConfig(**dict(raw.items()))
    ref, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_config, None)
    torch.testing.assert_close(rope_inv_freq(ModelConfig.from_dict(raw)), ref)


def test_unsupported_architecture_is_refused(tmp_path):
    path = preset_create("tiny", tmp_path / "odd", seed=0, model_type="gpt2")
    with pytest.raises(UnsupportedModel):
        LLMEngine(EngineConfig(model=str(path)))


def test_bfloat16_engine_runs_and_stays_close_to_float32(make_engine, prompts):
    """The half-precision path (what CUDA uses by default) works end to end on CPU too."""
    from workers.engine import SamplingParams

    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=0)
    half = make_engine(dtype="bfloat16", max_num_batched_tokens=64).generate(prompts[6:10], params)
    full = make_engine().generate(prompts[6:10], params)
    assert all(len(h.token_ids) == 8 for h in half)
    assert sum(h.token_ids[0] == f.token_ids[0] for h, f in zip(half, full, strict=False)) >= 3
    vectors = make_engine(dtype="bfloat16").embed(prompts[6:8])
    torch.testing.assert_close(vectors, make_engine().embed(prompts[6:8]), atol=0.15, rtol=0.05)


@pytest.mark.gpu
def test_cuda_engine_equals_hf(tiny_dir, prompts, hf_greedy):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (none on this machine)")
    from workers.engine import SamplingParams

    engine = LLMEngine(
        EngineConfig(model=str(tiny_dir), device="cuda", dtype="float32", num_kv_blocks=512)
    )
    outs = engine.generate(prompts, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))
    assert [o.token_ids for o in outs] == hf_greedy
