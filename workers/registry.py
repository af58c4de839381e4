"""Reads and writes of the model registry, and what the serving path needs to know about a
model without loading its weights: where it lives, its tokenizer, its context, its prices."""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from django.conf import settings

from tenants.errors import InvalidRequest
from tenants.services.validation import save_validated
from workers.artifacts.load import artifact_provenance
from workers.artifacts.presets import preset_signed_dir
from workers.engine import (EngineConfig, EngineError, SpeculativeConfig, Tokenizer,
                            checkpoint_context_length, engine_context_length)
from workers.engine.presets import PRESETS
from workers.models import ServedModel

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
    runtime: str = "engine"  # "engine" (ours) or "vllm" (a managed `vllm serve` child)
    # The version: its label ("" for a model without versions: its implicit one), and the
    # digest of its signed manifest (its system_fingerprint).
    version: str = ""
    digest: str = ""
    # A model's versions taking traffic (workers/versions.py): (label, source, digest,
    # weight), the primary first; () in a job, which names one version.
    versions: tuple[tuple[str, str, str, int], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.versions, tuple):  # from JSON: lists
            object.__setattr__(self, "versions", tuple(tuple(v) for v in self.versions))

    @classmethod
    def of(cls, row: ServedModel) -> ModelInfo:
        from workers.versions import versions_split

        versions = versions_split(row)
        return cls(name=row.name, source=row.source,
                   version=versions[0][0] if versions else "", digest=row.manifest_digest,
                   versions=versions,
                   price_input_per_mtok=row.price_input_per_mtok,
                   price_output_per_mtok=row.price_output_per_mtok,
                   price_cached_per_mtok=row.price_cached_per_mtok,
                   quantization=row.quantization, quantization_group_size=row.quantization_group_size,
                   speculative_method=row.speculative_method, speculative_tokens=row.speculative_tokens,
                   speculative_draft=row.speculative_draft, runtime=row.runtime)

    def to_dict(self) -> dict:
        return asdict(self)


def model_source_check(source: str, *, param: str = "source") -> None:
    if source.startswith(PRESET_PREFIX):
        preset = source.removeprefix(PRESET_PREFIX).split("@")[0]
        if preset not in PRESETS:
            raise InvalidRequest(f"Unknown preset {preset!r}; presets: {sorted(PRESETS)}.",
                                 param=param)
        return
    path = Path(source)
    if not path.is_absolute() or not (path / "config.json").exists():
        raise InvalidRequest(f"{param} must be preset:<name>[@seed] or an absolute path to a "
                             "directory with config.json, *.safetensors and tokenizer.json.",
                             param=param)


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
def _config_at(path: str) -> dict:
    return json.loads((Path(path) / "config.json").read_text())


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
    return _config_at(str(model_dir(info.source)))["vocab_size"]


def model_list_enabled() -> list[ModelInfo]:
    return [ModelInfo.of(row) for row in
            ServedModel.objects.filter(is_enabled=True).prefetch_related("versions")]


def model_get(*, name: str) -> ModelInfo | None:
    row = ServedModel.objects.filter(name=name, is_enabled=True).first()
    return ModelInfo.of(row) if row else None


def model_register(*, name: str, source: str, description: str = "",
                   price_input_per_mtok: int = 0, price_output_per_mtok: int = 0,
                   price_cached_per_mtok: int = 0, quantization: str = "",
                   quantization_group_size: int = 128, speculative_method: str = "",
                   speculative_tokens: int = 4, speculative_draft: str = "",
                   runtime: str = ServedModel.Runtime.ENGINE, version: str = "",
                   canary_weight: int | None = None, min_replicas: int | None = None,
                   max_replicas: int | None = None) -> ServedModel:
    """Add a model to the registry, or update the one with that name, with the provenance of
    its signed manifest (refused if a worker would refuse to load it), its runtime (our engine
    or vLLM) and our engine's options: quantization at load (int8 / int4) and speculative
    decoding (ngram / draft). With `version`, `source` is that version of the model: the one
    it serves from now on (a swap), or with `canary_weight` a canary taking that percentage of
    its requests (workers/versions.py)."""
    from django.db import transaction

    from workers.versions import version_add

    model_source_check(source)
    if speculative_draft:
        model_source_check(speculative_draft, param="speculative_draft")
    if canary_weight is not None and not (version and 0 <= canary_weight <= 100):
        raise InvalidRequest("A canary needs a version and a weight from 0 to 100.",
                             param="canary_weight")
    row = ServedModel.objects.filter(name=name).first() or ServedModel(name=name)
    earlier = (row.source, row.manifest_digest) if row.pk else None
    if canary_weight is not None and row.pk is None:
        raise InvalidRequest("A canary needs a primary version to share with; register one "
                             "first.", param="version")
    if not version and row.pk and row.source != source and row.versions.exists():
        raise InvalidRequest(f"{name} has versions: name the new one (version).", param="version")
    provenance = artifact_provenance(path=model_dir(source))
    if canary_weight is None:  # a canary leaves the model's own source to its primary
        row.source = source
        for field, value in provenance.items():
            setattr(row, field, value)
    row.description = description
    row.price_input_per_mtok = price_input_per_mtok
    row.price_output_per_mtok = price_output_per_mtok
    row.price_cached_per_mtok = price_cached_per_mtok
    row.quantization, row.quantization_group_size = quantization, quantization_group_size
    row.speculative_method, row.speculative_tokens = speculative_method, speculative_tokens
    row.speculative_draft = speculative_draft
    row.runtime = runtime
    if min_replicas is not None:
        row.min_replicas = min_replicas
    if max_replicas is not None:
        row.max_replicas = max_replicas
    with transaction.atomic():
        row = save_validated(row, unique_param="name")
        if version:
            version_add(row=row, label=version, source=source,
                        digest=provenance.get("manifest_digest", ""),
                        canary_weight=canary_weight, earlier=earlier)
            row.save()  # after its versions: the registry's snapshots are dropped on save
    return row


def model_engine_options(info: ModelInfo) -> dict:
    """EngineConfig keyword arguments for the model's quantization and speculation."""
    options: dict = {"quantization": info.quantization or None,
                     "quantization_group_size": info.quantization_group_size}
    if info.speculative_method:
        draft = str(model_dir(info.speculative_draft)) if info.speculative_draft else None
        options["speculative"] = SpeculativeConfig(info.speculative_method, num_speculative_tokens=info.speculative_tokens,
                                                   model=draft)
    return options


def model_engine_config(info: ModelInfo) -> EngineConfig:
    """How this process runs the model on our engine: what the host starts it with and what
    its published context is derived from."""
    return EngineConfig(
        model=str(model_dir(info.source)),
        device=settings.FAIRLANE_ENGINE_DEVICE,
        kv_cache_memory_bytes=settings.FAIRLANE_ENGINE_KV_CACHE_MB << 20,
        max_num_seqs=settings.FAIRLANE_ENGINE_MAX_NUM_SEQS,
        max_model_len=settings.FAIRLANE_MAX_MODEL_LEN,
        num_threads=settings.FAIRLANE_ENGINE_THREADS,
        **model_engine_options(info),
    )


def usage_cost(info: ModelInfo, *, prompt_tokens: int, completion_tokens: int,
               cached_tokens: int = 0) -> int:
    """Micro-cents, rounded up: an estimate never undercharges what settlement will charge."""
    uncached = max(prompt_tokens - cached_tokens, 0)
    total = (uncached * info.price_input_per_mtok + cached_tokens * info.price_cached_per_mtok
             + completion_tokens * info.price_output_per_mtok)
    return -(-total // 1_000_000)
