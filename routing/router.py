"""Routing decisions: which backends may serve a request, in which order.

The registry (backends, their models and prices, agents' routing) is read from the database
into an in-process snapshot, reused for FAIRLANE_ROUTING_CACHE_SECONDS and dropped at once
when this process changes it, so a decision touches no database or network: candidates are
filtered by capability, health and circuit state, then ordered by the agent's policy.
Budgets and leases are applied as the chain is walked (routing/dispatch.py).
"""

from __future__ import annotations

import hashlib
import itertools
import time
from dataclasses import dataclass, field

from django.conf import settings
from django.db.models.signals import post_delete, post_save
from django.utils import timezone

from routing.backends.base import BackendSpec, Route, features_resolve
from routing.breaker import breakers
from routing.max_tokens import max_tokens_context_need
from routing.models import (
    KIND_ORDER,
    AgentRouting,
    Backend,
    BackendKind,
    BackendModel,
    Health,
    Policy,
)
from workers.models import ModelVersion, ServedModel
from workers.serving.catalog import ModelInfo, usage_cost

LOCAL_DEFAULT = BackendSpec(
    name="local",
    kind=BackendKind.LOCAL,
    health=Health.LIVE,
    continuous_batching=True,
    paged_kv=True,
    hidden_states=True,
)
_SPEC_FIELDS = [f for f in BackendSpec.__slots__ if f != "name"]


@dataclass(frozen=True, slots=True)
class AgentPlan:
    chain: tuple[str, ...] = ()
    policy: str = Policy.CHAIN
    cascade: tuple[str, ...] = ()
    cascade_threshold: float = -1.0


@dataclass
class BackendRegistry:
    backends: dict[str, BackendSpec] = field(default_factory=dict)
    routes: dict[str, list[Route]] = field(default_factory=dict)  # model -> routes
    agents: dict[str, AgentPlan] = field(default_factory=dict)
    loaded_at: float = 0.0


def spec_of(row: Backend, now=None) -> BackendSpec:
    """The row as the router sees it, its health as of now (staleness follows the clock)."""
    fields = {f: getattr(row, f) for f in _SPEC_FIELDS}
    fields["health"] = row.health_at(now or timezone.now())
    return BackendSpec(name=row.name, **fields)


def registry_load() -> BackendRegistry:
    registry = BackendRegistry(loaded_at=time.monotonic())
    local = None
    for row in Backend.objects.filter(is_enabled=True):
        spec = spec_of(row)
        registry.backends[spec.name] = spec
        if spec.is_local and local is None:
            local = spec
    has_disabled_local = Backend.objects.filter(kind=BackendKind.LOCAL, is_enabled=False).exists()
    if local is None and not has_disabled_local:
        local = LOCAL_DEFAULT  # the platform's own engines serve without any registration
        registry.backends[local.name] = local
    if local is not None:
        for served in ServedModel.objects.filter(is_enabled=True).prefetch_related("versions"):
            # A vLLM child gets no guides (workers/vllm): no tools or JSON modes there.
            features: frozenset[str] | None = (
                frozenset() if served.runtime == ServedModel.Runtime.VLLM else None
            )
            registry.routes.setdefault(served.name, []).append(
                Route(
                    backend=local,
                    model=served.name,
                    upstream=served.name,
                    info=ModelInfo.of(served),
                    model_features=features,
                )
            )
    for offered in BackendModel.objects.filter(backend__is_enabled=True).select_related("backend"):
        spec = registry.backends[offered.backend.name]
        if spec.is_local:
            continue
        info = ModelInfo(
            name=offered.model,
            source=f"backend:{spec.name}",
            price_input_per_mtok=offered.price_input_per_mtok,
            price_output_per_mtok=offered.price_output_per_mtok,
            price_cached_per_mtok=offered.price_cached_per_mtok,
        )
        registry.routes.setdefault(offered.model, []).append(
            Route(
                backend=spec,
                model=offered.model,
                upstream=offered.upstream_name or offered.model,
                info=info,
                model_features=features_resolve(spec.features, offered),
            )
        )
    for plan in AgentRouting.objects.all():
        registry.agents[str(plan.agent_id)] = AgentPlan(
            chain=tuple(plan.chain or ()),
            policy=plan.policy,
            cascade=tuple(plan.cascade or ()),
            cascade_threshold=plan.cascade_threshold,
        )
    return registry


_registry: BackendRegistry | None = None


def registry_get() -> BackendRegistry:
    """The snapshot (synchronous: it may read the database). No lock: two threads that find
    it stale both read it, which is harmless, whereas a thread waiting on a lock while holding
    a pooled database connection could starve the one loading it."""
    global _registry
    current = _registry
    if current is None or (
        time.monotonic() - current.loaded_at > settings.FAIRLANE_ROUTING_CACHE_SECONDS
    ):
        current = _registry = registry_load()
    return current


def registry_invalidate(*args, **kwargs) -> None:
    global _registry
    _registry = None


for _model in (Backend, BackendModel, AgentRouting, ServedModel, ModelVersion):
    post_save.connect(registry_invalidate, sender=_model, dispatch_uid=f"routing-{_model.__name__}")
    post_delete.connect(
        registry_invalidate, sender=_model, dispatch_uid=f"routing-del-{_model.__name__}"
    )


@dataclass(frozen=True, slots=True)
class Need:
    """What a request needs from a backend."""

    endpoint: str  # chat | completion | embed: which of the /v1 endpoints asks
    prompt_tokens: int = 0  # worst case, for prices
    max_tokens: int = 0
    n: int = 1
    token_prompts: bool = False  # prompts given as token ids (our tokenizer's)
    logit_bias: bool = False  # token ids too
    logprobs: bool = False
    tenant: str = ""
    prefix: str = ""  # the prompt's beginning, for KV affinity
    max_tokens_set: bool = True  # False: max_tokens is a default, fitted to each backend
    features: frozenset[str] = frozenset()  # ChatRequest.features (backends.base.FEATURES)
    context_need: int = field(init=False)  # what a remote backend's context must hold

    def __post_init__(self) -> None:  # once per request, not once per candidate backend
        object.__setattr__(
            self,
            "context_need",
            max_tokens_context_need(
                asked=self.max_tokens if self.max_tokens_set else None,
                worst_prompt_tokens=self.prompt_tokens,
            ),
        )


def route_supports(route: Route, need: Need) -> bool:
    spec = route.backend
    if not need.features <= route.features:
        return False
    if spec.is_local:
        return True
    same_tokenizer = (
        spec.kind == BackendKind.FAIRLANE
    )  # another Fairlane serves our models' tokenizers
    if need.endpoint == "embed":
        return spec.hidden_states and spec.kind in {
            BackendKind.FAIRLANE,
            BackendKind.OPENAI_COMPATIBLE,
            BackendKind.OPENAI,
        }
    if (need.token_prompts or need.logit_bias) and not same_tokenizer:
        return False
    if need.logprobs and (need.endpoint == "completion" or spec.kind == BackendKind.ANTHROPIC):
        return False
    if spec.kind == BackendKind.ANTHROPIC and (need.endpoint != "chat" or need.n > 1):
        return False
    return not spec.context_length or need.context_need <= spec.context_length


_HEALTH_RANK: dict[str, int] = {Health.LIVE: 0, Health.UNKNOWN: 1, Health.STALE: 2}


def _health_rank(spec: BackendSpec) -> int:
    return _HEALTH_RANK.get(spec.health, 2)


def _default_rank(spec: BackendSpec) -> tuple[int, str]:
    kind = KIND_ORDER.index(spec.kind) if spec.kind in KIND_ORDER else len(KIND_ORDER)
    return kind, spec.name


_round_robin = itertools.count()


def _affinity_score(need: Need, spec: BackendSpec) -> int:
    digest = hashlib.blake2b(
        f"{need.tenant}\x00{need.prefix}\x00{spec.name}".encode(), digest_size=8
    ).digest()
    return -int.from_bytes(digest, "big")  # rendezvous hashing: highest score first


def _is_overloaded(spec: BackendSpec) -> bool:
    return bool(spec.max_concurrency) and breakers.inflight(spec.name) >= spec.max_concurrency


def _policy_key(policy: str, need: Need):
    inf = float("inf")
    if policy == Policy.LEAST_BUSY:
        return lambda r: breakers.inflight(r.backend.name) / max(r.backend.max_concurrency, 1)
    if policy == Policy.LATENCY:  # this process's rolling p95, else the health probe's
        return lambda r: breakers.p95_ms(r.backend.name) or r.backend.probe_p95_ms
    if policy == Policy.COST:
        return lambda r: usage_cost(
            r.info, prompt_tokens=need.prompt_tokens, completion_tokens=need.max_tokens * need.n
        )
    if policy == Policy.ENERGY:  # unknown (0) sorts last
        return lambda r: r.backend.energy_mj_per_token or inf
    if policy == Policy.CARBON:
        return lambda r: (r.backend.energy_mj_per_token * r.backend.carbon_g_per_kwh) or inf
    if policy == Policy.AFFINITY:  # the same tenant and prefix to the same backend, unless busy
        return lambda r: (_is_overloaded(r.backend), _affinity_score(need, r.backend))
    return None


@dataclass
class Plan:
    routes: list[Route]
    agent: AgentPlan
    blocked_for: float = 0.0  # when every candidate is open/cooling: seconds until one is not
    unsupported: bool = False  # the model exists but no backend can serve this request
    missing: str | None = None  # a feature the request needs that none of them has


def route_plan(
    *, registry: BackendRegistry, agent_id: str, model: str, need: Need, policy: str | None = None
) -> Plan:
    """The backends to try for this request, in order (empty if none can serve it now)."""
    agent = registry.agents.get(agent_id, AgentPlan())
    routes = registry.routes.get(model, [])
    if agent.chain:
        position = {name: i for i, name in enumerate(agent.chain)}
        routes = sorted(
            (r for r in routes if r.backend.name in position),
            key=lambda r: position[r.backend.name],
        )
    else:
        routes = sorted(routes, key=lambda r: _default_rank(r.backend))
    capable = [r for r in routes if route_supports(r, need)]
    usable = [
        r
        for r in capable
        if r.backend.health != Health.OFFLINE and breakers.available(r.backend.name)
    ]
    plan = Plan(
        routes=usable,
        agent=agent,
        unsupported=bool(routes) and not capable,
        missing=feature_missing(routes, need) if routes and not capable else None,
    )
    if capable and not usable:
        waits = [breakers.blocked_for(r.backend.name) for r in capable]
        plan.blocked_for = min((w for w in waits if w > 0), default=0.0)
    policy = policy or agent.policy
    if policy == Policy.ROUND_ROBIN and usable:
        shift = next(_round_robin) % len(usable)
        usable[:] = usable[shift:] + usable[:shift]
    key = _policy_key(policy, need)
    if key is not None:
        usable.sort(key=key)
    usable.sort(key=lambda r: _health_rank(r.backend))  # stable: live, never probed, stale
    return plan


def feature_missing(routes: list[Route], need: Need) -> str | None:
    """A feature the request needs that none of these routes has, if any (for its 400)."""
    return next(
        (f for f in sorted(need.features) if not any(f in r.features for r in routes)), None
    )


def model_names(registry: BackendRegistry) -> list[str]:
    return sorted(registry.routes)
