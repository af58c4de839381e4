"""What the ops dashboard shows, read across every tenant (operators only): the backends'
health, circuits and error rates, the fair queues, the workers and their models, spend from
the ledger and the budgets' windows, and the alerts that fired."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count, F, Q, Sum, Value
from django.db.models.functions import Least
from django.utils import timezone

from routing.metrics import ATTEMPTS_BY_MINUTE, SEP
from routing.models import Backend, BackendKind
from routing.ops.processes import processes_breakers
from routing.overload import Load, brownout_level
from tenants.models import AlertEvent, BudgetWindow, Reservation, Tenant, UsageRecord
from workers.selectors import queue_states
from workers.serving.pool import QueueState
from workers.serving.runtime import Runtime

ERRORS = ("failed", "rate_limited")
REACHED = ("ok", "failed", "rate_limited", "refused")  # attempts that reached the backend


@dataclass(frozen=True, slots=True)
class Rate:
    attempts: int
    errors: int

    @property
    def percent(self) -> float | None:
        return 100 * self.errors / self.attempts if self.attempts else None


@dataclass(frozen=True, slots=True)
class BackendRow:
    name: str
    kind: str
    health: str
    detail: str
    probe_p95_ms: float
    inflight: int
    circuits: dict  # state -> processes with its circuit in that state
    rate_5m: Rate
    rate_60m: Rate
    last_error: str

    @property
    def circuit(self) -> str:
        """The worst circuit state of any API process."""
        for state in ("open", "half_open"):
            if self.circuits.get(state):
                return state
        return "closed"


def _rates(client, minutes: int) -> dict[str, Rate]:
    counts: dict[str, dict[str, int]] = {}
    for field, value in ATTEMPTS_BY_MINUTE.totals(client, since_seconds=minutes * 60).items():
        backend, _, outcome = field.partition(SEP)
        counts.setdefault(backend, {})[outcome] = value
    return {
        name: Rate(sum(c.get(o, 0) for o in REACHED), sum(c.get(o, 0) for o in ERRORS))
        for name, c in counts.items()
    }


def backends_overview(*, runtime: Runtime, now: datetime | None = None) -> list[BackendRow]:
    """Every backend (and the local engine pool, registered or not)."""
    now = now or timezone.now()
    rows = {b.name: b for b in Backend.objects.order_by("name")}
    client = runtime.redis
    breakers, short, long = processes_breakers(client), _rates(client, 5), _rates(client, 60)
    names = sorted(set(rows) | {"local"} | set(short) | set(breakers))
    result = []
    for name in names:
        row = rows.get(name)
        circuits = breakers.get(name, {})
        result.append(
            BackendRow(
                name=name,
                kind=row.kind if row else BackendKind.LOCAL,
                health=(row.health_at(now) if row.is_enabled else "disabled") if row else "live",
                detail=row.health_detail if row else "the platform's own engines",
                probe_p95_ms=row.probe_p95_ms if row else 0.0,
                inflight=circuits.get("inflight", 0),
                circuits=circuits,
                rate_5m=short.get(name, Rate(0, 0)),
                rate_60m=long.get(name, Rate(0, 0)),
                last_error=row.last_error
                if row and row.last_error_at and now - row.last_error_at < timedelta(hours=1)
                else "",
            )
        )
    return result


@dataclass(frozen=True, slots=True)
class QueueRow:
    state: QueueState
    brownout: int
    tenants: list[tuple[str, str, int]]  # (lane, tenant slug, waiting), most first


def queue_overview(*, runtime: Runtime) -> list[QueueRow]:
    states = queue_states(pool=runtime.pool)
    ids = {int(t) for s in states for lane in s.lanes for t in lane.tenants if t.isdigit()}
    slugs = {
        str(pk): slug for pk, slug in Tenant.objects.filter(pk__in=ids).values_list("pk", "slug")
    }
    rows = []
    for state in states:
        load = Load(lane_depth=0, tenant_depth=0, total_depth=state.depth, dispatch_rate=0.0)
        waiting = sorted(
            (
                (lane.lane, slugs.get(t, t), n)
                for lane in state.lanes
                for t, n in lane.tenants.items()
            ),
            key=lambda r: -r[2],
        )
        rows.append(QueueRow(state, brownout_level(load), waiting[:20]))
    return rows


def spend_since(*, since: datetime) -> dict:
    """Totals, top spenders (tenant and agent) and spend per backend and model since then."""
    records = UsageRecord.objects.filter(created_at__gte=since).order_by()
    totals = records.aggregate(
        cost=Sum("cost_microcents"),
        requests=Count("pk"),
        errors=Count("pk", filter=Q(status__in=("error", "timeout"))),
    )
    top = list(
        records.values("tenant__slug", "agent__name")
        .annotate(cost=Sum("cost_microcents"), requests=Count("pk"))
        .order_by("-cost")[:10]
    )
    by_route = list(
        records.values("backend", "model")
        .annotate(
            cost=Sum("cost_microcents"),
            requests=Count("pk"),
            tokens=Sum(F("prompt_tokens") + F("completion_tokens")),
        )
        .order_by("-cost", "backend", "model")[:20]
    )
    return {
        "cost": totals["cost"] or 0,
        "requests": totals["requests"],
        "errors": totals["errors"],
        "top": top,
        "by_route": by_route,
    }


def _current_windows(now: datetime):
    """The budgets' current windows, each with `used` (spent and reserved against the limit,
    in percent, at most 999)."""
    return (
        BudgetWindow.objects.filter(start__lte=now, end__gt=now, budget__limit_microcents__gt=0)
        .select_related(
            "budget__tenant", "budget__agent", "budget__api_key", "budget__member__user"
        )
        .annotate(
            used=Least(
                (F("spent_microcents") + F("reserved_microcents"))
                * 100
                / F("budget__limit_microcents"),
                Value(999),
            )
        )
    )


def _with_soft(windows) -> list[BudgetWindow]:
    """Each window with `soft`: the action its budget's soft level puts in force ("": none)."""
    windows = list(windows)
    for w in windows:
        w.soft = w.budget.soft_crossed(w.spent_microcents + w.reserved_microcents)
    return windows


def budgets_nearest(*, now: datetime | None = None, limit: int = 15) -> list[BudgetWindow]:
    """The current windows of every budget, the most used first."""
    now = now or timezone.now()
    return _with_soft(_current_windows(now).order_by("-used", "budget__tenant__slug")[:limit])


def budgets_soft_crossed(*, now: datetime | None = None, limit: int = 50) -> list[BudgetWindow]:
    """The current windows past their budget's soft level, whatever their share of the limit:
    whose new requests are demoted to the bulk lane, throttled, or only alerted on."""
    now = now or timezone.now()
    crossed = _current_windows(now).filter(
        budget__soft_limit_microcents__isnull=False,
        budget__soft_limit_microcents__lte=F("spent_microcents") + F("reserved_microcents"),
    )
    return _with_soft(crossed.order_by("budget__tenant__slug", "-used")[:limit])


def alerts_recent(*, limit: int = 30) -> list[AlertEvent]:
    return list(
        AlertEvent.objects.select_related("tenant", "agent")
        .prefetch_related("deliveries")
        .order_by("-created_at")[:limit]
    )


def tenant_by_slug(*, slug: str) -> Tenant | None:
    return Tenant.objects.filter(slug=slug).first()


# A request's timeline (workers/serving/trace.py has its keys), in the order the steps happen.
TIMELINE_STEPS = [
    ("received", "received by the API"),
    ("admitted", "admitted (budget held)"),
    ("queued", "queued"),
    ("taken", "taken"),
    ("submitted", "in the engine"),
    ("first_token", "first token"),
    ("last_token", "last token"),
]


@dataclass(frozen=True, slots=True)
class Step:
    name: str
    label: str
    at: datetime
    since_previous_ms: float | None  # None for the first
    since_start_ms: float
    detail: str = ""


@dataclass(frozen=True, slots=True)
class RequestLookup:
    records: list[UsageRecord]  # settled: by request id (one) or by trace id (its requests)
    in_flight: Reservation | None  # admitted, not settled yet


def request_lookup(*, query: str) -> RequestLookup:
    """A request by its `x-request-id`, or the requests of a trace id, across tenants (staff
    only: the ops dashboard)."""
    query = query.strip().lower()[:64]
    if not query:
        return RequestLookup([], None)
    records = list(
        UsageRecord.objects.select_related("tenant", "agent")
        .filter(Q(request_id=query) | Q(trace_id=query))
        .order_by("created_at")[:50]
    )
    in_flight = None
    if not records:
        in_flight = (
            Reservation.objects.select_related("tenant", "agent")
            .filter(request_id=query, status=Reservation.Status.HELD)
            .first()
        )
    return RequestLookup(records, in_flight)


def request_timeline(record: UsageRecord) -> list[Step]:
    """The steps of a settled request with the time each took; the settlement last."""
    line = record.timeline or {}
    points = [
        (name, label, line[name])
        for name, label in TIMELINE_STEPS
        if isinstance(line.get(name), int | float)
    ]
    points.append(("settled", "settled (ledger row)", record.created_at.timestamp()))
    details = {
        "queued": f"{line.get('lane', '')} lane, position {line['position']}"
        if line.get("position")
        else line.get("lane", ""),
        "taken": f"by worker {line['worker']}"
        if line.get("worker")
        else f"sent to backend {line['backend']}"
        if line.get("backend")
        else "",
    }
    steps, start, previous = [], points[0][2], None
    for name, label, at in points:
        steps.append(
            Step(
                name=name,
                label=label,
                at=datetime.fromtimestamp(at, tz=timezone.get_current_timezone()),
                since_previous_ms=None if previous is None else (at - previous) * 1000,
                since_start_ms=(at - start) * 1000,
                detail=details.get(name, ""),
            )
        )
        previous = at
    return steps
