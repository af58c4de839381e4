"""What the engine hands back: per-step deltas and finished completions."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(slots=True)
class RequestOutput:
    """What one step added to one request (a delta), and whether it is now finished."""

    request_id: str
    new_token_ids: list[int]
    new_text: str = ""
    new_logprobs: list[float] | None = None
    new_top_logprobs: list[dict[int, float]] | None = None
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    # Final-norm hidden state of the position each new token was sampled from: [n, hidden].
    hidden_states: torch.Tensor | None = None
    # Embedding requests only: the pooled final hidden state of the prompt, [hidden].
    embedding: torch.Tensor | None = None


@dataclass(slots=True)
class Completion:
    """A finished request, as the blocking ``generate`` returns it."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    stop_reason: str | int | None = None
    logprobs: list[float] | None = None
    top_logprobs: list[dict[int, float]] | None = None
    num_cached_tokens: int = 0
    hidden_states: torch.Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)
