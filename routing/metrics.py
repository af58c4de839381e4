"""Prometheus metrics of the /v1 API (it skips django-prometheus's middleware; see
platform/api_handler.py): requests, routing attempts, time to first token and time per
output token as the client sees them, and the backends' health at scrape time."""

import contextvars
import logging
import os
import time
from enum import StrEnum

from django.utils import timezone
from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from routing.breaker import breakers
from routing.models import Backend, Health
from tenants.counters import SharedCounts
from workers.serving.events import Done, Event, Tokens

logger = logging.getLogger(__name__)

API_REQUESTS = Counter(
    "fairlane_api_requests_total", "/v1 requests by endpoint and status", ["endpoint", "status"]
)
API_RESPONSE_START = Histogram(
    "fairlane_api_response_start_seconds",
    "/v1 time from request to response start (headers; for streams, after admission)",
    ["endpoint"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)


class Outcome(StrEnum):
    """How an attempt to serve a request on a backend ended (fairlane_route_attempts_total)."""

    OK = "ok"
    FAILED = "failed"
    RATE_LIMITED = "rate_limited"
    REFUSED = "refused"  # the backend refused the request itself (surfaced to the client)
    BUDGET = "budget"  # the budget cannot hold what this backend would cost
    LEASE = "lease"  # every slot of a scarce backend is held
    SKIPPED = "skipped"  # not tried: its circuit is open, or the local pool cannot take it


_ROUTE_ATTEMPTS = Counter(
    "fairlane_route_attempts_total",
    "Attempts to serve a request on a backend, by outcome "
    "(ok, failed, rate_limited, refused, budget, lease, skipped)",
    ["backend", "outcome"],
)
# The same outcomes per minute, added up across API processes (the dashboard's error rates).
ATTEMPTS_BY_MINUTE = SharedCounts("fl:ops:attempts", bucket_seconds=60, ttl_seconds=7200)
SEP = "\x1f"


class _Attempt:
    def __init__(self, backend: str, outcome: str) -> None:
        self.backend, self.outcome = backend, outcome

    def inc(self, amount: int = 1) -> None:
        _ROUTE_ATTEMPTS.labels(self.backend, self.outcome).inc(amount)
        ATTEMPTS_BY_MINUTE.add(f"{self.backend}{SEP}{self.outcome}", amount)


class _Attempts:
    """fairlane_route_attempts_total, also counted per minute for the ops dashboard."""

    def labels(self, backend: str, outcome: str) -> _Attempt:
        return _Attempt(backend, outcome)


ROUTE_ATTEMPTS = _Attempts()
ROUTE_TTFT = Histogram(
    "fairlane_route_first_token_seconds",
    "Time from dispatch to a backend's first token",
    ["backend"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)

# Time to first token and time per output token as the client sees them (from the request's
# arrival at the API), by the model asked for, the backend and the model's version (ours; ""
# elsewhere) that answered. vLLM's names.
TTFT = Histogram(
    "fairlane_time_to_first_token_seconds",
    "time from the request's arrival at the API to its first token",
    ["model", "backend", "version"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80),
)
TPOT = Histogram(
    "fairlane_time_per_output_token_seconds",
    "a request's mean time between output tokens after the first (inter-token latency)",
    ["model", "backend", "version"],
    buckets=(
        0.005,
        0.01,
        0.015,
        0.02,
        0.025,
        0.03,
        0.04,
        0.05,
        0.075,
        0.1,
        0.15,
        0.2,
        0.3,
        0.4,
        0.5,
        0.75,
        1,
        2.5,
    ),
)
# How each version of a model fares (a canary against its primary): requests by how they ended.
MODEL_REQUESTS = Counter(
    "fairlane_model_requests_total",
    "requests answered, by model, backend, version and ledger status (ok, error, cancelled...)",
    ["model", "backend", "version", "status"],
)
_arrived: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "fairlane_arrived", default=None
)


def request_arrived() -> None:
    """Mark now as the arrival of the request this task serves (its TTFT's start)."""
    _arrived.set(time.monotonic())


class TokenTimer:
    """Watches a request's events on their way to the client and, when they end, observes
    its time to first token and time per output token."""

    def __init__(self, *, model: str, backend: str, version: str = "") -> None:
        self.model, self.backend, self.version = model, backend or "unknown", version
        self.status = "error"  # unless its Done says otherwise
        self.started = _arrived.get() or time.monotonic()
        self.first: float | None = None
        self.last = 0.0
        self.tokens = 0

    def see(self, event: Event) -> None:
        match event:
            case Tokens(token_ids=token_ids, text=text) if token_ids or text:
                self.last = time.monotonic()
                if self.first is None:
                    self.first = self.last
                    TTFT.labels(self.model, self.backend, self.version).observe(
                        self.first - self.started
                    )
                # A remote chunk carries text, not token ids: about one token.
                self.tokens += len(token_ids) or 1
            case Done(usage=usage, status=status):
                self.tokens = usage.completion_tokens or self.tokens
                self.status = status

    def done(self) -> None:
        MODEL_REQUESTS.labels(self.model, self.backend, self.version, self.status).inc()
        if self.first is not None and self.tokens > 1:
            TPOT.labels(self.model, self.backend, self.version).observe(
                (self.last - self.first) / (self.tokens - 1)
            )


class BackendCollector:
    """At scrape time: each backend's health (from the beat's probes) and, in this process,
    its circuit state and requests in flight."""

    STATES = {"closed": 0, "half_open": 1, "open": 2}

    def describe(self):
        """The families without their values: registering must not touch the database."""
        return list(self._families())

    FAMILIES = [
        (
            "fairlane_backend_registry_readable",
            "1 when this scrape could read the backend registry (0: the figures below are missing)",
        ),
        ("fairlane_backend_up", "1 when the backend's last probes succeeded (live)"),
        ("fairlane_backend_probe_p95_seconds", "p95 latency of the backend's health probes"),
        ("fairlane_backend_circuit_state", "this process's circuit: 0 closed, 1 half-open, 2 open"),
        ("fairlane_backend_inflight", "requests this process has in flight at the backend"),
    ]

    def _families(self):
        return tuple(
            GaugeMetricFamily(name, help_text, labels=[] if i == 0 else ["backend"])
            for i, (name, help_text) in enumerate(self.FAMILIES)
        )

    def collect(self):
        readable, up, p95, circuit, inflight = self._families()
        now = timezone.now()
        try:
            rows = list(
                Backend.objects.filter(is_enabled=True).only(
                    "name", "health", "health_ok_at", "probe_p95_ms"
                )
            )
            readable.add_metric([], 1.0)
        except Exception:  # a scrape must not fail because the database blinked: say so
            logger.exception("backend metrics: the registry could not be read")
            readable.add_metric([], 0.0)
            rows = []
        for row in rows:
            up.add_metric([row.name], 1.0 if row.health_at(now) == Health.LIVE else 0.0)
            p95.add_metric([row.name], row.probe_p95_ms / 1000)
        yield from (readable, up, p95)
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            return  # every process's, from its published gauges (routing/ops/processes.py)
        for name, state in breakers.snapshot().items():
            circuit.add_metric([name], float(self.STATES.get(breakers.state(name), 0)))
            inflight.add_metric([name], float(state["inflight"]))
        yield from (circuit, inflight)
