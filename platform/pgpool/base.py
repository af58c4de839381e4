"""The PostgreSQL backend (django-prometheus's, for its query metrics) whose connection pool
heals at once after the server ended its connections (a restart, a failover,
pg_terminate_backend, a proxy's idle cut).

Django hands the pool psycopg_pool's check (CONN_HEALTH_CHECKS): one empty round trip before
a request gets a connection. Alone it finds dead connections one at a time, pausing 1 s, 2 s,
4 s ... between them, so a request after a restart times out on a pool full of dead ones.
Here a dead connection makes the pool check every idle one at once and replace the dead."""

from __future__ import annotations

import logging

from django_prometheus.db.backends.postgresql.base import DatabaseWrapper as PrometheusWrapper
from psycopg_pool import ConnectionPool

logger = logging.getLogger(__name__)


def connection_check(conn) -> None:
    try:
        ConnectionPool.check_connection(conn)
    except Exception:
        pool = getattr(conn, "_pool", None)
        if pool is not None:
            logger.warning("a pooled database connection was dead: checking the others")
            pool.check()
        raise


class DatabaseWrapper(PrometheusWrapper):
    @property
    def pool(self):
        pool = super().pool
        if pool is not None and getattr(pool, "_check", None) is ConnectionPool.check_connection:
            pool._check = connection_check  # the constructor's `check`, which Django sets
        return pool
