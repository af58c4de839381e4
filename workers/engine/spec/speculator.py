"""The speculation controller: who speculates this step and how far, proposals, verification,
and vLLM's counters (drafts, draft tokens, accepted tokens, accepted per position).

Who speculates: the hard rules first (the request allows it, no penalties, guide or embedding,
``min_tokens`` reached; a seeded sampled request by config alone; the optional batch cap and
acceptance pause), then, when the config is adaptive, the measured costs: a sequence drafts
when its smoothed acceptance makes a step with drafts yield more tokens per second than one
without at the current batch size (``costs.speculation_pays``; a new sequence's acceptance
starts from the engine's recent one; with no request waiting for a slot, every sequence
decides on the acceptance of the method's last hundred or so tries, see
``decision_acceptance``), with hysteresis: a sequence
that speculated last time stops only once the rule fails by ``SWITCH_MARGIN``, one that did not
starts only once it passes by as much. A sequence whose draft model would first have to catch
up (its prompt, or the tokens of its steps without drafts) starts only if its drafts would save
more over its remaining tokens than the catch-up costs (``costs.switching_on_pays``, the
catch-up measured per token like the other costs). Two steps in a row out of every
``explore_interval`` of a batch-size bucket do the opposite, so both costs and every sequence's
acceptance stay measured (the interval doubles, up to ``EXPLORE_BACKOFF_MAX`` times, while each
exploration leaves the rule's verdict as it was, and is back at ``explore_interval`` once one
changes it), except that an exploring step switches on at most one sequence that
would have to catch up: that is the one-off work the rule declined, and paying it for every
sequence of the batch cost more than speculation could win back at large batch sizes.

Prompt lookup needs no exploration to keep its acceptance measured where the rule switched it
off: on a greedy sequence, what it would propose is scored against the tokens the target emits
(``shadow``), for next to nothing, so a batch switched off on a stretch of text that repeats
less switches back on when the text does again."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import torch

from workers.engine.config import SpeculativeConfig
from workers.engine.scheduler import ScheduledBatch
from workers.engine.sequence import Sequence
from workers.engine.spec.costs import (
    STEADY_CATCH_UP_TOKENS,
    StepCosts,
    cost_bucket,
    speculation_pays,
    switching_on_pays,
)
from workers.engine.spec.ngram import NgramProposer, ngram_propose
from workers.engine.spec.rejection import verify

# How fast a request's acceptance rate follows its latest verifications (an exponential average).
ACCEPTANCE_SMOOTHING = 0.3
# How fast the engine's acceptance rate, every verification's (where a new request's starts),
# follows them: about the last 20 verifications.
PRIOR_SMOOTHING = 0.05
# How fast what a method's tries yield (``tries_yield``) follows them: about the last 100. The
# method choice switches on it, and a draft model taken back must catch up first, so it follows
# a workload's average, not the ups and downs within one answer (prompt lookup's yield swung
# from 0.4 to 1.0 accepted tokens a try within the edit workload's answers over 20 tries).
TRIES_SMOOTHING = 0.01
# A bucket with a cost still unmeasured explores this often: its first step speculates (the
# optimistic prior), its next two decode plainly, the fourth speculates again, so both costs
# are known within a few steps.
EXPLORE_INTERVAL_UNMEASURED = 4
# Hysteresis of the cost rule, relative to a draft token's cost: a speculating sequence stops
# when acceptance x plain < (1 - margin) x draft, one that is not starts when it exceeds
# (1 + margin) x draft. Inside that band either choice is within a few per cent of the other
# (at most margin x a k / (1 + a k) of the throughput), so estimates that wobble around the
# break-even point do not switch a sequence back and forth.
SWITCH_MARGIN = 0.05
# Exploring costs what the rule saves: a step that drafts where drafting does not pay (or does
# not where it does). Where each exploration confirms the rule's verdict (at the engine's
# acceptance, with the estimates it refreshed), the bucket's interval doubles, up to this many
# times ``explore_interval``; a verdict that changed brings it back to ``explore_interval``.
EXPLORE_BACKOFF_MAX = 8


class Proposer(Protocol):
    def lookahead(self, seq: Sequence, k: int) -> int:
        """Draft slots to reserve for ``seq`` this step (at most ``k``)."""

    # Optional: ``catch_up(seq) -> int``, the tokens the proposer must process for ``seq``
    # before its first draft (a draft model's tokens without K/V); without it, none.

    def propose(self, seqs: list[Sequence], ks: list[int]) -> None:
        """Set ``spec_token_ids`` (``ks[i]`` tokens) and ``spec_draft_probs`` of each sequence."""


class SpecStats:
    """vLLM's speculative decoding counters (mean acceptance length = 1 + accepted / drafts)."""

    def __init__(self, k: int) -> None:
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.num_accepted_tokens_per_pos = [0] * k

    def record(self, num_draft_tokens: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        for pos in range(num_accepted):
            self.num_accepted_tokens_per_pos[pos] += 1

    def snapshot(self) -> dict[str, Any]:
        return {
            "spec_decode_num_drafts": self.num_drafts,
            "spec_decode_num_draft_tokens": self.num_draft_tokens,
            "spec_decode_num_accepted_tokens": self.num_accepted_tokens,
            "spec_decode_num_accepted_tokens_per_pos": list(self.num_accepted_tokens_per_pos),
            "spec_decode_mean_acceptance_length": 1 + self.num_accepted_tokens / self.num_drafts
            if self.num_drafts
            else 0.0,
            "spec_decode_draft_acceptance_rate": self.num_accepted_tokens / self.num_draft_tokens
            if self.num_draft_tokens
            else 0.0,
        }


class Speculator:
    def __init__(
        self,
        config: SpeculativeConfig,
        proposer: Proposer,
        *,
        max_model_len: int,
        generator: torch.Generator,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.config = config
        self.clock = clock  # what the cost model measures a step in (seconds)
        self.proposer = proposer
        self.max_model_len = max_model_len
        self.generator = generator  # the engine sampler's: unseeded requests draw from it
        self.stats = SpecStats(config.num_speculative_tokens)
        self.step_index = 0
        self.costs = StepCosts()
        # A new sequence's acceptance before its own verifications: the engine's lately (1.0,
        # optimistic, until anything is verified). A request's first steps would otherwise
        # speculate at any acceptance, and short answers are mostly first steps.
        self.acceptance_prior = 1.0
        # Per try (a sequence the rule let speculate): the draft tokens it verified and the
        # tokens accepted of them, smoothed (TRIES_SMOOTHING) from no prior (an average of the
        # tries so far until there are enough; a try prompt lookup found nothing for counts 0
        # and 0). What the method choice (spec/choice.py) compares methods by:
        # 1 + accepted tokens a step for the drafted ones' cost, where the acceptance alone
        # would miss how often a method has nothing to propose.
        self._drafted = self._accepted = self._tries_weight = 0.0
        self.num_decided: dict[int, int] = {}  # bucket -> steps decided in it
        self._decided_buckets: set[int] = set()  # this step's
        # Measured buckets whose step this one explores (this step's), and per bucket the
        # exploration interval's multiple of ``explore_interval`` (its backoff) and the rule's
        # verdict after its last exploration.
        self._explored_buckets: set[int] = set()
        self._explore_backoff: dict[int, int] = {}
        self._explore_verdicts: dict[int, bool] = {}
        # The last step an exploring step switched on a sequence that had to catch up (one in
        # two exploring steps: enough to keep the draft cost and acceptance measured, at one
        # catch-up's price).
        self._explored_catch_up_step = -2
        # A decode-only step: (seqs, drafts, catch-up tokens beyond the steady ones).
        self._step_shape: tuple[int, int, int] | None = None
        self._step_started: float | None = None
        # Requests waiting for a slot when the step started (the engine tells ``start_step``):
        # none, and the batch decides on one acceptance (``decision_acceptance``).
        self.num_waiting = 0
        # Set by the method choice (spec/choice.py) for its probing steps of this method: every
        # eligible sequence drafts, at most one that must catch up in two steps.
        self.is_probing = False
        self._declined = False  # see ``_is_speculating``

    def lookahead(self, seq: Sequence, num_running: int) -> int:
        """Draft slots for a decoding sequence this step; 0: it decodes one token as usual."""
        seq.spec_token_ids = []
        # Never draft past max_tokens (one more token always comes from the target) or the context.
        k = min(
            self.config.num_speculative_tokens,
            seq.params.max_tokens - seq.num_output_tokens - 1,
            self.max_model_len - seq.num_tokens,
        )
        if k <= 0:
            return 0
        if not self._is_speculating(seq, num_running):
            if self._declined and seq.params.is_greedy and self.shadows:
                self.shadow(seq, k, own=True)
            return 0
        if self.shadows:
            seq.spec_shadow = None  # it drafts: its verifications measure the acceptance
        n = self.proposer.lookahead(seq, k)
        if n == 0:  # nothing to propose: a try that drafted and gained nothing
            self.record_try(0, 0)
        return n

    def record_try(self, num_drafted: int, num_accepted: int) -> None:
        """A try that verified ``num_drafted`` drafts, ``num_accepted`` of them accepted."""
        self._drafted += TRIES_SMOOTHING * (num_drafted - self._drafted)
        self._accepted += TRIES_SMOOTHING * (num_accepted - self._accepted)
        self._tries_weight += TRIES_SMOOTHING * (1.0 - self._tries_weight)

    @property
    def shadows(self) -> bool:
        """Whether this method's yield can be scored where it does not draft, for next to
        nothing: prompt lookup's proposals need no model (``shadow``)."""
        return isinstance(self.proposer, NgramProposer)

    def shadow(self, seq: Sequence, k: int, *, own: bool) -> None:
        """Score prompt lookup where it does not draft: on a greedy sequence (whose text is the
        target's whichever method drafts, or none), what it proposed at an earlier position is
        compared with the tokens the target emitted there, once they are known, as a try and a
        verification of this method's (``own``: the sequence is this method's, so its own
        acceptance follows too); then a new proposal of ``k`` tokens is made from here.

        Without it, an adaptive batch switched off by a few unlucky verifications learned
        nothing more until its next exploration (every ``explore_interval`` steps and more once
        backed off): the sweep's batch 16 ran 66 of its 114 steps plainly that way."""
        proposer = self.proposer
        assert isinstance(proposer, NgramProposer)
        pending = seq.spec_shadow
        if pending is not None:
            position, proposal = pending
            if len(seq.token_ids) < position + max(len(proposal), 1):
                return  # not known yet
            emitted = seq.token_ids[position : position + len(proposal)]
            accepted = 0
            for proposed, token in zip(proposal, emitted, strict=True):
                if proposed != token:
                    break
                accepted += 1
            self.record_try(len(proposal), accepted)
            if proposal:
                self._record_acceptance(seq if own else None, accepted / len(proposal))
        proposal = ngram_propose(seq.token_ids, k=k, min_n=proposer.min_n, max_n=proposer.max_n)
        seq.spec_shadow = (len(seq.token_ids), proposal) if k > 0 else None

    @property
    def batch_acceptance(self) -> float:
        """The acceptance a batch with nothing waiting decides on: accepted over drafted tokens
        of the method's recent tries (``TRIES_SMOOTHING``, about the last 100), shadow ones
        included; the engine's acceptance before any try drafted.

        ``acceptance_prior`` follows the last 20 verifications, a step and a bit at batch 16:
        one step of text that repeats less (the edit workload's per-step mean swings by 0.1 and
        more around 0.4) switched a whole batch off where drafting still paid."""
        if self._drafted <= 0.0:
            return self.acceptance_prior
        return self._accepted / self._drafted

    @property
    def tries_yield(self) -> tuple[float, float] | None:
        """Draft tokens verified and tokens accepted per try, smoothed (None: no try yet)."""
        if not self._tries_weight:
            return None
        return self._drafted / self._tries_weight, self._accepted / self._tries_weight

    def _is_speculating(self, seq: Sequence, num_running: int) -> bool:
        """Whether ``seq`` drafts this step; ``_declined`` says afterwards whether a False came
        from the batch cap, a pause or the cost rule (the sequence may draft another time)
        rather than from what the request is."""
        params = seq.params
        self._declined = False
        if (
            not params.is_speculative
            or params.has_penalties
            or params.guide
            or seq.is_embedding
            or seq.num_output_tokens < params.min_tokens
        ):
            return False
        if params.seed is not None and not params.is_greedy:
            # A seeded sampled request speculates or not by its model's config alone, never by
            # load: its draws, hence its text, must not depend on what else was running.
            return True
        self._declined = True
        limit = self.config.disable_by_batch_size
        if (limit is not None and num_running > limit) or seq.spec_paused_until > self.step_index:
            return False
        if not self.config.is_adaptive:
            return True
        self._decided_buckets.add(cost_bucket(num_running))
        if seq.spec_is_new:
            seq.spec_acceptance, seq.spec_is_new = self.acceptance_prior, False
        catch_up = self.extra_catch_up(seq)
        if self.is_probing:
            return self._switches_on_exploring(catch_up)
        seq.spec_is_on = self.is_paying(
            self.decision_acceptance(seq),
            num_running,
            is_on=seq.spec_is_on,
            catch_up=catch_up,
            remaining=params.max_tokens - seq.num_output_tokens,
        )
        if not self.is_exploring(num_running):
            return seq.spec_is_on
        if self._is_measured(cost_bucket(num_running)):
            self._explored_buckets.add(cost_bucket(num_running))
        return not seq.spec_is_on and self._switches_on_exploring(catch_up)

    def _switches_on_exploring(self, catch_up: int) -> bool:
        """Whether an exploring (or probing) step switches on a sequence that the rule left
        off: yes, unless its draft model must first catch up and another did in this step or
        the last (one in two such steps: the second measures its drafts)."""
        if not catch_up:
            return True
        if self.step_index - self._explored_catch_up_step <= 1:
            return False
        self._explored_catch_up_step = self.step_index
        return True

    def decision_acceptance(self, seq: Sequence) -> float:
        """The acceptance the cost rule weighs for ``seq``: its own while requests wait for a
        slot, else that of the method's recent tries (``batch_acceptance``).

        The rule values a token at a sequence's share of a step, which is what finishing early
        is worth when a waiting request takes the slot. With nothing waiting it frees nothing:
        the batch takes as many steps as its slowest sequence, and a step costs little less with
        one sequence fewer (on a CPU a plain step at batch 4 cost 22 ms, at batch 1 16 ms). A
        sequence switched off on a few unlucky verifications (its acceptance is an average of a
        handful) then decodes one token a step while the others finish, and the batch's tail
        runs plainly at batch 1 or 2: the sweep measured draft adaptive below both forced draft
        and ``none`` that way. Drafting together or not at all, on the acceptance of every
        recent verification, is what the rule's comparison means for a batch, and it is far
        less noisy than one sequence's; the tries' acceptance is steadier than the last 20
        verifications' (``acceptance_prior``, a step and a bit at batch 16)."""
        return seq.spec_acceptance if self.num_waiting else self.batch_acceptance

    def extra_catch_up(self, seq: Sequence) -> int:
        """Tokens the proposer must catch up on for ``seq`` before drafting, beyond the steady
        ones (0 for a proposer without a model of its own)."""
        catch_up = getattr(self.proposer, "catch_up", None)
        return 0 if catch_up is None else max(catch_up(seq) - STEADY_CATCH_UP_TOKENS, 0)

    def is_paying(
        self,
        acceptance: float,
        num_running: int,
        *,
        is_on: bool = True,
        catch_up: int = 0,
        remaining: int = 0,
    ) -> bool:
        """The cost rule: whether a sequence with this acceptance speculates at this batch
        size, given whether it did last time (``is_on``: the hysteresis's side), and, if its
        draft model must first catch up on ``catch_up`` tokens, whether the ``remaining``
        tokens it may still emit repay that."""
        costs = self.costs.bucket(num_running)
        margin = -SWITCH_MARGIN if is_on else SWITCH_MARGIN
        k = min(self.config.num_speculative_tokens, remaining - 1)
        return switching_on_pays(
            acceptance,
            k,
            remaining,
            catch_up,
            costs.plain_s,
            costs.draft_s,
            self.costs.catch_up_s,
            margin=margin,
        )

    def is_exploring(self, num_running: int) -> bool:
        """Whether this step does the opposite of the cost rule, to keep its estimates fresh:
        two steps in a row (the first of a sequence's speculative steps after a break is not
        measured) out of every ``explore_interval`` of the bucket (times its backoff), starting
        with its second."""
        bucket = cost_bucket(num_running)
        return self.num_decided.get(bucket, 0) % self._explore_interval(bucket) in (1, 2)

    def _is_measured(self, bucket: int) -> bool:
        costs = self.costs.bucket(bucket)
        return costs.plain_s is not None and costs.draft_s is not None

    def _explore_interval(self, bucket: int) -> int:
        if not self._is_measured(bucket):
            return EXPLORE_INTERVAL_UNMEASURED
        return self.config.explore_interval * self._explore_backoff.get(bucket, 1)

    def _explored(self, bucket: int) -> None:
        """The second step of an exploration of ``bucket`` is measured: back the interval off
        if the rule's verdict, at the batch's acceptance (``batch_acceptance``), is the one the
        last exploration left (the first only records it), else start again from
        ``explore_interval``."""
        costs = self.costs.buckets[bucket]
        verdict = speculation_pays(self.batch_acceptance, costs.plain_s, costs.draft_s)
        last = self._explore_verdicts.get(bucket)
        if last is not None:
            backoff = self._explore_backoff.get(bucket, 1)
            self._explore_backoff[bucket] = (
                min(backoff * 2, EXPLORE_BACKOFF_MAX) if last == verdict else 1
            )
        self._explore_verdicts[bucket] = verdict

    def propose(self, batch: ScheduledBatch) -> int:
        """Drafts for the batch's speculative sequences; returns their tokens this step (k + 1
        each)."""
        seqs, ks = [], []
        is_decode_only = True
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=False):
            is_decoding = not seq.is_embedding and seq.num_tokens - seq.num_computed_tokens == 1
            is_decode_only = is_decode_only and is_decoding
            if n > 1 and is_decoding:
                seqs.append(seq)
                ks.append(n - 1)
            else:
                seq.spec_token_ids = []
        # Before proposing: what the draft model catches up on (a sample of that cost only).
        catch_up = sum(self.extra_catch_up(seq) for seq in seqs)
        if seqs:
            self.proposer.propose(seqs, ks)
        self._step_shape = (len(batch.seqs), sum(ks), catch_up) if is_decode_only else None
        for seq, k in zip(seqs, ks, strict=False):
            assert len(seq.spec_token_ids) == k, (
                f"{seq}: proposed {len(seq.spec_token_ids)} tokens for {k} slots"
            )
        return sum(ks) + len(ks)

    def verify(self, seqs: list[Sequence], logits: torch.Tensor) -> list[list[int]]:
        emitted = verify(seqs, logits, self.generator)
        for seq, tokens in zip(seqs, emitted, strict=False):
            self.record_verification(seq, len(seq.spec_token_ids), len(tokens) - 1)
        return emitted

    def record_verification(self, seq: Sequence, k: int, num_accepted: int) -> None:
        """``seq`` verified ``k`` drafts and ``num_accepted`` of them were accepted."""
        self.stats.record(k, num_accepted)
        self.record_try(k, num_accepted)
        self._record_acceptance(seq, num_accepted / k)
        if seq.spec_acceptance < self.config.min_acceptance_rate:
            seq.spec_paused_until = self.step_index + self.config.pause_steps
            seq.spec_acceptance = 1.0  # after the pause it gets a fresh chance

    def _record_acceptance(self, seq: Sequence | None, rate: float) -> None:
        """A verification (or a shadow one) accepted ``rate`` of its drafts: the engine's
        acceptance follows, and ``seq``'s own if given."""
        if seq is not None:
            seq.spec_acceptance += ACCEPTANCE_SMOOTHING * (rate - seq.spec_acceptance)
        self.acceptance_prior += PRIOR_SMOOTHING * (rate - self.acceptance_prior)

    def rolled_back(self, seq: Sequence) -> None:
        """After verification: the draft keeps K/V only for tokens the target accepted."""
        seq.spec_token_ids = []
        seq.spec_draft_probs = None
        seq.draft_num_computed = min(seq.draft_num_computed, seq.num_computed_tokens)

    def unmeasured_step(self) -> None:
        """This step is no sample of this method's costs (the method choice's: another method
        drafted in it too)."""
        self._step_shape = None

    def start_step(self, *, num_waiting: int = 0) -> None:
        """The engine starts a step (before scheduling), ``num_waiting`` requests waiting for a
        slot: the cost model's clock starts."""
        self.num_waiting = num_waiting
        self._step_started = self.clock()

    def end_step(self) -> tuple[int, int, int, float] | None:
        """The step is done (verified): a decode-only one feeds the cost model what it took.
        Returns that sample (sequences, draft tokens, catch-up tokens, seconds), if any."""
        sample = None
        if self._step_shape is not None and self._step_started is not None:
            num_seqs, num_drafts, catch_up = self._step_shape
            seconds = self.clock() - self._step_started
            self.costs.record(num_seqs, num_drafts, seconds, catch_up=catch_up)
            sample = (num_seqs, num_drafts, catch_up, seconds)
        self._step_shape = self._step_started = None
        for bucket in self._decided_buckets:
            num_decided = self.num_decided.get(bucket, 0)
            if (
                bucket in self._explored_buckets
                and num_decided % self._explore_interval(bucket) == 2
            ):
                self._explored(bucket)
            self.num_decided[bucket] = num_decided + 1
        self._decided_buckets.clear()
        self._explored_buckets.clear()
        self.step_index += 1
        return sample
