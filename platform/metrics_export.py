"""/metrics that add up across processes: prometheus_client's multiprocess mode.

With PROMETHEUS_MULTIPROC_DIR set (e.g. `uvicorn --workers 4`), every process writes its
counters, histograms and gauges to memory-mapped files in that directory, and whichever
process answers a scrape adds up all of them (gauges by their `multiprocess_mode`), alongside
the figures collected at scrape time (backends, engines, queues, spend), which read shared
state (the database, Redis) and so are the same from every process.

The directory belongs to one deployment on one host and is emptied when it starts:
`multiproc_dir_prepare()` (called by the settings, before any metric exists) takes a lock,
and if no process that used the directory is still alive, removes what the previous run
left; it then records this process (pid and start time, so a reused pid is not mistaken for
a live one). Files of processes that died meanwhile are kept (their counts still add up),
except their live gauges.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

ENV = "PROMETHEUS_MULTIPROC_DIR"


def _start_time(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "0"


def _alive(marker: str) -> bool:
    pid, _, started = marker.partition("-")
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return _start_time(int(pid)) == started


def multiproc_dir_prepare() -> Path | None:
    """Empty the directory if this is the first process of a new run; record this process."""
    raw = os.environ.get(ENV)
    if not raw:
        return None
    path = Path(raw)
    owners = path / "owners"
    owners.mkdir(parents=True, exist_ok=True)
    me = f"{os.getpid()}-{_start_time(os.getpid())}"
    with open(path / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        markers = [m.name for m in owners.iterdir()]
        alive = [m for m in markers if m != me and _alive(m)]
        for marker in set(markers) - set(alive) - {me}:
            (owners / marker).unlink(missing_ok=True)
            pid = marker.partition("-")[0]
            for stale in path.glob(f"gauge_live*_{pid}.db"):
                stale.unlink(missing_ok=True)
        if not alive:
            for stale in path.glob("*.db"):
                stale.unlink(missing_ok=True)
        (owners / me).touch()
    return path


def metrics_registry():
    """The registry a scrape reads: this process's (REGISTRY) in the single-process mode; in
    the multiprocess one, every process's files plus the scrape-time collectors."""
    import prometheus_client
    from prometheus_client import gc_collector, multiprocess, platform_collector, process_collector
    from prometheus_client.metrics import MetricWrapperBase

    if not os.environ.get(ENV):
        return prometheus_client.REGISTRY
    registry = prometheus_client.CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    per_process = (
        MetricWrapperBase,
        process_collector.ProcessCollector,
        platform_collector.PlatformCollector,
        gc_collector.GCCollector,
    )
    # Collectors the apps registered (apps.py): their figures come from shared state.
    for collector in list(prometheus_client.REGISTRY._collector_to_names):
        if not isinstance(collector, per_process):
            registry.register(collector)
    return registry
