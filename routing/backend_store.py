"""Writes to the backend registry: backends (their credential encrypted or referenced, never
stored plain), the models each serves with prices, and agents' routing. Every write is
validated like a form, so bad input is an InvalidRequest naming the field."""

from __future__ import annotations

import logging
import time
from datetime import datetime

from channels.db import database_sync_to_async
from django.utils import timezone

from routing.credentials import credential_encrypt, credential_ref_check
from routing.models import AgentRouting, Backend, BackendKind, BackendModel, Policy
from routing.router import registry_load
from tenants.errors import InvalidRequest, NotFound
from tenants.models import Agent
from tenants.services.audit import audit_change, snapshot
from tenants.services.validation import save_validated

logger = logging.getLogger(__name__)
SETTABLE = {
    "base_url",
    "credential_ref",
    "context_length",
    "hidden_states",
    "accelerator",
    "max_concurrency",
    "continuous_batching",
    "paged_kv",
    "zone",
    "energy_mj_per_token",
    "carbon_g_per_kwh",
    "lease_seconds",
    "queue_depth",
    "timeout_seconds",
    "is_enabled",
    "supports_tools",
    "supports_json_schema",
    "supports_vision",
}


def backend_register(*, name: str, kind: str, credential: str | None = None, **fields) -> Backend:
    """Add a backend, or change the one with that name. `credential` (a plain secret) is
    encrypted before it is stored; pass credential_ref="env:NAME" to keep it out of the
    database altogether."""
    if kind not in BackendKind.values:
        raise InvalidRequest(f"kind must be one of {BackendKind.values}.", param="kind")
    unknown = set(fields) - SETTABLE
    if unknown:
        raise InvalidRequest(
            f"Unknown backend field(s): {sorted(unknown)}.", param=sorted(unknown)[0]
        )
    credential_ref_check(fields.get("credential_ref", ""))
    if (
        kind != BackendKind.LOCAL
        and not fields.get("base_url")
        and not Backend.objects.filter(name=name).exclude(base_url="").exists()
    ):
        raise InvalidRequest("A remote backend needs base_url.", param="base_url")
    backend = Backend.objects.filter(name=name).first() or Backend(name=name)
    before = snapshot(backend) if backend.pk else None
    backend.kind = kind
    for field, value in fields.items():
        setattr(backend, field, value)
    if credential is not None:
        backend.credential_encrypted = credential_encrypt(credential) if credential else ""
        if credential:
            backend.credential_ref = ""
    elif fields.get("credential_ref"):
        backend.credential_encrypted = ""
    backend = save_validated(backend, unique_param="name")
    audit_change("backend.register", backend, before=before)
    return backend


def backend_error_note(*, name: str, detail: str, now: datetime | None = None) -> None:
    """Keep a backend's latest failure for operators (the admin shows it); clients got a
    code and a generic message."""
    Backend.objects.filter(name=name).update(
        last_error=detail[:500], last_error_at=now or timezone.now()
    )


NOTE_EVERY_SECONDS = 10.0
_noted: dict[str, float] = {}


async def backend_error_noted(name: str, detail: str) -> None:
    """`backend_error_note` from the request path: at most once per NOTE_EVERY_SECONDS per
    backend and process, so an outage does not turn into a write per request."""
    now = time.monotonic()
    if now - _noted.get(name, -NOTE_EVERY_SECONDS) < NOTE_EVERY_SECONDS:
        return
    _noted[name] = now
    try:
        await database_sync_to_async(backend_error_note)(name=name, detail=detail)
    except Exception:  # the database is down too: the log has the detail
        logger.warning("could not note %s's failure for the admin", name, exc_info=True)


def backend_model_set(
    *,
    backend: Backend,
    model: str,
    upstream_name: str = "",
    price_input_per_mtok: int = 0,
    price_output_per_mtok: int = 0,
    price_cached_per_mtok: int = 0,
    supports_tools: bool | None = None,
    supports_json_schema: bool | None = None,
    supports_vision: bool | None = None,
) -> BackendModel:
    """A model the backend serves; `supports_*` None: as its backend."""
    row = BackendModel.objects.filter(backend=backend, model=model).first() or BackendModel(
        backend=backend, model=model
    )
    before = snapshot(row) if row.pk else None
    row.supports_tools, row.supports_json_schema = supports_tools, supports_json_schema
    row.supports_vision = supports_vision
    row.upstream_name = upstream_name
    row.price_input_per_mtok = price_input_per_mtok
    row.price_output_per_mtok = price_output_per_mtok
    row.price_cached_per_mtok = price_cached_per_mtok
    row = save_validated(row, unique_param="model")
    audit_change("backend_model.set", row, before=before)
    return row


def _cascade_check(*, agent: Agent, cascade: list[str]) -> None:
    """A cascade that can work: each tier once, each a model the agent may use that something
    serves, and every tier but the last answerable with log-probabilities somewhere (a tier is
    scored by its mean token log-probability; Anthropic returns none). The registry may still
    change later: a tier that cannot answer then escalates (routing/services/cascade.py)."""
    if not cascade:
        return
    routes = registry_load().routes
    for model in cascade:
        if model not in routes or not agent.may_use_model(model):
            raise NotFound(
                f"Cascade tier '{model}' is not a model this agent can use.", param="cascade"
            )
    if len(cascade) == 1:
        raise InvalidRequest("A cascade needs at least two models.", param="cascade")
    if len(set(cascade)) != len(cascade):
        raise InvalidRequest("A cascade lists each model once.", param="cascade")
    for index, model in enumerate(cascade):
        scored = any(r.backend.kind != BackendKind.ANTHROPIC for r in routes[model])
        if index < len(cascade) - 1 and not scored:
            raise InvalidRequest(
                f"Cascade tier '{model}' is served only where no "
                "log-probabilities are returned; a tier before the last is "
                "scored by them.",
                param="cascade",
            )


def agent_routing_set(
    *,
    agent: Agent,
    chain: list[str] | None = None,
    policy: str = Policy.CHAIN,
    cascade: list[str] | None = None,
    cascade_threshold: float = -1.0,
) -> AgentRouting:
    chain, cascade = list(chain or []), list(cascade or [])
    if policy not in Policy.values:
        raise InvalidRequest(f"policy must be one of {Policy.values}.", param="policy")
    if not all(isinstance(n, str) for n in chain + cascade):
        raise InvalidRequest("chain and cascade are lists of names.", param="chain")
    known = set(Backend.objects.filter(name__in=chain).values_list("name", flat=True))
    known |= {BackendKind.LOCAL.value} & set(chain)  # the built-in local engine pool
    missing = [n for n in chain if n not in known]
    if missing:  # a reference to nothing: 404, like an unknown agent id
        raise NotFound(f"Unknown backend(s) in chain: {missing}.", param="chain")
    _cascade_check(agent=agent, cascade=cascade)
    row = AgentRouting.objects.filter(agent=agent).first() or AgentRouting(agent=agent)
    before = snapshot(row) if row.pk else None
    row.chain, row.policy, row.cascade = chain, policy, cascade
    row.cascade_threshold = float(cascade_threshold)
    row = save_validated(row)
    audit_change("agent_routing.set", row, before=before, tenant=agent.tenant)
    return row
