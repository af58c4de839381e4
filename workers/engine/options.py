"""What the engine's options build at load: quantized layers and the speculator."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from workers.engine.config import EngineConfig, ModelConfig
from workers.engine.errors import UnsupportedModel
from workers.engine.model.llama import LlamaModel
from workers.engine.quant import quantization_config_read, quantize_model
from workers.engine.sampler import uniform
from workers.engine.spec.choice import MethodChoice
from workers.engine.spec.draft import DraftProposer
from workers.engine.spec.ngram import NgramProposer
from workers.engine.spec.speculator import Proposer, Speculator


def quantization_apply(model: LlamaModel, config: EngineConfig) -> str | None:
    """Quantize at load as configured; a quantized checkpoint stays as it was saved."""
    saved = quantization_config_read(json.loads((Path(config.model) / "config.json").read_text()))
    wanted = config.quantization
    if saved is not None:
        if wanted is not None and wanted != saved[0]:
            raise UnsupportedModel(
                f"the checkpoint is {saved[0]}-quantized; it cannot load as {wanted}"
            )
        return saved[0]
    if wanted is not None:
        quantize_model(model, wanted, group_size=config.quantization_group_size)
    return wanted


def speculator_build(
    config: EngineConfig,
    target: ModelConfig,
    *,
    num_blocks: int,
    max_model_len: int,
    device: torch.device,
    dtype: torch.dtype,
    generator: torch.Generator,
    proposer: Proposer | None,
) -> Speculator | MethodChoice | None:
    """The speculator ``config.speculative`` asks for: with a draft model, adaptive, the choice
    between it and prompt lookup (spec/choice.py). ``proposer`` replaces its proposer (the only
    method then)."""
    spec = config.speculative
    if spec is None:
        return None
    is_chosen = (
        proposer is None and spec.method == "draft" and spec.is_adaptive and spec.also_prompt_lookup
    )
    if proposer is None and spec.method == "ngram":
        proposer = NgramProposer(min_n=spec.prompt_lookup_min, max_n=spec.prompt_lookup_max)
    elif proposer is None:
        proposer = DraftProposer(
            spec.draft_model,
            config=config,
            target=target,
            num_blocks=num_blocks,
            max_model_len=max_model_len,
            device=device,
            dtype=dtype,
            uniform=lambda seq: uniform(seq, generator),
        )
    # The cost model's clock: on a CPU the engine thread's CPU time (steps stretched by other
    # processes on the machine are not longer in it); on an accelerator the host's wall time
    # (the step waits there for the device's work, which no CPU clock sees).
    clock = time.thread_time if device.type == "cpu" else time.perf_counter
    speculator = Speculator(
        spec, proposer, max_model_len=max_model_len, generator=generator, clock=clock
    )
    if not is_chosen:
        return speculator
    # A draft model, adaptive: prompt lookup is the second method, chosen per batch size.
    ngram = NgramProposer(min_n=spec.prompt_lookup_min, max_n=spec.prompt_lookup_max)
    lookup = Speculator(spec, ngram, max_model_len=max_model_len, generator=generator, clock=clock)
    # Prompt lookup first: a new batch size measures it first (it has nothing to catch up on),
    # then probes the draft model beside it.
    return MethodChoice({"ngram": lookup, "draft": speculator}, configured="draft")
