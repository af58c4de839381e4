"""The one way a process runs work in the background: a `BackgroundLoop` is a daemon thread
that calls its step, waits (until its next step is due, or until it is woken), and repeats;
an error in a step is logged and counted, and the loop goes on. Loops are started where their
work first appears (or by the runtime at start-up) and stopped in order by the process's
`LoopGroup` on shutdown, each running its last step on the way out (a final flush).

It lives in tenants, the lowest app, because loops of every app use it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from prometheus_client import Counter

logger = logging.getLogger(__name__)

LOOP_ERRORS = Counter(
    "fairlane_background_loop_errors_total",
    "errors raised by a step of a background loop",
    ["loop"],
)

Step = Callable[[], float | None]


class BackgroundLoop:
    """Runs `step()` on a daemon thread named `name`, again after the seconds it returns (or
    `interval()` when it returns None), or at once when `wake()` is called. `final` runs once
    after the last step when the loop is stopped (e.g. a last flush)."""

    def __init__(
        self,
        name: str,
        step: Step,
        *,
        interval: Callable[[], float],
        final: Callable[[], None] | None = None,
    ) -> None:
        self.name, self.step, self.interval, self.final = name, step, interval, final
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def is_stopped(self) -> bool:
        return self._stopped.is_set()

    def start(self) -> BackgroundLoop:
        """Running from now on (a thread that died is started again); a stopped loop stays
        stopped."""
        if self.is_running or self._stopped.is_set():
            return self
        with self._lock:
            if not self.is_running and not self._stopped.is_set():
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
        return self

    def wake(self) -> None:
        """Run the next step now (starting the loop if need be)."""
        self.start()
        self._wake.set()

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the loop to end after its current step, wait for it, then run `final`."""
        self._stopped.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        if self.final is not None:
            self._guarded(self.final)

    def sleep(self, seconds: float) -> bool:
        """For a step that waits inside (a listener): False once the loop is to stop."""
        return not self._stopped.wait(seconds)

    def _guarded(self, call: Callable[[], float | None]) -> float | None:
        try:
            return call()
        except Exception:  # a thread boundary: log, count, and go on
            logger.exception("background loop %s failed", self.name)
            LOOP_ERRORS.labels(self.name).inc()
            return None

    def _run(self) -> None:
        while not self._stopped.is_set():
            delay = self._guarded(self.step)
            if self._stopped.is_set():
                return
            self._wake.wait(self.interval() if delay is None else max(delay, 0.0))
            self._wake.clear()


class LoopGroup:
    """A process's loops, stopped together in the order given at shutdown (producers first,
    the loops that flush what they produced last)."""

    def __init__(self, *loops: BackgroundLoop) -> None:
        self.loops = [loop for loop in loops if loop is not None]

    def add(self, loop: BackgroundLoop) -> BackgroundLoop:
        self.loops.append(loop)
        return loop

    def start(self) -> None:
        for loop in self.loops:
            loop.start()

    def stop(self, timeout: float = 5.0) -> None:
        for loop in self.loops:
            loop.stop(timeout)
