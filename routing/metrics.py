"""Prometheus metrics of the /v1 API (it skips django-prometheus's middleware; see
platform/api_handler.py)."""

import logging

from django.utils import timezone
from prometheus_client import Counter, Histogram

logger = logging.getLogger(__name__)

API_REQUESTS = Counter("fairlane_api_requests_total", "/v1 requests by endpoint and status",
                       ["endpoint", "status"])
API_RESPONSE_START = Histogram(
    "fairlane_api_response_start_seconds",
    "/v1 time from request to response start (headers; for streams, after admission)",
    ["endpoint"], buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))

ROUTE_ATTEMPTS = Counter("fairlane_route_attempts_total",
                         "Attempts to serve a request on a backend, by outcome "
                         "(ok, failed, rate_limited, refused, budget, lease, skipped)",
                         ["backend", "outcome"])
ROUTE_TTFT = Histogram("fairlane_route_first_token_seconds",
                       "Time from dispatch to a backend's first token", ["backend"],
                       buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))


class BackendCollector:
    """At scrape time: each backend's health (from the beat's probes) and, in this process,
    its circuit state and requests in flight."""

    STATES = {"closed": 0, "half_open": 1, "open": 2}

    def describe(self):
        """The families without their values: registering must not touch the database."""
        return list(self._families())

    FAMILIES = [
        ("fairlane_backend_registry_readable",
         "1 when this scrape could read the backend registry (0: the figures below are missing)"),
        ("fairlane_backend_up", "1 when the backend's last probes succeeded (live)"),
        ("fairlane_backend_probe_p95_seconds", "p95 latency of the backend's health probes"),
        ("fairlane_backend_circuit_state",
         "this process's circuit: 0 closed, 1 half-open, 2 open"),
        ("fairlane_backend_inflight", "requests this process has in flight at the backend"),
    ]

    def _families(self):
        from prometheus_client.core import GaugeMetricFamily

        return tuple(GaugeMetricFamily(name, help_text, labels=[] if i == 0 else ["backend"])
                     for i, (name, help_text) in enumerate(self.FAMILIES))

    def collect(self):
        from routing.breaker import breakers
        from routing.models import Backend, Health

        readable, up, p95, circuit, inflight = self._families()
        now = timezone.now()
        try:
            rows = list(Backend.objects.filter(is_enabled=True).only(
                "name", "health", "health_ok_at", "probe_p95_ms"))
            readable.add_metric([], 1.0)
        except Exception:  # a scrape must not fail because the database blinked: say so
            logger.exception("backend metrics: the registry could not be read")
            readable.add_metric([], 0.0)
            rows = []
        for row in rows:
            up.add_metric([row.name], 1.0 if row.health_at(now) == Health.LIVE else 0.0)
            p95.add_metric([row.name], row.probe_p95_ms / 1000)
        for name, state in breakers.snapshot().items():
            circuit.add_metric([name], float(self.STATES.get(breakers.state(name), 0)))
            inflight.add_metric([name], float(state["inflight"]))
        yield from (readable, up, p95, circuit, inflight)
