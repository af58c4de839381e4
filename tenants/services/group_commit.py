"""Group commit for the budget calls on PostgreSQL: the holds (or the settlements) that a
process's concurrent requests make at the same moment run as one statement, one transaction.

Every request of an agent updates the same two window rows (its own and its tenant's), so
under load their transactions queued on those rows' locks, each paying its own commit and
round trip. Here the first caller to arrive runs its call (it leads); callers that arrive
meanwhile wait, and when it is done the first of them leads the next batch, with all of them
in it. A caller alone runs its call as before; nobody waits for a timer.

A batch is one call of migration 0007's `*_many` function: the same single-call functions, in
order, in one transaction, so each call's result is what it would have been had the calls been
made one after another. When the batch's statement fails and the connection still works, each
call runs again alone, so that only the one at fault fails; when the connection failed, every
call of the batch gets that error, as each would have alone (callers treat it as transient: a
hold is released, a settlement is queued durably, workers/serving/outbox.py).

The leader runs the batch on its own thread's connection (from the pool, and checked by it,
where FAIRLANE_DB_POOL_SIZE sets one). A follower gives its pooled connection back before it
waits: followers holding the pool's connections while the leader waits for one would stall the
batch until the pool's timeout."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

import psycopg
from django.conf import settings
from django.db import connection, utils

logger = logging.getLogger(__name__)

MAX_BATCH = 64


@dataclass(slots=True, eq=False)
class Call:
    """One call of a budget function, with its parameters."""

    params: list
    row: tuple | None = None
    error: BaseException | None = None
    lead: bool = False  # woken to lead the next batch, not with a result
    done: threading.Event = field(default_factory=threading.Event)

    def result(self) -> tuple:
        if self.error is not None:
            raise _django_error(self.error)
        if self.row is None:  # every budget function returns one row
            raise utils.DatabaseError("the budget function returned no row")
        return self.row


class GroupCommit:
    """Calls of one function (`single`), batched by its `many` (arrays, one per parameter)."""

    def __init__(self, single: str, many: str) -> None:
        self.single, self.many = single, many
        self._lock = threading.Lock()
        self._pending: list[Call] = []
        self._running = False
        self.largest = 0  # the most calls one batch has held (tests and benchmarks read it)

    def run(self, params: list) -> tuple:
        """The call's row once its batch has committed; Django's database errors."""
        call = Call(params)
        with self._lock:
            self._pending.append(call)
            leads = not self._running
            self._running = True
        if not leads:
            if getattr(connection, "pool", None) is not None and connection.connection is not None:
                connection.close()  # back to the pool, for the leader (see above)
            call.done.wait()
            if not call.lead:
                return call.result()
        self._lead()
        return call.result()

    def _lead(self) -> None:
        with self._lock:
            batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            self.largest = max(self.largest, len(batch))
        try:
            self._run(batch)
        finally:
            with self._lock:
                if self._pending:  # they arrived meanwhile: the first of them leads them
                    self._pending[0].lead = True
                    self._pending[0].done.set()
                else:
                    self._running = False

    def _run(self, batch: list[Call]) -> None:
        conn = None
        try:
            connection.ensure_connection()
            conn = connection.connection
            if len(batch) == 1:
                self._alone(conn, batch[0])
            else:
                self._together(conn, batch)
        except Exception as exc:
            for call in batch:
                if call.row is None and call.error is None:
                    call.error = exc
        finally:
            for call in batch:
                call.done.set()
        if conn is None or conn.closed or conn.broken:
            connection.errors_occurred = True  # Django replaces it at the hop's end

    def _alone(self, conn: psycopg.Connection, call: Call) -> None:
        try:
            with psycopg.Cursor(conn) as cursor:
                cursor.execute(self.single, call.params, prepare=prepared())
                call.row = cursor.fetchone()
        except psycopg.Error as exc:
            if conn.closed or conn.broken:
                raise
            call.error = exc

    def _together(self, conn: psycopg.Connection, batch: list[Call]) -> None:
        columns = [list(column) for column in zip(*(call.params for call in batch), strict=False)]
        try:
            with psycopg.Cursor(conn) as cursor:
                cursor.execute(self.many, columns, prepare=prepared())
                rows = cursor.fetchall()
        except psycopg.Error as exc:
            if conn.closed or conn.broken:
                raise
            logger.info(
                "a batch of %d budget calls failed (%s): each alone", len(batch), type(exc).__name__
            )
            for call in batch:
                self._alone(conn, call)
            return
        for call, row in zip(batch, rows, strict=True):
            call.row = row


def prepared() -> bool:
    """psycopg's `prepare` for the budget statements: on first use on each connection, unless
    FAIRLANE_DB_PREPARE is off (settings.py then leaves Django's never on the connection)."""
    return settings.FAIRLANE_DB_PREPARE


def _django_error(exc: BaseException) -> BaseException:
    """psycopg's error as Django's (what callers catch); a new one for each caller, since
    each raises it in its own thread."""
    if isinstance(exc, utils.Error):  # Django's already (connecting failed)
        error = type(exc)(*exc.args)
        error.__cause__ = exc.__cause__ or exc
        return error
    for name in (
        "DataError",
        "OperationalError",
        "IntegrityError",
        "InternalError",
        "ProgrammingError",
        "NotSupportedError",
        "DatabaseError",
        "InterfaceError",
        "Error",
    ):
        if isinstance(exc, getattr(psycopg, name)):
            error = getattr(utils, name)(*exc.args)
            error.__cause__ = exc
            return error
    return exc
