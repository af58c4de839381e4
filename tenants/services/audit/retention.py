"""Retention: records older than FAIRLANE_AUDIT_RETENTION_DAYS are deleted, oldest first, by
the retention role only (the table's trigger refuses DELETE to every other role). Each chain
loses a prefix, and its head remembers the last removed record's seq and hash, so the chain
still verifies from its first remaining record.

On PostgreSQL this runs on a connection of its own, as FAIRLANE_AUDIT_RETENTION_DATABASE_URL
(a login role that is, or is granted, fairlane_audit_retention; never the application's
role). SQLite (the embedded mode, one machine, no roles) opens the trigger's window for the
length of the transaction."""

from __future__ import annotations

from datetime import datetime

import psycopg
from django.db import connection, transaction

RETENTION_ROLE = "fairlane_audit_retention"
PRUNE_SQL = """
WITH doomed AS (
    SELECT chain, max(seq) AS seq FROM tenants_auditrecord WHERE created_at < %(cutoff)s
    GROUP BY chain
), marks AS (
    SELECT d.chain, d.seq, r.hash FROM doomed d
    JOIN tenants_auditrecord r ON r.chain = d.chain AND r.seq = d.seq
), moved AS (
    UPDATE tenants_auditchainhead h SET pruned_seq = m.seq, pruned_hash = m.hash
    FROM marks m WHERE h.chain = m.chain RETURNING h.chain
)
DELETE FROM tenants_auditrecord r USING doomed d
WHERE r.chain = d.chain AND r.seq <= d.seq
"""


def audit_prune_postgres(*, database_url: str, cutoff: datetime) -> int:
    """Delete every record older than `cutoff` as the role of `database_url`; returns how many."""
    with psycopg.connect(database_url, autocommit=False) as conn:
        with conn.cursor() as cursor:
            # The login role is, or is granted, the retention role: act as it (the trigger
            # lets that role alone delete).
            cursor.execute(f"SET LOCAL ROLE {RETENTION_ROLE}")
            cursor.execute(PRUNE_SQL, {"cutoff": cutoff})
            deleted = cursor.rowcount
        conn.commit()
    return deleted


def audit_prune_sqlite(*, cutoff: datetime) -> int:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("INSERT INTO fairlane_audit_retention_window (open) VALUES (1)")
        cursor.execute(
            "SELECT chain, max(seq) FROM tenants_auditrecord WHERE created_at < %s GROUP BY chain",
            [cutoff],
        )
        deleted = 0
        for chain, seq in cursor.fetchall():
            cursor.execute(
                "SELECT hash FROM tenants_auditrecord WHERE chain = %s AND seq = %s", [chain, seq]
            )
            (digest,) = cursor.fetchone()
            cursor.execute(
                "UPDATE tenants_auditchainhead SET pruned_seq = %s, pruned_hash = %s "
                "WHERE chain = %s",
                [seq, digest, chain],
            )
            cursor.execute(
                "DELETE FROM tenants_auditrecord WHERE chain = %s AND seq <= %s", [chain, seq]
            )
            deleted += cursor.rowcount
        cursor.execute("DELETE FROM fairlane_audit_retention_window")
    return deleted
