"""The ops dashboard's capacity panel: per model, the local pool's load now against the
capacity its plan predicted (`manage.py capacity_plan`, issue 34)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count
from django.utils import timezone

from routing.models import Backend, BackendKind, CapacityFit
from tenants.models import UsageRecord
from workers.serving.runtime import Runtime

LOAD_MINUTES = 5


@dataclass(frozen=True, slots=True)
class CapacityRow:
    model: str
    load_rps: float  # requests the local pool answered per second over the last LOAD_MINUTES
    num_workers: int  # live workers hosting the model
    fit: CapacityFit | None

    @property
    def capacity_rps(self) -> float | None:
        """The plan's knee for the workers hosting the model now (one if none is live)."""
        return self.fit.capacity_rps * max(self.num_workers, 1) if self.fit else None

    @property
    def load_percent(self) -> float | None:
        capacity = self.capacity_rps
        return 100 * self.load_rps / capacity if capacity else None

    @property
    def level(self) -> str:
        percent = self.load_percent
        if percent is None:
            return "unknown"
        return "over" if percent >= 100 else "high" if percent >= 80 else "ok"


def capacity_overview(*, runtime: Runtime, now: datetime | None = None) -> list[CapacityRow]:
    """Every model with a plan or with load on the local pool in the window."""
    now = now or timezone.now()
    local = {
        "local",
        *Backend.objects.filter(kind=BackendKind.LOCAL).values_list("name", flat=True),
    }
    counts = dict(
        UsageRecord.objects.filter(
            created_at__gte=now - timedelta(minutes=LOAD_MINUTES), backend__in=local
        )
        .exclude(model="")
        .values_list("model")
        .annotate(n=Count("id"))
        .values_list("model", "n")
    )
    fits = {f.model: f for f in CapacityFit.objects.all()}
    hosting: dict[str, int] = {}
    for worker in runtime.pool.worker_states():
        for model in worker.engines:
            hosting[model] = hosting.get(model, 0) + 1
    return [
        CapacityRow(
            model=name,
            load_rps=counts.get(name, 0) / (LOAD_MINUTES * 60),
            num_workers=hosting.get(name, 0),
            fit=fits.get(name),
        )
        for name in sorted(set(fits) | set(counts))
    ]
