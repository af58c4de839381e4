"""The embedded mode's SQLite groups usage by UTC hour natively and folds the hours into the
tenant's local hours and days in Python; its figures equal PostgreSQL's (the same rows and
expectations as test_reports, run in a child process on a fresh SQLite file)."""

import json
import subprocess
import sys

from tests.conftest import ROOT

SCRIPT = r"""
import json
from datetime import UTC, datetime, timedelta
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from django.contrib.auth import get_user_model
from django.db import connection
from tenants.models import UsageRecord
from tenants.reports.usage import UsageFilter, usage_report
from tenants.services.tenancy import agent_create, tenant_create

assert connection.vendor == "sqlite"
owner = get_user_model().objects.create_user("o")
out = {}
for zone in ("Europe/Berlin", "Asia/Kolkata"):  # whole-hour offsets, and +05:30
    tenant = tenant_create(name=zone, slug=zone.replace("/", "-").lower(), owner=owner,
                           timezone_name=zone)
    agent = agent_create(tenant=tenant, name="a")
    now = datetime(2026, 3, 10, 12, 30, tzinfo=UTC)
    for n, (ago, cost, model) in enumerate([(70, 100, "tiny"), (65, 200, "small"),
                                             (20, 400, "tiny"), (60 * 48, 800, "tiny")]):
        UsageRecord.objects.create(request_id=f"{zone}{n}", tenant=tenant, agent=agent,
                                   model=model, cost_microcents=cost, prompt_tokens=10,
                                   completion_tokens=5, created_at=now - timedelta(minutes=ago))
    hourly = usage_report(tenant=tenant, filters=UsageFilter(since=now - timedelta(hours=24),
                          until=now), bucket="hour", split="model")
    daily = usage_report(tenant=tenant, filters=UsageFilter(since=now - timedelta(days=7),
                         until=now), bucket="day", split="model")
    out[zone] = {"hour_labels": [b.strftime("%d %H:%M") for b in hourly.series.buckets[-2:]],
                 "hour_tiny": hourly.series.groups["tiny"][-2:],
                 "hour_small": hourly.series.groups["small"][-2:],
                 "day_tiny": [v for v in daily.series.groups["tiny"] if v],
                 "totals": daily.totals["cost"]}
print(json.dumps(out))
"""


def test_sqlite_usage_buckets_match_the_tenants_local_hours_and_days(tmp_path):
    env = {
        "PYTHONPATH": f"{ROOT}:{ROOT / 'platform'}",
        "DJANGO_SETTINGS_MODULE": "settings",
        "FAIRLANE_DATA_DIR": str(tmp_path),
        "SECRET_KEY": "s" * 50,
        "PATH": "/usr/bin:/bin",
        "LOG_LEVEL": "WARNING",
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    berlin = out["Europe/Berlin"]  # 12:30 UTC is 13:30 in Berlin
    assert berlin["hour_labels"] == ["10 12:00", "10 13:00"]
    assert berlin["hour_tiny"] == [100, 400] and berlin["hour_small"] == [200, 0]
    assert berlin["day_tiny"] == [800, 500] and berlin["totals"] == 1500
    kolkata = out["Asia/Kolkata"]  # +05:30: the database truncates in the zone itself
    assert kolkata["hour_labels"] == ["10 16:00", "10 17:00"]  # 16:50 and 17:40 local
    assert kolkata["hour_tiny"] == [100, 400] and kolkata["totals"] == 1500
