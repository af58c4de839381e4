"""The operator's write to the model catalog: register a model, or update it, with the
provenance of its signed manifest and, with a version, as a swap or a canary of it
(workers/serving/versions.py)."""

from __future__ import annotations

from django.db import transaction

from tenants.errors import InvalidRequest
from tenants.services import audit
from tenants.services.validation import save_validated
from workers.artifacts.load import artifact_provenance
from workers.models import ServedModel
from workers.serving.catalog import model_dir, model_source_check
from workers.serving.versions import version_add


def model_register(
    *,
    name: str,
    source: str,
    description: str = "",
    price_input_per_mtok: int = 0,
    price_output_per_mtok: int = 0,
    price_cached_per_mtok: int = 0,
    quantization: str = "",
    quantization_group_size: int = 128,
    speculative_method: str = "",
    speculative_tokens: int = 4,
    speculative_draft: str = "",
    speculative_draft_only: bool = False,
    runtime: str = str(ServedModel.Runtime.ENGINE),
    version: str = "",
    canary_weight: int | None = None,
    min_replicas: int | None = None,
    max_replicas: int | None = None,
) -> ServedModel:
    """Add a model to the registry, or update the one with that name, with the provenance of
    its signed manifest (refused if a worker would refuse to load it), its runtime (our engine
    or vLLM) and our engine's options: quantization at load (int8 / int4) and speculative
    decoding (ngram / draft; a draft model also gets prompt lookup, chosen per batch size,
    unless `speculative_draft_only`). With `version`, `source` is that version of the model: the one
    it serves from now on (a swap), or with `canary_weight` a canary taking that percentage of
    its requests (workers/serving/versions.py)."""
    model_source_check(source)
    if speculative_draft:
        model_source_check(speculative_draft, param="speculative_draft")
    if canary_weight is not None and not (version and 0 <= canary_weight <= 100):
        raise InvalidRequest(
            "A canary needs a version and a weight from 0 to 100.", param="canary_weight"
        )
    row = ServedModel.objects.filter(name=name).first() or ServedModel(name=name)
    earlier = (row.source, row.manifest_digest) if row.pk else None
    before = audit.snapshot(row) if row.pk else None
    if canary_weight is not None and row.pk is None:
        raise InvalidRequest(
            "A canary needs a primary version to share with; register one first.", param="version"
        )
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
    row.speculative_draft_only = speculative_draft_only
    row.runtime = runtime
    if min_replicas is not None:
        row.min_replicas = min_replicas
    if max_replicas is not None:
        row.max_replicas = max_replicas
    with transaction.atomic():
        row = save_validated(row, unique_param="name")
        audit.audit_change("model.register", row, before=before)
        if version:
            version_add(
                row=row,
                label=version,
                source=source,
                digest=provenance.get("manifest_digest", ""),
                canary_weight=canary_weight,
                earlier=earlier,
            )
            row.save()  # after its versions: the registry's snapshots are dropped on save
    return row
