"""Sampled outputs with speculation follow the target's distribution (chi-square on a toy
vocabulary), in the three cases the rule has: rejection at the first draft, every draft accepted
(with the bonus token), and a rejection right at a block boundary; seeded requests reproduce."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from tests.engine.spec_helpers import ScriptedProposer, always, perturbed_copy
from workers.engine import EngineConfig, LLMEngine, SamplingParams, preset_create
from workers.engine.config import SpeculativeConfig

VOCAB, TOP_K, NUM_OUT, NUM_SAMPLES = 8, 3, 4, 3000
BLOCK_SIZE = 4
PROMPT = [3, 1, 4, 1, 5, 6]  # 6 tokens: the first draft step feeds positions 6, 7 | 8 (a boundary)
PARAMS = SamplingParams(
    max_tokens=NUM_OUT, temperature=1.0, top_k=TOP_K, ignore_eos=True, is_detokenized=False
)


class Reference:
    """The exact sampling distribution of a model (transformers on the same weights), per prefix."""

    def __init__(self, path: Path) -> None:
        from transformers import LlamaForCausalLM

        self.model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.cache: dict[tuple[int, ...], torch.Tensor] = {}

    def probs(self, prefix: tuple[int, ...]) -> torch.Tensor:
        if prefix not in self.cache:
            with torch.no_grad():
                logits = self.model(torch.tensor([prefix])).logits[0, -1].double()
            keep = logits >= logits.topk(TOP_K).values[-1]
            self.cache[prefix] = torch.softmax(logits.masked_fill(~keep, float("-inf")), dim=-1)
        return self.cache[prefix]

    def joint(self, prompt: list[int], n: int) -> dict[tuple[int, ...], float]:
        """P(first n output tokens) over the top-k tree."""
        out = {(): 1.0}
        for _ in range(n):
            out = {
                seq + (t,): p * float(self.probs(tuple(prompt) + seq)[t])
                for seq, p in out.items()
                for t in range(VOCAB)
                if self.probs(tuple(prompt) + seq)[t] > 0
            }
        return out


def chi_square_p(samples: list[tuple[int, ...]], expected: dict[tuple[int, ...], float]) -> float:
    """p-value of Pearson's test; cells expected below 5 are pooled. A sample off the support
    fails."""
    assert set(samples) <= set(expected), "a token outside the target's top-k was emitted"
    counts = dict.fromkeys(expected, 0)
    for s in samples:
        counts[s] += 1
    n = len(samples)
    big = [c for c in expected if expected[c] * n >= 5]
    small = [c for c in expected if expected[c] * n < 5]
    observed = [counts[c] for c in big] + ([sum(counts[c] for c in small)] if small else [])
    wanted = [expected[c] * n for c in big] + (
        [sum(expected[c] for c in small) * n] if small else []
    )
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, wanted, strict=False))
    df = len(observed) - 1
    return float(
        torch.special.gammaincc(
            torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)
        )
    )


@pytest.fixture(scope="module")
def toy_dir(tmp_path_factory) -> Path:
    return preset_create("tiny", tmp_path_factory.mktemp("toy") / "toy", seed=11, vocab_size=VOCAB)


@pytest.fixture(scope="module")
def toy_ref(toy_dir) -> Reference:
    return Reference(toy_dir)


def _engine(toy_dir: Path, speculative, proposer=None, *, seed: int = 0) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=str(toy_dir),
            block_size=BLOCK_SIZE,
            num_kv_blocks=6000,
            max_num_seqs=512,
            max_num_batched_tokens=8192,
            seed=seed,
            speculative=speculative,
        ),
        proposer=proposer,
    )


def _sample(engine: LLMEngine) -> list[tuple[int, ...]]:
    outs = engine.generate([PROMPT] * NUM_SAMPLES, PARAMS)
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    return [tuple(o.token_ids) for o in outs]


def _worst(ref: Reference, prefix: tuple[int, ...]) -> int:
    """A token the target can never emit after ``prefix`` (outside its top-k): always rejected."""
    return int(ref.probs(prefix).argmin())


def test_rejection_at_the_first_draft_keeps_the_distribution(toy_dir, toy_ref):
    def script(seq, k):
        return [_worst(toy_ref, tuple(seq.token_ids))] * k, None

    engine = _engine(toy_dir, always("ngram", 2), ScriptedProposer(script))
    samples = _sample(engine)
    stats = engine.stats()
    assert (
        stats["spec_decode_num_drafts"] >= NUM_SAMPLES
        and stats["spec_decode_num_accepted_tokens"] == 0
    )
    assert chi_square_p(samples, toy_ref.joint(PROMPT, NUM_OUT)) > 1e-3


def test_all_drafts_accepted_with_the_bonus_token_keeps_the_distribution(toy_dir, toy_ref):
    engine = _engine(toy_dir, always("draft", 2, model=str(toy_dir)))  # the target is its own draft
    samples = _sample(engine)
    stats = engine.stats()
    assert stats["spec_decode_num_drafts"] >= NUM_SAMPLES
    assert stats["spec_decode_num_accepted_tokens"] >= 0.99 * stats["spec_decode_num_draft_tokens"]
    assert (
        stats["spec_decode_num_accepted_tokens_per_pos"][1] > 0.9 * NUM_SAMPLES
    )  # both drafts, then the bonus
    assert chi_square_p(samples, toy_ref.joint(PROMPT, NUM_OUT)) > 1e-3


def test_rejection_at_a_block_boundary_keeps_the_distribution(toy_dir, toy_ref):
    """The first draft step reserves positions 6, 7 and 8 (a new block): the draft at 7 is drawn
    from the target's own distribution (accepted), the one at 8 can never be (rejected), so the
    block holding position 8 is freed at every first step."""
    g = torch.Generator().manual_seed(3)

    def script(seq, k):
        prefix = tuple(seq.token_ids)
        if len(prefix) == len(PROMPT) + 1 and k == 2:
            p = toy_ref.probs(prefix).float()
            first = int(torch.multinomial(p, 1, generator=g))
            bad = _worst(toy_ref, prefix + (first,))
            return [first, bad], torch.stack(
                [p, torch.nn.functional.one_hot(torch.tensor(bad), VOCAB).float()]
            )
        return [_worst(toy_ref, prefix)] * k, None

    engine = _engine(toy_dir, always("ngram", 2), ScriptedProposer(script))
    bm, truncate, freed = engine.block_manager, engine.block_manager.truncate, []

    def counting_truncate(seq):
        before = len(seq.block_table)
        truncate(seq)
        freed.append(before - len(seq.block_table))

    bm.truncate = counting_truncate
    samples = _sample(engine)
    stats = engine.stats()
    assert stats["spec_decode_num_accepted_tokens_per_pos"][0] > 0.95 * NUM_SAMPLES
    assert stats["spec_decode_num_accepted_tokens_per_pos"][1] == 0
    assert sum(freed) > 0.95 * NUM_SAMPLES  # the block past the rejected draft, every time
    assert chi_square_p(samples, toy_ref.joint(PROMPT, NUM_OUT)) > 1e-3


def test_the_chi_square_tells_the_draft_from_the_target(toy_dir, toy_ref, tmp_path):
    """A jittered draft: ragged acceptance; samples match the target, and clearly not the draft."""
    draft = perturbed_copy(toy_dir, tmp_path / "draft", noise=0.6, seed=1)
    engine = _engine(toy_dir, always("draft", 2, model=str(draft)))
    samples = _sample(engine)
    stats = engine.stats()
    assert (
        0.2 * stats["spec_decode_num_draft_tokens"]
        < stats["spec_decode_num_accepted_tokens"]
        < 0.95 * stats["spec_decode_num_draft_tokens"]
    )
    assert chi_square_p(samples, toy_ref.joint(PROMPT, NUM_OUT)) > 1e-3
    draft_joint = Reference(draft).joint(PROMPT, NUM_OUT)
    target_joint = toy_ref.joint(PROMPT, NUM_OUT)
    support = set(draft_joint) & set(target_joint)
    assert (
        chi_square_p(
            [s for s in samples if s in support],
            {c: draft_joint[c] / sum(draft_joint[d] for d in support) for c in support},
        )
        < 1e-6
    )


def test_seeded_requests_reproduce_whatever_the_batch_and_load(tiny_dir, prompts):
    params = SamplingParams(max_tokens=24, temperature=0.9, seed=17, ignore_eos=True)
    spec = always("draft", 3, model=str(tiny_dir))
    alone = LLMEngine(
        EngineConfig(model=str(tiny_dir), num_kv_blocks=512, speculative=spec)
    ).generate([prompts[9]], params)[0]
    # Under load this engine would switch speculation off (batch > 1, acceptance < 0.9): not for
    # seeded requests.
    busy_spec = SpeculativeConfig(
        "draft",
        num_speculative_tokens=3,
        model=str(tiny_dir),
        disable_by_batch_size=1,
        min_acceptance_rate=0.9,
    )
    busy = LLMEngine(
        EngineConfig(model=str(tiny_dir), num_kv_blocks=512, seed=5, speculative=busy_spec)
    )
    crowd = [SamplingParams(max_tokens=24, temperature=1.0, ignore_eos=True)] * 6 + [params]
    outs = busy.generate(prompts[2:8] + [prompts[9]], crowd)
    assert outs[-1].token_ids == alone.token_ids
    assert busy.stats()["spec_decode_num_drafts"] > 0


def test_joint_reference_sums_to_one(toy_ref):
    assert abs(sum(toy_ref.joint(PROMPT, 2).values()) - 1.0) < 1e-9
    assert all(len(c) == 2 for c in itertools.islice(toy_ref.joint(PROMPT, 2), 5))
