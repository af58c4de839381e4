"""Engine counters: KV usage and waste, prefix hits, the CPU tier, batch sizes, preemptions,
throughput."""

from __future__ import annotations

from collections import Counter, deque
from typing import Any

from workers.engine.block_manager import BlockManager
from workers.engine.kv_tier import tier_snapshot
from workers.engine.scheduler import ScheduledBatch, Scheduler

# Steps whose composition and time are kept for the capacity planner's step-time fit.
NUM_STEP_SAMPLES = 256


def step_composition(batch: ScheduledBatch) -> tuple[int, int, int]:
    """(prefill tokens, decoding sequences, their context tokens summed) of a scheduled step,
    read before it runs. Speculative verification counts as a decode of its context."""
    prefill = decodes = context = 0
    for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
        if seq.is_prefilling:
            prefill += n
        else:
            decodes += 1
            context += seq.num_computed_tokens + n
    return prefill, decodes, context


class EngineStats:
    """Accumulates per-step figures; ``snapshot`` turns them into a plain dict."""

    def __init__(self) -> None:
        self.num_steps = 0
        self.num_prefill_tokens = 0  # tokens whose K/V were computed from a prompt or a recompute
        self.num_generated_tokens = 0
        self.num_finished: Counter[str] = Counter()
        self.batch_seqs: Counter[int] = Counter()  # sequences per step -> number of steps
        self.num_batched_tokens = 0
        self.kv_reserved_slots = 0  # summed over steps
        self.kv_wasted_slots = 0
        # The last steps' (prefill tokens, decodes, context tokens, seconds, step number): a
        # bounded sample the worker publishes with its other stats (the capacity planner fits
        # step times to it; the number lets a reader join samples read at different times).
        self.step_samples: deque[tuple[int, int, int, float, int]] = deque(maxlen=NUM_STEP_SAMPLES)

    def record_step_time(self, composition: tuple[int, int, int], seconds: float) -> None:
        self.step_samples.append((*composition, round(seconds, 6), self.num_steps))

    def record_step(
        self,
        batch: ScheduledBatch,
        num_generated: int,
        scheduler: Scheduler,
        *,
        num_spec_tokens: int = 0,
    ) -> None:
        """``num_spec_tokens``: tokens of speculative sequences (their last token and drafts)."""
        if not batch.seqs:
            return
        self.num_steps += 1
        self.batch_seqs[len(batch.seqs)] += 1
        self.num_batched_tokens += batch.num_tokens
        self.num_generated_tokens += num_generated
        self.num_prefill_tokens += sum(n for n in batch.num_new_tokens if n > 1) - num_spec_tokens
        bm = scheduler.block_manager
        reserved = (bm.num_blocks - bm.num_free_blocks) * bm.block_size
        # Only a sequence's own tail block can be part-empty: shared blocks are always full.
        wasted = sum(
            len(s.block_table) * bm.block_size - s.num_computed_tokens for s in scheduler.running
        )
        self.kv_reserved_slots += reserved
        self.kv_wasted_slots += wasted

    def snapshot(self, block_manager: BlockManager, scheduler: Scheduler) -> dict[str, Any]:
        bm = block_manager
        num_steps = max(self.num_steps, 1)
        return {
            "kv_blocks_total": bm.num_blocks,
            "kv_blocks_used": bm.num_blocks - bm.num_free_blocks,
            "kv_blocks_free": bm.num_free_blocks,
            "kv_blocks_cached_free": bm.num_cached_free_blocks,
            "kv_block_size": bm.block_size,
            "kv_waste": self.kv_wasted_slots / self.kv_reserved_slots
            if self.kv_reserved_slots
            else 0.0,
            "prefix_query_tokens": bm.num_prefix_query_tokens,
            "prefix_hit_tokens": bm.num_prefix_hit_tokens,
            "prefix_hit_rate": bm.num_prefix_hit_tokens / bm.num_prefix_query_tokens
            if bm.num_prefix_query_tokens
            else 0.0,
            **tier_snapshot(bm.tier),
            "num_preemptions": scheduler.num_preemptions,
            "num_fair_preemptions": scheduler.num_fair_preemptions,
            "num_running": len(scheduler.running),
            "num_waiting": len(scheduler.waiting),
            "num_steps": self.num_steps,
            "num_prefill_tokens": self.num_prefill_tokens,
            "num_generated_tokens": self.num_generated_tokens,
            "num_batched_tokens": self.num_batched_tokens,
            "batch_seqs_mean": sum(k * v for k, v in self.batch_seqs.items()) / num_steps,
            "batch_seqs_histogram": dict(sorted(self.batch_seqs.items())),
            "batch_tokens_mean": self.num_batched_tokens / num_steps,
            "num_finished": dict(self.num_finished),
            "step_samples": [list(sample) for sample in self.step_samples],
        }
