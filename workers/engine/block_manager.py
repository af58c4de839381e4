"""The KV block pool: allocation, reference counts, and the prefix cache with LRU eviction
(into the CPU tier, when there is one)."""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict

from workers.engine.errors import OutOfBlocks
from workers.engine.kv_tier import KVTier
from workers.engine.sequence import Sequence


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "parent_hash", "token_ids", "salt")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.hash: bytes | None = None  # set while the block is registered in the prefix cache
        self.parent_hash: bytes | None = None
        self.token_ids: tuple[int, ...] = ()
        self.salt = ""

    def forget(self) -> None:
        self.hash, self.parent_hash, self.token_ids, self.salt = None, None, (), ""


def block_hash(parent: bytes | None, token_ids: list[int] | tuple[int, ...], salt: str) -> bytes:
    """Chained content hash: a block's identity includes every token before it and the salt."""
    h = hashlib.blake2b(digest_size=16)
    h.update(parent or b"\0" * 16)
    encoded_salt = salt.encode()
    h.update(len(encoded_salt).to_bytes(4, "little") + encoded_salt)
    h.update(array("q", token_ids).tobytes())
    return h.digest()


class BlockManager:
    """Hands out fixed-size KV blocks.

    Free blocks sit in one LRU queue (front = evicted first). A freed block that holds a full,
    hashed block of tokens goes to the back and stays findable by its hash until reused; a
    plain free block goes to the front. So cached prefixes survive as long as possible.

    With a ``tier``, an evicted cached block is copied there first, and so are a preempted
    sequence's full blocks that the prefix cache does not hold; lookups fall back on it.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        is_prefix_caching_enabled: bool,
        tier: KVTier | None = None,
    ) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.is_prefix_caching_enabled = is_prefix_caching_enabled
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached: dict[bytes, int] = {}  # hash -> block_id
        # Free blocks still holding a cached prefix (hashed), kept as blocks move: the worker
        # reads the engine's counters between steps, and a scan of a pool of 10^4 blocks took
        # a fifth of a small model's engine thread under load.
        self._num_cached_free = 0
        self.tier = tier
        self.num_prefix_query_tokens = 0
        self.num_prefix_hit_tokens = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def num_cached_free_blocks(self) -> int:
        return self._num_cached_free

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # Prefix cache ------------------------------------------------------------------------

    def prefix_lookup(self, seq: Sequence) -> list[int | None]:
        """Block ids holding the longest cached prefix of ``seq``, verified token by token; None
        where only the CPU tier holds the block (``allocate`` copies it back).

        At least one token is always left to compute, so the last prompt token's logits exist.
        Without prefix caching the tier still gives a preempted sequence its own blocks back.
        """
        if seq.is_embedding:
            return []
        is_primary = self.is_prefix_caching_enabled
        tier = self.tier if is_primary or seq.num_preemptions else None
        if not is_primary and tier is None:
            return []
        hits: list[int | None] = []
        for i, digest in enumerate(self._hashes(seq, (seq.num_tokens - 1) // self.block_size)):
            tokens = seq.token_ids[i * self.block_size : (i + 1) * self.block_size]
            parent = seq.block_hashes[i - 1] if i else None
            block_id = self.cached.get(digest) if is_primary else None
            if block_id is not None and self._is_match(
                self.blocks[block_id], parent, tokens, seq.salt
            ):
                hits.append(block_id)
            elif tier is not None and tier.has(digest, parent, tokens, seq.salt):
                hits.append(None)
            else:
                break
        return hits

    @staticmethod
    def _is_match(block: Block, parent: bytes | None, tokens: list[int], salt: str) -> bool:
        return (
            block.parent_hash == parent and block.salt == salt and block.token_ids == tuple(tokens)
        )

    def prompt_block_hashes(self, seq: Sequence) -> list[bytes]:
        """Hashes of every full block of the sequence's tokens except the last token's block."""
        return self._hashes(seq, (seq.num_tokens - 1) // self.block_size)

    def _hashes(self, seq: Sequence, num_blocks: int) -> list[bytes]:
        """Hashes of the sequence's first ``num_blocks`` blocks (full ones), computed lazily."""
        for i in range(len(seq.block_hashes), num_blocks):
            tokens = seq.token_ids[i * self.block_size : (i + 1) * self.block_size]
            seq.block_hashes.append(
                block_hash(seq.block_hashes[i - 1] if i else None, tokens, seq.salt)
            )
        return seq.block_hashes[:num_blocks]

    def in_flight(self, seq: Sequence) -> list[bytes]:
        """Hashes of full blocks this running sequence has yet to compute: cache hits to be."""
        if not self.is_prefix_caching_enabled or seq.is_embedding:
            return []
        return self.prompt_block_hashes(seq)[seq.num_committed_blocks :]

    def prefix_record(self, num_query_tokens: int, num_hit_tokens: int) -> None:
        self.num_prefix_query_tokens += num_query_tokens
        self.num_prefix_hit_tokens += num_hit_tokens

    # Allocation --------------------------------------------------------------------------

    def num_free_after_hits(self, hits: list[int | None]) -> int:
        """Free blocks left once the cached blocks in ``hits`` are taken out of the free queue
        and those restored from the tier have fresh blocks."""
        return self.num_free_blocks - sum(
            1 for b in hits if b is None or self.blocks[b].ref_count == 0
        )

    def allocate(self, seq: Sequence, hits: list[int | None]) -> None:
        """Give a waiting sequence its cached prefix blocks (copying back those in the tier); new
        blocks come with ``append_slots``."""
        assert not seq.block_table, f"{seq} already holds blocks"
        for i, block_id in enumerate(hits):
            if block_id is None:
                assert self.tier is not None, "only a tier gives hits outside the pool"
                self.tier.pin(seq.block_hashes[i])
            else:
                block = self.blocks[block_id]
                if block.ref_count == 0:
                    del self.free_queue[block_id]
                    self._num_cached_free -= block.hash is not None
                block.ref_count += 1
        seq.block_table = [
            self._restore(seq, i) if block_id is None else block_id
            for i, block_id in enumerate(hits)
        ]
        seq.num_committed_blocks = len(hits)
        seq.num_computed_tokens = len(hits) * self.block_size

    def _restore(self, seq: Sequence, i: int) -> int:
        """A fresh block for the sequence's block ``i``, copied back from the tier and
        registered in the prefix cache under its hash."""
        assert self.tier is not None, "only a tier restores"
        block_id = self._take_free_block()
        digest = seq.block_hashes[i]
        self.tier.restore(digest, block_id)
        if self.is_prefix_caching_enabled and digest not in self.cached:
            self.cached[digest] = block_id
            block = self.blocks[block_id]
            block.hash, block.parent_hash, block.salt = (
                digest,
                seq.block_hashes[i - 1] if i else None,
                seq.salt,
            )
            block.token_ids = tuple(seq.token_ids[i * self.block_size : (i + 1) * self.block_size])
        return block_id

    def num_new_blocks(self, seq: Sequence, num_new_tokens: int) -> int:
        return max(
            self.num_blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table), 0
        )

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.num_new_blocks(seq, num_new_tokens) <= self.num_free_blocks

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> None:
        """Make sure blocks exist for the next ``num_new_tokens`` tokens of ``seq``."""
        for _ in range(self.num_new_blocks(seq, num_new_tokens)):
            seq.block_table.append(self._take_free_block())

    def _take_free_block(self) -> int:
        if not self.free_queue:
            raise OutOfBlocks("no free KV block")
        block_id, _ = self.free_queue.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None:  # evict the least recently used cached block
            self._num_cached_free -= 1
            if self.cached.get(block.hash) == block_id:
                del self.cached[block.hash]
            if self.tier is not None:
                self.tier.save(block.hash, block_id, block.parent_hash, block.token_ids, block.salt)
            block.forget()
        block.ref_count = 1
        return block_id

    def commit(self, seq: Sequence) -> None:
        """Register the sequence's blocks that are now full of computed tokens in the prefix
        cache."""
        if not self.is_prefix_caching_enabled:
            return
        num_full = seq.num_computed_tokens // self.block_size
        for i in range(seq.num_committed_blocks, num_full):
            tokens = seq.token_ids[i * self.block_size : (i + 1) * self.block_size]
            parent = seq.block_hashes[i - 1] if i else None
            if i == len(seq.block_hashes):
                seq.block_hashes.append(block_hash(parent, tokens, seq.salt))
            block = self.blocks[seq.block_table[i]]
            digest = seq.block_hashes[i]
            if block.hash is None and digest not in self.cached:
                self.cached[digest] = block.block_id
                block.hash, block.parent_hash, block.token_ids, block.salt = (
                    digest,
                    parent,
                    tuple(tokens),
                    seq.salt,
                )
        seq.num_committed_blocks = max(seq.num_committed_blocks, num_full)

    def truncate(self, seq: Sequence) -> None:
        """Free the blocks wholly past the sequence's computed tokens (rejected draft tokens):
        they were reserved for this sequence alone and never published to the prefix cache."""
        keep = self.num_blocks_for(seq.num_computed_tokens)
        for block_id in seq.block_table[keep:]:
            block = self.blocks[block_id]
            assert block.ref_count == 1 and block.hash is None, (
                f"block {block_id} is shared or cached"
            )
            block.ref_count = 0
            self.free_queue[block_id] = None
            self.free_queue.move_to_end(block_id, last=False)
        del seq.block_table[keep:]

    def preempt(self, seq: Sequence) -> None:
        """Free a preempted sequence's blocks, first saving to the tier its full computed blocks
        that the prefix cache will not keep (all of them without prefix caching); those it
        keeps go to the tier if and when they are evicted."""
        if self.tier is not None and not seq.is_embedding:  # an embedding recomputes its pooling
            # Only a prefix is ever restored: blocks past the tier's size would evict the first.
            num_full = min(seq.num_computed_tokens // self.block_size, self.tier.num_blocks)
            for i, digest in enumerate(self._hashes(seq, num_full)):
                block = self.blocks[seq.block_table[i]]
                if block.hash is None and digest not in self.cached:
                    tokens = tuple(seq.token_ids[i * self.block_size : (i + 1) * self.block_size])
                    parent = seq.block_hashes[i - 1] if i else None
                    self.tier.save(digest, block.block_id, parent, tokens, seq.salt)
        self.free(seq)

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's references; blocks nobody holds return to the free queue."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {block_id} freed twice"
            if block.ref_count == 0:
                self.free_queue[block_id] = None
                if block.hash is None:
                    self.free_queue.move_to_end(block_id, last=False)
                else:
                    self._num_cached_free += 1
        seq.block_table = []
        seq.num_committed_blocks = 0
        seq.num_computed_tokens = 0
