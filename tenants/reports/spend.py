"""Spend in each budget's current window against its limit, the trailing run-rate, and when
the window would run out at that rate; requests and errors today. A handful of queries per
tenant, however many agents it has."""

from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import reduce
from operator import or_

from django.db.models import Count, Q, Sum
from django.utils import timezone

from tenants.models import Agent, Budget, BudgetWindow, Period, Tenant, UsageRecord
from tenants.windows import window_bounds

RUN_RATE_WINDOW = timedelta(hours=1)
WARN_RATIO = 0.8
ERROR_STATUSES = (UsageRecord.Status.ERROR, UsageRecord.Status.TIMEOUT)


@dataclass(frozen=True, slots=True)
class SpendLine:
    """One owner's spend (an agent's, or the tenant's when agent is None) in its window: the
    budget's window when it has a budget, else today in the tenant's time zone."""

    agent: Agent | None
    budget: Budget | None
    window_start: datetime
    window_end: datetime
    spent_microcents: int
    reserved_microcents: int
    run_rate_microcents_per_hour: int
    now: datetime

    @property
    def owner(self) -> str:
        if self.budget is not None and self.budget.slot == "extra":
            return self.budget.owner_label
        return self.agent.name if self.agent is not None else "tenant"

    @property
    def limit_microcents(self) -> int | None:
        return self.budget.limit_microcents if self.budget is not None else None

    @property
    def remaining_microcents(self) -> int | None:
        if self.budget is None:
            return None
        return max(
            0, self.budget.limit_microcents - self.spent_microcents - self.reserved_microcents
        )

    @property
    def used_ratio(self) -> float | None:
        if self.budget is None:
            return None
        if self.budget.limit_microcents == 0:
            return 1.0
        return (self.spent_microcents + self.reserved_microcents) / self.budget.limit_microcents

    @property
    def used_percent(self) -> int | None:
        return None if self.used_ratio is None else min(999, int(self.used_ratio * 100))

    @property
    def state(self) -> str:
        """unbudgeted, ok, warning (at or above 80 %) or exhausted."""
        if self.budget is None:
            return "unbudgeted"
        if self.remaining_microcents == 0:
            return "exhausted"
        return "warning" if (self.used_ratio or 0.0) >= WARN_RATIO else "ok"

    @property
    def soft(self) -> str:
        """The soft action in force for this owner's new requests ("alert", "demote" or
        "throttle"), or "" below its budget's soft level."""
        if self.budget is None:
            return ""
        return self.budget.soft_crossed(self.spent_microcents + self.reserved_microcents)

    @property
    def projected_exhaustion(self) -> datetime | None:
        """When the remaining budget runs out at the trailing hour's rate, if that is before
        the window resets; now when it already has."""
        remaining = self.remaining_microcents
        if remaining is None:
            return None
        if remaining == 0:
            return self.now
        if self.run_rate_microcents_per_hour <= 0:
            return None
        at = self.now + timedelta(hours=remaining / self.run_rate_microcents_per_hour)
        return at if at < self.window_end else None


@dataclass(frozen=True, slots=True)
class Today:
    start: datetime
    requests: int
    errors: int
    cost_microcents: int


def _windows_by_budget(*, budgets: list[Budget], now: datetime) -> dict:
    bounds = {
        b.pk: window_bounds(period=b.period, tz_name=b.tenant.timezone, now=now) for b in budgets
    }
    if not budgets:
        return {}
    match = reduce(or_, (Q(budget_id=pk, start=start) for pk, (start, _) in bounds.items()))
    rows = {w.budget_id: w for w in BudgetWindow.objects.filter(match)}
    return {pk: (start, end, rows.get(pk)) for pk, (start, end) in bounds.items()}


def _rates_by_agent(*, tenant: Tenant, now: datetime) -> dict:
    rows = (
        UsageRecord.objects.filter(
            tenant=tenant, created_at__gte=now - RUN_RATE_WINDOW, created_at__lte=now
        )
        .order_by()
        .values("agent_id")
        .annotate(cost=Sum("cost_microcents"))
    )
    hours = RUN_RATE_WINDOW.total_seconds() / 3600
    return {row["agent_id"]: int(row["cost"] / hours) for row in rows}


def spend_today(*, tenant: Tenant, now: datetime | None = None) -> tuple[Today, dict]:
    """Today's (in the tenant's zone) totals, and each agent's cost today by agent id."""
    now = now or timezone.now()
    start, _ = window_bounds(period=Period.DAILY, tz_name=tenant.timezone, now=now)
    rows = list(
        UsageRecord.objects.filter(tenant=tenant, created_at__gte=start)
        .order_by()
        .values("agent_id")
        .annotate(
            requests=Count("pk"),
            cost=Sum("cost_microcents"),
            errors=Count("pk", filter=Q(status__in=ERROR_STATUSES)),
        )
    )
    today = Today(
        start=start,
        requests=sum(r["requests"] for r in rows),
        errors=sum(r["errors"] for r in rows),
        cost_microcents=sum(r["cost"] for r in rows),
    )
    return today, {r["agent_id"]: r["cost"] for r in rows}


def spend_overview(
    *, tenant: Tenant, now: datetime | None = None
) -> tuple[SpendLine, list[SpendLine], Today]:
    """The tenant's line, one line per active agent (and per inactive one with a budget),
    and today's totals."""
    now = now or timezone.now()
    budgets = [
        b
        for b in Budget.objects.filter(tenant=tenant).select_related("agent", "tenant")
        if b.slot != "extra"
    ]
    windows = _windows_by_budget(budgets=budgets, now=now)
    rates = _rates_by_agent(tenant=tenant, now=now)
    today, cost_today = spend_today(tenant=tenant, now=now)
    by_agent = {b.agent_id: b for b in budgets}

    def line(agent: Agent | None, rate: int) -> SpendLine:
        budget = by_agent.get(agent.pk if agent else None)
        if budget is None:
            spent = cost_today.get(agent.pk, 0) if agent else today.cost_microcents
            start, end = window_bounds(period=Period.DAILY, tz_name=tenant.timezone, now=now)
            return SpendLine(agent, None, start, end, spent, 0, rate, now)
        start, end, window = windows[budget.pk]
        return SpendLine(
            agent,
            budget,
            start,
            end,
            window.spent_microcents if window else 0,
            window.reserved_microcents if window else 0,
            rate,
            now,
        )

    agents = (
        Agent.objects.filter(Q(is_active=True) | Q(pk__in=by_agent.keys()), tenant=tenant)
        .distinct()
        .order_by("name")
    )
    lines = [line(agent, rates.get(agent.pk, 0)) for agent in agents]
    return line(None, sum(rates.values())), lines, today


def spend_other_budgets(
    *, tenant: Tenant, now: datetime | None = None, member=None
) -> list[SpendLine]:
    """One line per budget of another scope (an API key's, a member's, or with a model
    filter), in its current window; only `member`'s own (theirs and their keys') when given."""
    now = now or timezone.now()
    budgets = Budget.objects.filter(tenant=tenant).select_related(
        "agent", "tenant", "api_key", "member__user"
    )
    if member is not None:
        budgets = budgets.filter(
            Q(member=member)
            | Q(api_key__created_by_id=member.user_id, api_key__handed_over_at__isnull=True)
        )
    others = sorted((b for b in budgets if b.slot == "extra"), key=lambda b: b.owner_key)
    windows = _windows_by_budget(budgets=others, now=now)
    lines = []
    for budget in others:
        start, end, window = windows[budget.pk]
        spent = window.spent_microcents if window else 0
        reserved = window.reserved_microcents if window else 0
        lines.append(SpendLine(budget.agent, budget, start, end, spent, reserved, 0, now))
    return lines


def spend_alerts(*, tenant: Tenant, now: datetime | None = None) -> list[SpendLine]:
    """Budgets at or above 80 % of their limit in their current window, or exhausted (the
    portal's banner). Two queries: the budgets and their current windows."""
    now = now or timezone.now()
    budgets = list(
        Budget.objects.filter(tenant=tenant)
        .select_related("agent", "tenant", "api_key", "member__user")
        .order_by("agent__name", "owner_key")
    )
    windows = _windows_by_budget(budgets=budgets, now=now)
    lines = []
    for budget in budgets:
        start, end, window = windows[budget.pk]
        line = SpendLine(
            budget.agent,
            budget,
            start,
            end,
            window.spent_microcents if window else 0,
            window.reserved_microcents if window else 0,
            0,
            now,
        )
        if line.state in {"warning", "exhausted"}:
            lines.append(line)
    return lines
