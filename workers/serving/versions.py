"""Versions of a served model: which one a request goes to (the canary split, sticky per
conversation), what a response and the ledger call it, and the operator's moves: add a version
(a swap, or a canary with a weight), promote a canary, roll back.

A model without versions is served from its own `source` (its implicit version), as before.
Pointing the name at another version changes the registry only; the GPU workers see it in the
registry on their next heartbeat, load the new version, and drop the old one once the requests
on it have finished (workers/host.py)."""

from __future__ import annotations

import dataclasses
import hashlib
import random
from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from tenants.errors import InvalidRequest, NotFound
from tenants.services import audit
from workers.artifacts.load import artifact_provenance
from workers.models import ModelVersion, ServedModel
from workers.serving.catalog import ModelInfo, model_dir

PRIMARY, CANARY, RETIRED = (
    ModelVersion.State.PRIMARY,
    ModelVersion.State.CANARY,
    ModelVersion.State.RETIRED,
)
INITIAL_LABEL = "initial"  # the directory a model was served from before its first version


def versions_of(info: ModelInfo) -> list[ModelInfo]:
    """The concrete versions of a model (ModelInfo) a worker hosting it loads, primary first."""
    if not info.versions:
        return [info]
    return [
        dataclasses.replace(info, source=source, version=label, digest=digest, versions=())
        for label, source, digest, _ in info.versions
    ]


def version_choose(info: ModelInfo, *, key: str = "") -> ModelInfo:
    """The version (a ModelInfo) that serves one request: by the weights, the same one for the
    same `key` (a conversation's beginning) while the weights stand, else at random."""
    hosted = versions_of(info)
    if len(hosted) == 1:
        return hosted[0]
    weights = [weight for *_, weight in info.versions]
    total = sum(weights)
    if total <= 0:
        return hosted[0]
    if key:
        digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
        point = int.from_bytes(digest, "big") / 2**64 * total
    else:
        point = random.random() * total
    for version, weight in zip(hosted, weights, strict=False):
        if point < weight:
            return version
        point -= weight
    return hosted[-1]


def version_tag(model: dict[str, Any]) -> str:
    """What the ledger and the x-fairlane-model-version header call the version that answered
    (a job's model dict): its label, else the fingerprint of its manifest; "" for backends
    other than ours."""
    if str(model.get("source", "")).startswith("backend:"):
        return ""
    return model.get("version") or version_fingerprint(model) or ""


def version_fingerprint(model: dict[str, Any]) -> str | None:
    """OpenAI's `system_fingerprint` for our engines: fp_ and the manifest digest's first 10
    hex digits (the label where there is no manifest); None for other backends."""
    if str(model.get("source", "")).startswith("backend:"):
        return None
    digest = str(model.get("digest") or "").rpartition(":")[2]
    if digest:
        return "fp_" + digest[:10]
    return f"fp_{model['version']}" if model.get("version") else None


# -- the operator's moves ---------------------------------------------------------------------


def version_add(
    *,
    row: ServedModel,
    label: str,
    source: str,
    digest: str,
    canary_weight: int | None,
    earlier: tuple[str, str] | None,
) -> ModelVersion:
    """Add (or update) a version of a saved model: the primary (a swap: the old primary and
    any canary are retired) or, with `canary_weight`, a canary taking that share. `earlier`:
    the model's source and digest before, kept as version "initial" when it had no versions
    (so a rollback can go back to it)."""
    with transaction.atomic():
        ServedModel.objects.select_for_update().filter(pk=row.pk).first()
        versions = row.versions
        if earlier and not versions.exists() and earlier[0] != source:
            is_kept = canary_weight is not None  # it stays the primary beside the canary
            ModelVersion.objects.create(
                served_model=row,
                label=INITIAL_LABEL,
                source=earlier[0],
                manifest_digest=earlier[1],
                state=PRIMARY if is_kept else RETIRED,
                primary_until=None if is_kept else timezone.now(),
            )
        if canary_weight is not None and not versions.filter(state=PRIMARY).exists():
            raise InvalidRequest(
                "A canary needs a primary version to share with; register one first.",
                param="version",
            )
        version = versions.filter(label=label).first() or ModelVersion(
            served_model=row, label=label
        )
        if version.state == PRIMARY and canary_weight is not None:
            raise InvalidRequest(f"{label} is the primary version.", param="version")
        before = audit.snapshot(version) if version.pk else None
        version.source, version.manifest_digest = source, digest
        if canary_weight is None:
            _retire(versions.exclude(label=label))
            version.state, version.weight = PRIMARY, 0
        else:
            version.state, version.weight = CANARY, canary_weight
        version.full_clean(validate_constraints=False)
        version.save()
        audit.audit_change("modelversion.add", version, before=before)
        return version


def _retire(versions: QuerySet[ModelVersion]) -> None:
    """Retire versions (a queryset); a primary among them remembers when it stopped being one."""
    now = timezone.now()
    versions.filter(state=PRIMARY).update(state=RETIRED, weight=0, primary_until=now)
    versions.exclude(state=RETIRED).update(state=RETIRED, weight=0)


def _model_locked(name: str) -> ServedModel:
    row = ServedModel.objects.select_for_update().filter(name=name).first()
    if row is None:
        raise NotFound(f"No served model named {name!r}.")
    return row


def _primary_set(row: ServedModel, version: ModelVersion) -> None:
    """Make `version` the primary and point the model's own source and provenance at it."""
    _retire(row.versions.filter(state=PRIMARY).exclude(pk=version.pk))
    version.state, version.weight = PRIMARY, 0
    version.save()
    row.source = version.source
    for field, value in artifact_provenance(path=model_dir(version.source)).items():
        setattr(row, field, value)
    row.save()


def version_promote(*, name: str, label: str = "") -> ModelVersion:
    """The canary (the one named, or the only one) becomes the primary and takes all the
    traffic; the old primary is retired (its workers drain it, then unload it)."""
    with transaction.atomic():
        row = _model_locked(name)
        canaries = row.versions.filter(state=CANARY)
        if label:
            canaries = canaries.filter(label=label)
        found = list(canaries)
        if len(found) != 1:
            raise InvalidRequest(
                f"{name} has {'no' if not found else 'more than one'} canary"
                f"{' ' + label if label else ''} to promote"
                f"{'; name one with --version' if len(found) > 1 else ''}.",
                param="version",
            )
        _retire(row.versions.filter(state=CANARY).exclude(pk=found[0].pk))
        before = audit.snapshot(found[0])
        _primary_set(row, found[0])
        audit.audit_change("modelversion.promote", found[0], before=before)
        return found[0]


def version_rollback(*, name: str) -> ModelVersion:
    """Undo the last move: retire the canaries if there are any (the primary takes all the
    traffic again), else go back from the primary to the version that was primary before.
    Returns the version serving now."""
    with transaction.atomic():
        row = _model_locked(name)
        primary = row.versions.filter(state=PRIMARY).first()
        if row.versions.filter(state=CANARY).exists():
            _retire(row.versions.filter(state=CANARY))
            if primary is None:
                raise InvalidRequest(f"{name} has no primary version.", param="name")
            row.save()  # the registry's snapshots are dropped on the model's save
            audit.audit_change("modelversion.rollback", primary)
            return primary
        previous = (
            row.versions.filter(state=RETIRED, primary_until__isnull=False)
            .order_by("-primary_until", "-pk")
            .first()
        )
        if primary is None or previous is None:
            raise InvalidRequest(f"{name} has no earlier version to roll back to.", param="name")
        _primary_set(row, previous)
        audit.audit_change("modelversion.rollback", previous)
        return previous
