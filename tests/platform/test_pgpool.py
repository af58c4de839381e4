"""The pool's connection check (platform/pgpool): a quiet idle connection is handed out without
a round trip, and one the server ended is caught before a request gets it (real PostgreSQL)."""

import time

import psycopg
import pytest
from django.conf import settings

from pgpool.base import connection_check, connection_quiet

pytestmark = pytest.mark.django_db


def _connect() -> psycopg.Connection:
    db = settings.DATABASES["default"]
    return psycopg.connect(
        host=db["HOST"] or None,
        port=db["PORT"] or None,
        user=db["USER"],
        dbname=db["NAME"],
        autocommit=True,
    )


def test_a_quiet_connection_is_checked_without_a_round_trip():
    conn = _connect()
    try:
        conn.execute("SELECT 1").fetchone()
        assert connection_quiet(conn)
        with conn.transaction():  # mid-transaction: never handed out as quiet
            assert not connection_quiet(conn)
        connection_check(conn)  # quiet: no statement sent, nothing raised
        assert connection_quiet(conn)
    finally:
        conn.close()
    assert not connection_quiet(conn)  # closed


def test_a_connection_the_server_ended_fails_the_check():
    conn, killer = _connect(), _connect()
    try:
        pid = conn.info.backend_pid
        assert killer.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0]
        deadline = time.monotonic() + 5
        while connection_quiet(conn) and time.monotonic() < deadline:
            time.sleep(0.01)  # the server's goodbye reaches the socket
        assert not connection_quiet(conn)
        with pytest.raises(psycopg.OperationalError):
            connection_check(conn)
    finally:
        conn.close()
        killer.close()
