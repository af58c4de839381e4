"""The PostgreSQL backend (django-prometheus's, for its query metrics) whose connection pool
heals at once after the server ended its connections (a restart, a failover,
pg_terminate_backend, a proxy's idle cut).

Django hands the pool psycopg_pool's check (CONN_HEALTH_CHECKS): one empty round trip before
a request gets a connection. Alone it finds dead connections one at a time, pausing 1 s, 2 s,
4 s ... between them, so a request after a restart times out on a pool full of dead ones.
Here a dead connection makes the pool check every idle one at once and replace the dead.

The round trip is skipped when the connection is provably quiet: idle, and nothing to read on
its socket. A server that ends a connection (terminate, shutdown, restart, a proxy's cut)
sends its error or closes the socket, either of which makes it readable; then the full check
runs. A request's hops each take a connection, so this saves a round trip on each of them."""

from __future__ import annotations

import logging
import select

from django_prometheus.db.backends.postgresql.base import DatabaseWrapper as PrometheusWrapper
from psycopg import pq
from psycopg_pool import ConnectionPool

logger = logging.getLogger(__name__)


def connection_quiet(conn) -> bool:
    """Idle, in a good state, and the server has sent nothing since it was last used."""
    if (
        conn.closed
        or conn.pgconn.status != pq.ConnStatus.OK
        or conn.info.transaction_status != pq.TransactionStatus.IDLE
    ):
        return False
    poller = select.poll()
    try:
        poller.register(conn.fileno(), select.POLLIN)
        return not poller.poll(0)
    except (OSError, ValueError):
        return False


def connection_check(conn) -> None:
    if connection_quiet(conn):
        return
    try:
        ConnectionPool.check_connection(conn)
    except Exception:
        pool = getattr(conn, "_pool", None)
        if pool is not None:
            logger.warning("a pooled database connection was dead: checking the others")
            pool.check()
        raise


class DatabaseWrapper(PrometheusWrapper):
    def get_connection_params(self):
        # Pooled: get_new_connection takes a connection from the pool and ignores these, so
        # they are not built again on every checkout (each of a request's database hops).
        if self.alias in self._connection_pools:
            return {}
        return super().get_connection_params()

    @property
    def pool(self):
        pool = super().pool
        if pool is not None and getattr(pool, "_check", None) is ConnectionPool.check_connection:
            pool._check = connection_check  # the constructor's `check`, which Django sets
        return pool
