"""GET /v1/models: what the caller may use and something can serve now."""

from __future__ import annotations

from routing.admission import Caller
from routing.router import registry_get
from routing.services.prepare import model_hosted, model_load_failed


def models_available(*, caller: Caller) -> list[str]:
    """Model names the agent may use that something can serve now: a remote backend that is
    not offline, the embedded engines, or a live GPU worker that advertises the model (not
    one that failed to load)."""
    names = []
    for name, routes in registry_get().routes.items():
        if not caller.agent.may_use_model(name):
            continue
        for route in routes:
            if route.backend.is_local:
                usable = model_hosted(name) and model_load_failed(name) is None
            else:
                usable = route.backend.health != "offline"
            if usable:
                names.append(name)
                break
    return sorted(names)
