"""Configs: the model's shape (read from a Hugging Face config.json) and the engine's knobs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workers.engine.errors import UnsupportedModel

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(slots=True, frozen=True)
class ModelConfig:
    """The architecture of a LLaMA-family decoder, as its config.json describes it."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_type: str = "default"
    # Extra keys of the RoPE variant (factor, low_freq_factor...), as a sorted tuple of pairs.
    rope_scaling: tuple[tuple[str, Any], ...] = ()
    tie_word_embeddings: bool = False
    model_type: str = "llama"
    torch_dtype: str = "float32"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModel(f"model_type {self.model_type!r} is not a LLaMA-family decoder")
        if self.rope_type not in SUPPORTED_ROPE_TYPES:
            raise UnsupportedModel(f"rope_type {self.rope_type!r} is not supported")
        if self.num_attention_heads % self.num_key_value_heads:
            raise UnsupportedModel("num_attention_heads must be a multiple of num_key_value_heads")

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def context_length(self) -> int:
        """The longest sequence the checkpoint allows: its positions, capped by its sliding
        window where its attention uses one (the engine attends fully, never beyond it)."""
        return _context_length(self.max_position_embeddings, self.sliding_window)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        num_heads = raw["num_attention_heads"]
        rope = _rope_parameters(raw)
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        return cls(
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=num_heads,
            num_key_value_heads=raw.get("num_key_value_heads") or num_heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // num_heads,
            max_position_embeddings=_max_positions(raw),
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope.pop("rope_theta", 10000.0)),
            rope_type=rope.pop("rope_type", "default"),
            rope_scaling=tuple(sorted(rope.items())),
            tie_word_embeddings=raw.get("tie_word_embeddings", False),
            model_type=raw.get("model_type", "llama"),
            torch_dtype=raw.get("torch_dtype") or raw.get("dtype") or "float32",
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=eos_ids,
            sliding_window=_sliding_window(raw),
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> ModelConfig:
        return cls.from_dict(json.loads((Path(path) / "config.json").read_text()))


def checkpoint_context_length(raw: dict[str, Any]) -> int:
    """``ModelConfig.context_length`` of a config.json of any architecture (vLLM serves more
    than the engine's)."""
    return _context_length(_max_positions(raw), _sliding_window(raw))


def _context_length(max_positions: int, sliding_window: int | None) -> int:
    return min(max_positions, sliding_window) if sliding_window else max_positions


def _max_positions(raw: dict[str, Any]) -> int:
    return raw.get("max_position_embeddings", 2048)


def _sliding_window(raw: dict[str, Any]) -> int | None:
    """Qwen2's configs name a window that their attention does not use (use_sliding_window)."""
    return raw.get("sliding_window") if raw.get("use_sliding_window", True) else None


def _rope_parameters(raw: dict[str, Any]) -> dict[str, Any]:
    """Normalise transformers 5's ``rope_parameters`` and the older
    ``rope_theta``/``rope_scaling``."""
    params = dict(raw.get("rope_parameters") or {})
    if not params:
        params = dict(raw.get("rope_scaling") or {})
        if "rope_theta" in raw:
            params["rope_theta"] = raw["rope_theta"]
    if "type" in params and "rope_type" not in params:
        params["rope_type"] = params.pop("type")
    params.pop("type", None)
    params.setdefault("rope_type", "default")
    return params


SPEC_METHODS = ("ngram", "draft")


@dataclass(slots=True, frozen=True)
class SpeculativeConfig:
    """``method="ngram"``: prompt lookup, no draft model. ``"draft"``: ``model`` is a directory
    with the target's tokenizer.

    Who speculates (see ``spec/speculator.py``): with ``is_adaptive`` (the default) a sequence
    drafts when, by the engine's measured step costs at the current batch size and the
    request's smoothed acceptance rate, a step with drafts yields more tokens per second than
    one without; two steps out of every ``explore_interval`` of a batch size do the opposite,
    to keep the estimates fresh (the interval doubles, up to 8 times, while each exploration
    confirms the rule's verdict). ``is_adaptive=False``: every eligible sequence drafts
    (forced). Either way two optional hard rules apply on top: no speculation while more than
    ``disable_by_batch_size`` sequences run (None: no cap, the cost rule alone decides), and a
    request whose acceptance rate falls below ``min_acceptance_rate`` (0.0: never) pauses for
    ``pause_steps`` steps. A seeded sampled request speculates by config alone: none of these
    rules apply to it.

    ``also_prompt_lookup`` (the draft method, adaptive): prompt lookup is a second method, and
    each batch size's steps go to whichever of the two predicts more tokens per second from
    its measured step costs and what its recent tries yielded (``spec/choice.py``). Its n-gram
    sizes are ``prompt_lookup_min`` and ``prompt_lookup_max``."""

    method: str
    num_speculative_tokens: int = 4
    model: str | None = None
    prompt_lookup_min: int = 3
    prompt_lookup_max: int = 12
    is_adaptive: bool = True
    explore_interval: int = 64
    disable_by_batch_size: int | None = None
    min_acceptance_rate: float = 0.0
    pause_steps: int = 32
    also_prompt_lookup: bool = True

    def __post_init__(self) -> None:
        if self.method not in SPEC_METHODS:
            raise ValueError(
                f"speculative method must be one of {SPEC_METHODS}, got {self.method!r}"
            )
        if not 1 <= self.num_speculative_tokens <= 16:
            raise ValueError("num_speculative_tokens must be in [1, 16]")
        if self.method == "draft" and not self.model:
            raise ValueError("the draft method needs a draft model directory")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError("need 1 <= prompt_lookup_min <= prompt_lookup_max")
        if self.explore_interval < 4:
            raise ValueError("explore_interval must be at least 4")
        if self.disable_by_batch_size is not None and self.disable_by_batch_size < 1:
            raise ValueError("disable_by_batch_size must be at least 1 (or None: never)")
        if not 0.0 <= self.min_acceptance_rate <= 1.0:
            raise ValueError("min_acceptance_rate must be in [0, 1]")
        if self.pause_steps < 0:
            raise ValueError("pause_steps must be >= 0")

    @property
    def draft_model(self) -> str:
        """The draft model's directory (the ``draft`` method's; ``__post_init__`` requires it)."""
        if not self.model:
            raise ValueError("the draft method needs a draft model directory")
        return self.model


QUANTIZATIONS = ("int8", "int4")
QUANT_GROUP_SIZES = (32, 64, 128)


@dataclass(slots=True, frozen=True)
class EngineConfig:
    """How the engine runs a model: where, how much KV memory, how big a step may be."""

    model: str
    device: str = "cpu"
    # "auto": float32 on CPU, the checkpoint's dtype (bf16/fp16) on CUDA.
    dtype: str = "auto"
    block_size: int = 16
    # KV pool size in blocks; None sizes it from kv_cache_memory_bytes.
    num_kv_blocks: int | None = None
    kv_cache_memory_bytes: int = 1 << 30
    # CPU tier: blocks of host memory (pinned on CUDA) that keep KV blocks evicted from the
    # pool's prefix cache or freed by a preemption, copied back instead of recomputed (0: off).
    kv_cpu_tier_blocks: int = 0
    max_num_seqs: int = 64
    # Token budget of one step (prefill chunks + decodes together).
    max_num_batched_tokens: int = 1024
    # None: the checkpoint's max_position_embeddings (capped by a sliding window, if any).
    max_model_len: int | None = None
    is_prefix_caching_enabled: bool = True
    is_chunked_prefill_enabled: bool = True
    # Fraction of the pool kept free when admitting new sequences, so running ones can grow.
    watermark: float = 0.01
    # Lanes that give way (e.g. a batch's bulk lane): while a sequence of another lane runs or
    # waits, at most yield_max_seqs of theirs run in a step (the rest keep their KV blocks and
    # wait for the next step). Empty: every running sequence runs every step.
    yield_lanes: tuple[str, ...] = ()
    yield_max_seqs: int = 1
    # Fairness inside the batch: when every sequence slot is taken and a waiting sequence's
    # tenant runs fewer than its weighted share of the slots, the running sequence of the
    # tenant furthest over its share (the highest virtual token counter) is preempted for it
    # (its KV blocks kept by the prefix cache or the CPU tier where they can be).
    is_fair_preemption_enabled: bool = False
    # With fair preemption: while a tenant runs fewer sequences than its share, each tenant over
    # its share runs at most its share (rounded up) of them in a step; the rest keep their KV
    # blocks and sit the step out. Where a step's cost grows with its sequences (the CPU), the
    # tenant under its share then decodes in smaller, faster steps.
    is_fair_step_share_enabled: bool = False
    seed: int = 0
    # torch intra-op threads; None leaves the process setting alone.
    num_threads: int | None = None
    # Decode attention groups sequences of similar length; a group stops growing once padding
    # would exceed this fraction of the keys it reads.
    max_group_padding: float = 0.15
    # Speculative decoding (None: off).
    speculative: SpeculativeConfig | None = None
    # Weight-only quantization of the decoder's linear layers at load: None, "int8" (per output
    # channel) or "int4" (group-wise, quantization_group_size input columns per scale).
    quantization: str | None = None
    quantization_group_size: int = 128
    # CPU float32: run the decoder's linear layers on oneDNN with prepacked weights (see
    # model/packed.py); False keeps them on torch's default (MKL) path.
    is_weight_prepacking_enabled: bool = True

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError("block_size must be a power of two")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 2:
            raise ValueError("num_kv_blocks must be at least 2")
        if self.kv_cpu_tier_blocks < 0:
            raise ValueError("kv_cpu_tier_blocks must be >= 0 (0: no CPU tier)")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be at least 1")
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be at least 1")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError("watermark must be in [0, 1)")
        if self.yield_max_seqs < 1:  # 0 could stall them behind a foreground that waits
            raise ValueError("yield_max_seqs must be at least 1")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"unknown dtype {self.dtype!r}")
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise ValueError(
                f"quantization must be one of {QUANTIZATIONS} or None, got {self.quantization!r}"
            )
        if self.quantization_group_size not in QUANT_GROUP_SIZES:
            raise ValueError(f"quantization_group_size must be one of {QUANT_GROUP_SIZES}")
