"""Helpers for the guided-decoding tests: run bytes or token ids through a fresh guide, and
walk a guide at random over the tiny presets' byte-level vocabulary."""

from __future__ import annotations

import json
import random

from workers.engine import SamplingParams
from workers.engine.guide import Guide, guide_start
from workers.engine.tokenizer import Tokenizer


def guide_for(tokenizer: Tokenizer, schema: dict | None = None) -> Guide:
    """JSON mode's guide, or a schema's."""
    params = (
        SamplingParams(guide="json_object")
        if schema is None
        else SamplingParams(guide="json_schema", guide_schema=json.dumps(schema))
    )
    return guide_start(tokenizer, (tokenizer.eos_token_id,), params)


def byte_ids(tokenizer: Tokenizer, data: bytes) -> list[int]:
    """The presets' one token per byte."""
    table = tokenizer.token_bytes_table()
    by_byte = {piece[0]: token_id for token_id, piece in enumerate(table) if len(piece) == 1}
    return [by_byte[b] for b in data]


def follows(guide: Guide, token_ids: list[int]) -> bool:
    """Whether each token was allowed when it came (the guide advanced over them)."""
    for token_id in token_ids:
        if not guide.allowed()[token_id]:
            return False
        guide.advance(token_id)
    return True


def accepts(tokenizer: Tokenizer, data: bytes, schema: dict | None = None) -> bool:
    """`data` whole: every token allowed, then EOS."""
    guide = guide_for(tokenizer, schema)
    return follows(guide, byte_ids(tokenizer, data)) and bool(
        guide.allowed()[tokenizer.eos_token_id]
    )


def random_walk(
    tokenizer: Tokenizer, guide: Guide, seed: int, *, closing: set[bytes], max_steps: int = 3000
) -> bytes:
    """Pick allowed tokens at random (a closing one more often) until the guide allows only
    EOS, or allows it and a coin says stop; the bytes written."""
    table, eos = tokenizer.token_bytes_table(), tokenizer.eos_token_id
    rng, out = random.Random(seed), b""
    for _ in range(max_steps):
        allowed = guide.allowed().nonzero().flatten().tolist()
        assert allowed, out
        if allowed == [eos] or eos in allowed and rng.random() < 0.5:
            return out
        choices = [t for t in allowed if t != eos]
        preferred = [t for t in choices if table[t] in closing]
        token = rng.choice(preferred if preferred and rng.random() < 0.6 else choices)
        guide.advance(token)
        out += table[token]
    raise AssertionError(f"no end in {max_steps} steps: {out!r}")
