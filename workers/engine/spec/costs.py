"""What a step costs, measured: the speculation controller's cost model.

A decode-only step (no prefill chunk in it) with ``num_seqs`` sequences and ``num_drafts`` draft
tokens in all is modelled as ``num_seqs * plain + num_drafts * draft`` seconds, per bucket of
batch size: ``plain`` is one sequence's share of a step without speculation, ``draft`` what one
more draft token adds (its slot in the target's pass, its verification, and the proposer's
work for it: the draft model's passes, next to nothing for prompt lookup). Both are
exponential averages of measured wall time, so they follow the machine and the load.

A sequence whose drafts are accepted at rate ``a`` (accepted / drafted) and that drafts ``k``
tokens emits ``1 + a * k`` tokens in ``plain + k * draft`` seconds instead of 1 in ``plain``:
speculation pays exactly when ``a * plain > draft``, whatever ``k`` (``speculation_pays``).
"""

from __future__ import annotations

from dataclasses import dataclass

# How fast the estimates follow new measurements (weight of the newest step).
COST_SMOOTHING = 0.2
# Batch sizes up to this many are buckets of their own; beyond it, powers of two.
EXACT_BUCKETS = 8


def cost_bucket(num_seqs: int) -> int:
    """The bucket a step of ``num_seqs`` sequences is measured and decided in: 1..8, then the
    next power of two (9..16 -> 16, 17..32 -> 32...)."""
    if num_seqs <= EXACT_BUCKETS:
        return max(num_seqs, 1)
    return 1 << (num_seqs - 1).bit_length()


def speculation_pays(acceptance: float, plain_s: float | None, draft_s: float | None) -> bool:
    """Whether a sequence with this acceptance rate (accepted / drafted, smoothed) emits more
    tokens per second speculating than decoding alone, given one sequence's share of a plain
    step (``plain_s``) and the seconds one draft token adds (``draft_s``).

    Per step it emits ``1 + a k`` tokens in ``plain_s + k draft_s`` seconds, against 1 token in
    ``plain_s``; the first is larger exactly when ``a plain_s > draft_s``. With either cost
    still unmeasured the answer is yes: a fresh engine speculates (an optimistic prior) and
    measures."""
    if plain_s is None or draft_s is None:
        return True
    return acceptance * plain_s > draft_s


@dataclass(slots=True)
class BucketCosts:
    """The estimates of one batch-size bucket (None: not measured yet)."""

    plain_s: float | None = None  # one sequence's share of a step without drafts
    draft_s: float | None = None  # seconds one draft token adds to a step
    num_steps: int = 0  # decode-only steps measured here
    num_plain_steps: int = 0
    num_spec_steps: int = 0
    # A step with drafts measured before any plain one: (seconds, sequences, drafts), used
    # once the plain cost is known.
    pending: tuple[float, int, int] | None = None


class StepCosts:
    """The estimates of every bucket, fed one measured decode-only step at a time."""

    def __init__(self) -> None:
        self.buckets: dict[int, BucketCosts] = {}

    def bucket(self, num_seqs: int) -> BucketCosts:
        key = cost_bucket(num_seqs)
        costs = self.buckets.get(key)
        if costs is None:
            costs = self.buckets[key] = BucketCosts()
        return costs

    def record(self, num_seqs: int, num_drafts: int, seconds: float) -> None:
        """One decode-only step: ``num_seqs`` sequences, ``num_drafts`` draft tokens in all,
        ``seconds`` of wall time (scheduling, proposals, the target's pass, verification)."""
        if num_seqs < 1 or seconds <= 0.0:
            return
        costs = self.bucket(num_seqs)
        costs.num_steps += 1
        if num_drafts == 0:
            costs.num_plain_steps += 1
            costs.plain_s = _smooth(costs.plain_s, seconds / num_seqs)
            if costs.pending is not None:
                (seconds, num_seqs, num_drafts), costs.pending = costs.pending, None
                _draft_update(costs, seconds, num_seqs, num_drafts)
            return
        costs.num_spec_steps += 1
        if costs.plain_s is None:
            costs.pending = (seconds, num_seqs, num_drafts)
        else:
            _draft_update(costs, seconds, num_seqs, num_drafts)

    def snapshot(self) -> dict[int, dict[str, float | int | None]]:
        """Per bucket: microseconds per plain sequence and per draft token, steps measured."""
        return {
            key: {
                "plain_us": None if c.plain_s is None else round(c.plain_s * 1e6, 1),
                "draft_us": None if c.draft_s is None else round(c.draft_s * 1e6, 1),
                "break_even_acceptance": round(c.draft_s / c.plain_s, 3)
                if c.plain_s and c.draft_s is not None
                else None,
                "num_plain_steps": c.num_plain_steps,
                "num_spec_steps": c.num_spec_steps,
            }
            for key, c in sorted(self.buckets.items())
        }


def _draft_update(costs: BucketCosts, seconds: float, num_seqs: int, num_drafts: int) -> None:
    """What the step took beyond its plain share, per draft token (one noisy sample can be
    negative; the average stays meaningful)."""
    assert costs.plain_s is not None, "a draft token's cost is measured against a plain step"
    extra = (seconds - num_seqs * costs.plain_s) / num_drafts
    costs.draft_s = _smooth(costs.draft_s, extra)


def _smooth(old: float | None, new: float) -> float:
    return new if old is None else old + COST_SMOOTHING * (new - old)
