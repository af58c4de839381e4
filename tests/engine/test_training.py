"""The training script: an offline corpus with a stable held-out split, seeded training that
lowers the loss, growing that keeps the function, and cached Hugging Face-format results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from workers.engine import EngineConfig, LLMEngine, SamplingParams
from workers.engine.loader import model_load
from workers.engine.presets import preset_config
from workers.engine.quantize.report import model_logits
from workers.engine.training import train as train_module
from workers.engine.training.data import corpus_load, is_heldout, stdlib_files
from workers.engine.training.grow import grow
from workers.engine.training.model import TrainableLlama
from workers.engine.training.train import TrainRecipe, ensure_trained, train_preset

SOURCE = b'''def add(a, b):
    """Return a plus b."""
    return a + b


class Point:
    def __init__(self, x, y):
        self.x = x
        self.y = y
'''


@pytest.fixture(scope="module")
def stdlib(tmp_path_factory) -> Path:
    """A small stand-in for the standard library: enough files that some are held out."""
    root = tmp_path_factory.mktemp("stdlib")
    for i in range(80):
        (root / f"mod{i}.py").write_bytes(SOURCE.replace(b"add", f"add{i}".encode()) * (1 + i % 3))
    (root / "site-packages").mkdir()
    (root / "site-packages" / "third_party.py").write_bytes(b"x = 1\n")
    return root


def test_corpus_is_the_sources_with_a_stable_held_out_split(stdlib):
    files = stdlib_files(stdlib)
    assert len(files) == 80 and all("site-packages" not in f.parts for f in files)
    corpus = corpus_load(stdlib)
    held = [f for f in files if is_heldout(f.relative_to(stdlib).as_posix())]
    assert corpus.heldout_files == held and 0 < len(held) < 20
    assert corpus.fingerprint == corpus_load(stdlib).fingerprint
    assert int((corpus.train == 2).sum()) == 80 - len(held)  # each file ends with </s>
    window = corpus.windows("train", num=2, length=32, seed=1)
    assert window.shape == (2, 32) and torch.equal(
        window, corpus.windows("train", num=2, length=32, seed=1)
    )


def test_seeded_training_lowers_the_loss_and_reproduces(stdlib):
    corpus = corpus_load(stdlib)
    recipe = TrainRecipe("tiny", num_steps=40, batch_size=4, seq_len=64, lr=1e-2, warmup_steps=4)
    start = TrainableLlama(preset_config("tiny"), max_positions=64)
    before = train_module.heldout_loss(start, corpus, 64)
    model, figures = train_preset(recipe, corpus, seed=3, log=lambda line: None)
    assert (
        figures["heldout_loss"] < before - 1.0
        and figures["num_steps_done"] == 40
        and not figures["is_truncated"]
    )
    again, _ = train_preset(recipe, corpus, seed=3, log=lambda line: None)
    for a, b in zip(model.parameters(), again.parameters(), strict=False):
        torch.testing.assert_close(a, b)


def test_growing_keeps_the_function():
    torch.manual_seed(0)
    small = TrainableLlama(preset_config("tiny"), max_positions=64)
    for p in small.parameters():
        p.data.add_(torch.randn_like(p) * 0.1)  # not the initial symmetric weights
    wide = preset_config(
        "tiny", hidden_size=128, num_attention_heads=8, intermediate_size=352, num_hidden_layers=4
    )
    big = TrainableLlama(wide, max_positions=64)
    grow(small, big, generator=torch.Generator().manual_seed(1))
    ids = torch.randint(5, 261, (2, 48))
    torch.testing.assert_close(big(ids), small(ids), atol=2e-3, rtol=1e-3)
    # Every new weight can learn: writers (zero) get gradients at once, readers one step later.
    optimizer = torch.optim.SGD(big.parameters(), lr=0.1)
    for _ in range(2):
        optimizer.zero_grad()
        big.loss(torch.randint(5, 261, (2, 49))).backward()
        optimizer.step()
    assert all(p.grad.abs().sum() > 0 for p in big.parameters())


def test_trained_models_are_cached_hf_directories_the_engine_serves(stdlib, tmp_path, monkeypatch):
    monkeypatch.setitem(
        train_module.RECIPES,
        "tiny",
        TrainRecipe("tiny", num_steps=5, batch_size=2, seq_len=32, lr=1e-2, warmup_steps=1),
    )
    corpus = corpus_load(stdlib)
    path = ensure_trained("tiny", tmp_path, seed=0, corpus=corpus, log=lambda line: None)
    assert path == tmp_path / "tiny-py-seed0"
    marker = json.loads((path / "fairlane_trained.json").read_text())
    assert marker["recipe"]["num_steps"] == 5 and marker["corpus"] == corpus.fingerprint
    assert {"train_loss", "heldout_ppl", "num_parameters"} <= set(marker)

    def no_training(*args, **kwargs):
        raise AssertionError("a cached model was trained again")

    monkeypatch.setattr(train_module, "train_preset", no_training)
    assert ensure_trained("tiny", tmp_path, seed=0, corpus=corpus, log=lambda line: None) == path
    trained = train_module._trained_load(path, 64)  # the saved weights, back in the training model
    ids = [5 + b for b in SOURCE[:40]]
    engine_model = model_load(
        path, device=torch.device("cpu"), dtype=torch.float32, max_positions=64
    )
    torch.testing.assert_close(
        model_logits(engine_model, ids),
        trained(torch.tensor([ids]))[0].detach(),
        atol=1e-4,
        rtol=1e-4,
    )
    out = LLMEngine(EngineConfig(model=str(path), num_kv_blocks=64)).generate(
        ["def "], SamplingParams(max_tokens=8, temperature=0)
    )
    assert len(out[0].token_ids) >= 1
