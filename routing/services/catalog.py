"""GET /v1/models: what the caller may use and something can serve now."""

from __future__ import annotations

from routing.admission import Caller
from routing.router import registry_get
from workers.serving.catalog import model_context_length
from workers.serving.runtime import Runtime


def models_available(*, runtime: Runtime, caller: Caller) -> dict[str, int]:
    """Model names the agent may use that something can serve now (a remote backend that is
    not offline, the embedded engines, or a live GPU worker that advertises the model, not one
    that failed to load), each with the longest context a usable route declares (0: none
    declares one), which /v1/models reports as vLLM does (`max_model_len`)."""
    available: dict[str, int] = {}
    for name, routes in registry_get().routes.items():
        if not caller.agent.may_use_model(name):
            continue
        for route in routes:
            if route.backend.is_local:
                pool = runtime.pool
                if not (pool.model_hosted(name) and pool.model_load_failed(name) is None):
                    continue
                context = model_context_length(route.info)
            elif route.backend.health != "offline":
                context = route.backend.context_length
            else:
                continue
            available[name] = max(available.get(name, 0), context)
    return dict(sorted(available.items()))
