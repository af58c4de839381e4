"""Building the runtime (workers/serving/runtime.py): once per process, at its start-up, from
FAIRLANE_ENGINE_MODE (where the engines run) and REDIS_URL (whether the process shares its
state with the others), with every part of the mode. routing builds it because routing sits on
both other apps: its limiter and leases, workers' dispatcher, pool, engines and outbox,
tenants' counters, cache listener and alert sender.

The process's entry points install the runtime they built and hand it on: the ASGI
application puts it on each request and websocket scope (platform/asgi.py, platform/
middleware.py), a Celery worker on its app for the tasks (platform/celery_app.py), a command
builds one (`RuntimeCommand`). Only those edges call `runtime_installed`; everything below
receives the runtime as an argument.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import redis
import redis.asyncio
from django.conf import settings
from django.core.management.base import BaseCommand
from redis import Redis

from routing.leases import LocalLeases, RedisLeases
from routing.ops.processes import BreakerPublisher
from routing.ratelimit import LocalLimiter, RedisLimiter
from routing.reservations import ReservationRenewer
from tenants.cache import CacheListener
from tenants.counters import CountsFlusher
from tenants.loops import LoopGroup
from tenants.metrics import counts_collector_register
from tenants.services.alerts import CeleryAlertSender, EmbeddedAlertSender, budget_alerts_sweep
from tenants.services.request_logs import RequestLogExpirer
from tenants.tasks import alert_delivery_send
from workers.dispatch import EmbeddedDispatcher, QueueDispatcher
from workers.fairqueue.local import LocalQueue
from workers.host import EngineHost
from workers.metrics import pool_collectors_register
from workers.pools import DistributedPool, EmbeddedPool
from workers.serving.outbox import Outbox
from workers.serving.runtime import Mode, Runtime


def _alert_send(delivery_id: str) -> None:
    alert_delivery_send.apply_async((delivery_id,), ignore_result=True)


def runtime_build(
    mode: str | Mode, *, engines: bool | None = None, redis_url: str | None = None
) -> Runtime:
    """The runtime of `mode` ("embedded" or "distributed"; "celery" is the latter's former
    name): where the engines run. `engines`: host engines in this process (always in the
    embedded mode; a GPU worker in the distributed one). `redis_url` (default REDIS_URL):
    with it, the process shares its rate limits, leases, counts, cache invalidations and
    queued settlements with every other process through Redis, in either mode (several
    embedded API processes share them too); without it, they stay in the process."""
    mode = Mode.DISTRIBUTED if mode == "celery" else Mode(mode)
    url = settings.REDIS_URL if redis_url is None else redis_url
    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5) if url else None
    if mode == Mode.EMBEDDED:
        return _embedded(client)
    if client is None:
        raise RuntimeError("The distributed mode needs REDIS_URL.")
    return _distributed(client, url, engines=bool(engines))


def _embedded(client: Redis | None) -> Runtime:
    local_queue = LocalQueue()
    pool = EmbeddedPool(local_queue=local_queue)
    host = EngineHost(node=pool.node, refusals=pool.verify_failure_count)
    pool.host_attach(host)
    outbox = Outbox(root=settings.FAIRLANE_SETTLEMENT_DIR, client=client)
    return _assembled(
        Mode.EMBEDDED,
        client=client,
        pool=pool,
        engine_host=host,
        outbox=outbox,
        dispatcher=EmbeddedDispatcher(host=host, outbox=outbox, local_queue=local_queue),
        alert_sender=EmbeddedAlertSender(sweep=budget_alerts_sweep),
    )


def _distributed(client: Redis, url: str, *, engines: bool) -> Runtime:
    pool = DistributedPool(client)
    host = EngineHost(node=pool.node, refusals=pool.verify_failure_count) if engines else None
    return _assembled(
        Mode.DISTRIBUTED,
        client=client,
        pool=pool,
        engine_host=host,
        outbox=Outbox(root=settings.FAIRLANE_SETTLEMENT_DIR, client=client),
        dispatcher=QueueDispatcher(client, lambda: redis.asyncio.Redis.from_url(url)),
        alert_sender=CeleryAlertSender(_alert_send),
    )


def _assembled(
    mode: Mode, *, client: Redis | None, alert_sender: Any, outbox: Outbox, **parts: Any
) -> Runtime:
    counters, cache_listener = CountsFlusher(client), CacheListener(client)
    reservations, publisher = ReservationRenewer(), BreakerPublisher(client)
    limiter = RedisLimiter(client) if client is not None else LocalLimiter()
    leases = RedisLeases(client) if client is not None else LocalLeases()
    # Stopped in this order at shutdown: what produces work first, what flushes it last.
    loops = LoopGroup(
        *(
            part.loop
            for part in (publisher, alert_sender, reservations, cache_listener, outbox, counters)
            if part.loop is not None
        )
    )
    if mode == Mode.EMBEDDED:  # no beat here: the server's own thread keeps the retention
        loops.add(RequestLogExpirer().loop)
    return Runtime(
        mode=mode,
        redis=client,
        outbox=outbox,
        counters=counters,
        cache_listener=cache_listener,
        alert_sender=alert_sender,
        reservations=reservations,
        breaker_publisher=publisher,
        loops=loops,
        limiter=limiter,
        leases=leases,
        **parts,
    )


_installed: Runtime | None = None
_lock = threading.Lock()
_building = threading.Lock()


def runtime_install(runtime: Runtime, *, serve: bool = False) -> Runtime:
    """Make `runtime` this process's (its entry points hand it on; the one before it, if any,
    no longer hears the apps' signals), point the metrics collectors at it, and start it
    (`serve`: with every loop, see Runtime.start). Returns it."""
    global _installed
    with _lock:
        previous, _installed = _installed, runtime
    if previous is not None and previous is not runtime:
        previous.disconnect()
    pool_collectors_register(runtime.pool, runtime.redis)
    counts_collector_register(runtime.redis)
    return runtime.start(serve=serve)


def runtime_installed() -> Runtime:
    """The runtime this process's start-up installed; for its entry points only (a request
    handler, a Celery task, a command). A process that installed none (a shell) gets one
    built from the settings, once."""
    installed = _installed
    if installed is None:
        with _building:  # one build, even when two threads ask at once
            if _installed is None:
                runtime_install(runtime_build(settings.FAIRLANE_ENGINE_MODE))
        installed = _installed
        if installed is None:  # uninstalled meanwhile (a test's runtime_using ending)
            raise RuntimeError("No runtime is installed.")
    return installed


@contextlib.contextmanager
def runtime_using(runtime: Runtime) -> Iterator[Runtime]:
    """`runtime` installed for a while, then the one before it again (tests, benchmarks)."""
    global _installed
    previous = _installed
    runtime_install(runtime)
    try:
        yield runtime
    finally:
        if previous is not None:
            runtime_install(previous)
        else:
            runtime.disconnect()
            with _lock:
                _installed = None


def runtime_serve() -> Runtime:
    """A server's start-up (platform/asgi.py): the installed runtime, one built from the
    settings when none is yet, with every loop started."""
    return runtime_installed().start(serve=True)


class RuntimeCommand(BaseCommand):
    """A management command with the process's runtime (`self.runtime`)."""

    def execute(self, *args: Any, **options: Any) -> str | None:
        self.runtime = runtime_installed()
        return super().execute(*args, **options)
