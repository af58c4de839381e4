"""Liveness, readiness and the Prometheus scrape endpoint."""

import hmac

from django.conf import settings
from django.db import connection
from django.http import HttpResponse, JsonResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from metrics_export import metrics_registry


@require_GET
def healthz(request):
    """Liveness: the process answers. Touches nothing else, so a slow database does not get
    healthy processes restarted."""
    return JsonResponse({"status": "ok"})


def _check_database() -> str | None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:  # readiness reports any failure, it never raises
        return f"{type(exc).__name__}"
    return None


def _check_redis(client) -> str | None:
    try:
        client.ping()
    except Exception as exc:  # readiness reports any failure, it never raises
        return f"{type(exc).__name__}"
    return None


@require_GET
def readyz(request):
    """Readiness: the database answers, and the runtime's Redis when it has one."""
    checks = {"database": _check_database()}
    if request.runtime.redis is not None:
        checks["redis"] = _check_redis(request.runtime.redis)
    ready = all(error is None for error in checks.values())
    body = {
        "status": "ok" if ready else "unavailable",
        "checks": {name: error or "ok" for name, error in checks.items()},
    }
    response = JsonResponse(body, status=200 if ready else 503)
    if not ready:
        response["Retry-After"] = "5"
    return response


LOOPBACK = frozenset({"127.0.0.1", "::1"})


def _metrics_allowed(request) -> bool:
    """With FAIRLANE_METRICS_TOKEN, whoever presents it; without, loopback clients where
    FAIRLANE_METRICS_LOOPBACK allows (the embedded mode's default), else nobody: the series
    name tenants and their spend."""
    token = settings.FAIRLANE_METRICS_TOKEN
    if token:
        presented = request.META.get("HTTP_AUTHORIZATION", "").removeprefix("Bearer ")
        return hmac.compare_digest(presented.encode(), token.encode())
    return settings.FAIRLANE_METRICS_LOOPBACK and request.META.get("REMOTE_ADDR") in LOOPBACK


@require_GET
def metrics(request):
    if not _metrics_allowed(request):
        return HttpResponse(
            "metrics token required (FAIRLANE_METRICS_TOKEN)\n",
            status=401,
            content_type="text/plain",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return HttpResponse(generate_latest(metrics_registry()), content_type=CONTENT_TYPE_LATEST)
