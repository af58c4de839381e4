"""The fair queue in front of the GPU workers, shared by every API process and worker through
Redis; every operation is one Lua script, so it is atomic.

- Lanes: realtime > standard > bulk by strict priority, except that a lower lane that is
  backlogged and below its minimum share of recent dispatches goes first (starvation guard).
- Within a lane: weighted fairness by virtual token counters (VTC, Sheng et al., OSDI 2024).
  A tenant is charged its input tokens / weight when a request is taken and its output tokens /
  weight as they are generated; the backlogged tenant with the lowest counter goes next; a
  tenant that comes back from idle is lifted to the lowest counter of the active ones.
- Reliable: a taken request is claimed by its worker, which renews the claim while it runs; a
  claim that expires (the worker died) puts the request back at the head of its tenant's queue.
  (A claim is not a lease: leases are on scarce backends, routing/leases.py.)

All keys share the hash tag `{fq:<model>}`, so one queue lives in one Redis Cluster slot.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from tenants.models import Lane


def _script(name: str) -> str:
    return (Path(__file__).parent / f"{name}.lua").read_text()


# The rule that lifts a tenant coming back from idle to the floor is written once
# (activate.lua) and shared by the two scripts that need it.
_SCRIPTS = {
    name: (_script("activate") if name in ("enqueue", "dequeue") else "") + _script(name)
    for name in ("enqueue", "dequeue", "charge", "ack", "renew")
}


@dataclass(frozen=True, slots=True)
class Taken:
    """A request a worker took from the queue."""

    id: str
    payload: dict
    tenant: str
    lane: str
    waited_ms: int
    position: int = 0  # its place in the lane when it was queued (1: first)


def _now_ms() -> int:
    return int(time.time() * 1000)


class FairQueue:
    """One model's queue. `prefix` namespaces it (one queue per model, or per test)."""

    def __init__(
        self,
        client: redis.Redis,
        name: str,
        *,
        claim_seconds: float = 10.0,
        min_share_standard: float = 0.10,
        min_share_bulk: float = 0.05,
        decay: float = 0.99,
    ) -> None:
        self.client = client
        self.prefix = f"{{fq:{name}}}:"
        self.claim_ms = int(claim_seconds * 1000)
        shares: dict[str, float] = {Lane.STANDARD: min_share_standard, Lane.BULK: min_share_bulk}
        self._lanes = [arg for lane in Lane.values for arg in (lane, shares.get(lane, 0.0))]
        self.decay = decay
        self._scripts = {name: client.register_script(src) for name, src in _SCRIPTS.items()}

    def _run(self, name: str, *args: str | int | float) -> Any:  # a script's reply
        return self._scripts[name](keys=[self.prefix], args=list(args))

    def enqueue(
        self, *, id: str, tenant: str, lane: str, weight: float, cost: int, payload: dict
    ) -> int:
        """Queue a request; `cost` is its input tokens. Returns the lane's depth."""
        if lane not in Lane.values:
            raise ValueError(f"unknown lane {lane!r}")
        return int(
            self._run("enqueue", id, tenant, lane, weight, cost, json.dumps(payload), _now_ms())
        )

    def dequeue(
        self, *, worker: str, realtime_only: bool = False, exclude: frozenset[str] = frozenset()
    ) -> Taken | None:
        """The next request by lane, then fairness, claimed by `worker`; None if none waits.
        `realtime_only` takes only realtime requests (a worker's reserved last slots);
        `exclude` names tenants whose requests are left queued (a full worker taking beyond
        its slots only for tenants under their share)."""
        reply = self._run(
            "dequeue",
            worker,
            self.claim_ms,
            _now_ms(),
            self.decay,
            1 if realtime_only else len(Lane),
            len(exclude),
            *sorted(exclude),
            *self._lanes,
        )
        if not reply:
            return None
        id_, payload, tenant, lane, waited, position = (
            v.decode() if isinstance(v, bytes) else v for v in reply
        )
        return Taken(
            id=id_,
            payload=json.loads(payload),
            tenant=tenant,
            lane=lane,
            waited_ms=int(float(waited)),
            position=int(position),
        )

    def charge(self, *, tenant: str, lane: str, tokens: int) -> float:
        """Charge generated tokens to the tenant's counter."""
        return float(self._run("charge", tenant, lane, tokens))

    def ack(self, *, id: str, worker: str) -> bool:
        """The request is done; False if its claim had already been lost."""
        return bool(self._run("ack", id, worker))

    def renew(self, *, worker: str, ids: list[str]) -> list[str]:
        """Extend this worker's claims; returns the ids it no longer holds."""
        if not ids:
            return []
        lost = self._run("renew", worker, _now_ms() + self.claim_ms, *ids)
        return [i.decode() for i in lost]

    def wait_for_work(self, timeout: float, *, freed_on: str | None = None) -> None:
        """Block until something is enqueued (or `timeout` seconds pass); with `freed_on`, also
        until that worker acknowledges a request (a slot of its own came free)."""
        keys = [self.prefix + "bell"]
        if freed_on is not None:
            keys.append(self.prefix + f"freed:{freed_on}")
        self.client.blpop(keys, timeout=timeout)

    def wait_for_slot(self, worker: str, timeout: float) -> None:
        """Block until `worker` acknowledges a request (or `timeout` seconds pass): a full
        worker's wait, which leaves the queue's bell to workers with room."""
        self.client.blpop([self.prefix + f"freed:{worker}"], timeout=timeout)

    def depth(self, lane: str | None = None, tenant: str | None = None) -> int:
        if tenant is not None:
            return int(self.client.hget(self.prefix + f"tdepth:{lane}", tenant) or 0)
        if lane is not None:
            return int(self.client.hget(self.prefix + "depth", lane) or 0)
        return sum(int(v) for v in self.client.hvals(self.prefix + "depth"))

    def dispatch_rate(self, seconds: int = 30) -> float:
        """Requests taken per second over the last `seconds` seconds."""
        now = int(time.time())
        keys = [self.prefix + f"dispatched:{t}" for t in range(now - seconds + 1, now + 1)]
        return sum(int(v) for v in self.client.mget(keys) if v) / seconds

    def counters(self, lane: str) -> dict[str, float]:
        return {
            k.decode(): float(v)
            for k, v in self.client.hgetall(self.prefix + f"vtc:{lane}").items()
        }

    def claimed(self) -> int:
        """Requests taken by a worker and not finished."""
        return int(self.client.zcard(self.prefix + "claims"))

    def clear(self) -> None:
        """Delete every key of this queue (tests, benchmarks)."""
        keys = list(
            self.client.scan_iter(
                match=self.prefix.replace("{", "\\{").replace("}", "\\}") + "*", count=1000
            )
        )
        if keys:
            self.client.delete(*keys)
