"""A draft model that proposes k tokens, autoregressively, over its own paged KV cache.

The draft's cache has the target's block layout (same block ids and slots, its own layers and
heads), so the target's block tables, reservations and frees serve it too. Each sequence
records how many of its tokens the draft has K/V for (``draft_num_computed``); a proposal
first catches up on the tokens it lacks (a new prompt, the tokens accepted last step), then
runs k - 1 single-token passes. Rolling back is lowering ``draft_num_computed`` to the tokens
the target accepted; anything the draft wrote past it is overwritten later.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from workers.engine.config import EngineConfig, ModelConfig
from workers.engine.errors import UnsupportedModel
from workers.engine.loader import model_load
from workers.engine.metadata import MetadataBuilder, batch_order
from workers.engine.model.packed import prepack_linears
from workers.engine.sampler import inverse_cdf, processed_probs
from workers.engine.sequence import Sequence

Uniform = Callable[[Sequence], float]


class _DraftView:
    """What the metadata builder reads of a sequence, as the draft sees it."""

    __slots__ = ("token_ids", "num_computed_tokens", "block_table", "spec_token_ids")

    def __init__(self, seq: Sequence, drafts: list[int]) -> None:
        self.token_ids = seq.token_ids + drafts
        self.num_computed_tokens = seq.draft_num_computed
        self.block_table = seq.block_table
        self.spec_token_ids: list[int] = []


def draft_kv_bytes_per_block(model_dir: str | Path, block_size: int, dtype: torch.dtype) -> int:
    mc = ModelConfig.from_dir(model_dir)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    return mc.num_hidden_layers * 2 * mc.num_key_value_heads * block_size * mc.head_dim * itemsize


class DraftProposer:
    def __init__(
        self,
        model_dir: str,
        *,
        config: EngineConfig,
        target: ModelConfig,
        num_blocks: int,
        max_model_len: int,
        device: torch.device,
        dtype: torch.dtype,
        uniform: Uniform,
    ) -> None:
        mc = ModelConfig.from_dir(model_dir)
        if mc.vocab_size != target.vocab_size:
            raise UnsupportedModel(
                f"the draft's vocabulary ({mc.vocab_size}) is not the target's"
                f" ({target.vocab_size})"
            )
        self.model = model_load(model_dir, device=device, dtype=dtype, max_positions=max_model_len)
        if config.is_weight_prepacking_enabled:
            prepack_linears(self.model, device=device, dtype=dtype)
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
        self.metadata = MetadataBuilder(
            block_size=config.block_size,
            num_queries_per_kv=mc.num_queries_per_kv,
            kv_bytes_per_block=draft_kv_bytes_per_block(model_dir, config.block_size, dtype),
            max_group_padding=config.max_group_padding,
            device=device,
            dtype=dtype,
        )
        self.uniform = uniform
        # The most tokens one sequence's draft had to catch up on in the last proposal (its
        # prompt, or the tokens of steps it did not speculate in); 1-2 step after step.
        self.max_catch_up = 0

    def lookahead(self, seq: Sequence, k: int) -> int:
        return k

    def catch_up(self, seq: Sequence) -> int:
        """Tokens of ``seq`` the draft has no K/V for: its next proposal's first pass."""
        return seq.num_tokens - seq.draft_num_computed

    def propose(self, seqs: list[Sequence], ks: list[int]) -> None:
        """Fill each sequence's ``spec_token_ids`` (k of them) and ``spec_draft_probs``."""
        drafts: list[list[int]] = [[] for _ in seqs]
        probs: list[list[torch.Tensor]] = [[] for _ in seqs]
        active = list(range(len(seqs)))
        self.max_catch_up = max(s.num_tokens - s.draft_num_computed for s in seqs)
        while active:
            views = [_DraftView(seqs[i], drafts[i]) for i in active]
            num_new = [len(v.token_ids) - v.num_computed_tokens for v in views]
            logits = self._forward(views, num_new)
            tokens, qs = self._sample([seqs[i] for i in active], logits)
            for row, i in enumerate(active):
                seqs[i].draft_num_computed += num_new[row]
                drafts[i].append(tokens[row])
                q = qs[row]
                if q is not None:
                    probs[i].append(q)
            active = [i for i in active if len(drafts[i]) < ks[i]]
        for seq, tokens, rows in zip(seqs, drafts, probs, strict=False):
            seq.spec_token_ids = tokens
            seq.spec_draft_probs = torch.stack(rows) if rows else None

    def _forward(self, views: list[_DraftView], num_new: list[int]) -> torch.Tensor:
        """Logits at each view's last new token: [len(views), vocab]."""
        order = batch_order(views, num_new)
        ordered = [views[i] for i in order]
        ordered_new = [num_new[i] for i in order]
        input_ids, positions, meta = self.metadata.build(ordered, ordered_new)
        hidden = self.model(input_ids, positions, self.kv_caches, meta)
        ends = torch.tensor(ordered_new).cumsum(0) - 1
        logits = self.model.compute_logits(hidden[ends]).float().cpu()
        back = torch.empty(len(order), dtype=torch.long)
        back[torch.tensor(order)] = torch.arange(len(order))
        return logits[back]

    def _sample(
        self, seqs: list[Sequence], logits: torch.Tensor
    ) -> tuple[list[int], list[torch.Tensor | None]]:
        """Each row's draft token: argmax for greedy requests, else drawn from q (returned too)."""
        tokens = logits.argmax(dim=-1).tolist()
        qs: list[torch.Tensor | None] = [None] * len(seqs)
        sampled = [i for i, s in enumerate(seqs) if not s.params.is_greedy]
        if sampled:
            q = processed_probs(logits[sampled], [seqs[i].params for i in sampled])
            for row, i in enumerate(sampled):
                qs[i] = q[row]
                tokens[i] = inverse_cdf(q[row], self.uniform(seqs[i]))
        return tokens, qs

    def extra_kv_bytes_per_block(self) -> int:
        return self.kv_cache[0, :, :, 0].numel() * self.kv_cache.element_size()
