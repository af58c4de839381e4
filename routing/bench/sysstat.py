"""CPU time read from /proc (Linux): a benchmarked server's whole process group (uvicorn's
workers, LiteLLM's), the PostgreSQL and Redis servers a gateway leans on, this process (the
load generator) and the whole machine (how busy its cores were, and what the host stole)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: str) -> tuple[str, int, float] | None:
    """(command name, session id, CPU seconds) of one process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name = raw[raw.index("(") + 1 : raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2 :].split()
    # fields[0] is state (field 3 of stat); session is field 6, utime 14, stime 15.
    return name, int(fields[3]), (int(fields[11]) + int(fields[12])) / TICKS


def _all() -> list[tuple[str, int, float]]:
    stats = (_stat(pid) for pid in os.listdir("/proc") if pid.isdigit())
    return [s for s in stats if s is not None]


def cpu_seconds(process) -> float:
    """CPU seconds used so far by every live process in `process`'s session (it was started
    with start_new_session, so the session id is its pid)."""
    if process is None:
        return 0.0
    sid = process.proc.pid
    return sum(cpu for _, session, cpu in _all() if session == sid)


def server_cpu_seconds() -> float:
    """CPU seconds of the PostgreSQL and Redis servers on this machine (shared by whatever
    else runs: an upper bound of what the benchmarked gateway cost them)."""
    return sum(cpu for name, _, cpu in _all() if name.startswith(("postgres", "redis-server")))


def machine_seconds() -> tuple[float, float, float]:
    """(busy, stolen, all) CPU seconds of every core since boot: /proc/stat's first line. Busy
    is user, nice, system, irq and softirq time; stolen is what the hypervisor gave to other
    guests (a shared host's slow phases); the rest is idle and I/O wait."""
    line = Path("/proc/stat").read_text().split("\n", 1)[0]
    user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in line.split()[1:9])
    busy = user + nice + system + irq + softirq
    return busy / TICKS, steal / TICKS, (busy + idle + iowait + steal) / TICKS


_pg = None  # a psycopg connection of its own (the probe runs inside the load's event loop)


def db_transactions() -> int:
    """Transactions committed and rolled back in this database so far (pg_stat_database):
    every statement run outside a transaction counts one, a batch of holds one. PostgreSQL's
    backends publish these about once a second, so over a window of several seconds the
    difference is close. 0 without PostgreSQL."""
    global _pg
    from django.conf import settings
    from django.db import connection

    if connection.vendor != "postgresql":  # PostgreSQL's backend or its pool (platform/pgpool)
        return 0
    db = settings.DATABASES["default"]
    import psycopg

    if _pg is None or _pg.closed:
        _pg = psycopg.connect(
            dbname=db["NAME"],
            user=db.get("USER") or None,
            password=db.get("PASSWORD") or None,
            host=db.get("HOST") or None,
            port=db.get("PORT") or None,
            autocommit=True,
        )
    row = _pg.execute(
        "SELECT xact_commit + xact_rollback FROM pg_stat_database "
        "WHERE datname = current_database()"
    ).fetchone()
    return int(row[0]) if row else 0


@dataclass(frozen=True, slots=True)
class Sample:
    """CPU counters at one moment, for the difference over a measured window."""

    server: float
    db_redis: float
    loadgen: float
    busy: float
    stolen: float
    all: float
    db_xacts: int = 0

    @classmethod
    def take(cls, process) -> Sample:
        busy, stolen, every = machine_seconds()
        return cls(
            cpu_seconds(process),
            server_cpu_seconds(),
            time.process_time(),
            busy,
            stolen,
            every,
            db_transactions(),
        )

    def until(self, end: Sample, served: int) -> dict:
        """The window's figures: CPU per request of each part, and the machine's cores' busy
        and stolen shares (percent of all cores' time)."""
        served, every = max(served, 1), max(end.all - self.all, 1e-9)

        def per_request(name: str) -> float:
            return round((getattr(end, name) - getattr(self, name)) * 1000 / served, 3)

        return {
            "cpu_ms_per_request": per_request("server"),
            "db_redis_cpu_ms_per_request": per_request("db_redis"),
            "loadgen_cpu_ms_per_request": per_request("loadgen"),
            "machine_busy_pct": round((end.busy - self.busy) * 100 / every, 1),
            "machine_stolen_pct": round((end.stolen - self.stolen) * 100 / every, 1),
            # the probe's own query counts 1 of them
            "db_xacts_per_request": round((end.db_xacts - self.db_xacts - 1) / served, 3),
        }
