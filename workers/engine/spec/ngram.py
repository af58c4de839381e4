"""Prompt lookup: propose what followed the most recent earlier occurrence of the context's
longest suffix (``max_n`` down to ``min_n`` tokens), up to ``k`` tokens. No draft model."""

from __future__ import annotations

from array import array

from workers.engine.sequence import Sequence

_WIDTH = 4  # bytes per token id in the search buffer


def ngram_propose(tokens: list[int], *, k: int, min_n: int, max_n: int) -> list[int]:
    num_tokens = len(tokens)
    if k <= 0 or num_tokens <= min_n:
        return []
    data = array("i", tokens).tobytes()
    for n in range(min(max_n, num_tokens - 1), min_n - 1, -1):
        pattern = data[(num_tokens - n) * _WIDTH :]
        # An earlier occurrence must end before the suffix's own last token.
        end = (num_tokens - 1) * _WIDTH
        pos = data.rfind(pattern, 0, end)
        while pos > 0 and pos % _WIDTH:  # a match straddling token boundaries: look further back
            pos = data.rfind(pattern, 0, pos + len(pattern) - 1)
        if pos >= 0 and pos % _WIDTH == 0:
            start = pos // _WIDTH + n
            return tokens[start : start + k]
    return []


class NgramProposer:
    """Proposals are made while scheduling (they decide how many slots to reserve)."""

    def __init__(self, *, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n

    def lookahead(self, seq: Sequence, k: int) -> int:
        seq.spec_token_ids = ngram_propose(seq.token_ids, k=k, min_n=self.min_n, max_n=self.max_n)
        return len(seq.spec_token_ids)

    def propose(self, seqs: list[Sequence], ks: list[int]) -> None:
        for seq, k in zip(seqs, ks, strict=False):
            seq.spec_token_ids = seq.spec_token_ids[:k]
            seq.spec_draft_probs = None

    def extra_kv_bytes_per_block(self) -> int:
        return 0
