"""Soft budget levels: what a budget does to its owner's new requests once its current
window's spent + reserved reaches the soft level (below the limit, which still refuses).

- `alert`: nothing but the alert (the `soft_limit` rule, once per window).
- `demote`: the request runs on the bulk lane until the window resets, at the same price,
  and its answer says so in the `x-fairlane-demoted` header.
- `throttle`: the request counts against a requests-per-minute limit of the budget's
  (`soft_rpm`), checked by the rate limiter with the caller's other limits.

Checked at admission, before the budget hold: a request that crosses the level itself runs as
before; the next one sees the crossing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import F
from django.utils import timezone

from tenants.models import Agent, ApiKey, Budget, BudgetWindow, SoftAction, Tenant
from tenants.services.alerts.evaluate import budget_soft_alert
from tenants.services.budgets import budget_window_cached, budgets_for_caller


@dataclass(frozen=True, slots=True)
class SoftState:
    """The soft levels a caller's budgets have crossed in their current windows."""

    demoted: str = ""  # the x-fairlane-demoted header ("": not demoted)
    throttles: tuple[tuple[str, int], ...] = ()  # (budget id, requests per minute)


def demoted_header(*, budget: Budget, percent: int) -> str:
    return f"budget={budget.pk}; spent={percent}%"


def budget_soft_check(
    *,
    tenant: Tenant,
    agent: Agent,
    api_key: ApiKey | None = None,
    model: str = "",
    now: datetime | None = None,
) -> SoftState:
    """The soft levels of every budget the request counts against, as their current windows
    stand (one query when any has a soft level, none otherwise); a crossing fires its alert."""
    now = now or timezone.now()
    budgets = [
        b
        for b in budgets_for_caller(tenant=tenant, agent=agent, api_key=api_key, model=model)
        if b.soft_limit_microcents is not None
    ]
    if not budgets:
        return SoftState()
    windows = {b.pk: budget_window_cached(budget=b, now=now) for b in budgets}
    used = dict(
        BudgetWindow.objects.filter(pk__in=[w.pk for w in windows.values()]).values_list(
            "pk", F("spent_microcents") + F("reserved_microcents")
        )
    )
    demoted, throttles = "", []
    for budget in budgets:  # the agent's first: its header wins over the others
        window = windows[budget.pk]
        spent = used.get(window.pk, 0)
        action = budget.soft_crossed(spent)
        if not action:
            continue
        budget_soft_alert(window_id=window.pk, now=now)
        if action == SoftAction.DEMOTE and not demoted:
            limit = budget.limit_microcents
            percent = spent * 100 // limit if limit > 0 else 100
            demoted = demoted_header(budget=budget, percent=percent)
        elif action == SoftAction.THROTTLE and budget.soft_rpm:
            throttles.append((str(budget.pk), budget.soft_rpm))
    return SoftState(demoted=demoted, throttles=tuple(throttles))
