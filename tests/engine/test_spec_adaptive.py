"""The cost-based speculation controller: the decision rule on synthetic step costs, the
estimator under noisy samples, the hysteresis, the exploration that keeps its estimates fresh,
exactness with it on, and the bench's sweep."""

from __future__ import annotations

import itertools
import random
import time
from pathlib import Path

import pytest

from workers.engine import LLMEngine, SamplingParams
from workers.engine.bench.spec import SWEEP_BATCHES, _interleaved, spec_print, spec_section
from workers.engine.config import SpeculativeConfig
from workers.engine.spec.choice import MethodChoice
from workers.engine.spec.costs import (
    COST_WINDOW,
    MIN_CATCH_UP_SAMPLE_TOKENS,
    StepCosts,
    cost_bucket,
    speculation_pays,
    switching_on_pays,
)
from workers.engine.spec.speculator import EXPLORE_BACKOFF_MAX, SWITCH_MARGIN


def _throughputs(
    *, acceptance: float, k: int, num_seqs: int, plain_s: float, draft_s: float
) -> tuple[float, float]:
    """Tokens per second of a step of ``num_seqs`` sequences without and with k drafts each."""
    plain = num_seqs / (num_seqs * plain_s)
    spec = num_seqs * (1 + acceptance * k) / (num_seqs * plain_s + num_seqs * k * draft_s)
    return plain, spec


def test_speculation_pays_exactly_when_it_yields_more_tokens_per_second():
    grid = itertools.product(
        (0.0, 0.1, 0.33, 0.5, 0.77, 0.95, 1.0),  # acceptance
        (1, 2, 4, 8),  # k
        (1, 4, 8, 16, 64),  # sequences
        (0.5e-3, 2e-3, 11e-3),  # a sequence's share of a plain step
        (0.0, 0.1e-3, 0.7e-3, 1.9e-3, 6e-3),  # what one draft token adds
    )
    for acceptance, k, num_seqs, plain_s, draft_s in grid:
        plain, spec = _throughputs(
            acceptance=acceptance, k=k, num_seqs=num_seqs, plain_s=plain_s, draft_s=draft_s
        )
        if abs(spec - plain) < 1e-9 * plain:
            continue  # a tie either way
        assert speculation_pays(acceptance, plain_s, draft_s) is (spec > plain), (
            acceptance,
            k,
            num_seqs,
            plain_s,
            draft_s,
        )
    # Unmeasured: the optimistic prior speculates.
    assert speculation_pays(0.0, None, None) and speculation_pays(0.0, 1e-3, None)


def _measured(costs: StepCosts, *, num_seqs: int, k: int, plain_step_s: float, spec_step_s: float):
    """Feed a bucket a plain step and a step where every sequence drafted k tokens."""
    costs.record(num_seqs, 0, plain_step_s)
    costs.record(num_seqs, num_seqs * k, spec_step_s)


def test_step_costs_recover_the_synthetic_costs_and_decide_per_batch_size():
    costs = StepCosts()
    # Batch 16: a plain step 32 ms (2 ms a sequence); with 4 drafts each 128 ms: 1.5 ms a draft.
    _measured(costs, num_seqs=16, k=4, plain_step_s=0.032, spec_step_s=0.128)
    # Batch 8: 16 ms plain; 41.6 ms with 4 drafts each: 0.8 ms a draft.
    _measured(costs, num_seqs=8, k=4, plain_step_s=0.016, spec_step_s=0.0416)
    # Batch 1: 10 ms plain, 14 ms with 4 drafts: 1 ms a draft.
    _measured(costs, num_seqs=1, k=4, plain_step_s=0.010, spec_step_s=0.014)
    big, eight, one = costs.bucket(16), costs.bucket(8), costs.bucket(1)
    assert big.plain_s == pytest.approx(2e-3) and big.draft_s == pytest.approx(1.5e-3)
    assert eight.plain_s == pytest.approx(2e-3) and eight.draft_s == pytest.approx(0.8e-3)
    assert one.plain_s == pytest.approx(10e-3) and one.draft_s == pytest.approx(1e-3)
    for num_seqs, bucket in ((16, big), (8, eight), (1, one)):
        for acceptance in (0.05, 0.3, 0.6, 0.9):
            plain, spec = _throughputs(
                acceptance=acceptance,
                k=4,
                num_seqs=num_seqs,
                plain_s=bucket.plain_s,
                draft_s=bucket.draft_s,
            )
            assert speculation_pays(acceptance, bucket.plain_s, bucket.draft_s) is (spec > plain)
    # Batch 16 with a good acceptance (0.6): speculation must turn off; batch 8 at 0.9 and
    # batch 1 at 0.3 it must stay on.
    assert not speculation_pays(0.6, big.plain_s, big.draft_s)
    assert speculation_pays(0.9, eight.plain_s, eight.draft_s)
    assert speculation_pays(0.3, one.plain_s, one.draft_s)


def test_a_step_with_drafts_measured_first_counts_once_the_plain_cost_is_known():
    costs = StepCosts()
    costs.record(4, 16, 0.030)
    assert costs.bucket(4).draft_s is None and len(costs.bucket(4).spec_samples) == 1
    costs.record(4, 0, 0.010)
    assert costs.bucket(4).draft_s == pytest.approx((0.030 - 0.010) / 16)
    assert [cost_bucket(n) for n in (1, 5, 8, 9, 16, 17, 64)] == [1, 5, 8, 16, 16, 32, 64]


def _noisy_steps(
    rng: random.Random, *, num_seqs: int, k: int, plain_s: float, draft_s: float, num: int
):
    """``num`` pairs of (plain step, step with k drafts a sequence) as a loaded machine
    measures them: +-10 % jitter on every step, one step in four stretched 3-8x (descheduled,
    a collection), one in eight cut to a quarter (a coarse clock's tick): steps with drafts
    that take less than their plain share, i.e. negative deltas."""

    def noisy(seconds: float) -> float:
        seconds *= rng.uniform(0.9, 1.1)
        roll = rng.random()
        if roll < 0.25:
            return seconds * rng.uniform(3.0, 8.0)
        if roll < 0.375:
            return seconds * 0.25
        return seconds

    for _ in range(num):
        yield num_seqs, 0, noisy(num_seqs * plain_s)
        yield num_seqs, num_seqs * k, noisy(num_seqs * (plain_s + k * draft_s))


@pytest.mark.parametrize("seed", range(5))
def test_the_estimates_survive_outliers_and_negative_deltas_and_decide_as_the_true_costs(seed):
    rng = random.Random(seed)
    costs = StepCosts()
    # Batch 8: 2 ms a sequence, 0.6 ms a draft token (break-even acceptance 0.3). Batch 1:
    # 10 ms, 6 ms (break-even 0.6).
    truth = {8: (2e-3, 0.6e-3), 1: (10e-3, 6e-3)}
    num_negative = 0
    for num_seqs, (plain_s, draft_s) in truth.items():
        steps = list(
            _noisy_steps(
                rng, num_seqs=num_seqs, k=4, plain_s=plain_s, draft_s=draft_s, num=3 * COST_WINDOW
            )
        )
        for step in steps:
            costs.record(*step)
        num_negative += costs.bucket(num_seqs).num_negative_drafts
    assert num_negative > 0, "the noise gave steps with drafts cheaper than their plain share"
    for num_seqs, (plain_s, draft_s) in truth.items():
        bucket = costs.bucket(num_seqs)
        assert bucket.plain_s == pytest.approx(plain_s, rel=0.25)
        assert bucket.draft_s is not None and bucket.draft_s >= 0.0
        # Away from the break-even point (by 0.15 in acceptance), the decision is the truth's.
        for acceptance in (0.0, 0.1, 0.2, 0.45, 0.75, 0.9, 1.0):
            true_pays = speculation_pays(acceptance, plain_s, draft_s)
            if abs(acceptance - draft_s / plain_s) < 0.15:
                continue
            assert speculation_pays(acceptance, bucket.plain_s, bucket.draft_s) is true_pays, (
                num_seqs,
                acceptance,
                bucket.plain_s,
                bucket.draft_s,
            )


def test_a_burst_of_stretched_steps_does_not_move_the_estimates_and_a_lasting_change_does():
    costs = StepCosts()
    for _ in range(COST_WINDOW):
        costs.record(8, 0, 0.016)  # 2 ms a sequence
        costs.record(8, 32, 0.016 + 32 * 0.4e-3)  # 0.4 ms a draft token
    # Five steps with drafts in a row stretched 10x (another process had the cores): an
    # exponential average would have turned speculation off for most acceptance rates.
    for _ in range(5):
        costs.record(8, 32, 10 * (0.016 + 32 * 0.4e-3))
    bucket = costs.bucket(8)
    assert bucket.draft_s == pytest.approx(0.4e-3)
    assert speculation_pays(0.5, bucket.plain_s, bucket.draft_s)
    # Draft tokens really got dearer (2.4 ms each): once most of the window says so, it is off.
    for _ in range(COST_WINDOW // 2 + 1):
        costs.record(8, 32, 0.016 + 32 * 2.4e-3)
    assert bucket.draft_s == pytest.approx(2.4e-3)
    assert not speculation_pays(0.5, bucket.plain_s, bucket.draft_s)


def test_draft_costs_are_clamped_at_zero_when_steps_with_drafts_measure_cheaper():
    costs = StepCosts()
    for _ in range(COST_WINDOW):
        costs.record(4, 0, 0.012)
        costs.record(4, 16, 0.010)  # less than the plain step: noise, not a saving
    bucket = costs.bucket(4)
    assert bucket.draft_s == 0.0 and bucket.num_negative_drafts == COST_WINDOW
    assert costs.snapshot()[4]["break_even_acceptance"] == 0.0
    # Free drafts pay for any acceptance above zero, and never for none.
    assert speculation_pays(0.01, bucket.plain_s, bucket.draft_s)
    assert not speculation_pays(0.0, bucket.plain_s, bucket.draft_s)
    # A step measured as taking no time (or less) is no sample at all.
    costs.record(4, 0, 0.0)
    costs.record(4, 16, -1.0)
    assert bucket.num_steps == 2 * COST_WINDOW


def test_switching_on_pays_exactly_when_the_remaining_tokens_repay_the_catch_up():
    grid = itertools.product(
        (0.3, 0.55, 0.65, 0.9),  # acceptance
        (1, 4),  # k
        (4, 32, 128, 1024),  # tokens left to emit
        (0, 50, 300),  # tokens to catch up on
        (2e-3, 20e-3),  # a sequence's share of a plain step
        (0.5e-3, 1e-3),  # what a draft token adds
        (0.02e-3, 0.1e-3),  # what a token caught up on costs
    )
    for acceptance, k, remaining, catch_up, plain_s, draft_s, catch_up_s in grid:
        # Seconds to emit the remaining tokens: plainly, or speculating after the catch-up.
        plain = remaining * plain_s
        steps = remaining / (1 + acceptance * k)
        spec = catch_up * catch_up_s + steps * (plain_s + k * draft_s)
        if abs(spec - plain) < 1e-9 * plain:
            continue
        pays = switching_on_pays(acceptance, k, remaining, catch_up, plain_s, draft_s, catch_up_s)
        assert pays is (spec < plain), (acceptance, k, remaining, catch_up, plain_s, draft_s)
    # The batch-16 case of the sweep: acceptance 0.65 above a break-even of 0.5, but 32 tokens
    # left do not repay a 290-token prompt's catch-up; 1024 would; the catch-up's cost
    # unmeasured, the steady rule alone decides (the optimistic prior).
    assert speculation_pays(0.65, 2e-3, 1e-3)
    assert not switching_on_pays(0.65, 4, 32, 290, 2e-3, 1e-3, 0.1e-3)
    assert switching_on_pays(0.65, 4, 1024, 290, 2e-3, 1e-3, 0.1e-3)
    assert switching_on_pays(0.65, 4, 32, 290, 2e-3, 1e-3, None)
    assert switching_on_pays(0.65, 4, 32, 290, None, None, 0.1e-3)
    assert not switching_on_pays(0.45, 4, 1024, 0, 2e-3, 1e-3, 0.1e-3)


def test_a_catch_up_step_measures_the_catch_up_cost_and_not_the_draft_cost():
    costs = StepCosts()
    # Batch 4: 2 ms a sequence, 0.5 ms a draft token; a draft model's token caught up on
    # costs 0.1 ms. A catch-up step before the bucket is measured is no sample.
    costs.record(4, 16, 4 * 2e-3 + 16 * 0.5e-3 + 400 * 0.1e-3, catch_up=400)
    assert costs.catch_up_s is None and costs.num_catch_up_steps == 0
    _measured(costs, num_seqs=4, k=4, plain_step_s=4 * 2e-3, spec_step_s=4 * 2e-3 + 16 * 0.5e-3)
    bucket = costs.bucket(4)
    for catch_up in (400, 64, MIN_CATCH_UP_SAMPLE_TOKENS):
        costs.record(4, 16, 4 * 2e-3 + 16 * 0.5e-3 + catch_up * 0.1e-3, catch_up=catch_up)
    assert costs.catch_up_s == pytest.approx(0.1e-3) and costs.num_catch_up_steps == 3
    assert costs.catch_up_us() == pytest.approx(100.0)
    # Neither a sample of the plain nor of the draft cost (the old rule's "one-off work").
    assert bucket.num_steps == 2 and bucket.draft_s == pytest.approx(0.5e-3)
    # A few tokens' catch-up is lost in the noise: not a sample of anything.
    costs.record(4, 16, 1.0, catch_up=MIN_CATCH_UP_SAMPLE_TOKENS - 1)
    assert costs.num_catch_up_steps == 3 and bucket.num_steps == 2
    assert costs.catch_up_s == pytest.approx(0.1e-3)


def _decoding(engine: LLMEngine, prompt: list[int], params: SamplingParams):
    seq = engine.make_sequence(prompt, params)
    seq.num_computed_tokens = seq.num_tokens - 1  # its prompt is in the cache: it decodes
    seq.spec_is_new = False  # its acceptance is what the test sets
    return seq


def _with_costs(engine: LLMEngine, num_seqs: int, *, plain_s: float, draft_s: float) -> None:
    bucket = engine.speculator.costs.bucket(num_seqs)
    bucket.plain_s, bucket.draft_s = plain_s, draft_s
    engine.speculator.num_decided[cost_bucket(num_seqs)] = 3  # not an exploring step


def test_the_controller_follows_the_costs_and_keeps_the_fixed_rules(make_engine, tiny_dir, prompts):
    engine = make_engine(
        speculative=SpeculativeConfig("draft", model=str(tiny_dir), also_prompt_lookup=False)
    )
    greedy = SamplingParams(max_tokens=64, temperature=0.0)
    spec = engine.speculator
    spec.num_waiting = 1  # requests wait for a slot: each sequence's own acceptance decides
    # Batch 16: plain 2 ms a sequence, 1.5 ms a draft token; an acceptance of 0.6: off.
    _with_costs(engine, 16, plain_s=2e-3, draft_s=1.5e-3)
    seq = _decoding(engine, prompts[5], greedy)
    seq.spec_acceptance = 0.6
    assert spec.lookahead(seq, 16) == 0
    # Batch 8: plain 2 ms, 0.8 ms a draft; an acceptance of 0.9: on, with k drafts.
    _with_costs(engine, 8, plain_s=2e-3, draft_s=0.8e-3)
    seq.spec_acceptance = 0.9
    assert spec.lookahead(seq, 8) == 4
    seq.spec_acceptance = 0.3
    assert spec.lookahead(seq, 8) == 0
    # A seeded sampled request speculates by config alone, whatever the costs.
    seeded = _decoding(engine, prompts[5], SamplingParams(max_tokens=64, seed=3))
    seeded.spec_acceptance = 0.0
    assert spec.lookahead(seeded, 16) == 4
    # Penalties never speculate, however well speculation pays.
    _with_costs(engine, 2, plain_s=2e-3, draft_s=0.0)
    penalised = _decoding(
        engine, prompts[5], SamplingParams(max_tokens=64, temperature=0.0, presence_penalty=0.5)
    )
    assert spec.lookahead(penalised, 2) == 0
    # The batch cap stays a hard cap on top of the costs.
    capped = make_engine(
        speculative=SpeculativeConfig(
            "draft", model=str(tiny_dir), disable_by_batch_size=4, also_prompt_lookup=False
        )
    )
    _with_costs(capped, 8, plain_s=2e-3, draft_s=0.0)
    capped.speculator.num_waiting = 1
    seq = _decoding(capped, prompts[5], greedy)
    assert capped.speculator.lookahead(seq, 8) == 0
    assert capped.speculator.lookahead(seq, 4) == 4


def test_hysteresis_keeps_a_sequence_on_or_off_near_the_break_even_point(
    make_engine, tiny_dir, prompts
):
    engine = make_engine(
        speculative=SpeculativeConfig("draft", model=str(tiny_dir), also_prompt_lookup=False)
    )
    spec = engine.speculator
    spec.num_waiting = 1  # each sequence's own acceptance decides
    seq = _decoding(engine, prompts[5], SamplingParams(max_tokens=64, temperature=0.0))
    # Break-even acceptance 0.5 at batch 8 (plain 2 ms, draft 1 ms).
    _with_costs(engine, 8, plain_s=2e-3, draft_s=1e-3)
    below, above = 0.5 * (1 - SWITCH_MARGIN / 2), 0.5 * (1 + SWITCH_MARGIN / 2)
    seq.spec_acceptance = below  # inside the band, below break-even: a speculating one stays on
    assert seq.spec_is_on and spec.lookahead(seq, 8) == 4 and seq.spec_is_on
    seq.spec_acceptance = 0.5 * (1 - 2 * SWITCH_MARGIN)  # beyond the band: off
    assert spec.lookahead(seq, 8) == 0 and not seq.spec_is_on
    seq.spec_acceptance = above  # inside the band, above break-even: an idle one stays off
    assert spec.lookahead(seq, 8) == 0 and not seq.spec_is_on
    seq.spec_acceptance = 0.5 * (1 + 2 * SWITCH_MARGIN)  # beyond the band: on again
    assert spec.lookahead(seq, 8) == 4 and seq.spec_is_on
    # A fresh sequence starts on: the same acceptance just below break-even drafts for it.
    fresh = _decoding(engine, prompts[6], SamplingParams(max_tokens=64, temperature=0.0))
    fresh.spec_acceptance = below
    assert spec.lookahead(fresh, 8) == 4


def test_a_new_sequence_starts_from_the_engines_acceptance_not_an_optimistic_one(
    make_engine, tiny_dir, prompts
):
    engine = make_engine(
        speculative=SpeculativeConfig("draft", model=str(tiny_dir), also_prompt_lookup=False)
    )
    spec = engine.speculator
    _with_costs(engine, 8, plain_s=2e-3, draft_s=1e-3)  # break-even acceptance 0.5
    greedy = SamplingParams(max_tokens=64, temperature=0.0)
    first = engine.make_sequence(prompts[5], greedy)
    first.num_computed_tokens = first.num_tokens - 1
    # Nothing verified yet: optimistic, it drafts.
    assert spec.lookahead(first, 8) == 4 and first.spec_acceptance == 1.0
    # Forty verifications accept 1 draft in 4: the engine's acceptance falls towards 0.25.
    for _ in range(40):
        spec.record_verification(first, 4, 1)
    assert spec.acceptance_prior < 0.5
    new = engine.make_sequence(prompts[6], greedy)
    new.num_computed_tokens = new.num_tokens - 1
    assert spec.lookahead(new, 8) == 0, "a new request below break-even does not draft"
    assert new.spec_acceptance == spec.acceptance_prior and not new.spec_is_on


def test_a_draft_that_must_catch_up_is_not_switched_on_when_the_answer_cannot_repay_it(
    make_engine, tiny_dir, prompts
):
    engine = make_engine(
        speculative=SpeculativeConfig("draft", model=str(tiny_dir), also_prompt_lookup=False)
    )
    spec = engine.speculator
    # Batch 16 as the sweep measured it, fed as steps: 2 ms a sequence, 1 ms a draft token
    # (break-even acceptance 0.5), and catch-up steps at 0.3 ms a token.
    for _ in range(3):
        spec.costs.record(16, 0, 16 * 2e-3)
        spec.costs.record(16, 64, 16 * 2e-3 + 64 * 1e-3)
        spec.costs.record(16, 64, 16 * 2e-3 + 64 * 1e-3 + 3200 * 0.3e-3, catch_up=3200)
    assert spec.costs.catch_up_s == pytest.approx(0.3e-3)
    spec.num_decided[16] = 3  # not an exploring step
    spec.num_waiting = 1  # each sequence's own acceptance decides
    short = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    seq = _decoding(engine, prompts[14], short)  # 200 tokens the draft has no K/V for yet
    seq.spec_acceptance = 0.65
    assert spec.extra_catch_up(seq) == seq.num_tokens - 2
    # By the steady rule it pays (0.65 > 0.5): the old controller drafted, and paid 198 tokens'
    # catch-up (59 ms) to save 32 x 4 x (1.3 - 1) / 3.6 = 10.7 ms.
    assert speculation_pays(seq.spec_acceptance, 2e-3, 1e-3)
    assert spec.lookahead(seq, 16) == 0 and not seq.spec_is_on
    # A long answer repays it: on.
    long = _decoding(engine, prompts[14], SamplingParams(max_tokens=256, temperature=0.0))
    long.spec_acceptance = 0.65
    assert spec.lookahead(long, 16) == 4 and long.spec_is_on
    # A draft already caught up (it drafted last step) has nothing to repay: on.
    seq.draft_num_computed = seq.num_tokens - 1
    seq.spec_is_on = True
    assert spec.extra_catch_up(seq) == 0 and spec.lookahead(seq, 16) == 4
    # An n-gram proposer has no model to catch up: the steady rule alone.
    ngram = make_engine(speculative=SpeculativeConfig("ngram"))
    ngram.speculator.costs = spec.costs
    ngram.speculator.num_decided[16] = 3
    ngram.speculator.num_waiting = 1
    other = _decoding(ngram, prompts[14], short)
    other.spec_acceptance = 0.65
    assert ngram.speculator.extra_catch_up(other) == 0
    assert ngram.speculator.is_paying(0.65, 16, catch_up=0, remaining=32)


def test_an_exploring_step_switches_on_at_most_one_sequence_that_must_catch_up(
    make_engine, tiny_dir, prompts
):
    engine = make_engine(
        speculative=SpeculativeConfig("draft", model=str(tiny_dir), also_prompt_lookup=False)
    )
    spec = engine.speculator
    _with_costs(engine, 8, plain_s=2e-3, draft_s=1e-3)  # break-even acceptance 0.5
    short = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    seqs = [_decoding(engine, prompts[i], short) for i in range(8, 16)]
    spec.acceptance_prior = 0.3  # off by the steady rule (nothing waits: the batch decides)
    for seq in seqs:
        seq.spec_acceptance, seq.spec_is_on = 0.3, False
    spec.num_decided[8] = 1  # the first of the two exploring steps
    assert spec.is_exploring(8)
    # Every draft lags its prompt: exploring switches one of them on, not eight.
    assert [spec.lookahead(seq, 8) for seq in seqs] == [4] + [0] * 7
    # A sequence whose draft is caught up is switched on as before (no one-off work).
    seqs[3].draft_num_computed = seqs[3].num_tokens - 1
    spec.end_step()  # the second exploring step: the one switched on drafts again
    seqs[0].draft_num_computed = seqs[0].num_tokens - 1
    assert spec.is_exploring(8)
    ks = [spec.lookahead(seq, 8) for seq in seqs]
    assert ks == [4, 0, 0, 4, 0, 0, 0, 0]


def test_with_nothing_waiting_the_batch_decides_on_the_engines_acceptance(
    make_engine, tiny_dir, prompts
):
    engine = make_engine(
        speculative=SpeculativeConfig("draft", model=str(tiny_dir), also_prompt_lookup=False)
    )
    spec = engine.speculator
    _with_costs(engine, 4, plain_s=5e-3, draft_s=1.8e-3)  # break-even acceptance 0.36
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    seqs = [_decoding(engine, prompts[i], params) for i in range(4, 8)]
    for seq in seqs:
        seq.draft_num_computed = seq.num_tokens - 1  # caught up: the steady rule alone
    spec.acceptance_prior = 0.5  # every recent verification's
    # One sequence had two unlucky verifications (0.28), the others did well.
    for seq, acceptance in zip(seqs, (0.28, 0.6, 0.55, 0.7), strict=True):
        seq.spec_acceptance = acceptance
    # Requests waiting: each sequence on its own; the unlucky one stops.
    spec.start_step(num_waiting=3)
    assert [spec.lookahead(seq, 4) for seq in seqs] == [0, 4, 4, 4]
    spec.end_step()
    # Nothing waiting: the unlucky one would decode one token a step while the others
    # finish, the batch's tail at batch 1; all draft on the engine's acceptance, together.
    spec.num_decided[4] = 3  # not an exploring step
    spec.start_step(num_waiting=0)
    assert [spec.lookahead(seq, 4) for seq in seqs] == [4, 4, 4, 4]
    spec.end_step()
    # And stop together when the engine's acceptance falls below break-even.
    spec.num_decided[4] = 3
    spec.acceptance_prior = 0.3
    spec.start_step(num_waiting=0)
    assert [spec.lookahead(seq, 4) for seq in seqs] == [0, 0, 0, 0]
    # The engine tells the speculator how many wait at each step's start.
    engine.add_request(prompts[9], params)
    engine.step()
    assert spec.num_waiting == 1
    engine.step()
    assert spec.num_waiting == 0


def test_a_batch_decides_on_its_recent_tries_not_on_one_unlucky_step(make_engine, prompts):
    engine = make_engine(speculative=SpeculativeConfig("ngram"))
    spec = engine.speculator
    _with_costs(engine, 16, plain_s=2e-3, draft_s=0.5e-3)  # break-even acceptance 0.25
    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    # Texts that repeat themselves: prompt lookup has something to propose for each.
    seqs = [_decoding(engine, prompts[8 + i % 8][:20] * 3, params) for i in range(16)]
    # Two hundred tries: 4 drafts each, 1 or 2 accepted in turn (0.375).
    for i in range(200):
        spec.record_verification(seqs[i % 16], 4, 1 + i % 2)
    assert spec.batch_acceptance == pytest.approx(0.375, abs=0.01)
    # One step's sixteen verifications accept nothing: the last 20 verifications' acceptance
    # (a step and a bit at batch 16) falls far below break-even, the tries' does not.
    for seq in seqs:
        spec.record_verification(seq, 4, 0)
    assert spec.acceptance_prior < 0.2
    assert spec.batch_acceptance > 0.3
    spec.start_step(num_waiting=0)
    assert all(spec.lookahead(seq, 16) > 0 for seq in seqs), "the batch keeps drafting"
    spec.end_step()
    # A lasting fall switches it off: a hundred more tries that accept nothing.
    for i in range(100):
        spec.record_verification(seqs[i % 16], 4, 0)
    assert spec.batch_acceptance < 0.2
    spec.num_decided[16] = 3
    spec.start_step(num_waiting=0)
    assert [spec.lookahead(seq, 16) for seq in seqs] == [0] * 16
    spec.end_step()


def test_prompt_lookup_switched_off_keeps_scoring_the_text_and_switches_back_on(
    make_engine, prompts
):
    engine = make_engine(speculative=SpeculativeConfig("ngram"))
    spec = engine.speculator
    _with_costs(engine, 1, plain_s=2e-3, draft_s=0.6e-3)  # break-even acceptance 0.3
    # Its recent tries accepted nothing: off.
    spec.acceptance_prior = 0.0
    for _ in range(300):
        spec.record_try(4, 0)
    half = prompts[10][:30]
    seq = _decoding(engine, half + half, SamplingParams(max_tokens=400, temperature=0.0))
    seq.spec_is_on = False
    # From here the target emits what prompt lookup would propose: the text repeats itself.
    switched_on = None
    for step in range(300):
        spec.num_decided[1] = 3  # no exploring step: only the shadow can tell
        spec.start_step()
        k = spec.lookahead(seq, 1)
        spec.end_step()
        if k:
            switched_on = step
            break
        pending = seq.spec_shadow
        assert pending is not None and len(pending[1]) == 4, "a proposal to score, from here"
        assert pending[0] <= len(seq.token_ids)
        seq.token_ids.append(pending[1][len(seq.token_ids) - pending[0]])
        seq.num_computed_tokens = seq.num_tokens - 1
    # Every shadow try accepted its 4 tokens: the tries' acceptance passed break-even (plus the
    # hysteresis) after about 40 of them, one every 4 tokens.
    assert switched_on is not None and 100 <= switched_on <= 250
    assert spec.batch_acceptance > 0.3 * (1 + SWITCH_MARGIN)
    assert spec.stats.num_drafts == 0, "shadow tries are not drafts (vLLM's counters)"
    # A sampled request's text is a draw: nothing to score it on.
    sampled = _decoding(engine, half + half, SamplingParams(max_tokens=400, temperature=1.0))
    spec.acceptance_prior = 0.0
    for _ in range(300):
        spec.record_try(4, 0)
    spec.num_decided[1] = 3
    spec.start_step()
    assert spec.lookahead(sampled, 1) == 0 and sampled.spec_shadow is None
    spec.end_step()


class _StepClock:
    """A clock for the cost model that moves on by the next of ``durations`` at each reading:
    a step measured from one reading to the next took that long."""

    def __init__(self, durations):
        self.durations = iter(durations)
        self.now = 0.0

    def __call__(self) -> float:
        self.now += next(self.durations)
        return self.now


def test_the_cost_model_measures_the_speculator_clock(make_engine, tiny_dir, prompts):
    engine = make_engine(
        speculative=SpeculativeConfig("ngram", prompt_lookup_min=1), max_num_seqs=4
    )
    # On a CPU the clock is the engine thread's CPU time: other processes' turns on the
    # cores are not in it.
    assert engine.speculator.clock is time.thread_time
    engine.speculator.clock = _StepClock(itertools.repeat(0.04))
    engine.generate(prompts[4:8], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
    bucket = engine.speculator.costs.bucket(4)
    assert bucket.plain_samples
    assert all(x == pytest.approx(0.01) for x in bucket.plain_samples)
    # Every step took 0.04 s on that clock, drafts or not: a draft token costs nothing.
    assert bucket.spec_samples
    assert all(s == pytest.approx(0.04) for s, _, _ in bucket.spec_samples)
    assert bucket.plain_s == pytest.approx(0.01) and bucket.draft_s == 0.0


@pytest.mark.parametrize("pays", [False, True])
def test_exploration_flips_the_rule_and_keeps_the_estimates_updating(
    make_engine, tiny_dir, prompts, pays
):
    interval = 6
    engine = make_engine(
        speculative=SpeculativeConfig(
            "draft", model=str(tiny_dir), explore_interval=interval, also_prompt_lookup=False
        )
    )
    spec = engine.speculator
    # Start from costs that say always (drafts save time) or never (a draft token dearer than
    # a second); what the engine measures then takes over, whatever it is.
    _with_costs(engine, 4, plain_s=1e-3, draft_s=-1.0 if pays else 1.0)
    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    for prompt in prompts[4:8]:
        engine.add_request(prompt, params)
    num_explored = num_plain = num_spec = 0
    caught_up_at = -2  # the last step exploring switched on a sequence that had to catch up
    while engine.has_unfinished_requests():
        running = list(engine.scheduler.running)
        num_running = len(running)
        if not running or any(s.is_prefilling for s in running):
            engine.step()
            continue
        exploring = spec.is_exploring(num_running)
        wanting = []
        for s in running:
            remaining = s.params.max_tokens - s.num_output_tokens
            if remaining <= 1:
                continue  # no room for a draft
            catch_up = spec.extra_catch_up(s)
            on = spec.is_paying(
                spec.decision_acceptance(s),
                num_running,
                is_on=s.spec_is_on,
                catch_up=catch_up,
                remaining=remaining,
            )
            if exploring and (on or not catch_up):
                on = not on
            elif exploring and spec.step_index - caught_up_at > 1:
                on, caught_up_at = True, spec.step_index  # one such sequence, not all
            if on:
                wanting.append(s)
        costs = spec.costs.bucket(num_running)
        before = (costs.num_spec_steps, costs.num_plain_steps, costs.num_steps)
        drafts = engine.stats()["spec_decode_num_drafts"]
        engine.step()
        # Exactly the sequences the rule (flipped on an exploring step) picked drafted.
        assert engine.stats()["spec_decode_num_drafts"] - drafts == len(wanting)
        if wanting and spec.proposer.max_catch_up > 2:
            assert costs.num_steps == before[2], "a draft's catching up is not measured"
        else:
            assert costs.num_steps == before[2] + 1, "every other decode-only step is"
            kind = costs.num_spec_steps if wanting else costs.num_plain_steps
            assert kind == before[0 if wanting else 1] + 1, "a sample of the step's kind"
        num_explored += exploring
        num_spec += bool(wanting)
        num_plain += not wanting
    assert num_explored >= 3
    assert num_plain >= 3 and num_spec >= 3, "both kinds of step were measured again"
    assert spec.costs.bucket(4).draft_s != (-1.0 if pays else 1.0)


def test_exploration_backs_off_while_it_confirms_the_rule_and_resets_when_it_changes(
    make_engine, prompts
):
    """An exploration costs what the rule saves; while each one leaves the verdict as it was,
    the bucket explores half as often, down to once in EXPLORE_BACKOFF_MAX intervals, and a
    verdict that changed brings it back to every interval."""
    engine = make_engine(speculative=SpeculativeConfig("ngram", prompt_lookup_min=1))
    spec = engine.speculator
    interval = spec.config.explore_interval
    bucket = spec.costs.bucket(4)
    bucket.plain_s, bucket.draft_s = 1e-3, 1e-3  # break-even acceptance 1.0: never pays
    spec.acceptance_prior = 0.3
    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    seqs = [_decoding(engine, prompts[i], params) for i in range(4, 8)]
    explored = []
    for n in range(EXPLORE_BACKOFF_MAX * interval * 3 + 2 * interval + 4):
        if n == EXPLORE_BACKOFF_MAX * interval * 2 + 8:
            bucket.draft_s, spec.acceptance_prior = 1e-4, 0.9  # now it pays
        spec.start_step()
        if spec.is_exploring(4):
            explored.append(n)
        for seq in seqs:
            spec.lookahead(seq, 4)
        spec.end_step()
    pairs = [n for n in explored if n % 2]
    assert explored == [p + i for p in pairs for i in (0, 1)], "two steps in a row each time"
    # The first exploration records the verdict; each that confirms it doubles the interval
    # (the next exploration comes at the next multiple of the new one, plus one).
    gaps = [b - a for a, b in itertools.pairwise(pairs)]
    top = EXPLORE_BACKOFF_MAX * interval
    assert gaps[:6] == [interval, interval, 2 * interval, 4 * interval, top, top]
    # The exploration after the costs changed finds the verdict changed: every interval again.
    changed = next(i for i, p in enumerate(pairs) if p > 2 * top + 8)
    assert gaps[changed] == interval


def test_a_fresh_engine_speculates_then_measures_a_plain_step(make_engine, tiny_dir, prompts):
    engine = make_engine(
        speculative=SpeculativeConfig("draft", model=str(tiny_dir), also_prompt_lookup=False)
    )
    engine.generate(prompts[4:6], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
    bucket = engine.speculator.costs.bucket(2)
    assert engine.stats()["spec_decode_num_drafts"] > 0
    assert bucket.plain_s is not None and bucket.draft_s is not None


@pytest.mark.parametrize("is_noisy", [False, True])
@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_greedy_output_with_the_adaptive_controller_equals_no_speculation(
    make_engine, tiny_dir, prompts, method, is_noisy
):
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    plain = make_engine().generate(prompts, params)
    extra = {"prompt_lookup_min": 1} if method == "ngram" else {"model": str(tiny_dir)}
    # Exploring often mixes plain and speculative steps.
    spec = SpeculativeConfig(method, explore_interval=4, **extra)
    for max_num_seqs in (3, 16):
        engine = make_engine(speculative=spec, max_num_seqs=max_num_seqs)
        # A draft model, adaptive: it and prompt lookup, chosen per batch size.
        speculators = (
            list(engine.speculator.methods.values())
            if isinstance(engine.speculator, MethodChoice)
            else [engine.speculator]
        )
        assert len(speculators) == (2 if method == "draft" else 1)
        if is_noisy:
            # Step costs drawn at random over three orders of magnitude: the estimates, hence
            # who speculates (and with which method), change from step to step; the text must
            # not.
            rng = random.Random(max_num_seqs)
            for speculator in speculators:
                speculator.clock = _StepClock(rng.uniform(1e-4, 1e-1) for _ in itertools.count())
        outs = engine.generate(prompts, params)
        assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
        costs = [c for s in speculators for c in s.costs.snapshot().values()]
        assert any(c["num_plain_steps"] for c in costs)
        assert any(c["num_spec_steps"] for c in costs)
        assert engine.stats()["spec_decode_num_drafts"] > 0


def _heldout_files(root: Path) -> list[Path]:
    """Source-like files long enough for the spec workloads (3 x 192 bytes and more)."""
    root.mkdir(parents=True, exist_ok=True)
    files = []
    for i in range(4):
        body = "".join(
            f"def f{i}_{j}(x):\n    # step {j}\n    return x * {j} + {i}\n\n" for j in range(40)
        )
        path = root / f"m{i}.py"
        path.write_text(body)
        files.append(path)
    return files


def test_the_sweep_interleaves_the_modes_by_groups_and_sums_each_modes_runs(make_engine, prompts):
    engines = {
        "none": make_engine(),
        "ngram": make_engine(speculative=SpeculativeConfig("ngram", prompt_lookup_min=1)),
    }
    order: list[tuple[str, int]] = []
    for name, engine in engines.items():
        generate = engine.generate

        def recorded(group, params, name=name, generate=generate):
            order.append((name, len(group)))
            return generate(group, params)

        engine.generate = recorded
    cell = list(prompts[2:8])  # 6 requests, 2 in flight: 3 groups
    runs = _interleaved(engines, cell, 2, 8, offset=1)
    # Each group on every mode before the next group, starting one further along each group.
    assert order == [
        ("ngram", 2),
        ("none", 2),
        ("none", 2),
        ("ngram", 2),
        ("ngram", 2),
        ("none", 2),
    ]
    for tok_s, outputs, cpu, _ in runs.values():
        assert len(outputs) == 6 and all(len(o) == 8 for o in outputs) and tok_s > 0 and cpu > 0
    assert runs["ngram"][1] == runs["none"][1], "greedy: the same text, group by group"
    drafts, drafted, accepted = runs["ngram"][3]
    assert drafted == engines["ngram"].stats()["spec_decode_num_draft_tokens"] > 0
    assert runs["none"][3] == (0, 0, 0)


def test_the_bench_sweep_runs_quick_with_a_ratio_and_spread_per_mode_and_batch(
    tiny_dir, tmp_path, capsys
):
    section = spec_section(
        tiny_dir,
        tiny_dir,
        _heldout_files(tmp_path / "heldout"),
        quick=True,
        repeat=1,
        sweep_repeat=2,
    )
    assert set(section["results"]) == {"code_batch1", "code_batch4", "edit_batch1", "edit_batch4"}
    sweep = section["sweep"]
    assert sweep["batch_sizes"] == list(SWEEP_BATCHES) == [1, 2, 4, 8, 16]
    assert sweep["repeat"] == 2
    modes = ["none", "ngram", "draft", "ngram_adaptive", "draft_adaptive"]
    assert sweep["modes"] == modes
    assert list(sweep["results"]) == ["edit"]
    per_batch = sweep["results"]["edit"]
    assert list(per_batch) == ["1", "2", "4", "8", "16"]
    for cell in per_batch.values():
        for mode in modes:
            c = cell[mode]
            assert len(c["tok_s"]) == 2 and all(t > 0 for t in c["tok_s"])
            assert c["ratio_min"] <= c["ratio"] <= c["ratio_max"]
            assert len(c["cpu_s"]) == 2 and all(t > 0 for t in c["cpu_s"])
            assert c["cpu_ratio_min"] <= c["cpu_ratio"] <= c["cpu_ratio_max"]
            assert c["greedy_identical"] is True
            assert (c["draft_tokens"] > 0) is (mode != "none")
        assert cell["none"]["ratio"] == 1.0 and cell["none"]["cpu_ratio"] == 1.0
        assert len(cell["load_avg"]) == 2
        assert set(cell["checks"]) == {"wall", "cpu"}
        for measure, key in (("wall", "ratio"), ("cpu", "cpu_ratio")):
            checks = cell["checks"][measure]
            assert set(checks) == {"ngram_adaptive", "draft_adaptive"}
            best = max(cell["ngram"][key], cell["draft"][key])
            for name, check in checks.items():
                ratio = cell[name][key]
                assert check["at_least_none"] is (ratio >= 1.0)
                own = cell[name.removesuffix("_adaptive")][key]
                assert check["within_5pct_of_forced"] is (ratio >= 0.95 * own)
                assert cell[check["best_forced"]][key] == best
                assert check["within_5pct_of_best_forced"] is (ratio >= 0.95 * best)
    # Draft adaptive chooses between its draft model and prompt lookup: the costs of each.
    assert set(sweep["costs"]) == {
        "ngram_adaptive",
        "draft_adaptive/ngram",
        "draft_adaptive/draft",
    }
    choice = sweep["choices"]["draft_adaptive"]
    assert set(choice["methods"]) == {"ngram", "draft"}
    assert set(choice["chosen"].values()) <= {"ngram", "draft"}
    assert sum(n for m in choice["methods"].values() for n in m["steps"].values()) > 0
    assert len(sweep["load_avg"]) == 2
    spec_print(section)
    printed = capsys.readouterr().out
    assert "speculation sweep" in printed and ">= 0.95x best forced" in printed
    assert "cpu  ngram_adaptive" in printed and "wall draft_adaptive" in printed
    assert "draft_adaptive chose per batch bucket" in printed


def test_the_sweep_alone_leaves_the_table_out(tiny_dir, tmp_path):
    section = spec_section(
        tiny_dir,
        tiny_dir,
        _heldout_files(tmp_path / "heldout"),
        quick=True,
        repeat=1,
        sweep_batches=(2,),
        sweep_repeat=1,
        table=False,
    )
    assert section["results"] == {}
    assert list(section["sweep"]["results"]["edit"]) == ["2"]
