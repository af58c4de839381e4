"""What the request path reads on every request, kept in the process: API keys (with their
tenant and agent), budgets and budget windows. A change to any of those rows drops every
process's copies at once: the process that saved it clears its own and publishes on Redis
(`<namespace>fl:invalidate`); a thread in each process listens and clears its copies, and
clears them again whenever it (re)connects, since messages sent while it was away are lost.
FAIRLANE_AUTH_CACHE_SECONDS bounds an entry's age as well, so a revocation made while Redis was
unreachable still takes effect within that time. Without Redis (the embedded mode: one
process) the saving process is the only one.

Cached rows are shared between requests: treat them as read-only.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models.signals import post_delete, post_save

logger = logging.getLogger(__name__)

CHANNEL = "fl:invalidate"


_generation = 0  # bumped by every invalidation


def generation() -> int:
    """Take it before reading the rows to cache, and pass it to `put`: a change that lands
    while they are read must not leave the old rows cached."""
    return _generation


class HotCache:
    """A dictionary whose entries expire after FAIRLANE_AUTH_CACHE_SECONDS and vanish together
    when any cached row changes (`invalidate`)."""

    def __init__(self, name: str, max_entries: int = 100_000) -> None:
        self.name, self.max_entries = name, max_entries
        self._entries: dict[Any, tuple[float, Any]] = {}

    def get(self, key):
        found = self._entries.get(key)
        if found is None or found[0] < time.monotonic():
            return None
        return found[1]

    def put(self, key, value, read_at: int) -> None:
        """Cache `value`, read from the database after `generation()` returned `read_at`."""
        listener.start()
        if read_at != _generation:
            return
        if len(self._entries) >= self.max_entries:
            self._entries.clear()
        self._entries[key] = (time.monotonic() + settings.FAIRLANE_AUTH_CACHE_SECONDS, value)

    def clear(self) -> None:
        self._entries = {}


caches: list[HotCache] = []


def hot_cache(name: str) -> HotCache:
    cache = HotCache(name)
    caches.append(cache)
    return cache


def clear_local() -> None:
    global _generation
    _generation += 1
    for cache in caches:
        cache.clear()


def invalidate(*args, **kwargs) -> None:
    """A cached row changed: clear this process's copies and tell the others, once the change
    has committed (before that, another process would read the old row again)."""
    clear_local()
    transaction.on_commit(_publish)


def _publish() -> None:
    clear_local()
    listener.start()
    client = _redis()
    if client is not None:
        try:
            client.publish(_channel(), b"1")
        except Exception:  # the others fall back on the entries' age
            logger.warning("could not publish a cache invalidation; other processes keep "
                           "their entries for up to %s s", settings.FAIRLANE_AUTH_CACHE_SECONDS)


def _channel() -> str:
    return settings.FAIRLANE_QUEUE_NAMESPACE + CHANNEL


def _redis():
    from tenants.counters import redis_client

    return redis_client()


class Listener:
    """This process's subscriber to invalidations (started with the first cached entry)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if not settings.REDIS_URL or (self._thread is not None and self._thread.is_alive()):
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="cache-invalidations",
                                                daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        import redis

        while True:
            try:
                client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2,
                                              health_check_interval=10)
                pubsub = client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(_channel())
                clear_local()  # what was published while we were not listening
                for message in pubsub.listen():
                    if message and message.get("type") == "message":
                        clear_local()
            except Exception:  # Redis went away: entries age out meanwhile
                logger.info("cache invalidations: Redis unreachable; retrying", exc_info=True)
            clear_local()
            time.sleep(1.0)


listener = Listener()


def connect(*models) -> None:
    for model in models:
        post_save.connect(invalidate, sender=model, dispatch_uid=f"hot-{model.__name__}")
        post_delete.connect(invalidate, sender=model, dispatch_uid=f"hot-del-{model.__name__}")
