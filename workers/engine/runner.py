"""Turns a scheduled batch into tensors, runs the model over the paged KV cache, samples."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from workers.engine.config import EngineConfig, ModelConfig
from workers.engine.metadata import MetadataBuilder, batch_order
from workers.engine.model.llama import LlamaModel
from workers.engine.sampler import Sampler, SampleResult
from workers.engine.scheduler import ScheduledBatch
from workers.engine.sequence import Sequence


@dataclass(slots=True)
class StepResult:
    sampled_seqs: list[Sequence]  # sequences whose chunk reached their last token
    sample: SampleResult | None
    hidden_last: torch.Tensor | None  # [len(sampled_seqs), hidden] if any of them wants states
    # Speculative sequences: the target's logits at each one's k + 1 positions, stacked.
    spec_seqs: list[Sequence] = field(default_factory=list)
    spec_logits: torch.Tensor | None = None  # [sum(k + 1), vocab]
    spec_hidden: torch.Tensor | None = None  # [sum(k + 1), hidden] if any of them wants states


class ModelRunner:
    """Owns the model, the KV cache tensors and the sampler."""

    def __init__(
        self,
        model: LlamaModel,
        config: EngineConfig,
        num_blocks: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        mc: ModelConfig = model.config
        self.model = model
        self.config = config
        self.device = device
        shape = (
            mc.num_hidden_layers,
            2,
            mc.num_key_value_heads,
            num_blocks,
            config.block_size,
            mc.head_dim,
        )
        self.kv_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.kv_caches = [(layer[0], layer[1]) for layer in self.kv_cache]
        self.sampler = Sampler(config.seed)
        self.metadata = MetadataBuilder(
            block_size=config.block_size,
            num_queries_per_kv=mc.num_queries_per_kv,
            kv_bytes_per_block=self.kv_cache[0, :, :, 0].numel() * self.kv_cache.element_size(),
            max_group_padding=config.max_group_padding,
            device=device,
            dtype=dtype,
        )
        self.eos_token_ids = mc.eos_token_ids

    def execute(self, batch: ScheduledBatch) -> StepResult:
        order = batch_order(batch.seqs, batch.num_new_tokens)
        seqs = [batch.seqs[i] for i in order]
        num_new = [batch.num_new_tokens[i] for i in order]
        input_ids, positions, meta = self.metadata.build(seqs, num_new)
        hidden = self.model(input_ids, positions, self.kv_caches, meta)  # [T, hidden]
        self._pool_embeddings(seqs, num_new, hidden)
        starts = [0, *itertools.accumulate(num_new)]
        sampled, spec, rows = [], [], []
        for i, (seq, n) in enumerate(zip(seqs, num_new, strict=False)):
            if seq.is_embedding:
                continue
            if seq.spec_token_ids:  # a speculative step: every position's logits
                spec.append(seq)
            elif seq.num_computed_tokens + n == seq.num_tokens:
                sampled.append(seq)
                rows.append(starts[i + 1] - 1)
        rows += [
            r
            for i, s in enumerate(seqs)
            if s.spec_token_ids and not s.is_embedding
            for r in range(starts[i], starts[i + 1])
        ]
        if not rows:
            return StepResult([], None, None)
        last = hidden[rows]
        logits = self.model.compute_logits(last)
        num_sampled = len(sampled)
        result = (
            self.sampler(logits[:num_sampled], sampled, self.eos_token_ids) if sampled else None
        )
        wants_hidden = any(s.is_hidden_states_returned for s in sampled)
        wants_spec_hidden = any(s.is_hidden_states_returned for s in spec)
        return StepResult(
            sampled,
            result,
            last[:num_sampled].float().cpu() if wants_hidden else None,
            spec,
            logits[num_sampled:] if spec else None,
            last[num_sampled:].float().cpu() if wants_spec_hidden else None,
        )

    def _pool_embeddings(
        self, seqs: list[Sequence], num_new: list[int], hidden: torch.Tensor
    ) -> None:
        row = 0
        for seq, n in zip(seqs, num_new, strict=False):
            if seq.is_embedding:
                chunk = hidden[row : row + n].float()
                seq.hidden_sum = (
                    chunk.sum(0) if seq.hidden_sum is None else seq.hidden_sum + chunk.sum(0)
                )
                seq.hidden_last = chunk[-1]
            row += n
