"""Graceful shutdown of an API process. On SIGTERM (Kubernetes, systemd, `kill`) uvicorn stops
accepting connections and waits for the open ones; requests in flight get
FAIRLANE_DRAIN_TIMEOUT_SECONDS to finish. Those still running then are cut cleanly: their run
is cancelled and settled (what ran is charged, once), and the client gets an error in the
OpenAI shape (503 with Retry-After before the answer started; an error chunk then [DONE] in a
stream), so it can retry on another replica.

uvicorn owns the signal: the first request installs a handler that starts the drain clock and
then hands the signal on to uvicorn's own.

The cut is sent again every CUT_REPEAT_SECONDS to whatever is still running uncut (a
cancellation that library code swallowed, a request between its view and its stream when the
clock ran out, and so entered its stream's watch after the deadline): past the deadline nothing
keeps the process from exiting. Each is cut inside its stream, so its run is settled."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading

from django.conf import settings

from tenants.errors import ServiceUnavailable
from workers.serving.settlement import settlements_finish

logger = logging.getLogger(__name__)
SETTLE_WAIT_SECONDS = 10.0
CUT_REPEAT_SECONDS = 1.0


class Drained(ServiceUnavailable):
    default_message = "The server is restarting; retry the request."


class Drain:
    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.tasks: set[asyncio.Task] = set()
        self.cut: set[asyncio.Task] = set()
        self.is_draining = False
        self.is_past_deadline = False

    def install(self) -> None:
        """Chain a SIGTERM handler in front of the server's (from the loop's main thread)."""
        if self.loop is not None or threading.current_thread() is not threading.main_thread():
            return
        self.loop = loop = asyncio.get_running_loop()
        previous = signal.getsignal(signal.SIGTERM)

        def on_term(signum, frame) -> None:
            loop.call_soon_threadsafe(self.begin)
            if callable(previous):
                previous(signum, frame)

        signal.signal(signal.SIGTERM, on_term)

    def begin(self) -> None:
        if self.is_draining:
            return
        self.is_draining = True
        timeout = settings.FAIRLANE_DRAIN_TIMEOUT_SECONDS
        logger.warning(
            "draining: %d request(s) in flight have %d s to finish", len(self.tasks), timeout
        )
        asyncio.get_running_loop().call_later(timeout, self._cut_all)

    def _cut_all(self) -> None:
        # What is still here has not heard a cut yet (a task that did left `tasks`).
        if self.tasks:
            logger.warning(
                "drain time is up: cutting %d request(s)%s",
                len(self.tasks),
                " (again)" if self.is_past_deadline else "",
            )
        self.is_past_deadline = True
        for task in list(self.tasks):
            self.cut.add(task)
            task.cancel()
        asyncio.get_running_loop().call_later(CUT_REPEAT_SECONDS, self._cut_all)

    @contextlib.asynccontextmanager
    async def watch(self):
        """The body runs as a request in flight: cut at the drain's deadline, when it raises
        Drained once its settlement is done."""
        task = asyncio.current_task()
        self.tasks.add(task)
        try:
            yield
        except asyncio.CancelledError:
            if task not in self.cut:
                raise
            self.tasks.discard(task)  # it heard the cut: no second one while it settles
            task.uncancel()
            await settlements_finish(SETTLE_WAIT_SECONDS)
            raise Drained(retry_after=1) from None
        finally:
            self.tasks.discard(task)
            self.cut.discard(task)


drain = Drain()
