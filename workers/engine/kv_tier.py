"""The CPU tier: a bounded second pool of KV blocks in host memory, keyed by content hash.

Blocks the primary pool evicts from its prefix cache, and full blocks of preempted sequences
that the prefix cache would not keep, are copied here; a prefix lookup that misses the primary
cache finds them here, and they are copied back into fresh primary blocks instead of being
recomputed. The tier is inclusive: a restored block keeps its copy here, so evicting it from the
primary pool again costs no copy.

The scheduler only does bookkeeping; the copies it asks for wait in two queues and run in one
batch per direction (``flush``) before the model runs. Saves go first: they read the primary
blocks as the last step left them (a block evicted and then restored into in one step is saved
before it is overwritten), and a block restored in the step that saved it reads what was saved.
An entry being restored is pinned until then, so no save in the same step takes its slot.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

BLOCK_DIM = 3  # of the KV cache: [layers, 2, kv_heads, num_blocks, block_size, head_dim]


@dataclass(slots=True, frozen=True)
class TierEntry:
    """Where a block sits in the tier, and what it holds (checked on every hit)."""

    slot: int
    parent_hash: bytes | None
    token_ids: tuple[int, ...]
    salt: str


class KVTier:
    """``num_blocks`` blocks shaped like the primary cache's, least recently used evicted first:
    pinned host memory when the cache is on CUDA, plain CPU tensors otherwise."""

    def __init__(self, num_blocks: int, kv_cache: torch.Tensor) -> None:
        assert num_blocks > 0, "a tier of no blocks is no tier: pass None"
        shape = list(kv_cache.shape)
        shape[BLOCK_DIM] = num_blocks
        self.storage = torch.zeros(
            shape, dtype=kv_cache.dtype, device="cpu", pin_memory=kv_cache.is_cuda
        )
        self.num_blocks = num_blocks
        self.bytes_per_block = kv_cache.select(BLOCK_DIM, 0).numel() * kv_cache.element_size()
        self.entries: OrderedDict[bytes, TierEntry] = OrderedDict()  # least recently used first
        self._free_slots = list(range(num_blocks - 1, -1, -1))
        self._saves: dict[int, int] = {}  # tier slot -> primary block to copy from
        self._restores: list[tuple[int, int]] = []  # (tier slot, primary block to copy into)
        self._pinned: set[bytes] = set()
        self.num_restored = 0  # tier hits: blocks copied back instead of recomputed
        self.num_saved = 0
        self.num_evicted = 0
        self.num_dropped = 0  # saves refused: every entry was pinned by this step's restores
        self.num_bytes_saved = 0
        self.num_bytes_restored = 0
        self.copy_seconds = 0.0

    @property
    def num_used_blocks(self) -> int:
        return len(self.entries)

    def has(self, digest: bytes, parent: bytes | None, tokens: list[int], salt: str) -> bool:
        """Whether the tier holds this block, verified like a primary hit."""
        entry = self.entries.get(digest)
        return (
            entry is not None
            and entry.parent_hash == parent
            and entry.salt == salt
            and entry.token_ids == tuple(tokens)
        )

    def save(
        self,
        digest: bytes,
        block_id: int,
        parent: bytes | None,
        tokens: tuple[int, ...],
        salt: str,
    ) -> None:
        """Queue a copy of primary block ``block_id`` into the tier (a block it already holds is
        only marked recently used). A full tier evicts its least recently used entry."""
        if digest in self.entries:
            self.entries.move_to_end(digest)
            return
        slot = self._slot_take()
        if slot is None:
            self.num_dropped += 1
            return
        self.entries[digest] = TierEntry(slot, parent, tokens, salt)
        self._saves[slot] = block_id  # replaces a save queued for an entry evicted this step

    def _slot_take(self) -> int | None:
        if self._free_slots:
            return self._free_slots.pop()
        victim = next((d for d in self.entries if d not in self._pinned), None)
        if victim is None:
            return None
        self.num_evicted += 1
        return self.entries.pop(victim).slot

    def pin(self, digest: bytes) -> None:
        """Keep an entry (and its slot) until this step's copies ran: it is about to be restored."""
        assert digest in self.entries, "only an entry found by a lookup is pinned"
        self._pinned.add(digest)

    def restore(self, digest: bytes, block_id: int) -> None:
        """Queue a copy of a pinned entry into primary block ``block_id``."""
        assert digest in self._pinned, "pin an entry before taking blocks for its restore"
        self.entries.move_to_end(digest)
        self._restores.append((self.entries[digest].slot, block_id))

    def flush(self, kv_cache: torch.Tensor) -> None:
        """Run the queued copies, one batched gather and scatter per direction."""
        if not self._saves and not self._restores:
            return
        start = time.perf_counter()
        device = kv_cache.device
        if self._saves:
            slots, blocks = zip(*self._saves.items(), strict=True)
            saved = kv_cache.index_select(BLOCK_DIM, torch.tensor(blocks, device=device))
            self.storage.index_copy_(BLOCK_DIM, torch.tensor(slots), _to_host(saved))
        if self._restores:
            slots, blocks = zip(*self._restores, strict=True)
            staged = _host_buffer(self.storage, len(slots))
            torch.index_select(self.storage, BLOCK_DIM, torch.tensor(slots), out=staged)
            kv_cache.index_copy_(
                BLOCK_DIM,
                torch.tensor(blocks, device=device),
                staged.to(device, non_blocking=True),
            )
        if kv_cache.is_cuda:  # the copies are asynchronous; time them whole
            torch.cuda.synchronize(device)
        self.copy_seconds += time.perf_counter() - start
        self.num_saved += len(self._saves)
        self.num_bytes_saved += len(self._saves) * self.bytes_per_block
        self.num_restored += len(self._restores)
        self.num_bytes_restored += len(self._restores) * self.bytes_per_block
        self._saves, self._restores = {}, []
        self._pinned.clear()


def _host_buffer(storage: torch.Tensor, num_blocks: int) -> torch.Tensor:
    shape = list(storage.shape)
    shape[BLOCK_DIM] = num_blocks
    return torch.empty(shape, dtype=storage.dtype, pin_memory=storage.is_pinned())


def _to_host(blocks: torch.Tensor) -> torch.Tensor:
    """Gathered device blocks in host memory (through a pinned buffer from CUDA)."""
    if not blocks.is_cuda:
        return blocks
    host = torch.empty(blocks.shape, dtype=blocks.dtype, pin_memory=True)
    return host.copy_(blocks)


def tier_snapshot(tier: KVTier | None) -> dict[str, Any]:
    """The tier's counters for ``engine.stats()`` (zeros when it is off)."""
    return {
        "kv_tier_blocks_total": tier.num_blocks if tier else 0,
        "kv_tier_blocks_used": tier.num_used_blocks if tier else 0,
        "kv_tier_hits": tier.num_restored if tier else 0,
        "kv_tier_blocks_saved": tier.num_saved if tier else 0,
        "kv_tier_blocks_evicted": tier.num_evicted if tier else 0,
        "kv_tier_blocks_dropped": tier.num_dropped if tier else 0,
        "kv_tier_bytes_saved": tier.num_bytes_saved if tier else 0,
        "kv_tier_bytes_restored": tier.num_bytes_restored if tier else 0,
        "kv_tier_copy_seconds": tier.copy_seconds if tier else 0.0,
    }
