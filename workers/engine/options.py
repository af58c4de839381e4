"""What the engine's options build at load: quantized layers and the speculator."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from torch import nn

from workers.engine.config import EngineConfig
from workers.engine.errors import UnsupportedModel
from workers.engine.quant import quantization_config_read, quantize_model
from workers.engine.sampler import uniform
from workers.engine.spec.draft import DraftProposer
from workers.engine.spec.ngram import NgramProposer
from workers.engine.spec.speculator import Proposer, Speculator

if TYPE_CHECKING:
    from workers.engine.engine import LLMEngine


def quantization_apply(model: nn.Module, config: EngineConfig) -> str | None:
    """Quantize at load as configured; a quantized checkpoint stays as it was saved."""
    saved = quantization_config_read(json.loads((Path(config.model) / "config.json").read_text()))
    wanted = config.quantization
    if saved is not None:
        if wanted is not None and wanted != saved[0]:
            raise UnsupportedModel(f"the checkpoint is {saved[0]}-quantized; it cannot load as {wanted}")
        return saved[0]
    if wanted is not None:
        quantize_model(model, wanted, group_size=config.quantization_group_size)
    return wanted


def speculator_build(engine: LLMEngine, num_blocks: int, proposer: Proposer | None) -> Speculator | None:
    """The speculator ``engine.config.speculative`` asks for; ``proposer`` replaces its proposer."""
    spec = engine.config.speculative
    if spec is None:
        return None
    generator = engine.runner.sampler.generator
    if proposer is None and spec.method == "ngram":
        proposer = NgramProposer(min_n=spec.prompt_lookup_min, max_n=spec.prompt_lookup_max)
    elif proposer is None:
        proposer = DraftProposer(
            spec.model, config=engine.config, target=engine.model_config, num_blocks=num_blocks,
            max_model_len=engine.max_model_len, device=engine.device, dtype=engine.dtype,
            uniform=lambda seq: uniform(seq, generator),
        )
    return Speculator(spec, proposer, max_model_len=engine.max_model_len, generator=generator)
