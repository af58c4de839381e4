"""Admission on the request path: who is calling (key, tenant, agent), may they use this model,
does the prompt fit, and the worst-case cost reserved against their budgets before anything
is sent."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from tenants.errors import AuthenticationFailed, ContextLengthExceeded, ModelNotFound, PermissionDenied
from tenants.models import Agent, ApiKey, Scope, Tenant
from tenants.services.budgets import budget_reserve
from tenants.services.keys import api_key_authenticate
from routing.ratelimit import Admitted, limiter_get, scopes_for
from workers.generation import GenerationJob
from workers.registry import ModelInfo, model_context_length, model_get, usage_cost

@dataclass(frozen=True, slots=True)
class Caller:
    api_key: ApiKey
    tenant: Tenant
    agent: Agent


def caller_authenticate(*, authorization: str | None) -> Caller:
    """The caller behind `Authorization: Bearer <key>`, if the key may use the /v1 API."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthenticationFailed("You didn't provide an API key. Send it as "
                                   "'Authorization: Bearer <key>'.")
    key = api_key_authenticate(plain=token.strip())
    if Scope.INFERENCE not in key.scopes:
        raise PermissionDenied("This API key lacks the inference scope.")
    return Caller(api_key=key, tenant=key.tenant, agent=key.agent)


def model_for(*, caller: Caller, name: str) -> ModelInfo:
    """The model, if it exists and the agent may use it (both failures read alike)."""
    info = model_get(name=name)
    if info is None or not caller.agent.may_use_model(name):
        raise ModelNotFound(f"The model '{name}' does not exist or you do not have access to "
                            "it.", param="model")
    return info



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


def engine_sampling(sampling, max_tokens: int) -> dict:
    """OpenAI's sampling parameters as the engine's SamplingParams keywords."""
    return {"max_tokens": max_tokens, "temperature": sampling.temperature,
            "top_p": sampling.top_p, "top_k": max(sampling.top_k, 0),
            "seed": sampling.seed,
            "stop": list(sampling.stop), "logprobs": sampling.logprobs,
            "min_tokens": min(sampling.min_tokens, max_tokens),
            "ignore_eos": sampling.ignore_eos, "presence_penalty": sampling.presence_penalty,
            "frequency_penalty": sampling.frequency_penalty,
            "repetition_penalty": sampling.repetition_penalty,
            "logit_bias": [list(pair) for pair in sampling.logit_bias]}


def generation_admit(*, caller: Caller, info: ModelInfo, prompts: list[list[int]],
                     kind: str, n: int = 1, sampling: dict | None = None,
                     ) -> tuple[GenerationJob, Admitted]:
    """Take the request's rate-limit slots (key, agent, tenant), then reserve its worst-case
    cost (every prompt in full, every choice at max_tokens) against the agent's and tenant's
    budgets, and describe it for a worker. Either refusal leaves nothing taken."""
    max_tokens = (sampling or {}).get("max_tokens", 0)
    worst_tokens = sum(len(p) for p in prompts) + len(prompts) * n * max_tokens
    estimate = sum(usage_cost(info, prompt_tokens=len(p), completion_tokens=n * max_tokens)
                   for p in prompts)
    request_id = uuid.uuid4().hex
    limiter = limiter_get()
    admitted = limiter.acquire(request_id=request_id, scopes=scopes_for(caller),
                               tokens=worst_tokens)
    try:
        budget_reserve(tenant=caller.tenant, agent=caller.agent, amount_microcents=estimate,
                       request_id=request_id, api_key=caller.api_key)
    except Exception:
        limiter.release(admitted, tokens_used=0)
        raise
    job = GenerationJob(request_id=request_id, kind=kind, model=info.to_dict(), prompts=prompts,
                        n=n, sampling=sampling or {}, tenant_id=caller.tenant.pk,
                        agent_id=str(caller.agent.pk), lane=caller.agent.effective_lane,
                        weight=caller.tenant.weight)
    return job, admitted
