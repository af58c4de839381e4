"""What the local engine pool reports, in either mode (workers/pools.py makes these): how
loaded a model's queue is for admission, and the operators' view of queues and workers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Load:
    """How loaded a model's queue is, as admission sees it."""

    lane_depth: int
    tenant_depth: int
    total_depth: int
    dispatch_rate: float  # requests per second


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


@dataclass(frozen=True, slots=True)
class WorkerState:
    id: str
    heartbeat_age_seconds: float
    running: int  # requests it runs now
    capacity: int
    engines: dict[
        str, dict[str, Any]
    ]  # model -> the engine's figures (running, waiting, KV blocks...)
    failed: dict[str, dict[str, Any]] = field(default_factory=dict)  # model -> why its load failed
