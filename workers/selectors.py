"""Reads of the GPU pool's live state for operators: the fair queues (depth per lane and
tenant, oldest wait, dispatch rate), the workers (what each hosts, its engines' load, its
heartbeat's age, models it failed to load) and each model's load and verification state.

Distributed: the fair queues and the heartbeats in Redis. Embedded: this process's engines
and their own queue."""

from __future__ import annotations

from dataclasses import dataclass

from workers.artifacts.models import ModelVerification
from workers.models import ServedModel
from workers.serving.catalog import model_list_enabled
from workers.serving.pool import QueueState, WorkerState
from workers.serving.runtime import Pool


def queue_states(*, pool: Pool) -> list[QueueState]:
    """Every enabled model's queue."""
    return pool.queue_states([info.name for info in model_list_enabled()])


@dataclass(frozen=True, slots=True)
class ModelState:
    name: str
    is_enabled: bool
    hosted_by: tuple[str, ...]  # live workers serving it
    failed_on: dict[str, str]  # worker -> why its load failed
    verifications: tuple[ModelVerification, ...]  # the last check on each worker host

    @property
    def state(self) -> str:
        """serving, failing (some worker could not load it), refused (its files failed
        verification), waiting (no worker hosts it yet) or disabled."""
        if not self.is_enabled:
            return "disabled"
        if self.hosted_by:
            return "failing" if self.failed_on else "serving"
        if any(v.status == ModelVerification.Status.REFUSED for v in self.verifications):
            return "refused"
        return "failing" if self.failed_on else "waiting"


def model_states(*, workers: list[WorkerState]) -> list[ModelState]:
    """Every registered model: who hosts it, who failed to load it and why, and what each
    worker's last verification of its files found."""
    checks: dict[int, list[ModelVerification]] = {}
    for check in ModelVerification.objects.order_by("worker"):
        checks.setdefault(check.model_id, []).append(check)
    return [
        ModelState(
            row.name,
            row.is_enabled,
            tuple(w.id for w in workers if row.name in w.engines),
            {
                w.id: str(w.failed[row.name].get("error", ""))
                for w in workers
                if row.name in w.failed
            },
            tuple(checks.get(row.pk, ())),
        )
        for row in ServedModel.objects.order_by("name")
    ]
