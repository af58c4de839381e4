"""The ledger aggregated for people: totals per hour or day (in the tenant's time zone),
split by model, agent, key or member, summed in the database so 100,000 rows cost one grouped scan
of the (tenant, created_at) index, not 100,000 Python objects."""

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from django.db import connection
from django.db.models import CharField, Count, F, Func, Q, QuerySet, Sum
from django.db.models.functions import TruncDay, TruncHour

from tenants.models import Agent, ApiKey, Membership, Tenant, UsageRecord
from tenants.reports.spend import ERROR_STATUSES

BUCKETS = {"hour": (TruncHour, timedelta(hours=1)), "day": (TruncDay, timedelta(days=1))}
# Grouped by the column itself (a foreign key's id, not a joined name): no join, a narrower
# hash; names are looked up afterwards among the tenant's few agents and keys.
# member: the person who created the request's key (its `created_by`).
SPLITS = {
    "model": "model",
    "agent": "agent_id",
    "key": "api_key_id",
    "member": "api_key__created_by_id",
}
METRICS = {"cost": "cost", "tokens": "tokens", "requests": "requests"}
SUMS = ("requests", "prompt", "completion", "tokens", "cost", "errors", "latency")
MAX_SERIES = 8  # the biggest groups get a series each; the rest are summed as "other"


@dataclass(frozen=True, slots=True)
class UsageFilter:
    since: datetime
    until: datetime
    agent: Agent | None = None
    api_key: ApiKey | None = None
    model: str = ""
    status: str = ""


@dataclass(slots=True)
class Series:
    """Buckets (start times, in the tenant's zone) and one list of values per group."""

    buckets: list[datetime]
    groups: dict[str, list[int]] = field(default_factory=dict)


@dataclass(slots=True)
class UsageReport:
    """One grouped query's answer: the chart's series, totals per group, and overall."""

    series: Series
    breakdown: list[dict]
    totals: dict


def usage_filtered(*, tenant: Tenant, filters: UsageFilter) -> QuerySet[UsageRecord]:
    records = UsageRecord.objects.filter(
        tenant=tenant, created_at__gte=filters.since, created_at__lt=filters.until
    )
    if filters.agent is not None:
        records = records.filter(agent=filters.agent)
    if filters.api_key is not None:
        records = records.filter(api_key=filters.api_key)
    if filters.model:
        records = records.filter(model=filters.model)
    if filters.status:
        records = records.filter(status=filters.status)
    return records


def _aggregates() -> dict:
    # Names unlike the columns': an aggregate named like a column would shadow it.
    return {
        "requests": Count("pk"),
        "prompt": Sum("prompt_tokens"),
        "completion": Sum("completion_tokens"),
        "tokens": Sum(F("prompt_tokens") + F("completion_tokens")),
        "cost": Sum("cost_microcents"),
        "latency": Sum("latency_ms"),
        "errors": Count("pk", filter=Q(status__in=ERROR_STATUSES)),
    }


def _labels(*, tenant: Tenant, split: str) -> dict:
    if split == "agent":
        return dict(Agent.objects.filter(tenant=tenant).values_list("pk", "name"))
    if split == "key":
        return {
            pk: f"fl-{key_id}"
            for pk, key_id in ApiKey.objects.filter(tenant=tenant).values_list("pk", "key_id")
        }
    if split == "member":
        return dict(
            Membership.objects.filter(tenant=tenant).values_list("user_id", "user__username")
        )
    return {}


def _label(split: str, value, names: dict) -> str:
    if value in (None, ""):
        return {"key": "(no key)", "member": "(no member)"}.get(split, "(none)")
    return names.get(value, str(value)) if split != "model" else str(value)


class _UtcHour(Func):
    """The row's UTC hour as 'YYYY-MM-DD HH', in native SQLite (a prefix of the stored text):
    Django's datetime functions are Python callbacks there, one per row."""

    template = "substr(%(expressions)s, 1, 13)"
    output_field = CharField()


def _whole_hour_offsets(tz: ZoneInfo, filters: UsageFilter) -> bool:
    return all(
        (moment.astimezone(tz).utcoffset() or timedelta()).total_seconds() % 3600 == 0
        for moment in (filters.since, filters.until)
    )


def _bucketed(*, records: QuerySet, tz: ZoneInfo, bucket: str, filters: UsageFilter):
    """(queryset with a `bucket` annotation, function from its value to the local bucket
    start). On SQLite (with a zone whose offsets are whole hours) rows are grouped by UTC
    hour natively and folded into local buckets here; elsewhere the database truncates in
    the tenant's zone itself."""
    trunc = BUCKETS[bucket][0]
    if connection.vendor != "sqlite" or not _whole_hour_offsets(tz, filters):
        return (
            records.annotate(bucket=trunc("created_at", tzinfo=tz)),
            lambda value: value.astimezone(tz).replace(tzinfo=None),
        )

    def local(value: str) -> datetime:
        at = datetime.strptime(value, "%Y-%m-%d %H").replace(tzinfo=UTC).astimezone(tz)
        at = at.replace(tzinfo=None)
        return at.replace(hour=0) if bucket == "day" else at

    return records.annotate(bucket=_UtcHour("created_at")), local


def usage_report(
    *, tenant: Tenant, filters: UsageFilter, bucket: str, split: str, metric: str = "cost"
) -> UsageReport:
    """Sums per bucket and group in one grouped query; the series (zero-filled, biggest
    groups first), the totals per group and overall are added up from its few rows."""
    tz = ZoneInfo(tenant.timezone)
    records, local = _bucketed(
        records=usage_filtered(tenant=tenant, filters=filters).order_by(),
        tz=tz,
        bucket=bucket,
        filters=filters,
    )
    rows = (
        records.annotate(group=F(SPLITS[split])).values("bucket", "group").annotate(**_aggregates())
    )
    names = _labels(tenant=tenant, split=split)
    buckets = _bucket_starts(
        since=filters.since, until=filters.until, trunc=bucket, tz=tz, step=BUCKETS[bucket][1]
    )
    index = {b: i for i, b in enumerate(buckets)}
    values: dict[str, list[int]] = {}
    per_group: dict[str, dict] = {}
    for row in rows:
        label = _label(split, row["group"], names)
        series = values.setdefault(label, [0] * len(buckets))
        slot = index.get(local(row["bucket"]))
        if slot is not None:
            series[slot] += row[METRICS[metric]] or 0
        sums = per_group.setdefault(label, dict.fromkeys(SUMS, 0))
        for name in SUMS:
            sums[name] += row[name] or 0
    breakdown = sorted(
        (
            {"label": label, **sums, "latency_ms": sums["latency"] / sums["requests"]}
            for label, sums in per_group.items()
        ),
        key=lambda row: (-row["cost"], row["label"]),
    )
    totals = {name: sum(row[name] for row in breakdown) for name in SUMS}
    return UsageReport(series=_series(buckets, values, tz), breakdown=breakdown, totals=totals)


def _series(buckets: list[datetime], values: dict, tz: ZoneInfo) -> Series:
    ordered = sorted(values.items(), key=lambda item: -sum(item[1]))
    series = Series(buckets=[b.replace(tzinfo=tz) for b in buckets])
    keep = ordered[: MAX_SERIES - 1] if len(ordered) > MAX_SERIES else ordered
    for label, column in keep:
        series.groups[label] = column
    if len(ordered) > MAX_SERIES:
        series.groups["other"] = [
            sum(col) for col in zip(*(v for _, v in ordered[MAX_SERIES - 1 :]), strict=False)
        ]
    return series


def _bucket_starts(
    *, since: datetime, until: datetime, trunc: str, tz: ZoneInfo, step: timedelta
) -> list[datetime]:
    """Naive local bucket starts covering [since, until): wall-clock steps, so a day is a
    calendar day across a DST change."""
    first = since.astimezone(tz).replace(minute=0, second=0, microsecond=0, tzinfo=None)
    if trunc == "day":
        first = first.replace(hour=0)
    last = until.astimezone(tz).replace(tzinfo=None)
    starts, at = [], first
    while at < last:
        starts.append(at)
        at += step
    return starts


def usage_records(*, tenant: Tenant, filters: UsageFilter) -> QuerySet[UsageRecord]:
    """The rows themselves, newest first (for the table and the CSV export)."""
    return (
        usage_filtered(tenant=tenant, filters=filters)
        .select_related("agent", "api_key")
        .order_by("-created_at", "-pk")
    )


def usage_record_get(*, tenant: Tenant, request_id: str) -> UsageRecord | None:
    return (
        UsageRecord.objects.filter(tenant=tenant, request_id=request_id)
        .select_related("agent", "api_key")
        .first()
    )
