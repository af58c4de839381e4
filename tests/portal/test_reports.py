"""The usage and spend figures, computed in the database: buckets in the tenant's time zone,
splits, the largest groups and "other", the run-rate projection, the CSV export; and never a
row of another tenant."""

import csv
import io
import itertools
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.urls import reverse

from tenants.models import Role, UsageRecord
from tenants.reports.spend import spend_overview
from tenants.reports.usage import UsageFilter, usage_report
from tenants.services.budgets import budget_create
from tenants.services.tenancy import agent_create

NOW = datetime(2026, 3, 10, 12, 30, tzinfo=UTC)  # Acme is Europe/Berlin: 13:30 local


_SEQUENCE = itertools.count(1)  # request ids, unique in the module


def record(tenant, agent, at, cost, *, model="tiny", key=None, status="ok"):
    number = next(_SEQUENCE)
    return UsageRecord.objects.create(
        request_id=f"r{number}",
        tenant=tenant,
        agent=agent,
        api_key=key,
        model=model,
        prompt_tokens=10,
        completion_tokens=5,
        cost_microcents=cost,
        latency_ms=100,
        status=status,
        created_at=at,
    )


@pytest.fixture
def ledger(tenant, agent, other_tenant, other_agent, api_key):
    writer = agent_create(tenant=tenant, name="writer")
    record(tenant, agent, NOW - timedelta(hours=1, minutes=10), 100, key=api_key[0])
    record(tenant, agent, NOW - timedelta(hours=1, minutes=5), 200, model="small")
    record(tenant, writer, NOW - timedelta(minutes=20), 400, status="error")
    record(tenant, agent, NOW - timedelta(days=2), 800)  # outside 24 h
    record(other_tenant, other_agent, NOW - timedelta(minutes=5), 10**6)
    return writer


def test_usage_series_buckets_by_local_hour_and_splits_by_model(tenant, ledger):
    filters = UsageFilter(since=NOW - timedelta(hours=24), until=NOW)
    series = usage_report(tenant=tenant, filters=filters, bucket="hour", split="model").series
    assert len(series.buckets) == 25  # 12:00 yesterday .. 13:00 today, local
    labels = [b.strftime("%d %H:%M") for b in series.buckets]
    assert labels[-2:] == ["10 12:00", "10 13:00"]  # Berlin wall-clock hours
    assert series.groups["tiny"][-2] == 100 and series.groups["small"][-2] == 200
    assert series.groups["tiny"][-1] == 400 and sum(series.groups["tiny"]) == 500
    assert list(series.groups) == ["tiny", "small"]  # biggest first, no other tenant's


def test_usage_by_day_agent_and_key_and_totals(tenant, agent, ledger, api_key):
    filters = UsageFilter(since=NOW - timedelta(days=7), until=NOW)
    by_agent = usage_report(tenant=tenant, filters=filters, bucket="day", split="agent").series
    assert len(by_agent.buckets) == 8
    assert sum(by_agent.groups["support-bot"]) == 1100 and sum(by_agent.groups["writer"]) == 400
    by_key = {
        r["label"]: r
        for r in usage_report(tenant=tenant, filters=filters, bucket="day", split="key").breakdown
    }
    assert by_key[api_key[0].prefix]["cost"] == 100 and by_key["(no key)"]["requests"] == 3
    totals = usage_report(tenant=tenant, filters=filters, bucket="day", split="model").totals
    assert totals == {
        "requests": 4,
        "prompt": 40,
        "completion": 20,
        "tokens": 60,
        "cost": 1500,
        "errors": 1,
        "latency": 400,
    }
    only_writer = usage_report(
        tenant=tenant,
        filters=UsageFilter(since=filters.since, until=NOW, agent=ledger, status="error"),
        bucket="day",
        split="agent",
    )
    assert only_writer.totals["cost"] == 400 and list(only_writer.series.groups) == ["writer"]


def test_more_than_eight_groups_keep_seven_and_sum_the_rest_as_other(tenant, agent):
    for i in range(10):
        record(tenant, agent, NOW - timedelta(minutes=5), 10 * (i + 1), model=f"m{i}")
    series = usage_report(
        tenant=tenant,
        filters=UsageFilter(since=NOW - timedelta(hours=2), until=NOW),
        bucket="hour",
        split="model",
        metric="cost",
    ).series
    assert list(series.groups)[:2] == ["m9", "m8"] and len(series.groups) == 8
    assert sum(series.groups["other"]) == 10 + 20 + 30


def test_spend_overview_projects_exhaustion_at_the_trailing_hours_rate(tenant, agent, ledger):
    budget_create(tenant=tenant, agent=agent, limit_microcents=10_000)
    with time_machine.travel(NOW, tick=False):
        from tenants.services.budgets import budget_reserve
        from tenants.services.ledger import Usage, budget_settle

        budget_reserve(tenant=tenant, agent=agent, amount_microcents=6000, request_id="big")
        budget_settle(
            tenant=tenant, request_id="big", cost_microcents=6000, usage=Usage(model="tiny")
        )
        tenant_line, lines, today = spend_overview(tenant=tenant, now=NOW)
    line = next(line for line in lines if line.owner == "support-bot")
    assert line.spent_microcents == 6000 and line.remaining_microcents == 4000
    # in the last hour: 6000 (just now) -> 4000 left lasts 40 minutes
    assert line.run_rate_microcents_per_hour == 6000
    assert line.projected_exhaustion == NOW + timedelta(minutes=40)
    assert line.state == "ok" and line.used_percent == 60
    writer = next(line for line in lines if line.owner == "writer")
    assert writer.budget is None and writer.spent_microcents == 400
    assert today.requests == 4 and today.errors == 1 and today.cost_microcents == 6700
    assert tenant_line.run_rate_microcents_per_hour == 6400  # 6000 + writer's 400


def test_the_csv_export_follows_the_filters_and_shows_no_other_tenant(
    portal_client, tenant, ledger
):
    client, _ = portal_client(Role.VIEWER)
    with time_machine.travel(NOW + timedelta(minutes=1), tick=False):
        response = client.get(
            reverse("portal:usage_csv", kwargs={"slug": "acme"}), {"range": "24h", "model": "tiny"}
        )
        body = _consume(response)
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(body)))
    assert sorted(r["cost_microcents"] for r in rows) == ["100", "400"]
    assert {r["agent"] for r in rows} == {"support-bot", "writer"}
    assert rows[0]["cost_usd"] == "0.00000400"


def _consume(response) -> str:
    """Read an async streaming response from this (sync) test: Django runs the stream in
    async_to_sync, whose database calls come back to this thread and its transaction."""
    with pytest.warns(Warning, match="consume asynchronous iterators"):
        return b"".join(response).decode()


def test_a_long_export_streams_in_chunks_with_every_row_once(portal_client, tenant, agent):
    UsageRecord.objects.bulk_create(
        [
            UsageRecord(
                request_id=f"bulk{n}",
                tenant=tenant,
                agent=agent,
                model="tiny",
                cost_microcents=n,
                created_at=NOW - timedelta(seconds=n // 3),
            )
            for n in range(4500)
        ]
    )  # ties on time
    client, _ = portal_client(Role.VIEWER)
    with time_machine.travel(NOW + timedelta(minutes=1), tick=False):
        response = client.get(
            reverse("portal:usage_csv", kwargs={"slug": "acme"}), {"range": "24h"}
        )
        assert response.is_async
        rows = list(csv.DictReader(io.StringIO(_consume(response))))
    assert sorted(int(r["cost_microcents"]) for r in rows) == list(range(4500))
    times = [r["created_at"] for r in rows]
    assert times == sorted(times, reverse=True)


def test_the_usage_page_shows_chart_data_and_rows_and_refuses_other_tenants_ids(
    portal_client, tenant, ledger, other_agent
):
    client, _ = portal_client(Role.VIEWER)
    with time_machine.travel(NOW + timedelta(minutes=1), tick=False):
        page = client.get(
            reverse("portal:usage", kwargs={"slug": "acme"}),
            {"range": "24h", "split": "agent", "bucket": "hour"},
        )
        foreign = client.get(
            reverse("portal:usage", kwargs={"slug": "acme"}), {"agent": str(other_agent.pk)}
        )
    html = page.content.decode()
    assert page.status_code == 200 and 'id="usage-chart"' in html
    assert '"label": "support-bot"' in html and '"label": "writer"' in html
    assert html.count("data-request=") == 3 and "$0.000007" in html  # the three in range
    assert foreign.status_code == 404
