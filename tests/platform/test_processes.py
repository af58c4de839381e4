"""The platform as a user runs it: `make run` serving over a real socket in the embedded mode,
a real Celery worker process on Redis and PostgreSQL, and budgets on SQLite under threads."""

import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from django.utils import timezone

from tenants.models import Reservation
from tenants.selectors import budget_window_status
from tenants.services.budgets import budget_create, budget_reserve

ROOT = Path(__file__).resolve().parents[2]
KEY_RE = re.compile(r"fl-[a-z0-9]{12}-[A-Za-z0-9]{43}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def make_run(tmp_path):
    """`make run` on a free port with its own data directory: no PostgreSQL, no Redis."""
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in {
            "DATABASE_URL",
            "REDIS_URL",
            "DJANGO_SETTINGS_MODULE",
            "PYTHONPATH",
            "SECRET_KEY",
            "MAKEFLAGS",
            "MAKELEVEL",
        }
    }
    env.update(FAIRLANE_DATA_DIR=str(tmp_path / "var"), STATIC_ROOT=str(tmp_path / "static"))
    process = subprocess.Popen(
        ["make", "--no-print-directory", "run", f"PORT={port}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    output = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        output.append(line)
        if "Uvicorn running" in line:
            break
    try:
        text = "".join(output)
        assert "Uvicorn running" in text, text
        yield f"http://127.0.0.1:{port}", text, tmp_path
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


def test_make_run_serves_the_embedded_mode_and_its_printed_key_works(make_run):
    base, output, data_dir = make_run
    key = KEY_RE.search(output)[0]
    assert "Admin user:  admin / " in output
    assert (data_dir / "var" / "fairlane.sqlite3").exists()

    with httpx.Client(base_url=base, timeout=10) as http:
        assert http.get("/healthz").json() == {"status": "ok"}
        assert http.get("/readyz").json()["checks"] == {"database": "ok"}  # no Redis configured
        tenants = http.get("/api/tenants/", headers={"Authorization": f"Bearer {key}"})
        assert tenants.status_code == 200
        assert [t["slug"] for t in tenants.json()["results"]] == ["demo"]
        budgets = http.get(
            "/api/tenants/demo/budgets/", headers={"Authorization": f"Bearer {key}"}
        ).json()["results"]
        assert sorted(b["limit_microcents"] for b in budgets) == [500_000_000, 5_000_000_000]
        refused = http.get("/api/tenants/", headers={"Authorization": f"Bearer {key}x"})
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "authentication"
        login = http.get("/admin/login/")
        assert login.status_code == 200 and "csrfmiddlewaretoken" in login.text
        assert http.get("/static/admin/css/base.css").status_code == 200
        assert http.get("/api/docs/").status_code == 200
        icon = http.get("/favicon.ico", follow_redirects=True)  # issue 28: it was a 404
        assert icon.status_code == 200 and icon.content[:4] == b"\x00\x00\x01\x00"
        # The embedded mode's /metrics answers on loopback without a token (issue 28).
        assert http.get("/metrics").status_code == 200


@pytest.fixture
def celery_worker(subprocess_env):
    import celery_app

    celery_app.app.control.purge()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "celery_app",
            "worker",
            "-P",
            "solo",
            "--without-gossip",
            "--without-mingle",
            "-l",
            "info",
            "-n",
            f"test-{uuid.uuid4().hex[:6]}",
        ],
        cwd=ROOT,
        env=subprocess_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if "ready." in line or not line:
            break
    try:
        yield celery_app.app
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_celery_worker_process_releases_stale_reservations(tenant, agent, celery_worker, settings):
    from tenants.tasks import budget_reservations_expire

    budget = budget_create(tenant=tenant, agent=agent, limit_microcents=1000)
    long_ago = timezone.now() - timedelta(seconds=settings.FAIRLANE_RESERVATION_TTL_SECONDS + 5)
    budget_reserve(
        tenant=tenant, agent=agent, amount_microcents=700, request_id="stale", now=long_ago
    )
    budget_reserve(tenant=tenant, agent=agent, amount_microcents=200, request_id="fresh")

    assert budget_reservations_expire.delay().get(timeout=60) == 1

    assert Reservation.objects.get(request_id="stale").status == Reservation.Status.EXPIRED
    assert Reservation.objects.get(request_id="fresh").status == Reservation.Status.HELD
    assert budget_window_status(budget=budget).reserved_microcents == 200


SQLITE_RACE = """
import threading, uuid, django
from concurrent.futures import ThreadPoolExecutor
django.setup()
from django.core.management import call_command
from django.db import connection
call_command("migrate", verbosity=0)
from tenants.errors import BudgetExhausted
from tenants.services.budgets import budget_create, budget_reserve
from tenants.services.tenancy import agent_create, tenant_create
from tenants.selectors import budget_window_status
assert connection.vendor == "sqlite"
tenant = tenant_create(name="t", slug="t", owner=None)
agent = agent_create(tenant=tenant, name="a")
budget = budget_create(tenant=tenant, agent=agent, limit_microcents=1000)
barrier = threading.Barrier(16)
def worker(_):
    won = 0
    barrier.wait()
    for _ in range(8):
        try:
            budget_reserve(tenant=tenant, agent=agent, amount_microcents=30,
                           request_id=uuid.uuid4().hex)
            won += 1
        except BudgetExhausted:
            pass
    connection.close()
    return won
with ThreadPoolExecutor(16) as pool:
    won = sum(pool.map(worker, range(16)))
print(won, budget_window_status(budget=budget).reserved_microcents)
"""


def test_budget_reservations_are_exact_on_sqlite_too(tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT}:{ROOT / 'platform'}",
        "DJANGO_SETTINGS_MODULE": "settings",
        "FAIRLANE_DATA_DIR": str(tmp_path),
    }
    env.pop("DATABASE_URL")
    env.pop("REDIS_URL")
    out = subprocess.run(
        [sys.executable, "-c", SQLITE_RACE],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["33", "990"]  # floor(1000 / 30) of 128 attempts
