"""Verification: which draft tokens the target accepts, and the token that follows them.

Greedy rows accept while the draft equals the target's argmax. Sampled rows use the exact rule
of speculative sampling (Leviathan et al., Chen et al.): accept draft ``d`` with probability
``min(1, p(d) / q(d))``; at the first rejection draw from ``normalize(max(0, p - q))`` and stop;
when all k are accepted, draw a bonus token from the target's next distribution. ``p`` is the
target's distribution after temperature/top-k/top-p, ``q`` the draft's under the same rule (a
point mass on ``d`` for prompt lookup). The emitted tokens then follow ``p`` exactly.
"""

from __future__ import annotations

import itertools

import torch

from workers.engine.sampler import inverse_cdf, processed_probs, uniform
from workers.engine.sequence import Sequence


def verify(seqs: list[Sequence], logits: torch.Tensor, shared: torch.Generator) -> list[list[int]]:
    """Emitted tokens per sequence (accepted drafts, then one more), from the target's logits at
    each sequence's k + 1 positions, stacked in order: [sum(k + 1), vocab]."""
    logits = logits.float().cpu()
    argmax = logits.argmax(dim=-1).tolist()
    starts = [0, *itertools.accumulate(len(s.spec_token_ids) + 1 for s in seqs)]
    sampled = [i for i, s in enumerate(seqs) if not s.params.is_greedy]
    probs: dict[int, torch.Tensor] = {}
    if sampled:  # every sampled row's distribution in one batched call
        rows = [r for i in sampled for r in range(starts[i], starts[i + 1])]
        p = processed_probs(
            logits[rows], [seqs[i].params for i in sampled for _ in range(starts[i], starts[i + 1])]
        )
        offsets = [0, *itertools.accumulate(starts[i + 1] - starts[i] for i in sampled)]
        probs = {i: p[offsets[j] : offsets[j + 1]] for j, i in enumerate(sampled)}
    emitted = []
    for i, seq in enumerate(seqs):
        if i in probs:
            emitted.append(_sampled(seq, probs[i], shared))
        else:
            emitted.append(_greedy(seq.spec_token_ids, argmax[starts[i] : starts[i + 1]]))
    return emitted


def _greedy(drafts: list[int], target: list[int]) -> list[int]:
    for i, token in enumerate(drafts):
        if token != target[i]:
            return [*drafts[:i], target[i]]
    return [*drafts, target[len(drafts)]]


def _sampled(seq: Sequence, p: torch.Tensor, shared: torch.Generator) -> list[int]:
    drafts, q = seq.spec_token_ids, seq.spec_draft_probs  # q: [k, vocab], or None (a point mass)
    for i, token in enumerate(drafts):
        q_token = 1.0 if q is None else float(q[i, token])
        if uniform(seq, shared) * q_token < float(p[i, token]):
            continue
        if q is None:
            residual = p[i].clone()
            residual[token] = 0.0
        else:
            residual = (p[i] - q[i]).clamp_(min=0.0)
        if not float(residual.sum()) > 0.0:  # p == q up to rounding: rejection had probability ~0
            residual = p[i]
        return [*drafts[:i], inverse_cdf(residual, uniform(seq, shared))]
    return [*drafts, inverse_cdf(p[len(drafts)], uniform(seq, shared))]
