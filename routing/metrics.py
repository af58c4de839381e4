"""Prometheus metrics of the /v1 API (it skips django-prometheus's middleware; see
platform/api_handler.py)."""

from prometheus_client import Counter, Histogram

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
