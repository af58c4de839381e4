"""What a step costs, measured: the speculation controller's cost model.

A decode-only step (no prefill chunk in it) with ``num_seqs`` sequences and ``num_drafts`` draft
tokens in all is modelled as ``num_seqs * plain + num_drafts * draft`` seconds, per bucket of
batch size: ``plain`` is one sequence's share of a step without speculation, ``draft`` what one
more draft token adds (its slot in the target's pass, its verification, and the proposer's
work for it: the draft model's passes, next to nothing for prompt lookup).

The seconds are the engine thread's CPU time on a CPU device (a step descheduled by other
processes on the machine is not longer in it) and wall time on an accelerator (what the host
waits for there is the device's work); see ``Speculator``. Each estimate is the median of the
bucket's last ``COST_WINDOW`` samples of its kind, so a few steps stretched by a page fault, a
collection or another process move it not at all: ``plain`` of the plain steps' per-sequence
shares, ``draft`` of what each step with drafts took beyond ``num_seqs * plain`` (with the
current ``plain``), per draft token. A noisy sample can make that difference negative; the
estimate is clamped at zero (a draft token never makes a step cheaper).

A sequence whose drafts are accepted at rate ``a`` (accepted / drafted) and that drafts ``k``
tokens emits ``1 + a * k`` tokens in ``plain + k * draft`` seconds instead of 1 in ``plain``:
speculation pays exactly when ``a * plain > draft``, whatever ``k`` (``speculation_pays``).

A draft model also has one-off work: before a sequence's first draft (and after steps without
drafts) it catches up on the tokens it has no K/V for, the prompt the first time. A step where
it did (more than ``STEADY_CATCH_UP_TOKENS`` for some sequence) is no sample of ``draft``; what
it took beyond ``num_seqs * plain + num_drafts * draft``, per token caught up on beyond the
steady ones, is a sample of ``catch_up`` (one estimate for all buckets: it is the draft model's
prefill, whoever else is in the step). Switching a sequence on pays only if what its drafts
save over its remaining tokens exceeds what its catch-up costs (``switching_on_pays``): with
short answers after long prompts, it does not.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

# Samples of each kind (plain steps, steps with drafts) kept per bucket; the estimates are
# their medians. Odd, so the median is one sample.
COST_WINDOW = 15
# Batch sizes up to this many are buckets of their own; beyond it, powers of two.
EXACT_BUCKETS = 8
# Tokens a draft model catches up on per sequence step after step (the last token, and the
# bonus token after a fully accepted draft): part of what a draft token costs, not catch-up.
STEADY_CATCH_UP_TOKENS = 2
# A step whose catch-up beyond the steady tokens is smaller than this is no sample of the
# catch-up cost (what a few tokens add is lost in a step's noise), nor of the draft cost.
MIN_CATCH_UP_SAMPLE_TOKENS = 16


def cost_bucket(num_seqs: int) -> int:
    """The bucket a step of ``num_seqs`` sequences is measured and decided in: 1..8, then the
    next power of two (9..16 -> 16, 17..32 -> 32...)."""
    if num_seqs <= EXACT_BUCKETS:
        return max(num_seqs, 1)
    return 1 << (num_seqs - 1).bit_length()


def speculation_pays(
    acceptance: float, plain_s: float | None, draft_s: float | None, *, margin: float = 0.0
) -> bool:
    """Whether a sequence with this acceptance rate (accepted / drafted, smoothed) emits more
    tokens per second speculating than decoding alone, given one sequence's share of a plain
    step (``plain_s``) and the seconds one draft token adds (``draft_s``).

    Per step it emits ``1 + a k`` tokens in ``plain_s + k draft_s`` seconds, against 1 token in
    ``plain_s``; the first is larger exactly when ``a plain_s > draft_s``. ``margin`` moves the
    bar to ``(1 + margin) draft_s`` (the controller's hysteresis: a positive margin to switch on,
    a negative one to stay on). With either cost still unmeasured the answer is yes: a fresh
    engine speculates (an optimistic prior) and measures."""
    if plain_s is None or draft_s is None:
        return True
    return acceptance * plain_s > (1.0 + margin) * draft_s


def tokens_per_second(
    accepted: float, drafted: float, plain_s: float | None, draft_s: float | None
) -> float | None:
    """One sequence's tokens per second at a batch size, with the better of speculating and
    not: a sequence that verifies ``drafted`` draft tokens a step on average (0 where its
    method had nothing to propose) and has ``accepted`` of them accepted emits ``1 + accepted``
    tokens in ``plain_s + drafted draft_s``, against 1 in ``plain_s``. What the method choice
    (spec/choice.py) compares methods by. None: a cost not measured yet."""
    if plain_s is None or draft_s is None or plain_s <= 0.0:
        return None
    return max((1.0 + accepted) / (plain_s + max(drafted, 0.0) * draft_s), 1.0 / plain_s)


def switching_on_pays(
    acceptance: float,
    k: int,
    remaining: int,
    catch_up: int,
    plain_s: float | None,
    draft_s: float | None,
    catch_up_s: float | None,
    *,
    margin: float = 0.0,
) -> bool:
    """Whether drafting ``k`` tokens a step for the ``remaining`` tokens of a sequence saves
    more than its draft model's catching up on ``catch_up`` tokens first costs
    (``catch_up_s`` each).

    Speculating, it emits ``1 + a k`` tokens a step in ``plain_s + k draft_s`` seconds, which
    plain steps would take ``(1 + a k) plain_s`` for: ``k (a plain_s - draft_s)`` saved a step,
    ``remaining / (1 + a k)`` steps. ``margin`` is the hysteresis of ``speculation_pays``. No
    catch-up, or a cost still unmeasured: only the steady rule decides (the optimistic prior:
    a fresh batch-size bucket drafts once for every sequence, catch-up included, and so
    measures what drafting costs there with the whole batch drafting)."""
    if not speculation_pays(acceptance, plain_s, draft_s, margin=margin):
        return False
    if catch_up <= 0 or catch_up_s is None or plain_s is None or draft_s is None or k <= 0:
        return True
    a = acceptance
    saved = remaining * k * (a * plain_s - (1.0 + margin) * draft_s) / (1.0 + a * k)
    return saved > catch_up * catch_up_s


@dataclass(slots=True)
class BucketCosts:
    """The samples and estimates of one batch-size bucket (None: not measured yet)."""

    plain_s: float | None = None  # one sequence's share of a step without drafts (median)
    draft_s: float | None = None  # seconds one draft token adds to a step (median, >= 0)
    num_steps: int = 0  # decode-only steps measured here
    num_plain_steps: int = 0
    num_spec_steps: int = 0
    num_negative_drafts: int = 0  # steps with drafts that took less than their plain share
    # The last COST_WINDOW plain steps' seconds per sequence.
    plain_samples: deque[float] = field(default_factory=lambda: deque(maxlen=COST_WINDOW))
    # The last COST_WINDOW steps with drafts: (seconds, sequences, draft tokens). Kept whole,
    # so the draft cost follows the plain cost when that moves (and a step with drafts measured
    # before any plain one counts once the plain cost is known).
    spec_samples: deque[tuple[float, int, int]] = field(
        default_factory=lambda: deque(maxlen=COST_WINDOW)
    )

    def estimate(self) -> None:
        """Recompute both medians from the samples."""
        if self.plain_samples:
            self.plain_s = statistics.median(self.plain_samples)
        if self.plain_s is None or not self.spec_samples:
            return
        plain_s = self.plain_s
        extras = [(s - n * plain_s) / d for s, n, d in self.spec_samples]
        self.draft_s = max(statistics.median(extras), 0.0)


class StepCosts:
    """The estimates of every bucket, fed one measured decode-only step at a time."""

    def __init__(self) -> None:
        self.buckets: dict[int, BucketCosts] = {}
        # Seconds per token a draft model catches up on (beyond the steady ones), the median
        # of the last COST_WINDOW catch-up steps' (None: not measured yet).
        self.catch_up_s: float | None = None
        self.catch_up_samples: deque[float] = deque(maxlen=COST_WINDOW)
        self.num_catch_up_steps = 0

    def bucket(self, num_seqs: int) -> BucketCosts:
        key = cost_bucket(num_seqs)
        costs = self.buckets.get(key)
        if costs is None:
            costs = self.buckets[key] = BucketCosts()
        return costs

    def record(self, num_seqs: int, num_drafts: int, seconds: float, *, catch_up: int = 0) -> None:
        """One decode-only step: ``num_seqs`` sequences, ``num_drafts`` draft tokens in all,
        ``seconds`` it took (scheduling, proposals, the target's pass, verification), and
        ``catch_up`` tokens the draft model caught up on beyond the steady ones. A step with
        catch-up is a sample of the catch-up cost alone (given the bucket's estimates, once
        known; a few tokens' worth is no sample); a step measured as taking no time (a clock
        too coarse for it) is not a sample."""
        if num_seqs < 1 or seconds <= 0.0:
            return
        costs = self.bucket(num_seqs)
        if catch_up > 0:
            if (
                catch_up >= MIN_CATCH_UP_SAMPLE_TOKENS
                and costs.plain_s is not None
                and costs.draft_s is not None
            ):
                steady = num_seqs * costs.plain_s + num_drafts * costs.draft_s
                self.num_catch_up_steps += 1
                self.catch_up_samples.append((seconds - steady) / catch_up)
                self.catch_up_s = max(statistics.median(self.catch_up_samples), 0.0)
            return
        costs.num_steps += 1
        if num_drafts == 0:
            costs.num_plain_steps += 1
            costs.plain_samples.append(seconds / num_seqs)
        else:
            costs.num_spec_steps += 1
            costs.spec_samples.append((seconds, num_seqs, num_drafts))
            if costs.plain_s is not None and seconds < num_seqs * costs.plain_s:
                costs.num_negative_drafts += 1
        costs.estimate()

    def snapshot(self) -> dict[int, dict[str, float | int | None]]:
        """Per bucket: microseconds per plain sequence and per draft token, the acceptance rate
        above which speculating pays, steps measured."""
        return {
            key: {
                "plain_us": None if c.plain_s is None else round(c.plain_s * 1e6, 1),
                "draft_us": None if c.draft_s is None else round(c.draft_s * 1e6, 1),
                "break_even_acceptance": round(c.draft_s / c.plain_s, 3)
                if c.plain_s and c.draft_s is not None
                else None,
                "num_plain_steps": c.num_plain_steps,
                "num_spec_steps": c.num_spec_steps,
                "num_negative_drafts": c.num_negative_drafts,
            }
            for key, c in sorted(self.buckets.items())
        }

    def catch_up_us(self) -> float | None:
        """Microseconds per token a draft model catches up on (None: not measured yet)."""
        return None if self.catch_up_s is None else round(self.catch_up_s * 1e6, 1)
