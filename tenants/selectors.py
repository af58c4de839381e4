"""Reads of the tenancy core. Every function is scoped by a tenant (or by the principal that
names its tenants); an unscoped `.objects` query appears nowhere else."""

from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth.models import User
from django.db.models import Count, QuerySet, Sum
from django.utils import timezone

from tenants.errors import NotFound
from tenants.models import (
    Agent,
    AlertDelivery,
    AlertDestination,
    AlertEvent,
    AlertEventName,
    ApiKey,
    Budget,
    BudgetWindow,
    Membership,
    Tenant,
    UsageRecord,
)
from tenants.windows import window_bounds, window_reservations_open, window_spent_settled


def tenant_list(*, user: User) -> QuerySet[Tenant]:
    return Tenant.objects.filter(memberships__user=user, memberships__is_active=True).order_by(
        "slug"
    )


def tenant_get(*, slug: str) -> Tenant | None:
    return Tenant.objects.filter(slug=slug).first()


def membership_get(*, tenant: Tenant, user: User) -> Membership | None:
    """The user's active membership (a deactivated one gives no access)."""
    return Membership.objects.filter(tenant=tenant, user=user, is_active=True).first()


def membership_list(*, tenant: Tenant) -> QuerySet[Membership]:
    return Membership.objects.filter(tenant=tenant).select_related("user").order_by("created_at")


def membership_get_by_id(*, tenant: Tenant, membership_id) -> Membership:
    membership = (
        Membership.objects.filter(tenant=tenant, pk=membership_id).select_related("user").first()
    )
    if membership is None:
        raise NotFound("No such member.")
    return membership


def agent_list(*, tenant: Tenant) -> QuerySet[Agent]:
    return Agent.objects.filter(tenant=tenant).select_related("tenant").order_by("name")


def agent_get(*, tenant: Tenant, agent_id) -> Agent:
    agent = Agent.objects.filter(tenant=tenant, pk=agent_id).select_related("tenant").first()
    if agent is None:
        raise NotFound("No such agent.", param="agent")
    return agent


def api_key_list(*, tenant: Tenant, agent: Agent | None = None) -> QuerySet[ApiKey]:
    keys = ApiKey.objects.filter(tenant=tenant).select_related("agent")
    return keys.filter(agent=agent) if agent is not None else keys


def api_key_get(*, tenant: Tenant, key_id) -> ApiKey:
    key = ApiKey.objects.filter(tenant=tenant, pk=key_id).select_related("agent", "tenant").first()
    if key is None:
        raise NotFound("No such API key.")
    return key


def budget_list(*, tenant: Tenant) -> QuerySet[Budget]:
    return Budget.objects.filter(tenant=tenant).select_related(
        "agent", "tenant", "api_key", "member__user"
    )


def budget_get(*, tenant: Tenant, budget_id) -> Budget:
    budget = (
        Budget.objects.filter(tenant=tenant, pk=budget_id)
        .select_related("agent", "tenant", "api_key", "member__user")
        .first()
    )
    if budget is None:
        raise NotFound("No such budget.")
    return budget


@dataclass(frozen=True, slots=True)
class WindowStatus:
    start: datetime
    end: datetime
    limit_microcents: int
    spent_microcents: int
    reserved_microcents: int

    @property
    def remaining_microcents(self) -> int:
        return max(0, self.limit_microcents - self.spent_microcents - self.reserved_microcents)


def budget_window_status(*, budget: Budget, now: datetime | None = None) -> WindowStatus:
    """The current window's figures; a window nobody has used yet reads as what it will open
    with (the ledger's charges and open holds of its time, e.g. after a time zone change)."""
    start, end = window_bounds(
        period=budget.period, tz_name=budget.tenant.timezone, now=now or timezone.now()
    )
    window = BudgetWindow.objects.filter(budget=budget, start=start).first()
    if window is None:
        spent = window_spent_settled(budget=budget, start=start, end=end)
        held = (
            window_reservations_open(budget=budget, start=start, end=end).aggregate(
                total=Sum("amount_microcents")
            )["total"]
            or 0
        )
    else:
        spent, held = window.spent_microcents, window.reserved_microcents
    return WindowStatus(
        start=start,
        end=end,
        limit_microcents=budget.limit_microcents,
        spent_microcents=spent,
        reserved_microcents=held,
    )


def usage_list(
    *,
    tenant: Tenant,
    since: datetime | None = None,
    until: datetime | None = None,
    agent: Agent | None = None,
    api_key: ApiKey | None = None,
    member: Membership | None = None,
    model: str | None = None,
) -> QuerySet[UsageRecord]:
    """The tenant's ledger rows, narrowed to an agent, an API key, a member's keys (those they
    created) or a model when given."""
    records = UsageRecord.objects.filter(tenant=tenant).select_related("agent", "api_key")
    if api_key is not None:
        records = records.filter(api_key=api_key)
    if member is not None:
        records = records.filter(api_key__created_by_id=member.user_id)
    if model is not None:
        records = records.filter(model=model)
    if since is not None:
        records = records.filter(created_at__gte=since)
    if until is not None:
        records = records.filter(created_at__lt=until)
    if agent is not None:
        records = records.filter(agent=agent)
    return records.order_by("-created_at", "-pk")


# What usage totals can be grouped by, and the columns each groups on.
USAGE_GROUPS = {
    "agent": ("agent__name",),
    "api_key": ("api_key__key_id",),
    "member": ("api_key__created_by__username",),
    "model": ("model",),
}


def usage_summary(
    *,
    tenant: Tenant,
    group_by: list[str] | tuple[str, ...] = ("agent", "model"),
    **filters,
) -> list[dict]:
    """Totals over the range per group (agent, API key, member, model: any of them)."""
    records = usage_list(tenant=tenant, **filters)
    columns = [c for g in group_by for c in USAGE_GROUPS[g]]
    return list(
        records.order_by()
        .values(*columns)
        .annotate(
            requests=Count("pk"),
            prompt_tokens=Sum("prompt_tokens"),
            completion_tokens=Sum("completion_tokens"),
            cached_tokens=Sum("cached_tokens"),
            cost_microcents=Sum("cost_microcents"),
        )
        .order_by(*columns)
    )


# -- budget alerts -----------------------------------------------------------------------------


def alert_event_list(*, tenant: Tenant, limit: int = 50) -> QuerySet[AlertEvent]:
    """The tenant's alerts, newest first, with their deliveries."""
    return (
        AlertEvent.objects.filter(tenant=tenant)
        .select_related("agent")
        .prefetch_related("deliveries")
        .order_by("-created_at")[:limit]
    )


def alert_destination_list(*, tenant: Tenant | None) -> QuerySet[AlertDestination]:
    """A tenant's destinations; tenant None: the platform's (operators')."""
    return AlertDestination.objects.filter(tenant=tenant).order_by("kind", "target")


def alert_forecasts_current(*, tenant: Tenant, now: datetime | None = None) -> list[AlertEvent]:
    """Forecast alerts of windows still open (the portal's banner), one per budget."""
    now = now or timezone.now()
    events = (
        AlertEvent.objects.filter(
            tenant=tenant, window_end__gt=now, event=AlertEventName.PROJECTED_LIMIT_EXCEEDED
        )
        .select_related("agent")
        .order_by("-created_at")
    )
    latest: dict = {}
    for event in events[:50]:
        latest.setdefault(event.budget_id, event)
    return list(latest.values())


def alert_delivery_list(*, tenant: Tenant, limit: int = 100) -> QuerySet[AlertDelivery]:
    return (
        AlertDelivery.objects.filter(tenant=tenant)
        .select_related("event")
        .order_by("-event__created_at")[:limit]
    )
