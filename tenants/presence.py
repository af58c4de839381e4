"""Who is alive now, read without a SCAN: the GPU workers' heartbeats (workers/pools.py) and
the API processes' published breakers (routing/ops/processes.py).

Each member writes its payload under its own key with a Redis expiry (its liveness) and its id
into a sorted set (id -> when its payload expires, ms by the member's clock); a reader takes the
set whole and the live payloads in one MGET. A SCAN for the payload keys would walk the whole
keyspace, which holds every request's stream for an hour (10^5 keys at a few dozen requests a
second). A write drops entries whose payload expired `prune_ms` ago (by the writer's clock), so
hosts whose clocks disagree by less than that never drop a live member; a member that stops
withdraws at once.

Both keys sit under the deployment's FAIRLANE_QUEUE_NAMESPACE, or another deployment's
namespace where given. It lives in tenants, the lowest app, because the other apps use it."""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis
from django.conf import settings


@dataclass(frozen=True)
class Presence:
    """Members of one kind: `index` is their sorted set, `prefix` starts each payload's key."""

    index: str
    prefix: str
    prune_ms: int = 60_000

    def key(self, member: str, namespace: str | None = None) -> str:
        return self._namespace(namespace) + self.prefix + member

    def write(
        self,
        pipe: redis.client.Pipeline,
        member: str,
        payload: str,
        ttl_seconds: float,
        *,
        now_ms: int | None = None,
    ) -> None:
        """Queues on `pipe` (the caller executes it, with its own commands) the member's payload,
        alive for `ttl_seconds` unless written again, and its place in the index."""
        index = self._namespace() + self.index
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        pipe.set(self.key(member), payload, px=int(ttl_seconds * 1000))
        pipe.zadd(index, {member: now_ms + int(ttl_seconds * 1000)})
        pipe.zremrangebyscore(index, "-inf", now_ms - self.prune_ms)

    def withdraw(self, client: redis.Redis, member: str) -> None:
        """A member that stops: gone at once."""
        pipe = client.pipeline(transaction=False)
        pipe.delete(self.key(member))
        pipe.zrem(self._namespace() + self.index, member)
        pipe.execute()

    def read(self, client: redis.Redis, namespaces: list[str] | None = None) -> list[bytes]:
        """The payloads of the members alive now, in this deployment or in `namespaces`."""
        namespaces = [self._namespace()] if namespaces is None else namespaces
        pipe = client.pipeline(transaction=False)
        for namespace in namespaces:
            pipe.zrange(namespace + self.index, 0, -1)
        keys = [
            namespace + self.prefix + member.decode()
            for namespace, members in zip(namespaces, pipe.execute(), strict=True)
            for member in members
        ]
        return [raw for raw in client.mget(keys) if raw] if keys else []

    @staticmethod
    def _namespace(namespace: str | None = None) -> str:
        return settings.FAIRLANE_QUEUE_NAMESPACE if namespace is None else namespace
