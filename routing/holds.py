"""Budget holds live as long as their requests: this process renews the holds of the requests
it is serving (every third of FAIRLANE_RESERVATION_TTL_SECONDS, one UPDATE for all of them),
as a GPU worker's heartbeat renews its claims on the fair queue's requests. A process that dies stops renewing,
and the beat releases its holds once they expire."""

from __future__ import annotations

import logging
import threading

from django.conf import settings
from django.db import close_old_connections

from tenants.services.budgets import budget_holds_renew

logger = logging.getLogger(__name__)


class HoldRenewer:
    def __init__(self) -> None:
        self._ids: set[str] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()

    def add(self, request_id: str) -> None:
        with self._lock:
            self._ids.add(request_id)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="hold-renewer",
                                                daemon=True)
                self._thread.start()

    def discard(self, request_id: str) -> None:
        with self._lock:
            self._ids.discard(request_id)

    def held(self) -> list[str]:
        with self._lock:
            return sorted(self._ids)

    def renew_now(self) -> None:
        ids = self.held()
        try:
            budget_holds_renew(request_ids=ids)
        except Exception:  # the database blinked: the next round tries again, well in time
            logger.warning("could not renew %d budget hold(s)", len(ids), exc_info=True)
        finally:
            close_old_connections()

    def _loop(self) -> None:
        while True:
            self._wake.wait(max(settings.FAIRLANE_RESERVATION_TTL_SECONDS / 3, 0.2))
            self._wake.clear()
            if self.held():
                self.renew_now()


holds = HoldRenewer()
