"""The runtime: every part of a process that differs between the two ways Fairlane runs,
built once at start-up from FAIRLANE_ENGINE_MODE (routing/runtimes.py) and handed to what
needs it: the request's handler puts it on the request (`request.runtime`, a websocket's
`scope["runtime"]`), services and the walk receive it as an argument, a GPU worker and the
Celery tasks get it from their process's start-up, commands build it. Nothing below asks
which mode it is in; tests build the runtime they need.

| part | embedded | distributed |
| --- | --- | --- |
| dispatcher | this process's engines | the Redis fair queue, events on Redis streams |
| pool | this process's engines and its own queue | the GPU workers' heartbeats, the fair queues |
| limiter, leases | in-process | Redis scripts |
| outbox | files | a Redis stream (files when Redis fails too) |
| counters | in-process | added to Redis hashes by a loop |
| cache invalidations | this process only | published and heard over Redis |
| alert sender | a loop of this process (and the sweep) | a Celery task per delivery |
| engine host | this process's | the GPU worker's (none in an API process) |

The protocols below are what routing and the workers call; the classes that implement them
live with their owners (workers/dispatch.py, workers/pools.py, routing/ratelimit.py, ...).
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from redis import Redis

from tenants.loops import LoopGroup
from workers.serving.events import Event
from workers.serving.jobs import Job
from workers.serving.outbox import Outbox
from workers.serving.pool import Load, QueueState, WorkerState


class Mode(StrEnum):
    EMBEDDED = "embedded"
    DISTRIBUTED = "distributed"


class Dispatcher(Protocol):
    """Runs a local-engine request and yields its events."""

    def events(self, job: Job) -> AsyncGenerator[Event, None]: ...
    def cancel(self, request_id: str) -> None: ...


class Pool(Protocol):
    """The local engine pool as the request path and the operators see it."""

    node: str  # what this mode's model loads are recorded under, before "@<host>"

    def model_hosted(self, model: str) -> bool: ...
    def model_load_failed(self, model: str) -> float | None: ...
    def load_read(self, *, model: str, lane: str, tenant: str) -> Load: ...
    def pool_probe(self) -> tuple[bool, str]: ...
    def engine_stats(self) -> dict[tuple[str, str], dict[str, Any]]: ...
    def queue_depths(self) -> dict[tuple[str, str], int]: ...
    def queue_states(self, models: list[str]) -> list[QueueState]: ...
    def worker_states(self) -> list[WorkerState]: ...
    def verify_failure_count(self, *, model: str, reason: str) -> None: ...
    def verify_failures(self) -> dict[tuple[str, str], int]: ...


class Limiter(Protocol):
    def acquire(self, *, request_id: str, scopes: tuple[Any, ...], tokens: int) -> Any: ...
    def release(self, admitted: Any, *, tokens_used: int) -> None: ...


class Leases(Protocol):
    def try_acquire(
        self, backend: str, holder: str, *, ttl: float, slots: int, depth: int, wait: float
    ) -> int: ...
    def renew(self, backend: str, holder: str, *, ttl: float) -> bool: ...
    def release(self, backend: str, holder: str) -> None: ...
    def holders(self, backend: str) -> list[str]: ...


class Reservations(Protocol):
    """The budget reservations of the requests this process serves, renewed while they run."""

    def add(self, request_id: str) -> None: ...
    def discard(self, request_id: str) -> None: ...


@dataclass(frozen=True)
class Runtime:
    mode: Mode
    redis: Redis | None  # the process's one client (None: no Redis, the embedded mode)
    dispatcher: Dispatcher
    pool: Pool
    limiter: Limiter
    leases: Leases
    outbox: Outbox
    counters: Any  # tenants.counters.CountsFlusher
    cache_listener: Any  # tenants.cache.CacheListener
    alert_sender: Any  # tenants.services.alerts: EmbeddedAlertSender | CeleryAlertSender
    reservations: Reservations
    breaker_publisher: Any  # routing.ops.processes.BreakerPublisher
    engine_host: Any = None  # workers.host.EngineHost, where engines run in this process
    loops: LoopGroup = field(default_factory=LoopGroup)
    _connected: threading.Event = field(default_factory=threading.Event, repr=False)
    _serving: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def is_distributed(self) -> bool:
        return self.mode == Mode.DISTRIBUTED

    @property
    def shared_redis(self) -> Redis:
        """The Redis client, for the parts that exist only where processes share state (the
        GPU worker's)."""
        if self.redis is None:
            raise RuntimeError("This needs REDIS_URL: processes share their state on Redis.")
        return self.redis

    def connect(self) -> None:
        """Hook the parts to the apps' signals (rows changed, deliveries created): the
        installed runtime's parts hear them, once."""
        if not self._connected.is_set():
            self._connected.set()
            for part in (self.cache_listener, self.alert_sender, self.counters):
                part.connect()

    def disconnect(self) -> None:
        if self._connected.is_set():
            self._connected.clear()
            for part in (self.cache_listener, self.alert_sender, self.counters):
                part.disconnect()

    def start(self, *, serve: bool = False) -> Runtime:
        """Connect the parts (see `connect`). `serve`: a serving process (the ASGI server, a
        Celery worker) also starts every loop now, and stops them at exit; elsewhere (a
        command, a test) a loop starts with its first work."""
        self.connect()
        if serve and not self._serving.is_set():
            self._serving.set()
            self.loops.start()
            atexit.register(self.stop)
        return self

    def stop(self) -> None:
        """Stop every loop in order (each ends with a last flush), then the engines."""
        self.loops.stop()
        self.disconnect()
        if self.engine_host is not None:
            self.engine_host.shutdown()
