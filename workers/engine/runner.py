"""Turns a scheduled batch into tensors, runs the model over the paged KV cache, samples."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workers.engine.config import EngineConfig, ModelConfig
from workers.engine.model.attention import AttentionGroup, AttentionMetadata
from workers.engine.model.llama import LlamaModel
from workers.engine.sampler import SampleResult, Sampler
from workers.engine.scheduler import ScheduledBatch
from workers.engine.sequence import Sequence

# Below this many sequences a decode group is not split: per-group overhead outweighs padding.
MIN_DECODE_GROUP = 8


@dataclass(slots=True)
class StepResult:
    sampled_seqs: list[Sequence]  # sequences whose chunk reached their last token
    sample: SampleResult | None
    hidden_last: torch.Tensor | None  # [len(sampled_seqs), hidden] if any of them wants states


class ModelRunner:
    """Owns the model, the KV cache tensors and the sampler."""

    def __init__(self, model: LlamaModel, config: EngineConfig, num_blocks: int, device: torch.device, dtype: torch.dtype) -> None:
        mc: ModelConfig = model.config
        self.model = model
        self.config = config
        self.device = device
        self.block_size = config.block_size
        self.num_queries_per_kv = mc.num_queries_per_kv
        shape = (mc.num_hidden_layers, 2, mc.num_key_value_heads, num_blocks, config.block_size, mc.head_dim)
        self.kv_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.kv_caches = [(layer[0], layer[1]) for layer in self.kv_cache]
        self.sampler = Sampler(config.seed)
        self.eos_token_ids = mc.eos_token_ids

    def execute(self, batch: ScheduledBatch) -> StepResult:
        order = self._order(batch)
        seqs = [batch.seqs[i] for i in order]
        num_new = [batch.num_new_tokens[i] for i in order]
        input_ids, positions, meta = self._prepare(seqs, num_new)
        hidden = self.model(input_ids, positions, self.kv_caches, meta)  # [T, hidden]
        ends = torch.tensor(num_new).cumsum(0) - 1
        self._pool_embeddings(seqs, num_new, hidden)
        sampled = [i for i, s in enumerate(seqs) if s.num_computed_tokens + num_new[i] == s.num_tokens and not s.is_embedding]
        if not sampled:
            return StepResult([], None, None)
        sampled_seqs = [seqs[i] for i in sampled]
        last = hidden[ends[sampled]]
        logits = self.model.compute_logits(last)
        result = self.sampler(logits, sampled_seqs, self.eos_token_ids)
        wants_hidden = any(s.is_hidden_states_returned for s in sampled_seqs)
        return StepResult(sampled_seqs, result, last.float().cpu() if wants_hidden else None)

    @staticmethod
    def _order(batch: ScheduledBatch) -> list[int]:
        """Single-token chunks first, longest context first, so decode groups have little padding."""
        def key(i: int) -> tuple[bool, int]:
            seq, n = batch.seqs[i], batch.num_new_tokens[i]
            return n > 1, -(seq.num_computed_tokens + n)
        return sorted(range(len(batch.seqs)), key=key)

    def _prepare(self, seqs: list[Sequence], num_new: list[int]):
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        for seq, n in zip(seqs, num_new):
            start = seq.num_computed_tokens
            input_ids.extend(seq.token_ids[start : start + n])
            table = seq.block_table
            for pos in range(start, start + n):
                positions.append(pos)
                slots.append(table[pos // bs] * bs + pos % bs)
        groups = self._decode_groups(seqs, num_new) + self._prefill_groups(seqs, num_new)
        to = dict(device=self.device, dtype=torch.long)
        meta = AttentionMetadata(slot_mapping=torch.tensor(slots, **to), groups=groups)
        return torch.tensor(input_ids, **to), torch.tensor(positions, **to), meta

    def _decode_groups(self, seqs: list[Sequence], num_new: list[int]) -> list[AttentionGroup]:
        """Cut the decodes (sorted longest first) where padding to the group's longest would grow too much."""
        num_decodes = sum(1 for n in num_new if n == 1)
        groups, start = [], 0
        while start < num_decodes:
            longest = self._num_blocks(seqs[start])
            end, used = start + 1, longest
            while end < num_decodes:
                used_next = used + self._num_blocks(seqs[end])
                is_wasteful = longest * (end + 1 - start) > (1 + self.config.max_group_padding) * used_next
                if is_wasteful and end - start >= MIN_DECODE_GROUP:
                    break
                end, used = end + 1, used_next
            groups.append(self._group(seqs[start:end], start, q_len=1))
            start = end
        return groups

    def _prefill_groups(self, seqs: list[Sequence], num_new: list[int]) -> list[AttentionGroup]:
        groups, row = [], sum(1 for n in num_new if n == 1)
        for seq, n in zip(seqs[row:], num_new[row:]):
            if seq.num_computed_tokens == 0:
                groups.append(AttentionGroup(row, 1, n, 0, None, None))
            else:
                groups.append(self._group([seq], row, q_len=n))
            row += n
        return groups

    def _num_blocks(self, seq: Sequence) -> int:
        return -(-(seq.num_computed_tokens + 1) // self.block_size)

    def _group(self, seqs: list[Sequence], start: int, *, q_len: int) -> AttentionGroup:
        num_blocks = max(-(-(s.num_computed_tokens + q_len) // self.block_size) for s in seqs)
        table = [s.block_table[:num_blocks] + [0] * (num_blocks - len(s.block_table[:num_blocks])) for s in seqs]
        block_ids = torch.tensor(table, dtype=torch.long, device=self.device).view(-1)
        num_keys = num_blocks * self.block_size
        keys = torch.arange(num_keys, device=self.device)
        if q_len == 1:
            lengths = torch.tensor([s.num_computed_tokens + 1 for s in seqs], device=self.device)
            is_full = bool((lengths == num_keys).all())
            mask = None if is_full else (keys[None, :] < lengths[:, None])[:, None, None, :]
        else:  # one sequence's chunk over its cached context: causal, repeated per query head
            query_pos = seqs[0].num_computed_tokens + torch.arange(q_len, device=self.device)
            causal = keys[None, :] <= query_pos[:, None]  # [q_len, num_keys]
            mask = causal.repeat(self.num_queries_per_kv, 1)[None, None]
        return AttentionGroup(start, len(seqs), q_len, num_blocks, block_ids, mask)

    def _pool_embeddings(self, seqs: list[Sequence], num_new: list[int], hidden: torch.Tensor) -> None:
        row = 0
        for seq, n in zip(seqs, num_new):
            if seq.is_embedding:
                chunk = hidden[row : row + n].float()
                seq.hidden_sum = chunk.sum(0) if seq.hidden_sum is None else seq.hidden_sum + chunk.sum(0)
                seq.hidden_last = chunk[-1]
            row += n
