"""Builds a step's attention metadata: slot mapping and attention groups.

The flattened batch holds single-token chunks (decodes) first, longest context first, then
prefill chunks. Decodes of similar length form groups; prefill chunks over cached context are
grouped too, with queries padded. A long chunk with no cached context attends to itself only
and skips the cache read. Masks are additive floats built here once and shared by all layers.
"""

from __future__ import annotations

import collections.abc
import itertools
from typing import Protocol

import torch

from workers.engine.model.attention import AttentionGroup, AttentionMetadata

# Below this many sequences a decode group is not split: per-group overhead outweighs padding.
MIN_DECODE_GROUP = 4
# A decode group's gathered K and V stay about this small, so attention reads them from cache
# right after the gather wrote them (measured: 8 sequences of ~400 tokens run twice as fast as
# 32 in one group on a 2-core EPYC).
MAX_GROUP_KV_BYTES = 4 << 20
# A fresh chunk at least this long runs alone, straight on its own keys (no gather, causal kernel).
MIN_DIRECT_PREFILL = 64
# Prefill groups stop growing once padded (query x key) area exceeds actual area by this factor.
MAX_PREFILL_PADDING = 1.3
MAX_GROUP_MASK_ELEMENTS = 1 << 23


class SequenceView(Protocol):
    """What the builder reads of a sequence: a Sequence, or the draft model's view of one
    (spec/draft.py)."""

    @property
    def token_ids(self) -> list[int]: ...

    @property
    def num_computed_tokens(self) -> int: ...

    @property
    def block_table(self) -> list[int]: ...

    @property
    def spec_token_ids(self) -> list[int]: ...


# The batch, read only (so a list of Sequences and a list of draft views are both one).
Views = collections.abc.Sequence[SequenceView]


def batch_order(seqs: Views, num_new: list[int]) -> list[int]:
    """Single-token chunks first, longest context first, so decode groups have little padding."""

    def key(i: int) -> tuple[bool, int]:
        return num_new[i] > 1, -(seqs[i].num_computed_tokens + num_new[i])

    return sorted(range(len(seqs)), key=key)


class MetadataBuilder:
    def __init__(
        self,
        *,
        block_size: int,
        num_queries_per_kv: int,
        kv_bytes_per_block: int,
        max_group_padding: float,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.dtype = dtype  # attention masks must match the queries' dtype
        self.block_size = block_size
        self.max_group_blocks = max(MAX_GROUP_KV_BYTES // kv_bytes_per_block, 1)
        self.group = num_queries_per_kv
        self.max_group_padding = max_group_padding
        self.device = device

    def build(
        self, seqs: Views, num_new: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """(input_ids [T], positions [T], metadata) for ``seqs`` in batch order."""
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        for seq, n in zip(seqs, num_new, strict=False):
            start = seq.num_computed_tokens
            chunk = seq.token_ids[start : start + n]
            if len(chunk) < n:  # a speculative step: the last token, then the drafts
                chunk = chunk + seq.spec_token_ids[: n - len(chunk)]
            input_ids.extend(chunk)
            table = seq.block_table
            positions.extend(range(start, start + n))
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, start + n))
        num_decodes = sum(1 for n in num_new if n == 1)
        rows = [0, *itertools.accumulate(num_new)]
        chunks = [
            (seq, n, rows[i])
            for i, (seq, n) in enumerate(zip(seqs, num_new, strict=False))
            if i >= num_decodes
        ]
        groups = (
            self._decode_groups(seqs[:num_decodes])
            + self._spec_groups([e for e in chunks if e[0].spec_token_ids])
            + self._prefill_groups([e for e in chunks if not e[0].spec_token_ids])
        )
        meta = AttentionMetadata(slot_mapping=self._long(slots), groups=groups)
        return self._long(input_ids), self._long(positions), meta

    def _long(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    def _num_blocks(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # Decodes ------------------------------------------------------------------------------

    def _decode_groups(self, seqs: Views) -> list[AttentionGroup]:
        """Cut the decodes (sorted longest first) where padding to the group's longest would grow
        too much."""
        groups, start = [], 0
        while start < len(seqs):
            longest = self._num_blocks(seqs[start].num_computed_tokens + 1)
            end, used = start + 1, longest
            while end < len(seqs):
                used_next = used + self._num_blocks(seqs[end].num_computed_tokens + 1)
                padded = longest * (end + 1 - start)
                is_wasteful = (
                    padded > (1 + self.max_group_padding) * used_next
                    or padded > self.max_group_blocks
                )
                if is_wasteful and end - start >= MIN_DECODE_GROUP:
                    break
                end, used = end + 1, used_next
            groups.append(self._decode_group(seqs[start:end], start))
            start = end
        return groups

    def _decode_group(self, seqs: Views, start: int) -> AttentionGroup:
        lengths = [s.num_computed_tokens + 1 for s in seqs]
        num_blocks = self._num_blocks(max(lengths))
        block_ids = self._block_ids(seqs, num_blocks)
        mask = None
        if any(n != num_blocks * self.block_size for n in lengths):
            keys = torch.arange(num_blocks * self.block_size, device=self.device)
            allowed = keys[None, :] < torch.tensor(lengths, device=self.device)[:, None]
            mask = _additive(allowed, self.dtype)[:, None, None, :]  # [B, 1, 1, keys]
        return AttentionGroup(
            len(seqs), 1, num_blocks, block_ids, mask, rows=slice(start, start + len(seqs))
        )

    def _block_ids(self, seqs: Views, num_blocks: int) -> torch.Tensor:
        table = [
            s.block_table[:num_blocks] + [0] * (num_blocks - min(len(s.block_table), num_blocks))
            for s in seqs
        ]
        return torch.tensor(table, dtype=torch.long, device=self.device).view(-1)

    # Speculative steps ---------------------------------------------------------------------

    def _spec_groups(self, entries: list[tuple[SequenceView, int, int]]) -> list[AttentionGroup]:
        """Sequences verifying drafts (k + 1 queries each) are cut like decodes: by how much
        padding to the group's longest context would add, then attended as padded chunks."""
        entries = sorted(entries, key=lambda e: -(e[0].num_computed_tokens + e[1]))
        groups, start = [], 0
        while start < len(entries):
            longest = self._num_blocks(entries[start][0].num_computed_tokens + entries[start][1])
            end, used = start + 1, longest
            while end < len(entries):
                used_next = used + self._num_blocks(
                    entries[end][0].num_computed_tokens + entries[end][1]
                )
                padded = longest * (end + 1 - start)
                is_wasteful = (
                    padded > (1 + self.max_group_padding) * used_next
                    or padded > self.max_group_blocks
                )
                if is_wasteful and end - start >= MIN_DECODE_GROUP:
                    break
                end, used = end + 1, used_next
            groups.append(self._prefill_group(entries[start:end]))
            start = end
        return groups

    # Prefill chunks -----------------------------------------------------------------------

    def _prefill_groups(self, entries: list[tuple[SequenceView, int, int]]) -> list[AttentionGroup]:
        """``entries``: (sequence, new tokens, first row in the flattened batch)."""
        groups: list[AttentionGroup] = []
        pending: list[tuple[SequenceView, int, int]] = []
        for seq, n, row in entries:
            if seq.num_computed_tokens == 0 and n >= MIN_DIRECT_PREFILL:
                groups.append(AttentionGroup(1, n, 0, None, None, rows=slice(row, row + n)))
            else:
                pending.append((seq, n, row))
        pending.sort(key=lambda e: -(e[0].num_computed_tokens + e[1]))
        start = 0
        while start < len(pending):
            end = start + 1
            while end < len(pending) and self._is_worth_joining(pending[start : end + 1]):
                end += 1
            groups.append(self._prefill_group(pending[start:end]))
            start = end
        return groups

    def _is_worth_joining(self, entries: list[tuple[SequenceView, int, int]]) -> bool:
        q_len = max(n for _, n, _ in entries)
        num_keys = (
            self._num_blocks(max(s.num_computed_tokens + n for s, n, _ in entries))
            * self.block_size
        )
        padded = len(entries) * q_len * num_keys
        actual = sum(n * (s.num_computed_tokens + n) for s, n, _ in entries)
        return (
            padded <= MAX_PREFILL_PADDING * actual
            and padded * self.group <= MAX_GROUP_MASK_ELEMENTS
        )

    def _prefill_group(self, entries: list[tuple[SequenceView, int, int]]) -> AttentionGroup:
        seqs = [s for s, _, _ in entries]
        lengths = torch.tensor([n for _, n, _ in entries], device=self.device)
        q_len = int(lengths.max())
        num_blocks = self._num_blocks(max(s.num_computed_tokens + n for s, n, _ in entries))
        block_ids = self._block_ids(seqs, num_blocks)
        steps = torch.arange(q_len, device=self.device)
        is_real = steps[None, :] < lengths[:, None]  # [B, q_len]
        first_rows = torch.tensor([r for _, _, r in entries], device=self.device)
        # Padding queries re-read their sequence's first row; their outputs are dropped.
        q_index = (first_rows[:, None] + torch.where(is_real, steps[None, :], 0)).view(-1)
        query_pos = (
            torch.tensor([s.num_computed_tokens for s in seqs], device=self.device)[:, None]
            + steps[None, :]
        )
        keys = torch.arange(num_blocks * self.block_size, device=self.device)
        allowed = keys[None, None, :] <= query_pos[:, :, None]  # [B, q_len, keys], causal
        allowed &= is_real[:, :, None] | (keys == 0)[None, None, :]  # padding rows: key 0 only
        mask = _additive(allowed.repeat(1, self.group, 1), self.dtype)[
            :, None
        ]  # [B, 1, group * q_len, keys]
        if len(entries) == 1 and q_len == int(lengths[0]):
            row = entries[0][2]
            return AttentionGroup(
                1, q_len, num_blocks, block_ids, mask, rows=slice(row, row + q_len)
            )
        flat_real = is_real.view(-1)
        return AttentionGroup(
            len(entries),
            q_len,
            num_blocks,
            block_ids,
            mask,
            q_index=q_index,
            out_index=flat_real.nonzero().view(-1),
            out_rows=q_index[flat_real],
        )


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
        ~allowed, float("-inf")
    )
