"""A GPU worker's life around its Celery tasks: load its models at start, advertise what it
hosts and how loaded it is in a Redis heartbeat, hear cancellations, and drain on shutdown.

Run one with `make worker` or
`PYTHONPATH=.:platform celery -A celery_app worker -Q gpu -P threads -c 64`: the thread pool
lets every request in flight sit in the one engine's continuous batches (a prefork child per
request would run them one at a time).
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

from workers.generation import generation_cancel, running_request_ids
from workers.host import host_get
from workers.registry import model_list_enabled
from workers.transport import CANCEL_CHANNEL, redis_sync

logger = logging.getLogger(__name__)

WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"
HEARTBEAT_PREFIX = "fl:worker:"


def run_lock_key(request_id: str) -> str:
    return f"fl:run:{request_id}"


def run_lock_take(client, request_id: str) -> bool:
    """Claim a request for this worker. A claim by a worker whose heartbeat has stopped (it
    died holding the request) is taken over; a live worker's claim is respected."""
    key, ttl = run_lock_key(request_id), settings.FAIRLANE_HEARTBEAT_TTL_SECONDS
    if client.set(key, WORKER_ID, nx=True, ex=ttl):
        return True
    holder = client.get(key)
    if holder is not None and client.exists(HEARTBEAT_PREFIX + holder.decode()):
        logger.info("request %s is already running on %s", request_id, holder.decode())
        return False
    client.set(key, WORKER_ID, ex=ttl)
    return True


def heartbeat_payload(capacity: int) -> dict:
    host = host_get()
    return {"id": WORKER_ID, "models": host.hosted(), "stats": host.stats(),
            "running": len(running_request_ids()), "capacity": capacity, "ts": time.time()}


class WorkerServices:
    """The worker's background threads: heartbeat (and run-lock refresh) and cancel listener."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity  # requests this worker runs at once (its thread pool)
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
        pipe = self.client.pipeline(transaction=False)
        pipe.set(HEARTBEAT_PREFIX + WORKER_ID, json.dumps(heartbeat_payload(self.capacity)),
                 ex=settings.FAIRLANE_HEARTBEAT_TTL_SECONDS)
        for request_id in running_request_ids():
            pipe.set(run_lock_key(request_id), WORKER_ID,
                     ex=settings.FAIRLANE_HEARTBEAT_TTL_SECONDS)
        pipe.execute()

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
                    if message and message["type"] == "message":
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
    wanted = set(settings.FAIRLANE_WORKER_MODELS)
    for info in model_list_enabled():
        if not wanted or info.name in wanted:
            host_get().engine(info)
    _services = WorkerServices(capacity=sender.controller.concurrency)
    _services.beat()
    _services.start()
    logger.info("worker %s hosts %s", WORKER_ID, host_get().hosted())


@signals.worker_shutdown.connect
def worker_stop(sender=None, **kwargs) -> None:
    """Celery's warm shutdown has already let running tasks finish (the drain)."""
    if _services is not None:
        _services.stop()
    host_get().shutdown()


def workers_live() -> list[dict]:
    """Heartbeats of the workers alive now (each expires unless renewed)."""
    client = redis_sync()
    keys = list(client.scan_iter(match=HEARTBEAT_PREFIX + "*", count=100))
    return [json.loads(raw) for raw in client.mget(keys) if raw] if keys else []
