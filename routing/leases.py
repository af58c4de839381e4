"""Leases on scarce backends (a reserved GPU box, a provider account with few slots): a request
holds one of the backend's slots for a while, renews it as it streams, releases it at the end;
a holder that dies simply lets it expire (no zombie holds). When every slot is held, up to the
backend's queue depth of requests wait in arrival order; the next one falls through at once.

Shared through Redis (one Lua script, so check-and-take is atomic across API processes), or
in-process in the embedded mode, with the same rules.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import redis
from django.conf import settings

from workers.serving.runtime import Leases

GRANTED, WAITING, FULL = 1, 0, -1
_SCRIPT = (Path(__file__).parent / "lease.lua").read_text()


def _key(backend: str, part: str) -> str:
    """One hash tag per backend: the script's two keys share a Redis Cluster slot. Under
    FAIRLANE_QUEUE_NAMESPACE: another deployment's backend of the same name is not this one."""
    return f"{settings.FAIRLANE_QUEUE_NAMESPACE}fl:lease:{{{backend}}}:{part}"


class RedisLeases:
    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.script = client.register_script(_SCRIPT)

    def _call(
        self,
        op: str,
        backend: str,
        holder: str,
        ttl_ms: int = 0,
        slots: int = 1,
        depth: int = 0,
        wait_ms: int = 0,
    ) -> int:
        keys = [_key(backend, "holders"), _key(backend, "waiters")]
        return int(
            self.script(
                keys=keys, args=[op, holder, int(time.time() * 1000), ttl_ms, slots, depth, wait_ms]
            )
        )

    def try_acquire(
        self, backend: str, holder: str, *, ttl: float, slots: int, depth: int, wait: float
    ) -> int:
        return self._call(
            "acquire", backend, holder, int(ttl * 1000), slots, depth, int(wait * 1000)
        )

    def renew(self, backend: str, holder: str, *, ttl: float) -> bool:
        return self._call("renew", backend, holder, int(ttl * 1000)) == 1

    def release(self, backend: str, holder: str) -> None:
        self._call("release", backend, holder)

    def holders(self, backend: str) -> list[str]:
        key = _key(backend, "holders")
        self.client.zremrangebyscore(key, "-inf", int(time.time() * 1000))
        return [h.decode() for h in self.client.zrange(key, 0, -1)]


class LocalLeases:
    """The same rules for one process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders: dict[str, dict[str, float]] = {}
        self._waiters: dict[str, dict[str, float]] = {}

    def _sweep(self, backend: str, now: float) -> tuple[dict, dict]:
        holders = self._holders.setdefault(backend, {})
        waiters = self._waiters.setdefault(backend, {})
        for table in (holders, waiters):
            for key in [k for k, expiry in table.items() if expiry <= now]:
                del table[key]
        return holders, waiters

    def try_acquire(
        self, backend: str, holder: str, *, ttl: float, slots: int, depth: int, wait: float
    ) -> int:
        now = time.time()
        with self._lock:
            holders, waiters = self._sweep(backend, now)
            if holder in holders:
                holders[holder] = now + ttl
                return GRANTED
            free = slots - len(holders)
            order = sorted(waiters, key=waiters.__getitem__)
            rank = order.index(holder) if holder in waiters else None
            if free > 0 and (
                (rank is not None and rank < free) or (rank is None and len(waiters) < free)
            ):
                waiters.pop(holder, None)
                holders[holder] = now + ttl
                return GRANTED
            if holder in waiters:
                return WAITING
            if len(waiters) >= depth:
                return FULL
            waiters[holder] = now + wait
            return WAITING

    def renew(self, backend: str, holder: str, *, ttl: float) -> bool:
        with self._lock:
            holders, _ = self._sweep(backend, time.time())
            if holder in holders:
                holders[holder] = time.time() + ttl
                return True
            return False

    def release(self, backend: str, holder: str) -> None:
        with self._lock:
            self._holders.get(backend, {}).pop(holder, None)
            self._waiters.get(backend, {}).pop(holder, None)

    def holders(self, backend: str) -> list[str]:
        with self._lock:
            return list(self._sweep(backend, time.time())[0])


POLL_SECONDS = 0.05


async def lease_acquire(
    store: Leases,
    backend: str,
    holder: str,
    *,
    ttl: float,
    slots: int,
    depth: int,
    wait: float,
) -> bool:
    """Hold one of the backend's slots (the runtime's `store`); waits in its queue up to
    `wait` seconds. False: the queue was full or the wait ran out (fall through to the next
    backend)."""
    deadline = time.monotonic() + wait
    while True:
        result = await asyncio.to_thread(
            store.try_acquire, backend, holder, ttl=ttl, slots=max(slots, 1), depth=depth, wait=wait
        )
        if result == GRANTED:
            return True
        if result == FULL or time.monotonic() >= deadline:
            await asyncio.to_thread(store.release, backend, holder)  # leave the queue
            return False
        await asyncio.sleep(POLL_SECONDS)
