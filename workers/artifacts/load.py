"""The check before every load of a model's weights, under the policy in
FAIRLANE_MODEL_SIGNATURES: a refusal raises ModelRefused (a 503 to a client that reaches it; the
worker does not host the model, so requests fall through to another backend), counts in
`fairlane_model_verify_failures_total{model,reason}`, and is recorded for the admin."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from django.conf import settings
from django.db import close_old_connections, connection

from tenants.errors import BackendUnavailable, InvalidRequest
from workers.artifacts.models import ModelVerification
from workers.artifacts.trust import trusted_keys
from workers.artifacts.verify import TRUSTED, UNSIGNED, Problem, Verification, model_verify

logger = logging.getLogger(__name__)

# A refused model is checked again at most this often (each check hashes every file).
RECHECK_SECONDS = 30.0


class ModelRefused(BackendUnavailable):
    """A model whose files failed verification; its weights were not read."""

    def __init__(self, model: str, problems: list[Problem]) -> None:
        super().__init__(
            f"The model '{model}' is unavailable: its files failed verification.",
            retry_after=int(RECHECK_SECONDS),
        )
        self.model, self.problems = model, problems

    def __str__(self) -> str:
        return f"model {self.model} refused: " + "; ".join(map(str, self.problems))


def artifact_check(
    *, path: Path, policy: str | None = None, exhaustive: bool = False
) -> tuple[Verification, list[Problem]]:
    """The verification, and what the policy refuses it for (empty: it may load)."""
    policy = policy or settings.FAIRLANE_MODEL_SIGNATURES
    result = model_verify(path, trusted_keys(), exhaustive=exhaustive)
    refusals = list(result.problems)
    if not refusals and policy == "require" and result.trust != TRUSTED:
        refusals.append(
            Problem("unsigned", "the model has no signed manifest")
            if result.trust == UNSIGNED
            else Problem(
                "untrusted_key", f"signed by {result.signer}, which is not a trusted key here"
            )
        )
    return result, refusals


_refused: dict[str, tuple[float, ModelRefused]] = {}
_refused_lock = threading.Lock()


def artifact_verify_for_load(
    *, model: str, path: Path, node: str, count_refusal: Callable[..., None]
) -> Verification:
    """Check `path` before `model` loads from it; raise ModelRefused if it may not. `node`:
    what the check is recorded under (before "@<host>"); `count_refusal(model=, reason=)` counts a
    refusal where this runtime's /metrics reads it."""
    key = f"{model}\x00{path}"
    with _refused_lock:
        earlier = _refused.get(key)
    if earlier and time.monotonic() - earlier[0] < RECHECK_SECONDS:
        raise earlier[1]
    result, refusals = artifact_check(path=path)
    status = _status(result, refusals)
    _record(model, status, result, refusals, worker=f"{node}@{socket.gethostname()}")
    if refusals:
        try:
            count_refusal(model=model, reason=refusals[0].code)
        except Exception:  # counting must not change the decision
            logger.exception("could not count the refused load of %s", model)
        refused = ModelRefused(model, refusals)
        logger.error("refusing to load %s from %s: %s", model, path, "; ".join(map(str, refusals)))
        with _refused_lock:
            _refused[key] = (time.monotonic(), refused)
        raise refused
    with _refused_lock:
        _refused.pop(key, None)
    if result.trust != TRUSTED:
        logger.warning(
            "loading %s from %s: %s (FAIRLANE_MODEL_SIGNATURES=warn)",
            model,
            path,
            "no signature"
            if result.trust == UNSIGNED
            else f"signed by {result.signer}, not a trusted key",
        )
    return result


def _status(result: Verification, refusals: list[Problem]) -> str:
    if refusals:
        return ModelVerification.Status.REFUSED
    return {
        TRUSTED: ModelVerification.Status.VERIFIED,
        UNSIGNED: ModelVerification.Status.UNSIGNED,
    }.get(result.trust, ModelVerification.Status.UNTRUSTED)


def _record(
    model: str, status: str, result: Verification, refusals: list[Problem], *, worker: str
) -> None:
    """The admin's view of the check; never in the way of the refusal itself."""
    try:
        # The registry row, through the check's own foreign key (artifacts sit below the
        # registry's module, which imports theirs).
        served = ModelVerification._meta.get_field("model").related_model
        assert isinstance(served, type)  # a model class, not "self"
        row = served._default_manager.filter(name=model).first()
        if row is not None:
            ModelVerification.objects.update_or_create(
                model=row,
                worker=worker,
                defaults={
                    "status": status,
                    "reasons": "\n".join(map(str, refusals)),
                    "manifest_digest": result.digest,
                    "signer": result.signer,
                },
            )
    except Exception:  # the database is down: the load decision stands, the record waits
        logger.exception("could not record the verification of %s", model)
    finally:
        if not connection.in_atomic_block:  # loads run on worker threads: give it back
            close_old_connections()


def artifact_provenance(*, path: Path) -> dict:
    """For model_register: the manifest's digest, signer, origin and license, after the same
    check a worker makes (a model that would be refused at load is refused here)."""
    result, refusals = artifact_check(path=path)
    if refusals:
        raise InvalidRequest(
            "The model directory failed verification: " + "; ".join(map(str, refusals)),
            param="source",
        )
    predicate = result.predicate
    return {
        "manifest_digest": result.digest,
        "signer": result.signer,
        "origin": str(predicate.get("source", ""))[:500],
        "license": str(predicate.get("license", ""))[:200],
    }
