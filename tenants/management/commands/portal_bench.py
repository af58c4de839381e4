"""Server time of the portal's heaviest pages with a big ledger: seeds a throwaway tenant
with N usage rows (default 100,000, over the last 30 days), requests the overview and the
usage page (several ranges and splits) through Django's full middleware stack as a signed-in
member, and prints p50/p95 per page. Baseline: the usage chart's figures summed in Python
over the fetched rows, as a page that did not aggregate in the database would. Removes
everything it made; the last line is one JSON object (also written under bench-results/)."""

import json
import random
import statistics
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import connection
from django.test import Client
from django.utils import timezone

from tenants.models import ApiKey, Budget, BudgetWindow, Membership, Tenant, UsageRecord
from tenants.services.budgets import budget_create
from tenants.services.keys import api_key_create
from tenants.services.tenancy import agent_create, tenant_create

MODELS = ["tiny", "small", "llama-8b", "qwen-7b", "gpt-4o-mini", "claude"]
PAGES = {
    "overview": "",
    "usage 24h by model": "usage/",
    "usage 30d by day, by key": "usage/?range=30d&bucket=day&split=key",
    "usage 7d by hour, by agent": "usage/?range=7d&bucket=hour&split=agent",
}


class Command(BaseCommand):
    help = "Time the portal's overview and usage pages over a seeded ledger."

    def add_arguments(self, parser):
        parser.add_argument("--rows", type=int, default=100_000)
        parser.add_argument("--repeat", type=int, default=30)
        parser.add_argument(
            "--json-out",
            type=Path,
            default=Path(settings.BASE_DIR) / "bench-results" / "portal.json",
        )

    def handle(self, *args, rows: int, repeat: int, json_out: Path, **options):
        slug = f"bench-{uuid.uuid4().hex[:8]}"
        user = get_user_model().objects.create_user(slug, password=uuid.uuid4().hex)
        tenant = tenant_create(name="Portal bench", slug=slug, owner=user)
        try:
            started = time.perf_counter()
            self._seed(tenant, rows)
            if connection.vendor == "postgresql":  # what autovacuum does after a bulk insert
                with connection.cursor() as cursor:
                    cursor.execute("ANALYZE tenants_usagerecord")
            self.stdout.write(
                f"seeded {rows} ledger rows in {time.perf_counter() - started:.1f} s "
                f"({connection.vendor})"
            )
            result: dict[str, Any] = {
                "bench": "portal",
                "rows": rows,
                "repeat": repeat,
                "database": connection.vendor,
                "pages": {},
            }
            client = Client(HTTP_HOST="127.0.0.1")  # an allowed host, as a browser sends
            client.force_login(user)
            for name, path in PAGES.items():
                result["pages"][name] = self._time(client, f"/portal/t/{slug}/{path}", repeat)
                self._print(name, result["pages"][name])
            result["baseline_python_series"] = self._baseline(tenant, repeat=max(3, repeat // 5))
            self._print("baseline: 30d series in Python", result["baseline_python_series"])
            ours = result["pages"]["usage 30d by day, by key"]["p50_ms"]
            result["ratio_baseline_over_ours_p50"] = round(
                result["baseline_python_series"]["p50_ms"] / ours, 2
            )
            self.stdout.write(
                f"the 30-day usage page (whole page, p50) is "
                f"{result['ratio_baseline_over_ours_p50']}x faster than the "
                f"baseline's aggregation alone"
            )
        finally:
            self._clean(tenant, user)
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(result))
        self.stdout.write(json.dumps(result))

    def _seed(self, tenant: Tenant, rows: int) -> None:
        rng = random.Random(7)
        agents = [agent_create(tenant=tenant, name=f"agent-{i}") for i in range(8)]
        for agent in agents[:4]:
            budget_create(tenant=tenant, agent=agent, limit_microcents=10**10)
        budget_create(tenant=tenant, agent=None, limit_microcents=10**11)
        keys = [api_key_create(tenant=tenant, agent=agents[i % 8])[0] for i in range(24)]
        now = timezone.now()
        batch = []
        for n in range(rows):
            key = rng.choice(keys)
            prompt, completion = rng.randint(10, 2000), rng.randint(1, 800)
            batch.append(
                UsageRecord(
                    request_id=f"{tenant.slug}-{n}",
                    tenant=tenant,
                    agent_id=key.agent_id,
                    api_key=key,
                    backend="local",
                    model=rng.choice(MODELS),
                    prompt_tokens=prompt,
                    completion_tokens=completion,
                    cost_microcents=prompt * 10 + completion * 40,
                    latency_ms=rng.randint(20, 4000),
                    status="ok" if rng.random() > 0.03 else "error",
                    created_at=now - timedelta(seconds=rng.uniform(0, 30 * 86400)),
                )
            )
            if len(batch) == 5000:
                UsageRecord.objects.bulk_create(batch)
                batch = []
        UsageRecord.objects.bulk_create(batch)

    def _time(self, client: Client, url: str, repeat: int) -> dict:
        response = client.get(url)  # warm: templates compiled, connection open
        assert response.status_code == 200, (url, response.status_code)
        samples = []
        for _ in range(repeat):
            started = time.perf_counter()
            response = client.get(url)
            samples.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200
        return _stats(samples)

    def _baseline(self, tenant: Tenant, *, repeat: int) -> dict:
        since = timezone.now() - timedelta(days=30)
        samples = []
        for _ in range(repeat):
            started = time.perf_counter()
            sums: dict = {}
            for created_at, key_id, cost in (
                UsageRecord.objects.filter(tenant=tenant, created_at__gte=since)
                .values_list("created_at", "api_key__key_id", "cost_microcents")
                .iterator(2000)
            ):
                bucket = created_at.date()
                sums[(bucket, key_id)] = sums.get((bucket, key_id), 0) + cost
            samples.append((time.perf_counter() - started) * 1000)
        return _stats(samples)

    def _print(self, name: str, stats: dict) -> None:
        self.stdout.write(
            f"{name:32s} p50 {stats['p50_ms']:8.1f} ms   p95 {stats['p95_ms']:8.1f} ms"
        )

    def _clean(self, tenant: Tenant, user) -> None:
        UsageRecord.objects.filter(tenant=tenant).delete()
        BudgetWindow.objects.filter(budget__tenant=tenant).delete()
        Budget.objects.filter(tenant=tenant).delete()
        ApiKey.objects.filter(tenant=tenant).delete()
        Membership.objects.filter(tenant=tenant).delete()
        tenant.agents.all().delete()
        tenant.delete()
        user.delete()


def _stats(samples: list[float]) -> dict:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]
    return {
        "p50_ms": round(statistics.median(ordered), 1),
        "p95_ms": round(p95, 1),
        "max_ms": round(ordered[-1], 1),
        "n": len(ordered),
    }
