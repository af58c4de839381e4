"""Usage: a chart by hour or day split by model, agent, key or member, totals per group, the rows
themselves (paginated), and a CSV export; every filter lives in the URL's query string."""

import csv
from datetime import datetime, time, timedelta
from zoneinfo import ZoneInfo

from asgiref.sync import sync_to_async
from django import forms
from django.core.paginator import Paginator
from django.db.models import Q
from django.http import JsonResponse, StreamingHttpResponse
from django.utils import timezone

from tenants import selectors
from tenants.models import MICROCENTS_PER_USD, UsageRecord
from tenants.portal.access import portal_page
from tenants.portal.pages import render_page
from tenants.reports import usage as reports
from tenants.reports.usage import UsageFilter

RANGES = {
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
    "90d": timedelta(days=90),
}
PAGE_SIZE = 50
MAX_HOURLY = timedelta(days=31)


class UsageQuery(forms.Form):
    range = forms.ChoiceField(
        choices=[(r, r) for r in RANGES] + [("custom", "custom")], required=False
    )
    since = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    bucket = forms.ChoiceField(choices=[("hour", "by hour"), ("day", "by day")], required=False)
    split = forms.ChoiceField(
        choices=[("model", "model"), ("agent", "agent"), ("key", "key"), ("member", "member")],
        required=False,
    )
    metric = forms.ChoiceField(
        choices=[("cost", "cost"), ("tokens", "tokens"), ("requests", "requests")], required=False
    )
    agent = forms.UUIDField(required=False)
    key = forms.UUIDField(required=False)
    model = forms.CharField(required=False, max_length=200)
    status = forms.ChoiceField(choices=[("", "any")] + UsageRecord.Status.choices, required=False)

    def clean(self):
        data = super().clean()
        if data.get("since") and data.get("until") and data["since"] > data["until"]:
            raise forms.ValidationError("The start date is after the end date.")
        return data


def _query(request, portal) -> tuple[UsageQuery, dict]:
    """The filters as given (invalid ones fall back to the defaults, with the form's errors)."""
    form = UsageQuery(request.GET or None)
    data = form.cleaned_data if form.is_bound and form.is_valid() else {}
    tz = ZoneInfo(portal.tenant.timezone)
    now = timezone.now()
    span = data.get("range") or "24h"
    if span == "custom" and (data.get("since") or data.get("until")):
        until = (
            datetime.combine(data["until"] + timedelta(days=1), time(0), tz)
            if data.get("until")
            else now
        )
        since = (
            datetime.combine(data["since"], time(0), tz)
            if data.get("since")
            else until - RANGES["7d"]
        )
    else:
        span = span if span in RANGES else "24h"
        since, until = now - RANGES[span], now
    bucket = data.get("bucket") or ("hour" if until - since <= timedelta(days=2) else "day")
    if until - since > MAX_HOURLY:
        bucket = "day"
    agent = (
        selectors.agent_get(tenant=portal.tenant, agent_id=data["agent"])
        if data.get("agent")
        else None
    )
    key = (
        selectors.api_key_get(tenant=portal.tenant, key_id=data["key"]) if data.get("key") else None
    )
    filters = UsageFilter(
        since=since,
        until=until,
        agent=agent,
        api_key=key,
        model=data.get("model") or "",
        status=data.get("status") or "",
    )
    return form, {
        "filters": filters,
        "range": span,
        "bucket": bucket,
        "split": data.get("split") or "model",
        "metric": data.get("metric") or "cost",
    }


def _chart(series, metric: str) -> dict:
    scale = MICROCENTS_PER_USD if metric == "cost" else 1
    fmt = (
        "%H:%M"
        if len(series.buckets) > 1 and (series.buckets[1] - series.buckets[0]) < timedelta(days=1)
        else "%Y-%m-%d"
    )
    return {
        "labels": [b.strftime(fmt if fmt == "%Y-%m-%d" else "%m-%d %H:%M") for b in series.buckets],
        "unit": "USD" if metric == "cost" else metric,
        "datasets": [
            {"label": name, "data": [v / scale for v in values]}
            for name, values in series.groups.items()
        ],
    }


class _KnownCountPaginator(Paginator):
    """The row count is already known from the grouped totals: no second COUNT(*) scan."""

    def __init__(self, object_list, per_page, *, count: int):
        super().__init__(object_list, per_page)
        self.__dict__["count"] = count


@portal_page()
def usage(request, portal):
    form, q = _query(request, portal)
    filters = q["filters"]
    report = reports.usage_report(
        tenant=portal.tenant,
        filters=filters,
        bucket=q["bucket"],
        split=q["split"],
        metric=q["metric"],
    )
    page = _KnownCountPaginator(
        reports.usage_records(tenant=portal.tenant, filters=filters),
        PAGE_SIZE,
        count=report.totals["requests"],
    ).get_page(request.GET.get("page"))
    agents = list(selectors.agent_list(tenant=portal.tenant))
    models = sorted(
        {m for a in agents for m in a.allowed_models}
        | ({r["label"] for r in report.breakdown} if q["split"] == "model" else set())
    )
    context = {
        "form": form,
        "q": q,
        "chart": _chart(report.series, q["metric"]),
        "breakdown": report.breakdown,
        "totals": report.totals,
        "page": page,
        "query_string": _without_page(request),
        "agents": agents,
        "keys": selectors.api_key_list(tenant=portal.tenant),
        "models": models,
    }
    return render_page(request, portal, "portal/usage/index.html", context, section="usage")


def _without_page(request) -> str:
    params = request.GET.copy()
    params.pop("page", None)
    return params.urlencode()


CSV_COLUMNS = [
    "created_at",
    "request_id",
    "agent",
    "key",
    "backend",
    "model",
    "status",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "cost_usd",
    "cost_microcents",
    "latency_ms",
]


def _cell(value) -> str:
    # A cell starting with = + - @ is a formula to spreadsheets (CSV injection).
    text = "" if value is None else str(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


class _Echo:
    def write(self, value):
        return value


CSV_CHUNK = 2000


def _csv_chunk(records, after: tuple | None) -> list:
    """The next rows after (created_at, pk) in the export's newest-first order (keyset
    pagination: every chunk is an index range scan, however deep into the export)."""
    if after is not None:
        records = records.filter(
            Q(created_at__lt=after[0]) | Q(created_at=after[0], pk__lt=after[1])
        )
    return list(records[:CSV_CHUNK])


def _csv_row(r) -> list[str]:
    return [
        _cell(v)
        for v in (
            r.created_at.isoformat(),
            r.request_id,
            r.agent.name,
            r.api_key.prefix if r.api_key else "",
            r.backend,
            r.model,
            r.status,
            r.prompt_tokens,
            r.completion_tokens,
            r.cached_tokens,
            f"{r.cost_microcents / MICROCENTS_PER_USD:.8f}",
            r.cost_microcents,
            r.latency_ms,
        )
    ]


async def _csv_stream(records):
    """Streamed under ASGI chunk by chunk, never the whole export in memory."""
    writer = csv.writer(_Echo())
    yield writer.writerow(CSV_COLUMNS)
    after = None
    while True:
        chunk = await sync_to_async(_csv_chunk)(records, after)
        yield "".join(writer.writerow(_csv_row(r)) for r in chunk)
        if len(chunk) < CSV_CHUNK:
            return
        after = (chunk[-1].created_at, chunk[-1].pk)


@portal_page()
def usage_csv(request, portal):
    _, q = _query(request, portal)
    records = reports.usage_records(tenant=portal.tenant, filters=q["filters"])
    response = StreamingHttpResponse(_csv_stream(records), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = (
        f'attachment; filename="usage-{portal.tenant.slug}-{timezone.now():%Y%m%d-%H%M}.csv"'
    )
    return response


@portal_page()
def usage_request(request, portal, request_id: str):
    """One ledger row (the playground shows its cost), or 404 while it is not settled yet."""
    record = reports.usage_record_get(tenant=portal.tenant, request_id=request_id)
    if record is None:
        return JsonResponse({"error": "not settled yet"}, status=404)
    return JsonResponse(
        {
            "request_id": record.request_id,
            "model": record.model,
            "status": record.status,
            "prompt_tokens": record.prompt_tokens,
            "completion_tokens": record.completion_tokens,
            "cached_tokens": record.cached_tokens,
            "cost_microcents": record.cost_microcents,
            "cost_usd": f"{record.cost_microcents / MICROCENTS_PER_USD:.8f}",
            "latency_ms": record.latency_ms,
            "backend": record.backend,
        }
    )
