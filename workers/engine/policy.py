"""Who goes first: the ordering hook of the scheduler.

A policy gives each sequence a sort key (lower runs sooner, and is preempted later) and hears
how many tokens each sequence was given. The default orders by lane, then by the tenant's
virtual token counter (tokens processed / weight), then by arrival, which is weighted fair
queueing at token granularity. The fair-share issue can pass its own policy or a key callable.
The lanes are the caller's: the engine names none of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Any, Protocol

from workers.engine.sequence import Sequence


class SchedulingPolicy(Protocol):
    def key(self, seq: Sequence) -> Any: ...

    def on_added(self, seq: Sequence, active_tenants: set[str]) -> None: ...

    def on_scheduled(self, seq: Sequence, num_tokens: int) -> None: ...


class FairSharePolicy:
    """Lane priority, then the lowest per-tenant virtual token counter, then first come.

    ``lanes`` names the lanes from first to last; a request must name one of them, or none (it
    then goes after them all). Without lanes every request shares one.
    """

    def __init__(
        self, *, lanes: Iterable[str] = (), tenant_weights: dict[str, float] | None = None
    ) -> None:
        self.lanes = {lane: rank for rank, lane in enumerate(lanes)}
        self.tenant_weights = dict(tenant_weights or {})
        self.virtual_tokens: dict[str, float] = {}

    def lane_rank(self, seq: Sequence) -> int:
        last = len(self.lanes)  # no lane, or one not named: after them all
        return last if seq.lane is None else self.lanes.get(seq.lane, last)

    def key(self, seq: Sequence) -> tuple[int, float, int]:
        return self.lane_rank(seq), self.virtual_tokens.get(seq.tenant, 0.0), seq.arrival_order

    def on_added(self, seq: Sequence, active_tenants: set[str]) -> None:
        # A tenant that was idle starts at the busiest-served active tenant's floor, so idling
        # does not bank credit that would let it starve the others later.
        active = [self.virtual_tokens.get(t, 0.0) for t in active_tenants if t != seq.tenant]
        floor = min(active, default=0.0)
        if seq.tenant not in active_tenants:
            self.virtual_tokens[seq.tenant] = max(self.virtual_tokens.get(seq.tenant, 0.0), floor)

    def on_scheduled(self, seq: Sequence, num_tokens: int) -> None:
        weight = self.tenant_weights.get(seq.tenant, 1.0)
        self.virtual_tokens[seq.tenant] = (
            self.virtual_tokens.get(seq.tenant, 0.0) + num_tokens / weight
        )


class KeyPolicy:
    """Wrap a plain ``key(seq) -> sortable`` callable as a policy (no accounting)."""

    def __init__(self, key: Callable[[Sequence], Hashable]) -> None:
        self._key = key

    def key(self, seq: Sequence) -> Any:
        return self._key(seq)

    def on_added(self, seq: Sequence, active_tenants: set[str]) -> None:
        pass

    def on_scheduled(self, seq: Sequence, num_tokens: int) -> None:
        pass


class FifoPolicy(KeyPolicy):
    """Plain first come, first served."""

    def __init__(self) -> None:
        super().__init__(lambda seq: seq.arrival_order)
