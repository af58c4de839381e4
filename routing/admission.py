"""Admission on the request path: who is calling (key, tenant, agent), does the prompt fit the
model, and OpenAI's sampling parameters as the engine's. Budgets are reserved per backend as
the fall-through chain is walked (routing/dispatch.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from django.utils import timezone

from routing.wire.parse import Sampling
from tenants.cache import generation, hot_cache
from tenants.errors import AuthenticationFailed, ContextLengthExceeded, PermissionDenied
from tenants.models import Agent, ApiKey, Scope, Tenant
from tenants.services.keys import api_key_authenticate, api_key_fingerprint
from workers.engine import SamplingParams
from workers.registry import ModelInfo, model_context_length


@dataclass(frozen=True, slots=True)
class Caller:
    api_key: ApiKey
    tenant: Tenant
    agent: Agent


_callers = hot_cache("callers")  # by the key's keyed hash (tenants/cache.py)


def _bearer(authorization: str | None) -> str:
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthenticationFailed("You didn't provide an API key. Send it as "
                                   "'Authorization: Bearer <key>'.")
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
    read_at = generation()
    key = api_key_authenticate(plain=token)
    if Scope.INFERENCE not in key.scopes:
        raise PermissionDenied("This API key lacks the inference scope.")
    caller = Caller(api_key=key, tenant=key.tenant, agent=key.agent)
    _callers.put(api_key_fingerprint(token), caller, read_at)
    return caller


def max_tokens_resolve(*, info: ModelInfo, prompts: list[list[int]],
                       max_tokens: int | None) -> int:
    """max_tokens, defaulting (like OpenAI's API) to what the context leaves; the prompt and
    the completion must fit the context together."""
    context = model_context_length(info)
    longest = max(len(p) for p in prompts)
    if longest >= context:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {context} tokens. However, your prompt "
            f"is {longest} tokens long.", param="messages")
    if max_tokens is None:
        return context - longest
    if longest + max_tokens > context:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{longest + max_tokens} tokens ({longest} in the prompt, {max_tokens} for the "
            "completion). Please reduce the prompt or max_tokens.", param="max_tokens")
    return max_tokens


def sampling_for_engine(sampling: Sampling, max_tokens: int,
                        guide: dict | None = None) -> SamplingParams:
    """OpenAI's sampling parameters as the engine's, converted once, at the edge: what a job
    carries to its worker. `guide`: local_guide's keywords (JSON mode, tool calls)."""
    return SamplingParams(
        max_tokens=max_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
        top_k=max(sampling.top_k, 0), seed=sampling.seed, stop=sampling.stop,
        logprobs=sampling.logprobs, min_tokens=min(sampling.min_tokens, max_tokens),
        ignore_eos=sampling.ignore_eos, presence_penalty=sampling.presence_penalty,
        frequency_penalty=sampling.frequency_penalty,
        repetition_penalty=sampling.repetition_penalty, logit_bias=sampling.logit_bias,
        **(guide or {}))


def engine_sampling(sampling: Sampling, max_tokens: int) -> dict:
    """`sampling_for_engine` as the job's JSON carries it, for a caller that merges a guide in
    (a GenerationJob takes it back as SamplingParams)."""
    return asdict(sampling_for_engine(sampling, max_tokens))
