"""The embedded engine's own queue, as admission sees it: the requests this process handed to
its engines that have not started yet (no output), per model, lane and tenant, and how fast
they start. Admission asks it the same questions as the Redis fair queue (depth per lane and
tenant, drain rate over the last 30 s), so the embedded mode gives the same 429s and 503s."""

from __future__ import annotations

import threading
import time
from collections import Counter, deque

WINDOW_SECONDS = 30


class LocalQueue:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: Counter[tuple[str, str, str]] = Counter()  # (model, lane, tenant)
        self._started: dict[str, deque[float]] = {}  # model -> start times

    def enter(self, *, model: str, lane: str, tenant: str) -> None:
        with self._lock:
            self._waiting[(model, lane, tenant)] += 1

    def leave(self, *, model: str, lane: str, tenant: str, started: bool) -> None:
        """The request started (its first output), or ended before it did."""
        with self._lock:
            key = (model, lane, tenant)
            self._waiting[key] -= 1
            if self._waiting[key] <= 0:
                del self._waiting[key]
            if started:
                self._started.setdefault(model, deque()).append(time.monotonic())

    def depth(self, *, model: str, lane: str | None = None, tenant: str | None = None) -> int:
        with self._lock:
            return sum(
                n
                for (m, la, t), n in self._waiting.items()
                if m == model and (lane is None or la == lane) and (tenant is None or t == tenant)
            )

    def waiting(self) -> dict[tuple[str, str, str], int]:
        """(model, lane, tenant) -> requests waiting (the ops dashboard)."""
        with self._lock:
            return dict(self._waiting)

    def dispatch_rate(self, *, model: str, seconds: int = WINDOW_SECONDS) -> float:
        """Requests started per second over the last `seconds` seconds."""
        cutoff = time.monotonic() - seconds
        with self._lock:
            started = self._started.get(model, deque())
            while started and started[0] < cutoff:
                started.popleft()
            return len(started) / seconds
