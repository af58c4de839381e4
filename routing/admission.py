"""Admission on the request path: who is calling (key, tenant, agent), and OpenAI's sampling
parameters as the engine's. Budgets are reserved per backend as
the fall-through chain is walked (routing/dispatch.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.utils import timezone

from routing.errors import engine_refusal
from routing.wire.parse import Sampling
from tenants.cache import HotCache, epoch, hot_cache
from tenants.errors import AuthenticationFailed, PermissionDenied
from tenants.models import Agent, ApiKey, Scope, Tenant
from tenants.services.keys import api_key_authenticate, api_key_fingerprint
from workers.engine import EngineError, SamplingParams


@dataclass(frozen=True, slots=True)
class Caller:
    api_key: ApiKey
    tenant: Tenant
    agent: Agent
    # A batch's line (routing/batches/): the batch, and the request id its line is charged
    # under; its requests run on the bulk lane at the batch price.
    batch_id: str = ""
    request_id: str = ""


_callers: HotCache[Caller] = hot_cache("callers")  # by the key's keyed hash (tenants/cache.py)


def _bearer(authorization: str | None) -> str:
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthenticationFailed(
            "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'."
        )
    return token.strip()


def caller_cached(*, authorization: str | None) -> Caller | None:
    """The caller this process authenticated recently with the same key, if its key is still
    usable (no database, so the event loop may call it); None: authenticate."""
    caller = _callers.get(api_key_fingerprint(_bearer(authorization)))
    if caller is None or not caller.api_key.is_usable_at(timezone.now()):
        return None
    return caller


def caller_authenticate(*, authorization: str | None) -> Caller:
    """The caller behind `Authorization: Bearer <key>`, if the key may use the /v1 API."""
    token = _bearer(authorization)
    read_at = epoch()
    key = api_key_authenticate(plain=token)
    if Scope.INFERENCE not in key.scopes:
        raise PermissionDenied("This API key lacks the inference scope.")
    caller = Caller(api_key=key, tenant=key.tenant, agent=key.agent)
    _callers.put(api_key_fingerprint(token), caller, read_at)
    return caller


def sampling_for_engine(
    sampling: Sampling, max_tokens: int, guide: dict[str, Any] | None = None
) -> SamplingParams:
    """OpenAI's sampling parameters as the engine's, converted once, at the edge: what a job
    carries to its worker. `guide`: local_guide's keywords (JSON mode, tool calls). What the
    engine refuses is the client's error here, at the edge."""
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=max(sampling.top_k, 0),
            seed=sampling.seed,
            stop=sampling.stop,
            logprobs=sampling.logprobs,
            min_tokens=min(sampling.min_tokens, max_tokens),
            ignore_eos=sampling.ignore_eos,
            presence_penalty=sampling.presence_penalty,
            frequency_penalty=sampling.frequency_penalty,
            repetition_penalty=sampling.repetition_penalty,
            logit_bias=sampling.logit_bias,
            **(guide or {}),
        )
    except EngineError as exc:
        raise engine_refusal(exc) from None
