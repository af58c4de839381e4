"""Budget reservations live as long as their requests: this process renews the reservations of
the requests it is serving (every third of FAIRLANE_RESERVATION_TTL_SECONDS, one UPDATE for all
of them), as a GPU worker's heartbeat renews its claims on the fair queue's requests. A process
that dies stops renewing, and the beat releases its reservations once they expire. The
renewer is a part of the runtime (workers/serving/runtime.py)."""

from __future__ import annotations

import logging
import threading

from django.conf import settings
from django.db import close_old_connections

from tenants.loops import BackgroundLoop
from tenants.services.budgets import budget_reservations_renew

logger = logging.getLogger(__name__)


class ReservationRenewer:
    def __init__(self) -> None:
        self._ids: set[str] = set()
        self._lock = threading.Lock()
        self.loop = BackgroundLoop(
            "reservation-renewer",
            self._step,
            interval=lambda: max(settings.FAIRLANE_RESERVATION_TTL_SECONDS / 3, 0.2),
        )

    def add(self, request_id: str) -> None:
        with self._lock:
            self._ids.add(request_id)
        self.loop.start()

    def discard(self, request_id: str) -> None:
        with self._lock:
            self._ids.discard(request_id)

    def reserved(self) -> list[str]:
        with self._lock:
            return sorted(self._ids)

    def renew_now(self) -> None:
        ids = self.reserved()
        try:
            budget_reservations_renew(request_ids=ids)
        except Exception:  # the database blinked: the next round tries again, well in time
            logger.warning("could not renew %d budget reservation(s)", len(ids), exc_info=True)
        finally:
            close_old_connections()

    def _step(self) -> None:
        if self.reserved():
            self.renew_now()
