"""Reads and writes of the model registry, and what the serving path needs to know about a
model without loading its weights: where it lives, its tokenizer, its context, its prices."""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

from tenants.errors import InvalidRequest
from tenants.models import Lane
from workers.artifacts.presets import preset_signed_dir
from workers.engine import (
    EngineConfig,
    EngineError,
    SpeculativeConfig,
    Tokenizer,
    checkpoint_context_length,
    engine_context_length,
)
from workers.engine.presets import PRESETS
from workers.models import ModelVersion, ServedModel

PRESET_PREFIX = "preset:"


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """A registry row, detached from the ORM so it can travel to a worker as JSON."""

    name: str
    source: str
    price_input_per_mtok: int = 0
    price_output_per_mtok: int = 0
    price_cached_per_mtok: int = 0
    # Engine options: "" = none.
    quantization: str = ""
    quantization_group_size: int = 128
    speculative_method: str = ""
    speculative_tokens: int = 4
    speculative_draft: str = ""
    speculative_draft_only: bool = False  # the draft model without prompt lookup beside it
    runtime: str = "engine"  # "engine" (ours) or "vllm" (a managed `vllm serve` child)
    # The version: its label ("" for a model without versions: its implicit one), and the
    # digest of its signed manifest (its system_fingerprint).
    version: str = ""
    digest: str = ""
    # A model's versions taking traffic (workers/serving/versions.py): (label, source, digest,
    # weight), the primary first; () in a job, which names one version.
    versions: tuple[tuple[str, str, str, int], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.versions, tuple):  # from JSON: lists
            object.__setattr__(self, "versions", tuple(tuple(v) for v in self.versions))

    @classmethod
    def of(cls, row: ServedModel) -> ModelInfo:
        versions = versions_split(row)
        return cls(
            name=row.name,
            source=row.source,
            version=versions[0][0] if versions else "",
            digest=row.manifest_digest,
            versions=versions,
            price_input_per_mtok=row.price_input_per_mtok,
            price_output_per_mtok=row.price_output_per_mtok,
            price_cached_per_mtok=row.price_cached_per_mtok,
            quantization=row.quantization,
            quantization_group_size=row.quantization_group_size,
            speculative_method=row.speculative_method,
            speculative_tokens=row.speculative_tokens,
            speculative_draft=row.speculative_draft,
            speculative_draft_only=row.speculative_draft_only,
            runtime=row.runtime,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def versions_split(row: ServedModel) -> tuple[tuple[str, str, str, int], ...]:
    """(label, source, manifest digest, weight) of the versions taking traffic, the primary
    first with what its canaries leave of 100; () for a model without versions."""
    live = [v for v in row.versions.all() if v.state != ModelVersion.State.RETIRED]
    canaries = sorted(
        (v for v in live if v.state == ModelVersion.State.CANARY), key=lambda v: v.label
    )
    primary = [v for v in live if v.state == ModelVersion.State.PRIMARY]
    rest = max(100 - sum(v.weight for v in canaries), 0)
    return tuple(
        (
            v.label,
            v.source,
            v.manifest_digest,
            rest if v.state == ModelVersion.State.PRIMARY else v.weight,
        )
        for v in primary + canaries
    )


def model_source_check(source: str, *, param: str = "source") -> None:
    if source.startswith(PRESET_PREFIX):
        preset = source.removeprefix(PRESET_PREFIX).split("@")[0]
        if preset not in PRESETS:
            raise InvalidRequest(
                f"Unknown preset {preset!r}; presets: {sorted(PRESETS)}.", param=param
            )
        return
    path = Path(source)
    if not path.is_absolute() or not (path / "config.json").exists():
        raise InvalidRequest(
            f"{param} must be preset:<name>[@seed] or an absolute path to a "
            "directory with config.json, *.safetensors and tokenizer.json.",
            param=param,
        )


def model_dir(source: str) -> Path:
    """The local directory of a model; presets are generated (from their seed) on first use."""
    if source.startswith(PRESET_PREFIX):
        preset, _, seed = source.removeprefix(PRESET_PREFIX).partition("@")
        return preset_signed_dir(preset, settings.FAIRLANE_MODEL_DIR, seed=int(seed or 0))
    return Path(source)


@functools.lru_cache(maxsize=32)
def _tokenizer_at(path: str) -> Tokenizer:
    return Tokenizer(path)


def model_tokenizer(info: ModelInfo) -> Tokenizer:
    return _tokenizer_at(str(model_dir(info.source)))


@functools.lru_cache(maxsize=32)
def _config_at(path: str) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((Path(path) / "config.json").read_text())
    return config


def model_context_length(info: ModelInfo) -> int:
    """The context the model is served with, as its engine decides it (the KV pool and
    FAIRLANE_MAX_MODEL_LEN included), so the API refuses what the engine would. vLLM is
    started with the checkpoint's context, capped by FAIRLANE_MAX_MODEL_LEN."""
    path = str(model_dir(info.source))
    if info.runtime == ServedModel.Runtime.VLLM:
        return _checkpoint_context_length(path, settings.FAIRLANE_MAX_MODEL_LEN)
    try:
        return _engine_context_length(model_engine_config(info))
    except (EngineError, ValueError, KeyError):
        # Its engine refuses to load it (a 503, or the next backend answers); until that is
        # fixed, requests are checked against the checkpoint's own context.
        return _checkpoint_context_length(path, settings.FAIRLANE_MAX_MODEL_LEN)


@functools.lru_cache(maxsize=32)
def _engine_context_length(config: EngineConfig) -> int:
    return engine_context_length(config)


def _checkpoint_context_length(path: str, cap: int | None) -> int:
    limit = checkpoint_context_length(_config_at(path))
    return min(limit, cap) if cap else limit


def model_vocab_size(info: ModelInfo) -> int:
    return int(_config_at(str(model_dir(info.source)))["vocab_size"])


def model_list_enabled() -> list[ModelInfo]:
    return [
        ModelInfo.of(row)
        for row in ServedModel.objects.filter(is_enabled=True).prefetch_related("versions")
    ]


def model_get(*, name: str) -> ModelInfo | None:
    row = ServedModel.objects.filter(name=name, is_enabled=True).first()
    return ModelInfo.of(row) if row else None


def model_engine_options(info: ModelInfo) -> dict[str, Any]:
    """EngineConfig keyword arguments for the model's quantization and speculation."""
    options: dict[str, Any] = {
        "quantization": info.quantization or None,
        "quantization_group_size": info.quantization_group_size,
    }
    if info.speculative_method:
        draft = str(model_dir(info.speculative_draft)) if info.speculative_draft else None
        options["speculative"] = SpeculativeConfig(
            info.speculative_method,
            num_speculative_tokens=info.speculative_tokens,
            model=draft,
            also_prompt_lookup=not info.speculative_draft_only,
        )
    return options


def model_engine_config(info: ModelInfo) -> EngineConfig:
    """How this process runs the model on our engine: what the host starts it with and what
    its published context is derived from."""
    return EngineConfig(
        model=str(model_dir(info.source)),
        device=settings.FAIRLANE_ENGINE_DEVICE,
        kv_cache_memory_bytes=settings.FAIRLANE_ENGINE_KV_CACHE_MB << 20,
        kv_cpu_tier_blocks=settings.FAIRLANE_ENGINE_KV_CPU_TIER_BLOCKS,
        max_num_seqs=settings.FAIRLANE_ENGINE_MAX_NUM_SEQS,
        max_model_len=settings.FAIRLANE_MAX_MODEL_LEN,
        num_threads=settings.FAIRLANE_ENGINE_THREADS,
        is_fair_preemption_enabled=settings.FAIRLANE_FAIR_EXTRA_SLOTS > 0,
        is_fair_step_share_enabled=settings.FAIRLANE_ENGINE_FAIR_STEP_SHARE,
        **model_engine_options(info),
        **bulk_yield(),
    )


def bulk_yield() -> dict[str, Any]:
    """The bulk lane gives way to interactive sequences (see
    FAIRLANE_ENGINE_BULK_SEQS_BESIDE_INTERACTIVE)."""
    beside = settings.FAIRLANE_ENGINE_BULK_SEQS_BESIDE_INTERACTIVE
    return {"yield_lanes": (Lane.BULK.value,), "yield_max_seqs": beside} if beside > 0 else {}


# Writing a prompt to a provider's cache costs more than reading the prompt: Anthropic's price
# for its (5-minute) cache writes is the input price times 5/4.
CACHE_WRITE_PRICE = (5, 4)


def usage_cost(
    info: ModelInfo,
    *,
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int = 0,
    cache_write_tokens: int = 0,
) -> int:
    """Micro-cents, rounded up: an estimate never undercharges what settlement will charge.
    `cache_write_tokens`: of the prompt's uncached tokens, those written to the cache."""
    uncached = max(prompt_tokens - cached_tokens, 0)
    writes = min(cache_write_tokens, uncached)
    times, per = CACHE_WRITE_PRICE
    total = (
        (uncached - writes) * info.price_input_per_mtok * per
        + writes * info.price_input_per_mtok * times
        + cached_tokens * info.price_cached_per_mtok * per
        + completion_tokens * info.price_output_per_mtok * per
    )
    return -(-total // (1_000_000 * per))
