"""Per-backend circuit breakers and rolling latency, kept in each API process (as Envoy's
outlier detection is per proxy): a process stops sending to a backend it saw failing without
a shared-store round trip on every routing decision.

closed -> open: FAIRLANE_BREAKER_FAILURES failures in a row, or a failure ratio of at least
  FAIRLANE_BREAKER_RATIO over the last FAIRLANE_BREAKER_WINDOW_SECONDS once that window holds
  FAIRLANE_BREAKER_MIN_REQUESTS outcomes.
open -> half-open: after FAIRLANE_BREAKER_COOLDOWN_SECONDS, one trial request is let through.
half-open -> closed on its success, back to open (a new cooldown) on its failure.

A backend that answered 429 with Retry-After is "cooling" until then: not a fault, but no
request goes to it before the time it named.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

from django.conf import settings

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
LATENCY_SAMPLES = 200


@dataclass
class BackendState:
    state: str = CLOSED
    consecutive_failures: int = 0
    opened_at: float = 0.0
    trial_in_flight: bool = False
    cooling_until: float = 0.0
    outcomes: deque = field(default_factory=deque)  # (time, ok)
    latencies_ms: deque = field(default_factory=lambda: deque(maxlen=LATENCY_SAMPLES))
    inflight: int = 0
    samples: int = 0  # latencies ever recorded
    p95_cache: tuple[int, float] = (-1, 0.0)  # (samples when computed, p95)


class Breakers:
    """Thread-safe; one per process (see `breakers`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: dict[str, BackendState] = {}

    def _get(self, name: str) -> BackendState:
        state = self._states.get(name)
        if state is None:
            state = self._states[name] = BackendState()
        return state

    def state(self, name: str, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        with self._lock:
            state = self._get(name)
            if state.state == OPEN and now - state.opened_at >= _cooldown():
                return HALF_OPEN
            return state.state

    def available(self, name: str, now: float | None = None) -> bool:
        """May a request be sent now (without taking the half-open trial)?"""
        now = time.monotonic() if now is None else now
        with self._lock:
            state = self._states.get(name)
            if state is None:
                return True
            if now < state.cooling_until:
                return False
            if state.state == CLOSED:
                return True
            if state.state == OPEN and now - state.opened_at < _cooldown():
                return False
            return not state.trial_in_flight

    def blocked_for(self, name: str, now: float | None = None) -> float:
        """Seconds until this backend may be tried again (0: now)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            state = self._states.get(name)
            if state is None:
                return 0.0
            wait = max(state.cooling_until - now, 0.0)
            if state.state == OPEN:
                wait = max(wait, state.opened_at + _cooldown() - now)
            return wait

    def begin(self, name: str) -> bool:
        """Take the right to send one request: False when open, cooling, or when the
        half-open trial is already out."""
        now = time.monotonic()
        with self._lock:
            state = self._get(name)
            if now < state.cooling_until:
                return False
            if state.state == OPEN:
                if now - state.opened_at < _cooldown():
                    return False
                state.state = HALF_OPEN
            if state.state == HALF_OPEN:
                if state.trial_in_flight:
                    return False
                state.trial_in_flight = True
            state.inflight += 1
            return True

    def end(self, name: str) -> None:
        """The request stopped being in flight (outcome recorded separately)."""
        with self._lock:
            state = self._get(name)
            state.inflight = max(state.inflight - 1, 0)

    def success(self, name: str, latency_ms: float | None = None) -> None:
        now = time.monotonic()
        with self._lock:
            state = self._get(name)
            state.consecutive_failures = 0
            state.trial_in_flight = False
            state.state = CLOSED
            self._outcome(state, now, True)
            if latency_ms is not None:
                state.latencies_ms.append(latency_ms)
                state.samples += 1

    def failure(self, name: str) -> None:
        now = time.monotonic()
        with self._lock:
            state = self._get(name)
            state.consecutive_failures += 1
            self._outcome(state, now, False)
            if state.state == HALF_OPEN or self._should_open(state):
                state.state, state.opened_at = OPEN, now
            state.trial_in_flight = False

    def neutral(self, name: str) -> None:
        """An outcome that says nothing about health (the client's bad request, a content
        filter); frees a half-open trial."""
        with self._lock:
            state = self._get(name)
            if state.state == HALF_OPEN:
                state.state = CLOSED
            state.trial_in_flight = False

    def cool(self, name: str, seconds: float) -> None:
        """The backend asked us to wait (429 Retry-After)."""
        with self._lock:
            state = self._get(name)
            state.cooling_until = max(state.cooling_until, time.monotonic() + seconds)
            state.trial_in_flight = False

    def _outcome(self, state: BackendState, now: float, ok: bool) -> None:
        window = settings.FAIRLANE_BREAKER_WINDOW_SECONDS
        state.outcomes.append((now, ok))
        while state.outcomes and state.outcomes[0][0] < now - window:
            state.outcomes.popleft()

    def _should_open(self, state: BackendState) -> bool:
        if state.consecutive_failures >= settings.FAIRLANE_BREAKER_FAILURES:
            return True
        total = len(state.outcomes)
        if total < settings.FAIRLANE_BREAKER_MIN_REQUESTS:
            return False
        failed = sum(1 for _, ok in state.outcomes if not ok)
        return failed / total >= settings.FAIRLANE_BREAKER_RATIO

    def inflight(self, name: str) -> int:
        state = self._states.get(name)
        return state.inflight if state else 0

    def p95_ms(self, name: str) -> float | None:
        """Rolling p95 of time to first token this process saw; None before any sample."""
        state = self._states.get(name)
        if state is None or not state.latencies_ms:
            return None
        # Sorting 200 samples per decision would dominate routing; recompute every 10 samples.
        computed_at, cached = state.p95_cache
        if computed_at >= 0 and state.samples - computed_at < 10:
            return cached
        ordered = sorted(state.latencies_ms)
        value = ordered[min(int(len(ordered) * 0.95), len(ordered) - 1)]
        state.p95_cache = (state.samples, value)
        return value

    def snapshot(self) -> dict[str, dict]:
        with self._lock:
            return {
                name: {
                    "state": s.state,
                    "inflight": s.inflight,
                    "consecutive_failures": s.consecutive_failures,
                }
                for name, s in self._states.items()
            }

    def reset(self) -> None:
        with self._lock:
            self._states.clear()


def _cooldown() -> float:
    return settings.FAIRLANE_BREAKER_COOLDOWN_SECONDS


breakers = Breakers()
