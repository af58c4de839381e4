"""`make test`'s workers each use a Redis database of their own (tests/xdist_env.py)."""

import os

from django.conf import settings

from tests.xdist_env import worker_redis_url


def test_each_worker_moves_the_redis_database_by_its_number():
    assert worker_redis_url("redis://127.0.0.1:6379/0", "gw0") == "redis://127.0.0.1:6379/0"
    assert worker_redis_url("redis://127.0.0.1:6379/0", "gw1") == "redis://127.0.0.1:6379/1"
    assert worker_redis_url("redis://:pw@10.0.0.5:6380/4", "gw3") == "redis://:pw@10.0.0.5:6380/7"
    assert worker_redis_url("redis://127.0.0.1:6379", "gw2") == "redis://127.0.0.1:6379/2"


def test_this_process_uses_its_workers_redis_database():
    """Under xdist, the settings (hence every server and worker the tests start) took the
    worker's database; a run without xdist keeps the one named."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    db = int(settings.REDIS_URL.rsplit("/", 1)[1])
    if worker:
        assert os.environ["REDIS_URL"] == settings.REDIS_URL
        assert db >= int(worker.removeprefix("gw"))
    assert settings.CELERY_BROKER_URL == settings.REDIS_URL
