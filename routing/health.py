"""Backend health, probed by a Celery beat task (routing.tasks.backends_probe) with requests
that cost nothing (the model list; never a paid completion). The local engine pool's health
is its workers' heartbeats. A backend is live after a successful probe, stale when its last
success is older than FAIRLANE_HEALTH_STALE_SECONDS (still routed to, last), offline after
FAIRLANE_HEALTH_OFFLINE_AFTER failures in a row (not routed to); one success brings it back.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from routing.backends import backend_probe
from routing.models import Backend, BackendKind, Health
from routing.router import spec_of
from tenants.errors import ApplicationError
from workers.serving.runtime import Pool

SAMPLES = 20


async def _probe_remote(backend: Backend) -> tuple[float, bool, str]:
    started = time.perf_counter()
    try:
        await backend_probe(spec_of(backend))
        return (time.perf_counter() - started) * 1000, True, ""
    except ApplicationError as exc:  # the backend's error (its detail is for operators)
        return (time.perf_counter() - started) * 1000, False, f"{exc.code}: {exc.detail}"[:300]
    except Exception as exc:  # one broken backend must not stop the others' probes
        return (time.perf_counter() - started) * 1000, False, f"probe failed: {type(exc).__name__}"


def _probe_local(pool: Pool) -> tuple[float, bool, str]:
    ok, detail = pool.pool_probe()
    return 0.0, ok, detail


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(int(len(ordered) * q), len(ordered) - 1)]


def health_record(backend: Backend, latency_ms: float, ok: bool, detail: str, now=None) -> Backend:
    now = now or timezone.now()
    samples = (backend.probe_samples + [[round(latency_ms, 3), ok]])[-SAMPLES:]
    backend.probe_samples = samples
    good = [ms for ms, success in samples if success]
    backend.probe_p50_ms, backend.probe_p95_ms = _percentile(good, 0.5), _percentile(good, 0.95)
    backend.probe_error_rate = sum(1 for _, success in samples if not success) / len(samples)
    backend.health_checked_at = now
    if ok:
        backend.health_ok_at, backend.health, backend.health_detail = now, Health.LIVE, ""
    else:
        backend.health_detail = detail
        failures = 0
        for _, success in reversed(samples):
            if success:
                break
            failures += 1
        if failures >= settings.FAIRLANE_HEALTH_OFFLINE_AFTER:
            backend.health = Health.OFFLINE
        elif backend.health_ok_at and now - backend.health_ok_at > timedelta(
            seconds=settings.FAIRLANE_HEALTH_STALE_SECONDS
        ):
            backend.health = Health.STALE
    backend.save(
        update_fields=[
            "probe_samples",
            "probe_p50_ms",
            "probe_p95_ms",
            "probe_error_rate",
            "health_checked_at",
            "health_ok_at",
            "health",
            "health_detail",
        ]
    )
    return backend


def backends_probe(*, pool: Pool) -> dict[str, str]:
    """Probe every enabled backend once (concurrently), the local engine pool through the
    runtime's `pool`; their health by name."""
    backends = list(Backend.objects.filter(is_enabled=True))
    remote = [b for b in backends if b.kind != BackendKind.LOCAL]

    async def probe_all() -> list[tuple[float, bool, str]]:
        return list(await asyncio.gather(*(_probe_remote(b) for b in remote)))

    probed = asyncio.run(probe_all()) if remote else []
    results = dict(zip((b.pk for b in remote), probed, strict=True))
    for backend in backends:
        result = results[backend.pk] if backend.kind != BackendKind.LOCAL else _probe_local(pool)
        health_record(backend, *result)
    return {b.name: b.health for b in backends}
