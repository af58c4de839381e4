"""Counts that add up across processes and hosts: the spend per tenant that /metrics exports,
and the per-minute outcomes of the backends that the ops dashboard turns into error rates.

A Prometheus counter lives in the process that increments it; settlements happen in API
processes and in GPU workers (which serve no /metrics), so those counts are kept here: in the
process, and added to a Redis hash every FLUSH_SECONDS by the runtime's flusher loop (never on
the request path). Without Redis (the embedded mode: one process) they stay in the process.
Counts are figures for operators, not the ledger: a process that dies loses its last seconds.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

import redis
from django.conf import settings

from tenants.loops import BackgroundLoop

logger = logging.getLogger(__name__)

FLUSH_SECONDS = 2.0
_every: list[SharedCounts] = []  # every SharedCounts of the process, for the flusher


class SharedCounts:
    """Named counts, optionally in time buckets (`bucket_seconds`), kept `ttl_seconds` in
    Redis. `add` is a dictionary update under a lock; the runtime's `CountsFlusher` adds them
    to Redis; `totals` reads Redis (the runtime's client; None: this process alone) plus what
    this process has not flushed yet."""

    def __init__(self, key: str, *, bucket_seconds: int = 0, ttl_seconds: int = 0) -> None:
        self.key, self.bucket_seconds, self.ttl_seconds = key, bucket_seconds, ttl_seconds
        self._pending: collections.Counter[tuple[int, str]] = collections.Counter()
        self._lock = threading.Lock()
        _every.append(self)

    def _bucket(self, now: float) -> int:
        return int(now // self.bucket_seconds) * self.bucket_seconds if self.bucket_seconds else 0

    def _redis_key(self, bucket: int) -> str:
        key = settings.FAIRLANE_QUEUE_NAMESPACE + self.key
        return f"{key}:{bucket}" if self.bucket_seconds else key

    def add(self, field: str, amount: int = 1, *, now: float | None = None) -> None:
        bucket = self._bucket(time.time() if now is None else now)
        with self._lock:
            self._pending[(bucket, field)] += amount

    def flush(self, client: redis.Redis) -> None:
        with self._lock:
            pending, self._pending = self._pending, collections.Counter()
        if not pending:
            return
        try:
            pipe = client.pipeline(transaction=False)
            for (bucket, field), amount in pending.items():
                pipe.hincrby(self._redis_key(bucket), field, amount)
                if self.ttl_seconds:
                    pipe.expire(self._redis_key(bucket), self.ttl_seconds)
            pipe.execute()
        except redis.RedisError:  # keep them for the next flush
            logger.warning(
                "counts %s: Redis unavailable; keeping %d for later", self.key, len(pending)
            )
            with self._lock:
                self._pending.update(pending)

    def totals(
        self,
        client: redis.Redis | None,
        *,
        since_seconds: int | None = None,
        now: float | None = None,
    ) -> dict[str, int]:
        """Every field's total (over the buckets of the last `since_seconds`, when bucketed)."""
        now = time.time() if now is None else now
        buckets = [0]
        if self.bucket_seconds:
            first = self._bucket(now - (since_seconds or self.ttl_seconds) + self.bucket_seconds)
            buckets = list(range(first, self._bucket(now) + 1, self.bucket_seconds))
        totals: collections.Counter[str] = collections.Counter()
        with self._lock:
            for (bucket, field), amount in self._pending.items():
                if bucket in buckets:
                    totals[field] += amount
        if client is not None:
            pipe = client.pipeline(transaction=False)
            for bucket in buckets:
                pipe.hgetall(self._redis_key(bucket))
            for values in pipe.execute():
                for field, amount in values.items():
                    totals[field.decode()] += int(amount)
        return dict(totals)

    def clear(self, client: redis.Redis | None) -> None:
        """Forget every count (tests)."""
        with self._lock:
            self._pending.clear()
        if client is not None:
            pattern = settings.FAIRLANE_QUEUE_NAMESPACE + self.key + "*"
            keys = list(client.scan_iter(match=pattern, count=1000))
            if keys:
                client.delete(*keys)


class CountsFlusher:
    """The runtime's counters part: adds every SharedCounts of the process to Redis every
    FLUSH_SECONDS, and once more when it stops. Without Redis (the embedded mode) the counts
    stay in the process and nothing runs."""

    def __init__(self, client: redis.Redis | None) -> None:
        self.client = client
        self.loop = (
            BackgroundLoop(
                "counters-flush", self.flush, interval=lambda: FLUSH_SECONDS, final=self.flush
            )
            if client is not None
            else None
        )

    def flush(self) -> None:
        if self.client is not None:
            for counts in list(_every):
                counts.flush(self.client)

    def connect(self) -> None:
        pass

    def disconnect(self) -> None:
        pass


class SharedHistograms:
    """Histograms (per label values) that add up across processes and hosts, kept as
    SharedCounts: per labels, the count in each bucket (not cumulative), the count and the sum
    in microseconds. `families()` gives them cumulative, as Prometheus wants."""

    SEP = "\x1f"

    def __init__(self, key: str, buckets: tuple[float, ...]) -> None:
        self.counts = SharedCounts(key)  # flushed with the others
        self.buckets = tuple(sorted(buckets))

    def observe(self, labels: tuple[str, ...], seconds: float) -> None:
        seconds = max(seconds, 0.0)
        prefix = self.SEP.join(labels) + self.SEP
        le = next((str(b) for b in self.buckets if seconds <= b), "+Inf")
        self.counts.add(prefix + le)
        self.counts.add(prefix + "count")
        self.counts.add(prefix + "sum_us", int(seconds * 1_000_000))

    def families(
        self, client: redis.Redis | None
    ) -> dict[tuple[str, ...], tuple[list[tuple[str, int]], float]]:
        """Per label values: the cumulative buckets [(le, count), ..., ("+Inf", count)] and the
        sum in seconds."""
        per: dict[tuple[str, ...], dict[str, int]] = collections.defaultdict(dict)
        for field, amount in self.counts.totals(client).items():
            *labels, name = field.split(self.SEP)
            per[tuple(labels)][name] = amount
        out: dict[tuple[str, ...], tuple[list[tuple[str, int]], float]] = {}
        for key, values in per.items():
            running, cumulative = 0, []
            for bound in [str(b) for b in self.buckets] + ["+Inf"]:
                running += values.get(bound, 0)
                cumulative.append((bound, running))
            out[key] = (cumulative, values.get("sum_us", 0) / 1_000_000)
        return out
