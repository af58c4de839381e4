"""Paged attention in plain torch: K/V live in fixed-size blocks and are read through block tables.

The flattened batch (all sequences' new tokens back to back) is cut into groups (see
workers/engine/metadata.py): decodes of similar context length, prefill chunks over cached
context (queries padded), or one long fresh chunk. Per group, the blocks its sequences own are
gathered into a workspace (one index_select per K and V, no Python loop over sequences) and
scaled_dot_product_attention runs on them with an additive length/causal mask. Grouped-query
heads are folded into the query-length axis ([B, kv_heads, group * q_len, head_dim]), so K/V are
never repeated per query head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F


@dataclass(slots=True)
class AttentionGroup:
    """Sequences attended together: queries padded to ``q_len``, keys to ``num_blocks`` blocks."""

    num_seqs: int
    q_len: int  # new tokens per sequence (1 for decode groups), padded to the longest
    num_blocks: int  # blocks per sequence in block_ids (padded to the longest)
    block_ids: torch.Tensor | None  # [num_seqs * num_blocks]; None: fresh prefill, no cache read
    mask: torch.Tensor | None  # additive float [num_seqs, 1, rows, keys] (0 / -inf); None: all keys
    rows: slice | None = None  # the group's rows of the flattened batch, when they need no padding
    q_index: torch.Tensor | None = None  # else: [num_seqs * q_len] rows to read queries from
    out_index: torch.Tensor | None = (
        None  # [num_real] positions of real tokens in the padded layout
    )
    out_rows: torch.Tensor | None = None  # [num_real] their rows in the flattened batch


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens]: block_id * block_size + offset of each new token
    groups: list[AttentionGroup]


class GatherWorkspace:
    """Reusable K/V gather buffers: fresh large allocations cost page faults on every layer."""

    def __init__(self) -> None:
        self._k = torch.empty(0)
        self._v = torch.empty(0)

    def get(self, like: torch.Tensor, num_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
        kv_heads, _, block_size, head_dim = like.shape
        numel = kv_heads * num_blocks * block_size * head_dim
        if self._k.numel() < numel or self._k.dtype != like.dtype or self._k.device != like.device:
            size = max(numel, int(self._k.numel() * 1.5))
            self._k = torch.empty(size, dtype=like.dtype, device=like.device)
            self._v = torch.empty(size, dtype=like.dtype, device=like.device)
        shape = (kv_heads, num_blocks, block_size, head_dim)
        return self._k[:numel].view(shape), self._v[:numel].view(shape)


def kv_write(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """Store new keys/values. Caches: [kv_heads, num_blocks, block_size, head_dim]; k, v: [T,
    kv_heads, head_dim]."""
    kv_heads, _, _, head_dim = k_cache.shape
    k_cache.view(kv_heads, -1, head_dim).index_copy_(1, slots, k.transpose(0, 1))
    v_cache.view(kv_heads, -1, head_dim).index_copy_(1, slots, v.transpose(0, 1))


def paged_attention(
    q: torch.Tensor,  # [T, num_heads, head_dim]
    k: torch.Tensor,  # [T, kv_heads, head_dim] (this step's keys, already in the cache)
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    workspace: GatherWorkspace,
) -> torch.Tensor:
    num_heads, head_dim = q.shape[1], q.shape[2]
    kv_heads = k.shape[1]
    out = torch.empty_like(q)
    for group in meta.groups:
        if group.rows is not None:
            query = q[group.rows]
        else:
            assert group.q_index is not None, "a padded group reads its queries by index"
            query = q.index_select(0, group.q_index)
        if group.block_ids is None:
            o = _fresh_prefill(query, k[group.rows], v[group.rows], scale)
        else:
            k_blocks, v_blocks = workspace.get(k_cache, group.block_ids.numel())
            _blocks_gather(k_cache, group.block_ids, k_blocks)
            _blocks_gather(v_cache, group.block_ids, v_blocks)
            # [B, kv_heads, num_keys, head_dim], a view of the gathered blocks
            keys = k_blocks.view(kv_heads, group.num_seqs, -1, head_dim).transpose(0, 1)
            values = v_blocks.view(kv_heads, group.num_seqs, -1, head_dim).transpose(0, 1)
            folded = _fold_gqa(query, group.num_seqs, group.q_len, kv_heads)
            o = F.scaled_dot_product_attention(
                folded, keys, values, attn_mask=group.mask, scale=scale
            )
            o = _unfold_gqa(o, group.num_seqs, group.q_len, num_heads)
        if group.rows is not None:
            out[group.rows] = o
        else:
            assert group.out_rows is not None and group.out_index is not None, (
                "a padded group writes its real rows back by index"
            )
            out.index_copy_(0, group.out_rows, o.index_select(0, group.out_index))
    return out


def _blocks_gather(cache: torch.Tensor, block_ids: torch.Tensor, out: torch.Tensor) -> None:
    """`cache`'s blocks `block_ids` into `out` ([kv_heads, len(block_ids), block_size, head_dim]).
    On the CPU, one index_select along the first dimension per KV head, each a copy of whole
    contiguous blocks: one select along the blocks' dimension (1) took about twice as long
    (measured: 226-240 against 121-128 µs for 672 blocks of 2 KV heads). The gather was the
    largest op after the projections in a decode step's profile (`python -m
    workers.engine.bench.profile_step`)."""
    if cache.device.type != "cpu":
        torch.index_select(cache, 1, block_ids, out=out)
        return
    for head in range(cache.shape[0]):
        torch.index_select(cache[head], 0, block_ids, out=out[head])


def _fresh_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """A chunk with no cached context attends causally to itself: no gather needed."""
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        k.transpose(0, 1)[None],
        v.transpose(0, 1)[None],
        is_causal=True,
        scale=scale,
        enable_gqa=True,
    )  # [1, num_heads, q_len, head_dim]
    return o[0].transpose(0, 1)


def _fold_gqa(q: torch.Tensor, num_seqs: int, q_len: int, kv_heads: int) -> torch.Tensor:
    """[B * q_len, num_heads, D] -> [B, kv_heads, group * q_len, D] (row = g * q_len + i)."""
    head_dim = q.shape[-1]
    group = q.shape[1] // kv_heads
    q = q.view(num_seqs, q_len, kv_heads, group, head_dim)
    return q.permute(0, 2, 3, 1, 4).reshape(num_seqs, kv_heads, group * q_len, head_dim)


def _unfold_gqa(o: torch.Tensor, num_seqs: int, q_len: int, num_heads: int) -> torch.Tensor:
    kv_heads, head_dim = o.shape[1], o.shape[-1]
    o = o.view(num_seqs, kv_heads, num_heads // kv_heads, q_len, head_dim)
    return o.permute(0, 3, 1, 2, 4).reshape(num_seqs * q_len, num_heads, head_dim)
