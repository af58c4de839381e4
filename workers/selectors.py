"""Reads of the GPU pool's live state for operators: the fair queues (depth per lane and
tenant, oldest wait, dispatch rate), the workers (what each hosts, its engines' load, its
heartbeat's age, models it failed to load) and each model's load and verification state.

Distributed: the fair queues and the heartbeats in Redis. Embedded: this process's engines
and their own queue."""

from __future__ import annotations

from dataclasses import dataclass, field

from workers.artifacts.models import ModelVerification
from workers.models import ServedModel
from workers.modes import mode_get


@dataclass(frozen=True, slots=True)
class LaneState:
    lane: str
    depth: int
    oldest_wait_seconds: float | None  # None: nothing waits, or not known (embedded)
    tenants: dict[str, int]  # tenant id (as the queue keeps it) -> requests waiting


@dataclass(frozen=True, slots=True)
class QueueState:
    model: str
    lanes: tuple[LaneState, ...]
    dispatch_rate: float  # requests taken per second over the last RATE_SECONDS
    claimed: int  # taken by a worker, not finished (distributed)

    @property
    def depth(self) -> int:
        return sum(lane.depth for lane in self.lanes)


def lane_state_redis(queue, lane: str, now_ms: int) -> LaneState:
    """One lane of a model's fair queue; its oldest wait is the earliest enqueue time among
    the heads of its tenants' queues (each tenant's queue is in arrival order)."""
    client, prefix = queue.client, queue.prefix
    tenants = {k.decode(): int(v) for k, v in
               client.hgetall(prefix + f"tdepth:{lane}").items() if int(v) > 0}
    pipe = client.pipeline(transaction=False)
    for tenant in tenants:
        pipe.lindex(prefix + f"q:{lane}:{tenant}", 0)
    heads = [head.decode() for head in pipe.execute() if head]
    for head in heads:
        pipe.hget(prefix + f"meta:{head}", "enq")
    enqueued = [int(v) for v in pipe.execute() if v is not None]
    oldest = (now_ms - min(enqueued)) / 1000 if enqueued else None
    return LaneState(lane, queue.depth(lane), oldest, tenants)


def queue_states() -> list[QueueState]:
    """Every enabled model's queue."""
    from workers.registry import model_list_enabled

    return mode_get().queue_states([info.name for info in model_list_enabled()])


@dataclass(frozen=True, slots=True)
class WorkerState:
    id: str
    heartbeat_age_seconds: float
    running: int  # requests it runs now
    capacity: int
    engines: dict[str, dict]  # model -> the engine's figures (running, waiting, KV blocks...)
    failed: dict[str, dict] = field(default_factory=dict)  # model -> why its load failed


def worker_states() -> list[WorkerState]:
    """The live workers (their heartbeats); in the embedded mode, this process."""
    return mode_get().worker_states()


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


def model_states(*, workers: list[WorkerState] | None = None) -> list[ModelState]:
    """Every registered model: who hosts it, who failed to load it and why, and what each
    worker's last verification of its files found."""
    workers = worker_states() if workers is None else workers
    checks: dict[int, list[ModelVerification]] = {}
    for check in ModelVerification.objects.order_by("worker"):
        checks.setdefault(check.model_id, []).append(check)
    return [ModelState(row.name, row.is_enabled,
                       tuple(w.id for w in workers if row.name in w.engines),
                       {w.id: str(w.failed[row.name].get("error", "")) for w in workers
                        if row.name in w.failed},
                       tuple(checks.get(row.pk, ())))
            for row in ServedModel.objects.order_by("name")]
