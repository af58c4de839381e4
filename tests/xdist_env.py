"""`make test` runs the suite on pytest-xdist workers: each worker gets a Redis database of its
own, before Django reads its settings (this plugin is loaded with ``-p``, ahead of
pytest-django's set-up). The fair queue, the GPU workers' heartbeats, the Celery broker and the
caches of one worker's tests and servers are then never another's, as they are never another
deployment's. PostgreSQL needs nothing here: pytest-django gives each worker its own test
database (``test_<name>_gw0``...). Without xdist this does nothing."""

import os
from urllib.parse import urlsplit, urlunsplit


def worker_redis_url(url: str, worker: str) -> str:
    """``url`` with its database number moved up by the worker's number (gw0: unchanged)."""
    parts = urlsplit(url)
    base = int(parts.path.strip("/") or 0)
    return urlunsplit(parts._replace(path=f"/{base + int(worker.removeprefix('gw'))}"))


_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker.startswith("gw") and os.environ.get("REDIS_URL"):
    os.environ["REDIS_URL"] = worker_redis_url(os.environ["REDIS_URL"], _worker)
