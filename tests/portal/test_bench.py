"""The portal benchmark command runs end to end on a small ledger, reports every page and
the baseline, and leaves nothing behind (its figures are measurements, never asserted)."""

import io
import json

from django.core.management import call_command

from tenants.models import Tenant, UsageRecord


def test_portal_bench_times_every_page_and_removes_what_it_seeded(db, tmp_path):
    out = io.StringIO()
    call_command(
        "portal_bench",
        "--rows",
        "3000",
        "--repeat",
        "2",
        "--json-out",
        str(tmp_path / "portal.json"),
        stdout=out,
    )
    result = json.loads(out.getvalue().strip().splitlines()[-1])
    assert result == json.loads((tmp_path / "portal.json").read_text())
    assert result["rows"] == 3000 and set(result["pages"]) == {
        "overview",
        "usage 24h by model",
        "usage 30d by day, by key",
        "usage 7d by hour, by agent",
    }
    assert all(
        page["n"] == 2 and page["p95_ms"] >= page["p50_ms"] > 0 for page in result["pages"].values()
    )
    assert result["baseline_python_series"]["n"] == 3
    assert not UsageRecord.objects.exists() and not Tenant.objects.exists()
