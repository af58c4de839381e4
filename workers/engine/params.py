"""Per-request sampling parameters, validated where the user hands them in."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from workers.engine.errors import InvalidRequest

MAX_LOGPROBS = 20
GUIDES = (None, "json_object", "json_schema")
MAX_STOP_STRINGS = 16
MIN_SEED, MAX_SEED = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed takes
GREEDY_BELOW = 1e-5  # a temperature below this is greedy (vLLM's _SAMPLING_EPS)


@dataclass(slots=True, frozen=True)
class SamplingParams:
    """How to pick tokens for one request. ``temperature=0`` (below 1e-5) is greedy.

    ``top_k=0`` and ``top_p=1`` disable those filters. ``logprobs=None`` returns none, ``0`` the
    chosen token's log-probability, ``n`` also the ``n`` most likely tokens. Log-probabilities
    are those of the model's raw distribution (before temperature and filters), like vLLM.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    # OpenAI/vLLM penalties: presence and frequency count output tokens; repetition (like
    # transformers') divides positive / multiplies negative logits of tokens seen in prompt or
    # output.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # Added to a token's logit before sampling (OpenAI's logit_bias): {token_id: bias in [-100,
    # 100]}.
    logit_bias: tuple[tuple[int, float], ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None
    include_stop_str_in_output: bool = False
    # False skips detokenisation (token ids only); stop strings then cannot match.
    is_detokenized: bool = True
    # False opts this request out of speculative decoding (where its model speculates).
    is_speculative: bool = True
    # "json_object": only tokens that keep the output a JSON object; "json_schema": a document
    # of `guide_schema` (JSON text); guide.py, by llguidance. Such a request does not
    # speculate. `guide_prefix`: output it already has (a resumed request).
    guide: str | None = None
    guide_schema: str = ""
    guide_prefix: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", _as_tuple(self.stop, "stop"))
        object.__setattr__(self, "stop_token_ids", _as_tuple(self.stop_token_ids, "stop_token_ids"))
        object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias))
        _check_int(self.max_tokens, "max_tokens", low=1)
        _check_int(self.min_tokens, "min_tokens", low=0, high=self.max_tokens)
        _check_int(self.top_k, "top_k", low=-1)
        if not _is_number(self.temperature) or not 0.0 <= self.temperature <= 100.0:
            raise InvalidRequest("temperature must be a number in [0, 100]", param="temperature")
        if not _is_number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise InvalidRequest("top_p must be a number in (0, 1]", param="top_p")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_number(value) or not -2.0 <= value <= 2.0:
                raise InvalidRequest(f"{name} must be a number in [-2, 2]", param=name)
        if not _is_number(self.repetition_penalty) or not 0.0 < self.repetition_penalty <= 2.0:
            raise InvalidRequest(
                "repetition_penalty must be a number in (0, 2]", param="repetition_penalty"
            )
        if self.seed is not None:
            _check_int(self.seed, "seed", low=MIN_SEED, high=MAX_SEED)
        if self.logprobs is not None:
            _check_int(self.logprobs, "logprobs", low=0, high=MAX_LOGPROBS)
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidRequest(f"at most {MAX_STOP_STRINGS} stop strings", param="stop")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequest("stop strings must be non-empty strings", param="stop")
        for token_id in self.stop_token_ids:
            _check_int(token_id, "stop_token_ids", low=0)
        if self.guide not in GUIDES:
            raise InvalidRequest(f"guide must be one of {GUIDES}", param="response_format")
        object.__setattr__(self, "guide_prefix", _as_tuple(self.guide_prefix, "guide_prefix"))

    @property
    def is_greedy(self) -> bool:
        # Below vLLM's epsilon, dividing the logits by the temperature overflows float32.
        return self.temperature < GREEDY_BELOW

    @property
    def has_penalties(self) -> bool:
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
            or bool(self.logit_bias)
        )


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_int(value: object, param: str, *, low: int, high: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidRequest(f"{param} must be an integer", param=param)
    if value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise InvalidRequest(f"{param} must be {bounds}, got {value}", param=param)


def _as_tuple(value: object, param: str) -> tuple:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if param == "stop" else _bad(param)
    if isinstance(value, (list, tuple)):
        return tuple(value)
    return _bad(param)


def _bias_pairs(value: object) -> tuple[tuple[int, float], ...]:
    items = value.items() if isinstance(value, dict) else value
    not_a_map = "logit_bias must map token ids to numbers"
    if not isinstance(items, Iterable):
        raise InvalidRequest(not_a_map, param="logit_bias")
    try:
        pairs = tuple((token, bias) for token, bias in items)
    except (TypeError, ValueError):
        raise InvalidRequest(not_a_map, param="logit_bias") from None
    for token, bias in pairs:
        _check_int(token, "logit_bias", low=0)
        if not _is_number(bias) or not -100.0 <= bias <= 100.0:
            raise InvalidRequest(
                "logit_bias values must be numbers in [-100, 100]", param="logit_bias"
            )
    return pairs


def _bad(param: str) -> tuple:
    raise InvalidRequest(f"{param} must be a list", param=param)
