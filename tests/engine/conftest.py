"""Shared fixtures: the tiny preset written once per session, HF's model on the same weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from workers.engine import EngineConfig, LLMEngine, SamplingParams, preset_create

NUM_PROMPTS = 16
NUM_NEW_TOKENS = 24


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    # The tiny model's matrices are too small to split; on a shared 2-core box a second
    # thread only adds waiting on a descheduled peer (milliseconds per op).
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return preset_create("tiny", tmp_path_factory.mktemp("models") / "tiny", seed=0)


@pytest.fixture(scope="session")
def hf_model(tiny_dir: Path):
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # compare fixed-length continuations
    return model


@pytest.fixture(scope="session")
def prompts() -> list[list[int]]:
    """16 prompts of varied lengths (1 to ~300 tokens); four share a 40-token prefix."""
    g = torch.Generator().manual_seed(1234)
    lengths = [1, 2, 5, 15, 16, 17, 31, 33, 47, 64, 80, 111, 128, 150, 200, 300]
    out = [torch.randint(5, 261, (n,), generator=g).tolist() for n in lengths]
    shared = torch.randint(5, 261, (40,), generator=g).tolist()
    for i in (9, 11, 13, 15):
        out[i] = shared + out[i][40:]
    return out


@pytest.fixture(scope="session")
def hf_greedy(hf_model, prompts) -> list[list[int]]:
    """Hugging Face's greedy continuations, one prompt at a time: the reference."""
    refs = []
    for p in prompts:
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


@pytest.fixture
def make_engine(tiny_dir: Path):
    def make(*, proposer=None, policy=None, **overrides) -> LLMEngine:
        config = {"model": str(tiny_dir), "num_kv_blocks": 512, "seed": 0, **overrides}
        return LLMEngine(EngineConfig(**config), policy=policy, proposer=proposer)

    return make


@pytest.fixture
def greedy() -> SamplingParams:
    return SamplingParams(max_tokens=NUM_NEW_TOKENS, temperature=0.0, ignore_eos=True)


def assert_no_leaks(engine: LLMEngine) -> None:
    bm = engine.block_manager
    assert not engine.requests
    assert bm.num_free_blocks == bm.num_blocks, "blocks still held after every request ended"
    assert all(b.ref_count == 0 for b in bm.blocks)
    assert bm.num_cached_free_blocks == sum(1 for b in bm.blocks if b.hash is not None), (
        "the count of cached free blocks drifted from the pool"
    )
