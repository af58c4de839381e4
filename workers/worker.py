"""A GPU worker's life: load its models at start, take requests from the fair queue while its
engines have room (workers/pulling.py), advertise what it hosts and how loaded it is in a
Redis heartbeat that also renews its claims on the requests it runs, hear cancellations, and
drain on shutdown.

A GPU worker is a Celery worker consuming the `gpu` queue (`make worker`, or
`PYTHONPATH=.:platform celery -A celery_app worker -Q gpu,default -P threads -c 4`); its
requests come from the fair queue, not from Celery's broker, and every request it runs shares
its engine's continuous batches. platform/celery_app.py starts and stops it with the process's
runtime.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time

import redis
from django.conf import settings
from django.db import close_old_connections

from tenants.loops import BackgroundLoop
from workers.host import EngineHost, ModelLoadFailed, engine_key
from workers.pools import heartbeat_delete, heartbeat_write
from workers.pulling import Puller
from workers.serving.catalog import model_list_enabled
from workers.serving.runtime import Runtime
from workers.serving.versions import versions_of
from workers.transport import CANCEL_CHANNEL, cancel_key

logger = logging.getLogger(__name__)

WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"


def worker_models() -> list:
    """The enabled models this worker serves (FAIRLANE_WORKER_MODELS, or all of them)."""
    wanted = set(settings.FAIRLANE_WORKER_MODELS)
    try:
        return [info for info in model_list_enabled() if not wanted or info.name in wanted]
    finally:
        close_old_connections()


def heartbeat_payload(host: EngineHost, puller: Puller) -> dict:
    return {
        "id": WORKER_ID,
        "models": host.hosted(),
        "failed": host.failed(),
        "stats": host.stats(),
        "versions": host.hosted_versions(),
        "running": puller.in_flight(),
        "capacity": puller.capacity,
        "ts": time.time(),
    }


class WorkerServices:
    """The worker's background loops: the heartbeat (which also renews its claims and serves
    the models the registry has now) and the cancel listener."""

    def __init__(self, runtime: Runtime, puller: Puller) -> None:
        self.runtime, self.puller = runtime, puller
        self.host: EngineHost = runtime.engine_host
        self.client = runtime.shared_redis
        self.heartbeat = BackgroundLoop(
            "worker-heartbeat", self.beat, interval=lambda: settings.FAIRLANE_HEARTBEAT_SECONDS
        )
        self.cancels = BackgroundLoop("worker-cancels", self._cancels_hear, interval=lambda: 1.0)
        self._pubsub: redis.client.PubSub | None = None

    def start(self) -> None:
        self.heartbeat.start()
        self.cancels.start()

    def stop(self) -> None:
        self.cancels.stop()
        self.heartbeat.stop()
        heartbeat_delete(self.client, WORKER_ID)

    def beat(self) -> None:
        models = worker_models()
        self.puller.serve(models)
        # Versions swapped out, rolled back or disabled: dropped once idle. API processes
        # may route to them for as long as they keep their registry snapshot, and a second.
        self.host.retire_unwanted(
            {engine_key(v) for info in models for v in versions_of(info)},
            grace=settings.FAIRLANE_ROUTING_CACHE_SECONDS + 1.0,
        )
        heartbeat_write(
            self.client,
            WORKER_ID,
            json.dumps(heartbeat_payload(self.host, self.puller)),
            settings.FAIRLANE_HEARTBEAT_TTL_SECONDS,
        )
        self.puller.renew_claims()
        self._cancels_sweep()

    def _cancels_sweep(self) -> None:
        """Pub/sub delivers at most once: a cancellation published while the listener was
        reconnecting is lost. Its key stays (`cancel_request`), so each beat looks up the keys
        of the runs here and aborts those whose client has left."""
        running = self.host.runs.running()
        if not running:
            return
        pipe = self.client.pipeline(transaction=False)
        for request_id in running:
            pipe.exists(cancel_key(request_id))
        for request_id, is_cancelled in zip(running, pipe.execute(), strict=True):
            if is_cancelled:
                logger.info("request %s: cancelled (its key; the message was missed)", request_id)
                self.host.runs.cancel(request_id)

    def _cancels_hear(self) -> float:
        """Wait up to a second for a cancellation; a Redis failure is logged by the loop,
        which reconnects a second later."""
        pubsub = self._pubsub
        if pubsub is None:
            pubsub = self._pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            pubsub.subscribe(CANCEL_CHANNEL)
        try:
            message = pubsub.get_message(timeout=1.0)
        except Exception:
            self._pubsub = None
            raise
        # Redis pub/sub's own message kinds, not request events.
        if message and message.get("type") == "message":
            self.host.runs.cancel(message["data"].decode())
        return 0.0


def worker_services_start(runtime: Runtime) -> WorkerServices:
    """Load this worker's models, then pull and heartbeat (a Celery GPU worker at start-up,
    platform/celery_app.py; `bench hops --distributed` in its own process)."""
    host = runtime.engine_host
    for info in worker_models():
        if info.runtime == "vllm":  # its pull thread starts the child: a start can take
            continue  # minutes, and the other models need not wait for it
        for version in versions_of(info):
            try:
                host.load(version)
            except ModelLoadFailed:  # logged (refusals counted); the other models still
                pass  # load, and its pull thread retries it with a backoff
    services = WorkerServices(
        runtime, Puller(runtime, WORKER_ID, settings.FAIRLANE_WORKER_CONCURRENCY)
    )
    services.beat()
    services.start()
    logger.info("worker %s hosts %s", WORKER_ID, host.hosted())
    return services


def worker_services_stop(runtime: Runtime, services: WorkerServices | None) -> None:
    """Warm shutdown: stop taking requests, let the running ones finish (heartbeats keep
    renewing their claims meanwhile), then stop."""
    if services is not None:
        services.puller.stop(drain_timeout=settings.FAIRLANE_DRAIN_TIMEOUT_SECONDS)
        services.stop()
    runtime.stop()


def consumes_gpu_queue(consumer) -> bool:
    """Whether a Celery worker consumes the GPU queue (else it only runs housekeeping and
    hosts no engine)."""
    queues = consumer.app.amqp.queues
    return settings.FAIRLANE_GPU_QUEUE in set(queues.consume_from or queues)
