"""Verification: which draft tokens the target accepts, and the token that follows them.

Greedy rows accept while the draft equals the target's argmax. Sampled rows use the exact rule
of speculative sampling (Leviathan et al., Chen et al.): accept draft ``d`` with probability
``min(1, p(d) / q(d))``; at the first rejection draw from ``normalize(max(0, p - q))`` and stop;
when all k are accepted, draw a bonus token from the target's next distribution. ``p`` is the
target's distribution after temperature/top-k/top-p, ``q`` the draft's under the same rule (a
point mass on ``d`` for prompt lookup). The emitted tokens then follow ``p`` exactly.
"""

from __future__ import annotations

import torch

from workers.engine.sampler import inverse_cdf, processed_probs, uniform
from workers.engine.sequence import Sequence


def verify(seqs: list[Sequence], logits: torch.Tensor, shared: torch.Generator) -> list[list[int]]:
    """Emitted tokens per sequence (accepted drafts, then one more), from the target's logits at
    each sequence's k + 1 positions, stacked in order: [sum(k + 1), vocab]."""
    logits = logits.float().cpu()
    argmax = logits.argmax(dim=-1).tolist()
    emitted, row = [], 0
    for seq in seqs:
        k = len(seq.spec_token_ids)
        if seq.params.is_greedy:
            emitted.append(_greedy(seq.spec_token_ids, argmax[row : row + k + 1]))
        else:
            p = processed_probs(logits[row : row + k + 1], [seq.params] * (k + 1))
            emitted.append(_sampled(seq, p, shared))
        row += k + 1
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
