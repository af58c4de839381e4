"""A GPU worker's life: load its models at start, take requests from the fair queue while its
engines have room (workers/pulling.py), advertise what it hosts and how loaded it is in a
Redis heartbeat that also renews its claims on the requests it runs, hear cancellations, and drain on shutdown.

A GPU worker is a Celery worker consuming the `gpu` queue (`make worker`, or
`PYTHONPATH=.:platform celery -A celery_app worker -Q gpu,default -P threads -c 4`); its
requests come from the fair queue, not from Celery's broker, and every request it runs shares
its engine's continuous batches.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time

from celery import signals
from django.conf import settings
from django.db import close_old_connections

from workers.host import ModelLoadFailed, engine_key, host_get
from workers.pulling import Puller
from workers.registry import model_list_enabled
from workers.runs import generation_cancel
from workers.transport import CANCEL_CHANNEL, redis_sync
from workers.versions import versions_of

logger = logging.getLogger(__name__)

WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"
HEARTBEAT_PREFIX = "fl:worker:"


def worker_models() -> list:
    """The enabled models this worker serves (FAIRLANE_WORKER_MODELS, or all of them)."""
    wanted = set(settings.FAIRLANE_WORKER_MODELS)
    try:
        return [info for info in model_list_enabled() if not wanted or info.name in wanted]
    finally:
        close_old_connections()


def heartbeat_payload(puller: Puller) -> dict:
    host = host_get()
    return {"id": WORKER_ID, "models": host.hosted(), "failed": host.failed(),
            "stats": host.stats(), "versions": host.hosted_versions(),
            "running": puller.in_flight(), "capacity": puller.capacity, "ts": time.time()}


class WorkerServices:
    """The worker's background threads: heartbeat (and run-lock refresh) and cancel listener."""

    def __init__(self, puller: Puller) -> None:
        self.puller = puller
        self.client = redis_sync()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for target in (self._heartbeat_loop, self._cancel_loop):
            thread = threading.Thread(target=target, name=target.__name__, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        self.client.delete(HEARTBEAT_PREFIX + WORKER_ID)

    def beat(self) -> None:
        models = worker_models()
        self.puller.serve(models)
        # Versions swapped out, rolled back or disabled: dropped once drained. API processes
        # may route to them for as long as they keep their registry snapshot, and a second.
        host_get().retire_unwanted({engine_key(v) for info in models for v in versions_of(info)},
                                   grace=settings.FAIRLANE_ROUTING_CACHE_SECONDS + 1.0)
        self.client.set(HEARTBEAT_PREFIX + WORKER_ID, json.dumps(heartbeat_payload(self.puller)),
                        ex=settings.FAIRLANE_HEARTBEAT_TTL_SECONDS)
        self.puller.renew_claims()

    def _heartbeat_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.beat()
            except Exception:  # a thread boundary: Redis hiccups must not kill the heartbeat
                logger.exception("heartbeat failed")
            self._stop.wait(settings.FAIRLANE_HEARTBEAT_SECONDS)

    def _cancel_loop(self) -> None:
        while not self._stop.is_set():
            try:
                pubsub = self.client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(CANCEL_CHANNEL)
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=1.0)
                    # Redis pub/sub's own message kinds, not request events.
                    if message and message.get("type") == "message":
                        generation_cancel(message["data"].decode())
            except Exception:  # reconnect after Redis trouble
                logger.exception("cancel listener failed; reconnecting")
                self._stop.wait(1.0)


_services: WorkerServices | None = None


def _consumes_gpu_queue(consumer) -> bool:
    queues = consumer.app.amqp.queues
    return settings.FAIRLANE_GPU_QUEUE in set(queues.consume_from or queues)


@signals.worker_ready.connect
def worker_start(sender=None, **kwargs) -> None:
    """Load the worker's models before it advertises them, then start heartbeating. Workers
    that only run housekeeping (the default queue) host no engine."""
    global _services
    if sender is None or not _consumes_gpu_queue(sender):
        return
    _services = worker_services_start()


def worker_services_start() -> WorkerServices:
    """Load this worker's models, then pull and heartbeat (a Celery GPU worker at start-up;
    `bench hops --distributed` in its own process)."""
    for info in worker_models():
        if info.runtime == "vllm":  # its pull thread starts the child: a start can take
            continue                # minutes, and the other models need not wait for it
        for version in versions_of(info):
            try:
                host_get().load(version)
            except ModelLoadFailed:  # logged (refusals counted); the other models still
                pass                 # load, and its pull thread retries it with a backoff
    services = WorkerServices(Puller(WORKER_ID, settings.FAIRLANE_WORKER_CONCURRENCY))
    services.beat()
    services.start()
    logger.info("worker %s hosts %s", WORKER_ID, host_get().hosted())
    return services


@signals.worker_shutdown.connect
def worker_stop(sender=None, **kwargs) -> None:
    """Warm shutdown: stop taking requests, let the running ones finish (heartbeats keep
    renewing their claims meanwhile), then stop."""
    if _services is not None:
        _services.puller.stop(drain_timeout=settings.FAIRLANE_DRAIN_TIMEOUT_SECONDS)
        _services.stop()
    host_get().shutdown()


def workers_live() -> list[dict]:
    """Heartbeats of the workers alive now (each expires unless renewed)."""
    client = redis_sync()
    keys = list(client.scan_iter(match=HEARTBEAT_PREFIX + "*", count=100))
    return [json.loads(raw) for raw in client.mget(keys) if raw] if keys else []
