"""CPU time of benchmarked processes, read from /proc (Linux): a server's whole process group
(uvicorn's workers, LiteLLM's), and the PostgreSQL and Redis servers a gateway leans on."""

from __future__ import annotations

import os
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: str) -> tuple[str, int, float] | None:
    """(command name, session id, CPU seconds) of one process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name = raw[raw.index("(") + 1:raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2:].split()
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
    return sum(cpu for name, _, cpu in _all()
               if name.startswith(("postgres", "redis-server")))
