"""The speculation method chosen per batch size (spec/choice.py): a draft model or prompt
lookup, by measured step costs and what each method's tries yield; exactness whichever is
chosen; a seeded sampled request keeping its configured method."""

from __future__ import annotations

import pytest

from workers.engine import LLMEngine, SamplingParams
from workers.engine.config import SpeculativeConfig
from workers.engine.spec.choice import (
    CHOICE_MARGIN,
    CHOICE_PROBE_BACKOFF_MAX,
    CHOICE_PROBE_INTERVAL,
    CHOICE_PROBE_STEPS,
    MethodChoice,
)
from workers.engine.spec.costs import tokens_per_second
from workers.engine.spec.speculator import PRIOR_SMOOTHING, Speculator

from .spec_helpers import always


def test_tokens_per_second_counts_the_tries_a_method_has_nothing_to_propose():
    # Always 4 drafts, 2 accepted: 3 tokens in plain + 4 draft.
    assert tokens_per_second(2.0, 4.0, 1e-3, 0.1e-3) == pytest.approx(3 / 1.4e-3)
    # The same acceptance (0.5 of what it drafts) but nothing to propose half the time: half
    # the drafts and half the accepted tokens per try, fewer tokens per second.
    assert tokens_per_second(1.0, 2.0, 1e-3, 0.1e-3) == pytest.approx(2 / 1.2e-3)
    assert tokens_per_second(1.0, 2.0, 1e-3, 0.1e-3) < tokens_per_second(2.0, 4.0, 1e-3, 0.1e-3)
    # Not paying: the plain rate (the method's rule decodes plainly).
    assert tokens_per_second(0.2, 4.0, 1e-3, 0.5e-3) == pytest.approx(1 / 1e-3)
    assert tokens_per_second(1.0, 4.0, None, 0.5e-3) is None
    assert tokens_per_second(1.0, 4.0, 1e-3, None) is None


def _draft_config(tiny_dir, **extra) -> SpeculativeConfig:
    return SpeculativeConfig("draft", model=str(tiny_dir), **extra)


def test_an_adaptive_draft_model_gets_prompt_lookup_as_a_second_method(make_engine, tiny_dir):
    engine = make_engine(speculative=_draft_config(tiny_dir))
    choice = engine.speculator
    assert isinstance(choice, MethodChoice)
    assert choice.names == ["ngram", "draft"] and choice.configured == "draft"
    # One set of vLLM's counters for both methods.
    assert choice.methods["ngram"].stats is choice.methods["draft"].stats is choice.stats
    # Off, forced, or prompt lookup configured: one method, as before.
    for spec in (
        _draft_config(tiny_dir, also_prompt_lookup=False),
        always("draft", 4, model=str(tiny_dir)),
        SpeculativeConfig("ngram"),
    ):
        assert isinstance(make_engine(speculative=spec).speculator, Speculator)


def _measured(choice: MethodChoice, name: str, bucket: int, *, plain_s, draft_s, drafted, accepted):
    """Method ``name`` measured in ``bucket``: these costs, and every try yielding this."""
    speculator = choice.methods[name]
    costs = speculator.costs.bucket(bucket)
    costs.plain_s, costs.draft_s = plain_s, draft_s
    for _ in range(60):
        speculator.record_try(drafted, accepted)


def test_each_bucket_goes_to_the_method_that_predicts_more_with_hysteresis_and_probes(
    make_engine, tiny_dir
):
    choice = make_engine(speculative=_draft_config(tiny_dir)).speculator
    # Batch 1: the draft model (2.5 of 4 accepted, a draft token 0.1 of a plain step) beats
    # prompt lookup (a proposal one try in four).
    _measured(choice, "draft", 1, plain_s=10e-3, draft_s=1e-3, drafted=4, accepted=2.5)
    _measured(choice, "ngram", 1, plain_s=10e-3, draft_s=0.05e-3, drafted=1, accepted=0.6)
    # Batch 8: a draft token costs 0.6 of a sequence's plain share; prompt lookup wins.
    _measured(choice, "draft", 8, plain_s=2e-3, draft_s=1.2e-3, drafted=4, accepted=2.5)
    _measured(choice, "ngram", 8, plain_s=2e-3, draft_s=0.1e-3, drafted=1, accepted=0.6)
    assert choice.rate("draft", 1) > choice.rate("ngram", 1)
    assert choice.rate("ngram", 8) > choice.rate("draft", 8)
    assert choice.choose(1) == "draft" and choice.choose(8) == "ngram"
    assert choice.chosen == {1: "draft", 8: "ngram"}
    assert not any(s.is_probing for s in choice.methods.values())
    # Hysteresis: prompt lookup predicting a little more at batch 1 does not take it...
    draft_rate = choice.rate("draft", 1)
    ngram = choice.methods["ngram"].costs.bucket(1)
    ngram.plain_s = 1.0 / (draft_rate * (1 + CHOICE_MARGIN / 2) / 1.6)  # 1 + 0.6 tokens a try
    ngram.draft_s = 0.0
    assert draft_rate < choice.rate("ngram", 1) < draft_rate * (1 + CHOICE_MARGIN)
    assert choice.choose(1) == "draft"
    # ... predicting clearly more does.
    ngram.plain_s *= 0.9
    assert choice.choose(1) == "ngram"
    # Every CHOICE_PROBE_INTERVAL steps of a bucket, the other method drafts (probing) for
    # CHOICE_PROBE_STEPS steps.
    choice.num_steps[8] = CHOICE_PROBE_INTERVAL
    for step in range(CHOICE_PROBE_STEPS):
        choice.num_steps[8] = CHOICE_PROBE_INTERVAL + step
        assert choice.choose(8) == "draft" and choice.methods["draft"].is_probing
        choice.methods["draft"].is_probing = False
    choice.num_steps[8] = CHOICE_PROBE_INTERVAL + CHOICE_PROBE_STEPS
    assert choice.choose(8) == "ngram" and not choice.methods["draft"].is_probing


def _probe_starts(choice: MethodChoice, bucket: int, first: int, num_steps: int) -> list[int]:
    """The steps of ``bucket`` at which a probe starts, choosing step by step from ``first``."""
    starts, was_probing = [], False
    for n in range(first, first + num_steps):
        choice.num_steps[bucket] = n
        is_probing = choice.choose(bucket) != choice.chosen[bucket]
        if is_probing and not was_probing:
            starts.append(n)
        was_probing = is_probing
        for speculator in choice.methods.values():
            speculator.is_probing = False
    return starts


def test_probes_back_off_while_the_bucket_keeps_its_method_and_return_when_it_changes(
    make_engine, tiny_dir
):
    choice = make_engine(speculative=_draft_config(tiny_dir)).speculator
    _measured(choice, "draft", 8, plain_s=2e-3, draft_s=1.2e-3, drafted=4, accepted=2.5)
    _measured(choice, "ngram", 8, plain_s=2e-3, draft_s=0.1e-3, drafted=1, accepted=0.6)
    # Prompt lookup keeps batch 8: the waits between probes of the draft model double, up to
    # CHOICE_PROBE_BACKOFF_MAX times the interval.
    interval, longest = CHOICE_PROBE_INTERVAL, CHOICE_PROBE_BACKOFF_MAX * CHOICE_PROBE_INTERVAL
    starts = _probe_starts(choice, 8, 0, 6 * longest)
    waits = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert starts[0] == interval
    assert waits == [min(interval * 2**i, longest) for i in range(1, len(waits) + 1)]
    assert waits[-1] == longest
    # A probe after which the bucket changes method brings the wait back to the interval.
    n = starts[-1] + longest  # the next probe's first step
    choice.num_steps[8] = n
    assert choice.choose(8) == "draft" and choice.methods["draft"].is_probing
    choice.methods["draft"].costs.bucket(8).draft_s = 0.01e-3  # the probe finds it cheap now
    for step in range(1, CHOICE_PROBE_STEPS + 1):
        choice.num_steps[8] = n + step
        choice.choose(8)
    assert choice.chosen[8] == "draft"
    assert _probe_starts(choice, 8, n + CHOICE_PROBE_STEPS + 1, 2 * interval) == [n + interval]


class _ShapeClock:
    """The cost model's clock for one method: a step of n sequences and d draft tokens takes
    n x plain_s + d x draft_s (+ 10 us a catch-up token), whatever the machine is doing."""

    def __init__(self, speculator: Speculator, *, plain_s: float, draft_s: float) -> None:
        self.speculator, self.plain_s, self.draft_s = speculator, plain_s, draft_s
        self.now = 0.0

    def __call__(self) -> float:
        shape = self.speculator._step_shape  # set between propose and end_step
        if shape is not None:
            num_seqs, num_drafts, catch_up = shape
            self.now += num_seqs * self.plain_s + num_drafts * self.draft_s + catch_up * 1e-5
        return self.now


def _engine_with_costs(make_engine, tiny_dir, *, draft_s: float, ngram_s: float) -> LLMEngine:
    # The draft is the target itself: greedy drafts are always accepted.
    engine = make_engine(speculative=_draft_config(tiny_dir, prompt_lookup_min=1), max_num_seqs=4)
    choice = engine.speculator
    for name, cost in (("draft", draft_s), ("ngram", ngram_s)):
        speculator = choice.methods[name]
        speculator.clock = _ShapeClock(speculator, plain_s=2e-3, draft_s=cost)
    return engine


@pytest.mark.parametrize(
    ("draft_s", "ngram_s", "expected"),
    [
        (0.2e-3, 0.1e-3, "draft"),  # a cheap, always-right draft model beats prompt lookup
        (3e-3, 0.1e-3, "ngram"),  # a draft token dearer than a plain step never pays
    ],
)
def test_the_engine_chooses_the_method_its_measured_steps_favour_and_output_is_exact(
    make_engine, tiny_dir, prompts, draft_s, ngram_s, expected
):
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    # Each prompt says its first half twice: prompt lookup has something to propose at once.
    texts = [p[:12] + p[:12] for p in prompts[8:16]]
    plain = make_engine().generate(texts, params)
    engine = _engine_with_costs(make_engine, tiny_dir, draft_s=draft_s, ngram_s=ngram_s)
    outs = engine.generate(texts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    choice = engine.speculator
    assert choice.chosen[4] == expected, choice.snapshot()
    steps = {name: choice.num_method_steps.get((name, 4), 0) for name in choice.names}
    other = next(name for name in choice.names if name != expected)
    assert steps[expected] > 2 * steps[other], choice.snapshot()
    assert engine.stats()["spec_decode_num_drafts"] > 0


def test_a_seeded_sampled_request_keeps_its_configured_method_in_a_prompt_lookup_batch(
    make_engine, tiny_dir, prompts
):
    seeded = SamplingParams(max_tokens=24, temperature=0.9, seed=17, ignore_eos=True)
    alone = make_engine(speculative=always("draft", 4, model=str(tiny_dir))).generate(
        [prompts[9]], seeded
    )[0]
    # Prompt lookup wins this engine's batches (its draft tokens cost more than a plain step).
    engine = _engine_with_costs(make_engine, tiny_dir, draft_s=3e-3, ngram_s=0.1e-3)
    greedy = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    texts = [p[:12] + p[:12] for p in prompts[10:13]]  # prompt lookup proposes at once
    outs = engine.generate(texts + [prompts[9]], [greedy] * 3 + [seeded])
    assert outs[-1].token_ids == alone.token_ids
    choice = engine.speculator
    assert set(choice.chosen.values()) == {"ngram"}, choice.snapshot()
    # Steps where both methods drafted: prompt lookup for the batch, the draft model for the
    # seeded request.
    assert choice.num_mixed_steps > 0, choice.snapshot()


def test_a_sequence_the_draft_model_declines_for_its_catch_up_is_offered_to_prompt_lookup(
    make_engine, tiny_dir, prompts
):
    engine = make_engine(speculative=_draft_config(tiny_dir, prompt_lookup_min=1))
    choice = engine.speculator
    # Batch 1 is the draft model's: it predicts more than prompt lookup there.
    _measured(choice, "draft", 1, plain_s=10e-3, draft_s=1e-3, drafted=4, accepted=3)
    _measured(choice, "ngram", 1, plain_s=10e-3, draft_s=0.05e-3, drafted=1, accepted=0.5)
    draft = choice.methods["draft"]
    draft.costs.catch_up_s = 1e-3  # a token the draft model catches up on
    draft.num_decided[1] = 3  # no exploring step (they do the opposite of the rule)
    half = prompts[10][:30]
    text = half + half  # prompt lookup proposes what followed the first half: the second

    def decoding(max_tokens: int):
        seq = engine.make_sequence(text, SamplingParams(max_tokens=max_tokens, temperature=0.0))
        seq.num_computed_tokens = seq.num_tokens - 1  # its prompt is cached: it decodes
        return seq

    long, short = decoding(400), decoding(3)
    assert len(text) == 60
    # A long answer repays its 58 tokens of catch-up (58 ms): the draft model drafts for it.
    choice.start_step()
    assert choice.lookahead(long, 1) == 4 and long.spec_method == "draft"
    choice.end_step()
    # Three tokens left repay nothing: prompt lookup drafts for it instead, though the step
    # is the draft model's.
    choice.start_step()
    assert choice.lookahead(short, 1) == 2 and short.spec_method == "ngram"
    assert choice.chosen[1] == "draft"
    assert short.spec_token_ids == half[:2]
    choice.end_step()


def test_prompt_lookup_is_scored_on_the_text_of_sequences_the_draft_model_serves(
    make_engine, tiny_dir, prompts
):
    engine = make_engine(speculative=_draft_config(tiny_dir, prompt_lookup_min=1))
    choice = engine.speculator
    for name in choice.names:  # both measured at batch 1; only the draft model has tries
        costs = choice.methods[name].costs.bucket(1)
        costs.plain_s, costs.draft_s = 10e-3, 1e-3
    draft, lookup = choice.methods["draft"], choice.methods["ngram"]
    for _ in range(60):
        draft.record_try(4, 3)
    draft.num_decided[1] = 3  # no exploring step
    half = prompts[10][:30]
    seq = engine.make_sequence(half + half, SamplingParams(max_tokens=100, temperature=0.0))
    seq.num_computed_tokens = seq.num_tokens - 1

    def step() -> None:
        choice.start_step()
        assert choice.lookahead(seq, 1) == 4 and seq.spec_method == "draft"
        choice.end_step()

    step()
    # What prompt lookup would propose at position 60: what followed the first half.
    assert seq.spec_shadow == (60, half[:4])
    assert lookup.tries_yield is None
    # The target emits the first two of them, then another token, then one more.
    seq.token_ids += [half[0], half[1], half[2] + 1]
    step()  # not known yet: the fourth token is not there
    assert lookup.tries_yield is None and seq.spec_shadow[0] == 60
    seq.token_ids.append(half[3])
    own, prior = seq.spec_acceptance, lookup.acceptance_prior
    step()
    # Scored: 4 proposed, 2 accepted (a draft stops at its first miss); a new proposal from 64.
    assert lookup.tries_yield == pytest.approx((4.0, 2.0))
    # Prompt lookup's acceptance follows (0.5); the sequence's own is the draft model's.
    assert lookup.acceptance_prior == pytest.approx(prior + PRIOR_SMOOTHING * (0.5 - prior))
    assert seq.spec_acceptance == own
    assert seq.spec_shadow is not None and seq.spec_shadow[0] == 64
    # Prompt lookup never ran, and a sampled request is not scored (its text is a draw).
    assert not any(name == "ngram" for name, _ in choice.num_method_steps)
    sampled = engine.make_sequence(half + half, SamplingParams(max_tokens=100, temperature=1.0))
    sampled.num_computed_tokens = sampled.num_tokens - 1
    choice.start_step()
    choice.lookahead(sampled, 1)
    choice.end_step()
    assert sampled.spec_shadow is None
