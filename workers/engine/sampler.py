"""Batched token sampling: greedy, temperature, top-k, top-p, per-request seeds, logprobs."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from workers.engine.guide import guide_masks
from workers.engine.sequence import Sequence


@dataclass(slots=True)
class SampleResult:
    token_ids: list[int]
    logprobs: list[float] | None  # of the chosen tokens, raw distribution; None if nobody asked
    top_logprobs: list[dict[int, float] | None] | None


class Sampler:
    """Samples one token per row of logits, each row under its own sequence's parameters.

    Random rows draw one uniform number each (from the request's seeded generator, or the
    engine's) and invert the CDF of the filtered distribution: a token outside top-k/top-p has
    probability exactly zero and can never be picked, and a seeded request's draws do not
    depend on which other requests share the batch.
    """

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)
        # What guided decoding costs: time spent masking, over the steps that had guided rows.
        self.guide_seconds, self.num_guided_steps = 0.0, 0

    def __call__(
        self, logits: torch.Tensor, seqs: list[Sequence], eos_token_ids: tuple[int, ...]
    ) -> SampleResult:
        logits = logits.float().cpu()  # [num_seqs, vocab]
        raw = logits
        logits = _penalize(logits, seqs)
        suppressed = self._suppress_stops(logits, seqs, eos_token_ids)
        if any(s.guide is not None for s in seqs):
            start = time.perf_counter()
            logits = _guide(suppressed, logits, seqs)
            self.guide_seconds += time.perf_counter() - start
            self.num_guided_steps += 1
        else:
            logits = suppressed
        token_ids = logits.argmax(dim=-1)
        random_rows = [i for i, s in enumerate(seqs) if not s.params.is_greedy]
        if random_rows:
            rows = torch.tensor(random_rows)
            token_ids[rows] = self._sample(logits[rows], [seqs[i] for i in random_rows])
        return SampleResult(token_ids.tolist(), *self._logprobs(raw, token_ids, seqs))

    @staticmethod
    def _suppress_stops(
        logits: torch.Tensor, seqs: list[Sequence], eos_token_ids: tuple[int, ...]
    ) -> torch.Tensor:
        """Before min_tokens, EOS and stop tokens cannot be chosen."""
        rows = [i for i, s in enumerate(seqs) if s.num_output_tokens < s.params.min_tokens]
        if not rows:
            return logits
        logits = logits.clone()
        for i in rows:
            stops = [
                *seqs[i].params.stop_token_ids,
                *([] if seqs[i].params.ignore_eos else eos_token_ids),
            ]
            logits[i, stops] = float("-inf")
        return logits

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        temperature = torch.tensor([s.params.temperature for s in seqs]).unsqueeze(1)
        logits = logits / temperature
        top_k = [s.params.top_k for s in seqs]
        top_p = [s.params.top_p for s in seqs]
        is_filtered = any(k > 0 for k in top_k) or any(p < 1.0 for p in top_p)
        if is_filtered:
            logits, order = logits.sort(dim=-1, descending=True)
            logits = _filter_sorted(logits, top_k, top_p)
        probs = torch.softmax(logits, dim=-1)
        cdf = probs.cumsum(dim=-1)
        u = self._uniforms(seqs) * cdf[:, -1]
        picked = torch.searchsorted(cdf, u.unsqueeze(1), right=True).squeeze(1)
        # A draw landing on the float rounding at the very top takes the last token still allowed.
        last_allowed = (
            (probs > 0).sum(dim=-1) - 1
            if is_filtered
            else torch.full_like(picked, probs.shape[1] - 1)
        )
        picked = torch.minimum(picked, last_allowed)
        return order.gather(1, picked.unsqueeze(1)).squeeze(1) if is_filtered else picked

    def _uniforms(self, seqs: list[Sequence]) -> torch.Tensor:
        shared = torch.rand(len(seqs), generator=self.generator, dtype=torch.float64)
        own = [(i, s.generator) for i, s in enumerate(seqs) if s.generator is not None]
        for i, gen in own:
            shared[i] = torch.rand(1, generator=gen, dtype=torch.float64)
        return shared.float()

    @staticmethod
    def logprobs_of(raw: torch.Tensor, token_ids: list[int], num_top: int | None):
        """Logprobs of ``token_ids[i]`` under row i of ``raw`` [n, vocab], and the ``num_top``
        best."""
        if num_top is None:
            return None, None
        logprobs = torch.log_softmax(raw.float(), dim=-1)
        chosen = logprobs[torch.arange(len(token_ids)), torch.tensor(token_ids)].tolist()
        if not num_top:
            return chosen, None
        values, indices = logprobs.topk(num_top, dim=-1)
        return chosen, [
            dict(zip(i.tolist(), v.tolist(), strict=False))
            for i, v in zip(indices, values, strict=False)
        ]

    @staticmethod
    def _logprobs(raw: torch.Tensor, token_ids: torch.Tensor, seqs: list[Sequence]):
        wanted = [s.params.logprobs for s in seqs]
        if all(w is None for w in wanted):
            return None, None
        logprobs = torch.log_softmax(raw, dim=-1)
        chosen = logprobs.gather(1, token_ids.unsqueeze(1)).squeeze(1).tolist()
        num_top = max(w or 0 for w in wanted)
        if num_top == 0:
            return chosen, None
        values, indices = logprobs.topk(num_top, dim=-1)
        top: list[dict[int, float] | None] = []
        for row, n in enumerate(wanted):
            top.append(
                dict(zip(indices[row, :n].tolist(), values[row, :n].tolist(), strict=False))
                if n
                else None
            )
        return chosen, top


def _guide(logits: torch.Tensor, unsuppressed: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """Guided rows (JSON mode, schemas, tool calls) keep only the tokens their grammar allows;
    the grammar decides when EOS may come, over min_tokens. A row whose grammar broke (before
    or while computing its mask) is left as it is."""
    guides = [(i, s.guide) for i, s in enumerate(seqs) if s.guide is not None and s.guide.is_active]
    if not guides:
        return logits
    keep = guide_masks([guide for _, guide in guides], logits.shape[1])  # [len(guides), vocab]
    is_guided = [guide.is_active for _, guide in guides]
    rows = [i for (i, _), ok in zip(guides, is_guided, strict=False) if ok]
    if len(rows) < len(guides):
        keep = keep[torch.tensor(is_guided)]
    if len(rows) == len(seqs):
        return unsuppressed.masked_fill(~keep, float("-inf"))
    if logits is not unsuppressed:  # min_tokens held stops back in some row
        logits = logits.clone()
        logits[rows] = unsuppressed[rows]
    blocked = torch.zeros_like(logits, dtype=torch.bool)
    blocked[rows] = ~keep
    return logits.masked_fill(blocked, float("-inf"))


def _penalize(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """Presence/frequency penalties over output tokens, logit bias, repetition penalty over all
    tokens."""
    rows = [i for i, s in enumerate(seqs) if s.params.has_penalties]
    if not rows:
        return logits
    logits = logits.clone()
    vocab = logits.shape[1]
    for i in rows:
        params, seq = seqs[i].params, seqs[i]
        if params.presence_penalty or params.frequency_penalty:
            counts = torch.bincount(
                torch.tensor(seq.output_token_ids, dtype=torch.long), minlength=vocab
            )[:vocab]
            logits[i] -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0)
        if params.logit_bias:
            tokens, biases = zip(*params.logit_bias, strict=False)
            logits[i, list(tokens)] += torch.tensor(biases, dtype=logits.dtype)
        if params.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(seq.token_ids)), dtype=torch.long)
            values = logits[i, seen]
            logits[i, seen] = torch.where(
                values > 0, values / params.repetition_penalty, values * params.repetition_penalty
            )
    return logits


def _filter_sorted(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Mask sorted (descending) logits outside each row's top-k, then outside its top-p nucleus."""
    vocab = logits.shape[1]
    ranks = torch.arange(vocab).unsqueeze(0)
    k = torch.tensor([t if t > 0 else vocab for t in top_k]).unsqueeze(1)
    logits = logits.masked_fill(ranks >= k, float("-inf"))
    p = torch.tensor(top_p).unsqueeze(1)
    probs = torch.softmax(logits, dim=-1)
    # Drop a token when the tokens ranked before it already reach top_p; the first always stays
    # (also when top_p is so small that it is 0 as a float32).
    mass_before = probs.cumsum(dim=-1) - probs
    return logits.masked_fill((mass_before >= p) & (ranks > 0), float("-inf"))


def processed_probs(logits: torch.Tensor, params: list) -> torch.Tensor:
    """The distribution each row samples from (temperature, then top-k, then top-p), in vocabulary
    order: [rows, vocab]. The same rule as ``Sampler._sample``; speculation verifies against it."""
    logits = logits.float() / torch.tensor([p.temperature for p in params]).unsqueeze(1)
    top_k = [p.top_k for p in params]
    top_p = [p.top_p for p in params]
    if any(k > 0 for k in top_k) or any(p < 1.0 for p in top_p):
        ordered, order = logits.sort(dim=-1, descending=True)
        logits = torch.empty_like(logits).scatter_(1, order, _filter_sorted(ordered, top_k, top_p))
    return torch.softmax(logits, dim=-1)


def inverse_cdf(probs: torch.Tensor, u: float) -> int:
    """The token at ``u`` (in [0, 1)) of an unnormalised distribution [vocab]; never a
    zero-probability one."""
    cdf = probs.double().cumsum(0)
    picked = int(
        torch.searchsorted(cdf, torch.tensor([u * float(cdf[-1])], dtype=torch.float64), right=True)
    )
    last_allowed = int(probs.nonzero()[-1])
    return min(picked, last_allowed)


def uniform(seq: Sequence, shared: torch.Generator) -> float:
    """One draw in [0, 1): from the request's own seeded generator, else the engine's."""
    generator = seq.generator if seq.generator is not None else shared
    return float(torch.rand(1, generator=generator, dtype=torch.float64))
