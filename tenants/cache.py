"""What the request path reads on every request, kept in the process: API keys (with their
tenant and agent), budgets and budget windows. A change to any of those rows drops every
process's copies at once: the process that saved it clears its own, and the runtime's
`CacheListener` tells the others over Redis. FAIRLANE_AUTH_CACHE_SECONDS bounds an entry's age
as well, so a revocation made while Redis was unreachable still takes effect within that time.
Without Redis (the embedded mode: one process) the saving process is the only one.

Cached rows are shared between requests: treat them as read-only.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Generic, TypeVar

import redis
from django.conf import settings
from django.db import transaction
from django.db.models.signals import post_delete, post_save
from django.dispatch import Signal

from tenants.loops import BackgroundLoop

logger = logging.getLogger(__name__)

CHANNEL = "fl:invalidate"


_epoch = 0  # bumped by every invalidation


def epoch() -> int:
    """Take it before reading the rows to cache, and pass it to `put`: a change that lands
    while they are read must not leave the old rows cached."""
    return _epoch


V = TypeVar("V")


class HotCache(Generic[V]):
    """A dictionary whose entries expire after FAIRLANE_AUTH_CACHE_SECONDS and vanish together
    when any cached row changes (`invalidate`)."""

    def __init__(self, name: str, max_entries: int = 100_000) -> None:
        self.name, self.max_entries = name, max_entries
        self._entries: dict[Any, tuple[float, V]] = {}

    def get(self, key: Any) -> V | None:
        found = self._entries.get(key)
        if found is None or found[0] < time.monotonic():
            return None
        return found[1]

    def put(self, key: Any, value: V, read_at: int) -> None:
        """Cache `value`, read from the database after `epoch()` returned `read_at`."""
        if read_at != _epoch:
            return
        if len(self._entries) >= self.max_entries:
            self._entries.clear()
        self._entries[key] = (time.monotonic() + settings.FAIRLANE_AUTH_CACHE_SECONDS, value)

    def clear(self) -> None:
        self._entries = {}


caches: list[HotCache[Any]] = []


def hot_cache(name: str) -> HotCache[Any]:
    cache: HotCache[Any] = HotCache(name)
    caches.append(cache)
    return cache


def clear_local() -> None:
    global _epoch
    _epoch += 1
    for cache in caches:
        cache.clear()


def invalidate(*args, **kwargs) -> None:
    """A cached row changed: clear this process's copies and, once the change has committed
    (before that, another process would read the old row again), tell the others through
    whichever runtime's listener is connected (`rows_changed`)."""
    clear_local()
    transaction.on_commit(_committed)


def _committed() -> None:
    clear_local()
    rows_changed.send(sender=None)


# Sent once a change to a cached row has committed; the runtime's listener publishes it.
rows_changed = Signal()


class CacheListener:
    """The runtime's cache invalidations: without Redis (one process) clearing this process's
    copies is all there is; with it, each committed change is published on Redis
    (`<namespace>fl:invalidate:<Redis db>`) and a loop of every process hears them and clears
    its copies, and clears them again whenever it (re)connects, since messages sent while it
    was away are lost."""

    def __init__(self, client: redis.Redis | None) -> None:
        self.client = client
        self._pubsub: redis.client.PubSub | None = None
        self.subscribed = threading.Event()  # set once it listens (and cleared what it had)
        self.loop = (
            BackgroundLoop("cache-invalidations", self._hear, interval=lambda: 1.0)
            if client is not None
            else None
        )

    def connect(self) -> None:
        rows_changed.connect(self._publish, dispatch_uid=f"cache-publish-{id(self)}")

    def disconnect(self) -> None:
        rows_changed.disconnect(dispatch_uid=f"cache-publish-{id(self)}")

    def _publish(self, **kwargs) -> None:
        if self.client is None:
            return
        if self.loop is not None:
            self.loop.start()  # this process listens too, from its first change
        try:
            self.client.publish(self._channel(), b"1")
        except Exception:  # the others fall back on the entries' age
            logger.warning(
                "could not publish a cache invalidation; other processes keep "
                "their entries for up to %s s",
                settings.FAIRLANE_AUTH_CACHE_SECONDS,
            )

    def _channel(self) -> str:
        """Pub/sub channels span a Redis server's numbered databases, unlike keys: the channel
        names the database (and the namespace) so deployments sharing a server stay apart."""
        db = self.client.connection_pool.connection_kwargs.get("db", 0) if self.client else 0
        return f"{settings.FAIRLANE_QUEUE_NAMESPACE}{CHANNEL}:{db}"

    def _hear(self) -> float:
        """Wait up to a second for an invalidation; a Redis failure is logged by the loop
        (entries age out meanwhile), which subscribes again a second later."""
        pubsub = self._pubsub
        if pubsub is None:
            assert self.client is not None  # the loop exists only with a client
            pubsub = self._pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            pubsub.subscribe(self._channel())
            clear_local()  # what was published while we were not listening
            self.subscribed.set()
        try:
            message = pubsub.get_message(timeout=1.0)
        except Exception:
            self._pubsub = None
            self.subscribed.clear()
            clear_local()
            raise
        if message and message.get("type") == "message":
            clear_local()
        return 0.0


def connect(*models) -> None:
    for model in models:
        post_save.connect(invalidate, sender=model, dispatch_uid=f"hot-{model.__name__}")
        post_delete.connect(invalidate, sender=model, dispatch_uid=f"hot-del-{model.__name__}")
