"""Seeded benchmark workloads: mixed lengths, and a shared system prompt with varied user turns."""

from __future__ import annotations

import random
from dataclasses import dataclass

# Byte tokens of the preset tokenizer (ids 5..260); specials are left out so prompts look like text.
_FIRST_BYTE_ID, _LAST_BYTE_ID = 5, 260


@dataclass(slots=True, frozen=True)
class Request:
    prompt: list[int]
    num_output_tokens: int


def mixed_workload(
    *, seed: int, num_requests: int, prompt_range: tuple[int, int], output_range: tuple[int, int]
) -> list[Request]:
    rng = random.Random(seed)
    return [
        Request(_tokens(rng, rng.randint(*prompt_range)), rng.randint(*output_range))
        for _ in range(num_requests)
    ]


def shared_prefix_workload(
    *,
    seed: int,
    num_requests: int,
    system_tokens: int,
    turn_range: tuple[int, int],
    num_output_tokens: int,
) -> list[Request]:
    """One tenant's agents: the same system prompt, then a different user turn each."""
    rng = random.Random(seed + 1)
    system = _tokens(rng, system_tokens)
    return [
        Request(system + _tokens(rng, rng.randint(*turn_range)), num_output_tokens)
        for _ in range(num_requests)
    ]


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randint(_FIRST_BYTE_ID, _LAST_BYTE_ID) for _ in range(n)]
