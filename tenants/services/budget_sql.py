"""The reservation and the settlement in one round trip each, on PostgreSQL: the functions that
migration 0005 creates, called here. They keep the rules budgets.py and settlement.py state
(both windows or neither; the agent's window locked before the tenant's; a settlement charges
at most what its windows have room for and writes its one ledger row), as one short
transaction, so that requests of one agent queue on its window rows for microseconds. SQLite
(the embedded mode, one process) keeps the ORM path.

Both are sent with server-side binding on psycopg's own cursor: its C dumpers encode the
parameters. Django's cursor binds client-side, quoting each parameter into the SQL in Python,
which cost more CPU than the rest of the call. They are prepared on each connection at first
use (FAIRLANE_DB_PREPARE): Django sets psycopg's prepare threshold to never, and parsing and
planning them on every call cost PostgreSQL measurable CPU a request (docs/benchmarks.md).
Database errors still come out as Django's (IntegrityError, ...). The SQL functions keep the
names they were created with (fairlane_budget_hold*)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import psycopg
from django.db import IntegrityError, connection, transaction
from psycopg.types.json import Jsonb

from tenants.models import Reservation
from tenants.services.group_commit import GroupCommit, prepared

RESERVE = "SELECT fairlane_budget_hold(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
SETTLE = (
    "SELECT * FROM fairlane_budget_settle(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
# Concurrent requests' calls, batched (migration 0007's functions; one array per parameter).
_reservations = GroupCommit(
    RESERVE,
    "SELECT * FROM fairlane_budget_hold_many(%s::uuid[], "
    "%s::varchar[], %s::bigint[], %s::uuid[], %s::uuid[], %s::bigint[], "
    "%s::bigint[], %s::bigint[], %s::jsonb[], %s::varchar[], %s::timestamptz[], "
    "%s::timestamptz[])",
)
_settlements = GroupCommit(
    SETTLE,
    "SELECT * FROM fairlane_budget_settle_many(%s::varchar[], "
    "%s::bigint[], %s::bigint[], %s::varchar[], %s::varchar[], "
    "%s::integer[], %s::integer[], %s::integer[], %s::integer[], "
    "%s::varchar[], %s::timestamptz[], %s::varchar[], %s::varchar[], "
    "%s::jsonb[])",
)


_NO_EXTRA = Jsonb([])
_vendor: str | None = None


def enabled() -> bool:
    global _vendor
    if _vendor is None:  # a process keeps its database
        _vendor = connection.vendor
    return _vendor == "postgresql"


def reserve(reservation: Reservation) -> str:
    """Reserve `reservation` (unsaved) on its windows and insert it: "" when held, else whose
    window could not cover it ("agent", "tenant" or "window:<id>" for an extra window), with
    nothing held. IntegrityError when the request id has a reservation already."""
    r = reservation
    params = [
        r.id,
        r.request_id,
        r.tenant_id,
        r.agent_id,
        r.api_key_id,
        r.amount_microcents,
        r.agent_window_id,
        r.tenant_window_id,
        _NO_EXTRA if not r.extra_windows else Jsonb(r.extra_windows),
        r.model,
        r.created_at,
        r.expires_at,
    ]
    if not connection.in_atomic_block:  # the request path: batched with its neighbours'
        refused = _reservations.run(params)[0]
        if refused == "duplicate":
            raise IntegrityError(f"a reservation for request {r.request_id} exists")
        return refused
    # Inside a caller's transaction a refused insert must not abort it: a savepoint.
    with transaction.atomic():
        return _call_one(RESERVE, params)[0]


def _call_one(sql: str, params: list) -> tuple:
    """One row of `sql`, bound server-side on this thread's Django connection, inside its
    transaction."""
    connection.ensure_connection()
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(sql, params, prepare=prepared())
        row = cursor.fetchone()
    if row is None:  # every budget function returns one row
        raise IntegrityError("the budget function returned no row")
    return row


@dataclass(frozen=True, slots=True)
class Settled:
    outcome: str  # ok | settled (already: nothing changed) | missing (no reservation)
    charge: int
    held: int
    prior: str  # the reservation's status before (held, released, expired)
    usage_id: int | None
    agent_id: uuid.UUID | None = None  # psycopg reads uuid columns as uuid.UUID
    api_key_id: uuid.UUID | None = None
    agent_window_id: int | None = None
    tenant_window_id: int | None = None
    agent_spent: int | None = None  # the windows' spent after this charge
    tenant_spent: int | None = None
    extra_window_ids: list[int] | None = None  # the extra windows, and their spent after it
    extra_spent: list[int] | None = None

    def spent_after(self) -> dict:
        """Window id -> its spent after this charge."""
        after = {self.agent_window_id: self.agent_spent, self.tenant_window_id: self.tenant_spent}
        after.update(zip(self.extra_window_ids or (), self.extra_spent or (), strict=True))
        return after

    def window_ids(self) -> tuple:
        return (self.agent_window_id, self.tenant_window_id, *(self.extra_window_ids or ()))


def settle(*, request_id: str, tenant_id: int, cost: int, usage, now) -> Settled:
    params = [
        request_id,
        tenant_id,
        cost,
        usage.backend,
        usage.model,
        usage.prompt_tokens,
        usage.completion_tokens,
        usage.cached_tokens,
        usage.latency_ms,
        usage.status,
        now,
        usage.trace_id,
        usage.model_version,
        Jsonb(usage.timeline or {}),
    ]
    outcome, charge, held, prior, usage_id, *rest = (
        _call_one(SETTLE, params) if connection.in_atomic_block else _settlements.run(params)
    )
    return Settled(outcome, charge or 0, held or 0, prior or "", usage_id, *rest)
