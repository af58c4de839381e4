"""Helpers for the speculative decoding tests: drafts for the tiny preset, scripted proposers."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from workers.engine.config import SpeculativeConfig
from workers.engine.sequence import Sequence


def perturbed_copy(source: Path, target: Path, *, noise: float, seed: int) -> Path:
    """The same model with every weight jittered by ``noise`` of its own scale: a draft that
    mostly agrees with its target and sometimes does not."""
    target.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.is_file() and path.suffix != ".safetensors":
            shutil.copy2(path, target / path.name)
    g = torch.Generator().manual_seed(seed)
    weights = load_file(str(source / "model.safetensors"))
    jittered = {
        name: (w + noise * w.std() * torch.randn(w.shape, generator=g)).contiguous()
        for name, w in weights.items()
    }
    save_file(jittered, str(target / "model.safetensors"), metadata={"format": "pt"})
    return target


def always(method: str, k: int = 4, **kwargs) -> SpeculativeConfig:
    """A config that speculates whatever the batch size or acceptance (the exactness tests)."""
    return SpeculativeConfig(
        method,
        num_speculative_tokens=k,
        is_adaptive=False,
        disable_by_batch_size=None,
        min_acceptance_rate=0.0,
        **kwargs,
    )


class ScriptedProposer:
    """Proposes what ``script(seq, k)`` returns: k tokens, and the distribution each was drawn
    from ([k, vocab]) or None for point masses (as prompt lookup proposes)."""

    def __init__(self, script) -> None:
        self.script = script
        self.num_calls = 0

    def lookahead(self, seq: Sequence, k: int) -> int:
        return k

    def propose(self, seqs: list[Sequence], ks: list[int]) -> None:
        self.num_calls += 1
        for seq, k in zip(seqs, ks, strict=False):
            tokens, probs = self.script(seq, k)
            seq.spec_token_ids = list(tokens)[:k]
            seq.spec_draft_probs = None if probs is None else probs[:k]
