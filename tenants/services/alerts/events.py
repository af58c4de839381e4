"""An alert that fired: its record, its message and webhook body (LiteLLM's fields, so
receivers written for LiteLLM's budget alerts work, plus ours), and one delivery per
destination (the tenant's and the platform's)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from zoneinfo import ZoneInfo

from django.db import transaction
from django.db.models import Q
from django.dispatch import Signal

from tenants.metrics import ALERTS, SEP
from tenants.models import (
    MICROCENTS_PER_USD,
    AlertDelivery,
    AlertDestination,
    AlertEvent,
    AlertEventName,
    BudgetWindow,
)
from tenants.services.alerts.rules import Rule

# Sent once new deliveries have committed (`ids`); the runtime's alert sender hears it.
deliveries_created = Signal()


def usd(microcents: int) -> str:
    """Dollars, with the digits that matter for small amounts (as the portal shows them)."""
    amount = Decimal(int(microcents)) / MICROCENTS_PER_USD
    if amount == 0 or abs(amount) >= Decimal("0.01"):
        return f"${amount:,.2f}"
    return f"${amount:.8f}".rstrip("0")


def _local(at: datetime, tz_name: str) -> str:
    return f"{at.astimezone(ZoneInfo(tz_name)):%Y-%m-%d %H:%M} {tz_name}"


def event_name(rule: Rule) -> str:
    if rule.is_forecast:
        return AlertEventName.PROJECTED_LIMIT_EXCEEDED
    return (
        AlertEventName.BUDGET_CROSSED
        if (rule.percent or 0) >= 100
        else AlertEventName.THRESHOLD_CROSSED
    )


def _message(*, window: BudgetWindow, rule: Rule, projected_at: datetime | None) -> str:
    budget = window.budget
    tz = budget.tenant.timezone
    described = budget.described()
    owner = (
        f"The {described}"
        if budget.scope == budget.Scope.TENANT
        else described[0].upper() + described[1:]
    )
    spent = f"{usd(window.spent_microcents)} of {usd(budget.limit_microcents)}"
    ends = _local(window.end, tz)
    if rule.is_forecast and projected_at is not None:
        return (
            f"{owner} is projected to run out at "
            f"{_local(projected_at, tz)}, before its window ends at {ends} ({spent} "
            f"spent)."
        )
    if (rule.percent or 0) >= 100:
        if window.reserved_microcents:  # refused while requests in flight hold the rest
            spent = (
                f"{usd(window.spent_microcents)} spent and {usd(window.reserved_microcents)} "
                f"held by requests in flight, of {usd(budget.limit_microcents)}"
            )
        return (
            f"{owner} is spent ({spent}): its requests are refused "
            f"until the window resets at {ends}."
        )
    return f"{owner} reached {rule.percent} % ({spent}; resets at {ends})."


def alert_event_create(
    *,
    window: BudgetWindow,
    rule: Rule,
    now: datetime,
    projected_at: datetime | None = None,
    projected_spend: int | None = None,
) -> AlertEvent:
    """Record the alert and its deliveries (in the caller's transaction); once it commits,
    `deliveries_created` tells the runtime's sender."""
    budget = window.budget
    event = AlertEvent.objects.create(
        tenant_id=budget.tenant_id,
        budget=budget,
        agent_id=budget.agent_id,
        event=event_name(rule),
        rule=rule.key,
        period=budget.period,
        window_start=window.start,
        window_end=window.end,
        spent_microcents=window.spent_microcents,
        limit_microcents=budget.limit_microcents,
        projected_at=projected_at,
        projected_spend_microcents=projected_spend,
        message=_message(window=window, rule=rule, projected_at=projected_at)[:300],
        created_at=now,
    )
    destinations = AlertDestination.objects.filter(
        Q(tenant_id=budget.tenant_id) | Q(tenant__isnull=True), is_enabled=True
    )
    deliveries = AlertDelivery.objects.bulk_create(
        [
            AlertDelivery(
                tenant_id=budget.tenant_id,
                event=event,
                destination=d,
                kind=d.kind,
                target=d.target,
                next_attempt_at=now,
            )
            for d in destinations
        ]
    )
    ids = [str(d.pk) for d in deliveries]
    slug = budget.tenant.slug

    def committed() -> None:
        ALERTS.add(f"{slug}{SEP}{event.event}")
        deliveries_created.send(sender=None, ids=ids)

    transaction.on_commit(committed)
    return event


def event_payload(event: AlertEvent) -> dict:
    """What a webhook receives: LiteLLM's budget alert fields (spend and max_budget in USD,
    event, event_group, event_message; team_id is the tenant, key_alias the agent) and
    Fairlane's own, in integer micro-cents."""
    agent = event.agent.name if event.agent is not None else None
    budget = event.budget
    scope = budget.scope if budget is not None else ("agent" if agent else "tenant")
    key = budget.api_key.prefix if budget is not None and budget.api_key else None
    user = budget.member.user if budget is not None and budget.member else None
    projected = event.projected_spend_microcents
    return {
        "event": event.event,
        "event_group": {"agent": "key", "api_key": "key", "member": "user"}.get(scope, "team"),
        "event_message": event.message,
        "spend": event.spent_microcents / MICROCENTS_PER_USD,
        "max_budget": event.limit_microcents / MICROCENTS_PER_USD,
        "projected_exceeded_date": event.projected_at.isoformat() if event.projected_at else None,
        "projected_spend": projected / MICROCENTS_PER_USD if projected is not None else None,
        "token": None,
        "user_id": user.get_username() if user is not None else None,
        "user_email": (user.email or None) if user is not None else None,
        "customer_id": None,
        "team_id": event.tenant.slug,
        "key_alias": key or agent,
        "fairlane": {
            "id": str(event.pk),
            "tenant": event.tenant.slug,
            "agent": agent,
            "scope": scope,
            "api_key": key,
            "member": user.get_username() if user is not None else None,
            "models": list(budget.model_names) if budget is not None else [],
            "budget_id": str(event.budget_id) if event.budget_id else None,
            "rule": event.rule,
            "period": event.period,
            "window_start": event.window_start.isoformat(),
            "window_end": event.window_end.isoformat(),
            "spend_microcents": event.spent_microcents,
            "limit_microcents": event.limit_microcents,
            "created_at": event.created_at.isoformat(),
        },
    }
