"""Services a test owns and may disrupt: a dedicated redis-server (or a small Redis Cluster) on
free ports, a dedicated PostgreSQL database cloned from the test database, and a TCP proxy that
adds latency or cuts connections. Nothing here touches the machine's shared Redis or the other
databases on its PostgreSQL server."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
import redis

from tests.servers import free_port


def _wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {port}")


class RedisServer:
    """A redis-server of our own, without persistence: a restart loses everything, as a crashed
    cache node does."""

    def __init__(self, *extra: str, port: int | None = None) -> None:
        self.port = port or free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="fl-redis-"))
        self.extra = extra
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.dir),
                *self.extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_port(self.port)

    def kill(self) -> None:
        """Gone at once, with everything it held."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self, down_for: float = 0.0) -> None:
        self.kill()
        time.sleep(down_for)
        self.start()

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def _cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is a valid, free port too."""
    while True:
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


class RedisCluster:
    """Three masters, no replicas: every slot is served by exactly one node."""

    def __init__(self) -> None:
        self.nodes = [
            RedisServer(
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                port=_cluster_port(),
            )
            for _ in range(3)
        ]
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *(f"127.0.0.1:{n.port}" for n in self.nodes),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            info = self.nodes[0].client().execute_command("CLUSTER", "INFO")
            info = info.decode() if isinstance(info, bytes) else str(info)
            if "cluster_state:ok" in info:
                return
            time.sleep(0.1)
        raise TimeoutError("the cluster did not become ready")

    def client(self):
        from redis.cluster import RedisCluster as Client

        return Client(host="127.0.0.1", port=self.nodes[0].port)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


class Database:
    """A PostgreSQL database of our own on the local server, cloned from the test database (its
    schema and the rows the test committed). Only its own connections are ever terminated."""

    def __init__(
        self, template: str, *, host: str = "127.0.0.1", port: int = 5432, user: str = "postgres"
    ) -> None:
        self.name = f"fl_chaos_{uuid.uuid4().hex[:10]}"
        self.host, self.port, self.user = host, port, user
        with self._admin() as conn:
            for _ in range(50):  # the template must have no other sessions for a moment
                try:
                    conn.execute(f'CREATE DATABASE "{self.name}" TEMPLATE "{template}"')
                    break
                except psycopg.errors.ObjectInUse:
                    # Idle connections that earlier tests' threads (the loop's executor, which
                    # the request path uses) left open on the test database: the test process
                    # reconnects when it needs them (CONN_HEALTH_CHECKS).
                    conn.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = %s AND pid <> pg_backend_pid() "
                        "AND state = 'idle'",
                        [template],
                    )
                    time.sleep(0.1)
            else:
                raise RuntimeError(f"{template} stayed in use")

    def _admin(self) -> psycopg.Connection:
        return psycopg.connect(
            host=self.host, port=self.port, user=self.user, dbname="postgres", autocommit=True
        )

    @property
    def url(self) -> str:
        return f"postgres://{self.user}@{self.host}:{self.port}/{self.name}"

    def connect(self) -> psycopg.Connection:
        return psycopg.connect(
            host=self.host, port=self.port, user=self.user, dbname=self.name, autocommit=True
        )

    def query(self, sql: str, *params) -> list[tuple]:
        with self.connect() as conn:
            return conn.execute(sql, params).fetchall()

    def terminate_connections(self) -> int:
        """pg_terminate_backend on every session of this database (ours only)."""
        with self._admin() as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (self.name,),
            ).fetchall()
        return len(rows)

    def set_reachable(self, reachable: bool) -> None:
        """Refuse (or accept again) new sessions, and end the open ones: to its clients the
        database is unreachable."""
        with self._admin() as conn:
            conn.execute(
                f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS {"true" if reachable else "false"}'
            )
        if not reachable:
            self.terminate_connections()

    def drop(self) -> None:
        with self._admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
