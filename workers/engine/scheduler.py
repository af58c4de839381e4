"""Iteration-level scheduling: which sequences run this step, and how many tokens each."""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from workers.engine.block_manager import BlockManager
from workers.engine.config import EngineConfig
from workers.engine.policy import SchedulingPolicy
from workers.engine.sequence import FinishReason, Sequence, SequenceStatus

Lookahead = Callable[[Sequence, int], int]  # (sequence, sequences running) -> draft slots


@dataclass(slots=True)
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    num_preempted: int = 0

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def add(self, seq: Sequence, num_tokens: int) -> None:
        self.seqs.append(seq)
        self.num_new_tokens.append(num_tokens)


class Scheduler:
    """Continuous batching under a token budget, with chunked prefill and preemption by recompute.

    Each step: running sequences first, in policy order, growing their block tables (a prefill
    chunk never takes the budget the decodes behind it need); when the pool runs dry the
    lowest-priority running sequence is preempted (its blocks freed, its tokens recomputed
    later, except blocks the prefix cache or the CPU tier still holds). Then, if nothing was
    preempted, waiting sequences are admitted in policy order while the budget,
    ``max_num_seqs`` and the pool (minus a watermark) allow, each starting from its longest
    cached prefix.

    With fair preemption on, a step first makes room when every slot is taken and a waiting
    sequence's tenant runs fewer than its weighted share of the slots: the running sequence
    of the tenant furthest over its share is preempted, and the waiting one is admitted
    ahead of everyone (``promoted``), so one tenant's flood cannot hold every slot while
    another tenant's request waits for one to finish.
    """

    def __init__(
        self,
        config: EngineConfig,
        block_manager: BlockManager,
        policy: SchedulingPolicy,
        lookahead: Lookahead | None = None,
    ) -> None:
        self.config = config
        # Speculative decoding: draft slots a decoding sequence wants (k of k + 1 this step).
        self.lookahead = lookahead
        self.block_manager = block_manager
        self.policy = policy
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.num_fair_preemptions = 0
        # Waiting sequences a fair preemption made room for: admitted before the others.
        self.promoted: list[Sequence] = []
        # When a sequence of a lane that does not yield was last seen (time.monotonic(); 0:
        # never, or no lane yields): read by callers that yield too (the batch runner).
        self.foreground_at = 0.0
        self._watermark_blocks = int(config.watermark * block_manager.num_blocks)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def active_tenants(self) -> set[str]:
        return {s.tenant for s in self.waiting} | {s.tenant for s in self.running}

    def add(self, seq: Sequence) -> None:
        self.policy.on_added(seq, self.active_tenants())
        self.waiting.append(seq)

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        yielding = self._yield_room()
        if self.config.is_fair_preemption_enabled:
            self._preempt_for_fairness()
        budget = self._schedule_running(batch, self.config.max_num_batched_tokens, yielding)
        if not batch.num_preempted:
            self._schedule_waiting(batch, budget, yielding)
        return batch

    def _yield_room(self) -> list[int] | None:
        """Places left this step for sequences of the yielding lanes (one mutable count), or
        None when they need not give way: no lane yields, or no other lane has a sequence."""
        lanes = self.config.yield_lanes
        if not lanes:
            return None
        for seq in (*self.running, *self.waiting):
            if seq.lane not in lanes:
                self.foreground_at = time.monotonic()
                return [self.config.yield_max_seqs]
        return None

    def _gives_way(self, seq: Sequence, yielding: list[int] | None) -> bool:
        """Whether `seq` sits this step out (its lane yields and their places are taken); if
        not and its lane yields, it takes one of their places."""
        if yielding is None or seq.lane not in self.config.yield_lanes:
            return False
        if yielding[0] <= 0:
            return True
        yielding[0] -= 1
        return False

    def _schedule_running(
        self, batch: ScheduledBatch, budget: int, yielding: list[int] | None = None
    ) -> int:
        """Running sequences in policy order; prefill chunks leave room for every decode.
        Those of a yielding lane beyond its places sit the step out."""
        self.running.sort(key=self.policy.key)
        num_decodes_left = sum(1 for s in self.running if not s.is_prefilling)
        caps = self._fair_step_caps()
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if self._gives_way(seq, yielding) or self._over_step_share(seq, caps):
                num_decodes_left -= 0 if seq.is_prefilling else 1
                i += 1
                continue
            if seq.is_prefilling:
                # Shrink the chunk to the room there is before preempting anyone for it.
                room = self._room(seq) if self.config.is_chunked_prefill_enabled else seq.num_tokens
                num_tokens = min(
                    seq.num_tokens - seq.num_computed_tokens,
                    budget - num_decodes_left,
                    max(room, 1),
                )
                if num_tokens <= 0:
                    i += 1
                    continue
            else:
                num_decodes_left -= 1
                num_tokens = 1 + self._num_draft_slots(seq, budget - 1 - num_decodes_left)
            while not self.block_manager.can_append(seq, num_tokens):
                victim = self.running.pop()  # the lowest priority of those not yet scheduled
                if victim is not seq and not victim.is_prefilling:
                    num_decodes_left -= 1
                self._preempt(victim)
                batch.num_preempted += 1
                if victim is seq:
                    return budget
            self.block_manager.append_slots(seq, num_tokens)
            batch.add(seq, num_tokens)
            self.policy.on_scheduled(seq, num_tokens)
            budget -= num_tokens
            i += 1
        return budget

    def _shares(self) -> tuple[Counter, dict[str, float]]:
        """Running sequences per tenant, and each present tenant's weighted share of the slots
        (over the tenants running or waiting)."""
        running = Counter(s.tenant for s in self.running)
        tenants = set(running) | {s.tenant for s in self.waiting}
        weights: dict[str, float] = getattr(self.policy, "tenant_weights", {})
        total = sum(weights.get(t, 1.0) for t in tenants) or 1.0
        slots = self.config.max_num_seqs
        return running, {t: slots * weights.get(t, 1.0) / total for t in tenants}

    def _fair_step_caps(self) -> dict[str, int] | None:
        """Sequences each tenant over its share may run this step, while another runs under
        its share (is_fair_step_share_enabled); None: no cap this step."""
        config = self.config
        if not (config.is_fair_preemption_enabled and config.is_fair_step_share_enabled):
            return None
        running, shares = self._shares()
        if len(running) < 2 or not any(n < shares[t] for t, n in running.items()):
            return None
        return {t: max(1, math.ceil(shares[t])) for t, n in running.items() if n > shares[t]}

    @staticmethod
    def _over_step_share(seq: Sequence, caps: dict[str, int] | None) -> bool:
        """Whether `seq` sits this step out (its tenant ran its share of this step); if not
        and its tenant is capped, it takes one of its places."""
        if caps is None or seq.tenant not in caps:
            return False
        if caps[seq.tenant] <= 0:
            return True
        caps[seq.tenant] -= 1
        return False

    def _num_draft_slots(self, seq: Sequence, budget: int) -> int:
        """Draft tokens a decoding sequence verifies this step: what its proposer wants, within the
        budget left after every other decode, and only if the pool has the blocks for all k + 1
        slots (across a block boundary too); speculation never preempts anyone."""
        if self.lookahead is None or budget <= 0:
            return 0
        k = min(self.lookahead(seq, len(self.running)), budget)
        return k if k > 0 and self.block_manager.can_append(seq, 1 + k) else 0

    def _room(self, seq: Sequence) -> int:
        """New tokens the sequence can take without anyone being preempted."""
        bm = self.block_manager
        return (
            len(seq.block_table) * bm.block_size
            - seq.num_computed_tokens
            + bm.num_free_blocks * bm.block_size
        )

    def _preempt_for_fairness(self) -> None:
        """When every slot is taken: for each waiting sequence (in policy order) whose tenant
        runs fewer than its weighted share of the slots even with it, preempt the running
        sequence that sorts last (lowest lane, then the highest virtual token counter, then
        the latest) among the tenants that stay at or above their share without it; never
        one of a higher lane. Shares count running sequences only, so a preempted sequence
        waiting again cannot take its slot back while its tenant is still over its share."""
        slots = self.config.max_num_seqs
        if len(self.running) < slots or not self.waiting:
            return
        running, shares = self._shares()
        if len(shares) < 2:
            return
        lane_rank = getattr(self.policy, "lane_rank", None) or (lambda seq: 0)
        promoted = {id(s) for s in self.promoted}
        for seq in sorted(self.waiting, key=self.policy.key):
            if id(seq) in promoted or running[seq.tenant] + 1 > shares[seq.tenant]:
                continue
            victims = [
                v
                for v in self.running
                if running[v.tenant] - 1 >= shares[v.tenant] and lane_rank(v) >= lane_rank(seq)
            ]
            if not victims:
                continue
            victim = max(victims, key=self.policy.key)
            self.running.remove(victim)
            self._preempt(victim)
            self.num_fair_preemptions += 1
            running[victim.tenant] -= 1
            running[seq.tenant] += 1
            self.promoted.append(seq)

    def _waiting_order(self) -> Iterator[Sequence]:
        """Waiting sequences to try, promoted ones first, then in policy order. Keys only
        grow within a step (tenants are charged as they are scheduled), so a heap re-checks a
        popped key instead of sorting every waiting sequence again after each admission."""
        promoted = [s for s in self.promoted if s.status is SequenceStatus.WAITING]
        yield from promoted
        skip = {id(s) for s in promoted}
        heap = [(self.policy.key(s), s.arrival_order, s) for s in self.waiting if id(s) not in skip]
        heapq.heapify(heap)
        rekeyed: set[int] = set()
        while heap:
            key, order, seq = heapq.heappop(heap)
            if id(seq) not in rekeyed and (fresh := self.policy.key(seq)) != key:
                rekeyed.add(id(seq))
                heapq.heappush(heap, (fresh, order, seq))
                continue
            yield seq

    def _schedule_waiting(
        self, batch: ScheduledBatch, budget: int, yielding: list[int] | None = None
    ) -> None:
        """Admit waiting sequences (``_waiting_order``) while the budget and the slots allow.
        One of a yielding lane beyond its places waits for a later step."""
        in_flight: set[bytes] | None = None
        for seq in self._waiting_order():
            if budget <= 0 or len(self.running) >= self.config.max_num_seqs:
                return
            if yielding is not None and seq.lane in self.config.yield_lanes and yielding[0] <= 0:
                continue
            hits = self.block_manager.prefix_lookup(seq)
            if self.block_manager.is_prefix_caching_enabled and not seq.is_embedding:
                in_flight = self._in_flight() if in_flight is None else in_flight
                if len(hits) < len(seq.block_hashes) and seq.block_hashes[len(hits)] in in_flight:
                    # Another sequence is computing this prefix right now: wait and reuse it
                    # rather than compute the same blocks twice.
                    continue
            num_tokens = self._admission_chunk(seq, hits, budget, is_alone=not batch.seqs)
            if num_tokens == 0:
                return
            self.waiting.remove(seq)
            self._gives_way(seq, yielding)  # takes one of its lane's places
            self._admit(seq, hits, num_tokens)
            batch.add(seq, num_tokens)
            self.policy.on_scheduled(seq, num_tokens)
            budget -= num_tokens
            if in_flight is not None:
                in_flight.update(self.block_manager.in_flight(seq))

    def _admission_chunk(
        self, seq: Sequence, hits: list[int | None], budget: int, *, is_alone: bool
    ) -> int:
        """Tokens a waiting sequence may start with (0: not now), given budget and free blocks.

        The watermark keeps room for running sequences to grow; with nothing running it is
        waived, so a request as large as the whole pool still gets in.
        """
        bm = self.block_manager
        num_tokens = seq.num_tokens - len(hits) * bm.block_size
        watermark = self._watermark_blocks if self.running else 0
        room = (bm.num_free_after_hits(hits) - watermark) * bm.block_size
        if not self.config.is_chunked_prefill_enabled:
            # A prompt runs whole; one longer than the budget runs alone.
            is_fitting = num_tokens <= budget or is_alone
            return num_tokens if is_fitting and num_tokens <= room else 0
        return max(min(num_tokens, budget, room), 0)

    def _in_flight(self) -> set[bytes]:
        hashes: set[bytes] = set()
        for seq in self.running:
            if seq.is_prefilling:
                hashes.update(self.block_manager.in_flight(seq))
        return hashes

    def _admit(self, seq: Sequence, hits: list[int | None], num_tokens: int) -> None:
        if seq.num_preemptions == 0:
            seq.num_cached_tokens = len(hits) * self.block_manager.block_size
            self.block_manager.prefix_record(seq.num_tokens, seq.num_cached_tokens)
        self.block_manager.allocate(seq, hits)
        self.block_manager.append_slots(seq, num_tokens)
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        if self.promoted and seq in self.promoted:
            self.promoted.remove(seq)

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.preempt(seq)
        seq.spec_token_ids, seq.draft_num_computed = [], 0
        seq.hidden_sum = seq.hidden_last = (
            None  # an embedding restarts its pooling with its prefill
        )
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.append(seq)

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """Retire a sequence (finished or aborted) and give its blocks back."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        if self.promoted and seq in self.promoted:
            self.promoted.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
