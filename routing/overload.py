"""Admission control and brownout: what the API does when work arrives faster than the GPU
workers drain it.

- Queue depth limits: a tenant with too many requests waiting gets a 429 (its own doing); a
  lane too deep gets a 503 (the platform's). Both carry Retry-After estimated from how fast the
  queue drains.
- Brownout, by how full the queues are: first shed the bulk lane (503), then also cap
  max_tokens in the standard lane; realtime is never touched. Responses say so in the
  `x-fairlane-brownout` header, and the metrics count it.
"""

from __future__ import annotations

import math

import redis
from django.conf import settings
from prometheus_client import Counter, Gauge

from routing.max_tokens import max_tokens_brownout
from tenants.errors import Overloaded, RateLimited, ServiceUnavailable
from tenants.models import Lane
from workers.serving.catalog import ModelInfo
from workers.serving.pool import Load
from workers.serving.runtime import Pool

BROWNOUT_LEVEL = Gauge(
    "fairlane_brownout_level",
    "0 normal, 1 bulk shed, 2 bulk shed and standard max_tokens capped",
    ["model"],
    multiprocess_mode="mostrecent",
)
BROWNOUT_ACTIONS = Counter(
    "fairlane_brownout_actions_total",
    "requests shed or capped by the brownout",
    ["model", "action"],
)
MAX_RETRY_AFTER = 120


def _retry_after(depth: int, rate: float) -> int:
    return max(1, min(MAX_RETRY_AFTER, math.ceil(depth / max(rate, 0.1))))


def load_read(*, pool: Pool, info: ModelInfo, lane: str, tenant: str) -> Load:
    try:
        return pool.load_read(model=info.name, lane=lane, tenant=tenant)
    except redis.RedisError as exc:  # the queue is unreachable: nothing can be queued now
        raise ServiceUnavailable(
            "The request queue is unreachable; retry shortly.", retry_after=2
        ) from exc


def brownout_level(load: Load) -> int:
    pressure = load.total_depth / settings.FAIRLANE_MAX_QUEUE_PER_LANE
    if pressure >= settings.FAIRLANE_BROWNOUT_CAP_AT:
        return 2
    if pressure >= settings.FAIRLANE_BROWNOUT_SHED_AT:
        return 1
    return 0


def load_admit(
    *, pool: Pool, info: ModelInfo, lane: str, tenant: str, max_tokens: int
) -> tuple[int, str]:
    """Admit a request under the runtime pool's current load: its (possibly capped)
    max_tokens, and the value of the x-fairlane-brownout header ("" when none applies).
    Raises when it must wait."""
    load = load_read(pool=pool, info=info, lane=lane, tenant=tenant)
    retry = _retry_after(load.lane_depth, load.dispatch_rate)
    if load.tenant_depth >= settings.FAIRLANE_MAX_QUEUE_PER_TENANT:
        raise RateLimited(
            f"{load.tenant_depth} of your requests are already waiting in the "
            f"{lane} lane; retry later.",
            retry_after=retry,
        )
    if load.lane_depth >= settings.FAIRLANE_MAX_QUEUE_PER_LANE:
        raise Overloaded(f"The {lane} lane is full; retry later.", retry_after=retry)
    level = brownout_level(load)
    BROWNOUT_LEVEL.labels(info.name).set(level)
    if level >= 1 and lane == Lane.BULK:
        BROWNOUT_ACTIONS.labels(info.name, "shed_bulk").inc()
        raise Overloaded(
            "Under heavy load the bulk lane is shed (brownout); retry later.",
            retry_after=_retry_after(load.total_depth, load.dispatch_rate),
            headers={"x-fairlane-brownout": "shed-bulk"},
        )
    capped = max_tokens_brownout(max_tokens)
    if level >= 2 and lane == Lane.STANDARD and capped < max_tokens:
        BROWNOUT_ACTIONS.labels(info.name, "cap_max_tokens").inc()
        return capped, f"cap-max-tokens={capped}"
    return max_tokens, ""
