"""Where the engines run, chosen once at start-up from FAIRLANE_ENGINE_MODE: in this process
(embedded) or on GPU workers behind the Redis fair queue (distributed; "celery" is its former
name, still accepted). Everything that differs between the two lives here, behind one interface;
routing and the rest of workers ask `mode_get()` and never test the setting themselves.

- dispatcher: runs a request and yields its events (workers/transport).
- which models are hosted, and which failed to load: this process's engines, or the workers'
  heartbeats.
- queue load for admission: the engine's own queue, or the model's fair queue.
- the local pool's health, the engine figures and fair-queue depths for Prometheus, the
  operators' view of queues and workers, and where refused model loads are counted.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import redis
from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from tenants.models import Lane
from workers.fairqueue.local import local_queue
from workers.host import host_get
from workers.transport import EmbeddedDispatcher, QueueDispatcher, queue_for, redis_sync
from workers.worker import workers_live

RATE_SECONDS = 10
VERIFY_FAILURES_KEY = "fl:model_verify_failures"


@dataclass(frozen=True, slots=True)
class Load:
    """How loaded a model's queue is, as admission sees it."""

    lane_depth: int
    tenant_depth: int
    total_depth: int
    drain_rate: float  # requests per second


class Mode(Protocol):
    name: str  # "embedded" or "distributed"
    node: str  # what this process's model loads are recorded under, before "@<host>"
    dispatcher: EmbeddedDispatcher | QueueDispatcher

    def model_hosted(self, model: str) -> bool: ...
    def model_load_failed(self, model: str) -> float | None: ...
    def load_read(self, *, model: str, lane: str, tenant: str) -> Load: ...
    def pool_probe(self) -> tuple[bool, str]: ...
    def engine_stats(self) -> dict[tuple[str, str], dict]: ...
    def queue_depths(self) -> dict[tuple[str, str], int]: ...
    def queue_states(self, models: list[str]) -> list: ...
    def worker_states(self) -> list: ...
    def verify_failure_count(self, *, model: str, reason: str) -> None: ...
    def verify_failures(self) -> dict[tuple[str, str], int]: ...


# Refused loads in the embedded mode: this process is the only one that loads.
_verify_failures: collections.Counter[tuple[str, str]] = collections.Counter()
_verify_lock = threading.Lock()


class EmbeddedMode:
    """Engines in this process, on a background thread; their own queue admits."""

    name = node = "embedded"

    def __init__(self) -> None:
        self.dispatcher = EmbeddedDispatcher()

    def model_hosted(self, model: str) -> bool:
        return True  # loaded here on first use

    def model_load_failed(self, model: str) -> float | None:
        failure = host_get().failed().get(model)
        return failure["retry_in"] if failure else None

    def load_read(self, *, model: str, lane: str, tenant: str) -> Load:
        return Load(lane_depth=local_queue.depth(model=model, lane=lane),
                    tenant_depth=local_queue.depth(model=model, lane=lane, tenant=tenant),
                    total_depth=local_queue.depth(model=model),
                    drain_rate=local_queue.drain_rate(model=model))

    def pool_probe(self) -> tuple[bool, str]:
        return True, ""

    def engine_stats(self) -> dict[tuple[str, str], dict]:
        return {("embedded", model): stats for model, stats in host_get().stats().items()}

    def queue_depths(self) -> dict[tuple[str, str], int]:
        return {}  # no fair queue: what waits is in the engines' num_waiting

    def queue_states(self, models: list[str]) -> list:
        from workers.selectors import LaneState, QueueState

        waiting = local_queue.waiting()

        def lane_state(model: str, lane: str) -> LaneState:
            tenants = {t: n for (m, la, t), n in waiting.items() if m == model and la == lane}
            return LaneState(lane, sum(tenants.values()), None, tenants)

        return [QueueState(model, tuple(lane_state(model, lane) for lane in Lane.values),
                           local_queue.drain_rate(model=model, seconds=RATE_SECONDS), 0)
                for model in models]

    def worker_states(self) -> list:
        from workers.selectors import WorkerState

        host = host_get()
        stats = host.stats()
        running = sum(int(s.get("num_running", 0)) for s in stats.values())
        return [WorkerState("embedded", 0.0, running, settings.FAIRLANE_ENGINE_MAX_NUM_SEQS,
                            stats, host.failed())]

    def verify_failure_count(self, *, model: str, reason: str) -> None:
        with _verify_lock:
            _verify_failures[(model, reason)] += 1

    def verify_failures(self) -> dict[tuple[str, str], int]:
        with _verify_lock:
            return dict(_verify_failures)


class DistributedMode:
    """GPU workers take requests from each model's fair queue in Redis and advertise what they
    host (and failed to load) in their heartbeats."""

    name = "distributed"
    node = "celery"  # loads happen on GPU workers, Celery nodes named celery@<host>

    def __init__(self) -> None:
        self.dispatcher = QueueDispatcher()
        self._heartbeats: tuple[float, set[str], dict[str, float]] = (0.0, set(), {})

    def _pool_state(self) -> tuple[set[str], dict[str, float]]:
        """Models live GPU workers host, and those that failed to load there (seconds until
        the next attempt), from their heartbeats, read at most once a second."""
        checked, hosted, failed = self._heartbeats
        if time.monotonic() - checked > 1.0:
            try:
                beats = workers_live()
            except redis.RedisError:  # unreachable: what was known a moment ago (the queue
                return hosted, failed  # itself then answers 503)
            hosted = {name for beat in beats for name in beat["models"]}
            failed = {}
            for beat in beats:
                for name, failure in (beat.get("failed") or {}).items():
                    failed[name] = min(failed.get(name, math.inf), float(failure["retry_in"]))
            self._heartbeats = (time.monotonic(), hosted, failed)
        return hosted, failed

    def model_hosted(self, model: str) -> bool:
        return model in self._pool_state()[0]

    def model_load_failed(self, model: str) -> float | None:
        hosted, failed = self._pool_state()
        return failed.get(model) if model not in hosted else None

    def load_read(self, *, model: str, lane: str, tenant: str) -> Load:
        """Raises redis.RedisError when the queue is unreachable."""
        queue = queue_for(redis_sync(), model)
        return Load(lane_depth=queue.depth(lane), tenant_depth=queue.depth(lane, tenant),
                    total_depth=queue.depth(), drain_rate=queue.drain_rate())

    def pool_probe(self) -> tuple[bool, str]:
        from workers.models import ServedModel

        models = set(ServedModel.objects.filter(is_enabled=True).values_list("name", flat=True))
        hosted = {name for beat in workers_live() for name in beat["models"]}
        if hosted & models:
            return True, ""
        return False, "no live GPU worker hosts a registered model"

    def engine_stats(self) -> dict[tuple[str, str], dict]:
        return {(beat["id"], model): stats for beat in workers_live()
                for model, stats in beat.get("stats", {}).items()}

    def queue_depths(self) -> dict[tuple[str, str], int]:
        """Every enabled model, zeros included, so a scaler sees 0 rather than no series."""
        from workers.registry import model_list_enabled

        client = redis_sync()
        depths = {}
        for info in model_list_enabled():
            by_lane = {k.decode(): int(v) for k, v in client.hgetall(
                queue_for(client, info.name).prefix + "depth").items()}
            depths.update({(info.name, lane): by_lane.get(lane, 0) for lane in Lane.values})
        return depths

    def queue_states(self, models: list[str]) -> list:
        from workers.selectors import QueueState, lane_state_redis

        client, now_ms = redis_sync(), int(time.time() * 1000)
        states = []
        for model in models:
            queue = queue_for(client, model)
            states.append(QueueState(model, tuple(lane_state_redis(queue, lane, now_ms)
                                                  for lane in Lane.values),
                                     queue.drain_rate(RATE_SECONDS), queue.claimed()))
        return states

    def worker_states(self) -> list:
        from workers.selectors import WorkerState

        now = time.time()
        return sorted((WorkerState(beat["id"], max(now - beat.get("ts", now), 0.0),
                                   int(beat.get("running", 0)), int(beat.get("capacity", 0)),
                                   beat.get("stats", {}), beat.get("failed", {}))
                       for beat in workers_live()), key=lambda w: w.id)

    def verify_failure_count(self, *, model: str, reason: str) -> None:
        """GPU workers keep the count in Redis, which the API's /metrics reads."""
        redis_sync().hincrby(settings.FAIRLANE_QUEUE_NAMESPACE + VERIFY_FAILURES_KEY,
                             f"{model}\x1f{reason}", 1)

    def verify_failures(self) -> dict[tuple[str, str], int]:
        raw = redis_sync().hgetall(settings.FAIRLANE_QUEUE_NAMESPACE + VERIFY_FAILURES_KEY)
        return {tuple(k.decode().split("\x1f", 1)): int(v) for k, v in raw.items()}


MODES: dict[str, Callable[[], Mode]] = {
    "embedded": EmbeddedMode, "distributed": DistributedMode, "celery": DistributedMode}
_mode: Mode | None = None
_mode_lock = threading.Lock()


def mode_get() -> Mode:
    """The mode this process runs in: picked from the settings on first use (the workers app
    does it at start-up) and kept."""
    global _mode
    if _mode is None:
        with _mode_lock:
            if _mode is None:
                _mode = MODES[settings.FAIRLANE_ENGINE_MODE]()
    return _mode


@receiver(setting_changed)
def _mode_reset(*, setting: str, **kwargs) -> None:
    """Tests change the setting (override_settings): pick again on next use."""
    global _mode
    if setting == "FAIRLANE_ENGINE_MODE":
        _mode = None
