"""The runtime's view of the local engine pool (workers/serving/runtime.py `Pool`): which
models are hosted and which failed to load, the queue load admission reads, the pool's health,
the engine figures and fair-queue depths for Prometheus, the operators' view of queues and
workers, and where refused model loads are counted.

- Embedded: this process's engines and their own queue (workers/fairqueue/local.py).
- Distributed: the GPU workers' heartbeats and the Redis fair queues.
"""

from __future__ import annotations

import collections
import fnmatch
import json
import math
import threading
import time

import redis
from django.conf import settings

from tenants.models import Lane
from tenants.presence import Presence
from workers.fairqueue.local import LocalQueue
from workers.host import EngineHost
from workers.models import ServedModel
from workers.serving.catalog import model_list_enabled
from workers.serving.pool import LaneState, Load, QueueState, WorkerState
from workers.transport import queue_for

RATE_SECONDS = 10
VERIFY_FAILURES_KEY = "fl:model_verify_failures"
HEARTBEAT_PREFIX = "fl:worker:"
# The deployment's workers (tenants/presence.py): read by the API processes every second, so a
# list and one MGET, never a SCAN of the keyspace.
WORKERS_KEY = "fl:workers"
WORKERS = Presence(index=WORKERS_KEY, prefix=HEARTBEAT_PREFIX)
# Every namespace whose workers beat on this Redis (name -> last beat, ms), for a view across
# deployments (`workers_live(namespace=...)`); not namespaced itself.
NAMESPACES_KEY = "fl:namespaces"
NAMESPACE_KEPT_MS = 86_400_000


def heartbeat_key(worker_id: str) -> str:
    """A worker's heartbeat, under the deployment's FAIRLANE_QUEUE_NAMESPACE: deployments that
    share a Redis do not see each other's workers."""
    return WORKERS.key(worker_id)


def heartbeat_write(client: redis.Redis, worker_id: str, payload: str, ttl_seconds: int) -> None:
    """A worker's heartbeat, alive for `ttl_seconds` unless written again, and its place in
    its deployment's list of workers."""
    now_ms = int(time.time() * 1000)
    pipe = client.pipeline(transaction=False)
    WORKERS.write(pipe, worker_id, payload, ttl_seconds, now_ms=now_ms)
    pipe.zadd(NAMESPACES_KEY, {settings.FAIRLANE_QUEUE_NAMESPACE: now_ms})
    pipe.zremrangebyscore(NAMESPACES_KEY, "-inf", now_ms - NAMESPACE_KEPT_MS)
    pipe.execute()


def heartbeat_delete(client: redis.Redis, worker_id: str) -> None:
    """A worker that stops: gone from its deployment's list at once."""
    WORKERS.withdraw(client, worker_id)


def workers_live(client: redis.Redis, *, namespace: str | None = None) -> list[dict]:
    """Heartbeats of this deployment's GPU workers alive now (each expires unless renewed);
    `namespace` another deployment's (a glob: `*` for every deployment's)."""
    namespaces = None
    if namespace is not None:
        namespaces = [
            name
            for name in (m.decode() for m in client.zrangebyscore(NAMESPACES_KEY, 0, "+inf"))
            if fnmatch.fnmatchcase(name, namespace)
        ]
    return [json.loads(raw) for raw in WORKERS.read(client, namespaces)]


def lane_state_redis(queue, lane: str, now_ms: int) -> LaneState:
    """One lane of a model's fair queue; its oldest wait is the earliest enqueue time among
    the heads of its tenants' queues (each tenant's queue is in arrival order)."""
    client, prefix = queue.client, queue.prefix
    tenants = {
        k.decode(): int(v)
        for k, v in client.hgetall(prefix + f"tdepth:{lane}").items()
        if int(v) > 0
    }
    pipe = client.pipeline(transaction=False)
    for tenant in tenants:
        pipe.lindex(prefix + f"q:{lane}:{tenant}", 0)
    heads = [head.decode() for head in pipe.execute() if head]
    for head in heads:
        pipe.hget(prefix + f"meta:{head}", "enq")
    enqueued = [int(v) for v in pipe.execute() if v is not None]
    oldest = (now_ms - min(enqueued)) / 1000 if enqueued else None
    return LaneState(lane, queue.depth(lane), oldest, tenants)


class EmbeddedPool:
    """Engines in this process, on a background thread; their own queue admits."""

    node = "embedded"

    def __init__(self, *, local_queue: LocalQueue) -> None:
        self.local_queue = local_queue
        self._host: EngineHost | None = None  # attached once made (it counts refusals here)
        # Refused loads: this process is the only one that loads.
        self._verify_failures: collections.Counter[tuple[str, str]] = collections.Counter()
        self._verify_lock = threading.Lock()

    @property
    def host(self) -> EngineHost:
        if self._host is None:
            raise RuntimeError("The pool's engine host is not attached.")
        return self._host

    def host_attach(self, host: EngineHost) -> None:
        self._host = host

    def model_hosted(self, model: str) -> bool:
        return True  # loaded here on first use

    def model_load_failed(self, model: str) -> float | None:
        failure = self.host.failed().get(model)
        return failure["retry_in"] if failure else None

    def load_read(self, *, model: str, lane: str, tenant: str) -> Load:
        return Load(
            lane_depth=self.local_queue.depth(model=model, lane=lane),
            tenant_depth=self.local_queue.depth(model=model, lane=lane, tenant=tenant),
            total_depth=self.local_queue.depth(model=model),
            dispatch_rate=self.local_queue.dispatch_rate(model=model),
        )

    def pool_probe(self) -> tuple[bool, str]:
        return True, ""

    def engine_stats(self) -> dict[tuple[str, str], dict]:
        return {("embedded", model): stats for model, stats in self.host.stats().items()}

    def queue_depths(self) -> dict[tuple[str, str], int]:
        return {}  # no fair queue: what waits is in the engines' num_waiting

    def queue_states(self, models: list[str]) -> list[QueueState]:
        waiting = self.local_queue.waiting()

        def lane_state(model: str, lane: str) -> LaneState:
            tenants = {t: n for (m, la, t), n in waiting.items() if m == model and la == lane}
            return LaneState(lane, sum(tenants.values()), None, tenants)

        return [
            QueueState(
                model,
                tuple(lane_state(model, lane) for lane in Lane.values),
                self.local_queue.dispatch_rate(model=model, seconds=RATE_SECONDS),
                0,
            )
            for model in models
        ]

    def worker_states(self) -> list[WorkerState]:
        host = self.host
        stats = host.stats()
        running = sum(int(s.get("num_running", 0)) for s in stats.values())
        return [
            WorkerState(
                "embedded",
                0.0,
                running,
                settings.FAIRLANE_ENGINE_MAX_NUM_SEQS,
                stats,
                host.failed(),
            )
        ]

    def verify_failure_count(self, *, model: str, reason: str) -> None:
        with self._verify_lock:
            self._verify_failures[(model, reason)] += 1

    def verify_failures(self) -> dict[tuple[str, str], int]:
        with self._verify_lock:
            return dict(self._verify_failures)


class DistributedPool:
    """GPU workers take requests from each model's fair queue in Redis and advertise what they
    host (and failed to load) in their heartbeats."""

    node = "celery"  # loads happen on GPU workers, Celery nodes named celery@<host>

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._heartbeats: tuple[float, set[str], dict[str, float]] = (0.0, set(), {})

    def _pool_state(self) -> tuple[set[str], dict[str, float]]:
        """Models live GPU workers host, and those that failed to load there (seconds until
        the next attempt), from their heartbeats, read at most once a second."""
        checked, hosted, failed = self._heartbeats
        if time.monotonic() - checked > 1.0:
            try:
                beats = workers_live(self.client)
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
        queue = queue_for(self.client, model)
        return Load(
            lane_depth=queue.depth(lane),
            tenant_depth=queue.depth(lane, tenant),
            total_depth=queue.depth(),
            dispatch_rate=queue.dispatch_rate(),
        )

    def pool_probe(self) -> tuple[bool, str]:
        models = set(ServedModel.objects.filter(is_enabled=True).values_list("name", flat=True))
        hosted = {name for beat in workers_live(self.client) for name in beat["models"]}
        if hosted & models:
            return True, ""
        return False, "no live GPU worker hosts a registered model"

    def engine_stats(self) -> dict[tuple[str, str], dict]:
        return {
            (beat["id"], model): stats
            for beat in workers_live(self.client)
            for model, stats in beat.get("stats", {}).items()
        }

    def queue_depths(self) -> dict[tuple[str, str], int]:
        """Every enabled model, zeros included, so a scaler sees 0 rather than no series."""
        client = self.client
        depths = {}
        for info in model_list_enabled():
            by_lane = {
                k.decode(): int(v)
                for k, v in client.hgetall(queue_for(client, info.name).prefix + "depth").items()
            }
            depths.update({(info.name, lane): by_lane.get(lane, 0) for lane in Lane.values})
        return depths

    def queue_states(self, models: list[str]) -> list[QueueState]:
        client, now_ms = self.client, int(time.time() * 1000)
        states = []
        for model in models:
            queue = queue_for(client, model)
            states.append(
                QueueState(
                    model,
                    tuple(lane_state_redis(queue, lane, now_ms) for lane in Lane.values),
                    queue.dispatch_rate(RATE_SECONDS),
                    queue.claimed(),
                )
            )
        return states

    def worker_states(self) -> list[WorkerState]:
        now = time.time()
        return sorted(
            (
                WorkerState(
                    beat["id"],
                    max(now - beat.get("ts", now), 0.0),
                    int(beat.get("running", 0)),
                    int(beat.get("capacity", 0)),
                    beat.get("stats", {}),
                    beat.get("failed", {}),
                )
                for beat in workers_live(self.client)
            ),
            key=lambda w: w.id,
        )

    def verify_failure_count(self, *, model: str, reason: str) -> None:
        """GPU workers keep the count in Redis, which the API's /metrics reads."""
        self.client.hincrby(
            settings.FAIRLANE_QUEUE_NAMESPACE + VERIFY_FAILURES_KEY, f"{model}\x1f{reason}", 1
        )

    def verify_failures(self) -> dict[tuple[str, str], int]:
        raw = self.client.hgetall(settings.FAIRLANE_QUEUE_NAMESPACE + VERIFY_FAILURES_KEY)
        return {tuple(k.decode().split("\x1f", 1)): int(v) for k, v in raw.items()}
