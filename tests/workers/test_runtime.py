"""The runtime (workers/serving/runtime.py, built by routing/runtimes.py): every part that
differs between the modes, built once from FAIRLANE_ENGINE_MODE; no other module reads the
mode or REDIS_URL, and only the process's edges ask for the installed runtime."""

import os
import re
import subprocess
import sys
import threading
import time

import pytest

from routing.leases import LocalLeases, RedisLeases
from routing.ratelimit import LocalLimiter, RedisLimiter
from routing.runtimes import runtime_build, runtime_installed, runtime_using
from tenants.loops import LOOP_ERRORS, BackgroundLoop, LoopGroup
from tenants.services.alerts import CeleryAlertSender, EmbeddedAlertSender
from tests.conftest import ROOT, wait_for
from workers.dispatch import EmbeddedDispatcher, QueueDispatcher
from workers.pools import DistributedPool, EmbeddedPool
from workers.serving.runtime import Mode


def test_an_embedded_runtime_without_redis_has_the_in_process_parts():
    runtime = runtime_build("embedded", redis_url="")
    assert runtime.mode == Mode.EMBEDDED and runtime.redis is None
    assert isinstance(runtime.dispatcher, EmbeddedDispatcher)
    assert isinstance(runtime.pool, EmbeddedPool) and runtime.pool.host is runtime.engine_host
    assert isinstance(runtime.limiter, LocalLimiter) and isinstance(runtime.leases, LocalLeases)
    assert runtime.outbox.stream is None  # files only
    assert isinstance(runtime.alert_sender, EmbeddedAlertSender)
    assert runtime.counters.loop is None and runtime.cache_listener.loop is None


def test_embedded_engines_beside_redis_share_the_processes_state(embedded_runtime):
    """Several embedded API processes on one Redis (uvicorn --workers N) share their limits,
    leases, counts, invalidations and queued settlements; their engines stay their own."""
    runtime = embedded_runtime  # the tests run with REDIS_URL
    assert runtime.mode == Mode.EMBEDDED and runtime.redis is not None
    assert isinstance(runtime.dispatcher, EmbeddedDispatcher)
    assert isinstance(runtime.limiter, RedisLimiter) and isinstance(runtime.leases, RedisLeases)
    assert runtime.outbox.stream is not None
    assert isinstance(runtime.alert_sender, EmbeddedAlertSender)


def test_a_distributed_runtime_has_the_redis_parts_and_engines_only_on_a_gpu_worker():
    for engines in (False, True):
        runtime = runtime_build("distributed", engines=engines)
        assert runtime.mode == Mode.DISTRIBUTED and runtime.redis is not None
        assert isinstance(runtime.dispatcher, QueueDispatcher)
        assert isinstance(runtime.pool, DistributedPool)
        assert isinstance(runtime.limiter, RedisLimiter)
        assert isinstance(runtime.leases, RedisLeases)
        assert runtime.outbox.stream is not None
        assert isinstance(runtime.alert_sender, CeleryAlertSender)
        assert (runtime.engine_host is not None) is engines
        # One client for every Redis part.
        assert runtime.limiter.client is runtime.redis is runtime.pool.client
        assert runtime.counters.client is runtime.cache_listener.client is runtime.redis


def test_celery_still_names_the_distributed_mode():
    assert runtime_build("celery").mode == Mode.DISTRIBUTED


def test_installing_a_runtime_hands_it_to_the_edges_and_gives_the_last_one_back(embedded_runtime):
    before = runtime_installed()
    with runtime_using(embedded_runtime):
        assert runtime_installed() is embedded_runtime
    assert runtime_installed() is before


def test_the_settings_read_celery_from_the_environment_as_distributed():
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT}:{ROOT / 'platform'}",
        "DJANGO_SETTINGS_MODULE": "settings",
    }
    code = (
        "import django; django.setup(); from django.conf import settings; "
        "print(settings.FAIRLANE_ENGINE_MODE)"
    )
    for given, read in (
        ("celery", "distributed"),
        ("distributed", "distributed"),
        ("embedded", "embedded"),
    ):
        out = subprocess.run(
            [sys.executable, "-c", code],
            env={**env, "FAIRLANE_ENGINE_MODE": given},
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.strip() == read
    refused = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "FAIRLANE_ENGINE_MODE": "gpu"},
        capture_output=True,
        text=True,
    )
    assert refused.returncode != 0 and "must be 'embedded' or 'distributed'" in refused.stderr


RUNTIME_DIRS = ("routing", "tenants", "workers", "platform")
# Where the mode and the Redis URL may be read: the settings, and the runtime's builder.
MODE_READERS = {
    "platform/fairlane_settings.py",
    "platform/settings.py",
    "platform/environment.py",
    "routing/runtimes.py",
}
# The process's edges: the request handlers, the Celery start-up, commands.
EDGES = {"routing/runtimes.py", "platform/api_handler.py", "platform/middleware.py"}


def _runtime_sources():
    for top in RUNTIME_DIRS:
        for path in (ROOT / top).rglob("*.py"):
            relative = str(path.relative_to(ROOT))
            if "/bench/" in relative or "/migrations/" in relative:
                continue
            yield relative, path.read_text()


def test_no_module_but_the_builder_reads_the_mode_or_the_redis_url():
    readers = {
        name
        for name, text in _runtime_sources()
        if re.search(r"settings\.(FAIRLANE_ENGINE_MODE|REDIS_URL)\b", text)
    }
    assert readers <= MODE_READERS | {"platform/asgi.py", "platform/celery_app.py"}, readers
    assert not {
        name
        for name, text in _runtime_sources()
        if re.search(r"\b(mode_get|limiter_get|leases_get|host_get|redis_sync)\(", text)
    }


def test_only_the_edges_ask_for_the_installed_runtime():
    askers = {name for name, text in _runtime_sources() if "runtime_installed(" in text}
    assert askers <= EDGES, askers - EDGES


def test_a_loop_steps_wakes_counts_its_errors_and_stops_with_a_last_step():
    steps, finals = [], []
    failing = {"now": True}

    def step():
        steps.append(threading.current_thread().name)
        if failing["now"]:
            failing["now"] = False
            raise RuntimeError("boom")
        return 60.0  # asleep until woken

    before = LOOP_ERRORS.labels("test-loop")._value.get()
    loop = BackgroundLoop("test-loop", step, interval=lambda: 0.01, final=lambda: finals.append(1))
    loop.start()
    from tests.conftest import wait_for

    wait_for(lambda: len(steps) >= 2, 10, "a step after the failing one")
    assert LOOP_ERRORS.labels("test-loop")._value.get() == before + 1
    assert set(steps) == {"test-loop"}
    loop.wake()
    wait_for(lambda: len(steps) >= 3, 10, "the woken step")
    loop.stop()
    assert finals == [1] and not loop.is_running
    loop.start()  # a stopped loop stays stopped
    assert not loop.is_running


def test_a_group_stops_its_loops_in_order():
    order = []
    loops = [
        BackgroundLoop(
            name, lambda: None, interval=lambda: 60.0, final=lambda n=name: order.append(n)
        )
        for name in "abc"
    ]
    group = LoopGroup(*loops)
    group.start()
    assert all(loop.is_running for loop in loops)
    group.stop()
    assert order == ["a", "b", "c"]


@pytest.mark.django_db(transaction=True)
def test_settlements_retried_by_the_runtime_loop(tenant, agent, tmp_path):
    """The outbox part: a record queued while the ledger was down is settled by its loop."""
    from tenants.models import UsageRecord
    from tenants.services.budgets import budget_create, budget_reserve
    from tests.conftest import wait_for
    from workers.serving.outbox import Outbox, Settlement

    budget_create(tenant=tenant, agent=agent, limit_microcents=10**6)
    budget_reserve(tenant=tenant, agent=agent, amount_microcents=100, request_id="r-loop")
    outbox = Outbox(root=tmp_path)
    outbox.put(
        Settlement(
            request_id="r-loop",
            tenant_id=tenant.pk,
            cost_microcents=40,
            usage={"backend": "local", "model": "tiny"},
            at=time.time(),
        )
    )
    wait_for(lambda: UsageRecord.objects.filter(request_id="r-loop").exists(), 30, "settled")
    outbox.loop.stop()
    assert UsageRecord.objects.get(request_id="r-loop").cost_microcents == 40


def test_deployments_on_one_redis_see_only_their_own_workers(settings):
    """FAIRLANE_QUEUE_NAMESPACE separates deployments that share a Redis: the heartbeats too,
    so one deployment's API processes never count another's workers as theirs (its models
    hosted, its slots free)."""
    import json
    import uuid

    import redis as redis_lib

    from workers.pools import heartbeat_delete, heartbeat_write, workers_live

    client = redis_lib.Redis.from_url(settings.REDIS_URL)
    a, b = f"a{uuid.uuid4().hex[:6]}-", f"b{uuid.uuid4().hex[:6]}-"
    settings.FAIRLANE_QUEUE_NAMESPACE = a
    heartbeat_write(client, "host:1", json.dumps({"id": "host:1", "models": ["tiny"]}), 30)
    try:
        assert [beat["id"] for beat in workers_live(client)] == ["host:1"]
        settings.FAIRLANE_QUEUE_NAMESPACE = b
        assert workers_live(client) == []
        assert "host:1" in [beat["id"] for beat in workers_live(client, namespace="*")]
        assert "host:1" in [beat["id"] for beat in workers_live(client, namespace=a)]
        assert workers_live(client, namespace=b + "*") == []
    finally:
        settings.FAIRLANE_QUEUE_NAMESPACE = a
        heartbeat_delete(client, "host:1")
    assert workers_live(client) == []


def test_the_list_of_workers_drops_a_heartbeat_that_expired_or_was_deleted(settings):
    """The API processes read the workers through their list, not a SCAN: a worker that died
    (its heartbeat expired) or stopped (deleted) is not read as live, and a beat drops entries
    whose heartbeat expired more than a minute ago."""
    import json
    import time
    import uuid

    import redis as redis_lib

    from workers.pools import WORKERS, WORKERS_KEY, heartbeat_delete, heartbeat_write, workers_live

    client = redis_lib.Redis.from_url(settings.REDIS_URL)
    settings.FAIRLANE_QUEUE_NAMESPACE = f"w{uuid.uuid4().hex[:6]}-"
    heartbeat_write(client, "dies:1", json.dumps({"id": "dies:1", "models": []}), 1)
    heartbeat_write(client, "stays:2", json.dumps({"id": "stays:2", "models": []}), 30)
    heartbeat_write(client, "stops:3", json.dumps({"id": "stops:3", "models": []}), 30)
    try:
        assert sorted(b["id"] for b in workers_live(client)) == ["dies:1", "stays:2", "stops:3"]
        heartbeat_delete(client, "stops:3")
        assert sorted(b["id"] for b in workers_live(client)) == ["dies:1", "stays:2"]
        wait_for(lambda: [b["id"] for b in workers_live(client)] == ["stays:2"], timeout=10)
        # An entry whose heartbeat expired over a minute ago goes at the next beat.
        workers = settings.FAIRLANE_QUEUE_NAMESPACE + WORKERS_KEY
        stale = int(time.time() * 1000) - WORKERS.prune_ms - 1000
        client.zadd(workers, {"dies:1": stale})
        heartbeat_write(client, "stays:2", json.dumps({"id": "stays:2", "models": []}), 30)
        assert client.zrange(workers, 0, -1) == [b"stays:2"]
    finally:
        heartbeat_delete(client, "stays:2")


def test_deployments_on_one_redis_keep_their_cache_and_channel_groups_apart():
    """The Django cache (the sign-in lockouts) and the Channels layer under the namespace too:
    an entry one deployment writes is not another's, and is its own again in a later process."""
    import uuid

    from tests.conftest import child_env

    script = (
        "import sys, django; django.setup()\n"
        "from django.conf import settings; from django.core.cache import cache\n"
        "key, write = sys.argv[1], sys.argv[2] == 'write'\n"
        "cache.set(key, 'here', 60) if write else None\n"
        "print(cache.get(key), settings.CHANNEL_LAYERS['default']['CONFIG']['prefix'])\n"
    )
    key, a, b = uuid.uuid4().hex, f"a{uuid.uuid4().hex[:6]}-", f"b{uuid.uuid4().hex[:6]}-"

    def run(namespace: str, action: str) -> str:
        env = child_env(FAIRLANE_QUEUE_NAMESPACE=namespace)
        done = subprocess.run(
            [sys.executable, "-c", script, key, action],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.split("\n")[-2]

    assert run(a, "write") == f"here {a}asgi"
    assert run(b, "read") == f"None {b}asgi"  # another deployment's
    assert run(a, "read") == f"here {a}asgi"  # its own, in another process


@pytest.mark.slow
def test_deployments_on_one_redis_run_only_their_own_celery_tasks(subprocess_env):
    """Celery's queues under the namespace too (kombu's global key prefix): a housekeeping
    task one deployment queues on `default` is never taken by another deployment's worker on a
    queue of the same name, which would run it against its own database. Deployment B's task
    is queued first: on one shared list the worker would take it before A's."""
    import uuid

    import redis as redis_lib
    from celery.result import AsyncResult
    from django.conf import settings

    from tests.conftest import child_env
    from tests.servers import CeleryWorker

    import celery_app

    a, b = f"a{uuid.uuid4().hex[:6]}-", f"b{uuid.uuid4().hex[:6]}-"
    script = (
        "import django; django.setup()\n"
        "import celery_app\n"
        "from tenants.tasks import budget_reservations_expire\n"
        "print(budget_reservations_expire.apply_async().id)\n"
    )

    def queue_task(namespace: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", script],
            env=child_env(FAIRLANE_QUEUE_NAMESPACE=namespace),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.split()[-1]

    client = redis_lib.Redis.from_url(settings.REDIS_URL)
    try:
        b_task = queue_task(b)
        assert client.llen(f"{b}default") == 1  # under B's prefix, not on a shared list
        a_task = queue_task(a)
        assert client.llen(f"{a}default") == 1
        worker = CeleryWorker(
            {**subprocess_env, "FAIRLANE_QUEUE_NAMESPACE": a},
            queue="default",
            concurrency=1,
            name="housekeeping",
        )
        try:
            assert AsyncResult(a_task, app=celery_app.app).get(timeout=60) == 0
        finally:
            worker.stop()
        assert client.llen(f"{b}default") == 1  # B's task waits for B's workers
        assert AsyncResult(b_task, app=celery_app.app).state == "PENDING"
    finally:
        for key in client.scan_iter(f"{a}*"):
            client.delete(key)
        for key in client.scan_iter(f"{b}*"):
            client.delete(key)
