"""Checks a request at the engine's edge: everything a caller can get wrong raises
InvalidRequest."""

from __future__ import annotations

from collections.abc import Sequence as SequenceABC

from workers.engine.errors import ContextLengthExceeded, InvalidRequest
from workers.engine.params import SamplingParams
from workers.engine.tokenizer import Tokenizer

POOLINGS = ("mean", "last")


def prompt_token_ids(prompt: object, tokenizer: Tokenizer | None, *, vocab_size: int) -> list[int]:
    """Tokenise a text prompt, or check a list of token ids."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise InvalidRequest("this model has no tokenizer; send token ids", param="prompt")
        ids = tokenizer.encode(prompt) if prompt else []
    elif isinstance(prompt, SequenceABC) and not isinstance(prompt, (bytes, bytearray)):
        ids = list(prompt)
        if any(
            not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab_size for t in ids
        ):
            raise InvalidRequest(
                f"prompt token ids must be integers in [0, {vocab_size})", param="prompt"
            )
    else:
        raise InvalidRequest("prompt must be a string or a list of token ids", param="prompt")
    if not ids:
        raise InvalidRequest("prompt is empty", param="prompt")
    return ids


def request_check(
    ids: list[int],
    params: SamplingParams | None,
    *,
    max_model_len: int,
    vocab_size: int,
    lane: object,
    lanes: dict[str, int] | None,
    tenant: object,
) -> None:
    """Context length, stop token ids, tenant and lane (one of ``lanes`` where the policy names
    some, or None); ``params=None`` for embedding requests."""
    num_output = params.max_tokens if params is not None else 0
    if len(ids) > max_model_len or (params is not None and len(ids) >= max_model_len):
        raise ContextLengthExceeded(
            f"prompt has {len(ids)} tokens; this model's context is {max_model_len}", param="prompt"
        )
    if len(ids) + num_output > max_model_len:
        raise ContextLengthExceeded(
            f"this model's context is {max_model_len} tokens; the request asks for"
            f" {len(ids) + num_output}"
            f" ({len(ids)} prompt + {num_output} max_tokens)",
            param="max_tokens",
        )
    if params is not None and any(t >= vocab_size for t in params.stop_token_ids):
        raise InvalidRequest(
            f"stop_token_ids must be below the vocabulary size {vocab_size}", param="stop_token_ids"
        )
    if params is not None and any(t >= vocab_size for t, _ in params.logit_bias):
        raise InvalidRequest(
            f"logit_bias token ids must be below the vocabulary size {vocab_size}",
            param="logit_bias",
        )
    if not isinstance(tenant, str) or not tenant:
        raise InvalidRequest("tenant must be a non-empty string", param="tenant")
    if lane is not None and not isinstance(lane, str):
        raise InvalidRequest("lane must be a string", param="lane")
    if lane is not None and lanes and lane not in lanes:
        raise InvalidRequest(f"lane must be one of {list(lanes)}", param="lane")
